// Adds split-K partial sums P[splits][batch][M][N] into C (strided), always in split order,
// so the result is the same run to run.
//
// Specialisation: KERNEL, T (element type of C), P (partial type),
//   REDUCE_IN_P  1: round the running sum to P after each add (reduced-precision reduction)
// Launch: grid ceil(batch * M * N / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const P* __restrict__ partials, T* __restrict__ C,
    int M, int N, int batch, int splits, long long c_batch, long long c_row)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long mn = (long long)M * N;
    if (i >= mn * batch) return;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) {
        sum += to_f32(partials[s * mn * batch + i]);
#if REDUCE_IN_P
        sum = to_f32(from_f32<P>(sum));
#endif
    }
    const long long b = i / mn, m = (i % mn) / N, n = i % N;
    C[b * c_batch + m * c_row + n] = from_f32<T>(sum);
}
