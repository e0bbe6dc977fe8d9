//! The fused block's products on AVX512-BF16 dot products (`vdpbf16ps`: two bf16 products
//! per f32 lane, summed into an f32 accumulator), for bf16 inputs read as they are: the
//! block's queries as words of two dims (`qt[x/2][r]`), the keys' rows as the input holds
//! them (a word of two dims broadcast), the weights rounded to bf16 in pairs of keys, and
//! the values paired by keys once per head ([`super::pair_values`]). Sums stay f32; the
//! only rounding beyond the inputs' is the weights' (PyTorch's CPU flash attention rounds
//! them too, multiplying them by the values in bf16). Where the CPU runs these at twice
//! the f32 FMA rate, a block costs about half the f32 one's multiply-adds.

use std::arch::x86_64::*;

use super::lanes::{Operands, prefetch_line, scaled_sums, store_sums};
use super::{BLOCK_M, BLOCK_N, BfPairs, Line, Shape};

/// The 32 bf16 values a 512-bit register holds, typed for `vdpbf16ps`.
#[inline(always)]
fn bf16s(x: __m512i) -> __m512bh {
    // SAFETY: both types are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// Word i of a register from 16-bit elements i and 16 + i: two halves of 16 values
/// interleaved into pairs.
const INTERLEAVE: [u16; 32] = {
    let mut index = [0u16; 32];
    let mut i = 0;
    while i < 16 {
        index[2 * i] = i as u16;
        index[2 * i + 1] = 16 + i as u16;
        i += 1;
    }
    index
};

/// The bf16 operands of one block.
pub(super) struct PairLanes<'a> {
    /// The block's queries as words of dims 2x and 2x + 1: `qt[x][r]` (rows past the
    /// block zero).
    qt: Vec<Line>,
    k: &'a [half::bf16],
    v_pairs: &'a [u32],
    /// The key block's weights as words of keys 2c and 2c + 1: `wt[c][r]`.
    wt: [[Line; BLOCK_M / 16]; BLOCK_N / 2],
    scale: f32,
    d: usize,
    dv: usize,
}

impl<'a> PairLanes<'a> {
    /// The operands of a block of `n_rows` rows (`d` even and not 0).
    pub(super) fn new(inputs: BfPairs<'a>, s: &Shape, n_rows: usize) -> Self {
        let words = s.d / 2;
        assert!(words > 0 && s.d.is_multiple_of(2));
        assert!(n_rows <= BLOCK_M && inputs.q.len() >= n_rows * s.d);
        let mut qt = vec![Line::ZERO; words * BLOCK_M / 16];
        let qw: &mut [u32] = bytemuck::cast_slice_mut(&mut qt);
        for (r, row) in inputs.q[..n_rows * s.d].chunks_exact(s.d).enumerate() {
            for (x, dims) in row.chunks_exact(2).enumerate() {
                qw[x * BLOCK_M + r] = word(dims[0], dims[1]);
            }
        }
        PairLanes {
            qt,
            k: inputs.k,
            v_pairs: inputs.v_pairs,
            wt: [[Line::ZERO; BLOCK_M / 16]; BLOCK_N / 2],
            scale: inputs.scale,
            d: s.d,
            dv: s.dv,
        }
    }
}

/// The word of two bf16 values, `low` in its low half.
fn word(low: half::bf16, high: half::bf16) -> u32 {
    u32::from(low.to_bits()) | u32::from(high.to_bits()) << 16
}

impl Operands<__m512> for PairLanes<'_> {
    fn score_steps(&self) -> usize {
        self.d / 2
    }
    fn weight_steps(&self) -> usize {
        BLOCK_N / 2
    }
    fn value_bytes(&self, kb: usize, keys: usize) -> &[u8] {
        bytemuck::cast_slice(&self.v_pairs[kb / 2 * self.dv..(kb + keys).div_ceil(2) * self.dv])
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
        let (words, d, k) = (self.d / 2, self.d, self.k);
        let qt: &[u32] = bytemuck::cast_slice(&self.qt);
        let key_at = keys.map(|c| c * d);
        assert!(qt.len() >= words * BLOCK_M && out.len() >= KEYS && r0 + VECS * 16 <= BLOCK_M);
        assert!(key_at.iter().all(|&at| at + d <= k.len()));
        // SAFETY: every access is within the slices checked above (a key's word x is its
        // elements 2x and 2x + 1 < d); the caller's CPU has AVX-512 and AVX512-BF16.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); VECS]; KEYS];
            let keys = key_at.map(|at| k.as_ptr().add(at).cast::<u32>());
            for x in 0..words {
                prefetch_line(ahead, x);
                let column = qt.as_ptr().add(x * BLOCK_M + r0);
                let mut qv = [bf16s(_mm512_setzero_si512()); VECS];
                for (j, slot) in qv.iter_mut().enumerate() {
                    *slot = bf16s(_mm512_loadu_si512(column.add(16 * j).cast()));
                }
                for (key, row) in keys.iter().zip(acc.iter_mut()) {
                    let kx = bf16s(_mm512_set1_epi32(key.add(x).read_unaligned() as i32));
                    for j in 0..VECS {
                        row[j] = _mm512_dpbf16_ps(row[j], qv[j], kx);
                    }
                }
            }
            let scale = _mm512_set1_ps(self.scale);
            for (c, row) in acc.iter().enumerate() {
                for (j, &a) in row.iter().enumerate() {
                    _mm512_storeu_ps(
                        out[c].as_mut_ptr().add(r0 + 16 * j),
                        _mm512_mul_ps(a, scale),
                    );
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn take_weights(&mut self, st: &[[f32; BLOCK_M]], keys: usize) {
        assert!(keys <= st.len() && keys <= BLOCK_N);
        let wt: &mut [[u32; BLOCK_M]] = bytemuck::cast_slice_mut(&mut self.wt);
        // SAFETY: rows 2c and 2c + 1 < keys of `st` and row c of `wt` are read and written,
        // 16 lanes at a time within their BLOCK_M; the caller's CPU has AVX-512 (BW) and
        // AVX512-BF16.
        unsafe {
            let index = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            for (c, pairs) in wt[..keys.div_ceil(2)].iter_mut().enumerate() {
                for j in (0..BLOCK_M).step_by(16) {
                    let low = _mm512_loadu_ps(st[2 * c].as_ptr().add(j));
                    let high = match st.get(2 * c + 1).filter(|_| 2 * c + 1 < keys) {
                        Some(next) => _mm512_loadu_ps(next.as_ptr().add(j)),
                        None => _mm512_setzero_ps(),
                    };
                    // Key 2c's weights in elements 0..16, key 2c + 1's in 16..32, then
                    // interleaved into words.
                    let halves = _mm512_cvtne2ps_pbh(high, low);
                    let words = _mm512_permutexvar_epi16(
                        index,
                        std::mem::transmute::<__m512bh, __m512i>(halves),
                    );
                    _mm512_storeu_si512(pairs.as_mut_ptr().add(j).cast(), words);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn weighted<const COLS: usize, const VECS: usize>(
        &self,
        acc_t: &mut [f32],
        r0: usize,
        x0: usize,
        alpha: &[f32; BLOCK_M],
        _: &[[f32; BLOCK_M]],
        kb: usize,
        keys: usize,
        ahead: &[u8],
    ) {
        let dv = self.dv;
        let pairs = keys.div_ceil(2);
        let v = &self.v_pairs[kb / 2 * dv..];
        let wt: &[[u32; BLOCK_M]] = bytemuck::cast_slice(&self.wt);
        assert!(kb.is_multiple_of(2) && pairs <= wt.len() && x0 + COLS <= dv);
        assert!(acc_t.len() >= (x0 + COLS) * BLOCK_M && r0 + VECS * 16 <= BLOCK_M);
        assert!(pairs == 0 || v.len() >= (pairs - 1) * dv + x0 + COLS);
        // SAFETY: every access is within the slices checked above; the caller's CPU has
        // AVX-512 and AVX512-BF16.
        unsafe {
            let mut acc = scaled_sums::<__m512, COLS, VECS>(acc_t, r0, x0, alpha);
            let whole = keys / 2;
            for (c, weights) in wt[..whole].iter().enumerate() {
                prefetch_line(ahead, c);
                let values = v.as_ptr().add(c * dv + x0);
                add_pair(&mut acc, &weights[r0..], values, u32::MAX);
            }
            if pairs > whole {
                // An odd count: the last word's second key is past the block's, its weight
                // 0 and its value dropped (0 times a non-finite value there would be NaN).
                let values = v.as_ptr().add(whole * dv + x0);
                add_pair(&mut acc, &wt[whole][r0..], values, 0xFFFF);
            }
            store_sums::<__m512, COLS, VECS>(&acc, acc_t, r0, x0);
        }
    }
}

/// `acc[w][j] += Σ` over one pair of keys of the weights (`weights`, the rows from the
/// tile's first, `VECS` vectors) times the values (`values[w]`, words of two keys' values,
/// each ANDed with `keep`).
///
/// # Safety
/// The CPU has AVX-512 and AVX512-BF16; `values` holds `COLS` words.
#[inline(always)]
unsafe fn add_pair<const COLS: usize, const VECS: usize>(
    acc: &mut [[__m512; VECS]; COLS],
    weights: &[u32],
    values: *const u32,
    keep: u32,
) {
    assert!(weights.len() >= 16 * VECS);
    // SAFETY: the weights are checked above, the values are the caller's.
    unsafe {
        let mut p = [bf16s(_mm512_setzero_si512()); VECS];
        for (j, slot) in p.iter_mut().enumerate() {
            *slot = bf16s(_mm512_loadu_si512(weights.as_ptr().add(16 * j).cast()));
        }
        for (w, row) in acc.iter_mut().enumerate() {
            let b = bf16s(_mm512_set1_epi32((*values.add(w) & keep) as i32));
            for j in 0..VECS {
                row[j] = _mm512_dpbf16_ps(row[j], p[j], b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Band, BfPairs, BlockArgs, MaskView, Shape, pair_values};
    use crate::core::sdp::{CausalVariant, Window};
    use crate::runtime::cpu::Avx512Bf16Token;
    use half::bf16;

    /// Values in [-1, 1) from a fixed sequence (the test's only source of data).
    fn values(n: usize, seed: u64) -> Vec<bf16> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bf16::from_f64((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            })
            .collect()
    }

    #[test]
    fn bf16_block_matches_the_f64_reference_on_its_inputs() {
        let Some(token) = Avx512Bf16Token::get() else {
            eprintln!("skipped: this CPU has no AVX512-BF16 at the AVX-512 level");
            return;
        };
        let (upper, lower) = (
            Some(CausalVariant::UpperLeft),
            Some(CausalVariant::LowerRight),
        );
        // (rows, first row, keys, d, dv, causal, mask varies along rows / broadcast); the
        // upper-left case ends its key span on an odd key, 47, and the keys from 47 on (which
        // no row sees) hold NaN values.
        let cases = [
            (48, 0, 64, 64, 64, None, None),
            (17, 30, 77, 2, 5, None, None),
            (48, 96, 333, 128, 128, lower, None),
            (33, 0, 130, 40, 17, None, Some(true)),
            (48, 48, 97, 64, 64, lower, Some(false)),
            (47, 0, 64, 32, 16, upper, None),
        ];
        for (n_rows, first, lk, d, dv, causal, mask) in cases {
            let lq = first + n_rows;
            let s = Shape {
                b: 1,
                h: 1,
                hk: 1,
                lq,
                lk,
                d,
                dv,
            };
            let (q, k, mut v) = (values(n_rows * d, 1), values(lk * d, 2), values(lk * dv, 3));
            if causal == upper {
                v[lq * dv..].fill(bf16::NAN);
            }
            let mask_values: Vec<f32> = values(lq * lk, 4).iter().map(|x| x.to_f32()).collect();
            let bias = mask.map(|varies| MaskView {
                values: &mask_values,
                base: 0,
                si: if varies { lk } else { 0 },
                sj: 1,
            });
            let variant = causal.unwrap_or(CausalVariant::UpperLeft);
            let band = Band::new(causal.is_some(), variant, Window::default(), lq, lk);
            let mut v_pairs = vec![0u32; lk.div_ceil(2) * dv];
            pair_values(&v, lk, dv, &mut v_pairs);
            let scale = 0.3;
            let (mut out, mut lse) = (vec![f32::NAN; n_rows * dv], vec![f32::NAN; n_rows]);
            super::super::lanes::block_avx512_bf16(
                token,
                BlockArgs {
                    inputs: BfPairs {
                        q: &q,
                        k: &k,
                        v_pairs: &v_pairs,
                        scale,
                    },
                    rows: first..lq,
                    s: &s,
                    band,
                    bias,
                    out: &mut out,
                    lse: &mut lse,
                },
            );
            let f = |x: &bf16| x.to_f64();
            let (mut err, mut norm) = (0f64, 0f64);
            for r in 0..n_rows {
                let i = first + r;
                let seen = band.map_or(0..lk, |band| band.keys(i, lk));
                let scores: Vec<f64> = seen
                    .clone()
                    .map(|j| {
                        let dot: f64 = (0..d).map(|x| f(&q[r * d + x]) * f(&k[j * d + x])).sum();
                        let add = bias.map_or(0.0, |m| f64::from(m.at(i, j)));
                        dot * f64::from(scale) + add
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                let want_lse = max + sum.ln();
                assert!((f64::from(lse[r]) - want_lse).abs() < 1e-4, "lse {r}");
                for x in 0..dv {
                    let want: f64 = seen
                        .clone()
                        .zip(&scores)
                        .map(|(j, s)| (s - max).exp() / sum * f(&v[j * dv + x]))
                        .sum();
                    err += (f64::from(out[r * dv + x]) - want).powi(2);
                    norm += want * want;
                }
            }
            let rel = (err / norm).sqrt();
            // Only the weights are rounded to bf16 (2^-9 relative each).
            assert!(
                rel < 4e-3,
                "{n_rows} rows at {first}, lk {lk}, d {d}, dv {dv}: {rel}"
            );
        }
    }
}
