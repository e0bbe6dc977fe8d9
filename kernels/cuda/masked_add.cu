// Applies an attention mask to scores S[b, h, i, j] in place, for the math path:
// MASK_KIND 1 (boolean, M = unsigned char): S = -inf where the mask is false;
// MASK_KIND 2 (additive, M = T): S += mask. With `causal`, S = -inf where j > i (top-left).
// The mask is broadcast through its strides (0 on broadcast dimensions).
//
// Specialisation: KERNEL, T (score type), M (mask type), MASK_KIND.
// Launch: grid ceil(B * H * Lq * Lk / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    T* __restrict__ S, const M* __restrict__ mask, int B, int H, int Lq, int Lk, int causal,
    long long m_b, long long m_h, long long m_q, long long m_k)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * H * Lq * Lk) return;
    const int k = i % Lk, q = (i / Lk) % Lq, h = (i / ((long long)Lk * Lq)) % H;
    const int b = i / ((long long)Lk * Lq * H);
    const M mv = mask[b * m_b + h * m_h + q * m_q + k * m_k];
    float s = to_f32(S[i]);
#if MASK_KIND == 1
    if (!mv) s = NEG_INF;
#else
    s += to_f32(mv);
#endif
    if (causal && k > q) s = NEG_INF;
    S[i] = from_f32<T>(s);
}
