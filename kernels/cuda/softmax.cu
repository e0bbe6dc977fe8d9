// Row softmax for the math attention path: y[r, :] = softmax(x[r, :] * scale), computed in
// fp32; a row that is all -inf gives NaN, as PyTorch's softmax does.
//
// Specialisation: KERNEL, T (element type).
// Launch: grid ceil(rows / 4), block 128 (one warp per row).

extern "C" __global__ void __launch_bounds__(128) KERNEL(
    const T* __restrict__ x, T* __restrict__ y, int rows, int cols, float scale)
{
    const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const T* xr = x + (long long)row * cols;
    T* yr = y + (long long)row * cols;
    float m = NEG_INF;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, to_f32(xr[c]) * scale);
    m = warp_max(m);
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += __expf(to_f32(xr[c]) * scale - m);
    s = warp_sum(s);
    const float inv = 1.f / s;
    for (int c = lane; c < cols; c += 32) yr[c] = from_f32<T>(__expf(to_f32(xr[c]) * scale - m) * inv);
}
