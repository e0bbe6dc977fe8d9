// A strided view copied into a contiguous buffer: dst[i] = src[offset + sum_d index_d(i) *
// stride_d], index(i) being i's row-major index over `shape` (8 dimensions, unused leading
// ones of size 1 and stride 0). Elements move as opaque words: one variant per element size.
//
// Specialisation: KERNEL, T (unsigned short, unsigned int, unsigned long long)
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const T* __restrict__ src, T* __restrict__ dst, long long n, long long offset,
    long long s0, long long s1, long long s2, long long s3,
    long long s4, long long s5, long long s6, long long s7,
    long long t0, long long t1, long long t2, long long t3,
    long long t4, long long t5, long long t6, long long t7)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long shape[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    const long long stride[8] = {t0, t1, t2, t3, t4, t5, t6, t7};
    long long rest = i, at = offset;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
        at += rest % shape[d] * stride[d];
        rest /= shape[d];
    }
    dst[i] = src[at];
}
