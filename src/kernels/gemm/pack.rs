//! Packing: A's rows and B's columns laid out panel by panel in the order the
//! micro-kernels read them, rounded for the reduced-precision modes, or paired as bf16
//! values for the dot-product kernel.

use super::{MatView, Rounding};
use crate::DType;
use crate::core::tensor::Element;

/// The most rows a micro-kernel tile has.
pub(super) const MAX_MR: usize = 8;

/// Two values rounded to bf16 in one 32-bit word, `lo` in the lower half.
#[inline(always)]
pub(super) fn pair(lo: f32, hi: f32) -> f32 {
    let bits = |x: f32| u32::from(half::bf16::from_f32(x).to_bits());
    f32::from_bits(bits(lo) | bits(hi) << 16)
}

/// `x` as bf16 bits: the bits themselves for bf16 data (no round trip through f32), else
/// `x` rounded to bf16.
#[inline(always)]
pub(super) fn bf16_bits<T: Element>(x: T) -> u32 {
    if T::DTYPE == DType::Bf16 {
        u32::from(bytemuck::cast_slice::<T, u16>(std::slice::from_ref(&x))[0])
    } else {
        u32::from(half::bf16::from_f32(x.to_f32()).to_bits())
    }
}

/// As [`pair`], from elements (`hi` absent past the last K index).
#[inline(always)]
pub(super) fn pair_of<T: Element>(lo: T, hi: Option<T>) -> f32 {
    f32::from_bits(bf16_bits(lo) | hi.map_or(0, bf16_bits) << 16)
}

/// One packed slot: a value, or with `pairs` the bf16 values of K indices `k` and `k + 1`
/// (zero past `k_end`) in one 32-bit word.
#[inline(always)]
pub(super) fn slot(
    value: impl Fn(usize) -> f32,
    k: usize,
    k_end: usize,
    rounding: Rounding,
    pairs: bool,
) -> f32 {
    if !pairs {
        return rounding.apply(value(k));
    }
    let hi = if k + 1 < k_end { value(k + 1) } else { 0.0 };
    pair(value(k), hi)
}

/// Packs A's rows `[first_panel * mr ..)` (one chunk of panels) for K indices
/// `pc..pc + kc` (`rows` is `(pc, kc, m)`): panel `p` holds `out[p][step][row]`, zero past
/// row `m`; with `pairs`, a step holds two K indices.
pub(super) fn pack_a<T: Element>(
    a: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    mr: usize,
    (pc, kc, m): (usize, usize, usize),
    rounding: Rounding,
    pairs: bool,
) {
    let stride = if pairs { 2 } else { 1 };
    let steps = kc.div_ceil(stride);
    for (p, panel) in out.chunks_mut(mr * steps).enumerate() {
        let row0 = (first_panel + p) * mr;
        if a.cs == 1 && row0 + mr <= m && mr <= MAX_MR {
            // Contiguous rows: read them side by side and write the panel in order.
            let mut rows: [&[T]; MAX_MR] = [&[]; MAX_MR];
            for (i, row) in rows[..mr].iter_mut().enumerate() {
                let start = a.offset + (row0 + i) * a.rs + pc;
                *row = &a.data[start..start + kc];
            }
            match (mr, pairs, rounding) {
                // The AVX-512 and AVX2 tiles' common case, unrolled over its six rows.
                (6, false, Rounding::None) => {
                    interleave::<T, 6>(rows[..6].try_into().expect("six rows"), panel)
                }
                _ => {
                    for (step, dst) in panel.chunks_exact_mut(mr).enumerate() {
                        let k = step * stride;
                        for (slot, row) in dst.iter_mut().zip(&rows[..mr]) {
                            *slot = if pairs {
                                pair_of(row[k], row.get(k + 1).copied())
                            } else {
                                rounding.apply(row[k].to_f32())
                            };
                        }
                    }
                }
            }
            continue;
        }
        for (step, dst) in panel.chunks_exact_mut(mr).enumerate() {
            let k = pc + step * stride;
            for (i, slot) in dst.iter_mut().enumerate() {
                let row = row0 + i;
                *slot = if row < m {
                    self::slot(|k| a.at(row, k), k, pc + kc, rounding, pairs)
                } else {
                    0.0
                };
            }
        }
    }
}

/// Writes `MR` equally long rows into `panel` step by step: `panel[step][row]`.
#[inline(always)]
pub(super) fn interleave<T: Element, const MR: usize>(rows: [&[T]; MR], panel: &mut [f32]) {
    let steps = panel.len() / MR;
    let rows = rows.map(|row| &row[..steps]);
    for (step, dst) in panel.chunks_exact_mut(MR).enumerate() {
        for (slot, row) in dst.iter_mut().zip(rows) {
            *slot = row[step].to_f32();
        }
    }
}

/// Packs B's columns `[col_begin + first_panel * nr .. col_end)` for K indices
/// `pc..pc + kc` (`cols` is `(pc, kc, col_begin, col_end)`): panel `p` holds
/// `out[p][step][col]`, zero past `col_end`; with `pairs`, a step holds two K indices.
pub(super) fn pack_b<T: Element>(
    b: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    nr: usize,
    (pc, kc, col_begin, col_end): (usize, usize, usize, usize),
    rounding: Rounding,
    pairs: bool,
) {
    let stride = if pairs { 2 } else { 1 };
    let steps = kc.div_ceil(stride);
    for (p, panel) in out.chunks_mut(nr * steps).enumerate() {
        let col0 = col_begin + (first_panel + p) * nr;
        for step in 0..steps {
            let row = &mut panel[step * nr..(step + 1) * nr];
            let k = pc + step * stride;
            if b.cs == 1 && col0 + nr <= col_end {
                let start = b.offset + k * b.rs + col0;
                let lo = &b.data[start..start + nr];
                if !pairs {
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = rounding.apply(x.to_f32());
                    }
                } else if k + 1 < pc + kc {
                    let hi = &b.data[start + b.rs..start + b.rs + nr];
                    for ((slot, x), y) in row.iter_mut().zip(lo).zip(hi) {
                        *slot = pair_of(*x, Some(*y));
                    }
                } else {
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = pair_of(*x, None);
                    }
                }
                continue;
            }
            for (j, out) in row.iter_mut().enumerate() {
                let col = col0 + j;
                *out = if col < col_end {
                    slot(|k| b.at(k, col), k, pc + kc, rounding, pairs)
                } else {
                    0.0
                };
            }
        }
    }
}
