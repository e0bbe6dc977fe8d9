//! Matrix transposes of 2-, 4-, 8- and 16-byte elements in square tiles turned in vector
//! registers (4-byte: 16 rows a tile on AVX-512, 8 on AVX2; 8-byte: 8 or 4; 16-byte: 4 or
//! 2; 2-byte: 8 in SSE2): whole rows in, whole rows out. An element-by-element transpose
//! through memory ran a 1024 x 1024 f64 copy at 12 GB/s on an AMD EPYC VM; the AVX-512
//! tiles at twice that.
//! Other element sizes, CPUs without AVX2 and the edges past the last whole tile take a
//! portable loop.

use bytemuck::Pod;

/// Columns of the widest register tile: a matrix split into parts of a multiple of this
/// many columns leaves no tile across two parts.
const WIDEST_TILE: usize = 16;

/// Copies the `rows × cols` matrix whose row `i` starts at `src[i * src_stride]` into `dst`
/// transposed: its column `j` becomes the row starting at `dst[j * dst_stride]`.
///
/// # Panics
/// When either slice is too short for the shape and strides (a caller's bug).
pub(crate) fn transpose<T: Pod>(
    (src, src_stride): (&[T], usize),
    (dst, dst_stride): (&mut [T], usize),
    (rows, cols): (usize, usize),
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        (rows - 1) * src_stride + cols <= src.len(),
        "transpose: the source holds {rows} rows of {cols} at a stride of {src_stride}"
    );
    assert!(
        (cols - 1) * dst_stride + rows <= dst.len(),
        "transpose: the destination holds {cols} rows of {rows} at a stride of {dst_stride}"
    );
    #[cfg(target_arch = "x86_64")]
    let done = x86::tiles((src, src_stride), (dst, dst_stride), (rows, cols));
    #[cfg(not(target_arch = "x86_64"))]
    let done = (0, 0);
    // What the tiles left: the rows below them, then the columns right of them.
    let (tiled_rows, tiled_cols) = done;
    if tiled_rows < rows {
        portable(
            (&src[tiled_rows * src_stride..], src_stride),
            (&mut dst[tiled_rows..], dst_stride),
            (rows - tiled_rows, cols),
        );
    }
    if tiled_rows > 0 && tiled_cols < cols {
        portable(
            (&src[tiled_cols..], src_stride),
            (&mut dst[tiled_cols * dst_stride..], dst_stride),
            (tiled_rows, cols - tiled_cols),
        );
    }
}

/// [`transpose`] of the `rows × cols` matrix whose rows start `stride` apart in `src` into
/// `dst` (row-major `cols × rows`), on up to `threads` threads of the pool, each taking
/// a part of the columns in whole tiles.
pub(crate) fn transpose_on<T: Pod + Send + Sync>(
    threads: usize,
    (src, stride): (&[T], usize),
    (rows, cols): (usize, usize),
    dst: &mut [T],
) {
    let dst = &mut dst[..rows * cols];
    if threads <= 1 || cols <= WIDEST_TILE {
        return transpose((src, stride), (dst, rows), (rows, cols));
    }
    let per = cols.div_ceil(threads).next_multiple_of(WIDEST_TILE);
    let parts = dst.chunks_mut(per * rows).enumerate().collect();
    crate::runtime::threads::for_each(parts, &|(part, dst): (usize, &mut [T])| {
        let columns = dst.len() / rows;
        transpose((&src[part * per..], stride), (dst, rows), (rows, columns))
    });
}

/// [`transpose`] element by element, in blocks of rows so that the destination's lines
/// are filled while in cache.
fn portable<T: Pod>(
    (src, src_stride): (&[T], usize),
    (dst, dst_stride): (&mut [T], usize),
    (rows, cols): (usize, usize),
) {
    const BLOCK: usize = 8;
    for i0 in (0..rows).step_by(BLOCK) {
        for j in 0..cols {
            for i in i0..(i0 + BLOCK).min(rows) {
                dst[j * dst_stride + i] = src[i * src_stride + j];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use bytemuck::Pod;

    use crate::kernels::simd::Vector;
    use crate::runtime::cpu::{Avx2Token, Avx512Token};

    /// Rows, columns, the source's row stride and the destination's.
    type Shape = (usize, usize, usize, usize);

    /// `_mm512_shuffle_f64x2`'s selector of 128-bit lanes 0 and 2 of both registers.
    const LOW: i32 = 0b10_00_10_00;
    /// Its selector of lanes 1 and 3.
    const HIGH: i32 = 0b11_01_11_01;

    /// Transposes the whole tiles at the top left of the matrix (as [`super::transpose`],
    /// whose checks the slices passed) where the CPU and the element size have a register
    /// kernel, and returns the rows and columns they covered (`(0, 0)` where none ran).
    pub(super) fn tiles<T: Pod>(
        (src, src_stride): (&[T], usize),
        (dst, dst_stride): (&mut [T], usize),
        (rows, cols): (usize, usize),
    ) -> (usize, usize) {
        let (src, dst) = (src.as_ptr().cast::<u8>(), dst.as_mut_ptr().cast::<u8>());
        let shape = (rows, cols, src_stride, dst_stride);
        match size_of::<T>() {
            8 => {
                if let Some(token) = Avx512Token::get() {
                    return f64_avx512(token, src.cast(), dst.cast(), shape);
                }
                if let Some(token) = Avx2Token::get() {
                    return f64_avx2(token, src.cast(), dst.cast(), shape);
                }
            }
            4 => {
                if let Some(token) = Avx512Token::get() {
                    return f32_avx512(token, src.cast(), dst.cast(), shape);
                }
                if let Some(token) = Avx2Token::get() {
                    return f32_avx2(token, src.cast(), dst.cast(), shape);
                }
            }
            16 => {
                if let Some(token) = Avx512Token::get() {
                    return pairs_avx512(token, src.cast(), dst.cast(), shape);
                }
                if let Some(token) = Avx2Token::get() {
                    return pairs_avx2(token, src.cast(), dst.cast(), shape);
                }
            }
            2 => return u16_sse2(src.cast(), dst.cast(), shape),
            _ => {}
        }
        (0, 0)
    }

    /// Runs `tile(from, to)` on each whole `side × side` tile of the matrix: `from` its
    /// first element in the source, `to` the destination's place for it. Returns the rows
    /// and columns covered.
    ///
    /// # Safety
    /// `src` and `dst` hold the matrix as [`super::transpose`] checks; `tile` moves one
    /// tile between such places.
    #[inline(always)]
    unsafe fn each_tile<E>(
        (src, dst): (*const E, *mut E),
        (rows, cols, src_stride, dst_stride): Shape,
        side: usize,
        mut tile: impl FnMut(*const E, *mut E),
    ) -> (usize, usize) {
        let (rows, cols) = (rows / side * side, cols / side * side);
        for i in (0..rows).step_by(side) {
            for j in (0..cols).step_by(side) {
                // SAFETY: (i, j) and the tile below and right of it are inside the matrix.
                unsafe { tile(src.add(i * src_stride + j), dst.add(j * dst_stride + i)) }
            }
        }
        if rows == 0 || cols == 0 {
            return (0, 0);
        }
        (rows, cols)
    }

    fn f64_avx512(_: Avx512Token, src: *const f64, dst: *mut f64, shape: Shape) -> (usize, usize) {
        #[target_feature(enable = "avx512f")]
        unsafe fn go(src: *const f64, dst: *mut f64, shape: Shape) -> (usize, usize) {
            let (ss, ds) = (shape.2, shape.3);
            // Pairs of rows interleaved (`t[2p]` even columns, `t[2p + 1]` odd ones), then
            // 128-bit lanes gathered twice ([`LOW`], [`HIGH`]).
            // SAFETY: the caller's contract; each tile's 8 rows of 8 are in both matrices.
            unsafe {
                each_tile((src, dst), shape, 8, |from, to| {
                    let r: [__m512d; 8] =
                        std::array::from_fn(|i| _mm512_loadu_pd(from.add(i * ss)));
                    let t: [__m512d; 8] = std::array::from_fn(|i| match i % 2 {
                        0 => _mm512_unpacklo_pd(r[i], r[i + 1]),
                        _ => _mm512_unpackhi_pd(r[i - 1], r[i]),
                    });
                    // u[c]: columns c and c + 4 of rows 0..4 (c < 4: lanes in the order
                    // column c of rows 0, 1, column c + 4 of rows 0, 1, the same of rows
                    // 2, 3); v[c] the same of rows 4..8.
                    let u = [
                        _mm512_shuffle_f64x2::<LOW>(t[0], t[2]),
                        _mm512_shuffle_f64x2::<LOW>(t[1], t[3]),
                        _mm512_shuffle_f64x2::<HIGH>(t[0], t[2]),
                        _mm512_shuffle_f64x2::<HIGH>(t[1], t[3]),
                    ];
                    let v = [
                        _mm512_shuffle_f64x2::<LOW>(t[4], t[6]),
                        _mm512_shuffle_f64x2::<LOW>(t[5], t[7]),
                        _mm512_shuffle_f64x2::<HIGH>(t[4], t[6]),
                        _mm512_shuffle_f64x2::<HIGH>(t[5], t[7]),
                    ];
                    for c in 0..4 {
                        _mm512_storeu_pd(to.add(c * ds), _mm512_shuffle_f64x2::<LOW>(u[c], v[c]));
                        let high = _mm512_shuffle_f64x2::<HIGH>(u[c], v[c]);
                        _mm512_storeu_pd(to.add((c + 4) * ds), high);
                    }
                })
            }
        }
        // SAFETY: the token proves AVX-512F; the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    fn f64_avx2(_: Avx2Token, src: *const f64, dst: *mut f64, shape: Shape) -> (usize, usize) {
        #[target_feature(enable = "avx2")]
        unsafe fn go(src: *const f64, dst: *mut f64, shape: Shape) -> (usize, usize) {
            let (ss, ds) = (shape.2, shape.3);
            // SAFETY: the caller's contract; each tile's 4 rows of 4 are in both matrices.
            unsafe {
                each_tile((src, dst), shape, 4, |from, to| {
                    let r: [__m256d; 4] =
                        std::array::from_fn(|i| _mm256_loadu_pd(from.add(i * ss)));
                    let (even01, odd01) = (
                        _mm256_unpacklo_pd(r[0], r[1]),
                        _mm256_unpackhi_pd(r[0], r[1]),
                    );
                    let (even23, odd23) = (
                        _mm256_unpacklo_pd(r[2], r[3]),
                        _mm256_unpackhi_pd(r[2], r[3]),
                    );
                    _mm256_storeu_pd(to, _mm256_permute2f128_pd::<0x20>(even01, even23));
                    _mm256_storeu_pd(to.add(ds), _mm256_permute2f128_pd::<0x20>(odd01, odd23));
                    _mm256_storeu_pd(
                        to.add(2 * ds),
                        _mm256_permute2f128_pd::<0x31>(even01, even23),
                    );
                    _mm256_storeu_pd(to.add(3 * ds), _mm256_permute2f128_pd::<0x31>(odd01, odd23));
                })
            }
        }
        // SAFETY: the token proves AVX2; the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    /// 16-byte elements (complex f64) in 4 x 4 tiles: each register holds one tile row
    /// as four 128-bit lanes.
    fn pairs_avx512(
        _: Avx512Token,
        src: *const u128,
        dst: *mut u128,
        shape: Shape,
    ) -> (usize, usize) {
        #[target_feature(enable = "avx512f")]
        unsafe fn go(src: *const u128, dst: *mut u128, shape: Shape) -> (usize, usize) {
            let (ss, ds) = (shape.2, shape.3);
            // [`LOW`] and [`HIGH`] twice over: rows (a, b, c, d) become [a0 a2 b0 b2],
            // [a1 a3 b1 b3], ... and then columns.
            // SAFETY: the caller's contract; each tile's 4 rows of 4 are in both matrices.
            unsafe {
                each_tile((src, dst), shape, 4, |from, to| {
                    let r: [__m512d; 4] =
                        std::array::from_fn(|i| _mm512_loadu_pd(from.add(i * ss).cast()));
                    let t = [
                        _mm512_shuffle_f64x2::<LOW>(r[0], r[1]),
                        _mm512_shuffle_f64x2::<HIGH>(r[0], r[1]),
                        _mm512_shuffle_f64x2::<LOW>(r[2], r[3]),
                        _mm512_shuffle_f64x2::<HIGH>(r[2], r[3]),
                    ];
                    for c in 0..2 {
                        let (top, bottom) = (t[c], t[c + 2]);
                        let even = _mm512_shuffle_f64x2::<LOW>(top, bottom);
                        _mm512_storeu_pd(to.add(c * ds).cast(), even);
                        let odd = _mm512_shuffle_f64x2::<HIGH>(top, bottom);
                        _mm512_storeu_pd(to.add((c + 2) * ds).cast(), odd);
                    }
                })
            }
        }
        // SAFETY: the token proves AVX-512F; the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    fn pairs_avx2(_: Avx2Token, src: *const u128, dst: *mut u128, shape: Shape) -> (usize, usize) {
        #[target_feature(enable = "avx2")]
        unsafe fn go(src: *const u128, dst: *mut u128, shape: Shape) -> (usize, usize) {
            let (ss, ds) = (shape.2, shape.3);
            // SAFETY: the caller's contract; each tile's 2 rows of 2 are in both matrices.
            unsafe {
                each_tile((src, dst), shape, 2, |from, to| {
                    let (a, b) = (
                        _mm256_loadu_pd(from.cast()),
                        _mm256_loadu_pd(from.add(ss).cast()),
                    );
                    _mm256_storeu_pd(to.cast(), _mm256_permute2f128_pd::<0x20>(a, b));
                    _mm256_storeu_pd(to.add(ds).cast(), _mm256_permute2f128_pd::<0x31>(a, b));
                })
            }
        }
        // SAFETY: the token proves AVX2; the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    /// 2-byte elements in 8 x 8 tiles of SSE2 registers (x86-64's baseline).
    fn u16_sse2(src: *const u16, dst: *mut u16, shape: Shape) -> (usize, usize) {
        let (ss, ds) = (shape.2, shape.3);
        // SAFETY: the caller checked the slices (each tile's 8 rows of 8 are in both
        // matrices); SSE2 is part of x86-64.
        unsafe {
            each_tile((src, dst), shape, 8, |from, to| {
                let r: [__m128i; 8] =
                    std::array::from_fn(|i| _mm_loadu_si128(from.add(i * ss).cast()));
                // Pairs of rows interleaved by 16 bits, then by 32 (b[c / 2] holds columns
                // c and c + 1 of rows 0..4, b[4 + c / 2] of rows 4..8), then by 64.
                let a: [__m128i; 8] = std::array::from_fn(|i| {
                    let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
                    if i % 2 == 0 {
                        _mm_unpacklo_epi16(x, y)
                    } else {
                        _mm_unpackhi_epi16(x, y)
                    }
                });
                let b: [__m128i; 8] = std::array::from_fn(|i| {
                    let half = 4 * (i / 4);
                    let (x, y) = (a[half + (i % 4) / 2], a[half + 2 + (i % 4) / 2]);
                    if i % 2 == 0 {
                        _mm_unpacklo_epi32(x, y)
                    } else {
                        _mm_unpackhi_epi32(x, y)
                    }
                });
                for c in 0..4 {
                    _mm_storeu_si128(
                        to.add(2 * c * ds).cast(),
                        _mm_unpacklo_epi64(b[c], b[4 + c]),
                    );
                    _mm_storeu_si128(
                        to.add((2 * c + 1) * ds).cast(),
                        _mm_unpackhi_epi64(b[c], b[4 + c]),
                    );
                }
            })
        }
    }

    /// 4-byte elements in tiles of `V::LANES` rows through [`Vector::transpose`].
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; the caller checked the slices.
    #[inline(always)]
    unsafe fn f32_tiles<V: Vector>(src: *const f32, dst: *mut f32, shape: Shape) -> (usize, usize) {
        let (ss, ds) = (shape.2, shape.3);
        // SAFETY: the caller's contract; each tile's rows are in both matrices.
        unsafe {
            each_tile((src, dst), shape, V::LANES, |from, to| {
                let mut r = [V::splat(0.0); super::WIDEST_TILE];
                let r = &mut r[..V::LANES];
                for (i, row) in r.iter_mut().enumerate() {
                    *row = V::load(from.add(i * ss));
                }
                V::transpose(r);
                for (j, row) in r.iter().enumerate() {
                    row.store(to.add(j * ds));
                }
            })
        }
    }

    fn f32_avx512(_: Avx512Token, src: *const f32, dst: *mut f32, shape: Shape) -> (usize, usize) {
        #[target_feature(enable = "avx512f,avx512dq")]
        unsafe fn go(src: *const f32, dst: *mut f32, shape: Shape) -> (usize, usize) {
            // SAFETY: the caller's contract, on an AVX-512 CPU.
            unsafe { f32_tiles::<__m512>(src, dst, shape) }
        }
        // SAFETY: the token proves AVX-512 (F, DQ); the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    fn f32_avx2(_: Avx2Token, src: *const f32, dst: *mut f32, shape: Shape) -> (usize, usize) {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn go(src: *const f32, dst: *mut f32, shape: Shape) -> (usize, usize) {
            // SAFETY: the caller's contract, on an AVX2 CPU.
            unsafe { f32_tiles::<__m256>(src, dst, shape) }
        }
        // SAFETY: the token proves AVX2 and FMA; the caller checked the slices.
        unsafe { go(src, dst, shape) }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// `kernel`'s tiles (the AVX2 ones, which the dispatch passes over on an AVX-512
        /// CPU) against the definition, with every element outside them left as it was.
        fn check<T: Pod + PartialEq + std::fmt::Debug>(
            kernel: impl Fn(*const T, *mut T, Shape) -> (usize, usize),
            make: impl Fn(usize) -> T,
            poison: T,
        ) {
            for (rows, cols) in [(4, 4), (9, 6), (16, 17), (3, 40)] {
                let (ss, ds) = (cols + 1, rows + 3);
                let src: Vec<T> = (0..rows * ss).map(&make).collect();
                let mut dst = vec![poison; cols * ds];
                let (r, c) = kernel(src.as_ptr(), dst.as_mut_ptr(), (rows, cols, ss, ds));
                assert!(
                    r <= rows && c <= cols && (r > 0) == (c > 0),
                    "{rows}x{cols}"
                );
                for j in 0..cols {
                    for i in 0..ds {
                        let want = if i < r && j < c {
                            src[i * ss + j]
                        } else {
                            poison
                        };
                        assert_eq!(dst[j * ds + i], want, "{rows}x{cols} ({i}, {j})");
                    }
                }
            }
        }

        #[test]
        fn avx2_tiles_land_transposed() {
            let Some(token) = Avx2Token::get() else {
                eprintln!("skipped: the CPU level in force is below AVX2");
                return;
            };
            check(
                |s, d, shape| f32_avx2(token, s, d, shape),
                |i| i as f32,
                -1.0,
            );
            check(
                |s, d, shape| f64_avx2(token, s, d, shape),
                |i| i as f64,
                -1.0,
            );
            check(
                |s, d, shape| pairs_avx2(token, s, d, shape),
                |i| i as u128 * 3,
                u128::MAX,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element lands where the definition puts it, for shapes around each tile side,
    /// strided rows on both sides, and the bytes untouched outside the destination's rows.
    fn check<T: Pod + PartialEq + std::fmt::Debug>(make: impl Fn(usize) -> T, poison: T) {
        for rows in [1, 3, 4, 7, 8, 9, 15, 16, 17, 33] {
            for cols in [1, 2, 4, 5, 8, 12, 16, 19, 40] {
                for pad in [0, 3] {
                    let (ss, ds) = (cols + pad, rows + 2 * pad);
                    let src: Vec<T> = (0..rows * ss).map(&make).collect();
                    let mut dst = vec![poison; cols * ds];
                    transpose(
                        (&src, ss),
                        (&mut dst[..(cols - 1) * ds + rows], ds),
                        (rows, cols),
                    );
                    for j in 0..cols {
                        for i in 0..ds {
                            let want = if i < rows { src[i * ss + j] } else { poison };
                            assert_eq!(dst[j * ds + i], want, "{rows}x{cols} pad {pad} ({i}, {j})");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn eight_byte_elements_land_transposed() {
        check(
            |i| 0x4000_0000_0000_0000 ^ (i as u64 * 0x9e37_79b9),
            u64::MAX,
        );
    }

    #[test]
    fn sixteen_byte_elements_land_transposed() {
        check(
            |i| (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
            u128::MAX,
        );
    }

    #[test]
    fn four_byte_elements_land_transposed() {
        check(|i| (i as u32).wrapping_mul(2_654_435_761), u32::MAX);
    }

    #[test]
    fn two_byte_elements_land_transposed() {
        check(|i| (i as u16).wrapping_mul(40_503), u16::MAX);
    }

    #[test]
    fn other_sizes_land_transposed() {
        check(|i| (i % 251) as u8, u8::MAX);
    }

    #[test]
    fn shared_transposes_match_one_threads() {
        // Column counts below, at and past the parts' tile multiple; a padded source.
        for (rows, cols) in [(5, 7), (33, 16), (40, 100), (17, 257)] {
            let stride = cols + 3;
            let src: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
            let mut want = vec![f32::NAN; rows * cols];
            transpose((&src, stride), (&mut want, rows), (rows, cols));
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; rows * cols];
                transpose_on(threads, (&src, stride), (rows, cols), &mut got);
                assert_eq!(got, want, "{rows}x{cols} on {threads} threads");
            }
        }
    }
}
