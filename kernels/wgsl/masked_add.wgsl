// Applies an attention mask to scores S[b, h, i, j] in place, for the math path:
// MASK_KIND 1 (boolean; MASK_T = u32 holding one byte per element): S = -inf where false;
// MASK_KIND 2 (additive; MASK_T = T): S += mask. With `causal`, S = -inf where j > i.
// The mask is read through its strides (0 on broadcast dimensions).
//
// Specialisation: alias T, alias MASK_T, const MASK_KIND.
// Dispatch: (ceil(B * H * Lq * Lk / 256), 1, 1), or split over y when that exceeds 65535.

struct Params { B: u32, H: u32, Lq: u32, Lk: u32, causal: u32, m_b: u32, m_h: u32, m_q: u32, m_k: u32, row_groups: u32 }

@group(0) @binding(0) var<storage, read_write> S: array<T>;
@group(0) @binding(1) var<storage, read> mask: array<MASK_T>;
@group(0) @binding(2) var<uniform> p: Params;

fn neg_inf() -> f32 {
    var bits = 0xff800000u;  // a run-time value: a constant infinity is a shader error
    return bitcast<f32>(bits);
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.row_groups + wg.x) * 256u + tid;
    if (i >= p.B * p.H * p.Lq * p.Lk) { return; }
    let kk = i % p.Lk;
    let qq = (i / p.Lk) % p.Lq;
    let h = (i / (p.Lk * p.Lq)) % p.H;
    let b = i / (p.Lk * p.Lq * p.H);
    let index = b * p.m_b + h * p.m_h + qq * p.m_q + kk * p.m_k;
    var s = f32(S[i]);
    if (MASK_KIND == 1u) {
        if (((u32(mask[index / 4u]) >> (8u * (index % 4u))) & 0xffu) == 0u) { s = neg_inf(); }
    } else {
        s += f32(mask[index]);
    }
    if (p.causal != 0u && kk > qq) { s = neg_inf(); }
    S[i] = T(s);
}
