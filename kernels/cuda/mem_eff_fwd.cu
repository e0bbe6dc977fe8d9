// Memory-efficient attention forward: O = softmax(Q K^T * scale + mask) V, tiled with an
// online softmax in fp32 (SIMT), any head dim up to D_MAX, with an optional mask and a
// run-time causal flag (key j is hidden from query i when j > i + diag: diag 0 top-left
// aligned, Lk - Lq bottom-right; any Lq, Lk). Writes the natural-log
// log-sum-exp per query row. A query row with no visible key gets O = 0 and lse = -inf.
// With dropout_p > 0, each weight is kept with probability 1 - dropout_p (scaled by
// 1 / (1 - dropout_p)) by `dropout_keep(seed, index)`, the host's decision.
//
// Specialisation: KERNEL, T (float, half_t, bf16_t), MASK_KIND (0 none, 1 boolean: M is
//   unsigned char and false hides a key, 2 additive: M is T), M, D_MAX, BLOCK_M, BLOCK_N
// Launch: grid (ceil(Lq / BLOCK_M), B * H), block 128 (128 / BLOCK_M threads per query row).
// Layout as flash_fwd; the mask is read through its strides (0 on broadcast dimensions).

#define THREADS 128
#define TPR (THREADS / BLOCK_M)

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const M* __restrict__ mask, T* __restrict__ o, float* __restrict__ lse,
    int H, int Hk, int Lq, int Lk, int D, float scale, int causal, int diag,
    long long q_b, long long q_h, long long q_l,
    long long k_b, long long k_h, long long k_l,
    long long v_b, long long v_h, long long v_l,
    long long o_b, long long o_h, long long o_l,
    long long m_b, long long m_h, long long m_q, long long m_k,
    double dropout_p, unsigned long long seed)
{
    __shared__ float Qs[BLOCK_M][D_MAX];
    __shared__ float Ks[BLOCK_N][D_MAX + 1];
    __shared__ float Vs[BLOCK_N][D_MAX];
    __shared__ float Ps[BLOCK_M][BLOCK_N];

    const int tid = threadIdx.x, row = tid / TPR, sub = tid % TPR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hk);
    const int m0 = blockIdx.x * BLOCK_M, qi = m0 + row;
    q += b * q_b + h * q_h;
    k += b * k_b + hk * k_h;
    v += b * v_b + hk * v_h;
    o += b * o_b + h * o_h;
#if MASK_KIND
    mask += b * m_b + h * m_h + min(qi, Lq - 1) * m_q;
#endif

    for (int e = tid; e < BLOCK_M * D_MAX; e += THREADS) {
        int r = e / D_MAX, c = e % D_MAX;
        Qs[r][c] = (m0 + r < Lq && c < D) ? to_f32(q[(m0 + r) * q_l + c]) : 0.f;
    }
    float acc[D_MAX / TPR];
#pragma unroll
    for (int i = 0; i < D_MAX / TPR; ++i) acc[i] = 0.f;
    float row_max = NEG_INF, row_sum = 0.f;
    const float keep_scale = (float)(1.0 / (1.0 - dropout_p));

    int k_stop = Lk;
    // The block's last row sees the most keys.
    if (causal) k_stop = max(0, min(Lk, m0 + BLOCK_M + diag));
    for (int kb = 0; kb < k_stop; kb += BLOCK_N) {
        __syncthreads();
        for (int e = tid; e < BLOCK_N * D_MAX; e += THREADS) {
            int r = e / D_MAX, c = e % D_MAX;
            bool in = kb + r < Lk && c < D;
            Ks[r][c] = in ? to_f32(k[(kb + r) * k_l + c]) : 0.f;
            Vs[r][c] = in ? to_f32(v[(kb + r) * v_l + c]) : 0.f;
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
            bool hidden = key >= Lk || qi >= Lq || (causal && key > qi + diag);
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

    if (qi >= Lq) return;
    const float inv = row_sum != 0.f ? 1.f / row_sum : 0.f;  // NaN rows stay NaN
#pragma unroll
    for (int i = 0; i < D_MAX / TPR; ++i) {
        const int d = sub + TPR * i;
        if (d < D) o[qi * o_l + d] = from_f32<T>(acc[i] * inv);
    }
    if (sub == 0) lse[(long long)bh * Lq + qi] = row_sum != 0.f ? row_max + __logf(row_sum) : NEG_INF;
}

#undef THREADS
#undef TPR
