// A convolution's input unfolded for its GEMM (im2col): for images [count, C, H, W], dst
// is [count, C, kH, kW, H', W'] (the GEMM's [C/g · kH · kW, H' · W'] right side of each group
// of each image, one after another), zero where a tap falls in the padding. Elements move
// as opaque words: one variant per element size.
//
// Specialisation: KERNEL, T (unsigned short, unsigned int, unsigned long long)
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const T* __restrict__ src, T* __restrict__ dst, long long n, long long offset,
    long long height, long long width, long long out_h, long long out_w,
    int kh, int kw, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long pixels = out_h * out_w;
    const long long pixel = i % pixels, row = i / pixels;
    const long long taps = (long long)kh * kw;
    const long long tap = row % taps, plane = row / taps;
    const long long iy = pixel / out_w * stride_h + tap / kw * dil_h - pad_h;
    const long long ix = pixel % out_w * stride_w + tap % kw * dil_w - pad_w;
    T value = 0;
    if (iy >= 0 && iy < height && ix >= 0 && ix < width)
        value = src[offset + (plane * height + iy) * width + ix];
    dst[i] = value;
}
