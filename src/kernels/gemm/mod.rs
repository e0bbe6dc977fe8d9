//! CPU GEMM: cache-blocked and packed, with SIMD micro-kernels for AVX-512 and AVX2+FMA and
//! a portable fallback, chosen from [`crate::runtime::cpu::get_cpu_capability`], on the library's
//! threads. fp16/bf16 inputs are widened to f32 while packing, and every product is
//! accumulated in f32, in a fixed order: results are bit-identical run to run and do not
//! depend on the thread count.
//!
//! `driver.rs` blocks the product for the caches and shares it among threads, `pack.rs`
//! lays A and B out in panels (rounding inputs for the reduced-precision modes), and
//! `micro.rs` holds the micro-kernels that multiply one panel pair into a tile of C.

#[cfg(target_arch = "x86_64")]
mod amx;
mod driver;
mod micro;
mod pack;
#[cfg(target_arch = "x86_64")]
mod skinny;

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

impl<'a, T: Element> MatView<'a, T> {
    #[inline]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.offset + r * self.rs + c * self.cs].to_f32()
    }

    /// The same view with its elements seen as `E`, a type of the same size (a kernel's own
    /// name for `T`, chosen through `T::DTYPE`).
    fn cast<E: bytemuck::Pod>(self) -> MatView<'a, E> {
        MatView {
            data: bytemuck::cast_slice(self.data),
            offset: self.offset,
            rs: self.rs,
            cs: self.cs,
        }
    }
}

/// B as the packed path reads it: a strided view, or rows of one buffer at listed starts,
/// element `(k, j)` at `data[starts[k] + j]` (shifted rows of an image's padded phase
/// planes, which a convolution reads in place instead of unfolding them).
#[derive(Clone, Copy)]
pub(crate) enum BOperand<'a, T> {
    View(MatView<'a, T>),
    Rows { data: &'a [T], starts: &'a [usize] },
}

type MicroFn = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// A micro-kernel reading B in place: as [`MicroFn`], with step `s`'s `nr` values at
/// `b + starts[s]` (the third and fourth arguments) instead of a packed panel.
type MicroRowsFn = unsafe fn(usize, *const f32, *const f32, *const usize, *mut f32, usize, bool);

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
    /// The same tile reading f32 B rows in place, where the kernel has that form.
    run_rows: Option<MicroRowsFn>,
    /// The kernel on half the tile's columns, where it has that form.
    half: Option<Half>,
}

/// A micro-kernel on the first `nr / 2` columns of its panels (packed B steps keep their
/// `nr` stride), for a last panel no wider: a full tile there computed columns that were
/// dropped (an eighth of a 3 x 3 convolution at 14 x 14).
#[derive(Clone, Copy)]
pub(crate) struct Half {
    run: MicroFn,
    /// With the kernel's `run_rows`: the same, reading B rows in place.
    run_rows: Option<MicroRowsFn>,
}

impl Micro {
    /// Packed steps for `kc` K indices.
    fn steps(&self, kc: usize) -> usize {
        if self.pairs { kc.div_ceil(2) } else { kc }
    }

    /// K indices per K block: [`driver::KC_STEPS`] steps.
    fn kc_max(&self) -> usize {
        if self.pairs {
            2 * driver::KC_STEPS
        } else {
            driver::KC_STEPS
        }
    }
}

/// The micro-kernel for a product whose inputs are bf16 values (bf16 data, or f32 rounded
/// to bf16): AVX512-BF16 dot products where AVX-512 is in force and the CPU runs them
/// faster than f32 FMAs (see [`crate::runtime::cpu::bf16_dot_speedup`]: on Intel cores without AMX
/// the values widened to f32 measured 1.55x faster at n = 2048), else [`micro_in_force`].
/// Chosen once per process, in [`crate::kernels::dispatch`].
pub(crate) fn micro_for_bf16_in_force() -> Micro {
    #[cfg(target_arch = "x86_64")]
    if crate::runtime::cpu::bf16_dots_pay() {
        return micro::x86::AVX512_BF16;
    }
    micro_in_force()
}

/// The micro-kernel for the CPU capability in force (chosen once per process, in
/// [`crate::kernels::dispatch`]).
pub(crate) fn micro_in_force() -> Micro {
    match crate::runtime::cpu::get_cpu_capability() {
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx512 => micro::x86::AVX512,
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx2 => micro::x86::AVX2,
        _ => micro::PORTABLE,
    }
}

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
    #[cfg(target_arch = "x86_64")]
    if skinny::kernel::<T>((m, n), (b.rs, b.cs), rounding).is_some() {
        return skinny::gemm(c, (m, n, k), a, b, threads);
    }
    #[cfg(target_arch = "x86_64")]
    if amx::kernel::<T>(rounding).is_some() && amx::gemm(c, (m, n, k), a, b, threads) {
        return;
    }
    driver::gemm_with(
        packed_micro::<T>(rounding),
        c,
        (m, n, k),
        a,
        b,
        rounding,
        threads,
    );
}

/// `A (m x k) · B (k x n)` plus `bias` (one per column) rounded once into `c`, a row-major
/// `m x n` matrix of `O` (bf16, f16), on the packed path with no f32 copy of C (see
/// `driver::gemm_narrow`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_narrowed<T: Element, O: Element>(
    c: &mut [O],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    bias: Option<&[f32]>,
    rounding: Rounding,
    threads: usize,
) {
    assert_eq!(c.len(), m * n, "the output holds m x n values");
    assert!(
        bias.is_none_or(|bias| bias.len() == n),
        "one bias per column"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        let zeros = vec![0.0; n];
        for row in c.chunks_exact_mut(n) {
            crate::kernels::convert::narrow_into(row, &zeros, bias);
        }
        return;
    }
    let mk = packed_micro::<T>(rounding);
    driver::gemm_narrow(mk, c, (m, n, k), a, b, bias, rounding, threads);
}

/// The packed path's micro-kernel for inputs `T` under `rounding`: the bf16 one where the
/// inputs are bf16 values (data, or f32 rounded to bf16), else the f32 one.
pub(crate) fn packed_micro<T: Element>(rounding: Rounding) -> Micro {
    if T::DTYPE == DType::Bf16 || rounding == Rounding::Bf16 {
        crate::kernels::dispatch::cpu_kernels().gemm_bf16
    } else {
        crate::kernels::dispatch::cpu_kernels().gemm
    }
}

/// `A (m x k) · B (k x n)` into `c` (row-major `m x n` f32) for a B given as rows of one
/// buffer ([`BOperand::Rows`]: `starts` holds `k` row starts, each followed by `n` values),
/// on the packed path with [`packed_micro`]'s kernel.
pub(crate) fn gemm_rows<T: Element>(
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    (data, starts): (&[T], &[usize]),
    rounding: Rounding,
    threads: usize,
) {
    assert!(
        c.len() == m * n && starts.len() == k,
        "the output holds m x n floats and B has k rows"
    );
    assert!(
        starts
            .iter()
            .all(|&s| s.checked_add(n).is_some_and(|end| end <= data.len())),
        "every row of B lies in its buffer"
    );
    if m == 0 || n == 0 || k == 0 {
        c.fill(0.0);
        return;
    }
    driver::gemm_rows(
        packed_micro::<T>(rounding),
        c,
        (m, n, k),
        a,
        (data, starts),
        rounding,
        threads,
    );
}

/// The kernel [`gemm`] runs for `m` rows of A against a B of `n` columns and strides `(rs, cs)` when it is
/// not the packed micro-kernel path: the skinny path's name, AMX's, or `None`.
pub(crate) fn special_kernel<T: Element>(
    (m, n): (usize, usize),
    strides: (usize, usize),
    rounding: Rounding,
) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    return skinny::kernel::<T>((m, n), strides, rounding).or_else(|| amx::kernel::<T>(rounding));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, n, strides, rounding);
        None
    }
}

/// `A · B` in f64 into `c`, a zeroed row-major `m x n` matrix, through faer's product
/// (its AVX-512/AVX2 f64 kernels), C split over `threads` along its longer side (its
/// columns as the rows of `Cᵀ = Bᵀ Aᵀ`).
pub(crate) fn gemm_f64(
    c: &mut [f64],
    m: usize,
    n: usize,
    k: usize,
    a: MatView<f64>,
    b: MatView<f64>,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let dst = faer::MatMut::from_row_major_slice_mut(c, m, n);
    let (mut dst, lhs, rhs) = if m >= n {
        (dst, a.faer(m, k), b.faer(k, n))
    } else {
        (
            dst.transpose_mut(),
            b.faer(k, n).transpose(),
            a.faer(m, k).transpose(),
        )
    };
    let step = dst.nrows().div_ceil(threads.max(1));
    let mut pieces = Vec::with_capacity(threads);
    let mut first = 0;
    while dst.nrows() > 0 {
        let rows = step.min(dst.nrows());
        let (piece, rest) = dst.split_at_row_mut(rows);
        pieces.push((first, piece));
        (dst, first) = (rest, first + rows);
    }
    crate::runtime::threads::for_each(pieces, &|(first, piece): (usize, faer::MatMut<f64>)| {
        let lhs = lhs.subrows(first, piece.nrows());
        faer::linalg::matmul::matmul(piece, faer::Accum::Add, lhs, rhs, 1.0, faer::Par::Seq);
    });
}

impl MatView<'_, f64> {
    /// The view's `rows x cols` matrix as faer's.
    fn faer(&self, rows: usize, cols: usize) -> faer::MatRef<'_, f64> {
        let last = (rows.max(1) - 1) * self.rs + (cols.max(1) - 1) * self.cs;
        // The caller's shapes and strides stay inside `data` (a broken view fails here).
        assert!(
            rows == 0 || cols == 0 || self.offset + last < self.data.len(),
            "a matrix view past its data"
        );
        let start = self.offset.min(self.data.len());
        // SAFETY: every element (i, j) of the view, at offset + i·rs + j·cs, lies inside
        // `data` (checked above), which outlives the returned view and is only read.
        unsafe {
            faer::MatRef::from_raw_parts(
                self.data[start..].as_ptr(),
                rows,
                cols,
                self.rs as isize,
                self.cs as isize,
            )
        }
    }
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

    /// The f64 product of row-major `a` (m x k) and `b` (k x n).
    fn product(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
        (0..m * n)
            .map(|e| (0..k).map(|p| a[e / n * k + p] * b[p * n + e % n]).sum())
            .collect()
    }

    /// ‖c − want‖ / ‖want‖.
    fn rel_err(c: &[f32], want: &[f64]) -> f64 {
        let diff: f64 = c
            .iter()
            .zip(want)
            .map(|(&x, y)| (f64::from(x) - y).powi(2))
            .sum();
        let norm: f64 = want.iter().map(|y| y * y).sum();
        (diff / norm).sqrt()
    }

    /// Every kernel a bf16 product can take on this CPU (the AVX512-BF16 dot products even
    /// where they are not chosen), against the exact product of the inputs rounded to bf16
    /// (to nearest even, as every kernel rounds them): only f32 accumulation error, far
    /// below the 4e-3 of rounding the inputs (a tie rounded another way would show as 1e-4
    /// over a short row).
    #[test]
    fn every_bf16_kernel_matches_the_product_of_the_rounded_inputs() {
        let mut kernels = vec![micro::PORTABLE, micro_in_force()];
        #[cfg(target_arch = "x86_64")]
        if crate::runtime::cpu::has_avx512_bf16()
            && crate::runtime::cpu::detected_cpu_capability() == CpuCapability::Avx512
        {
            kernels.push(micro::x86::AVX512_BF16);
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
            let want = product(&ra, &rb, (m, n, k));
            for mk in &kernels {
                let mut c = vec![f32::NAN; m * n];
                let view = |data, rs| MatView {
                    data,
                    offset: 0,
                    rs,
                    cs: 1,
                };
                driver::gemm_with(
                    *mk,
                    &mut c,
                    (m, n, k),
                    view(&a, k),
                    view(&b, n),
                    Rounding::Bf16,
                    2,
                );
                let err = rel_err(&c, &want);
                assert!(err < 1e-6, "{} {m}x{n}x{k}: {err}", mk.name);
                // The same B as rows at listed starts: stored last row first, a gap of 3
                // values after each.
                let mut data = vec![f32::NAN; k * (n + 3)];
                let starts: Vec<usize> = (0..k).map(|r| (k - 1 - r) * (n + 3)).collect();
                for (r, &start) in starts.iter().enumerate() {
                    data[start..start + n].copy_from_slice(&b[r * n..(r + 1) * n]);
                }
                let mut c = vec![f32::NAN; m * n];
                let rows = (&data[..], &starts[..]);
                driver::gemm_rows(*mk, &mut c, (m, n, k), view(&a, k), rows, Rounding::Bf16, 2);
                let err = rel_err(&c, &want);
                assert!(err < 1e-6, "rows {} {m}x{n}x{k}: {err}", mk.name);
            }
        }
    }

    /// Every f32 kernel this CPU runs, on products whose last panel is full, partial, half
    /// wide (the half-width kernels) or narrower, in one K block or two, with B as a matrix
    /// and as rows of one buffer (read in place where the rows have a panel's width of
    /// values from a column on, else packed), against the f64 product.
    #[test]
    fn every_f32_kernel_matches_the_product_at_every_edge() {
        let mut kernels = vec![micro::PORTABLE, micro_in_force()];
        #[cfg(target_arch = "x86_64")]
        if matches!(
            crate::runtime::cpu::detected_cpu_capability(),
            CpuCapability::Avx2 | CpuCapability::Avx512
        ) {
            kernels.push(micro::x86::AVX2);
        }
        let values = |len: usize, salt: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + salt * 104_729) % 2000) as f32 / 1000.0 - 1.0)
                .collect()
        };
        fn view(data: &[f32], rs: usize) -> MatView<'_, f32> {
            MatView {
                data,
                offset: 0,
                rs,
                cs: 1,
            }
        }
        for (m, n, k) in [
            (6, 32, 5),
            (7, 8, 9),
            (12, 33, 3),
            (5, 96, 600),
            (13, 100, 513),
        ] {
            let (a, b) = (values(m * k, m), values(k * n, n));
            let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
            let want = product(&wide(&a), &wide(&b), (m, n, k));
            for mk in &kernels {
                let mut c = vec![f32::NAN; m * n];
                let b_view = view(&b, n);
                driver::gemm_with(
                    *mk,
                    &mut c,
                    (m, n, k),
                    view(&a, k),
                    b_view,
                    Rounding::None,
                    2,
                );
                let err = rel_err(&c, &want);
                assert!(err < 1e-6, "{} {m}x{n}x{k}: {err}", mk.name);
                // B's rows stored last row first with `gap` values after each: 3 leaves the
                // last panel packed, a panel's width reads every panel in place.
                for gap in [3, 64] {
                    let mut data = vec![f32::NAN; k * (n + gap)];
                    let starts: Vec<usize> = (0..k).map(|r| (k - 1 - r) * (n + gap)).collect();
                    for (r, &start) in starts.iter().enumerate() {
                        data[start..start + n].copy_from_slice(&b[r * n..(r + 1) * n]);
                    }
                    let mut c = vec![f32::NAN; m * n];
                    let rows = (&data[..], &starts[..]);
                    driver::gemm_rows(*mk, &mut c, (m, n, k), view(&a, k), rows, Rounding::None, 2);
                    let err = rel_err(&c, &want);
                    assert!(err < 1e-6, "rows {} gap {gap} {m}x{n}x{k}: {err}", mk.name);
                }
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
        let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        let want = product(&wide(&a), &wide(&b), (m, n, k));
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
            assert!(rel_err(&c, &want) < 1e-5);
        }
    }
}
