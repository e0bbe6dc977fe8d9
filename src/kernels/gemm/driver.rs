//! The GEMM driver: blocks a product for the caches (K blocks, column blocks, row blocks of
//! A panels), packs B per block together and A per item, and runs the micro-kernel over
//! the tiles, on the library's threads with a fixed reduction order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};

use super::pack::{pack_a, pack_b};
use super::{BOperand, MatView, Micro, Rounding};
use crate::core::tensor::Element;

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

/// [`gemm`] with the micro-kernel `mk` (non-empty sizes).
pub(super) fn gemm_with<T: Element>(
    mk: Micro,
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: BOperand<T>,
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

/// A pointer into a buffer that threads share, each writing its own disjoint part (tiles of
/// the output, panels of a packed operand).
#[derive(Clone, Copy)]
pub(super) struct SharedOut(pub(super) *mut f32);

impl SharedOut {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    pub(super) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: threads write disjoint parts of the buffer behind the pointer (see `gemm_with` and
// the AMX driver).
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
pub(super) unsafe fn tile(
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
