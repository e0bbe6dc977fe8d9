// The softmax step of math attention on the device: P = softmax(S * scale + mask) per row of
// raw scores S = Q K^T, in f32 arithmetic, with a band (causal mask, sliding window: with
// `band` set, key j is visible to query i only when i + diag + lo <= j <= i + diag + hi,
// diag 0 top-left aligned (`lower_right` 0) or Lk - Lq bottom-right) and an optional
// mask read through its [B, H, Lq, Lk] strides (0 on broadcast dimensions). A row that sees no key gets P = 0 (PyTorch's safe softmax), a row with a NaN
// score NaN. No dropout:
// WGSL has no 64-bit integers for the host's dropout draw.
//
// Specialisation (injected before this text as WGSL declarations):
//   alias T          element type of S and P (f32)
//   alias MASK_T     mask word: u32 (boolean masks, one byte per element, packed) or T (additive)
//   const MASK_KIND  0 none, 1 boolean (false hides a key), 2 additive
// The mask readers (mask_hides, mask_bias) come from mask.wgsl, prepended by the generator.
// Dispatch: (groups_x, ceil(rows / groups_x), 1), one workgroup of 256 per row, rows in
// (b, h, i) order; S and P are contiguous [rows, Lk].

struct Params {
    rows: u32, H: u32, Lq: u32, Lk: u32,
    scale: f32, band: u32, groups_x: u32, m_offset: u32,
    m_b: u32, m_h: u32, m_q: u32, m_k: u32,
    lo: i32, hi: i32, lower_right: u32,
}

@group(0) @binding(0) var<storage, read> S: array<T>;
@group(0) @binding(1) var<storage, read> mask: array<MASK_T>;
@group(0) @binding(2) var<storage, read_write> P: array<T>;
@group(0) @binding(3) var<uniform> p: Params;

const THREADS: u32 = 256u;
// WGSL has no infinity constant: hidden keys score a finite sentinel far below any real
// score (an additive mask's -inf stays -inf, below it).
const HIDDEN: f32 = -1.0e30;
var<workgroup> scratch: array<f32, 256>;

// NaN by its bits: `max` may drop a NaN operand, and compares are ordered.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn nan() -> f32 {
    var bits = 0x7fc00000u;  // a run-time value, as a constant NaN is a shader error
    return bitcast<f32>(bits);
}

// The diagonal of the band: 0 top-left aligned, Lk - Lq bottom-right.
fn diag() -> i32 {
    return select(0, i32(p.Lk) - i32(p.Lq), p.lower_right != 0u);
}

// The masked, scaled score of key j of query i in row `base` of S (mask row at `m_base`).
fn score(base: u32, m_base: u32, i: u32, j: u32) -> f32 {
    if ((p.band != 0u && (i32(j) > i32(i) + diag() + p.hi || i32(j) < i32(i) + diag() + p.lo)) || mask_hides(m_base + j * p.m_k)) { return HIDDEN; }
    return f32(S[base + j]) * p.scale + mask_bias(m_base + j * p.m_k);
}

// The workgroup's maximum (or sum) of one value per invocation, for every invocation.
fn reduce(x: f32, tid: u32, sum: bool) -> f32 {
    scratch[tid] = x;
    workgroupBarrier();
    for (var half = THREADS / 2u; half > 0u; half = half / 2u) {
        if (tid < half) {
            let other = scratch[tid + half];
            scratch[tid] = select(max(scratch[tid], other), scratch[tid] + other, sum);
        }
        workgroupBarrier();
    }
    // A uniform value: the branches on it around later barriers are uniform.
    let all = workgroupUniformLoad(&scratch[0]);
    workgroupBarrier();
    return all;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // Every invocation of a workgroup takes the same branches around the barriers.
    let row = wg.y * p.groups_x + wg.x;
    if (row >= p.rows) { return; }
    let i = row % p.Lq;
    let h = (row / p.Lq) % p.H;
    let b = row / p.Lq / p.H;
    let base = row * p.Lk;
    let m_base = p.m_offset + b * p.m_b + h * p.m_h + i * p.m_q;
    var top = HIDDEN;
    var saw_nan = 0.0;
    for (var j = tid; j < p.Lk; j += THREADS) {
        let x = score(base, m_base, i, j);
        if (is_nan(x)) { saw_nan = 1.0; }
        top = max(top, x);
    }
    top = reduce(top, tid, false);
    saw_nan = reduce(saw_nan, tid, false);
    if (saw_nan > 0.0) {
        for (var j = tid; j < p.Lk; j += THREADS) { P[base + j] = T(nan()); }
        return;
    }
    if (top <= HIDDEN) {
        for (var j = tid; j < p.Lk; j += THREADS) { P[base + j] = T(0.0); }
        return;
    }
    var total = 0.0;
    for (var j = tid; j < p.Lk; j += THREADS) { total += exp(score(base, m_base, i, j) - top); }
    total = reduce(total, tid, true);
    for (var j = tid; j < p.Lk; j += THREADS) {
        P[base + j] = T(exp(score(base, m_base, i, j) - top) / total);
    }
}
