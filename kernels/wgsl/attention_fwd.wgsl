// Attention forward for wgpu, shared by the flash and memory-efficient families:
// O = softmax(Q K^T * scale + mask) V, tiled over keys with an online softmax in fp32, never
// materialising the Lq x Lk score matrix; writes the natural-log log-sum-exp per query row.
// A query row with no visible key gets O = 0 and lse = -inf.
//
// Specialisation (injected before this text):
//   alias T          storage type of q, k, v, o (f32, or f16 with shader-f16)
//   alias MASK_T     mask word: u32 (boolean masks, one byte per element, packed) or T (additive)
//   const MASK_KIND  0 none, 1 boolean (false hides a key), 2 additive
// The mask readers (mask_hides, mask_bias) come from mask.wgsl, prepended by the generator.
//   const CAUSAL     the band (causal mask, sliding window): 0 off, 1 on, 2 read from the
//                    parameters (`band`); in it key j is visible to query i only when
//                    i + diag + lo <= j <= i + diag + hi, diag 0 top-left aligned
//                    (`lower_right` 0) or Lk - Lq bottom-right (each sequence's own lengths)
//   const D_MAX      largest head dim served (the flash family uses the exact head dim)
//   const BLOCK_M, BLOCK_N  query rows per workgroup, keys per step; 64 invocations,
//                    64 / BLOCK_M of them per query row
// Dispatch: (ceil(Lq / BLOCK_M), B * H, 1). Layout: [B, H(k), L, D] with the last dimension
// contiguous and the other strides given; key/value head = h / (H / Hk).
// Sequences (`seqs` 1 packed, 2 paged; 0 dense), read from `seq`: packed, sequence b's
// query rows start at row seq[b] (Lq = seq[b + 1] - seq[b]) and its key rows at
// seq[seq_k + b] (likewise); paged, its Lk is seq[seq_k + b] and key j lies in cache row
// seq[table + b * per_seq + j / block] * block + j % block. Lq and Lk then bound the
// sequences' lengths (the dispatch), and the log-sum-exp of query i is at
// b * lse_b + h * lse_h + first query row + i.

struct Params {
    H: u32, Hk: u32, Lq: u32, Lk: u32, D: u32, band: u32, scale: f32, lo: i32, hi: i32,
    lower_right: u32,
    q_b: u32, q_h: u32, q_l: u32, k_b: u32, k_h: u32, k_l: u32,
    v_b: u32, v_h: u32, v_l: u32, o_b: u32, o_h: u32, o_l: u32,
    m_b: u32, m_h: u32, m_q: u32, m_k: u32,
    seqs: u32, seq_k: u32, table: u32, per_seq: u32, block: u32, lse_b: u32, lse_h: u32,
}

@group(0) @binding(0) var<storage, read> q: array<T>;
@group(0) @binding(1) var<storage, read> k: array<T>;
@group(0) @binding(2) var<storage, read> v: array<T>;
@group(0) @binding(3) var<storage, read> mask: array<MASK_T>;
@group(0) @binding(4) var<storage, read_write> o: array<T>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
@group(0) @binding(6) var<storage, read> seq: array<u32>;
@group(0) @binding(7) var<uniform> p: Params;

const THREADS: u32 = 64u;
const TPR: u32 = THREADS / BLOCK_M;
// WGSL has no infinity constant: hidden scores use a finite sentinel far below any real score.
const HIDDEN: f32 = -1.0e30;
var<workgroup> Qs: array<f32, BLOCK_M * D_MAX>;
var<workgroup> Ks: array<f32, BLOCK_N * D_MAX>;
var<workgroup> Vs: array<f32, BLOCK_N * D_MAX>;
var<workgroup> Ps: array<f32, BLOCK_M * BLOCK_N>;
// The workgroup's sequence, read once: first query row, first key row, Lq, Lk.
var<workgroup> seq_q0: u32;
var<workgroup> seq_k0: u32;
var<workgroup> seq_lq: u32;
var<workgroup> seq_lk: u32;

// The cache row of key j of sequence b (paged), or its row in k and v.
fn key_row(b: u32, k0: u32, j: u32) -> u32 {
    if (p.seqs == 2u) {
        return seq[p.table + b * p.per_seq + j / p.block] * p.block + j % p.block;
    }
    return k0 + j;
}

fn neg_inf() -> f32 {
    var bits = 0xff800000u;  // a run-time value: a constant infinity is a shader error
    return bitcast<f32>(bits);
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row = tid / TPR;
    let sub = tid % TPR;
    let bh = wg.y;
    let b = bh / p.H;
    let h = bh % p.H;
    let hk = h / (p.H / p.Hk);
    let m0 = wg.x * BLOCK_M;
    let qi = m0 + row;
    if (tid == 0u) {
        var q0 = 0u;
        var k0 = 0u;
        var lq = p.Lq;
        var lk = p.Lk;
        if (p.seqs == 1u) {
            q0 = seq[b];
            lq = seq[b + 1u] - q0;
            k0 = seq[p.seq_k + b];
            lk = seq[p.seq_k + b + 1u] - k0;
        } else if (p.seqs == 2u) {
            lk = seq[p.seq_k + b];
        }
        seq_q0 = q0;
        seq_k0 = k0;
        seq_lq = lq;
        seq_lk = lk;
    }
    // Uniform over the workgroup (the barriers below need it).
    let Lq = workgroupUniformLoad(&seq_lq);
    let Lk = workgroupUniformLoad(&seq_lk);
    let q0 = workgroupUniformLoad(&seq_q0);
    let k0 = workgroupUniformLoad(&seq_k0);
    if (m0 >= Lq) { return; }
    let q_base = b * p.q_b + h * p.q_h + q0 * p.q_l;
    let k_base = b * p.k_b + hk * p.k_h;
    let v_base = b * p.v_b + hk * p.v_h;
    let o_base = b * p.o_b + h * p.o_h + q0 * p.o_l;
    let m_base = b * p.m_b + h * p.m_h + min(qi, Lq - 1u) * p.m_q;
    let banded = CAUSAL == 1u || (CAUSAL == 2u && p.band != 0u);
    // The band around this sequence's diagonal (lengths below 2^28, offsets within 2^29:
    // the host checks, so these sums fit in i32).
    let diag = select(0, i32(Lk) - i32(Lq), p.lower_right != 0u);
    let lo = p.lo + diag;
    let hi = p.hi + diag;

    for (var e = tid; e < BLOCK_M * D_MAX; e += THREADS) {
        let r = e / D_MAX;
        let c = e % D_MAX;
        var x = 0.0;
        if (m0 + r < Lq && c < p.D) { x = f32(q[q_base + (m0 + r) * p.q_l + c]); }
        Qs[e] = x;
    }
    var acc: array<f32, D_MAX / TPR>;
    var row_max = HIDDEN;
    var row_sum = 0.0;

    var k_start = 0u;
    var k_stop = Lk;
    // The block's first row sees the earliest keys, its last row the latest.
    if (banded) {
        k_start = u32(max(i32(m0) + lo, 0)) / BLOCK_N * BLOCK_N;
        k_stop = u32(clamp(i32(m0 + BLOCK_M) + hi, 0, i32(Lk)));
    }
    for (var kb = k_start; kb < k_stop; kb += BLOCK_N) {
        workgroupBarrier();
        for (var e = tid; e < BLOCK_N * D_MAX; e += THREADS) {
            let r = e / D_MAX;
            let c = e % D_MAX;
            var kx = 0.0;
            var vx = 0.0;
            if (kb + r < Lk && c < p.D) {
                let at = key_row(b, k0, kb + r);
                kx = f32(k[k_base + at * p.k_l + c]);
                vx = f32(v[v_base + at * p.v_l + c]);
            }
            Ks[e] = kx;
            Vs[e] = vx;
        }
        workgroupBarrier();
        for (var j = sub; j < BLOCK_N; j += TPR) {
            let key = kb + j;
            var s = HIDDEN;
            let hidden = key >= Lk || qi >= Lq || (banded && (i32(key) > i32(qi) + hi || i32(key) < i32(qi) + lo));
            if (!hidden && !mask_hides(m_base + key * p.m_k)) {
                var dot = 0.0;
                for (var d = 0u; d < p.D; d++) { dot = fma(Qs[row * D_MAX + d], Ks[j * D_MAX + d], dot); }
                s = dot * p.scale + mask_bias(m_base + key * p.m_k);
            }
            Ps[row * BLOCK_N + j] = s;
        }
        workgroupBarrier();
        var block_max = HIDDEN;
        for (var j = 0u; j < BLOCK_N; j++) { block_max = max(block_max, Ps[row * BLOCK_N + j]); }
        let new_max = max(row_max, block_max);
        let alpha = exp(row_max - new_max);
        row_max = new_max;
        row_sum *= alpha;
        for (var i = 0u; i < D_MAX / TPR; i++) { acc[i] *= alpha; }
        for (var j = 0u; j < BLOCK_N; j++) {
            let s = Ps[row * BLOCK_N + j];
            if (s <= HIDDEN) { continue; }
            let w = exp(s - new_max);
            row_sum += w;
            for (var i = 0u; i < D_MAX / TPR; i++) { acc[i] = fma(w, Vs[j * D_MAX + sub + TPR * i], acc[i]); }
        }
    }

    if (qi >= Lq) { return; }
    // A row that saw no key: O = 0, lse = -inf; a NaN row: NaN and NaN (`==` is an ordered
    // compare in SPIR-V, false for NaN, where `!=` would be false too).
    var inv = 1.0 / row_sum;
    var l = row_max + log(row_sum);
    if (row_sum == 0.0) {
        inv = 0.0;
        l = neg_inf();
    }
    for (var i = 0u; i < D_MAX / TPR; i++) {
        let d = sub + TPR * i;
        if (d < p.D) { o[o_base + qi * p.o_l + d] = T(acc[i] * inv); }
    }
    if (sub == 0u) { lse[b * p.lse_b + h * p.lse_h + q0 + qi] = l; }
}
