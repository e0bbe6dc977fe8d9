// Flash attention forward: O = softmax(Q K^T * scale) V, tiled with an online softmax on
// tensor cores (mma.sync m16n8k16), never materialising the Lq x Lk score matrix.
// Also writes the log-sum-exp of each query row (natural log) for a later backward pass.
// A query row with no visible key gets O = 0 and lse = -inf. With dropout_p > 0, each
// weight is kept with probability 1 - dropout_p (scaled by 1 / (1 - dropout_p)) by
// `dropout_keep(seed, index)`, the host's decision.
//
// Specialisation: KERNEL, T (half_t or bf16_t), HEAD_DIM, WARPS (16 query rows each),
//   BLOCK_N (keys per step, a multiple of 16), CAUSAL (1: a band, causal mask or sliding window:
//   key j is visible to query i only when i + diag + lo <= j <= i + diag + hi, diag 0
//   top-left aligned (`lower_right` 0) or Lk - Lq bottom-right)
// Launch: grid (ceil(Lq / (16 * WARPS)), B * H, S), block 32 * WARPS.
// Layout: q, k, v, o are [B, H(k), L, D] with the last dimension contiguous and the
// other strides given; key/value head = h / (H / Hk) (grouped-query attention). D <= HEAD_DIM:
// the tiles' columns from D on are zeros (they add nothing to Q K^T), and o's are not written.
// Split-KV (decoding): block z of the S along the grid's z axis reads keys
// [z * split_len, (z + 1) * split_len) only and writes its partial output at o + z * o_z and
// its log-sum-exp at lse + z * lse_z, for the combine kernel (S = 1: split_len >= Lk).
// Tiles are copied 16 bytes at a time when every row start is 16-byte aligned, else one
// element at a time. Warps whose 16 query rows all lie past Lq skip the arithmetic.

#define BLOCK_M (16 * WARPS)
#define THREADS (32 * WARPS)

// Elements c and c + 1 (c even) of row r of a tile in one 32-bit read, element c in the
// low half.
__device__ __forceinline__ unsigned pair(const unsigned short (*tile)[HEAD_DIM], int r, int c) {
    return *reinterpret_cast<const unsigned*>(&tile[r][c]);
}

// The A fragment of query rows qr and qr + 8, head dims [d, d + 16).
__device__ __forceinline__ void q_fragment(unsigned a[4], const unsigned short (*Qs)[HEAD_DIM], int qr,
                                           int d, int t) {
    a[0] = pair(Qs, qr, d + 2 * t);
    a[1] = pair(Qs, qr + 8, d + 2 * t);
    a[2] = pair(Qs, qr, d + 2 * t + 8);
    a[3] = pair(Qs, qr + 8, d + 2 * t + 8);
}

// Copies rows [r0, r0 + ROWS), columns [0, D) of a row-major slab (row stride ld) into dst,
// zeros from row `rows` and column D on (vec: D is a multiple of 8).
template <int ROWS, class T>
__device__ __forceinline__ void load_tile(unsigned short (*dst)[HEAD_DIM], const T* src, long long ld,
                                          int r0, int rows, int D, bool vec, int tid) {
    if (vec) {
        constexpr int PER_ROW = HEAD_DIM / 8, COUNT = ROWS * PER_ROW;
        // Four 16-byte loads in flight per thread: more would take the accumulators'
        // registers.
#pragma unroll 4
        for (int i = 0; i < (COUNT + THREADS - 1) / THREADS; ++i) {
            const int e = i * THREADS + tid;
            if (COUNT % THREADS != 0 && e >= COUNT) break;
            const int r = e / PER_ROW, c = e % PER_ROW * 8;
            if (r0 + r < rows && c < D) {
                copy16(&dst[r][c], src + (r0 + r) * ld + c);
            } else {
                *reinterpret_cast<bytes16*>(&dst[r][c]) = bytes16{0, 0, 0, 0};
            }
        }
    } else {
        for (int e = tid; e < ROWS * HEAD_DIM; e += THREADS) {
            const int r = e / HEAD_DIM, c = e % HEAD_DIM;
            dst[r][c] = r0 + r < rows && c < D ? src[(r0 + r) * ld + c].bits : 0;
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 1) KERNEL(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    T* __restrict__ o, float* __restrict__ lse,
    int H, int Hk, int Lq, int Lk, int D, float scale, int lo, int hi, int lower_right, int split_len,
    long long q_b, long long q_h, long long q_l,
    long long k_b, long long k_h, long long k_l,
    long long v_b, long long v_h, long long v_l,
    long long o_b, long long o_h, long long o_l,
    long long o_z, long long lse_z,
    double dropout_p, unsigned long long seed)
{
    __shared__ __align__(16) unsigned short Qs[BLOCK_M][HEAD_DIM];
    __shared__ __align__(16) unsigned short Ks[BLOCK_N][HEAD_DIM];
    __shared__ __align__(16) unsigned short Vs[BLOCK_N][HEAD_DIM];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hk);
    const int m0 = blockIdx.x * BLOCK_M;
    q += b * q_b + h * q_h;
    k += b * k_b + hk * k_h;
    v += b * v_b + hk * v_h;
    o += b * o_b + h * o_h + blockIdx.z * o_z;
    lse += blockIdx.z * lse_z;
    const float scale_log2 = scale * 1.4426950408889634f;
    const float keep_scale = (float)(1.0 / (1.0 - dropout_p));
    const bool vec = aligned16(q) && aligned16(k) && aligned16(v) && ((q_l | k_l | v_l | D) & 7) == 0;
    // Whether any of this warp's 16 query rows exists (uniform across the warp).
    const bool active = m0 + warp * 16 < Lq;

    // (Read after the key loop's first barrier.)
    load_tile<BLOCK_M>(Qs, q, q_l, m0, Lq, D, vec, tid);

    float acc[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[n][r] = 0.f;
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.f, 0.f};
    const int row0 = m0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

    const int split_start = blockIdx.z * split_len;
    int k_start = split_start, k_stop = min(Lk, split_start + split_len);
#if CAUSAL
    // The band around the diagonal (lengths below 2^28, offsets within 2^29: the host
    // checks, so these sums fit in int).
    lo += lower_right ? Lk - Lq : 0;
    hi += lower_right ? Lk - Lq : 0;
    // The block's first row sees the earliest keys, its last row the latest.
    k_start = max(k_start, max(0, m0 + lo) / BLOCK_N * BLOCK_N);
    k_stop = max(0, min(k_stop, m0 + BLOCK_M + hi));
#endif
    for (int kb = k_start; kb < k_stop; kb += BLOCK_N) {
        __syncthreads();
        load_tile<BLOCK_N>(Ks, k, k_l, kb, k_stop, D, vec, tid);
        load_tile<BLOCK_N>(Vs, v, v_l, kb, k_stop, D, vec, tid);
        __syncthreads();
        if (!active) continue;

        float s[BLOCK_N / 8][4];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[j][r] = 0.f;
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d += 16) {
            unsigned a[4];
            q_fragment(a, Qs, warp * 16 + g, d, t);
#pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j) {
                unsigned bf[2] = {
                    pair(Ks, 8 * j + g, d + 2 * t),
                    pair(Ks, 8 * j + g, d + 2 * t + 8),
                };
                mma_16(s[j], a, bf, T());
            }
        }

        float block_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int key = kb + 8 * j + 2 * t + (r % 2);
                bool hidden = key >= k_stop;
#if CAUSAL
                const int qi = row0 + (r / 2) * 8;
                hidden = hidden || key > qi + hi || key < qi + lo;
#endif
                s[j][r] = hidden ? NEG_INF : s[j][r] * scale_log2;
                block_max[r / 2] = fmaxf(block_max[r / 2], s[j][r]);
            }
        float alpha[2], ref[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            block_max[i] = fmaxf(block_max[i], __shfl_xor_sync(0xffffffffu, block_max[i], 1));
            block_max[i] = fmaxf(block_max[i], __shfl_xor_sync(0xffffffffu, block_max[i], 2));
            float new_max = fmaxf(row_max[i], block_max[i]);
            ref[i] = new_max == NEG_INF ? 0.f : new_max;  // no visible key yet: keep zeros
            alpha[i] = exp2f(row_max[i] - ref[i]);
            row_max[i] = new_max;
            row_sum[i] *= alpha[i];
        }
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[n][r] *= alpha[r / 2];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                s[j][r] = exp2f(s[j][r] - ref[r / 2]);
                row_sum[r / 2] += s[j][r];  // the softmax sum counts every weight
                if (dropout_p > 0.0) {
                    const unsigned long long row = row0 + (r / 2) * 8;
                    const unsigned long long key = kb + 8 * j + 2 * t + (r % 2);
                    const unsigned long long index = ((unsigned long long)bh * Lq + row) * Lk + key;
                    s[j][r] = dropout_keep(seed, index, dropout_p) ? s[j][r] * keep_scale : 0.f;
                }
            }

#pragma unroll
        for (int c = 0; c < BLOCK_N / 16; ++c) {
            unsigned a[4] = {
                pack2f<T>(s[2 * c][0], s[2 * c][1]),
                pack2f<T>(s[2 * c][2], s[2 * c][3]),
                pack2f<T>(s[2 * c + 1][0], s[2 * c + 1][1]),
                pack2f<T>(s[2 * c + 1][2], s[2 * c + 1][3]),
            };
            const int kr = 16 * c + 2 * t;
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n) {
                const int col = 8 * n + g;
                unsigned bf[2] = {
                    pack2(Vs[kr][col], Vs[kr + 1][col]),
                    pack2(Vs[kr + 8][col], Vs[kr + 9][col]),
                };
                mma_16(acc[n], a, bf, T());
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
        row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = row0 + 8 * i;
        if (row >= Lq) continue;
        const float inv = row_sum[i] != 0.f ? 1.f / row_sum[i] : 0.f;  // NaN rows stay NaN
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) {
            const int col = 8 * n + 2 * t;
            if (col < D) o[row * o_l + col] = from_f32<T>(acc[n][2 * i] * inv);
            if (col + 1 < D) o[row * o_l + col + 1] = from_f32<T>(acc[n][2 * i + 1] * inv);
        }
        if (t == 0)
            lse[(long long)bh * Lq + row] =
                row_sum[i] != 0.f ? (row_max[i] + log2f(row_sum[i])) * 0.6931471805599453f : NEG_INF;
    }
}

#undef BLOCK_M
#undef THREADS
