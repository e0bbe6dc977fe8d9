// Memory-efficient attention forward: O = softmax(Q K^T * scale + mask) V, tiled with an
// online softmax in fp32 (SIMT), any head dim up to D_MAX, with an optional mask and a
// run-time band (causal mask, sliding window: with `band` set, key j is visible to query i
// only when i + diag + lo <= j <= i + diag + hi, diag 0 top-left aligned (`lower_right`
// 0) or Lk - Lq bottom-right, each sequence's own lengths; any Lq, Lk). Writes the natural-log
// log-sum-exp per query row. A query row with no visible key gets O = 0 and lse = -inf.
// With dropout_p > 0, each weight is kept with probability 1 - dropout_p (scaled by
// 1 / (1 - dropout_p)) by `dropout_keep(seed, index)`, the host's decision.
//
// Specialisation: KERNEL, T (float, half_t, bf16_t), MASK_KIND (0 none, 1 boolean: M is
//   unsigned char and false hides a key, 2 additive: M is T), M, D_MAX, BLOCK_M, BLOCK_N
// Launch: grid (ceil(Lq / BLOCK_M), B * H), block 128 (128 / BLOCK_M threads per query row).
// Layout as flash_fwd; the mask is read through its strides (0 on broadcast dimensions).
// Sequences (`seqs` 1 packed, 2 paged; 0 dense), read from `seq`: packed, sequence b's
// query rows start at row seq[b] (Lq = seq[b + 1] - seq[b]) and its key rows at
// seq[seq_k + b] (likewise); paged, its Lk is seq[seq_k + b] and key j lies in cache row
// seq[table + b * per_seq + j / block] * block + j % block. Lq and Lk then bound the
// sequences' lengths (the grid), and the log-sum-exp of query i is at
// b * lse_b + h * lse_h + first query row + i.

#define THREADS 128
#define TPR (THREADS / BLOCK_M)

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const M* __restrict__ mask, T* __restrict__ o, float* __restrict__ lse,
    int H, int Hk, int Lq, int Lk, int D, float scale, int band, int lo, int hi,
    int lower_right,
    long long q_b, long long q_h, long long q_l,
    long long k_b, long long k_h, long long k_l,
    long long v_b, long long v_h, long long v_l,
    long long o_b, long long o_h, long long o_l,
    long long m_b, long long m_h, long long m_q, long long m_k,
    const unsigned* __restrict__ seq, int seqs, int seq_k, int table, int per_seq, int block,
    long long lse_b, long long lse_h,
    double dropout_p, unsigned long long seed)
{
    __shared__ float Qs[BLOCK_M][D_MAX];
    __shared__ float Ks[BLOCK_N][D_MAX + 1];
    __shared__ float Vs[BLOCK_N][D_MAX];
    __shared__ float Ps[BLOCK_M][BLOCK_N];

    const int tid = threadIdx.x, row = tid / TPR, sub = tid % TPR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hk);
    const int m0 = blockIdx.x * BLOCK_M, qi = m0 + row;
    // This block's sequence: its first query and key rows and its lengths.
    int q0 = 0, k0 = 0, lq = Lq, lk = Lk;
    if (seqs == 1) {
        q0 = seq[b], lq = seq[b + 1] - q0;
        k0 = seq[seq_k + b], lk = seq[seq_k + b + 1] - k0;
    } else if (seqs == 2) {
        lk = seq[seq_k + b];
    }
    if (m0 >= lq) return;  // the whole block: before any barrier
    // The key (cache) row of key j.
    auto key_row = [&](int j) -> long long {
        if (seqs == 2) return (long long)seq[table + b * per_seq + j / block] * block + j % block;
        return k0 + j;
    };
    q += b * q_b + h * q_h + q0 * q_l;
    k += b * k_b + hk * k_h;
    v += b * v_b + hk * v_h;
    o += b * o_b + h * o_h + q0 * o_l;
#if MASK_KIND
    mask += b * m_b + h * m_h + min(qi, lq - 1) * m_q;
#endif
    // The band around this sequence's diagonal (lengths below 2^28, offsets within 2^29:
    // the host checks, so these sums fit in int).
    const int diag = lower_right ? lk - lq : 0;
    lo += diag;
    hi += diag;

    for (int e = tid; e < BLOCK_M * D_MAX; e += THREADS) {
        int r = e / D_MAX, c = e % D_MAX;
        Qs[r][c] = (m0 + r < lq && c < D) ? to_f32(q[(m0 + r) * q_l + c]) : 0.f;
    }
    float acc[D_MAX / TPR];
#pragma unroll
    for (int i = 0; i < D_MAX / TPR; ++i) acc[i] = 0.f;
    float row_max = NEG_INF, row_sum = 0.f;
    const float keep_scale = (float)(1.0 / (1.0 - dropout_p));

    int k_start = 0, k_stop = lk;
    // The block's first row sees the earliest keys, its last row the latest.
    if (band) {
        k_start = max(0, m0 + lo) / BLOCK_N * BLOCK_N;
        k_stop = max(0, min(lk, m0 + BLOCK_M + hi));
    }
    for (int kb = k_start; kb < k_stop; kb += BLOCK_N) {
        __syncthreads();
        for (int e = tid; e < BLOCK_N * D_MAX; e += THREADS) {
            int r = e / D_MAX, c = e % D_MAX;
            const bool in = kb + r < lk && c < D;
            const long long at = in ? key_row(kb + r) : 0;
            Ks[r][c] = in ? to_f32(k[at * k_l + c]) : 0.f;
            Vs[r][c] = in ? to_f32(v[at * v_l + c]) : 0.f;
        }
        __syncthreads();

        float s[BLOCK_N / TPR];
        float block_max = NEG_INF;
#pragma unroll
        for (int i = 0; i < BLOCK_N / TPR; ++i) {
            const int j = sub + TPR * i, key = kb + j;
            float dot = 0.f;
#pragma unroll
            for (int d = 0; d < D; ++d) dot = fmaf(Qs[row][d], Ks[j][d], dot);
            float x = dot * scale;
            bool hidden = key >= lk || qi >= lq || (band && (key > qi + hi || key < qi + lo));
#if MASK_KIND == 1
            if (!hidden && !mask[key * m_k]) hidden = true;
#elif MASK_KIND == 2
            if (!hidden) x += to_f32(mask[key * m_k]);
#endif
            s[i] = hidden ? NEG_INF : x;
            block_max = fmaxf(block_max, s[i]);
        }
        for (int off = 1; off < TPR; off <<= 1)
            block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, off));
        const float new_max = fmaxf(row_max, block_max);
        const float ref = new_max == NEG_INF ? 0.f : new_max;
        const float alpha = __expf(row_max - ref);
        row_max = new_max;
        float part = 0.f;
#pragma unroll
        for (int i = 0; i < BLOCK_N / TPR; ++i) {
            float p = __expf(s[i] - ref);
            part += p;  // the softmax sum counts every weight; dropout acts after it
            if (dropout_p > 0.0) {
                const unsigned long long index =
                    ((unsigned long long)bh * Lq + qi) * Lk + kb + sub + TPR * i;
                p = dropout_keep(seed, index, dropout_p) ? p * keep_scale : 0.f;
            }
            Ps[row][sub + TPR * i] = p;
        }
        for (int off = 1; off < TPR; off <<= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        row_sum = row_sum * alpha + part;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < D_MAX / TPR; ++i) {
            const int d = sub + TPR * i;
            float a = acc[i] * alpha;
#pragma unroll
            for (int j = 0; j < BLOCK_N; ++j) a = fmaf(Ps[row][j], Vs[j][d], a);
            acc[i] = a;
        }
    }

    if (qi >= lq) return;
    const float inv = row_sum != 0.f ? 1.f / row_sum : 0.f;  // NaN rows stay NaN
#pragma unroll
    for (int i = 0; i < D_MAX / TPR; ++i) {
        const int d = sub + TPR * i;
        if (d < D) o[qi * o_l + d] = from_f32<T>(acc[i] * inv);
    }
    if (sub == 0)
        lse[b * lse_b + h * lse_h + q0 + qi] = row_sum != 0.f ? row_max + __logf(row_sum) : NEG_INF;
}

#undef THREADS
#undef TPR
