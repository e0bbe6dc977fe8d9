// The softmax step of math attention on the device: P = softmax(S * scale + mask) per row of
// raw scores S = Q K^T, in f32 arithmetic, with a band (causal mask, sliding window: with
// `band` set, key j is visible to query i only when i + diag + lo <= j <= i + diag + hi,
// diag 0 top-left aligned (`lower_right` 0) or Lk - Lq bottom-right) and an optional
// mask read through its [B, H, Lq, Lk] strides (0 on broadcast dimensions). A row that sees no key gets P = 0 (PyTorch's safe softmax), a row with a NaN
// score NaN. With
// dropout_p > 0, each weight is kept with probability 1 - dropout_p (scaled by
// 1 / (1 - dropout_p)) by `dropout_keep(seed, index)`, the host's decision.
//
// Specialisation: KERNEL, T (float), MASK_KIND (0 none, 1 boolean: M is unsigned char and
//   false hides a key, 2 additive: M is T), M
// Launch: grid (B * H * Lq), block 256; S and P are contiguous [B * H * Lq, Lk], rows in
// (b, h, i) order.

#define THREADS 256

// The block's maximum (or sum) of one value per thread, for every thread.
__device__ __forceinline__ float block_reduce(float x, bool sum, float* scratch)
{
    x = sum ? warp_sum(x) : warp_max(x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < THREADS / 32 ? scratch[lane] : (sum ? 0.f : NEG_INF);
    return sum ? warp_sum(x) : warp_max(x);
}

extern "C" __global__ void __launch_bounds__(THREADS) KERNEL(
    const T* __restrict__ s, const M* __restrict__ mask, T* __restrict__ p,
    int H, int Lq, int Lk, float scale, int band, int lo, int hi, int lower_right,
    long long m_b, long long m_h, long long m_q, long long m_k,
    double dropout_p, unsigned long long seed)
{
    __shared__ float scratch[THREADS / 32];
    const long long row = blockIdx.x;
    const int i = (int)(row % Lq), h = (int)(row / Lq % H);
    const long long b = row / Lq / H;
    s += row * Lk;
    p += row * Lk;
#if MASK_KIND
    mask += b * m_b + h * m_h + i * m_q;
#endif
    const int diag = lower_right ? Lk - Lq : 0;
    lo += diag;
    hi += diag;
    // The masked, scaled score of key j (-inf where hidden).
    auto score = [&](int j) -> float {
        if (band && (j > i + hi || j < i + lo)) return NEG_INF;
#if MASK_KIND == 1
        if (!mask[j * m_k]) return NEG_INF;
#endif
        float x = to_f32(s[j]) * scale;
#if MASK_KIND == 2
        x += to_f32(mask[j * m_k]);
#endif
        return x;
    };
    float top = NEG_INF, saw_nan = 0.f;
    for (int j = threadIdx.x; j < Lk; j += THREADS) {
        const float x = score(j);
        if (x != x) saw_nan = 1.f;
        top = fmaxf(top, x);  // fmaxf drops a NaN operand: saw_nan keeps it
    }
    top = block_reduce(top, false, scratch);
    if (block_reduce(saw_nan, false, scratch) > 0.f) {
        for (int j = threadIdx.x; j < Lk; j += THREADS) p[j] = from_f32<T>(__int_as_float(0x7fc00000));
        return;
    }
    if (top == NEG_INF) {
        for (int j = threadIdx.x; j < Lk; j += THREADS) p[j] = from_f32<T>(0.f);
        return;
    }
    float total = 0.f;
    for (int j = threadIdx.x; j < Lk; j += THREADS) total += __expf(score(j) - top);
    total = block_reduce(total, true, scratch);
    const float keep_scale = dropout_p > 0.0 ? (float)(1.0 / (1.0 - dropout_p)) : 1.f;
    for (int j = threadIdx.x; j < Lk; j += THREADS) {
        float w = __expf(score(j) - top) / total;
        if (dropout_p > 0.0) w = dropout_keep(seed, row * Lk + j, dropout_p) ? w * keep_scale : 0.f;
        p[j] = from_f32<T>(w);
    }
}
