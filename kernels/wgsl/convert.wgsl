// Converts a buffer between a half type (bf16 or f16) and f32, element by element. WGSL has
// no bf16 (and f16 only with an extension): a half-type buffer holds pairs of elements in
// u32 words (the lower half first), so both sides are read and written as u32 words (f32
// elements as their bits). Ops on bf16 wgpu tensors widen the buffers to f32, compute in f32
// and round the result back; math attention widens its half-type inputs so.
//
// Specialisation: NARROW (0: half -> f32, one invocation per element; 1: f32 -> half,
// rounded to nearest even as PyTorch rounds, NaN kept a quiet NaN; one invocation per
// word, the upper half of a last odd word 0), F16 (1: the half type is f16, 0: bf16).
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

// The f16 bits nearest the f32 with bits `x` (ties to even; past the largest f16, infinity).
fn f16_bits(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u; // 65520 and above round to infinity
    }
    if (a >= 0x38800000u) {
        // Normal: the exponent rebiased from 127 to 15, 13 mantissa bits rounded off.
        let r = a - 0x38000000u;
        return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    if (a < 0x33000000u) {
        return sign; // below half the smallest subnormal (2^-25 itself ties to 0)
    }
    // Subnormal: the 24-bit significand in units of 2^-24, rounded.
    let shift = 126u - (a >> 23u);
    let m = (a & 0x7fffffu) | 0x800000u;
    let q = m >> shift;
    let rest = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rest > half || (rest == half && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}

fn half_bits(x: u32) -> u32 {
    if (F16 == 1u) {
        return f16_bits(x);
    }
    return bf16_bits(x);
}

// The f32 bits of the half-type element in the lower 16 bits of `h` (exact).
fn f32_bits(h: u32) -> u32 {
    if (F16 == 1u) {
        return bitcast<u32>(unpack2x16float(h).x);
    }
    return h << 16u;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (NARROW == 0u) {
        if (i >= p.n) { return; }
        let at = p.offset + i;
        let word = src[at / 2u];
        dst[i] = f32_bits(select(word & 0xffffu, word >> 16u, (at & 1u) == 1u));
    } else {
        if (i >= (p.n + 1u) / 2u) { return; }
        let low = half_bits(src[p.offset + 2u * i]);
        var high = 0u;
        if (2u * i + 1u < p.n) {
            high = half_bits(src[p.offset + 2u * i + 1u]);
        }
        dst[i] = low | (high << 16u);
    }
}
