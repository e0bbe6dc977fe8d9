// Split-KV attention's last step: the partial results of S key chunks combined by their
// log-sum-exps. Chunk c of batch b wrote, for query row i of head h, O_c at partial + b * o_b
// + c * o_c + h * o_h + i * o_i (Dv contiguous elements) and lse_c at partial_lse + b * l_b +
// c * l_c + h * l_h + i * l_i. The output row out[((b * H + h) * Lq + i) * Dv + ..] is
// sum_c w_c O_c / sum_c w_c with w_c = exp(lse_c - max lse), and lse[(b * H + h) * Lq + i]
// is max + log(sum_c w_c). A row no chunk saw (every lse -inf) gets 0 and -inf, as the
// attention kernels give it.
//
// Specialisation: KERNEL, T (float, half_t, bf16_t)
// Launch: grid ceil(B * H * Lq * Dv / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    const T* __restrict__ partial, const float* __restrict__ partial_lse,
    T* __restrict__ out, float* __restrict__ lse, int B, int H, int Lq, int Dv, int S,
    long long o_b, long long o_c, long long o_h, long long o_i,
    long long l_b, long long l_c, long long l_h, long long l_i)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * H * Lq * Dv) return;
    const int d = (int)(e % Dv);
    const long long row = e / Dv;
    const int i = (int)(row % Lq), h = (int)(row / Lq % H), b = (int)(row / ((long long)Lq * H));
    const float* l = partial_lse + b * l_b + h * l_h + i * l_i;
    const T* o = partial + b * o_b + h * o_h + i * o_i + d;
    float top = NEG_INF;
    for (int c = 0; c < S; ++c) top = fmaxf(top, l[c * l_c]);
    float sum = 0.f, acc = 0.f;
    if (top != NEG_INF) {
        for (int c = 0; c < S; ++c) {
            const float w = __expf(l[c * l_c] - top);
            sum += w;
            acc += w * to_f32(o[c * o_c]);
        }
    }
    out[e] = from_f32<T>(sum > 0.f ? acc / sum : 0.f);
    if (d == 0) lse[row] = sum > 0.f ? top + __logf(sum) : NEG_INF;
}
