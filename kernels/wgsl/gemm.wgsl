// Batched GEMM: C[b] = A[b] · B[b] over strided views (with offsets), fp32 accumulate.
//
// Specialisation (injected before this text as WGSL declarations):
//   alias T        element type of A, B, C (f32, or f16 where the adapter has shader-f16)
//   const MATH     0: IEEE fp32   1: inputs rounded to TF32 (10-bit mantissa)
//                  2: inputs rounded to bf16 (7-bit mantissa); both emulate reduced-precision
//                  hardware on adapters that have none, and are used only when asked for
//   const BM, BN, BK  block tile; the workgroup is 16 x 16 invocations, each a (BM/16) x (BN/16)
//                  patch of C
//   const CONV     1: an implicit-GEMM convolution. Batch b is image b / groups, group
//                  b % groups; A is the weight [groups, M, K] (A's batch is the group's), B the
//                  input [images, groups · C/g, H, W] (b_batch = C/g · H · W), read as its
//                  unfolding [C/g · kH · kW, H' · W'] (zero where a tap falls in the padding;
//                  b_row and b_col unused); C is [images, groups · M, H' · W'].
// Dispatch: (ceil(N / BN), ceil(M / BM), batches), from batch `batch0` on (a batch larger than a
// dispatch takes runs in several).

struct Params {
    M: u32, N: u32, K: u32, batch: u32,
    a_batch: u32, a_row: u32, a_col: u32,
    b_batch: u32, b_row: u32, b_col: u32,
    c_batch: u32, c_row: u32,
    a_offset: u32, b_offset: u32,  // the first element of each operand's view
    batch0: u32, pad1: u32,
    // CONV only: the groups, the input's height and width, the output's width, the kernel's
    // height and width, the strides, the zeros before each dimension, the dilations.
    groups: u32, height: u32, width: u32, out_w: u32, kh: u32, kw: u32,
    stride_h: u32, stride_w: u32, pad_h: u32, pad_w: u32, dil_h: u32, dil_w: u32,
    pad2: u32, pad3: u32, pad4: u32, pad5: u32,
}

@group(0) @binding(0) var<storage, read> A: array<T>;
@group(0) @binding(1) var<storage, read> B: array<T>;
@group(0) @binding(2) var<storage, read_write> C: array<T>;
@group(0) @binding(3) var<uniform> p: Params;

const TM: u32 = BM / 16u;
const TN: u32 = BN / 16u;
var<workgroup> As: array<f32, BM * BK>;
var<workgroup> Bs: array<f32, BK * BN>;

// Rounds x to nearest keeping `keep` of the 23 mantissa bits: ties away from zero (TF32,
// as cvt.rna.tf32.f32) or, with `even`, ties to even (bf16, as PyTorch converts).
fn round_mantissa(x: f32, keep: u32, even: bool) -> f32 {
    let drop = 23u - keep;
    let bits = bitcast<u32>(x);
    var bias = 1u << (drop - 1u);
    if (even) { bias = bias - 1u + ((bits >> drop) & 1u); }
    return bitcast<f32>((bits + bias) & ~((1u << drop) - 1u));
}

fn load_input(x: T) -> f32 {
    let v = f32(x);
    if (MATH == 1u) { return round_mantissa(v, 10u, false); }
    if (MATH == 2u) { return round_mantissa(v, 7u, true); }
    return v;
}

// B's element (k, n) from its batch's first element `base`.
fn load_b(base: u32, k: u32, n: u32) -> f32 {
    if (CONV == 0u) { return load_input(B[base + k * p.b_row + n * p.b_col]); }
    // Input channel k / (kH · kW), tap k % (kH · kW), at output pixel n; the padded input's
    // row and column (unsigned: the host checks that H and W with their padding fit).
    let taps = p.kh * p.kw;
    let channel = k / taps;
    let tap = k % taps;
    let y = n / p.out_w * p.stride_h + tap / p.kw * p.dil_h;
    let x = n % p.out_w * p.stride_w + tap % p.kw * p.dil_w;
    if (y < p.pad_h || y - p.pad_h >= p.height || x < p.pad_w || x - p.pad_w >= p.width) {
        return 0.0;
    }
    return load_input(B[base + (channel * p.height + y - p.pad_h) * p.width + x - p.pad_w]);
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let b = p.batch0 + wg.z;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    var a_base = p.a_offset + b * p.a_batch;
    if (CONV == 1u) { a_base = p.a_offset + b % p.groups * p.a_batch; }
    let b_base = p.b_offset + b * p.b_batch;
    var acc: array<array<f32, TN>, TM>;
    for (var k0 = 0u; k0 < p.K; k0 += BK) {
        for (var e = tid; e < BM * BK; e += 256u) {
            let r = e / BK;
            let c = e % BK;
            var v = 0.0;
            if (m0 + r < p.M && k0 + c < p.K) {
                v = load_input(A[a_base + (m0 + r) * p.a_row + (k0 + c) * p.a_col]);
            }
            As[e] = v;
        }
        for (var e = tid; e < BK * BN; e += 256u) {
            let r = e / BN;
            let c = e % BN;
            var v = 0.0;
            if (k0 + r < p.K && n0 + c < p.N) {
                v = load_b(b_base, k0 + r, n0 + c);
            }
            Bs[e] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<f32, TM>;
            var bv: array<f32, TN>;
            for (var i = 0u; i < TM; i++) { a[i] = As[(lid.y + 16u * i) * BK + kk]; }
            for (var j = 0u; j < TN; j++) { bv[j] = Bs[kk * BN + lid.x + 16u * j]; }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) { acc[i][j] = fma(a[i], bv[j], acc[i][j]); }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            let m = m0 + lid.y + 16u * i;
            let n = n0 + lid.x + 16u * j;
            if (m < p.M && n < p.N) { C[b * p.c_batch + m * p.c_row + n] = T(acc[i][j]); }
        }
    }
}
