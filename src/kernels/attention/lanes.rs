//! The fused attention block on x86 vector registers (AVX-512 and AVX2): one generic body
//! over a small vector vocabulary, compiled once per instruction set.

use std::arch::x86_64::*;

use super::portable::EXP2_POLY;
use super::{BLOCK_M, BLOCK_N, Band, BfPairs, BlockArgs, Floats, Line, MaskView, Shape};
use crate::kernels::simd::Vector;
use crate::runtime::cpu::{Avx2Token, Avx512Bf16Token, Avx512Token};

/// The fused block for AVX-512: [`block_lanes`] with 16 rows per vector, score tiles of
/// 8 keys x 48 rows and weighted-sum tiles of 8 value columns x 48 rows.
pub(super) fn block_avx512(_: Avx512Token, a: BlockArgs) {
    // SAFETY: the token proves the CPU runs the AVX-512 level.
    unsafe { block_avx512_unchecked(a) }
}

/// # Safety
/// The CPU has AVX-512F and DQ, and FMA.
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn block_avx512_unchecked(a: BlockArgs) {
    let (inputs, a) = a.split();
    // SAFETY: the caller's CPU has what `__m512`'s operations need.
    unsafe {
        let ops = FloatLanes::new::<__m512>(inputs, a.s, a.rows.len());
        block_lanes::<__m512, _, 8, 3, 8, 3>(ops, a)
    }
}

/// The fused block for AVX-512 on bf16 inputs: [`block_avx512`]'s tiles, the products
/// formed by AVX512-BF16 dot products ([`super::pairs`]).
pub(super) fn block_avx512_bf16(_: Avx512Bf16Token, a: BlockArgs<BfPairs>) {
    // SAFETY: the token proves the CPU has AVX-512 and AVX512-BF16.
    unsafe { block_avx512_bf16_unchecked(a) }
}

/// # Safety
/// The CPU has AVX-512F, DQ and BW, AVX512-BF16 and FMA.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512bf16,fma")]
unsafe fn block_avx512_bf16_unchecked(a: BlockArgs<BfPairs>) {
    let (inputs, a) = a.split();
    // SAFETY: the caller's CPU has what the operations need.
    unsafe {
        let ops = super::pairs::PairLanes::new(inputs, a.s, a.rows.len());
        block_lanes::<__m512, _, 8, 3, 8, 3>(ops, a)
    }
}

/// The fused block for AVX2: [`block_lanes`] with 8 rows per vector, score tiles of
/// 4 keys x 24 rows and weighted-sum tiles of 6 value columns x 16 rows (12 of the 16
/// registers; 4 columns x 24 rows left too few and spilled: 15-27% slower).
pub(super) fn block_avx2(_: Avx2Token, a: BlockArgs) {
    // SAFETY: the token proves the CPU has AVX2 and FMA.
    unsafe { block_avx2_unchecked(a) }
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2_unchecked(a: BlockArgs) {
    let (inputs, a) = a.split();
    // SAFETY: the caller's CPU has what `__m256`'s operations need.
    unsafe {
        let ops = FloatLanes::new::<__m256>(inputs, a.s, a.rows.len());
        block_lanes::<__m256, _, 4, 3, 6, 2>(ops, a)
    }
}

/// The vector operations of the online softmax, beyond the shared vocabulary.
pub(super) trait SoftmaxLanes: Vector {
    /// `x` in the lanes whose index l has `first_shown <= l <= last_shown`, -inf in the
    /// others.
    unsafe fn hide_outside(x: Self, first_shown: f32, last_shown: f32) -> Self;
    /// `max·log2 e`, 0 where `max` is -inf (rows that have seen no key).
    unsafe fn shift_of(max: Self) -> Self;
    /// e^(s - max) with `shift` = max·log2 e: 2^(s·log2 e - shift) formed by one FMA,
    /// split into 2^n · 2^f with the polynomial of [`super::portable::fast_exp`]. Exactly 0 where
    /// the power is below -125 (and for s = -inf), NaN for NaN.
    unsafe fn exp_shifted(s: Self, shift: Self) -> Self;
}

/// The polynomial of 2^f on [-0.5, 0.5] (Horner, [`EXP2_POLY`] then 1).
#[inline(always)]
unsafe fn exp2_fraction<V: Vector>(f: V) -> V {
    // SAFETY: register work, under the caller's instruction set.
    unsafe {
        let mut p = V::splat(EXP2_POLY[0]);
        for &coefficient in &EXP2_POLY[1..] {
            p = V::fmadd(f, p, V::splat(coefficient));
        }
        V::fmadd(f, p, V::splat(1.0))
    }
}

// SAFETY (every method): a few intrinsics under the trait's contract (the CPU has
// AVX-512F and DQ).
#[allow(unsafe_op_in_unsafe_fn)]
impl SoftmaxLanes for __m512 {
    #[inline(always)]
    unsafe fn hide_outside(x: Self, first_shown: f32, last_shown: f32) -> Self {
        let lane = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        let from = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(lane, _mm512_set1_ps(first_shown));
        let to = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(lane, _mm512_set1_ps(last_shown));
        _mm512_mask_blend_ps(from & to, _mm512_set1_ps(f32::NEG_INFINITY), x)
    }
    #[inline(always)]
    unsafe fn shift_of(max: Self) -> Self {
        let seen = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(max, _mm512_set1_ps(f32::NEG_INFINITY));
        _mm512_maskz_mul_ps(seen, max, _mm512_set1_ps(std::f32::consts::LOG2_E))
    }
    #[inline(always)]
    unsafe fn exp_shifted(s: Self, shift: Self) -> Self {
        let y = _mm512_fmsub_ps(s, _mm512_set1_ps(std::f32::consts::LOG2_E), shift);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
        let p = exp2_fraction(_mm512_sub_ps(y, n));
        // No subnormal weights; -inf gives NaN in f and is zeroed here; NaN is not
        // below.
        let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(y, _mm512_set1_ps(-125.0));
        _mm512_maskz_scalef_ps(keep, p, n)
    }
}

// SAFETY (every method): a few intrinsics under the trait's contract (the CPU has AVX2
// and FMA).
#[allow(unsafe_op_in_unsafe_fn)]
impl SoftmaxLanes for __m256 {
    #[inline(always)]
    unsafe fn hide_outside(x: Self, first_shown: f32, last_shown: f32) -> Self {
        let lane = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let from = _mm256_cmp_ps::<_CMP_GE_OQ>(lane, _mm256_set1_ps(first_shown));
        let to = _mm256_cmp_ps::<_CMP_LE_OQ>(lane, _mm256_set1_ps(last_shown));
        _mm256_blendv_ps(
            _mm256_set1_ps(f32::NEG_INFINITY),
            x,
            _mm256_and_ps(from, to),
        )
    }
    #[inline(always)]
    unsafe fn shift_of(max: Self) -> Self {
        let seen = _mm256_cmp_ps::<_CMP_NEQ_UQ>(max, _mm256_set1_ps(f32::NEG_INFINITY));
        let shift = _mm256_mul_ps(max, _mm256_set1_ps(std::f32::consts::LOG2_E));
        _mm256_and_ps(shift, seen)
    }
    #[inline(always)]
    unsafe fn exp_shifted(s: Self, shift: Self) -> Self {
        let y = _mm256_fmsub_ps(s, _mm256_set1_ps(std::f32::consts::LOG2_E), shift);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
        let p = exp2_fraction(_mm256_sub_ps(y, n));
        // 2^n from its exponent bits: n is at least -125 where kept (a normal
        // float); the other lanes (-inf, far below) are zeroed, NaN stays NaN in p.
        let power = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(y, _mm256_set1_ps(-125.0));
        _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(power)), keep)
    }
}

/// The running max and sum of one vector of query rows, one per lane.
#[derive(Clone, Copy)]
struct RowState<V> {
    max: V,
    sum: V,
}

/// What a block multiplies, and how: the scores (queries x keys) and the weighted sums
/// (weights x values), as register tiles with the block's rows in lanes. [`Floats`] holds
/// f32 inputs (FMAs); [`super::pairs`] bf16 ones (AVX512-BF16 dot products, two keys or
/// two dims per f32 lane).
pub(super) trait Operands<V: Vector> {
    /// Cache lines a score tile's loop asks for ahead (one per step).
    fn score_steps(&self) -> usize;
    /// Cache lines a weighted-sum tile's loop asks for ahead.
    fn weight_steps(&self) -> usize;
    /// The bytes holding the values of keys `kb..kb + keys` (asked for in L2 while the
    /// scores are formed).
    fn value_bytes(&self, kb: usize, keys: usize) -> &[u8];
    /// The bytes holding keys `start..end` (asked for while the weighted sums are formed).
    fn key_bytes(&self, start: usize, end: usize) -> &[u8];
    /// Scores of the `KEYS` keys `keys[c]` against `VECS` vectors of the block's rows from
    /// `r0`, scaled: `out[c][r]`. Asks for `ahead` in L2, a line per step.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set and what the operands' products need.
    unsafe fn scores<const KEYS: usize, const VECS: usize>(
        &self,
        r0: usize,
        keys: [usize; KEYS],
        out: &mut [[f32; BLOCK_M]],
        ahead: &[u8],
    );
    /// Takes the weights `st[..keys]` of the key block in hand for [`Operands::weighted`].
    ///
    /// # Safety
    /// As for [`Operands::scores`].
    unsafe fn take_weights(&mut self, st: &[[f32; BLOCK_M]], keys: usize);
    /// `acc_t[x][r] = acc_t[x][r]·alpha[r] + Σ_c w[c][r]·v[kb + c][x]` for value columns
    /// `x0..x0 + COLS` and `VECS` vectors of rows from `r0`, over the `keys` keys of the
    /// block from `kb` (`st` its weights). Asks for `ahead` in L2, a line per step.
    ///
    /// # Safety
    /// As for [`Operands::scores`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn weighted<const COLS: usize, const VECS: usize>(
        &self,
        acc_t: &mut [f32],
        r0: usize,
        x0: usize,
        alpha: &[f32; BLOCK_M],
        st: &[[f32; BLOCK_M]],
        kb: usize,
        keys: usize,
        ahead: &[u8],
    );
}

/// The fused block with its 48 query rows in vector lanes: scores as register tiles of
/// `KEYS` keys x `VECS` vectors of rows (the keys read as rows, not transposed), the
/// online softmax one vector of rows at a time (no horizontal reductions, no branches
/// on the data), the weighted sums as register tiles of `COLS` value columns x `WVECS`
/// vectors of rows (the values broadcast, the weights read as vectors), turned back
/// into rows once per block. `ops` forms the products.
///
/// # Safety
/// The CPU has `V`'s instruction set and what `ops` needs.
#[inline(always)]
unsafe fn block_lanes<
    V: SoftmaxLanes,
    O: Operands<V>,
    const KEYS: usize,
    const VECS: usize,
    const COLS: usize,
    const WVECS: usize,
>(
    mut ops: O,
    a: BlockArgs<()>,
) {
    let BlockArgs {
        rows,
        s,
        band,
        bias,
        out,
        lse,
        ..
    } = a;
    let n_rows = rows.len();
    // Rows per tile pass (48 or 24), vectors of rows per block (3 or 6).
    let pass = VECS * V::LANES;
    let vectors = BLOCK_M / V::LANES;
    assert!(BLOCK_M.is_multiple_of(pass) && vectors <= 6 && BLOCK_N.is_multiple_of(KEYS));
    assert!(BLOCK_M.is_multiple_of(WVECS * V::LANES));
    // Scores, then weights, of the key block: `st[c][r]`.
    let mut st_lines = [[Line::ZERO; BLOCK_M / 16]; BLOCK_N];
    let st: &mut [[f32; BLOCK_M]] = bytemuck::cast_slice_mut(&mut st_lines);
    // SAFETY: register work under `V`'s instruction set.
    let mut states = unsafe {
        [RowState {
            max: V::splat(f32::NEG_INFINITY),
            sum: V::splat(0.0),
        }; 6]
    };
    let mut alpha = [1f32; BLOCK_M];
    // The block's weighted sums with the rows in lanes, `acc_t[x][r]`.
    let mut acc_t_lines = vec![Line::ZERO; s.dv * BLOCK_M / 16];
    let acc_t: &mut [f32] = bytemuck::cast_slice_mut(&mut acc_t_lines);
    let (k_start, k_end) = super::key_span(band, rows.clone(), s.lk);
    let (score_line, weight_line) = (64 * ops.score_steps(), 64 * ops.weight_steps());
    for kb in (k_start..k_end).step_by(BLOCK_N) {
        let keys = BLOCK_N.min(k_end - kb);
        // While the scores are formed, the block's values are fetched into L2, and the
        // next block's keys while the weighted sums are (+4-11% at d = 128, L ≥ 1024).
        let mut tiles = 0;
        for r0 in (0..n_rows).step_by(pass) {
            for c0 in (0..keys).step_by(KEYS) {
                // Past the last key, repeat it (those scores are never read).
                let key_at = std::array::from_fn(|c| (kb + c0 + c).min(s.lk - 1));
                let ahead = piece(ops.value_bytes(kb, keys), tiles, score_line);
                tiles += 1;
                // SAFETY: under `V`'s instruction set and `ops`' (the caller's).
                unsafe { ops.scores::<KEYS, VECS>(r0, key_at, &mut st[c0..], ahead) };
            }
        }
        // A mask that varies along the rows is added here, tile by tile; one that does not
        // is added in the softmax, one broadcast value per key.
        let bias = match bias {
            Some(mask) if mask.si != 0 => {
                // SAFETY: under `V`'s instruction set (the caller's).
                unsafe { add_mask::<V>(&mut st[..keys], mask, rows.clone(), kb) };
                None
            }
            other => other,
        };
        for (j, state) in states[..vectors].iter_mut().enumerate() {
            let row0 = rows.start + V::LANES * j;
            if row0 >= rows.end {
                break;
            }
            let real = (rows.end - row0).min(V::LANES);
            let lanes = Lanes {
                first: V::LANES * j,
                row0,
                real,
                kb,
                // The first row's last visible key is the lanes' earliest, the last row's
                // first visible key their latest.
                band: band.filter(|band| {
                    kb + keys > band.keys(row0, s.lk).end
                        || kb < band.keys(row0 + real - 1, s.lk).start
                }),
                bias,
            };
            // SAFETY: under `V`'s instruction set (the caller's).
            unsafe { softmax(&mut st[..keys], lanes, state, &mut alpha) };
        }
        // SAFETY: under `V`'s instruction set and `ops`' (the caller's).
        unsafe { ops.take_weights(st, keys) };
        let next_keys = (kb + keys, k_end.min(kb + keys + BLOCK_N));
        let mut tiles = 0;
        for r0 in (0..n_rows).step_by(WVECS * V::LANES) {
            let mut x0 = 0;
            while x0 + COLS <= s.dv {
                let ahead = piece(ops.key_bytes(next_keys.0, next_keys.1), tiles, weight_line);
                tiles += 1;
                // SAFETY: under `V`'s instruction set and `ops`' (the caller's).
                unsafe { ops.weighted::<COLS, WVECS>(acc_t, r0, x0, &alpha, st, kb, keys, ahead) };
                x0 += COLS;
            }
            for x in x0..s.dv {
                // SAFETY: as above.
                unsafe { ops.weighted::<1, WVECS>(acc_t, r0, x, &alpha, st, kb, keys, &[]) };
            }
        }
    }
    let mut max = [0f32; BLOCK_M];
    let mut sum = [0f32; BLOCK_M];
    for (j, state) in states[..vectors].iter().enumerate() {
        // SAFETY: LANES floats fit at LANES·j of the 48.
        unsafe {
            state.max.store(max.as_mut_ptr().add(V::LANES * j));
            state.sum.store(sum.as_mut_ptr().add(V::LANES * j));
        }
    }
    let acc = &mut out[..n_rows * s.dv];
    // SAFETY: under `V`'s instruction set (the caller's).
    unsafe { rows_from_lanes::<V>(acc_t, acc, s.dv, n_rows) };
    super::finish_rows(acc, s.dv, &max[..n_rows], &sum[..n_rows], lse);
}

/// The f32 operands: the block's queries transposed (`qt[x][r]`, rows past the block
/// zero), the head's keys and values as rows.
struct FloatLanes<'a> {
    qt: Vec<Line>,
    k: &'a [f32],
    v: &'a [f32],
    d: usize,
    dv: usize,
}

impl<'a> FloatLanes<'a> {
    /// The operands of a block of `n_rows` rows.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn new<V: Vector>(inputs: Floats<'a>, s: &Shape, n_rows: usize) -> Self {
        FloatLanes {
            // SAFETY: under `V`'s instruction set (the caller's).
            qt: unsafe { transpose_queries::<V>(inputs.q, s.d, n_rows) },
            k: inputs.k,
            v: inputs.v,
            d: s.d,
            dv: s.dv,
        }
    }
}

impl<V: Vector> Operands<V> for FloatLanes<'_> {
    fn score_steps(&self) -> usize {
        self.d
    }
    fn weight_steps(&self) -> usize {
        BLOCK_N
    }
    fn value_bytes(&self, kb: usize, keys: usize) -> &[u8] {
        bytemuck::cast_slice(&self.v[kb * self.dv..(kb + keys) * self.dv])
    }
    fn key_bytes(&self, start: usize, end: usize) -> &[u8] {
        bytemuck::cast_slice(&self.k[start * self.d..end * self.d])
    }

    #[inline(always)]
    unsafe fn scores<const KEYS: usize, const VECS: usize>(
        &self,
        r0: usize,
        keys: [usize; KEYS],
        out: &mut [[f32; BLOCK_M]],
        ahead: &[u8],
    ) {
        let (qt, d, k): (&[f32], _, _) = (bytemuck::cast_slice(&self.qt), self.d, self.k);
        let key_at = keys.map(|c| c * d);
        assert!(qt.len() >= d * BLOCK_M && out.len() >= KEYS && r0 + VECS * V::LANES <= BLOCK_M);
        assert!(key_at.iter().all(|&at| at + d <= k.len()));
        // SAFETY: every access is within the slices checked above.
        unsafe {
            let mut acc = [[V::splat(0.0); VECS]; KEYS];
            let keys = key_at.map(|at| k.as_ptr().add(at));
            for x in 0..d {
                prefetch_line(ahead, x);
                let column = qt.as_ptr().add(x * BLOCK_M + r0);
                let mut qv = [V::splat(0.0); VECS];
                for (j, slot) in qv.iter_mut().enumerate() {
                    *slot = V::load(column.add(V::LANES * j));
                }
                for (key, row) in keys.iter().zip(acc.iter_mut()) {
                    let kx = V::splat(*key.add(x));
                    for j in 0..VECS {
                        row[j] = V::fmadd(qv[j], kx, row[j]);
                    }
                }
            }
            for (c, row) in acc.iter().enumerate() {
                for (j, &a) in row.iter().enumerate() {
                    a.store(out[c].as_mut_ptr().add(r0 + V::LANES * j));
                }
            }
        }
    }

    unsafe fn take_weights(&mut self, _: &[[f32; BLOCK_M]], _: usize) {}

    #[inline(always)]
    unsafe fn weighted<const COLS: usize, const VECS: usize>(
        &self,
        acc_t: &mut [f32],
        r0: usize,
        x0: usize,
        alpha: &[f32; BLOCK_M],
        pt: &[[f32; BLOCK_M]],
        kb: usize,
        keys: usize,
        ahead: &[u8],
    ) {
        let (v, dv) = (&self.v[kb * self.dv..], self.dv);
        assert!(acc_t.len() >= (x0 + COLS) * BLOCK_M && keys <= pt.len() && x0 + COLS <= dv);
        assert!(r0 + VECS * V::LANES <= BLOCK_M);
        assert!(keys == 0 || v.len() >= (keys - 1) * dv + x0 + COLS);
        // SAFETY: every access is within the slices checked above.
        unsafe {
            let mut acc = scaled_sums::<V, COLS, VECS>(acc_t, r0, x0, alpha);
            for c in 0..keys {
                prefetch_line(ahead, c);
                let weights = pt.get_unchecked(c).as_ptr().add(r0);
                let mut p = [V::splat(0.0); VECS];
                for (j, slot) in p.iter_mut().enumerate() {
                    *slot = V::load(weights.add(V::LANES * j));
                }
                let values = v.as_ptr().add(c * dv + x0);
                for (w, row) in acc.iter_mut().enumerate() {
                    let b = V::splat(*values.add(w));
                    for j in 0..VECS {
                        row[j] = V::fmadd(p[j], b, row[j]);
                    }
                }
            }
            store_sums::<V, COLS, VECS>(&acc, acc_t, r0, x0);
        }
    }
}

/// Line `step` of `ahead` asked for in L2 (nothing past its end).
#[inline(always)]
pub(super) fn prefetch_line(ahead: &[u8], step: usize) {
    if 64 * step < ahead.len() {
        // SAFETY: `prefetcht1` is SSE (x86-64's baseline) and does not fault; the address
        // is inside `ahead` anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.as_ptr().add(64 * step).cast()) };
    }
}

/// The weighted sums `acc_t[x][r]` of columns `x0..x0 + COLS`, `VECS` vectors of rows from
/// `r0`, multiplied by the rows' factors `alpha`, in registers.
///
/// # Safety
/// The CPU has `V`'s instruction set; the tile lies inside `acc_t`.
#[inline(always)]
pub(super) unsafe fn scaled_sums<V: Vector, const COLS: usize, const VECS: usize>(
    acc_t: &[f32],
    r0: usize,
    x0: usize,
    alpha: &[f32; BLOCK_M],
) -> [[V; VECS]; COLS] {
    // SAFETY: the caller's contract.
    unsafe {
        let mut scale = [V::splat(0.0); VECS];
        for (j, slot) in scale.iter_mut().enumerate() {
            *slot = V::load(alpha.as_ptr().add(r0 + V::LANES * j));
        }
        let mut acc = [[V::splat(0.0); VECS]; COLS];
        for (w, row) in acc.iter_mut().enumerate() {
            let at = acc_t.as_ptr().add((x0 + w) * BLOCK_M + r0);
            for j in 0..VECS {
                row[j] = V::mul(V::load(at.add(V::LANES * j)), scale[j]);
            }
        }
        acc
    }
}

/// Stores a tile of weighted sums back to `acc_t` (the tile [`scaled_sums`] loaded).
///
/// # Safety
/// As for [`scaled_sums`].
#[inline(always)]
pub(super) unsafe fn store_sums<V: Vector, const COLS: usize, const VECS: usize>(
    acc: &[[V; VECS]; COLS],
    acc_t: &mut [f32],
    r0: usize,
    x0: usize,
) {
    for (w, row) in acc.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe {
            let at = acc_t.as_mut_ptr().add((x0 + w) * BLOCK_M + r0);
            for (j, &a) in row.iter().enumerate() {
                a.store(at.add(V::LANES * j));
            }
        }
    }
}

/// The block's `n_rows` queries (`q`, rows of `d`) transposed to `qt[x][r]` with
/// `BLOCK_M` rows, those past `n_rows` zero: a vector of rows per gather.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn transpose_queries<V: Vector>(q: &[f32], d: usize, n_rows: usize) -> Vec<Line> {
    assert!(n_rows <= BLOCK_M && q.len() >= n_rows * d);
    let mut lines = vec![Line::ZERO; d * BLOCK_M / 16];
    let qt: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
    for r0 in (0..n_rows).step_by(V::LANES) {
        let real = (n_rows - r0).min(V::LANES);
        for x in 0..d {
            // SAFETY: lane l reads q[(r0 + l)·d + x] for rows below n_rows, inside `q`;
            // the store fills qt[x][r0..r0 + LANES], inside `qt` (both checked).
            unsafe {
                V::gather(q.as_ptr().add(r0 * d + x), d, real)
                    .store(qt.as_mut_ptr().add(x * BLOCK_M + r0));
            }
        }
    }
    lines
}

/// `acc[r][x] = acc_t[x][r]` for the first `n_rows` rows (`dv` columns each), a vector
/// of columns per gather.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn rows_from_lanes<V: Vector>(acc_t: &[f32], acc: &mut [f32], dv: usize, n_rows: usize) {
    assert!(acc_t.len() >= dv * BLOCK_M && acc.len() >= n_rows * dv && n_rows <= BLOCK_M);
    for x0 in (0..dv).step_by(V::LANES) {
        let real = (dv - x0).min(V::LANES);
        for r in 0..n_rows {
            // SAFETY: lane l reads acc_t[(x0 + l)·48 + r] with x0 + l < dv, inside
            // `acc_t`; the store writes acc[r][x0..x0 + real], inside `acc` (checked).
            unsafe {
                V::gather(acc_t.as_ptr().add(x0 * BLOCK_M + r), BLOCK_M, real)
                    .store_first(acc.as_mut_ptr().add(r * dv + x0), real);
            }
        }
    }
}

/// Piece `index` of `all` in pieces of `len` (shorter or empty at the end).
fn piece(all: &[u8], index: usize, len: usize) -> &[u8] {
    let start = (index * len).min(all.len());
    &all[start..(start + len).min(all.len())]
}

/// Which rows a softmax vector holds, and what hides keys from them.
#[derive(Clone, Copy)]
struct Lanes<'a> {
    /// The first row's place in the block.
    first: usize,
    /// The first row's query index.
    row0: usize,
    /// Rows that exist (the others are padding, their lanes never read).
    real: usize,
    /// The key block's first key.
    kb: usize,
    /// The band of visible keys where one of its edges crosses this key block for these
    /// rows.
    band: Option<Band>,
    bias: Option<MaskView<'a>>,
}

/// The online softmax of one key block for one vector of query rows, one row per lane:
/// `st[c]` holds the scores of key `c` and becomes its weights. Keys outside a row's
/// band (causal, window) get weight 0, the mask is added; the factors that rescale the
/// rows' earlier sums (0 while a row has seen no key) go to `alpha`.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn softmax<V: SoftmaxLanes>(
    st: &mut [[f32; BLOCK_M]],
    lanes: Lanes,
    state: &mut RowState<V>,
    alpha: &mut [f32; BLOCK_M],
) {
    assert!(lanes.first + V::LANES <= BLOCK_M && lanes.real >= 1);
    // SAFETY: lanes first..first + LANES of each row of `st` and of `alpha` are in
    // bounds (checked); the mask reads are described at `mask_values`.
    unsafe {
        let mut block_max = V::splat(f32::NEG_INFINITY);
        for (c, key) in st.iter_mut().enumerate() {
            let at = key.as_mut_ptr().add(lanes.first);
            let mut x = V::load(at);
            if let Some(mask) = lanes.bias {
                x = V::add(x, mask_values::<V>(mask, lanes, c));
            }
            if let Some(band) = lanes.band {
                // Key kb + c is visible to row row0 + l when kb + c - row0 - hi <= l <=
                // kb + c - row0 - lo (small differences where an edge crosses the block:
                // exact as floats; far ones only need their side of 0..LANES).
                let key = (lanes.kb + c) as isize - lanes.row0 as isize;
                let lane_of = |edge: isize| key.saturating_sub(edge) as f32;
                let first_shown = band.hi.map_or(f32::NEG_INFINITY, lane_of);
                let last_shown = band.lo.map_or(f32::INFINITY, lane_of);
                x = V::hide_outside(x, first_shown, last_shown);
            }
            if lanes.bias.is_some() || lanes.band.is_some() {
                x.store(at);
            }
            block_max = V::max(block_max, x);
        }
        let new_max = V::max(state.max, block_max);
        // Rows that have seen no key yet keep max -inf: shift them by 0, so that their
        // weights and factor are 0 instead of NaN.
        let shift = V::shift_of(new_max);
        let factor = V::exp_shifted(state.max, shift);
        state.max = new_max;
        let mut sum = V::splat(0.0);
        for key in st.iter_mut() {
            let at = key.as_mut_ptr().add(lanes.first);
            let e = V::exp_shifted(V::load(at), shift);
            e.store(at);
            sum = V::add(sum, e);
        }
        state.sum = V::fmadd(state.sum, factor, sum);
        factor.store(alpha.as_mut_ptr().add(lanes.first));
    }
}

/// Adds the mask to one key block's scores `st[c][r]` (row `rows.start + r`, key `kb + c`):
/// `LANES x LANES` tiles of mask rows read as vectors along the keys and transposed in
/// registers (no per-key gathers), element by element at the block's edges or where the
/// keys are not contiguous in the mask.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn add_mask<V: Vector>(
    st: &mut [[f32; BLOCK_M]],
    mask: MaskView,
    rows: std::ops::Range<usize>,
    kb: usize,
) {
    let lanes = V::LANES;
    let (whole_rows, whole_keys) = if mask.sj == 1 {
        (rows.len() / lanes * lanes, st.len() / lanes * lanes)
    } else {
        (0, 0)
    };
    // SAFETY: register work under `V`'s instruction set (the caller's).
    let mut block = [unsafe { V::splat(0.0) }; 16];
    for r0 in (0..whole_rows).step_by(lanes) {
        let first = mask.base + (rows.start + r0) * mask.si + kb;
        // The tile's last element (row r0 + lanes - 1, key whole_keys - 1) is in the mask.
        assert!(first + (lanes - 1) * mask.si + whole_keys <= mask.values.len());
        for c0 in (0..whole_keys).step_by(lanes) {
            // SAFETY: the loads read keys kb + c0.. of rows r0..r0 + lanes, inside the
            // mask (checked above); the adds touch lanes r0..r0 + lanes of st's rows c0..,
            // inside its BLOCK_M lanes (r0 + lanes <= rows.len() <= BLOCK_M).
            unsafe {
                for (i, row) in block[..lanes].iter_mut().enumerate() {
                    *row = V::load(mask.values.as_ptr().add(first + i * mask.si + c0));
                }
                V::transpose(&mut block[..lanes]);
                for (c, values) in block[..lanes].iter().enumerate() {
                    let at = st[c0 + c].as_mut_ptr().add(r0);
                    V::add(V::load(at), *values).store(at);
                }
            }
        }
    }
    // The edges: keys past the whole tiles for the tiled rows, every key for the others.
    for (c, key) in st.iter_mut().enumerate() {
        let first = if c < whole_keys { whole_rows } else { 0 };
        for (r, score) in key[first..rows.len()].iter_mut().enumerate() {
            *score += mask.at(rows.start + first + r, kb + c);
        }
    }
}

/// The mask's values for key `lanes.kb + c` of the vector's rows (0 in padding lanes):
/// one broadcast value where the mask does not vary along the rows, else a gather.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn mask_values<V: Vector>(mask: MaskView, lanes: Lanes, c: usize) -> V {
    let first = mask.base + lanes.row0 * mask.si + (lanes.kb + c) * mask.sj;
    if mask.si == 0 {
        // SAFETY: register work.
        return unsafe { V::splat(mask.values[first]) };
    }
    let last = first + (lanes.real - 1) * mask.si;
    assert!(last < mask.values.len());
    // SAFETY: the gather reads the elements (row0 + l, kb + c) of the real rows, which
    // the mask has (checked for the last real row).
    unsafe { V::gather(mask.values.as_ptr().add(first), mask.si, lanes.real) }
}
