//! The GEMM driver: blocks a product for the caches (K blocks, column blocks, row blocks of
//! A panels), packs B per block together and A per item, and runs the micro-kernel over
//! the tiles, on the library's threads with a fixed reduction order; for bf16/f16 outputs
//! each item keeps its tiles' f32 sums over every K block and rounds them once; a B given
//! as rows of one buffer is packed by each item for itself, or read in place.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};

use super::pack::{pack_a, pack_b};
use super::{BOperand, MatView, Micro, Rounding};
use crate::DType;
use crate::core::tensor::Element;
use crate::kernels::convert::narrow_into;

/// Packed steps per K block (a 6 x 512 A panel, 12 KiB, stays in L1, a 512 x 64 B panel,
/// 128 KiB, in L2): 512 K indices, or 1024 for a pair kernel, whose steps hold two. (384
/// measured 2-5% slower at n = 2048..4096, 128-320 slower still.)
pub(super) const KC_STEPS: usize = 512;
/// Columns of B per packed block.
pub(super) const NC: usize = 2048;

/// A panels per row block, at most: the block fills a quarter of the core's L2, so that
/// every B panel, streamed from L3 once per row block, serves many A panels (with 8-panel
/// blocks each B block was read from L3 ~40 times at n = 2048; a 56-panel block on a 2 MiB
/// L2 measured +3-6% at n = 1024..4096). Never under 8 panels, so that small L2s still
/// share B.
pub(super) fn panels_per_block(mr: usize) -> usize {
    let panel_bytes = mr * KC_STEPS * std::mem::size_of::<f32>();
    (crate::runtime::cpu::l2_cache_bytes() / 4 / panel_bytes).max(8)
}

/// f32 values per 64-byte cache line.
pub(super) const LINE_FLOATS: usize = 16;

/// Multiply-adds a thread is started for, at least.
pub(super) const MIN_WORK_PER_THREAD: usize = 1 << 21;

/// How a product's work is shared: the thread count asked for, and items of row blocks
/// of A panels x column chunks of each column block.
struct Shares {
    threads: usize,
    a_panels: usize,
    row_blocks: usize,
    col_chunks: usize,
}

impl Shares {
    fn new(mk: Micro, (m, n, k): (usize, usize, usize), threads: usize) -> Shares {
        let threads = Self::threads((m, n, k), threads);
        let a_panels = m.div_ceil(mk.mr);
        // Row blocks of A panels: a multiple of the thread count, so that threads end
        // together.
        let row_blocks = a_panels
            .div_ceil(panels_per_block(mk.mr))
            .next_multiple_of(threads)
            .min(a_panels);
        Shares {
            threads,
            a_panels,
            row_blocks,
            // Column chunks split the work when there are fewer row blocks than threads.
            col_chunks: threads.div_ceil(row_blocks),
        }
    }

    /// Shares of a product whose items share no packed B ([`gemm_rows`]): every row
    /// block (sized for L2 alone) is cut into one column chunk per thread, which balances
    /// the threads however many row blocks there are.
    fn unshared(mk: Micro, (m, n, k): (usize, usize, usize), threads: usize) -> Shares {
        let threads = Self::threads((m, n, k), threads);
        let a_panels = m.div_ceil(mk.mr);
        Shares {
            threads,
            a_panels,
            row_blocks: a_panels.div_ceil(panels_per_block(mk.mr)),
            col_chunks: threads,
        }
    }

    /// The threads a product is worth: a thread costs tens of microseconds to start, so
    /// each gets a few MFLOP at least.
    fn threads((m, n, k): (usize, usize, usize), threads: usize) -> usize {
        threads.clamp(
            1,
            m.saturating_mul(n)
                .saturating_mul(k)
                .div_ceil(MIN_WORK_PER_THREAD),
        )
    }

    fn items(&self) -> usize {
        self.row_blocks * self.col_chunks
    }

    /// Item `item`'s A panels and B panels (of `b_panels` in its column block).
    fn ranges(&self, item: usize, b_panels: usize) -> (Range<usize>, Range<usize>) {
        let (ib, jb) = (item / self.col_chunks, item % self.col_chunks);
        (
            ib * self.a_panels / self.row_blocks..(ib + 1) * self.a_panels / self.row_blocks,
            jb * b_panels / self.col_chunks..(jb + 1) * b_panels / self.col_chunks,
        )
    }
}

/// [`gemm`] with the micro-kernel `mk` (non-empty sizes).
pub(super) fn gemm_with<T: Element>(
    mk: Micro,
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    rounding: Rounding,
    threads: usize,
) {
    let b = BOperand::View(b);
    let shares = Shares::new(mk, (m, n, k), threads);
    let (threads, a_panels, row_blocks, items) = (
        shares.threads,
        shares.a_panels,
        shares.row_blocks,
        shares.items(),
    );
    let (mr, nr, pairs) = (mk.mr, mk.nr, mk.pairs);
    let kc_max = mk.kc_max();
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
                let (a_range, b_range) = shares.ranges(item, b_panels);
                let a_buf = &mut a_block[..a_range.len() * mr * ks];
                pack_a(a, a_range.start, a_buf, mr, (pc, kc, m), rounding, pairs);
                for jp in b_range {
                    let b_panel = BPanel::Packed(&b_buf[jp * nr * ks..(jp + 1) * nr * ks]);
                    let col0 = jc + jp * nr;
                    let c = c_ptr.get().wrapping_add(a_range.start * mr * n + col0);
                    // SAFETY: every item is taken by one thread and items cover disjoint
                    // tiles; the tiles lie inside the m x n output (rows and cols are
                    // clipped).
                    unsafe {
                        tile_column(
                            mk,
                            ks,
                            (a_buf, a_range.start),
                            b_panel,
                            c,
                            n,
                            (m, n - col0),
                            pc > 0,
                        )
                    };
                }
            }
            barrier.wait();
        }
        A_BLOCK.set(a_block);
    };
    crate::runtime::threads::parallel(threads, &worker);
    PACKED_B.set(packed_b);
}

/// [`gemm_with`] for a B given as rows of one buffer, element `(k, j)` at
/// `data[starts[k] + j]` (a convolution's shifted input rows), with no B shared between
/// threads, so that they never wait on each other: each item takes its tiles through every
/// K block, packing its A panels and then one B panel after another for itself, or, for f32
/// values the kernel's `run_rows` takes exactly, reading B's panels in place (all but a last
/// one whose rows would run past the end of `data`). Packing the shifted rows was a sixth of
/// a 3 x 3 convolution's time, and the barriers around shared packing another tenth.
pub(super) fn gemm_rows<T: Element>(
    mk: Micro,
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    (data, starts): (&[T], &[usize]),
    rounding: Rounding,
    threads: usize,
) {
    let shares = Shares::unshared(mk, (m, n, k), threads);
    let (mr, nr, pairs, kc_max) = (mk.mr, mk.nr, mk.pairs, mk.kc_max());
    let b_panels = n.div_ceil(nr);
    let in_place =
        mk.run_rows.is_some() && T::DTYPE == DType::F32 && rounding == Rounding::None && !pairs;
    // Every row has this many values from its start on: a panel from column `col0` is read
    // in place where `col0 + nr` is at most that.
    let readable = data.len() - starts.iter().max().copied().unwrap_or(0);
    // Builds with debug assertions (the tests') poison C, so that NaN shows an element the
    // first K block does not store.
    if cfg!(debug_assertions) {
        c.fill(f32::NAN);
    }
    let next = AtomicUsize::new(0);
    let c_ptr = SharedOut(c.as_mut_ptr());
    let worker = |_: usize, _: usize| {
        // This item's A panels of a K block, then room for one packed B panel.
        let mut buffer = A_BLOCK.take();
        let steps = mk.steps(kc_max.min(k));
        let a_len = shares.a_panels.div_ceil(shares.row_blocks) * mr * steps;
        buffer.resize(buffer.len().max(a_len + nr * steps), 0.0);
        let (a_block, own) = buffer.split_at_mut(a_len);
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= shares.items() {
                break;
            }
            let (a_range, b_range) = shares.ranges(item, b_panels);
            for pc in (0..k).step_by(kc_max) {
                let kc = kc_max.min(k - pc);
                let ks = mk.steps(kc);
                let a_buf = &mut a_block[..a_range.len() * mr * ks];
                pack_a(a, a_range.start, a_buf, mr, (pc, kc, m), rounding, pairs);
                for jp in b_range.clone() {
                    let col0 = jp * nr;
                    let panel = if in_place && col0 + nr <= readable {
                        BPanel::InPlace {
                            first: bytemuck::cast_slice::<T, f32>(data)[col0..].as_ptr(),
                            starts: &starts[pc..pc + kc],
                        }
                    } else {
                        let b = BOperand::Rows { data, starts };
                        let own = &mut own[..nr * ks];
                        pack_b(b, jp, own, nr, (pc, kc, 0, n), rounding, pairs);
                        BPanel::Packed(own)
                    };
                    let c = c_ptr.get().wrapping_add(a_range.start * mr * n + col0);
                    // SAFETY: items cover disjoint tiles, each taken by one thread through
                    // all its K blocks; the tiles lie inside the m x n output (rows and
                    // columns clipped); an in-place panel's rows hold `nr` values from
                    // `col0` (`readable`).
                    unsafe {
                        tile_column(
                            mk,
                            ks,
                            (a_buf, a_range.start),
                            panel,
                            c,
                            n,
                            (m, n - col0),
                            pc > 0,
                        )
                    };
                }
            }
        }
        A_BLOCK.set(buffer);
    };
    crate::runtime::threads::parallel(shares.threads, &worker);
}

/// Packed B values a narrowed product holds for one column block (every K block of it),
/// at most: 16 MiB, half of a 32 MiB L3.
const NARROWED_B_FLOATS: usize = 1 << 22;

/// [`gemm_with`] for an output of another type than f32 (`O`: bf16, f16), with `bias` (f32,
/// one per column) added: every tile takes all its K blocks into a per-thread block of f32
/// sums, which is rounded into `c` once, so that no f32 copy of C is made. B is packed for
/// every K block of a column block before the items start (columns limited to
/// [`NARROWED_B_FLOATS`]); the sums of each tile follow the same order as in `gemm_with`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_narrow<T: Element, O: Element>(
    mk: Micro,
    c: &mut [O],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    bias: Option<&[f32]>,
    rounding: Rounding,
    threads: usize,
) {
    let shares = Shares::new(mk, (m, n, k), threads);
    let (mr, nr, pairs) = (mk.mr, mk.nr, mk.pairs);
    let kc_max = mk.kc_max();
    // The K blocks (first index, length, packed steps) and where each one's steps start in
    // a packed B panel, which holds them all (`all_steps`).
    let mut all_steps = 0;
    let k_blocks: Vec<(usize, usize, usize, usize)> = (0..k)
        .step_by(kc_max)
        .map(|pc| {
            let (kc, at) = (kc_max.min(k - pc), all_steps);
            all_steps += mk.steps(kc);
            (pc, kc, mk.steps(kc), at)
        })
        .collect();
    let nc_max = (NARROWED_B_FLOATS / all_steps / nr * nr).clamp(nr, NC);
    let mut packed_b = PACKED_B.take();
    let b_len = nc_max.min(n).div_ceil(nr) * nr * all_steps;
    if packed_b.len() < b_len + LINE_FLOATS {
        packed_b = vec![0f32; b_len + LINE_FLOATS];
    }
    let b_start = packed_b.as_ptr().align_offset(64).min(LINE_FLOATS);
    let blocks: Vec<usize> = (0..n).step_by(nc_max).collect();
    let counters: Vec<AtomicUsize> = blocks.iter().map(|_| AtomicUsize::new(0)).collect();
    let barrier = OnceLock::new();
    let (b_ptr, c_ptr) = (
        SharedOut(packed_b[b_start..].as_mut_ptr()),
        SharedOut(c.as_mut_ptr()),
    );
    let worker = |t: usize, team: usize| {
        let barrier = barrier.get_or_init(|| Barrier::new(team));
        let (mut a_block, mut sums) = (A_BLOCK.take(), SUMS.take());
        let item_panels = shares.a_panels.div_ceil(shares.row_blocks);
        a_block.resize(
            a_block
                .len()
                .max(item_panels * mr * mk.steps(kc_max.min(k))),
            0.0,
        );
        for (&jc, next) in blocks.iter().zip(&counters) {
            let nc = nc_max.min(n - jc);
            let b_panels = nc.div_ceil(nr);
            let per = b_panels.div_ceil(team);
            let mine = (t * per).min(b_panels)..((t + 1) * per).min(b_panels);
            // Panel p holds every K block, one after another.
            for &(pc, kc, ks, at) in &k_blocks {
                for panel in mine.clone() {
                    // SAFETY: threads pack disjoint panels of the packed B (all_steps x nr
                    // floats each), which nobody reads before the barrier below.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            b_ptr.get().add((panel * all_steps + at) * nr),
                            ks * nr,
                        )
                    };
                    let cols = (pc, kc, jc, jc + nc);
                    pack_b(BOperand::View(b), panel, out, nr, cols, rounding, pairs);
                }
            }
            barrier.wait();
            // SAFETY: between the two barriers the packed B is only read.
            let b_buf =
                unsafe { std::slice::from_raw_parts(b_ptr.get(), b_panels * nr * all_steps) };
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= shares.items() {
                    break;
                }
                let (a_range, b_range) = shares.ranges(item, b_panels);
                if a_range.is_empty() || b_range.is_empty() {
                    continue;
                }
                let (row0, col0) = (a_range.start * mr, jc + b_range.start * nr);
                let (rows, cols) = (
                    (a_range.end * mr).min(m) - row0,
                    (jc + b_range.end * nr).min(jc + nc) - col0,
                );
                let width = b_range.len() * nr;
                sums.resize(sums.len().max(a_range.len() * mr * width), 0.0);
                for &(pc, kc, ks, at) in &k_blocks {
                    let a_buf = &mut a_block[..a_range.len() * mr * ks];
                    pack_a(a, a_range.start, a_buf, mr, (pc, kc, m), rounding, pairs);
                    for jp in b_range.clone() {
                        let panel = BPanel::Packed(&b_buf[(jp * all_steps + at) * nr..][..ks * nr]);
                        let x = (jp - b_range.start) * nr;
                        let (at_x, columns) = (sums.as_mut_ptr().wrapping_add(x), nc - jp * nr);
                        // SAFETY: the tiles lie inside this thread's block of sums (rows and
                        // columns clipped to the output's).
                        unsafe {
                            tile_column(
                                mk,
                                ks,
                                (a_buf, a_range.start),
                                panel,
                                at_x,
                                width,
                                (m, columns),
                                pc > 0,
                            )
                        };
                    }
                }
                let bias = bias.map(|bias| &bias[col0..col0 + cols]);
                for (r, from) in sums.chunks_exact(width).take(rows).enumerate() {
                    // SAFETY: every item is taken by one thread and items cover disjoint
                    // blocks of C; the row's columns lie inside the m x n output.
                    let to = unsafe {
                        std::slice::from_raw_parts_mut(c_ptr.get().add((row0 + r) * n + col0), cols)
                    };
                    narrow_into(to, &from[..cols], bias);
                }
            }
            barrier.wait();
        }
        A_BLOCK.set(a_block);
        SUMS.set(sums);
    };
    crate::runtime::threads::parallel(shares.threads, &worker);
    PACKED_B.set(packed_b);
}

thread_local! {
    /// A narrowed product's block of f32 sums on this thread (see [`gemm_narrow`]).
    static SUMS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The packed B of the last product this thread ran (see [`gemm`]).
    static PACKED_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The packed A block of this thread's last product (the pool's workers keep theirs).
    static A_BLOCK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A pointer into a buffer that threads share, each writing its own disjoint part (tiles of
/// the output, panels of a packed operand).
pub(super) struct SharedOut<T = f32>(pub(super) *mut T);

impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    pub(super) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: threads write disjoint parts of the buffer behind the pointer (see `gemm_with` and
// the AMX driver).
unsafe impl<T> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedOut<T> {}

/// Where a tile's micro-kernel reads B.
#[derive(Clone, Copy)]
pub(super) enum BPanel<'a> {
    /// A packed panel.
    Packed(&'a [f32]),
    /// Rows in place, read by the kernel's `run_rows`: step `s`'s values from
    /// `first + starts[s]` on.
    InPlace {
        first: *const f32,
        starts: &'a [usize],
    },
}

/// The tiles of one B panel against each A panel of `a_panels` (A's panels `first` on), into
/// C from `c` (the first A panel's first row, the B panel's first column; rows `ldc` apart),
/// clipped to A's `m` rows and to `cols` columns left from the panel's first.
///
/// # Safety
/// As [`tile`], for every tile: C holds the clipped tiles, which no other thread touches.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_column(
    mk: Micro,
    steps: usize,
    (a_panels, first): (&[f32], usize),
    b: BPanel,
    c: *mut f32,
    ldc: usize,
    (m, cols): (usize, usize),
    accumulate: bool,
) {
    for (i, a_panel) in a_panels.chunks_exact(mk.mr * steps).enumerate() {
        let row0 = (first + i) * mk.mr;
        let (rows, cols) = (mk.mr.min(m - row0), mk.nr.min(cols));
        // SAFETY: the caller's tiles.
        unsafe {
            tile(
                mk,
                steps,
                a_panel,
                b,
                c.wrapping_add(i * mk.mr * ldc),
                ldc,
                rows,
                cols,
                accumulate,
            )
        };
    }
}

/// Stores (or with `accumulate`, adds) one `rows x cols` tile (at most `mr x nr`) into C at
/// `c` (row stride `ldc`), over `steps` steps of the A panel and `b`.
///
/// # Safety
/// `c` must point at `rows` rows of `cols` writable floats, `ldc` apart, that no other
/// thread touches; the A panel must hold `steps` steps of `mr` values, and `b` `steps` steps
/// of `nr` (packed, or `nr` readable floats from each in-place row's start).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    mk: Micro,
    steps: usize,
    a: &[f32],
    b: BPanel,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    // A tile no wider than half the kernel's runs its half-width form, where it has one.
    let (run_packed, run_rows, width) = match mk.half.filter(|_| cols <= mk.nr / 2) {
        Some(half) => (half.run, half.run_rows, mk.nr / 2),
        None => (mk.run, mk.run_rows, mk.nr),
    };
    let run = |c: *mut f32, ldc: usize, accumulate: bool| match b {
        BPanel::Packed(b) => {
            debug_assert!(a.len() >= steps * mk.mr && b.len() >= steps * mk.nr);
            // SAFETY: the panels are long enough (asserted) and C holds the tile (caller).
            unsafe { run_packed(steps, a.as_ptr(), b.as_ptr(), c, ldc, accumulate) }
        }
        BPanel::InPlace { first, starts } => {
            let run = run_rows.expect("in-place panels go to kernels that read rows");
            debug_assert!(a.len() >= steps * mk.mr && starts.len() == steps);
            // SAFETY: the A panel is long enough (asserted), each row holds `nr` values from
            // its start and C holds the tile (caller).
            unsafe {
                run(
                    steps,
                    a.as_ptr(),
                    first,
                    starts.as_ptr(),
                    c,
                    ldc,
                    accumulate,
                )
            }
        }
    };
    if rows == mk.mr && cols == width {
        run(c, ldc, accumulate);
        return;
    }
    let mut scratch = [0f32; 1024];
    assert!(
        mk.mr * mk.nr <= scratch.len(),
        "the scratch tile holds every micro-kernel's tile"
    );
    // The scratch tile holds mr x nr floats (asserted) with row stride nr.
    run(scratch.as_mut_ptr(), mk.nr, false);
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
