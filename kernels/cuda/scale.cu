// Multiplies every element of x by `factor` in place: the 1/n of the inverse FFTs, which
// cuFFT leaves unnormalised.
//
// Specialisation: KERNEL, T (float or double).
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(T* __restrict__ x, long long n, double factor)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (T)(x[i] * factor);
}
