// Converts n contiguous elements between a half type and f32: out[i] = in[i] through f32,
// rounded to nearest even where TO is the half type (as PyTorch rounds).
//
// Specialisation: KERNEL, FROM, TO (float, half_t or bf16_t).
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const FROM* __restrict__ in, TO* __restrict__ out, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<TO>(to_f32(in[i]));
}
