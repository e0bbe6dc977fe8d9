//! The SIMD vocabulary of the CPU kernels: [`Vector`], one register of `f32` lanes with the
//! operations the GEMM micro-kernels and the fused attention block are written in, for
//! AVX-512 (`__m512`) and AVX2 (`__m256`). A kernel body is written once, generic over
//! `V: Vector`, and compiled per instruction set inside a `#[target_feature]` function that
//! a capability token ([`crate::runtime::cpu::Avx512Token`], [`crate::runtime::cpu::Avx2Token`])
//! makes safe to call.

use std::arch::x86_64::*;

/// One register of `LANES` floats and its operations. Every method is unsafe: the CPU must
/// have the vector's instruction set, and pointers must be valid for the lanes they touch.
pub(crate) trait Vector: Copy {
    /// Floats per register.
    const LANES: usize;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `LANES` floats from `at` (unaligned).
    unsafe fn load(at: *const f32) -> Self;
    /// The lanes to `at` (unaligned).
    unsafe fn store(self, at: *mut f32);
    /// Stores lanes `0..n` only.
    unsafe fn store_first(self, at: *mut f32, n: usize);
    /// `a·b + c`, fused.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// `a·b`.
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// `a + b`.
    unsafe fn add(a: Self, b: Self) -> Self;
    /// The lane-wise maximum.
    unsafe fn max(a: Self, b: Self) -> Self;
    /// `base[l·stride]` in lanes `l < n`, 0 in the others (64-bit offsets: any stride).
    unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self;
    /// `LANES` bf16 values (their bits) from `at`, widened to f32 exactly.
    unsafe fn load_bf16(at: *const u16) -> Self;
    /// The sum of the lanes.
    unsafe fn sum(self) -> f32;
    /// Transposes the `LANES x LANES` block held in `rows` (`rows[i]` lane `j` becomes
    /// `rows[j]` lane `i`); `rows` holds exactly `LANES` registers.
    unsafe fn transpose(rows: &mut [Self]);
}

/// The element types the kernels read straight from a tensor, widened into f32 lanes.
pub(crate) trait Load: Copy + crate::core::tensor::Element {
    /// `LANES` values from `at`, as f32.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; `at` is valid for `LANES` values.
    unsafe fn load<V: Vector>(at: *const Self) -> V;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load<V: Vector>(at: *const f32) -> V {
        // SAFETY: the caller's contract.
        unsafe { V::load(at) }
    }
}

impl Load for half::bf16 {
    #[inline(always)]
    unsafe fn load<V: Vector>(at: *const half::bf16) -> V {
        // SAFETY: the caller's contract; a bf16 is its 16 bits.
        unsafe { V::load_bf16(at.cast()) }
    }
}

/// Asks for the cache line of `at` in L1. No safety condition: a prefetch never faults,
/// whatever the address (it is only computed, never read).
#[inline(always)]
pub(crate) fn prefetch_l1(at: *const f32) {
    // SAFETY: `prefetcht0` is SSE (x86-64's baseline) and does not fault on any address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) }
}

// SAFETY (every method): one or a few intrinsics under the trait's contract (the CPU
// has AVX-512F and DQ, pointers are valid for the lanes touched).
#[allow(unsafe_op_in_unsafe_fn)]
impl Vector for __m512 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        _mm512_loadu_ps(at)
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32) {
        _mm512_storeu_ps(at, self)
    }
    #[inline(always)]
    unsafe fn store_first(self, at: *mut f32, n: usize) {
        _mm512_mask_storeu_ps(at, first_lanes16(n), self)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self {
        let stride = _mm512_set1_epi64(stride as i64);
        let low_offsets = _mm512_mullo_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), stride);
        let high_offsets =
            _mm512_mullo_epi64(_mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15), stride);
        let real = first_lanes16(n);
        let low = _mm512_mask_i64gather_ps::<4>(
            _mm256_setzero_ps(),
            real as __mmask8,
            low_offsets,
            base.cast(),
        );
        let high = _mm512_mask_i64gather_ps::<4>(
            _mm256_setzero_ps(),
            (real >> 8) as __mmask8,
            high_offsets,
            base.cast(),
        );
        _mm512_insertf32x8::<1>(_mm512_castps256_ps512(low), high)
    }
    #[inline(always)]
    unsafe fn load_bf16(at: *const u16) -> Self {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(at.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        _mm512_reduce_add_ps(self)
    }
    #[inline(always)]
    unsafe fn transpose(rows: &mut [Self]) {
        let r: &mut [__m512; 16] = rows.try_into().expect("16 rows");
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        // Pairs of rows interleaved by 32 bits, then groups of four by 64 bits: register
        // 4g + c then holds, in 128-bit lane l, column 4l + c of rows 4g..4g + 4.
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let (a, b, c, d) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
            let (lo_ab, hi_ab) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            let (lo_cd, hi_cd) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
            u[4 * g] = ps(_mm512_unpacklo_pd(pd(lo_ab), pd(lo_cd)));
            u[4 * g + 1] = ps(_mm512_unpackhi_pd(pd(lo_ab), pd(lo_cd)));
            u[4 * g + 2] = ps(_mm512_unpacklo_pd(pd(hi_ab), pd(hi_cd)));
            u[4 * g + 3] = ps(_mm512_unpackhi_pd(pd(hi_ab), pd(hi_cd)));
        }
        // Then the 128-bit lanes of the four groups gathered: column 4l + c is lane l of
        // registers c, 4 + c, 8 + c, 12 + c.
        for c in 0..4 {
            let even01 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
            let odd01 = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
            let even23 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
            let odd23 = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
            r[c] = _mm512_shuffle_f32x4::<0x88>(even01, even23);
            r[8 + c] = _mm512_shuffle_f32x4::<0xdd>(even01, even23);
            r[4 + c] = _mm512_shuffle_f32x4::<0x88>(odd01, odd23);
            r[12 + c] = _mm512_shuffle_f32x4::<0xdd>(odd01, odd23);
        }
    }
}

/// The mask of lanes `0..n` of 16.
#[inline(always)]
pub(crate) fn first_lanes16(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

// SAFETY (every method): one or a few intrinsics under the trait's contract (the CPU
// has AVX2 and FMA, pointers are valid for the lanes touched).
#[allow(unsafe_op_in_unsafe_fn)]
impl Vector for __m256 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        _mm256_loadu_ps(at)
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32) {
        _mm256_storeu_ps(at, self)
    }
    #[inline(always)]
    unsafe fn store_first(self, at: *mut f32, n: usize) {
        _mm256_maskstore_ps(at, first_lanes8(n), self)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self {
        let stride = stride as i64;
        let low_offsets = _mm256_setr_epi64x(0, stride, 2 * stride, 3 * stride);
        let high_offsets = _mm256_setr_epi64x(4 * stride, 5 * stride, 6 * stride, 7 * stride);
        let real = _mm256_castsi256_ps(first_lanes8(n));
        let low = _mm256_mask_i64gather_ps::<4>(
            _mm_setzero_ps(),
            base,
            low_offsets,
            _mm256_castps256_ps128(real),
        );
        let high = _mm256_mask_i64gather_ps::<4>(
            _mm_setzero_ps(),
            base,
            high_offsets,
            _mm256_extractf128_ps::<1>(real),
        );
        _mm256_set_m128(high, low)
    }
    #[inline(always)]
    unsafe fn load_bf16(at: *const u16) -> Self {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(at.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        let quad = _mm_add_ps(
            _mm256_castps256_ps128(self),
            _mm256_extractf128_ps::<1>(self),
        );
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
    }
    #[inline(always)]
    unsafe fn transpose(rows: &mut [Self]) {
        let r: &mut [__m256; 8] = rows.try_into().expect("8 rows");
        // Within each 128-bit lane l, register 4g + c gets column 4l + c of rows 4g..4g + 4;
        // then the two lanes of groups 0 and 1 are paired.
        let mut u = [_mm256_setzero_ps(); 8];
        for g in 0..2 {
            let (a, b, c, d) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
            let (lo_ab, hi_ab) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
            let (lo_cd, hi_cd) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
            u[4 * g] = _mm256_shuffle_ps::<0x44>(lo_ab, lo_cd);
            u[4 * g + 1] = _mm256_shuffle_ps::<0xee>(lo_ab, lo_cd);
            u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(hi_ab, hi_cd);
            u[4 * g + 3] = _mm256_shuffle_ps::<0xee>(hi_ab, hi_cd);
        }
        for c in 0..4 {
            r[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
            r[4 + c] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
        }
    }
}

/// All-ones in 32-bit lanes `0..n` of 8.
///
/// # Safety
/// The CPU has AVX2 (`vpcmpgtd` on 256 bits).
#[inline(always)]
pub(crate) unsafe fn first_lanes8(n: usize) -> __m256i {
    // SAFETY: register work; the caller's CPU has AVX2.
    unsafe {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), lane)
    }
}
