//! The fused attention block in portable code: the build's vector width, each key block
//! transposed once so that scores and weighted sums are plain loops the compiler vectorises.

use super::{BLOCK_M, BLOCK_N, BlockArgs, Floats, MaskView, finish_rows, key_block, key_span};
use crate::runtime::cpu::mul_add;

/// e^x for the fused path: 2^(x·log2 e) split into 2^n · 2^f, with [`EXP2_POLY`] for 2^f
/// (relative error below 1e-6 on [-10, 0], 4e-6 near ±87); exactly 0 below -87 and for -inf,
/// infinite above 88.7, NaN for NaN. Branch-free, so that loops over it vectorise.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    // Adding 1.5·2^23 rounds to an integer (ties to even) held in the low mantissa bits:
    // n is read back as an integer without a float-to-int conversion, which would not
    // vectorise.
    const SHIFT: f32 = 12_582_912.0;
    let y = (x * std::f32::consts::LOG2_E).clamp(-126.0, 128.0);
    let shifted = y + SHIFT;
    let n = shifted - SHIFT;
    let f = y - n;
    let mut p = 0.0;
    for &c in &EXP2_POLY {
        p = p * f + c;
    }
    let p = p * f + 1.0;
    let n_bits = shifted.to_bits().wrapping_sub(SHIFT.to_bits());
    let scaled = p * f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { scaled }
}

/// 2^f on [-0.5, 0.5] as a degree-5 polynomial, highest coefficient first (near-minimax
/// relative error 1e-7, 2e-7 evaluated in f32); the constant term is 1.
#[allow(clippy::approx_constant)] // the linear term is the fit's, 3 ulp below ln 2
pub(crate) const EXP2_POLY: [f32; 5] = [
    0.001_326_470_6,
    0.009_671_511,
    0.055_507_34,
    0.240_222_42,
    0.693_147,
];

/// One (pre-scaled) query row's scores against a transposed key block (`kt[x][c]`), kept
/// in registers.
#[inline(always)]
pub(crate) fn score_row<const FUSED: bool>(q: &[f32], kt: &[f32]) -> [f32; BLOCK_N] {
    let mut acc = [0f32; BLOCK_N];
    for (&qx, col) in q.iter().zip(kt.chunks_exact(BLOCK_N)) {
        for c in 0..BLOCK_N {
            acc[c] = mul_add::<FUSED>(qx, col[c], acc[c]);
        }
    }
    acc
}

/// `acc * alpha + Σ_c p[c] · v_c[0..64]`, kept in registers; `v(c)` starts at key c's values.
#[inline(always)]
pub(crate) fn weighted_sum<'v, const FUSED: bool>(
    mut acc: [f32; 64],
    alpha: f32,
    p: &[f32],
    v: impl Fn(usize) -> &'v [f32],
) -> [f32; 64] {
    for a in acc.iter_mut() {
        *a *= alpha;
    }
    for (c, &w) in p.iter().enumerate() {
        let row: &[f32; 64] = v(c)[..64].try_into().expect("64 values");
        for l in 0..64 {
            acc[l] = mul_add::<FUSED>(w, row[l], acc[l]);
        }
    }
    acc
}

/// The maximum of a block row, over 16 lanes (so that it vectorises).
#[inline(always)]
pub(crate) fn lanes_max(x: &[f32; BLOCK_N]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    for chunk in x.chunks_exact(16) {
        for l in 0..16 {
            lanes[l] = nan_max(lanes[l], chunk[l]);
        }
    }
    halving(lanes, nan_max)
}

/// The larger of `a` and `b`, NaN if either is (so that a NaN score makes its row NaN, as
/// on every other path).
#[inline(always)]
pub(crate) fn nan_max(a: f32, b: f32) -> f32 {
    if b > a || b.is_nan() { b } else { a }
}

/// `lanes` folded by `op` in halves (8 pairs, 4, 2, 1), so that the steps vectorise
/// instead of forming one serial chain.
#[inline(always)]
pub(crate) fn halving(lanes: [f32; 16], op: impl Fn(f32, f32) -> f32) -> f32 {
    let eight: [f32; 8] = std::array::from_fn(|l| op(lanes[l], lanes[l + 8]));
    let four: [f32; 4] = std::array::from_fn(|l| op(eight[l], eight[l + 4]));
    op(op(four[0], four[2]), op(four[1], four[3]))
}

/// The sum of a block row, over 16 lanes (so that it vectorises).
#[inline(always)]
pub(crate) fn lanes_sum(x: &[f32; BLOCK_N]) -> f32 {
    let mut lanes = [0f32; 16];
    for chunk in x.chunks_exact(16) {
        for l in 0..16 {
            lanes[l] += chunk[l];
        }
    }
    halving(lanes, |a, b| a + b)
}

/// One row of a block's scores through the online softmax: keys outside `visible` are
/// hidden, the mask `(view, row, first key)` is added, the row's running max and sum take
/// the block in, and the scores become weights. Returns the factor that rescales the
/// row's earlier sums, or `None` (with zero weights) while the row has seen no key.
#[inline(always)]
pub(crate) fn online_softmax(
    srow: &mut [f32; BLOCK_N],
    visible: std::ops::Range<usize>,
    bias: Option<(MaskView, usize, usize)>,
    row_max: &mut f32,
    row_sum: &mut f32,
) -> Option<f32> {
    srow[..visible.start].fill(f32::NEG_INFINITY);
    srow[visible.end..].fill(f32::NEG_INFINITY);
    if let Some((mask, i, kb)) = bias {
        for c in visible {
            srow[c] += mask.at(i, kb + c);
        }
    }
    let new_max = nan_max(*row_max, lanes_max(srow));
    if new_max == f32::NEG_INFINITY {
        srow.fill(0.0);
        return None;
    }
    let alpha = fast_exp(*row_max - new_max);
    *row_max = new_max;
    for x in srow.iter_mut() {
        *x = fast_exp(*x - new_max);
    }
    *row_sum = *row_sum * alpha + lanes_sum(srow);
    Some(alpha)
}

/// One query block against all its keys, online softmax in f32, in portable code (the
/// build's vector width): each key block is transposed once, so that scores and weighted
/// sums are plain loops the compiler vectorises.
#[inline(always)]
pub(crate) fn fused_block_body<const FUSED: bool>(a: BlockArgs) {
    let BlockArgs {
        inputs: Floats { q, v, kt, .. },
        rows,
        s,
        band,
        bias,
        out,
        lse,
    } = a;
    let n_rows = rows.len();
    let mut row_max = [f32::NEG_INFINITY; BLOCK_M];
    let mut row_sum = [0f32; BLOCK_M];
    let acc = &mut out[..n_rows * s.dv];
    acc.fill(0.0);
    let (k_start, k_end) = key_span(band, rows.clone(), s.lk);
    for kb in (k_start..k_end).step_by(BLOCK_N) {
        let keys = BLOCK_N.min(k_end - kb);
        let kt = key_block(kt, s.d, kb);
        for (r, i) in rows.clone().enumerate() {
            let mut srow = score_row::<FUSED>(&q[r * s.d..(r + 1) * s.d], kt);
            let visible = band.map_or(0..keys, |band| {
                let seen = band.keys(i, s.lk);
                let at = |j: usize| j.saturating_sub(kb).min(keys);
                at(seen.start)..at(seen.end)
            });
            let bias = bias.map(|m| (m, i, kb));
            let Some(alpha) =
                online_softmax(&mut srow, visible, bias, &mut row_max[r], &mut row_sum[r])
            else {
                continue; // nothing visible yet: keep zeros
            };
            // Weighted sum of the block's values, 64 output dims at a time in registers.
            let arow = &mut acc[r * s.dv..(r + 1) * s.dv];
            for (chunk_index, chunk) in arow.chunks_mut(64).enumerate() {
                let d0 = chunk_index * 64;
                let rows_of_v = |c: usize| &v[(kb + c) * s.dv + d0..];
                if let Ok(full) = <&mut [f32; 64]>::try_from(&mut *chunk) {
                    *full = weighted_sum::<FUSED>(*full, alpha, &srow[..keys], rows_of_v);
                } else {
                    for x in chunk.iter_mut() {
                        *x *= alpha;
                    }
                    let width = chunk.len();
                    for (c, &p) in srow[..keys].iter().enumerate() {
                        for (a, &y) in chunk.iter_mut().zip(&rows_of_v(c)[..width]) {
                            *a = mul_add::<FUSED>(p, y, *a);
                        }
                    }
                }
            }
        }
    }
    finish_rows(acc, s.dv, &row_max[..n_rows], &row_sum[..n_rows], lse);
}

#[cfg(test)]
mod tests {
    use super::fast_exp;

    #[test]
    fn fast_exp_is_close_to_exp_and_handles_the_edges() {
        // The rounding of x·log2(e) grows with |x|: about 4e-6 relative near ±87, below 1e-6
        // where softmax weights live (the largest is 1, at x = 0).
        for (low, high, bound) in [(-87.0, 88.0, 5e-6), (-10.0, 0.0, 1e-6)] {
            let mut worst = 0f64;
            for i in 0..=100_000 {
                let x = (low + (high - low) * f64::from(i) / 100_000.0) as f32;
                let want = f64::from(x).exp();
                worst = worst.max(((f64::from(fast_exp(x)) - want) / want).abs());
            }
            assert!(
                worst < bound,
                "[{low}, {high}]: worst relative error {worst}"
            );
        }
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(100.0), f32::INFINITY);
        assert!(fast_exp(f32::NAN).is_nan());
    }
}
