// Split-KV attention's last step: the partial results of S key chunks combined by their
// log-sum-exps. Chunk s of query row i, head h, wrote O_s = partial[(s * Lq + i) * H * Dv +
// h * Dv + ..] and lse_s = partial_lse[h * S * Lq + s * Lq + i] (a packed varlen call with
// one sequence per chunk); out[(h * Lq + i) * Dv + d] = sum_s w_s O_s[d] / sum_s w_s with
// w_s = exp(lse_s - max lse), and lse[h * Lq + i] = max + log(sum_s w_s). A row no chunk
// saw (every lse -inf) gets 0 and -inf, as the attention kernels give it.
//
// Specialisation: KERNEL, T (float, half_t, bf16_t)
// Launch: grid ceil(H * Lq * Dv / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const T* __restrict__ partial, const float* __restrict__ partial_lse,
    T* __restrict__ out, float* __restrict__ lse, int H, int Lq, int Dv, int S)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)H * Lq * Dv) return;
    const int d = (int)(e % Dv);
    const long long row = e / Dv;
    const int i = (int)(row % Lq), h = (int)(row / Lq);
    const float* l = partial_lse + (long long)h * S * Lq + i;
    float top = NEG_INF;
    for (int s = 0; s < S; ++s) top = fmaxf(top, l[(long long)s * Lq]);
    float sum = 0.f, acc = 0.f;
    if (top != NEG_INF) {
        for (int s = 0; s < S; ++s) {
            const float w = __expf(l[(long long)s * Lq] - top);
            sum += w;
            acc += w * to_f32(partial[((long long)s * Lq + i) * H * Dv + (long long)h * Dv + d]);
        }
    }
    out[e] = from_f32<T>(sum > 0.f ? acc / sum : 0.f);
    if (d == 0) lse[row] = sum > 0.f ? top + __logf(sum) : NEG_INF;
}
