//! Packing: A's rows and B's columns laid out panel by panel in the order the
//! micro-kernels read them, rounded for the reduced-precision modes, or paired as bf16
//! values for the dot-product kernel.

use super::{BOperand, MatView, Rounding};
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

/// `out[j]` = [`pair_of`]`(lo[j], hi[j])` (`hi` absent past the last K index): for bf16 rows
/// an interleave of their bits on the widest vectors the CPU has (one element at a time, it
/// was a fifth of a bf16 3 x 3 convolution's time).
fn pair_rows<T: Element>(lo: &[T], hi: Option<&[T]>, out: &mut [f32]) {
    if T::DTYPE != DType::Bf16 {
        for (j, (slot, x)) in out.iter_mut().zip(lo).enumerate() {
            *slot = pair_of(*x, hi.map(|hi| hi[j]));
        }
        return;
    }
    fn bits<T: Element>(row: &[T]) -> &[u16] {
        bytemuck::cast_slice(row)
    }
    let (lo, hi) = (bits(lo), hi.map(bits));
    #[inline(always)]
    fn interleave(lo: &[u16], hi: Option<&[u16]>, out: &mut [f32]) {
        match hi {
            Some(hi) => {
                for ((slot, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                    *slot = f32::from_bits(u32::from(l) | u32::from(h) << 16);
                }
            }
            None => {
                for (slot, &l) in out.iter_mut().zip(lo) {
                    *slot = f32::from_bits(u32::from(l));
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn avx512(lo: &[u16], hi: Option<&[u16]>, out: &mut [f32]) {
            interleave(lo, hi, out)
        }
        if crate::runtime::cpu::Avx512Token::get().is_some() {
            // SAFETY: the token proves the AVX-512 level (F and BW among it).
            return unsafe { avx512(lo, hi, out) };
        }
    }
    interleave(lo, hi, out)
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
                // bf16 data in pairs: two neighbours along K already are one packed word.
                (6, true, _) if T::DTYPE == DType::Bf16 => {
                    let rows: [&[T]; 6] = rows[..6].try_into().expect("six rows");
                    interleave_words(rows.map(bytemuck::cast_slice::<T, u16>), panel)
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

/// Writes `MR` equally long rows of bf16 bits into `panel` as pairs, step by step:
/// `panel[step][row]` holds the row's values `2 step` (low half) and `2 step + 1` (high
/// half, zero past the row's end).
#[inline(always)]
fn interleave_words<const MR: usize>(rows: [&[u16]; MR], panel: &mut [f32]) {
    let whole = rows[0].len() / 2;
    let (body, tail) = panel.split_at_mut(whole * MR);
    for (step, dst) in body.chunks_exact_mut(MR).enumerate() {
        for (slot, row) in dst.iter_mut().zip(rows) {
            let word = u32::from(row[2 * step]) | u32::from(row[2 * step + 1]) << 16;
            *slot = f32::from_bits(word);
        }
    }
    if let Some(dst) = tail.chunks_exact_mut(MR).next() {
        for (slot, row) in dst.iter_mut().zip(rows) {
            *slot = f32::from_bits(u32::from(row[2 * whole]));
        }
    }
}

/// Packs B's columns `[col_begin + first_panel * nr .. col_end)` for K indices
/// `pc..pc + kc` (`cols` is `(pc, kc, col_begin, col_end)`): panel `p` holds
/// `out[p][step][col]`, zero past `col_end`; with `pairs`, a step holds two K indices.
pub(super) fn pack_b<T: Element>(
    b: BOperand<T>,
    first_panel: usize,
    out: &mut [f32],
    nr: usize,
    (pc, kc, col_begin, col_end): (usize, usize, usize, usize),
    rounding: Rounding,
    pairs: bool,
) {
    let stride = if pairs { 2 } else { 1 };
    let steps = kc.div_ceil(stride);
    let data = match b {
        BOperand::View(view) => view.data,
        BOperand::Rows { data, .. } => data,
    };
    // Where row k of B starts, when its columns are contiguous.
    let row_start = |k: usize| match b {
        BOperand::View(view) => (view.cs == 1).then(|| view.offset + k * view.rs),
        BOperand::Rows { starts, .. } => Some(starts[k]),
    };
    let value = |k: usize, col: usize| match b {
        BOperand::View(view) => view.at(k, col),
        BOperand::Rows { data, starts } => data[starts[k] + col].to_f32(),
    };
    for (p, panel) in out.chunks_mut(nr * steps).enumerate() {
        let col0 = col_begin + (first_panel + p) * nr;
        // A B stored column by column (`W.t()`): whole panels go through register transposes
        // (of values, or for bf16 pairs of the 32-bit words two K indices make).
        let exact = if pairs {
            T::DTYPE == DType::Bf16
        } else {
            rounding == Rounding::None
        };
        if let BOperand::View(view) = b {
            let by_columns = exact && view.rs == 1 && view.cs != 1 && col0 + nr <= col_end;
            if by_columns && columns::pack_panel(view, col0, (pc, kc), nr, pairs, panel) {
                continue;
            }
        }
        // Columns of the panel inside B (a last panel can be partial: zero past them).
        let width = nr.min(col_end.saturating_sub(col0));
        for step in 0..steps {
            let (row, past) = panel[step * nr..(step + 1) * nr].split_at_mut(width);
            past.fill(0.0);
            let k = pc + step * stride;
            if let Some(start) = row_start(k) {
                let start = start + col0;
                let lo = &data[start..start + width];
                if !pairs && rounding == Rounding::None {
                    // (A loop of its own, which the compiler turns into vector copies.)
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = x.to_f32();
                    }
                } else if !pairs {
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = rounding.apply(x.to_f32());
                    }
                } else {
                    let next = (k + 1 < pc + kc).then(|| row_start(k + 1)).flatten();
                    let hi = next.map(|next| &data[next + col0..next + col0 + width]);
                    pair_rows(lo, hi, row);
                }
                continue;
            }
            for (j, out) in row.iter_mut().enumerate() {
                *out = slot(|k| value(k, col0 + j), k, pc + kc, rounding, pairs);
            }
        }
    }
}

/// Packing of a B stored column by column (row stride 1, as the transposed view of a
/// row-major weight): blocks of `LANES x LANES` elements read as vectors along K,
/// transposed in registers and stored as panel rows, instead of one strided element at a
/// time.
mod columns {
    use super::MatView;
    use crate::DType;
    use crate::core::tensor::Element;

    /// Packs the full panel of columns `col0..col0 + nr`, K indices `k0..k0 + kc`, into
    /// `panel` (`out[step][col]`, a step one K index or with `pairs` two as bf16) where this
    /// CPU and element type (f32, bf16; pairs of bf16) have the vector path; `false` where
    /// they have not (nothing is written then).
    pub(super) fn pack_panel<T: Element>(
        b: MatView<T>,
        col0: usize,
        (k0, kc): (usize, usize),
        nr: usize,
        pairs: bool,
        panel: &mut [f32],
    ) -> bool {
        // Every element read lies in the data and every one written in the panel.
        let last = (col0 + nr - 1)
            .checked_mul(b.cs)
            .and_then(|x| x.checked_add(b.offset + k0 + kc));
        let steps = if pairs { kc.div_ceil(2) } else { kc };
        if kc == 0
            || nr == 0
            || last.is_none_or(|end| end > b.data.len())
            || panel.len() < steps * nr
        {
            return false;
        }
        match T::DTYPE {
            #[cfg(target_arch = "x86_64")]
            DType::F32 if !pairs => x86::pack(
                bytemuck::cast_slice::<T, f32>(b.data),
                b,
                col0,
                (k0, kc),
                (nr, false),
                panel,
            ),
            #[cfg(target_arch = "x86_64")]
            DType::Bf16 => x86::pack(
                bytemuck::cast_slice::<T, half::bf16>(b.data),
                b,
                col0,
                (k0, kc),
                (nr, pairs),
                panel,
            ),
            _ => false,
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::{__m256, __m512};

        use super::MatView;
        use crate::core::tensor::Element;
        use crate::kernels::simd::{Load, Vector};
        use crate::runtime::cpu::{Avx2Token, Avx512Token};

        /// [`super::pack_panel`] over `data` (B's elements as `L`), checked by the caller.
        pub(super) fn pack<T: Element, L: Load>(
            data: &[L],
            b: MatView<T>,
            col0: usize,
            (k0, kc): (usize, usize),
            (nr, pairs): (usize, bool),
            panel: &mut [f32],
        ) -> bool {
            let first = data[b.offset + col0 * b.cs..].as_ptr();
            let (out, cs) = (panel.as_mut_ptr(), b.cs);
            if nr.is_multiple_of(16) && Avx512Token::get().is_some() {
                // SAFETY: the AVX-512 level is in force (the token); the caller checked that
                // the columns' elements lie in `data` and the panel holds its steps x nr
                // floats.
                unsafe { by_zmm(first, cs, (k0, kc), (nr, pairs), out) };
                return true;
            }
            if nr.is_multiple_of(8) && Avx2Token::get().is_some() {
                // SAFETY: as above, for AVX2 (the token).
                unsafe { by_ymm(first, cs, (k0, kc), (nr, pairs), out) };
                return true;
            }
            false
        }

        /// # Safety
        /// The CPU has AVX-512F; see [`by_blocks`].
        #[target_feature(enable = "avx512f,fma")]
        unsafe fn by_zmm<L: Load>(
            first: *const L,
            cs: usize,
            k: (usize, usize),
            nr: (usize, bool),
            out: *mut f32,
        ) {
            // SAFETY: the caller's CPU and pointers.
            unsafe { by_blocks::<__m512, L>(first, cs, k, nr, out) }
        }

        /// # Safety
        /// The CPU has AVX2 and FMA; see [`by_blocks`].
        #[target_feature(enable = "avx2,fma")]
        unsafe fn by_ymm<L: Load>(
            first: *const L,
            cs: usize,
            k: (usize, usize),
            nr: (usize, bool),
            out: *mut f32,
        ) {
            // SAFETY: the caller's CPU and pointers.
            unsafe { by_blocks::<__m256, L>(first, cs, k, nr, out) }
        }

        /// `out[step * nr + j] = column j's element k0 + step` for `j < nr` (a multiple of
        /// `LANES`), `step < kc`, where column `j` starts at `first + j·cs`; with `pairs`
        /// (bf16 elements), step `s` holds elements `k0 + 2s` and `k0 + 2s + 1` (0 past
        /// `kc`) as one 32-bit word, the transpose then moving words.
        ///
        /// # Safety
        /// The CPU has `V`'s instruction set; every column holds its K indices
        /// `k0..k0 + kc`; `out` is valid for `steps x nr` floats.
        #[inline(always)]
        unsafe fn by_blocks<V: Vector, L: Load>(
            first: *const L,
            cs: usize,
            (k0, kc): (usize, usize),
            (nr, pairs): (usize, bool),
            out: *mut f32,
        ) {
            let lanes = V::LANES;
            let (steps, full) = if pairs {
                (kc.div_ceil(2), kc / 2)
            } else {
                (kc, kc)
            };
            let whole = full / lanes * lanes;
            // SAFETY: every read is a column's K index below k0 + kc (a vector of pairs
            // reads 2 x LANES elements from an even step) and every write a panel slot below
            // steps x nr (the contract above).
            unsafe {
                let mut block = [V::splat(0.0); 16];
                for cb in (0..nr).step_by(lanes) {
                    let column = |i: usize| first.add((cb + i) * cs + k0);
                    for kb in (0..whole).step_by(lanes) {
                        for (i, row) in block[..lanes].iter_mut().enumerate() {
                            *row = if pairs {
                                V::load(column(i).add(2 * kb).cast())
                            } else {
                                L::load::<V>(column(i).add(kb))
                            };
                        }
                        V::transpose(&mut block[..lanes]);
                        for (r, row) in block[..lanes].iter().enumerate() {
                            row.store(out.add((kb + r) * nr + cb));
                        }
                    }
                    for step in whole..steps {
                        for i in 0..lanes {
                            let at = column(i);
                            *out.add(step * nr + cb + i) = if pairs {
                                let hi = (2 * step + 1 < kc).then(|| *at.add(2 * step + 1));
                                super::super::pair_of(*at.add(2 * step), hi)
                            } else {
                                (*at.add(step)).to_f32()
                            };
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register-transpose packing of a column-major B gives the element-by-element
    /// packing's panels, for f32 and bf16, full and partial K blocks, on every vector width
    /// this CPU has (AVX-512's 64-wide panels, AVX2's 16-wide ones).
    #[test]
    fn column_major_panels_match_the_element_loop() {
        let (k, n) = (53, 128);
        let values: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let bf16s: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
        fn check<T: Element>(data: &[T], (k, n): (usize, usize), nr: usize) {
            // B = W.t() for a row-major [n + 1, k] W, seen from its second row on.
            let b = MatView {
                data,
                offset: k,
                rs: 1,
                cs: k,
            };
            for (pc, kc) in [(0, k), (5, 33), (16, 16), (2, 51)] {
                let len = (n - 1) / nr * nr;
                let mut fast = vec![f32::NAN; len * kc];
                pack_b(
                    BOperand::View(b),
                    0,
                    &mut fast,
                    nr,
                    (pc, kc, 0, len),
                    Rounding::None,
                    false,
                );
                let slow: Vec<f32> = (0..len / nr)
                    .flat_map(|p| (0..kc).flat_map(move |step| (0..nr).map(move |j| (p, step, j))))
                    .map(|(p, step, j)| b.at(pc + step, p * nr + j))
                    .collect();
                assert_eq!(fast, slow, "{} nr={nr} pc={pc} kc={kc}", T::DTYPE);
                if T::DTYPE != DType::Bf16 {
                    continue;
                }
                // Pairs of bf16 (the dot-product and AMX layouts): words of two K indices.
                let steps = kc.div_ceil(2);
                let mut fast = vec![f32::NAN; len * steps];
                pack_b(
                    BOperand::View(b),
                    0,
                    &mut fast,
                    nr,
                    (pc, kc, 0, len),
                    Rounding::None,
                    true,
                );
                let value = |k: usize, col: usize| b.data[b.offset + k * b.rs + col * b.cs];
                let slow: Vec<u32> = (0..len / nr)
                    .flat_map(|p| {
                        (0..steps).flat_map(move |step| (0..nr).map(move |j| (p, step, j)))
                    })
                    .map(|(p, step, j)| {
                        let (k, col) = (pc + 2 * step, p * nr + j);
                        let hi = (k + 1 < pc + kc).then(|| value(k + 1, col));
                        pair_of(value(k, col), hi).to_bits()
                    })
                    .collect();
                let fast: Vec<u32> = fast.iter().map(|x| x.to_bits()).collect();
                assert_eq!(fast, slow, "pairs nr={nr} pc={pc} kc={kc}");
            }
        }
        let mut data = values.clone();
        data.extend(std::iter::repeat_n(0.5, k));
        let mut wide = bf16s.clone();
        wide.extend(std::iter::repeat_n(half::bf16::from_f32(0.5), k));
        for nr in [64, 16] {
            check(&data, (k, n), nr);
            check(&wide, (k, n), nr);
        }
    }
}
