//! The skinny path for bf16 data on CPUs whose AVX512-BF16 dot products the packed GEMM
//! uses too (`vdpbf16ps`: two bf16 products per f32 lane, accumulated in f32): A's rows as
//! words of two neighbouring K values, B read in place.
//!
//! A transposed B (`W.t()`) already holds neighbouring K values side by side: a 32-value
//! load of a weight row is 16 pairs, dotted with the same K range of A's rows, which are
//! packed so that the rows a pass holds lie side by side for each step (weight rows a
//! multiple of 4 KiB apart already make the loads of a step contend for the same L1 banks:
//! with A's rows apart too, a pass ran at half the rate on an AMD EPYC). A row-major B
//! holds them in two rows: one permutation interleaves 32 columns of rows `k` and `k + 1`
//! into pairs, and a tile of C (the rows of A x 32 columns) stays in registers over a block
//! of K.

use std::arch::x86_64::*;

use half::bf16;

use super::super::MatView;

/// Rows of A a dot-product pass holds in registers, at most (with [`NB`] weight rows each:
/// 24 accumulators).
const ROW_GROUP: usize = 6;
/// Weight rows a dot-product pass reads together.
const NB: usize = 4;
/// Weight rows a dot-product pass reads together for at most [`FEW_ROWS`] rows of A: more
/// independent sums and weight lines in flight (`[1, 4096] x W.t()`, W `[11008, 4096]`:
/// 1.15x the time of 4 rows on an AMD EPYC Zen 4).
const NB_FEW: usize = 8;
/// Rows of A that take [`NB_FEW`] weight rows a pass (16 accumulators).
const FEW_ROWS: usize = 2;
/// Steps ahead (32 K values each) whose weight lines a dot-product pass prefetches.
const PREFETCH_STEPS: usize = 16;
/// Pairs of B rows the row-major pass streams per tile of C before moving to the next
/// columns, for up to 8 rows of A and for more: few rows of B at a time keep B's streams few
/// (m = 1: 0.57 ms at 8 pairs, 0.98 at 64, for [1, 4096] x [4096, 4096] on an AMD EPYC);
/// more rows of A reuse C more often (m = 32: 5.9 ms at 8 pairs, 3.4 at 64).
const K_PAIRS: [usize; 2] = [8, 64];
/// Tiles ahead whose B lines the row-major pass prefetches.
const PREFETCH_TILES: usize = 8;
/// Columns of a row-major pass's tile (two vectors of 16 f32 accumulators per row of A).
const TILE: usize = 32;

/// The 32 bf16 values a 512-bit register holds, typed for `vdpbf16ps`.
#[inline(always)]
fn bf16s(x: __m512i) -> __m512bh {
    // SAFETY: both types are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// A's `m` rows of `k` values as words of two bf16 values (`k` and `k + 1`, the second
/// zero past the row's end), in the layout the pass for B's layout reads: for a B streamed
/// by rows, rows of `k.div_ceil(2)` words; for a weight read by dot products, each group of
/// rows ([`groups`]) step by step (16 words of each of its rows a step, zero past K).
pub(super) fn pair_rows<T: crate::core::tensor::Element>(
    a: MatView<T>,
    (m, k): (usize, usize),
    rows_layout: bool,
) -> Vec<u32> {
    let words = k.div_ceil(2);
    let bits = |i: usize, kk: usize| {
        super::super::pack::bf16_bits(a.data[a.offset + i * a.rs + kk * a.cs])
    };
    let word = |i: usize, w: usize| {
        let kk = 2 * w;
        bits(i, kk) | if kk + 1 < k { bits(i, kk + 1) << 16 } else { 0 }
    };
    if rows_layout {
        return (0..m * words).map(|w| word(w / words, w % words)).collect();
    }
    let steps = k.div_ceil(32);
    let mut packed = vec![0; m * 16 * steps];
    for (r0, group) in groups(m) {
        let block = &mut packed[r0 * 16 * steps..(r0 + group) * 16 * steps];
        for (chunk, slot) in block.chunks_exact_mut(16).enumerate() {
            let (step, i) = (chunk / group, chunk % group);
            for (l, x) in slot.iter_mut().enumerate() {
                let w = 16 * step + l;
                if w < words {
                    *x = word(r0 + i, w);
                }
            }
        }
    }
    packed
}

/// The groups of A's `m` rows a dot-product pass takes (first row, rows): as few as
/// [`ROW_GROUP`] allows, of sizes that differ by one at most.
fn groups(m: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = m.div_ceil(ROW_GROUP);
    let (size, larger) = (m / count.max(1), m % count.max(1));
    (0..count).map(move |g| (g * size + g.min(larger), size + usize::from(g < larger)))
}

/// Columns `j0..j1` of `A · B` into `out` (`m` rows of `j1 - j0`), from A's pair words
/// `a` ([`pair_rows`], in the layout for `rows_layout`) and a bf16 B, streamed by rows
/// (`rows_layout`, `cs = 1`) or read as the rows of a weight (`rs = 1`).
///
/// `cs = 1` with `rows_layout`, else `rs = 1` (asserted, as is every element B's loops read).
///
/// # Safety
/// The CPU has AVX-512 (F, BW) and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn columns(
    a: &[u32],
    (m, k): (usize, usize),
    (b, rows_layout): (MatView<bf16>, bool),
    (j0, j1): (usize, usize),
    out: &mut [f32],
) {
    let words = if rows_layout {
        k.div_ceil(2)
    } else {
        16 * k.div_ceil(32)
    };
    assert!(a.len() == m * words && out.len() == m * (j1 - j0));
    assert!(if rows_layout { b.cs == 1 } else { b.rs == 1 });
    // Every element of B the loops read, checked once: (k - 1, j1 - 1) is the farthest.
    assert!(b.offset + (k - 1) * b.rs + (j1 - 1) * b.cs < b.data.len());
    let base = b.data.as_ptr().wrapping_add(b.offset).cast::<u16>();
    // SAFETY: the caller's CPU; B's layout and extent are asserted above.
    unsafe {
        if rows_layout {
            by_rows(a, (m, k), (base, b.rs), (j0, j1), out)
        } else if m <= FEW_ROWS {
            by_dots::<NB_FEW>(a, (m, k), (base, b.cs), (j0, j1), out)
        } else {
            by_dots::<NB>(a, (m, k), (base, b.cs), (j0, j1), out)
        }
    }
}

/// `out[i, j - j0] = a[i, :] · w[j, :]`, `w[j, kk]` at `base + j·cs + kk` (contiguous in
/// K): `N` weight rows against a group of A's rows at a time, 32 K values a step (the
/// last one masked), the weight rows staying in L1 while the groups of A pass.
///
/// # Safety
/// As [`columns`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn by_dots<const N: usize>(
    a: &[u32],
    (m, k): (usize, usize),
    (base, cs): (*const u16, usize),
    (j0, j1): (usize, usize),
    out: &mut [f32],
) {
    let (steps, width) = (k.div_ceil(32), j1 - j0);
    let last_mask = u32::MAX >> (32 * steps - k);
    let mut j = j0;
    while j < j1 {
        let count = N.min(j1 - j);
        // Past the last weight row, the block repeats it (its sums are not stored).
        let w: [*const u16; N] =
            std::array::from_fn(|jj| base.wrapping_add((j + jj.min(count - 1)) * cs));
        for (r0, group) in groups(m) {
            let rows = a[r0 * 16 * steps..(r0 + group) * 16 * steps].as_ptr();
            let block = Dots {
                w,
                steps,
                last_mask,
                prefetch: r0 == 0,
            };
            // SAFETY: the caller's CPU; the weight rows below j1 (clamped) hold k values,
            // the group's `group · 16 · steps` words are sliced above.
            let acc = unsafe {
                match group {
                    1 => widen(block.run::<1>(rows)),
                    2 => widen(block.run::<2>(rows)),
                    3 => widen(block.run::<3>(rows)),
                    4 => widen(block.run::<4>(rows)),
                    5 => widen(block.run::<5>(rows)),
                    _ => block.run::<ROW_GROUP>(rows),
                }
            };
            for (i, acc_i) in acc.iter().enumerate().take(group) {
                for (jj, &lanes) in acc_i.iter().enumerate().take(count) {
                    out[(r0 + i) * width + (j - j0) + jj] = _mm512_reduce_add_ps(lanes);
                }
            }
        }
        j += count;
    }
}

/// A group's sums widened to [`ROW_GROUP`] rows (the rows past `G` unused).
#[inline(always)]
fn widen<const G: usize, const N: usize>(acc: [[__m512; N]; G]) -> [[__m512; N]; ROW_GROUP] {
    // SAFETY: `_mm512_setzero_ps` needs AVX-512F, which every caller (`by_dots`, compiled
    // for it) has.
    let mut wide = [[unsafe { _mm512_setzero_ps() }; N]; ROW_GROUP];
    wide[..G].copy_from_slice(&acc);
    wide
}

/// The `N` weight rows of one dot-product block: `steps` steps of 32 K values (of which
/// `last_mask` the last step's); with `prefetch`, the weight lines [`PREFETCH_STEPS`] steps
/// ahead are asked for.
struct Dots<const N: usize> {
    w: [*const u16; N],
    steps: usize,
    last_mask: __mmask32,
    prefetch: bool,
}

impl<const N: usize> Dots<N> {
    /// The 16-lane partial sums of the weight rows with `G` rows of A (pair words from
    /// `rows`, step by step as [`pair_rows`] packs a group). `G` is a constant so that the
    /// accumulators stay in registers.
    ///
    /// # Safety
    /// The CPU has AVX-512 (F, BW) and AVX512-BF16; `rows` holds `G · 16 · steps` words
    /// and every weight row the masked values of `steps` steps.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn run<const G: usize>(&self, rows: *const u32) -> [[__m512; N]; G] {
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        for step in 0..self.steps {
            let mask = if step + 1 == self.steps {
                self.last_mask
            } else {
                u32::MAX
            };
            // SAFETY: step < steps of every row (the caller); prefetches do not fault.
            unsafe {
                if self.prefetch {
                    for row in self.w {
                        let ahead = row.wrapping_add(32 * (step + PREFETCH_STEPS));
                        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                    }
                }
                // (Loops, not closures, which would not inherit the target features.)
                let mut wv = [bf16s(_mm512_setzero_si512()); N];
                for (x, row) in wv.iter_mut().zip(self.w) {
                    *x = bf16s(_mm512_maskz_loadu_epi16(mask, row.add(32 * step).cast()));
                }
                let words = rows.add(16 * G * step);
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let av = bf16s(_mm512_loadu_si512(words.add(16 * i).cast()));
                    for (slot, &x) in acc_i.iter_mut().zip(&wv) {
                        *slot = _mm512_dpbf16_ps(*slot, av, x);
                    }
                }
            }
        }
        acc
    }
}

/// `out[i, :] = a[i, :] · B[:, j0..j1]` for a row-major B (row `kk` at `base + kk·rs`):
/// tiles of [`TILE`] columns (the last one masked) whose accumulators, one register pair
/// per row of A for up to 8 rows at a time, take [`K_PAIRS`] pairs of B rows before being
/// stored; every group of rows passes over a tile's B lines while they are in L1, so that
/// B is read from memory once.
///
/// # Safety
/// As [`columns`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn by_rows(
    a: &[u32],
    (m, k): (usize, usize),
    (base, rs): (*const u16, usize),
    (j0, j1): (usize, usize),
    out: &mut [f32],
) {
    let (words, width) = (k.div_ceil(2), j1 - j0);
    // Word 2c of the low half of a tile takes column c of the first row and word 2c + 1
    // column c of the second (indices 32.. name the second operand); the high half, columns
    // 16 + c.
    let interleave = |half: i16| -> __m512i {
        let idx: [i16; 32] =
            std::array::from_fn(|w| (w as i16 / 2) + 16 * half + 32 * (w as i16 % 2));
        // SAFETY: 32 i16 are one 512-bit register.
        unsafe { std::mem::transmute(idx) }
    };
    let interleave = [interleave(0), interleave(1)];
    let k_pairs = K_PAIRS[usize::from(m > 8)];
    for p0 in (0..words).step_by(k_pairs) {
        for t0 in (0..width).step_by(TILE) {
            let cols = (u64::MAX >> (64 - TILE.min(width - t0))) as u32;
            let tile = Tile {
                b: base.wrapping_add(j0 + t0),
                rs,
                pairs: (p0, (p0 + k_pairs).min(words), k / 2),
                load_mask: cols,
                store_mask: [cols as u16, (cols >> 16) as u16],
                interleave,
            };
            for g0 in (0..m).step_by(8) {
                let rows = &a[g0 * words..];
                let c = out[g0 * width + t0..].as_mut_ptr();
                let prefetch = g0 == 0;
                // SAFETY: the caller's CPU and B; row g0 + i < m of `out` holds the tile's
                // columns t0..t0 + cols ≤ width at c + i·width.
                unsafe {
                    match (m - g0).min(8) {
                        1 => tile.run::<1>(rows, words, c, width, prefetch),
                        2 => tile.run::<2>(rows, words, c, width, prefetch),
                        3 => tile.run::<3>(rows, words, c, width, prefetch),
                        4 => tile.run::<4>(rows, words, c, width, prefetch),
                        5 => tile.run::<5>(rows, words, c, width, prefetch),
                        6 => tile.run::<6>(rows, words, c, width, prefetch),
                        7 => tile.run::<7>(rows, words, c, width, prefetch),
                        _ => tile.run::<8>(rows, words, c, width, prefetch),
                    }
                }
            }
        }
    }
}

/// One tile of a row-major pass: up to [`TILE`] columns of B from `b` (rows `rs` apart),
/// pairs `p0..p1` of its rows (row `2p + 1` zero from `pairs` on).
struct Tile {
    b: *const u16,
    rs: usize,
    pairs: (usize, usize, usize),
    load_mask: __mmask32,
    store_mask: [__mmask16; 2],
    interleave: [__m512i; 2],
}

impl Tile {
    /// Adds the tile's products with `M` rows of A (pair words `words` apart in `a`) to C at
    /// `c` (rows `ldc` apart), storing them where the tile starts K (`p0 = 0`); with
    /// `prefetch`, asks for the B lines [`PREFETCH_TILES`] tiles ahead.
    ///
    /// # Safety
    /// The CPU has AVX-512 (F, BW) and AVX512-BF16; the tile's B rows and masked columns are
    /// readable, `a` holds `M` rows of `p1` words at least, and `c` the masked columns of `M`
    /// rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn run<const M: usize>(
        &self,
        a: &[u32],
        words: usize,
        c: *mut f32,
        ldc: usize,
        prefetch: bool,
    ) {
        let (p0, p1, pairs) = self.pairs;
        // (A loop, not a closure, which would not inherit the target features.)
        let mut rows: [&[u32]; M] = [&[]; M];
        for (i, row) in rows.iter_mut().enumerate() {
            *row = &a[i * words..i * words + p1];
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        if p0 > 0 {
            for (i, acc_i) in acc.iter_mut().enumerate() {
                for (h, x) in acc_i.iter_mut().enumerate() {
                    // SAFETY: the masked lanes lie in row i of C (the caller).
                    *x = unsafe {
                        _mm512_maskz_loadu_ps(self.store_mask[h], c.add(i * ldc + 16 * h))
                    };
                }
            }
        }
        for p in p0..p1 {
            // SAFETY: rows 2p and 2p + 1 (the second read only below `pairs`) and the masked
            // columns are B's (the caller); p < p1 words of every row of A (sliced above).
            unsafe {
                if prefetch {
                    for row in [2 * p, 2 * p + 1] {
                        let ahead = self.b.wrapping_add(row * self.rs + PREFETCH_TILES * TILE);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                    }
                }
                let first =
                    _mm512_maskz_loadu_epi16(self.load_mask, self.b.add(2 * p * self.rs).cast());
                let second = if p < pairs {
                    _mm512_maskz_loadu_epi16(
                        self.load_mask,
                        self.b.add((2 * p + 1) * self.rs).cast(),
                    )
                } else {
                    _mm512_setzero_si512()
                };
                let [low, high] = self.interleave;
                let b: [__m512bh; 2] = [
                    bf16s(_mm512_permutex2var_epi16(first, low, second)),
                    bf16s(_mm512_permutex2var_epi16(first, high, second)),
                ];
                for (acc_i, row) in acc.iter_mut().zip(rows) {
                    let word = bf16s(_mm512_set1_epi32(row[p] as i32));
                    for (x, &bh) in acc_i.iter_mut().zip(&b) {
                        *x = _mm512_dpbf16_ps(*x, word, bh);
                    }
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (h, &x) in acc_i.iter().enumerate() {
                // SAFETY: as the loads above.
                unsafe { _mm512_mask_storeu_ps(c.add(i * ldc + 16 * h), self.store_mask[h], x) };
            }
        }
    }
}
