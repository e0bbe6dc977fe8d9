//! The micro-kernels: one `mr x nr` tile of C from a packed A panel and a packed B panel,
//! portable and, on x86-64, AVX-512, AVX512-BF16 and AVX2+FMA.

use super::Micro;

/// The portable micro-kernel and its tile.
pub(super) const PORTABLE: Micro = Micro {
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
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Micro;

    /// The AVX-512 micro-kernel and its tile.
    pub(in crate::kernels::gemm) const AVX512: Micro = Micro {
        name: "avx512",
        mr: 6,
        nr: 64,
        pairs: false,
        run: micro_avx512::<6, 4>,
    };

    /// The AVX512-BF16 micro-kernel: the AVX-512 tile over bf16 pairs (`vdpbf16ps`).
    pub(in crate::kernels::gemm) const AVX512_BF16: Micro = Micro {
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
    pub(in crate::kernels::gemm) const AVX2: Micro = Micro {
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
