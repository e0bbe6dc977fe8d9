//! Singular values of an upper bidiagonal matrix alone, by shifted differential qd steps
//! (dqds: Fernando and Parlett) with Laguerre shifts. The squares of the diagonal and of the
//! superdiagonal are transformed, every quantity staying positive, so each value keeps high
//! relative accuracy. faer's SVD without vectors runs a divide and conquer on the
//! bidiagonal instead, 3 to 7 times slower on one thread (n = 256 and 1024; random,
//! graded and clustered values).
//!
//! Each pass runs a step with shift `τ` under the block's smallest eigenvalue and two
//! unshifted steps behind it (see [`pass`]); the last carries the derivatives of its pivots,
//! whose product is the characteristic polynomial, and so yields `G = Σ 1/x` and
//! `H = Σ 1/x²` over the eigenvalues `x` of the block. Laguerre's bound from them is never
//! above the smallest `x` (in exact arithmetic), so the next shift keeps every pivot
//! positive and converges cubically.

/// Relative size under which a squared superdiagonal element counts as zero (LAPACK's
/// `(100 ε)²`).
const NEGLIGIBLE: f64 = (100.0 * f64::EPSILON / 2.0) * (100.0 * f64::EPSILON / 2.0);

/// The fraction of Laguerre's bound a shift stays under, against rounding.
const SHIFT_MARGIN: f64 = 1e-12;

/// Replaces `d` with the singular values, in descending order, of the upper bidiagonal
/// matrix of diagonal `d` (`n`) and superdiagonal `e` (`n - 1`), using `work` (`4 n`).
/// `false` where the iteration met a value it cannot go on from (an infinity, a NaN) or did
/// not converge: `d` then holds nothing useful.
pub(super) fn singular_values(d: &mut [f64], e: &[f64], work: &mut [f64]) -> bool {
    let n = d.len();
    debug_assert!(e.len() + 1 == n.max(1) && work.len() >= 4 * n);
    let scale = d.iter().chain(e).fold(0.0, |m: f64, x| m.max(x.abs()));
    if !scale.is_finite() {
        return false;
    }
    if scale == 0.0 {
        return true;
    }
    let (q, work) = work.split_at_mut(n);
    let (z, work) = work.split_at_mut(n);
    let (next_q, next_z) = work.split_at_mut(n);
    for (q, d) in q.iter_mut().zip(d.iter()) {
        *q = (d / scale) * (d / scale);
    }
    for (z, e) in z.iter_mut().zip(e) {
        *z = (e / scale) * (e / scale);
    }
    // Blocks split by an exact zero are independent; each converges from its bottom.
    let mut end = n;
    while end > 0 {
        let start = (1..end).rev().find(|&i| z[i - 1] == 0.0).unwrap_or(0);
        let range = start..end;
        let arrays = (&mut q[range.clone()], &mut z[range.clone()]);
        if !block(arrays, (&mut next_q[range.clone()], &mut next_z[range])) {
            return false;
        }
        end = start;
    }
    for (d, q) in d.iter_mut().zip(q.iter()) {
        *d = q.max(0.0).sqrt() * scale;
    }
    d.sort_unstable_by(|a, b| b.total_cmp(a));
    true
}

/// Replaces `q` (an unreduced block; `z` its squared superdiagonal, one element longer than
/// needed) with its eigenvalues, the squared singular values, stepping through `next_q` and
/// `next_z` (as long).
fn block((q, z): (&mut [f64], &mut [f64]), (next_q, next_z): (&mut [f64], &mut [f64])) -> bool {
    // The shift so far, and the next one.
    let (mut sigma, mut tau) = (0.0, 0.0);
    let mut len = q.len();
    let mut passes = 0;
    let max_passes = 30 * len + 10;
    while len > 2 {
        let last = len - 1;
        // Deflate the bottom value, or the bottom 2 × 2, once its coupling no longer moves
        // it; the next shift is then learnt afresh (a pass with none).
        if z[last - 1] <= NEGLIGIBLE * (sigma + q[last]) {
            q[last] += sigma;
            (len, tau) = (last, 0.0);
            continue;
        }
        if z[last - 2] <= NEGLIGIBLE * (sigma + q[last - 1]) {
            let (small, large) = two_by_two(q[last - 1], z[last - 1], q[last]);
            (q[last - 1], q[last]) = (sigma + large, sigma + small);
            (len, tau) = (last - 1, 0.0);
            continue;
        }
        passes += 1;
        if passes > max_passes {
            return false;
        }
        let (g, h) = loop {
            let next = (&mut next_q[..len], &mut next_z[..last]);
            if let Some(sums) = pass((&q[..len], &z[..last]), tau, next) {
                break sums;
            }
            // Rounding put the shift past the smallest eigenvalue: halve it, down to none.
            if tau == 0.0 {
                return false;
            }
            tau = if tau > 1e-3 * sigma { tau / 2.0 } else { 0.0 };
        };
        q[..len].copy_from_slice(&next_q[..len]);
        z[..last].copy_from_slice(&next_z[..last]);
        sigma += tau;
        tau = laguerre(g, h, len) * (1.0 - SHIFT_MARGIN);
    }
    match len {
        2 => {
            let (small, large) = two_by_two(q[0], z[0], q[1]);
            (q[0], q[1]) = (sigma + large, sigma + small);
        }
        1 => q[0] += sigma,
        _ => {}
    }
    true
}

/// Laguerre's lower bound on the smallest of `n` positive numbers `x` from `g = Σ 1/x` and
/// `h = Σ 1/x²` (exact where all are equal); 0 where the sums say nothing finite.
fn laguerre(g: f64, h: f64, n: usize) -> f64 {
    let n = n as f64;
    let root = ((n - 1.0) * (n * h - g * g)).max(0.0).sqrt();
    let bound = n / (g + root);
    if bound.is_finite() { bound } else { 0.0 }
}

/// Three dqds steps fused into one pass from `(q, z)` into `(next_q, next_z)`: the first
/// with shift `tau`, the second and third with none, each one element behind the one before
/// (its input element passed on in registers), so that their chains of divisions overlap
/// (a pass costs little more than one step; the unshifted steps carry small values down to
/// the bottom, where they deflate). Returns the sums `(Σ 1/x, Σ 1/x²)` over the eigenvalues
/// `x` of the new block, or `None` where a pivot came out negative (`tau` is past the
/// smallest eigenvalue) or not a number. The block is at least 3 long.
fn pass(
    (q, z): (&[f64], &[f64]),
    tau: f64,
    (next_q, next_z): (&mut [f64], &mut [f64]),
) -> Option<(f64, f64)> {
    let last = q.len() - 1;
    let mut d = q[0] - tau;
    // The second step's pivot, and the third step.
    let mut second = 0.0;
    let mut third = Unshifted::default();
    // The superdiagonal element the first step and the second gave last, not yet taken by
    // the step behind.
    let (mut first_z, mut second_z) = (0.0, 0.0);
    for i in 0..last {
        if d < 0.0 || d.is_nan() {
            return None;
        }
        let pivot = d + z[i];
        let t = q[i + 1] / pivot;
        d = d * t - tau;
        let new_z = z[i] * t;
        if i == 0 {
            (second, first_z) = (pivot, new_z);
            continue;
        }
        let (pivot, new_second_z) = step_unshifted(&mut second, first_z, pivot);
        first_z = new_z;
        match i {
            1 => third.d = pivot,
            _ => (next_q[i - 2], next_z[i - 2]) = third.next(second_z, pivot),
        }
        second_z = new_second_z;
    }
    if d < 0.0 || d.is_nan() {
        return None;
    }
    let (pivot, last_z) = step_unshifted(&mut second, first_z, d);
    (next_q[last - 2], next_z[last - 2]) = third.next(second_z, pivot);
    (next_q[last - 1], next_z[last - 1]) = third.next(last_z, second);
    next_q[last] = third.d;
    third.sums()
}

/// An unshifted dqds step's next element from its pivot `d`, the squared superdiagonal `z`
/// beside it and the squared diagonal `q_next` under it: the new `(q, z)`.
fn step_unshifted(d: &mut f64, z: f64, q_next: f64) -> (f64, f64) {
    let pivot = *d + z;
    let t = q_next / pivot;
    *d *= t;
    (pivot, z * t)
}

/// An unshifted dqds step under way, carrying the first and second derivatives (in the
/// shift) of its pivot `d` and of the log of the product of its pivots so far: the pivots
/// are those of the block shifted, so their product is its characteristic polynomial `p`.
struct Unshifted {
    d: f64,
    d1: f64,
    d2: f64,
    log1: f64,
    log2: f64,
}

impl Default for Unshifted {
    /// Before its first element (`d` is then set to the first pivot; `d1 = -1` as `d = q - τ`).
    fn default() -> Self {
        let (d, d1, d2) = (0.0, -1.0, 0.0);
        Unshifted {
            d,
            d1,
            d2,
            log1: 0.0,
            log2: 0.0,
        }
    }
}

impl Unshifted {
    /// The step's next element from the squared superdiagonal `z` beside the pivot and the
    /// squared diagonal `q_next` under it: the new `(q, z)`.
    fn next(&mut self, z: f64, q_next: f64) -> (f64, f64) {
        let Unshifted { d, d1, d2, .. } = *self;
        let pivot = d + z;
        let r = 1.0 / pivot;
        let t = q_next * r;
        // (log pivot)' and (log pivot)''; t = q_next / pivot moves against the pivot.
        let a = d1 * r;
        let b = d2 * r - a * a;
        self.log1 += a;
        self.log2 += b;
        let (t1, t2) = (-t * a, t * (a * a - b));
        self.d = d * t;
        self.d1 = d1 * t + d * t1 - 1.0;
        self.d2 = d2 * t + 2.0 * d1 * t1 + d * t2;
        (pivot, z * t)
    }

    /// With the last pivot `d` taken: `(Σ 1/x, Σ 1/x²) = (-(log p)', -(log p)'')`, or
    /// `None` where that pivot is negative or not a number.
    fn sums(&self) -> Option<(f64, f64)> {
        let d = self.d;
        if d < 0.0 || d.is_nan() {
            return None;
        }
        let a = self.d1 / d;
        Some((-(self.log1 + a), -(self.log2 + self.d2 / d - a * a)))
    }
}

/// The eigenvalues `(smaller, larger)` of the 2 × 2 block of qd values `q0`, `z0`, `q1`:
/// the squared singular values of `[[√q0, √z0], [0, √q1]]`.
fn two_by_two(q0: f64, z0: f64, q1: f64) -> (f64, f64) {
    let (f, g, h) = (q0.sqrt(), z0.sqrt(), q1.sqrt());
    let (fh_min, fh_max) = (f.min(h), f.max(h));
    let (small, large) = if fh_min == 0.0 {
        (0.0, fh_max.hypot(g))
    } else {
        let sum = 1.0 + fh_min / fh_max;
        let diff = (fh_max - fh_min) / fh_max;
        if g < fh_max {
            let au = (g / fh_max) * (g / fh_max);
            let c = 2.0 / ((sum * sum + au).sqrt() + (diff * diff + au).sqrt());
            (fh_min * c, fh_max / c)
        } else {
            let au = fh_max / g;
            let c = 1.0
                / ((1.0 + (sum * au) * (sum * au)).sqrt()
                    + (1.0 + (diff * au) * (diff * au)).sqrt());
            (2.0 * (fh_min * c) * au, g / (c + c))
        }
    };
    (small * small, large * large)
}

#[cfg(test)]
mod tests {
    use super::singular_values;

    fn values(d: &[f64], e: &[f64]) -> Option<Vec<f64>> {
        let mut d = d.to_vec();
        let mut work = vec![f64::NAN; 4 * d.len()];
        singular_values(&mut d, e, &mut work).then_some(d)
    }

    #[test]
    fn small_blocks_have_their_closed_form_values() {
        // [[3, 1], [0, 2]]: BᵀB has trace 14 and determinant 36.
        let s = values(&[3.0, 2.0], &[1.0]).unwrap();
        let root = (14.0f64 * 14.0 - 4.0 * 36.0).sqrt();
        let expect = [((14.0 + root) / 2.0).sqrt(), ((14.0 - root) / 2.0).sqrt()];
        assert!((s[0] - expect[0]).abs() < 1e-15 * expect[0], "{s:?}");
        assert!((s[1] - expect[1]).abs() < 1e-15 * expect[0], "{s:?}");
        // [[1, 1, 0], [0, 0, 1], [0, 0, 2]]: B Bᵀ = diag(2) ⊕ [[1, 2], [2, 4]], values √5, √2, 0.
        // A zero pivot.
        let s = values(&[1.0, 0.0, 2.0], &[1.0, 1.0]).unwrap();
        let expect = [5f64.sqrt(), 2f64.sqrt(), 0.0];
        assert!(
            s.iter()
                .zip(expect)
                .all(|(s, x)| (s - x).abs() < 1e-15 * 3.0),
            "{s:?}"
        );
        // Exact zeros on the superdiagonal split the matrix; its values are the diagonal's.
        let s = values(&[-2.0, 5.0, 0.5, 1.0], &[0.0, 0.0, 0.0]).unwrap();
        assert_eq!(s, [5.0, 2.0, 1.0, 0.5]);
        assert_eq!(values(&[0.0; 3], &[0.0; 2]).unwrap(), [0.0; 3]);
        assert_eq!(values(&[f64::INFINITY, 1.0], &[1.0]), None);
    }

    #[test]
    fn graded_values_keep_their_relative_accuracy() {
        // d_i = 10^(-8 i), e_i = 10^(-8 i - 4): each value is d_i to about 1e-8 relative,
        // however far under ε times the largest (values down to 1e-152).
        let n = 20;
        let d: Vec<f64> = (0..n).map(|i| 10f64.powi(-8 * i)).collect();
        let e: Vec<f64> = (0..n - 1).map(|i| 10f64.powi(-8 * i - 4)).collect();
        let s = values(&d, &e).unwrap();
        for (s, d) in s.iter().zip(&d) {
            assert!((s / d - 1.0).abs() < 1e-7, "{s:e} against {d:e}");
        }
    }

    #[test]
    fn clustered_values_converge() {
        // A bidiagonal with values all within 1e-9 of each other and of 1, and one of order
        // 300 with random-like entries: both converge and keep the Frobenius norm (the sum
        // of squares of the values is that of the entries).
        let n = 300;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let cases = [
            (0..n).map(|i| 1.0 + 1e-12 * i as f64).collect::<Vec<_>>(),
            (0..n).map(|_| next() + 0.01).collect(),
        ];
        let couplings = [vec![1e-10; n - 1], (0..n - 1).map(|_| next()).collect()];
        for (d, e) in cases.iter().zip(&couplings) {
            let s = values(d, e).unwrap();
            assert!(s.windows(2).all(|p| p[0] >= p[1]));
            let squares = |x: &[f64]| x.iter().map(|x| x * x).sum::<f64>();
            let (ours, entries) = (squares(&s), squares(d) + squares(e));
            assert!((ours - entries).abs() < 1e-13 * entries, "{ours} {entries}");
        }
    }
}
