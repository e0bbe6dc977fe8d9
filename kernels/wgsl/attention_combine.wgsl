// Split-KV attention's last step: the partial results of S key chunks combined by their
// log-sum-exps (see kernels/cuda/attention_combine.cu for the layouts and strides).
//
// Specialisation: T (f32, or f16 with shader-f16).
// Dispatch: (groups_x, ceil(ceil(B * H * Lq * Dv / 256) / groups_x), 1), 256 invocations
// per workgroup.

struct Params {
    B: u32, H: u32, Lq: u32, Dv: u32, S: u32, groups_x: u32, pad0: u32, pad1: u32,
    o_b: u32, o_c: u32, o_h: u32, o_i: u32, l_b: u32, l_c: u32, l_h: u32, l_i: u32,
}

@group(0) @binding(0) var<storage, read> partial: array<T>;
@group(0) @binding(1) var<storage, read> partial_lse: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let e = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (e >= p.B * p.H * p.Lq * p.Dv) { return; }
    let d = e % p.Dv;
    let row = e / p.Dv;
    let i = row % p.Lq;
    let h = row / p.Lq % p.H;
    let b = row / (p.Lq * p.H);
    let l0 = b * p.l_b + h * p.l_h + i * p.l_i;
    let o0 = b * p.o_b + h * p.o_h + i * p.o_i + d;
    var top = -3.4028235e38;
    var seen = false;
    for (var c = 0u; c < p.S; c++) {
        let l = partial_lse[l0 + c * p.l_c];
        // -inf (a chunk that saw no key) is below every finite value.
        if (l > top) { top = l; seen = true; }
    }
    var sum = 0.0;
    var acc = 0.0;
    if (seen) {
        for (var c = 0u; c < p.S; c++) {
            let w = exp(partial_lse[l0 + c * p.l_c] - top);
            sum += w;
            acc += w * f32(partial[o0 + c * p.o_c]);
        }
    }
    out[e] = T(select(0.0, acc / sum, sum > 0.0));
    if (d == 0u) {
        lse[row] = select(-bitcast<f32>(0x7f800000u), top + log(sum), sum > 0.0);
    }
}
