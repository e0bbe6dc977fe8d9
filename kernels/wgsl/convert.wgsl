// Converts a whole buffer between bf16 and f32, element by element. WGSL has no bf16: a bf16
// buffer holds pairs of elements in u32 words (the lower half first), so both sides are
// read and written as u32 words (f32 elements as their bits). Ops on bf16 wgpu tensors
// widen the buffers to f32, compute in f32 and round the result back.
//
// Specialisation: TO_BF16 (0: bf16 -> f32, one invocation per element; 1: f32 -> bf16,
// rounded to nearest even with NaN as 0x7fc0, as PyTorch rounds; one invocation per word,
// the upper half of a last odd word 0).
// Dispatch: (groups_x, ceil(ceil(count / 256) / groups_x), 1), 256 invocations per workgroup,
// count = n (widening) or ceil(n / 2) (rounding).

// n elements converted from element `offset` of src.
struct Params {
    n: u32, groups_x: u32, offset: u32, pad0: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

// The bf16 bits nearest the f32 with bits `x` (ties to even).
fn bf16_bits(x: u32) -> u32 {
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (TO_BF16 == 0u) {
        if (i >= p.n) { return; }
        let at = p.offset + i;
        let word = src[at / 2u];
        dst[i] = select(word << 16u, word & 0xffff0000u, (at & 1u) == 1u);
    } else {
        if (i >= (p.n + 1u) / 2u) { return; }
        let low = bf16_bits(src[p.offset + 2u * i]);
        var high = 0u;
        if (2u * i + 1u < p.n) {
            high = bf16_bits(src[p.offset + 2u * i + 1u]);
        }
        dst[i] = low | (high << 16u);
    }
}
