//! The CPU's transforms, through `rustfft` (SIMD mixed-radix, Rader and Bluestein for every
//! length) and `realfft` (real-input transforms at half the complex cost). f64 tensors
//! are transformed in f64, every other float dtype in f32. Batches of signals are spread
//! over the thread pool; plans live in the CPU's [`super::PlanCache`].

use std::sync::Arc;

use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftNum, FftPlanner};

use super::{Direction, OP, PlanKey, plan_cache};
use crate::core::tensor::host_filled;
use crate::runtime::threads::{for_each, get_num_threads};
use crate::{DType, Device, Error, Result, Tensor};

/// Elements below which a transform runs on the calling thread alone.
const PARALLEL_ABOVE: usize = 1 << 15;

/// A float the host transforms run in, with the conversions from and to tensors.
pub(super) trait Real: FftNum + Default + bytemuck::Pod
where
    Complex<Self>: bytemuck::Pod,
{
    /// The tensor's elements as this type (f16/bf16 widened), row-major.
    fn load(x: &Tensor) -> Result<Vec<Self>>;
    /// A tensor of `dtype` holding `values`.
    fn store(values: Vec<Self>, shape: &[usize], dtype: DType) -> Result<Tensor>;
}

impl Real for f32 {
    fn load(x: &Tensor) -> Result<Vec<f32>> {
        match x.dtype() {
            DType::F32 => x.to_vec::<f32>(),
            _ => Ok(x.to_f64()?.into_iter().map(|v| v as f32).collect()),
        }
    }

    fn store(values: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::F32 => Tensor::from_vec(values, shape, Device::Cpu),
            _ => {
                let wide: Vec<f64> = values.into_iter().map(f64::from).collect();
                Tensor::from_f64(&wide, shape, dtype, Device::Cpu)
            }
        }
    }
}

impl Real for f64 {
    fn load(x: &Tensor) -> Result<Vec<f64>> {
        x.to_f64()
    }

    fn store(values: Vec<f64>, shape: &[usize], _: DType) -> Result<Tensor> {
        Tensor::from_vec(values, shape, Device::Cpu)
    }
}

/// Lines per thread's run for `lines` lines of `line` elements: one run where the work is
/// small, else one per thread.
fn lines_per_run(lines: usize, line: usize) -> usize {
    let threads = if lines * line < PARALLEL_ABOVE {
        1
    } else {
        get_num_threads().min(lines).max(1)
    };
    lines.div_ceil(threads).max(1)
}

/// Runs `plan` over every line of `data` in place, spread over the pool.
fn lines<T: Real>(plan: &Arc<dyn Fft<T>>, data: &mut [Complex<T>]) -> Result<()>
where
    Complex<T>: bytemuck::Pod,
{
    let scratch_len = plan.get_inplace_scratch_len();
    let failed = std::sync::atomic::AtomicBool::new(false);
    let n = plan.len();
    for_each(
        data.chunks_mut(lines_per_run(data.len() / n, n) * n)
            .collect(),
        &|run: &mut [Complex<T>]| match host_filled(OP, scratch_len, Complex::default()) {
            Ok(mut scratch) => plan.process_with_scratch(run, &mut scratch),
            Err(_) => failed.store(true, std::sync::atomic::Ordering::Relaxed),
        },
    );
    if failed.into_inner() {
        return Err(Error::OutOfMemory {
            device: Device::Cpu,
            bytes: (scratch_len * std::mem::size_of::<Complex<T>>()) as u64,
            why: format!("{OP}: the scratch of a transform of {}", plan.len()),
        });
    }
    Ok(())
}

/// Columns moved through the column pass at a time: 32 complex f32 are one 256-byte
/// stretch of each row (four cache lines), read and written whole (16 and 64 measured
/// slower on `fft2 [8, 256, 256]`).
const COLUMN_BLOCK: usize = 32;

/// Rows of a column block gathered (and scattered) together: 8 complex f32 are one cache
/// line of the block.
const TILE_ROWS: usize = 8;

/// Runs `plan` (length `rows`) down every column of each `rows x cols` matrix of `data`:
/// blocks of columns are gathered into contiguous lines, transformed and scattered back;
/// the matrices are spread over the pool.
fn columns<T: Real>(
    plan: &Arc<dyn Fft<T>>,
    data: &mut [Complex<T>],
    (rows, cols): (usize, usize),
) -> Result<()>
where
    Complex<T>: bytemuck::Pod,
{
    let scratch_len = plan.get_inplace_scratch_len();
    let failed = std::sync::atomic::AtomicBool::new(false);
    let matrices: Vec<&mut [Complex<T>]> = data.chunks_mut(rows * cols).collect();
    for_each(matrices, &|matrix: &mut [Complex<T>]| {
        let (Ok(mut block), Ok(mut scratch)) = (
            host_filled(OP, COLUMN_BLOCK * rows, Complex::default()),
            host_filled(OP, scratch_len, Complex::default()),
        ) else {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        for c0 in (0..cols).step_by(COLUMN_BLOCK) {
            let width = COLUMN_BLOCK.min(cols - c0);
            // In tiles of rows, so that each line of the block is written (and read back)
            // a whole cache line at a time.
            for r0 in (0..rows).step_by(TILE_ROWS) {
                let tile = r0..(r0 + TILE_ROWS).min(rows);
                for c in 0..width {
                    for r in tile.clone() {
                        block[c * rows + r] = matrix[r * cols + c0 + c];
                    }
                }
            }
            plan.process_with_scratch(&mut block[..width * rows], &mut scratch);
            for r0 in (0..rows).step_by(TILE_ROWS) {
                let tile = r0..(r0 + TILE_ROWS).min(rows);
                for c in 0..width {
                    for r in tile.clone() {
                        matrix[r * cols + c0 + c] = block[c * rows + r];
                    }
                }
            }
        }
    });
    if failed.into_inner() {
        return Err(Error::OutOfMemory {
            device: Device::Cpu,
            bytes: ((scratch_len + COLUMN_BLOCK * rows) * std::mem::size_of::<Complex<T>>()) as u64,
            why: format!("{OP}: the scratch of a column transform of {rows}"),
        });
    }
    Ok(())
}

/// The complex transform of the last `dims` dimensions of `x` (stored `[..., 2]`), in `T`,
/// multiplied by `scale` (the normalisation).
pub(super) fn complex_transform<T: Real>(
    x: &Tensor,
    dims: usize,
    direction: Direction,
    scale: f64,
) -> Result<Tensor>
where
    Complex<T>: bytemuck::Pod,
{
    let shape = &x.shape()[..x.shape().len() - 1];
    let sizes = shape[shape.len() - dims..].to_vec();
    // The (real, imaginary) pairs, transformed in place as complex numbers.
    let mut values = T::load(x)?;
    // No signal (a batch of 0): nothing to plan, however long the other dimensions are.
    if values.is_empty() {
        return T::store(values, x.shape(), x.dtype());
    }
    let data: &mut [Complex<T>] = bytemuck::cast_slice_mut(&mut values);
    let inverse = direction == Direction::Inverse;
    let key = PlanKey {
        batch: shape[..shape.len() - dims].iter().product(),
        sizes: sizes.clone(),
        dtype: x.dtype(),
        direction,
        strides: x.strides().to_vec(),
    };
    let plans = plan_cache(Device::Cpu)?.get(key, || {
        crate::core::verbose::creation_event(|| format!("fft plan {sizes:?} {direction:?}"));
        let mut planner = FftPlanner::<T>::new();
        Ok(sizes
            .iter()
            .map(|&n| {
                if inverse {
                    planner.plan_fft_inverse(n)
                } else {
                    planner.plan_fft_forward(n)
                }
            })
            .collect::<Vec<_>>())
    })?;
    // The last dimension's lines are contiguous; the one before it (2-D) is transformed
    // down the columns of each [n, inner] matrix.
    for (d, plan) in plans.iter().enumerate().rev() {
        let inner: usize = sizes[d + 1..].iter().product();
        if inner == 1 {
            lines(plan, data)?;
        } else {
            columns(plan, data, (sizes[d], inner))?;
        }
    }
    scaled(&mut values, scale);
    T::store(values, x.shape(), x.dtype())
}

/// `values *= scale` (nothing to do for 1).
fn scaled<T: Real>(values: &mut [T], scale: f64) {
    if scale != 1.0 {
        let scale = T::from_f64(scale).unwrap_or_default();
        values.iter_mut().for_each(|v| *v = *v * scale);
    }
}

/// The first `n / 2 + 1` DFT coefficients of each length-`n` line of real `x`, multiplied
/// by `scale`.
pub(super) fn real_forward<T: Real>(x: &Tensor, n: usize, scale: f64) -> Result<Tensor>
where
    Complex<T>: bytemuck::Pod,
{
    let mut data = T::load(x)?;
    let half = n / 2 + 1;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = half;
    shape.push(2);
    let lines_count = data.len() / n;
    let mut out_values = host_filled(OP, lines_count * half * 2, T::zero())?;
    let out: &mut [Complex<T>] = bytemuck::cast_slice_mut(&mut out_values);
    if lines_count > 0 {
        let key = PlanKey {
            sizes: vec![n],
            batch: lines_count,
            dtype: x.dtype(),
            direction: Direction::RealForward,
            strides: x.strides().to_vec(),
        };
        let plan: Arc<Arc<dyn RealToComplex<T>>> = plan_cache(Device::Cpu)?.get(key, || {
            crate::core::verbose::creation_event(|| format!("fft plan [{n}] RealForward"));
            Ok(RealFftPlanner::<T>::new().plan_fft_forward(n))
        })?;
        let per = lines_per_run(lines_count, n);
        let work: Vec<_> = data
            .chunks_mut(per * n)
            .zip(out.chunks_mut(per * half))
            .collect();
        for_each(work, &|(input, output): (&mut [T], &mut [Complex<T>])| {
            let mut scratch = plan.make_scratch_vec();
            for (line, spectrum) in input.chunks_exact_mut(n).zip(output.chunks_exact_mut(half)) {
                plan.process_with_scratch(line, spectrum, &mut scratch)
                    .expect("lengths match the plan");
            }
        });
    }
    scaled(&mut out_values, scale);
    T::store(out_values, &shape, x.dtype())
}

/// The real length-`n` signals (multiplied by `scale`) of the half-spectra `half`
/// (`n / 2 + 1` coefficients per line as (real, imaginary) pairs, edge imaginary parts 0),
/// shaped `out_shape`.
pub(super) fn real_inverse<T: Real>(
    x: &Tensor,
    half: &[f64],
    (n, scale): (usize, f64),
    out_shape: &[usize],
) -> Result<Tensor>
where
    Complex<T>: bytemuck::Pod,
{
    let mut spectra: Vec<Complex<T>> = host_filled(OP, half.len() / 2, Complex::default())?;
    for (c, p) in spectra.iter_mut().zip(half.chunks_exact(2)) {
        let float = |v: f64| T::from_f64(v).unwrap_or_default();
        *c = Complex::new(float(p[0]), float(p[1]));
    }
    let width = n / 2 + 1;
    let lines_count = spectra.len() / width;
    let mut out = host_filled(OP, lines_count * n, T::zero())?;
    if lines_count > 0 {
        let key = PlanKey {
            sizes: vec![n],
            batch: lines_count,
            dtype: x.dtype(),
            direction: Direction::RealInverse,
            strides: x.strides().to_vec(),
        };
        let plan: Arc<Arc<dyn ComplexToReal<T>>> = plan_cache(Device::Cpu)?.get(key, || {
            crate::core::verbose::creation_event(|| format!("fft plan [{n}] RealInverse"));
            Ok(RealFftPlanner::<T>::new().plan_fft_inverse(n))
        })?;
        let scale = T::from_f64(scale).unwrap_or_default();
        let per = lines_per_run(lines_count, width);
        let work: Vec<_> = spectra
            .chunks_mut(per * width)
            .zip(out.chunks_mut(per * n))
            .collect();
        for_each(work, &|(input, output): (&mut [Complex<T>], &mut [T])| {
            let mut scratch = plan.make_scratch_vec();
            for (spectrum, line) in input
                .chunks_exact_mut(width)
                .zip(output.chunks_exact_mut(n))
            {
                // The edge imaginary parts were zeroed by the caller, as the plan requires.
                plan.process_with_scratch(spectrum, line, &mut scratch)
                    .expect("lengths and edge coefficients match the plan");
                line.iter_mut().for_each(|v| *v = *v * scale);
            }
        });
    }
    T::store(out, out_shape, x.dtype())
}
