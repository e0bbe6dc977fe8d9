//! The micro-kernels: one `mr x nr` tile of C from a packed A panel and a packed B panel,
//! portable and, on x86-64, AVX-512, AVX512-BF16 and AVX2+FMA; the f32 x86 ones also read B
//! in place, as rows of one buffer at listed starts (`run_rows`).

use super::Micro;

/// The portable micro-kernel and its tile.
pub(super) const PORTABLE: Micro = Micro {
    name: "portable",
    mr: 4,
    nr: 8,
    pairs: false,
    run: micro_portable,
    run_rows: None,
    half: None,
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
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use crate::kernels::gemm::{Half, Micro};
    use crate::kernels::simd::{Vector, prefetch_l1};

    /// The AVX-512 micro-kernel and its tile.
    pub(in crate::kernels::gemm) const AVX512: Micro = Micro {
        name: "avx512",
        mr: 6,
        nr: 64,
        pairs: false,
        run: micro_avx512,
        run_rows: Some(rows_avx512),
        half: Some(Half {
            run: half_avx512,
            run_rows: Some(half_rows_avx512),
        }),
    };

    /// The AVX512-BF16 micro-kernel: the AVX-512 tile over bf16 pairs (`vdpbf16ps`).
    pub(in crate::kernels::gemm) const AVX512_BF16: Micro = Micro {
        name: "avx512_bf16",
        mr: 6,
        nr: 64,
        pairs: true,
        run: micro_avx512_bf16,
        run_rows: None,
        half: None,
    };

    /// The AVX2 micro-kernel and its tile.
    pub(in crate::kernels::gemm) const AVX2: Micro = Micro {
        name: "avx2",
        mr: 6,
        nr: 16,
        pairs: false,
        run: micro_avx2,
        run_rows: Some(rows_avx2),
        half: Some(Half {
            run: half_avx2,
            run_rows: Some(half_rows_avx2),
        }),
    };

    /// Emits a micro-kernel over packed B panels and its twin reading B's rows in place, both
    /// [`micro_lanes`] with `MR` = 6 and `$nv` vectors of `$v` per step (`$tile` columns),
    /// compiled for `$features`. The packed panels' steps are `$stride` vectors apart: `$nv`
    /// for a whole tile, twice that for the half-width kernels, which read a panel's first
    /// half.
    macro_rules! lanes {
        ($features:literal, $v:ty, $nv:literal, $stride:literal, $tile:literal, $packed:ident, $rows:ident) => {
            #[doc = concat!("[`micro_lanes`] on a 6 x ", $tile, " tile over a packed B panel.")]
            ///
            /// # Safety
            #[doc = concat!("The CPU has ", $features, "; the panels and the tile as [`micro_lanes`]")]
            #[doc = concat!("says, a packed step holding `", $stride, "` vectors.")]
            #[target_feature(enable = $features)]
            unsafe fn $packed(
                kc: usize,
                a: *const f32,
                b: *const f32,
                c: *mut f32,
                ldc: usize,
                accumulate: bool,
            ) {
                // SAFETY: the caller's CPU, panels and tile (above).
                unsafe {
                    micro_lanes::<$v, 6, $nv>(kc, a, packed::<$v, $stride>(b), c, ldc, accumulate)
                }
            }

            #[doc = concat!("[`micro_lanes`] on a 6 x ", $tile, " tile reading step `s`'s B values")]
            /// in place at `b + starts[s]`.
            ///
            /// # Safety
            #[doc = concat!("The CPU has ", $features, "; `starts` holds `kc` offsets from `b`, each")]
            #[doc = concat!("the start of ", $tile, " readable floats; the A panel and the tile as")]
            /// [`micro_lanes`] says.
            #[target_feature(enable = $features)]
            unsafe fn $rows(
                kc: usize,
                a: *const f32,
                b: *const f32,
                starts: *const usize,
                c: *mut f32,
                ldc: usize,
                accumulate: bool,
            ) {
                // SAFETY: the caller's CPU, panel, rows and tile (above).
                unsafe {
                    micro_lanes::<$v, 6, $nv>(kc, a, in_place(b, starts, kc), c, ldc, accumulate)
                }
            }
        };
    }

    lanes!("avx512f,fma", __m512, 4, 4, 64, micro_avx512, rows_avx512);
    lanes!(
        "avx512f,fma",
        __m512,
        2,
        4,
        32,
        half_avx512,
        half_rows_avx512
    );
    lanes!("avx2,fma", __m256, 2, 2, 16, micro_avx2, rows_avx2);
    lanes!("avx2,fma", __m256, 1, 2, 8, half_avx2, half_rows_avx2);

    /// Where a packed B panel holds step `s`: `NV` vectors after the previous step's.
    #[inline(always)]
    fn packed<V: Vector, const NV: usize>(b: *const f32) -> impl Fn(usize) -> *const f32 {
        move |step| b.wrapping_add(step * NV * V::LANES)
    }

    /// Where B's row of step `s` starts in place: `b + starts[s]` (for a step past the last,
    /// which only prefetches ask for, the last row's).
    ///
    /// # Safety
    /// `starts` holds `kc` (at least one) offsets.
    #[inline(always)]
    unsafe fn in_place(
        b: *const f32,
        starts: *const usize,
        kc: usize,
    ) -> impl Fn(usize) -> *const f32 {
        // SAFETY: the index is below kc (caller).
        move |step| b.wrapping_add(unsafe { *starts.add(step.min(kc - 1)) })
    }

    /// Steps ahead of the one being computed whose B lines the micro-kernels prefetch: the
    /// 64-wide B panel (96 KiB at 384 steps) outgrows L1 and streams from L2, where the
    /// loads stalled the FMAs (measured +10-19% on an Intel Xeon at n = 1024..4096).
    const PREFETCH_STEPS: usize = 6;

    /// An `MR x (LANES * NV)` tile: `MR * NV` accumulators; per step, NV vectors of B (from
    /// `b(step)` on) and one broadcast of A per row.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; `a` holds `kc * MR` floats, `b(step)` is the start
    /// of `LANES * NV` readable floats for every step below `kc`, and `c` has MR rows of
    /// `LANES * NV` writable floats `ldc` apart.
    #[inline(always)]
    unsafe fn micro_lanes<V: Vector, const MR: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: impl Fn(usize) -> *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        prefetch_tile::<V>(c, ldc, MR, V::LANES * NV);
        // SAFETY: register work under the caller's instruction set.
        let mut acc = [[unsafe { V::splat(0.0) }; NV]; MR];
        for step in 0..kc {
            prefetch_b::<V, NV>(b(step + PREFETCH_STEPS));
            let row = b(step);
            // SAFETY: step < kc, so the reads stay inside the panels (caller).
            unsafe {
                let bv: [V; NV] = std::array::from_fn(|v| V::load(row.add(v * V::LANES)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = V::splat(*a.add(step * MR + i));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = V::fmadd(ai, bx, *x);
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<V, MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// As [`micro_avx512`], but each step holds two K indices as bf16 pairs: one
    /// `vdpbf16ps` per accumulator adds both products in f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16; `a` holds `steps * 6` pairs, `b`
    /// `steps * 64`, and `c` 6 rows of 64 writable floats `ldc` apart.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn micro_avx512_bf16(
        steps: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const MR: usize = 6;
        const NV: usize = 4;
        prefetch_tile::<__m512>(c, ldc, MR, 16 * NV);
        // SAFETY: register work (AVX-512F).
        let mut acc = [[unsafe { __m512::splat(0.0) }; NV]; MR];
        for step in 0..steps {
            prefetch_b::<__m512, NV>(b.wrapping_add((step + PREFETCH_STEPS) * NV * 16));
            // SAFETY: step < steps, so the reads stay inside the panels (caller). A pair of
            // bf16 values and an f32 are both 32 bits: the casts reinterpret lanes.
            unsafe {
                let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute(__m512::load(b.add((step * NV + v) * 16)))
                });
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai: __m512bh = std::mem::transmute(__m512::splat(*a.add(step * MR + i)));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, ai, bx);
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<__m512, MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// Prefetches the cache lines of one step's B values from `row` on into L1 (one prefetch
    /// per 64-byte line: `NV` vectors of `LANES` floats).
    #[inline(always)]
    fn prefetch_b<V: Vector, const NV: usize>(row: *const f32) {
        for line in (0..NV * V::LANES).step_by(16) {
            prefetch_l1(row.wrapping_add(line));
        }
    }

    /// Asks for the C tile's cache lines ahead of the K loop, so that storing (or adding to)
    /// it at the end does not wait on memory.
    #[inline(always)]
    fn prefetch_tile<V: Vector>(c: *const f32, ldc: usize, rows: usize, cols: usize) {
        for i in 0..rows {
            for col in (0..cols).step_by(V::LANES) {
                prefetch_l1(c.wrapping_add(i * ldc + col));
            }
        }
    }

    /// Stores (or adds) the accumulators into C.
    ///
    /// # Safety
    /// As the micro-kernels: the CPU has `V`'s instruction set and `c` has MR rows of
    /// `LANES * NV` writable floats `ldc` apart.
    #[inline(always)]
    unsafe fn store<V: Vector, const MR: usize, const NV: usize>(
        acc: &[[V; NV]; MR],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: row i of the tile has LANES * NV writable floats (caller).
                unsafe {
                    let cv = c.add(i * ldc + v * V::LANES);
                    let out = if accumulate {
                        V::add(V::load(cv), x)
                    } else {
                        x
                    };
                    out.store(cv);
                }
            }
        }
    }
}
