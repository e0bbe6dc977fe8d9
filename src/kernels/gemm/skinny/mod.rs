//! Products with few rows of A (a decoding step's `x @ W`, matrix-vector products; up to
//! 32 rows of f32 values or of bf16 ones on bf16 dot products, 8 of bf16 widened to f32).
//! They are bound by reading B, so B is read once, in place, in its own layout and dtype:
//! packing it (N·K per call) would cost as much as the product. A row-major B is read in
//! register tiles of C against panels of its columns, a few rows of B at a time, each
//! left to right (`rows_panels`), the columns past the last panel streamed row by row into
//! the rows of C, kept in L1 (`c[i, :] += a[i, k] · b[k, :]`); a transposed one (`W.t()`
//! of a row-major `[N, K]` weight) gives each output a dot product over a contiguous row
//! of W. Columns of C are split among the threads; every output is summed
//! by one thread in a fixed order, so results do not depend on the thread count. bf16 data
//! runs as AVX512-BF16 dot products where the packed GEMM's kernel does (`pairs.rs`), else
//! widened to f32.

mod pairs;

use half::bf16;

use super::{MatView, Rounding};
use crate::DType;
use crate::core::tensor::Element;
use crate::kernels::simd::{Load, Vector};
use crate::runtime::cpu::{Avx2Token, Avx512Token};
use std::arch::x86_64::{__m256, __m512};

/// The most rows of A whose bf16 B is widened to f32 (each group of rows widens it again).
const MAX_WIDENED_ROWS: usize = 8;
/// The most rows of A this path takes otherwise: each group of rows reuses B's rows from L1
/// or L2, which stays ahead of packing B up to 32 rows (f32 `[32, 4096] x W.t()`, W
/// `[4096, 4096]`: 0.73x PyTorch, packed 0.51x; `[11008, 4096]`: 0.88x against 0.56x, on a
/// 2-core Xeon; `[32, 4096] x [4096, 11008]` in register tiles 10.9 ms, packed 16.2, on
/// an AMD EPYC Zen 5).
const MAX_ROWS: usize = 32;
/// Rows of A a dot-product pass holds in registers (with `NB` outputs each).
const ROW_GROUP: usize = 4;

/// Columns of C a thread gets, at least (fewer: the start-up costs more than the work).
const MIN_COLUMNS_PER_THREAD: usize = 256;

/// Whether the skinny path serves `m` rows of A against a B of strides `(rs, cs)` (exact
/// f32 or bf16 values, B row-major or transposed, a SIMD level in force): the name of its
/// kernel, or `None`.
pub(crate) fn kernel<T: Element>(
    (m, n): (usize, usize),
    (rs, cs): (usize, usize),
    rounding: Rounding,
) -> Option<&'static str> {
    let layout_ok = cs == 1 || rs == 1;
    let rows_layout = streams_rows(rs, cs, n);
    let dtype_ok = matches!(T::DTYPE, DType::F32 | DType::Bf16);
    let max_rows = if bf16_pairs::<T>() || T::DTYPE == DType::F32 {
        MAX_ROWS
    } else {
        MAX_WIDENED_ROWS
    };
    if m == 0 || m > max_rows || rounding != Rounding::None || !layout_ok || !dtype_ok {
        return None;
    }
    if bf16_pairs::<T>() {
        Some(if rows_layout {
            "skinny_rows_avx512_bf16"
        } else {
            "skinny_dots_avx512_bf16"
        })
    } else if Avx512Token::get().is_some() {
        Some(if rows_layout {
            "skinny_rows_avx512"
        } else {
            "skinny_dots_avx512"
        })
    } else if Avx2Token::get().is_some() {
        Some(if rows_layout {
            "skinny_rows_avx2"
        } else {
            "skinny_dots_avx2"
        })
    } else {
        None
    }
}

/// Whether `T` is bf16 and runs as bf16 dot products ([`pairs`]): where the packed GEMM's
/// bf16 kernel does (AVX512-BF16 in force and faster than f32 FMAs).
fn bf16_pairs<T: Element>() -> bool {
    T::DTYPE == DType::Bf16 && crate::kernels::dispatch::cpu_kernels().gemm_bf16.pairs
}

/// Whether a B of strides `(rs, cs)` and `n` columns is streamed by rows (row-major), else
/// read as the rows of a weight (dot products). A B that is both (`rs = cs = 1`: fewer
/// columns than a vector) is read as dot products: whole vectors along K, not one scalar
/// per K index.
fn streams_rows(rs: usize, cs: usize, n: usize) -> bool {
    cs == 1 && !(rs == 1 && n < 16)
}

/// `A (m x k) · B (k x n)` into the row-major `m x n` matrix `c`, where [`kernel`] said
/// this path serves it.
pub(super) fn gemm<T: Element>(
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    threads: usize,
) {
    // A's rows, contiguous in f32 or as bf16 pairs (m·k values: small next to B).
    let pairs = bf16_pairs::<T>();
    let rows_layout = streams_rows(b.rs, b.cs, n);
    let words = if pairs {
        pairs::pair_rows(a, (m, k), rows_layout)
    } else {
        Vec::new()
    };
    let rows: Vec<f32> = if pairs {
        Vec::new()
    } else {
        (0..m * k).map(|e| a.at(e / k, e % k)).collect()
    };
    let team = threads
        .min(n.div_ceil(MIN_COLUMNS_PER_THREAD))
        .min(
            (m * n * k)
                .div_ceil(super::driver::MIN_WORK_PER_THREAD)
                .max(1),
        )
        .max(1);
    // Each thread's columns of C, written into its own buffer, then copied in place.
    let per = n.div_ceil(team).next_multiple_of(16);
    let parts: Vec<std::sync::Mutex<Vec<f32>>> = (0..team).map(|_| Default::default()).collect();
    crate::runtime::threads::parallel(team, &|index, team_now| {
        // A smaller team than asked takes the ranges in turns.
        for range in (index..team).step_by(team_now) {
            let (j0, j1) = ((range * per).min(n), ((range + 1) * per).min(n));
            let mut out = vec![0f32; m * (j1 - j0)];
            if j1 > j0 && pairs {
                // SAFETY: `bf16_pairs` saw the packed GEMM's AVX512-BF16 kernel in force (the
                // AVX-512 level and AVX512-BF16).
                unsafe {
                    pairs::columns(&words, (m, k), (b.cast(), rows_layout), (j0, j1), &mut out)
                };
            } else if j1 > j0 {
                columns(Share {
                    rows: &rows,
                    m,
                    k,
                    b,
                    j0,
                    j1,
                    out: &mut out,
                });
            }
            *parts[range].lock().unwrap_or_else(|p| p.into_inner()) = out;
        }
    });
    for (range, part) in parts.into_iter().enumerate() {
        let part = part.into_inner().unwrap_or_else(|p| p.into_inner());
        let (j0, j1) = ((range * per).min(n), ((range + 1) * per).min(n));
        for i in 0..m {
            c[i * n + j0..i * n + j1].copy_from_slice(&part[i * (j1 - j0)..(i + 1) * (j1 - j0)]);
        }
    }
}

/// One thread's share of the product: columns `j0..j1` of C (`out`: `m` rows of `j1 - j0`)
/// from A's rows (`rows`: `m x k` in f32) and B.
struct Share<'a, E> {
    rows: &'a [f32],
    m: usize,
    k: usize,
    b: MatView<'a, E>,
    j0: usize,
    j1: usize,
    out: &'a mut [f32],
}

impl<'a, T: Element> Share<'a, T> {
    /// The same share with B seen as `E`, which is `T` (checked by the caller through
    /// `T::DTYPE`).
    fn cast<E: bytemuck::Pod>(self) -> Share<'a, E> {
        Share {
            rows: self.rows,
            m: self.m,
            k: self.k,
            b: self.b.cast(),
            j0: self.j0,
            j1: self.j1,
            out: self.out,
        }
    }
}

/// A share on the SIMD level in force, with B in its own element type.
fn columns<T: Element>(share: Share<T>) {
    match T::DTYPE {
        DType::F32 => level(share.cast::<f32>()),
        DType::Bf16 => level(share.cast::<bf16>()),
        _ => unreachable!("`kernel` takes f32 and bf16 only"),
    }
}

fn level<E: Load>(share: Share<E>) {
    if let Some(token) = Avx512Token::get() {
        avx512(token, share);
    } else if let Some(token) = Avx2Token::get() {
        avx2(token, share);
    }
}

fn avx512<E: Load>(_: Avx512Token, share: Share<E>) {
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run<E: Load>(share: Share<E>) {
        // SAFETY: the CPU has AVX-512 (the caller's token).
        unsafe { body::<__m512, E, 4, 8, 3>(share) }
    }
    // SAFETY: the token proves the AVX-512 level (F and FMA).
    unsafe { run(share) }
}

fn avx2<E: Load>(_: Avx2Token, share: Share<E>) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<E: Load>(share: Share<E>) {
        // SAFETY: the CPU has AVX2 and FMA (the caller's token).
        unsafe { body::<__m256, E, 2, 4, 2>(share) }
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { run(share) }
}

/// Both layouts on vectors `V`; `NB` outputs of a dot product at a time, register tiles of
/// `R` rows of A against a row-major B.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn body<V: Vector, E: Load, const NB: usize, const R: usize, const P: usize>(
    share: Share<E>,
) {
    let Share {
        rows,
        m,
        k,
        b,
        j0,
        j1,
        out,
    } = share;
    let width = j1 - j0;
    assert!(rows.len() == m * k && out.len() == m * width && m <= MAX_ROWS);
    // Every element of B the loops read, checked once: (k - 1, j1 - 1) is the farthest.
    assert!(b.offset + (k - 1) * b.rs + (j1 - 1) * b.cs < b.data.len());
    let base = b.data.as_ptr().wrapping_add(b.offset);
    // (j1 ≥ 16 whenever n is: the threads' ranges are multiples of 16 but the last, which
    // ends at n.)
    if streams_rows(b.rs, b.cs, j1) {
        // C in register tiles against panels of B's columns; the columns past the last
        // whole panel (fewer than a panel's) by streaming B's rows into C's:
        // c[i, p..] += a[i, kk] · b[kk, p..].
        let panels = width / (P * V::LANES) * (P * V::LANES);
        if panels > 0 {
            // SAFETY: columns j0..j0 + panels ≤ j1 of every row of B (checked above).
            unsafe { rows_panels::<V, E, R, P>(rows, (m, k), (base, b.rs), (j0, panels), out) };
        }
        if panels < width {
            // SAFETY: columns j0 + panels..j1 of every row of B (checked above).
            unsafe {
                rows_piece::<V, E>(
                    rows,
                    (m, k),
                    (base, b.rs),
                    (j0 + panels, j1),
                    out,
                    (width, panels),
                );
            }
        }
        return;
    }
    // c[i, j] = a[i, :] · w[j, :] with w[j, kk] = b[kk, j] contiguous in kk, `NB` rows of W
    // against a group of A's rows at a time (the W rows stay in L1 between groups).
    let full = k / V::LANES * V::LANES;
    let mut j = j0;
    while j < j1 {
        let count = NB.min(j1 - j);
        for r0 in (0..m).step_by(ROW_GROUP) {
            let group = ROW_GROUP.min(m - r0);
            // SAFETY: register work under the caller's instruction set.
            let zero = unsafe { V::splat(0.0) };
            let mut acc = [[zero; NB]; ROW_GROUP];
            let w = |jj: usize| base.wrapping_add((j + jj.min(count - 1)) * b.cs);
            for kk in (0..full).step_by(V::LANES) {
                // SAFETY: lanes kk..kk + LANES < k of rows of W below j1 (clamped) and of
                // A's rows (r0 + i < m).
                unsafe {
                    let wv: [V; NB] = std::array::from_fn(|jj| E::load::<V>(w(jj).add(kk)));
                    for (i, acc_i) in acc.iter_mut().enumerate().take(group) {
                        let av = V::load(rows.as_ptr().add((r0 + i) * k + kk));
                        for (slot, &x) in acc_i.iter_mut().zip(&wv) {
                            *slot = V::fmadd(av, x, *slot);
                        }
                    }
                }
            }
            for i in 0..group {
                for jj in 0..count {
                    // SAFETY: register work under the caller's instruction set.
                    let mut sum = unsafe { acc[i][jj].sum() };
                    for kk in full..k {
                        // SAFETY: kk < k in row j + jj < j1 of W (checked above).
                        let x = unsafe { *w(jj).add(kk) }.to_f32();
                        sum = rows[(r0 + i) * k + kk].mul_add(x, sum);
                    }
                    out[(r0 + i) * width + (j - j0) + jj] = sum;
                }
            }
        }
        j += count;
    }
}

/// C's columns `j0..j0 + len` (`len` a multiple of `P` vectors) from a row-major B, in
/// register tiles of up to `R` rows of A x `P` vectors of columns, each running down a
/// block of B's rows (C loaded and stored once per block, not once per row of B). A block
/// sweeps all the panels before the next block starts, so that B is read as a few rows at
/// a time, each left to right: [`K_BLOCK`] rows where one group of A's rows reads B once
/// (the memory streams it so), [`K_BLOCK_SHARED`] where several groups share the block from
/// L1 and L2. Each output is summed in the order of K, as the row-streaming pass sums it.
///
/// # Safety
/// The CPU has `V`'s instruction set; B's rows hold columns `j0..j0 + len` for every
/// `kk < k`.
#[inline(always)]
unsafe fn rows_panels<V: Vector, E: Load, const R: usize, const P: usize>(
    rows: &[f32],
    (m, k): (usize, usize),
    (base, rs): (*const E, usize),
    (j0, len): (usize, usize),
    out: &mut [f32],
) {
    let width = out.len() / m;
    assert!(len <= width && len.is_multiple_of(P * V::LANES) && rows.len() >= m * k);
    let shared = m > R;
    let k_block = if shared { K_BLOCK_SHARED } else { K_BLOCK };
    let panel_width = P * V::LANES;
    // Where groups share a block, each panel's part is copied together first: B's rows,
    // 4 KiB multiples apart, would fall in a few cache sets and leave L1 and L2 before the
    // next group reads them (`[32, 4096] x [4096, 4096]` f32 on a 2-core Xeon: 19.3 ms in
    // place, 6 with the copy).
    let mut copy: Vec<E> = Vec::new();
    if shared {
        copy.resize(k_block * panel_width, E::from_f64(0.0));
    }
    for kb in (0..k).step_by(k_block) {
        let ks = kb..(kb + k_block).min(k);
        for p in (0..len).step_by(panel_width) {
            let mut panel = (base.wrapping_add(j0 + p), rs);
            if shared {
                for (kk, to) in ks.clone().zip(copy.chunks_exact_mut(panel_width)) {
                    // SAFETY: the panel's columns of B's row kk (the caller's bounds).
                    let from =
                        unsafe { std::slice::from_raw_parts(panel.0.add(kk * rs), panel_width) };
                    to.copy_from_slice(from);
                }
                // Row kk of the block at (kk - kb) panel widths into the copy.
                panel = (copy.as_ptr().wrapping_sub(kb * panel_width), panel_width);
            }
            for r0 in (0..m).step_by(R) {
                let tile = Tile {
                    rows,
                    k,
                    r0,
                    ks: ks.clone(),
                    panel,
                };
                let c = &mut out[r0 * width + p..];
                // SAFETY: the caller's instruction set and bounds; the tile's rows of A
                // are below m (r0 + its R), its outputs inside `out` (p + P·LANES ≤ width).
                unsafe {
                    match m - r0 {
                        1 => tile.run::<V, 1, P>(c, width),
                        2 => tile.run::<V, 2, P>(c, width),
                        3 => tile.run::<V, 3, P>(c, width),
                        4 => tile.run::<V, 4, P>(c, width),
                        5 if R > 4 => tile.run::<V, 5, P>(c, width),
                        6 if R > 4 => tile.run::<V, 6, P>(c, width),
                        7 if R > 4 => tile.run::<V, 7, P>(c, width),
                        _ => tile.run::<V, R, P>(c, width),
                    }
                }
            }
        }
    }
}

/// Rows of B per block where one group of A's rows reads it: `[8, 4096] x [4096, 11008]`
/// f32 took 6.4 ms with 16, 7.3 with 8, 8.4 with 32 (two threads, AMD EPYC Zen 5), and
/// B streamed into C 18.3.
const K_BLOCK: usize = 16;
/// Rows of B per block where several groups of A's rows share it (48 KiB of a panel of
/// three 16-float vectors): `[32, 4096] x [4096, 11008]` took 10.9 ms, 12.1 with blocks of
/// 64, 14.1 of 16, and 16.2 through the packed GEMM.
const K_BLOCK_SHARED: usize = 256;

/// One register tile of [`rows_panels`]: rows `r0..` of A against rows `ks` of a panel of B
/// (its first column's address and B's row stride).
struct Tile<'a, E> {
    rows: &'a [f32],
    k: usize,
    r0: usize,
    ks: std::ops::Range<usize>,
    panel: (*const E, usize),
}

impl<E: Load> Tile<'_, E> {
    /// Adds the tile's products to `c` (`N` rows, `width` apart, `P` vectors each; set
    /// rather than added on the first block of K).
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; rows `r0..r0 + N` of A exist; the panel holds `P`
    /// vectors of columns in rows `ks`; `c` holds `(N - 1)·width + P·LANES` floats.
    #[inline(always)]
    unsafe fn run<V: Vector, const N: usize, const P: usize>(&self, c: &mut [f32], width: usize) {
        let (panel, rs) = self.panel;
        let lanes = V::LANES;
        assert!(c.len() >= (N - 1) * width + P * lanes);
        assert!((self.r0 + N) * self.k <= self.rows.len() && self.ks.end <= self.k);
        // SAFETY: the caller's contract; A's rows are checked above.
        unsafe {
            let mut acc = [[V::splat(0.0); P]; N];
            if self.ks.start > 0 {
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    for (h, slot) in acc_i.iter_mut().enumerate() {
                        *slot = V::load(c.as_ptr().add(i * width + h * lanes));
                    }
                }
            }
            let a = self.rows.as_ptr().add(self.r0 * self.k);
            for kk in self.ks.clone() {
                let row = panel.wrapping_add(kk * rs);
                let mut bv = [V::splat(0.0); P];
                for (h, slot) in bv.iter_mut().enumerate() {
                    *slot = E::load::<V>(row.add(h * lanes));
                }
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let av = V::splat(*a.add(i * self.k + kk));
                    for (slot, &b) in acc_i.iter_mut().zip(&bv) {
                        *slot = V::fmadd(av, b, *slot);
                    }
                }
            }
            for (i, acc_i) in acc.iter().enumerate() {
                for (h, v) in acc_i.iter().enumerate() {
                    v.store(c.as_mut_ptr().add(i * width + h * lanes));
                }
            }
        }
    }
}

/// The row-streaming pass over columns `q0..q1` of C (`out`'s rows are `width` long and
/// start at column `j0`; this piece at `p0` in them).
///
/// # Safety
/// The CPU has `V`'s instruction set; B's rows hold columns `q0..q1` for every `kk < k`.
#[inline(always)]
unsafe fn rows_piece<V: Vector, E: Load>(
    rows: &[f32],
    (m, k): (usize, usize),
    (base, rs): (*const E, usize),
    (q0, q1): (usize, usize),
    out: &mut [f32],
    (width, p0): (usize, usize),
) {
    let len = q1 - q0;
    let vectors = len / V::LANES;
    for kk in 0..k {
        let row = base.wrapping_add(kk * rs + q0);
        for i in 0..m {
            let ai = rows[i * k + kk];
            let c = &mut out[i * width + p0..i * width + p0 + len];
            // SAFETY: lanes v·LANES.. < len of this row of B are inside it (the caller's
            // bounds) and of `c` (v < len / LANES).
            unsafe {
                let av = V::splat(ai);
                for v in 0..vectors {
                    let at = c.as_mut_ptr().add(v * V::LANES);
                    V::fmadd(av, E::load::<V>(row.add(v * V::LANES)), V::load(at)).store(at);
                }
            }
            for (j, x) in c.iter_mut().enumerate().skip(vectors * V::LANES) {
                // SAFETY: column q0 + j < q1 of this row (the caller's bounds).
                *x = ai.mul_add(unsafe { *row.add(j) }.to_f32(), *x);
            }
        }
    }
}
