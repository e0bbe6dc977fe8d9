// Adds a per-channel bias in place: x[i] += bias[(i / inner) % channels], for x laid out
// [outer, channels, inner] (a convolution's [N, O, H' · W'] output), the sum in f32 (f64
// for doubles) rounded once to T.
//
// Specialisation: KERNEL, T (float, double, half_t, bf16_t), IS_F64 (1 for double)
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    T* __restrict__ x, const T* __restrict__ bias, long long n, long long inner, long long channels)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T b = bias[i / inner % channels];
#if IS_F64
    x[i] = x[i] + b;
#else
    x[i] = from_f32<T>(to_f32(x[i]) + to_f32(b));
#endif
}
