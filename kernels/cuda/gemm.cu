// Batched GEMM: C[b] = A[b] · B[b] over strided views, fp32 accumulate (or fp16 with ACC_F16).
//
// Specialisation (injected as #defines):
//   KERNEL   entry point name
//   T        element type of A, B, C (float, half_t, bf16_t)
//   MATH     0: fp32 FFMA (IEEE)   1: TF32 tensor cores   2: bf16 tensor cores
//            (fp32 inputs rounded to bf16 when T is float)   3: fp16 tensor cores
//   ACC_F16  1: fp16 accumulators (MATH 3 only)
//   P        type of split-K partial sums (float, or T when reduced-precision reduction is allowed)
//   CONV     1: an implicit-GEMM convolution. Batch b is image b / groups, group b % groups;
//            A is the weight [groups, M, K] (A += (b % groups) * a_batch), B the input
//            [images, groups · C/g, H, W] (B += b * b_batch, b_batch = C/g · H · W), read as
//            its unfolding [C/g · kH · kW, H' · W'] (zero where a tap falls in the padding;
//            b_row and b_col unused); C is [images, groups · M, H' · W'].
//   BM, BN, BK  block tile; 128 threads = 2 x 2 warps, each a (BM/2) x (BN/2) warp tile
//
// Launch: grid (ceil(N/BN), ceil(M/BM), batch * splits), block 128.
// With splits == 1 the block writes C; otherwise it writes its K slice's partial sums to
// `out` as P[splits][batch][M][N], and splitk_reduce adds them up in a fixed order.

#define THREADS 128
#define WM (BM / 2)
#define WN (BN / 2)
#if MATH == 0
typedef float smem_t;
#define MMA_K 1
#elif MATH == 1
typedef float smem_t;
#define MMA_K 8
#else
typedef unsigned short smem_t;
#define MMA_K 16
#endif

__device__ __forceinline__ smem_t to_smem(T x) {
#if MATH == 0 || MATH == 1
    return to_f32(x);
#elif MATH == 2
    return from_f32<bf16_t>(to_f32(x)).bits;
#else
    return from_f32<half_t>(to_f32(x)).bits;
#endif
}

__device__ __forceinline__ void store_out(void* out, long long index, float v, bool partial) {
    if (partial) ((P*)out)[index] = from_f32<P>(v);
    else ((T*)out)[index] = from_f32<T>(v);
}

#if CONV
// The convolution's sizes: B's element (k, n) is input channel k / (kH · kW), tap
// k % (kH · kW), at output pixel n.
struct Conv {
    int groups, height, width, out_w, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

__device__ __forceinline__ T unfolded(const T* B, const Conv& cv, int gk, int gn) {
    const int taps = cv.kh * cv.kw;
    const int channel = gk / taps, tap = gk - channel * taps;
    const int oy = gn / cv.out_w, ox = gn - oy * cv.out_w;
    const int iy = oy * cv.stride_h + tap / cv.kw * cv.dil_h - cv.pad_h;
    const int ix = ox * cv.stride_w + tap % cv.kw * cv.dil_w - cv.pad_w;
    if (iy < 0 || iy >= cv.height || ix < 0 || ix >= cv.width) return from_f32<T>(0.f);
    return B[((long long)channel * cv.height + iy) * cv.width + ix];
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL(
    const T* __restrict__ A, const T* __restrict__ B, void* __restrict__ out,
    int M, int N, int K, int batch, int splits, int k_slice,
    long long a_batch, long long a_row, long long a_col,
    long long b_batch, long long b_row, long long b_col,
    long long c_batch, long long c_row
#if CONV
    , int groups, int height, int width, int out_w, int kh, int kw,
    int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w
#endif
    )
{
#if CONV
    const Conv cv = {groups, height, width, out_w, kh, kw, stride_h, stride_w, pad_h, pad_w,
                     dil_h, dil_w};
#endif
    __shared__ smem_t As[BM][BK + 1];
    __shared__ smem_t Bs[BN][BK + 1];

    const int tid = threadIdx.x;
    const int bz = blockIdx.z;
    const int b = bz / splits, split = bz % splits;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_begin = split * k_slice;
    const int k_end = min(K, k_begin + k_slice);
#if CONV
    A += (b % cv.groups) * a_batch;
#else
    A += b * a_batch;
#endif
    B += b * b_batch;

#if MATH == 0
    // 16 x 8 threads, each owning 8 rows x (BN / 16) columns.
    const int tx = tid % 16, ty = tid / 16;
    float acc[BM / 8][BN / 16];
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) acc[i][j] = 0.f;
#else
    const int warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int wm0 = (warp / 2) * WM, wn0 = (warp % 2) * WN;
#if ACC_F16
    unsigned acc[WM / 16][WN / 8][2];
#else
    float acc[WM / 16][WN / 8][4];
#endif
#pragma unroll
    for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
#pragma unroll
            for (int r = 0; r < (ACC_F16 ? 2 : 4); ++r) ((float*)acc[i][j])[r] = 0.f;
#endif

    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        for (int e = tid; e < BM * BK; e += THREADS) {
            int r = e / BK, c = e % BK;
            int gm = m0 + r, gk = k0 + c;
            As[r][c] = (gm < M && gk < k_end) ? to_smem(A[gm * a_row + gk * a_col]) : (smem_t)0;
        }
        for (int e = tid; e < BN * BK; e += THREADS) {
            int r = e / BK, c = e % BK;
            int gn = n0 + r, gk = k0 + c;
#if CONV
            Bs[r][c] = (gn < N && gk < k_end) ? to_smem(unfolded(B, cv, gk, gn)) : (smem_t)0;
#else
            Bs[r][c] = (gn < N && gk < k_end) ? to_smem(B[gk * b_row + gn * b_col]) : (smem_t)0;
#endif
        }
        __syncthreads();

#if MATH == 0
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[BM / 8], bv[BN / 16];
#pragma unroll
            for (int i = 0; i < BM / 8; ++i) a[i] = As[ty + 8 * i][kk];
#pragma unroll
            for (int j = 0; j < BN / 16; ++j) bv[j] = Bs[tx + 16 * j][kk];
#pragma unroll
            for (int i = 0; i < BM / 8; ++i)
#pragma unroll
                for (int j = 0; j < BN / 16; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
        }
#else
#pragma unroll
        for (int kk = 0; kk < BK; kk += MMA_K) {
            unsigned af[WM / 16][4], bf[WN / 8][2];
#pragma unroll
            for (int i = 0; i < WM / 16; ++i) {
                const int r = wm0 + 16 * i + g;
#if MATH == 1
                af[i][0] = to_tf32(As[r][kk + t]);
                af[i][1] = to_tf32(As[r + 8][kk + t]);
                af[i][2] = to_tf32(As[r][kk + t + 4]);
                af[i][3] = to_tf32(As[r + 8][kk + t + 4]);
#else
                af[i][0] = pack2(As[r][kk + 2 * t], As[r][kk + 2 * t + 1]);
                af[i][1] = pack2(As[r + 8][kk + 2 * t], As[r + 8][kk + 2 * t + 1]);
                af[i][2] = pack2(As[r][kk + 2 * t + 8], As[r][kk + 2 * t + 9]);
                af[i][3] = pack2(As[r + 8][kk + 2 * t + 8], As[r + 8][kk + 2 * t + 9]);
#endif
            }
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) {
                const int n = wn0 + 8 * j + g;
#if MATH == 1
                bf[j][0] = to_tf32(Bs[n][kk + t]);
                bf[j][1] = to_tf32(Bs[n][kk + t + 4]);
#else
                bf[j][0] = pack2(Bs[n][kk + 2 * t], Bs[n][kk + 2 * t + 1]);
                bf[j][1] = pack2(Bs[n][kk + 2 * t + 8], Bs[n][kk + 2 * t + 9]);
#endif
            }
#pragma unroll
            for (int i = 0; i < WM / 16; ++i)
#pragma unroll
                for (int j = 0; j < WN / 8; ++j) {
#if MATH == 1
                    mma_tf32_f32(acc[i][j], af[i], bf[j]);
#elif MATH == 2
                    mma_bf16_f32(acc[i][j], af[i], bf[j]);
#elif ACC_F16
                    mma_f16_f16(acc[i][j], af[i], bf[j]);
#else
                    mma_f16_f32(acc[i][j], af[i], bf[j]);
#endif
                }
        }
#endif
        __syncthreads();
    }

    const bool partial = splits > 1;
    const long long base = partial ? ((long long)split * batch + b) * M * N : b * c_batch;
    const long long row_stride = partial ? N : c_row;
#if MATH == 0
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
            int gm = m0 + ty + 8 * i, gn = n0 + tx + 16 * j;
            if (gm < M && gn < N) store_out(out, base + gm * row_stride + gn, acc[i][j], partial);
        }
#else
#pragma unroll
    for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                int gm = m0 + wm0 + 16 * i + g + (r / 2) * 8;
                int gn = n0 + wn0 + 8 * j + 2 * t + (r % 2);
#if ACC_F16
                half_t h;
                h.bits = (unsigned short)(acc[i][j][r / 2] >> (16 * (r % 2)));
                float v = to_f32(h);
#else
                float v = acc[i][j][r];
#endif
                if (gm < M && gn < N) store_out(out, base + gm * row_stride + gn, v, partial);
            }
#endif
}

#undef THREADS
#undef WM
#undef WN
#undef MMA_K
