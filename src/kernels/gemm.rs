//! CPU GEMM: cache-blocked and packed, with SIMD micro-kernels for AVX-512 and AVX2+FMA and
//! a portable fallback, chosen from [`crate::runtime::cpu::get_cpu_capability`], on the library's
//! threads. fp16/bf16 inputs are widened to f32 while packing, and every product is
//! accumulated in f32, in a fixed order: results are bit-identical run to run and do not
//! depend on the thread count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};

use crate::DType;
use crate::core::tensor::Element;
use crate::runtime::cpu::CpuCapability;

/// How inputs are rounded while packing (the reduced-precision matmul modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// Exact (IEEE fp32 math).
    None,
    /// To TF32's 10-bit mantissa.
    Tf32,
    /// To bf16's 7-bit mantissa.
    Bf16,
}

impl Rounding {
    /// `x` rounded to the kept mantissa: bf16 to nearest even (as PyTorch's and the CPU's
    /// conversions, and the bf16 dot-product kernel's packing, round), TF32 to nearest with
    /// ties away from zero (as `cvt.rna.tf32.f32`).
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Rounding::None => x,
            Rounding::Bf16 => half::bf16::from_f32(x).to_f32(),
            Rounding::Tf32 if x.is_finite() => {
                const DROP: u32 = 13;
                f32::from_bits((x.to_bits() + (1 << (DROP - 1))) & !((1u32 << DROP) - 1))
            }
            Rounding::Tf32 => x,
        }
    }
}

/// A matrix view: element `(r, c)` is `data[offset + r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatView<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<T: Element> MatView<'_, T> {
    #[inline]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.offset + r * self.rs + c * self.cs].to_f32()
    }
}

type MicroFn = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// A micro-kernel: computes an `mr x nr` block of C from packed panels, storing it (the
/// first K block) or adding it to what C holds (later K blocks). It runs over packed
/// steps: one K index each, or with `pairs` two K indices as bf16 values in one 32-bit slot.
#[derive(Clone, Copy)]
pub(crate) struct Micro {
    pub name: &'static str,
    mr: usize,
    nr: usize,
    pairs: bool,
    run: MicroFn,
}

impl Micro {
    /// Packed steps for `kc` K indices.
    fn steps(&self, kc: usize) -> usize {
        if self.pairs { kc.div_ceil(2) } else { kc }
    }
}

/// The micro-kernel for a product whose inputs are bf16 values (bf16 data, or f32 rounded
/// to bf16): AVX512-BF16 dot products where AVX-512 is in force and the CPU runs them
/// faster than f32 FMAs (see [`crate::runtime::cpu::bf16_dot_speedup`]: on Intel cores without AMX
/// the values widened to f32 measured 1.55x faster at n = 2048), else [`micro`].
pub(crate) fn micro_for_bf16() -> Micro {
    #[cfg(target_arch = "x86_64")]
    if crate::runtime::cpu::get_cpu_capability() == CpuCapability::Avx512
        && crate::runtime::cpu::bf16_dot_speedup().is_some_and(|speedup| speedup > 1.5)
    {
        return x86::AVX512_BF16;
    }
    micro()
}

/// The micro-kernel for the CPU capability in force.
pub(crate) fn micro() -> Micro {
    match crate::runtime::cpu::get_cpu_capability() {
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx512 => x86::AVX512,
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx2 => x86::AVX2,
        _ => PORTABLE,
    }
}

/// The most rows a micro-kernel tile has.
const MAX_MR: usize = 8;

/// Packed steps per K block (a 6 x 512 A panel, 12 KiB, stays in L1, a 512 x 64 B panel,
/// 128 KiB, in L2): 512 K indices, or 1024 for a pair kernel, whose steps hold two. (384
/// measured 2-5% slower at n = 2048..4096, 128-320 slower still.)
const KC_STEPS: usize = 512;
/// Columns of B per packed block.
const NC: usize = 2048;

/// A panels per row block, at most: the block fills a quarter of the core's L2, so that
/// every B panel, streamed from L3 once per row block, serves many A panels (with 8-panel
/// blocks each B block was read from L3 ~40 times at n = 2048; a 56-panel block on a 2 MiB
/// L2 measured +3-6% at n = 1024..4096). Never under 8 panels, so that small L2s still
/// share B.
fn panels_per_block(mr: usize) -> usize {
    let panel_bytes = mr * KC_STEPS * std::mem::size_of::<f32>();
    (crate::runtime::cpu::l2_cache_bytes() / 4 / panel_bytes).max(8)
}

/// f32 values per 64-byte cache line.
const LINE_FLOATS: usize = 16;

/// Multiply-adds a thread is started for, at least.
const MIN_WORK_PER_THREAD: usize = 1 << 21;

/// `A (m x k) · B (k x n)` into `c`, a row-major `m x n` f32 matrix.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Element>(
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    a: MatView<T>,
    b: MatView<T>,
    rounding: Rounding,
    threads: usize,
) {
    assert_eq!(c.len(), m * n, "the output holds m x n floats");
    if m == 0 || n == 0 || k == 0 {
        c.fill(0.0);
        return;
    }
    let mk = if T::DTYPE == DType::Bf16 || rounding == Rounding::Bf16 {
        micro_for_bf16()
    } else {
        micro()
    };
    gemm_with(mk, c, (m, n, k), a, b, rounding, threads);
}

/// [`gemm`] with the micro-kernel `mk` (non-empty sizes).
fn gemm_with<T: Element>(
    mk: Micro,
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    rounding: Rounding,
    threads: usize,
) {
    // A thread costs tens of microseconds to start: each gets a few MFLOP at least.
    let threads = threads.clamp(
        1,
        m.saturating_mul(n)
            .saturating_mul(k)
            .div_ceil(MIN_WORK_PER_THREAD),
    );
    let (mr, nr, pairs) = (mk.mr, mk.nr, mk.pairs);
    let a_panels = m.div_ceil(mr);
    // Row blocks of A panels: a multiple of the thread count, so that threads end together.
    let row_blocks = a_panels
        .div_ceil(panels_per_block(mr))
        .next_multiple_of(threads)
        .min(a_panels);
    // Column chunks split the work when there are fewer row blocks than threads.
    let col_chunks = threads.div_ceil(row_blocks);
    let items = row_blocks * col_chunks;
    let kc_max = if mk.pairs { 2 * KC_STEPS } else { KC_STEPS };
    let steps = mk.steps(kc_max.min(k));
    // The calling thread's packed-B buffer, kept between calls: allocating and zeroing it
    // per call costs small products a tenth of their time.
    let mut packed_b = PACKED_B.take();
    let b_len = NC.min(n).div_ceil(nr) * nr * steps;
    // Room to start the panels on a cache line: a vector load that straddles two lines
    // costs two.
    if packed_b.len() < b_len + LINE_FLOATS {
        packed_b = vec![0f32; b_len + LINE_FLOATS];
    }
    let b_start = packed_b.as_ptr().align_offset(64).min(LINE_FLOATS);
    // The (column block, K block) pairs, in order; each has its own item counter.
    let blocks: Vec<(usize, usize)> = (0..n)
        .step_by(NC)
        .flat_map(|jc| (0..k).step_by(kc_max).map(move |pc| (jc, pc)))
        .collect();
    let counters: Vec<AtomicUsize> = blocks.iter().map(|_| AtomicUsize::new(0)).collect();
    // Sized by the team the pool gives, which can be smaller than `threads`.
    let barrier = OnceLock::new();
    let (b_ptr, c_ptr, c_len) = (
        SharedOut(packed_b[b_start..].as_mut_ptr()),
        SharedOut(c.as_mut_ptr()),
        c.len(),
    );
    // One scope for the whole product: per block, the threads pack B's panels together,
    // meet, then take items (packing each item's own A panels), and meet again before the
    // next block overwrites the packed B.
    let worker = |t: usize, team: usize| {
        let barrier = barrier.get_or_init(|| Barrier::new(team));
        // Every element is stored by the first K block. Builds with debug assertions (the
        // tests') poison C first, so that NaN shows any element that is not; release builds
        // skip that pass over C (3-6% of a product at n = 512..4096).
        if cfg!(debug_assertions) {
            let share = c_len.div_ceil(team);
            let (lo, hi) = ((t * share).min(c_len), ((t + 1) * share).min(c_len));
            // SAFETY: the shares are disjoint and inside C; no tile is written before the
            // first barrier, which every thread reaches after its share.
            unsafe { std::slice::from_raw_parts_mut(c_ptr.get().add(lo), hi - lo) }.fill(f32::NAN);
        }
        let mut a_block = A_BLOCK.take();
        a_block.resize(
            a_block
                .len()
                .max(a_panels.div_ceil(row_blocks) * mr * steps),
            0.0,
        );
        for (&(jc, pc), next) in blocks.iter().zip(&counters) {
            let (nc, kc) = (NC.min(n - jc), kc_max.min(k - pc));
            let (b_panels, ks) = (nc.div_ceil(nr), mk.steps(kc));
            let per = b_panels.div_ceil(team);
            let mine = (t * per).min(b_panels)..((t + 1) * per).min(b_panels);
            // SAFETY: threads pack disjoint panel ranges of the packed B, which nobody reads
            // before the barrier below.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    b_ptr.get().add(mine.start * nr * ks),
                    mine.len() * nr * ks,
                )
            };
            pack_b(
                b,
                mine.start,
                out,
                nr,
                (pc, kc, jc, jc + nc),
                rounding,
                pairs,
            );
            barrier.wait();
            // SAFETY: between the two barriers the packed B is only read.
            let b_buf = unsafe { std::slice::from_raw_parts(b_ptr.get(), b_panels * nr * ks) };
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= items {
                    break;
                }
                let (ib, jb) = (item / col_chunks, item % col_chunks);
                let a_range = ib * a_panels / row_blocks..(ib + 1) * a_panels / row_blocks;
                let b_range = jb * b_panels / col_chunks..(jb + 1) * b_panels / col_chunks;
                let a_buf = &mut a_block[..a_range.len() * mr * ks];
                pack_a(a, a_range.start, a_buf, mr, (pc, kc, m), rounding, pairs);
                for jp in b_range {
                    let b_panel = &b_buf[jp * nr * ks..(jp + 1) * nr * ks];
                    let col0 = jc + jp * nr;
                    for (a_panel, ip) in a_buf.chunks_exact(mr * ks).zip(a_range.clone()) {
                        let row0 = ip * mr;
                        // SAFETY: every item is taken by one thread and items cover disjoint
                        // tiles; the tile lies inside the m x n output (rows and cols are
                        // clipped).
                        unsafe {
                            tile(
                                mk,
                                ks,
                                a_panel,
                                b_panel,
                                c_ptr.get().add(row0 * n + col0),
                                n,
                                mr.min(m - row0),
                                nr.min(n - col0),
                                pc > 0,
                            )
                        };
                    }
                }
            }
            barrier.wait();
        }
        A_BLOCK.set(a_block);
    };
    crate::runtime::threads::parallel(threads, &worker);
    PACKED_B.set(packed_b);
}

thread_local! {
    /// The packed B of the last product this thread ran (see [`gemm`]).
    static PACKED_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The packed A block of this thread's last product (the pool's workers keep theirs).
    static A_BLOCK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The output pointer, shared by threads that write disjoint tiles.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

impl SharedOut {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: threads write disjoint tiles of the buffer behind the pointer (see `gemm`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// Stores (or with `accumulate`, adds) one `rows x cols` tile (at most `mr x nr`) into C at
/// `c` (row stride `ldc`), over `steps` packed steps.
///
/// # Safety
/// `c` must point at `rows` rows of `cols` writable floats, `ldc` apart, that no other
/// thread touches; the panels must hold `steps` steps of `mr` and `nr` values.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    mk: Micro,
    steps: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    debug_assert!(a.len() >= steps * mk.mr && b.len() >= steps * mk.nr);
    if rows == mk.mr && cols == mk.nr {
        // SAFETY: the panels are long enough (asserted) and C holds a full tile (caller).
        unsafe { (mk.run)(steps, a.as_ptr(), b.as_ptr(), c, ldc, accumulate) };
        return;
    }
    let mut scratch = [0f32; 1024];
    assert!(
        mk.mr * mk.nr <= scratch.len(),
        "the scratch tile holds every micro-kernel's tile"
    );
    // SAFETY: the scratch tile holds mr x nr floats (asserted) with row stride nr.
    unsafe {
        (mk.run)(
            steps,
            a.as_ptr(),
            b.as_ptr(),
            scratch.as_mut_ptr(),
            mk.nr,
            false,
        )
    };
    for r in 0..rows {
        for col in 0..cols {
            let v = scratch[r * mk.nr + col];
            // SAFETY: r < rows and col < cols stay inside the caller's tile.
            unsafe {
                *c.add(r * ldc + col) = if accumulate {
                    *c.add(r * ldc + col) + v
                } else {
                    v
                }
            };
        }
    }
}

/// Two values rounded to bf16 in one 32-bit word, `lo` in the lower half.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> f32 {
    let bits = |x: f32| u32::from(half::bf16::from_f32(x).to_bits());
    f32::from_bits(bits(lo) | bits(hi) << 16)
}

/// `x` as bf16 bits: the bits themselves for bf16 data (no round trip through f32), else
/// `x` rounded to bf16.
#[inline(always)]
fn bf16_bits<T: Element>(x: T) -> u32 {
    if T::DTYPE == DType::Bf16 {
        u32::from(bytemuck::cast_slice::<T, u16>(std::slice::from_ref(&x))[0])
    } else {
        u32::from(half::bf16::from_f32(x.to_f32()).to_bits())
    }
}

/// As [`pair`], from elements (`hi` absent past the last K index).
#[inline(always)]
fn pair_of<T: Element>(lo: T, hi: Option<T>) -> f32 {
    f32::from_bits(bf16_bits(lo) | hi.map_or(0, bf16_bits) << 16)
}

/// One packed slot: a value, or with `pairs` the bf16 values of K indices `k` and `k + 1`
/// (zero past `k_end`) in one 32-bit word.
#[inline(always)]
fn slot(
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
fn pack_a<T: Element>(
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
fn interleave<T: Element, const MR: usize>(rows: [&[T]; MR], panel: &mut [f32]) {
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
fn pack_b<T: Element>(
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

/// The portable micro-kernel and its tile.
const PORTABLE: Micro = Micro {
    name: "portable",
    mr: 4,
    nr: 8,
    pairs: false,
    run: micro_portable,
};

/// # Safety
/// `a` holds `kc * 4` floats, `b` `kc * 8`, and `c` 4 rows of 8 writable floats `ldc` apart
/// (readable too with `accumulate`).
unsafe fn micro_portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the lengths above.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * 4),
            std::slice::from_raw_parts(b, kc * 8),
        )
    };
    let mut acc = [[0f32; 8]; 4];
    for step in 0..kc {
        let bs = &b[step * 8..step * 8 + 8];
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = a[step * 4 + i];
            for (x, &bv) in row.iter_mut().zip(bs) {
                *x = crate::runtime::cpu::mul_add::<{ crate::runtime::cpu::BASELINE_FMA }>(
                    ai, bv, *x,
                );
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: i < 4 and j < 8 stay inside the caller's tile.
            unsafe {
                *c.add(i * ldc + j) = if accumulate {
                    *c.add(i * ldc + j) + v
                } else {
                    v
                }
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Micro;

    /// The AVX-512 micro-kernel and its tile.
    pub(super) const AVX512: Micro = Micro {
        name: "avx512",
        mr: 6,
        nr: 64,
        pairs: false,
        run: micro_avx512::<6, 4>,
    };

    /// The AVX512-BF16 micro-kernel: the AVX-512 tile over bf16 pairs (`vdpbf16ps`).
    pub(super) const AVX512_BF16: Micro = Micro {
        name: "avx512_bf16",
        mr: 6,
        nr: 64,
        pairs: true,
        run: micro_avx512_bf16::<6, 4>,
    };

    /// As [`micro_avx512`], but each step holds two K indices as bf16 pairs: one
    /// `vdpbf16ps` per accumulator adds both products in f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16; `a` holds `steps * MR` pairs, `b`
    /// `steps * 16 * NV`, and `c` MR rows of `16 * NV` writable floats `ldc` apart.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn micro_avx512_bf16<const MR: usize, const NV: usize>(
        steps: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: C holds the tile (caller).
        unsafe { prefetch_tile(c, ldc, MR, 16 * NV) };
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for step in 0..steps {
            // SAFETY: step < steps, so the reads stay inside the panels (caller); prefetches
            // past the panel's end do not fault. A pair of bf16 values and an f32 are both
            // 32 bits: the casts reinterpret lanes.
            unsafe {
                prefetch_b::<NV>(b, step);
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, slot) in bv.iter_mut().enumerate() {
                    *slot = _mm512_loadu_ps(b.add((step * NV + v) * 16));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai: __m512bh = std::mem::transmute(_mm512_set1_ps(*a.add(step * MR + i)));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, ai, std::mem::transmute::<__m512, __m512bh>(bx));
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// Steps ahead of the one being computed whose B lines the micro-kernels prefetch: the
    /// 64-wide B panel (96 KiB at 384 steps) outgrows L1 and streams from L2, where the
    /// loads stalled the FMAs (measured +10-19% on an Intel Xeon at n = 1024..4096).
    const PREFETCH_STEPS: usize = 6;

    /// Prefetches the `NV` B vectors of step `step + PREFETCH_STEPS` into L1.
    ///
    /// # Safety
    /// None: the address is only computed (wrapping) and prefetched, never read.
    #[inline(always)]
    unsafe fn prefetch_b<const NV: usize>(b: *const f32, step: usize) {
        for v in 0..NV {
            let ahead = b.wrapping_add(((step + PREFETCH_STEPS) * NV + v) * 16);
            // SAFETY: a prefetch does not fault, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.cast()) };
        }
    }

    /// Asks for the C tile's cache lines ahead of the K loop, so that storing (or adding to)
    /// it at the end does not wait on memory.
    ///
    /// # Safety
    /// None beyond the micro-kernels': prefetches do not fault, the addresses are C's.
    #[inline(always)]
    unsafe fn prefetch_tile(c: *const f32, ldc: usize, rows: usize, cols: usize) {
        for i in 0..rows {
            for col in (0..cols).step_by(16) {
                // SAFETY: a prefetch of an address inside the caller's tile.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + col).cast()) };
            }
        }
    }

    /// Stores (or adds) the accumulators into C.
    ///
    /// # Safety
    /// As the micro-kernels: `c` has MR rows of `16 * NV` writable floats `ldc` apart.
    #[inline(always)]
    unsafe fn store<const MR: usize, const NV: usize>(
        acc: &[[__m512; NV]; MR],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: row i of the tile has 16 * NV writable floats (caller).
                unsafe {
                    let cv = c.add(i * ldc + v * 16);
                    let out = if accumulate {
                        _mm512_add_ps(_mm512_loadu_ps(cv), x)
                    } else {
                        x
                    };
                    _mm512_storeu_ps(cv, out);
                }
            }
        }
    }

    /// An `MR x (16 * NV)` tile: `MR * NV` zmm accumulators; per step, NV vectors of B and
    /// one broadcast of A per row.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `a` holds `kc * MR` floats, `b` `kc * 16 * NV`, and `c` MR rows
    /// of `16 * NV` writable floats `ldc` apart.
    #[target_feature(enable = "avx512f")]
    unsafe fn micro_avx512<const MR: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: C holds the tile (caller).
        unsafe { prefetch_tile(c, ldc, MR, 16 * NV) };
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for step in 0..kc {
            // SAFETY: step < kc, so the reads stay inside the panels (caller); prefetches
            // past the panel's end do not fault.
            unsafe {
                prefetch_b::<NV>(b, step);
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, slot) in bv.iter_mut().enumerate() {
                    *slot = _mm512_loadu_ps(b.add((step * NV + v) * 16));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*a.add(step * MR + i));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(ai, bx, *x);
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// The AVX2 micro-kernel and its tile.
    pub(super) const AVX2: Micro = Micro {
        name: "avx2",
        mr: 6,
        nr: 16,
        pairs: false,
        run: micro_avx2,
    };

    /// 6 x 16 tile: 12 ymm accumulators, two B vectors and one A broadcast per step.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `a` holds `kc * 6` floats, `b` `kc * 16`, and `c` 6 rows
    /// of 16 writable floats `ldc` apart.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_avx2(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: C holds the tile (caller).
        unsafe { prefetch_tile(c, ldc, 6, 16) };
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        for step in 0..kc {
            // SAFETY: step < kc, so the reads stay inside the panels (caller).
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(step * 16));
                let b1 = _mm256_loadu_ps(b.add(step * 16 + 8));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm256_set1_ps(*a.add(step * 6 + i));
                    row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: row i of the tile has 16 writable floats (caller).
            unsafe {
                let cr = c.add(i * ldc);
                let (mut v0, mut v1) = (row[0], row[1]);
                if accumulate {
                    v0 = _mm256_add_ps(_mm256_loadu_ps(cr), v0);
                    v1 = _mm256_add_ps(_mm256_loadu_ps(cr.add(8)), v1);
                }
                _mm256_storeu_ps(cr, v0);
                _mm256_storeu_ps(cr.add(8), v1);
            }
        }
    }
}

/// `A · B` in f64 (the reference path) into `c`, a zeroed row-major `m x n` matrix.
pub(crate) fn gemm_f64(
    c: &mut [f64],
    m: usize,
    n: usize,
    k: usize,
    a: MatView<f64>,
    b: MatView<f64>,
    threads: usize,
) {
    if n == 0 {
        return;
    }
    let rows_per = m.div_ceil(threads.max(1)).max(1);
    let chunks = c.chunks_mut(rows_per * n).enumerate().collect();
    crate::runtime::threads::for_each(chunks, &|(t, chunk): (usize, &mut [f64])| {
        for (r, row) in chunk.chunks_mut(n).enumerate() {
            let i = t * rows_per + r;
            for p in 0..k {
                let x = a.data[a.offset + i * a.rs + p * a.cs];
                for (j, out) in row.iter_mut().enumerate() {
                    *out += x * b.data[b.offset + p * b.rs + j * b.cs];
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_keeps_the_declared_mantissa() {
        let x = 1.0 + f32::EPSILON * 3.0;
        assert_eq!(Rounding::None.apply(x), x);
        assert_eq!(Rounding::Tf32.apply(x), 1.0);
        assert_eq!(
            Rounding::Bf16.apply(1.0 + 1.0 / 256.0 + 1.0 / 1024.0),
            1.0 + 1.0 / 128.0
        );
        // Ties: bf16 to even, TF32 away from zero.
        assert_eq!(Rounding::Bf16.apply(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(Rounding::Bf16.apply(-1.0 - 3.0 / 256.0), -1.0 - 4.0 / 256.0);
        assert_eq!(Rounding::Tf32.apply(1.0 + 1.0 / 2048.0), 1.0 + 1.0 / 1024.0);
        assert_eq!(Rounding::Bf16.apply(f32::INFINITY), f32::INFINITY);
        assert!(Rounding::Tf32.apply(f32::NAN).is_nan());
    }

    /// Every kernel a bf16 product can take on this CPU (the AVX512-BF16 dot products even
    /// where they are not chosen), against the exact product of the inputs rounded to bf16
    /// (to nearest even, as every kernel rounds them): only f32 accumulation error, far
    /// below the 4e-3 of rounding the inputs (a tie rounded another way would show as 1e-4
    /// over a short row).
    #[test]
    fn every_bf16_kernel_matches_the_product_of_the_rounded_inputs() {
        let mut kernels = vec![PORTABLE, micro()];
        #[cfg(target_arch = "x86_64")]
        if crate::runtime::cpu::has_avx512_bf16()
            && crate::runtime::cpu::detected_cpu_capability() == CpuCapability::Avx512
        {
            kernels.push(x86::AVX512_BF16);
        }
        let mut seed = 7u64;
        let mut random = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect()
        };
        // Odd and even K (pairs padded with zero), tiles cut at every edge.
        for (m, n, k) in [(1, 1, 1), (7, 65, 7), (63, 129, 385), (13, 70, 1000)] {
            let (mut a, mut b) = (random(m * k), random(k * n));
            // Ties, which every kernel must round the same way.
            a[0] = 1.0 + 1.0 / 256.0;
            b[k * n - 1] = -1.0 - 3.0 / 256.0;
            let rounded = |x: &[f32]| -> Vec<f64> {
                x.iter()
                    .map(|&v| f64::from(Rounding::Bf16.apply(v)))
                    .collect()
            };
            let (ra, rb) = (rounded(&a), rounded(&b));
            let want: Vec<f64> = (0..m * n)
                .map(|e| (0..k).map(|p| ra[e / n * k + p] * rb[p * n + e % n]).sum())
                .collect();
            for mk in &kernels {
                let mut c = vec![f32::NAN; m * n];
                let view = |data, rs| MatView {
                    data,
                    offset: 0,
                    rs,
                    cs: 1,
                };
                gemm_with(
                    *mk,
                    &mut c,
                    (m, n, k),
                    view(&a, k),
                    view(&b, n),
                    Rounding::Bf16,
                    2,
                );
                let diff: f64 = c
                    .iter()
                    .zip(&want)
                    .map(|(&x, y)| (f64::from(x) - y).powi(2))
                    .sum();
                let norm: f64 = want.iter().map(|y| y * y).sum();
                let err = (diff / norm).sqrt();
                assert!(err < 1e-6, "{} {m}x{n}x{k}: {err}", mk.name);
            }
        }
    }

    /// With no thread able to start (at the process's thread limit) and the pool busy
    /// elsewhere, a product asking for 8 threads runs on the caller alone: no panic, no
    /// wait at a barrier for threads that never started, and the right result.
    #[test]
    fn a_product_runs_with_the_threads_it_gets() {
        let (m, n, k) = (150, 260, 300);
        let values = |len: usize, salt: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + salt) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let (a, b) = (values(m * k, 17), values(k * n, 5));
        let want: Vec<f64> = (0..m * n)
            .map(|e| {
                (0..k)
                    .map(|p| f64::from(a[e / n * k + p]) * f64::from(b[p * n + e % n]))
                    .sum()
            })
            .collect();
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            crate::runtime::threads::REFUSE_SPAWN.with(|r| r.set(true));
            let run = |c: &mut Vec<f32>| {
                let view = |data, rs| MatView {
                    data,
                    offset: 0,
                    rs,
                    cs: 1,
                };
                gemm(c, m, n, k, view(&a, k), view(&b, n), Rounding::None, 8);
            };
            let mut free = vec![f32::NAN; m * n];
            run(&mut free);
            let held = crate::runtime::threads::hold_pool();
            let mut alone = vec![f32::NAN; m * n];
            run(&mut alone);
            drop(held);
            done.send((free, alone)).unwrap();
        });
        let (free, alone) = result
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the product finished (no thread waits for one that never started)");
        for c in [free, alone] {
            let diff: f64 = c
                .iter()
                .zip(&want)
                .map(|(&x, y)| (f64::from(x) - y).powi(2))
                .sum();
            let norm: f64 = want.iter().map(|y| y * y).sum();
            assert!((diff / norm).sqrt() < 1e-5);
        }
    }
}
