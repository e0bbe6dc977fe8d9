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
use crate::kernels::transpose::{transpose, transpose_on};
use crate::runtime::threads::{for_each, get_num_threads, try_for_each};
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
            DType::F32 => x.contiguous()?.into_vec::<f32>(),
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
        x.contiguous()?.into_vec::<f64>()
    }

    fn store(values: Vec<f64>, shape: &[usize], _: DType) -> Result<Tensor> {
        Tensor::from_vec(values, shape, Device::Cpu)
    }
}

/// Runs of work each thread gets, about, where work is shared over the pool: a thread
/// that starts late, or runs slower, takes fewer.
const RUNS_PER_THREAD: usize = 4;

/// Items (lines, or whole signals) per run for `count` items of `len` elements each: one
/// run where the work is small, else [`RUNS_PER_THREAD`] per thread.
fn per_run(count: usize, len: usize) -> usize {
    if count * len < PARALLEL_ABOVE {
        return count.max(1);
    }
    count.div_ceil(RUNS_PER_THREAD * get_num_threads()).max(1)
}

/// Runs `plan` over every line of `data` in place, spread over the pool.
fn lines<T: Real>(plan: &Arc<dyn Fft<T>>, data: &mut [Complex<T>]) -> Result<()>
where
    Complex<T>: bytemuck::Pod,
{
    let scratch_len = plan.get_inplace_scratch_len();
    let n = plan.len();
    try_for_each(
        data.chunks_mut(per_run(data.len() / n, n) * n).collect(),
        &|run: &mut [Complex<T>]| {
            let mut scratch = host_filled(OP, scratch_len, Complex::default()).map_err(|_| {
                out_of_memory::<T>(scratch_len, &format!("the scratch of a transform of {n}"))
            })?;
            plan.process_with_scratch(run, &mut scratch);
            Ok(())
        },
    )
}

/// The error for `len` complex values of working room a transform could not allocate.
fn out_of_memory<T>(len: usize, what: &str) -> Error {
    Error::OutOfMemory {
        device: Device::Cpu,
        bytes: (len as u64).saturating_mul(2 * std::mem::size_of::<T>() as u64),
        why: format!("{OP}: {what}"),
    }
}

/// Columns moved through a column pass at a time: 32 complex f32 are one 256-byte stretch
/// of each row (four cache lines), read and written whole (16 and 64 measured slower on
/// `fft2 [8, 256, 256]`).
const COLUMN_BLOCK: usize = 32;

/// Values a column block's lines are apart beyond their length (one cache line of complex
/// f32): lines of a power-of-two length, back to back, fall in few cache sets, and writing
/// them in transposed tiles ran 8% slower on `fft2 [8, 256, 256]` (AMD EPYC VM).
const LINE_PADDING: usize = 8;

/// A thread's working room for every pass of a signal: a block of columns as lines, and
/// the plans' scratch.
struct Room<T> {
    block: Vec<Complex<T>>,
    scratch: Vec<Complex<T>>,
}

impl<T: Real> Room<T>
where
    Complex<T>: bytemuck::Pod,
{
    /// Room for the passes of `plans` (one per dimension of `sizes`).
    fn new(plans: &[Arc<dyn Fft<T>>], sizes: &[usize]) -> Result<Self> {
        let column = sizes[..sizes.len() - 1].iter().max().copied().unwrap_or(0);
        let scratch = plans.iter().map(|p| p.get_inplace_scratch_len()).max();
        Ok(Room {
            block: host_filled(
                OP,
                COLUMN_BLOCK * (column + LINE_PADDING),
                Complex::default(),
            )?,
            scratch: host_filled(OP, scratch.unwrap_or(0), Complex::default())?,
        })
    }

    /// Every pass of each signal of `data` (row-major `sizes`, one after another), last
    /// dimension first, on this thread: a signal stays in cache through its passes.
    fn signals(&mut self, plans: &[Arc<dyn Fft<T>>], sizes: &[usize], data: &mut [Complex<T>]) {
        let len: usize = sizes.iter().product();
        for signal in data.chunks_exact_mut(len) {
            for (d, plan) in plans.iter().enumerate().rev() {
                let inner: usize = sizes[d + 1..].iter().product();
                if inner == 1 {
                    plan.process_with_scratch(signal, &mut self.scratch);
                } else {
                    self.columns(plan, signal, (sizes[d], inner));
                }
            }
        }
    }

    /// Runs `plan` (length `rows`) down every column of each `rows x cols` matrix of
    /// `data`: blocks of columns are transposed into contiguous lines, transformed and
    /// transposed back.
    fn columns(
        &mut self,
        plan: &Arc<dyn Fft<T>>,
        data: &mut [Complex<T>],
        (rows, cols): (usize, usize),
    ) {
        for matrix in data.chunks_exact_mut(rows * cols) {
            for c0 in (0..cols).step_by(COLUMN_BLOCK) {
                let width = COLUMN_BLOCK.min(cols - c0);
                let stride = rows + LINE_PADDING;
                let block = &mut self.block[..width * stride];
                transpose((&matrix[c0..], cols), (block, stride), (rows, width));
                for line in block.chunks_mut(stride) {
                    plan.process_with_scratch(&mut line[..rows], &mut self.scratch);
                }
                transpose((block, stride), (&mut matrix[c0..], cols), (width, rows));
            }
        }
    }
}

/// Runs `plan` (length `rows`) down every column of each `rows x cols` matrix of `data`,
/// for matrices too few to give every thread its own: each is transposed into a buffer
/// (its columns become lines), the lines transformed and transposed back, every step
/// spread over the pool.
fn shared_columns<T: Real>(
    plan: &Arc<dyn Fft<T>>,
    data: &mut [Complex<T>],
    (rows, cols): (usize, usize),
) -> Result<()>
where
    Complex<T>: bytemuck::Pod,
{
    let mut lined = host_filled(OP, data.len(), Complex::default())
        .map_err(|_| out_of_memory::<T>(data.len(), "the columns of a transform as lines"))?;
    let threads = get_num_threads();
    let size = rows * cols;
    for (matrix, lines) in data.chunks_exact(size).zip(lined.chunks_exact_mut(size)) {
        transpose_on(threads, (matrix, cols), (rows, cols), lines);
    }
    lines(plan, &mut lined)?;
    for (matrix, lines) in data.chunks_exact_mut(size).zip(lined.chunks_exact(size)) {
        transpose_on(threads, (lines, rows), (cols, rows), matrix);
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
    let len: usize = sizes.iter().product();
    let signals = data.len() / len;
    let threads = if data.len() < PARALLEL_ABOVE {
        1
    } else {
        get_num_threads()
    };
    if dims > 1 && signals >= threads {
        // Whole signals per run: each one's passes run while it is in cache.
        let per = per_run(signals, len);
        // A run whose room could not be allocated leaves its error (with its exact size).
        try_for_each(data.chunks_mut(per * len).collect(), &|run| {
            Room::new(&plans, &sizes).map(|mut room| room.signals(&plans, &sizes, run))
        })?;
    } else {
        // Lines, or few large signals: each pass over all of them, spread over the pool.
        // The last dimension's lines are contiguous; each other one is transformed down the
        // columns of the [n, inner] matrices it makes.
        for (d, plan) in plans.iter().enumerate().rev() {
            let inner: usize = sizes[d + 1..].iter().product();
            if inner == 1 {
                lines(plan, data)?;
            } else {
                shared_columns(plan, data, (sizes[d], inner))?;
            }
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
        let per = per_run(lines_count, n);
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
        let per = per_run(lines_count, width);
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
