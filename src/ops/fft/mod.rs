//! Discrete Fourier transforms (`torch.fft`'s `fft`, `ifft`, `rfft`, `irfft`, `fft2`,
//! `ifft2`) over the last dimension (two for the 2-D forms), with their plans kept in the
//! per-device LRU [`PlanCache`] of `torch.backends.cuda.cufft_plan_cache`.
//!
//! Complex tensors are stored as PyTorch's `view_as_real` shows them: a trailing dimension
//! of 2 holding the real and imaginary parts. Results have the input's dtype; f64 is
//! transformed in f64 and every other float dtype in f32, as PyTorch does. Normalisation is
//! PyTorch's default ("backward"): the inverse transforms divide by the length.
//!
//! The CPU runs `rustfft` and `realfft` (`fft/host.rs`: SIMD mixed radix for every length,
//! real transforms at half the complex cost, batches over the thread pool). CUDA tensors
//! (f32 and f64) go through cuFFT when it loads (`fft/cufft.rs`), its plans cached with
//! the device the same way. wgpu tensors have no FFT: move them to the CPU.

#[cfg(feature = "cuda")]
mod cufft;
mod host;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::runtime::cuda::device::CudaDevice;

use crate::core::tensor::{checked_numel, host_filled};
use crate::{DType, Device, Error, Result, Tensor};

/// Host buffers here are sized by the caller's lengths (irfft's `n` above all): they are
/// allocated fallibly, so a length too long for the machine is [`Error::OutOfMemory`].
const OP: &str = "fft";

/// What a transform is: its direction and whether one side is real.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Complex to complex, forward.
    Forward,
    /// Complex to complex, inverse.
    Inverse,
    /// Real to half-spectrum.
    RealForward,
    /// Half-spectrum to real.
    RealInverse,
}

/// Everything that shapes a plan, as cuFFT plans are keyed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// The signal sizes (one per transformed dimension).
    pub sizes: Vec<usize>,
    /// How many signals one call transforms.
    pub batch: usize,
    /// The element type.
    pub dtype: DType,
    /// The direction.
    pub direction: Direction,
    /// The input's strides.
    pub strides: Vec<usize>,
}

/// The default capacity of a plan cache (PyTorch's).
pub const DEFAULT_MAX_SIZE: usize = 4096;

/// What one cache entry holds: the device's plan type (host kernels, one per transformed
/// dimension, on the CPU; a cuFFT plan on CUDA).
type Plans = Arc<dyn Any + Send + Sync>;

struct CacheState {
    max_size: usize,
    tick: u64,
    /// Each key's plans and the tick of their last use.
    plans: HashMap<PlanKey, (Plans, u64)>,
}

/// A thread-safe LRU cache of FFT plans for one device.
pub struct PlanCache {
    state: Mutex<CacheState>,
}

impl Default for PlanCache {
    fn default() -> Self {
        PlanCache::new()
    }
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("size", &self.size())
            .field("max_size", &self.max_size())
            .finish()
    }
}

impl PlanCache {
    /// An empty cache holding at most [`DEFAULT_MAX_SIZE`] plans.
    pub fn new() -> PlanCache {
        PlanCache {
            state: Mutex::new(CacheState {
                max_size: DEFAULT_MAX_SIZE,
                tick: 0,
                plans: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many plans it holds.
    pub fn size(&self) -> usize {
        self.lock().plans.len()
    }

    /// The most plans it holds.
    pub fn max_size(&self) -> usize {
        self.lock().max_size
    }

    /// Sets the capacity; lowering it below [`PlanCache::size`] evicts the least recently
    /// used plans at once.
    pub fn set_max_size(&self, max_size: usize) {
        let mut state = self.lock();
        state.max_size = max_size;
        evict(&mut state);
    }

    /// Drops every plan.
    pub fn clear(&self) {
        self.lock().plans.clear();
    }

    /// Whether a plan for `key` is cached (without touching its recency).
    pub fn contains(&self, key: &PlanKey) -> bool {
        self.lock().plans.contains_key(key)
    }

    /// The plans for `key` (of the device's plan type `T`), built by `make` on a miss.
    fn get<T: Any + Send + Sync>(
        &self,
        key: PlanKey,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            if let Some((plans, used)) = state.plans.get_mut(&key)
                && let Ok(plans) = plans.clone().downcast::<T>()
            {
                *used = tick;
                return Ok(plans);
            }
        }
        // Built outside the lock: other threads keep using the cache meanwhile.
        let plans = Arc::new(make()?);
        let mut state = self.lock();
        if state.max_size > 0 {
            let tick = state.tick;
            state.plans.insert(key, (plans.clone(), tick));
            evict(&mut state);
        }
        Ok(plans)
    }
}

fn evict(state: &mut CacheState) {
    while state.plans.len() > state.max_size {
        let oldest = state
            .plans
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| k.clone())
            .expect("a cache over capacity has an entry");
        state.plans.remove(&oldest);
    }
}

/// The plan cache of `device`: the process's for the CPU, and for a CUDA device the one
/// kept with that device (`CudaDevice::state`, created on first use). wgpu devices have no
/// FFT, hence no cache, and a CUDA ordinal that is not present is an error.
pub fn plan_cache(device: Device) -> Result<&'static PlanCache> {
    static HOST: LazyLock<PlanCache> = LazyLock::new(PlanCache::new);
    match device {
        Device::Cpu => Ok(&HOST),
        Device::Cuda(ordinal) => Ok(CudaDevice::get(ordinal)?.state::<PlanCache>()),
        Device::Wgpu(_) => Err(no_fft_on(device)),
    }
}

/// Why a device has no FFT.
fn no_fft_on(device: Device) -> Error {
    Error::Unavailable {
        what: "FFTs here",
        why: format!(
            "FFTs run on the CPU and on CUDA (cuFFT); move the tensor to one ({device} given)"
        ),
    }
}

fn fft_error(op: &'static str, detail: String) -> Error {
    Error::ShapeMismatch { op, detail }
}

/// Checks that `x` is a float complex tensor stored as `[..., n (x dims), 2]`, with no
/// transformed dimension of length 0.
fn check_complex(op: &'static str, x: &Tensor, dims: usize) -> Result<()> {
    let s = x.shape();
    if s.len() < dims + 1 || s[s.len() - 1] != 2 {
        return Err(fft_error(
            op,
            format!(
                "expected a complex tensor stored as [..., {}2] (real and imaginary parts last); got {s:?}",
                "n, ".repeat(dims)
            ),
        ));
    }
    check_lengths(op, &s[s.len() - 1 - dims..s.len() - 1])?;
    float(op, x)
}

/// PyTorch's error for a transform over a dimension of length 0.
fn check_lengths(op: &'static str, lengths: &[usize]) -> Result<()> {
    if lengths.contains(&0) {
        return Err(fft_error(
            op,
            format!(
                "Invalid number of data points (0) specified: the transformed dimensions {lengths:?} \
                 must each hold at least one point"
            ),
        ));
    }
    Ok(())
}

fn float(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: x.dtype(),
        })
    }
}

/// Where an FFT of `x` runs.
enum Place {
    Host,
    Cuda(usize),
}

fn place(x: &Tensor) -> Result<Place> {
    match x.device() {
        Device::Cpu => Ok(Place::Host),
        Device::Cuda(ordinal) => Ok(Place::Cuda(ordinal)),
        other => Err(no_fft_on(other)),
    }
}

/// A transform of CUDA tensor `x` through cuFFT (see `cufft::transform`); unreached in
/// builds without `cuda`, which have no CUDA tensors.
fn on_cuda(
    op: &'static str,
    ordinal: usize,
    x: &Tensor,
    direction: Direction,
    io: (Vec<usize>, Vec<usize>),
    input: Option<Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    return cufft::transform(op, ordinal, x, direction, io, input);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, x, direction, io, input);
        Err(Error::Unavailable {
            what: op,
            why: "this build has no cuFFT bindings: build with the `cuda` feature".into(),
        })
    }
}

fn complex(op: &'static str, x: &Tensor, dims: usize, direction: Direction) -> Result<Tensor> {
    let place = place(x)?;
    check_complex(op, x, dims)?;
    if let Place::Cuda(ordinal) = place {
        let s = x.shape();
        let sizes = s[s.len() - 1 - dims..s.len() - 1].to_vec();
        return on_cuda(op, ordinal, x, direction, (sizes, s.to_vec()), None);
    }
    if x.dtype() == DType::F64 {
        host::complex_transform::<f64>(x, dims, direction)
    } else {
        host::complex_transform::<f32>(x, dims, direction)
    }
}

/// The DFT over the last dimension of a complex `[..., n, 2]` tensor.
pub fn fft(x: &Tensor) -> Result<Tensor> {
    complex("fft", x, 1, Direction::Forward)
}

/// The inverse DFT (divided by n) over the last dimension of a complex `[..., n, 2]` tensor.
pub fn ifft(x: &Tensor) -> Result<Tensor> {
    complex("ifft", x, 1, Direction::Inverse)
}

/// The 2-D DFT over the last two dimensions of a complex `[..., h, w, 2]` tensor.
pub fn fft2(x: &Tensor) -> Result<Tensor> {
    complex("fft2", x, 2, Direction::Forward)
}

/// The inverse 2-D DFT (divided by h·w) of a complex `[..., h, w, 2]` tensor.
pub fn ifft2(x: &Tensor) -> Result<Tensor> {
    complex("ifft2", x, 2, Direction::Inverse)
}

/// The DFT of a real `[..., n]` tensor: its first `n / 2 + 1` coefficients as a complex
/// `[..., n / 2 + 1, 2]` tensor (the rest follow by symmetry).
pub fn rfft(x: &Tensor) -> Result<Tensor> {
    let place = place(x)?;
    float("rfft", x)?;
    let Some(&n) = x.shape().last() else {
        return Err(fft_error(
            "rfft",
            "a 0-D tensor has no dimension to transform".into(),
        ));
    };
    check_lengths("rfft", &[n])?;
    match place {
        Place::Host => {}
        Place::Cuda(ordinal) => {
            let mut out_shape = x.shape().to_vec();
            *out_shape.last_mut().expect("rank checked") = n / 2 + 1;
            out_shape.push(2);
            let io = (vec![n], out_shape);
            return on_cuda("rfft", ordinal, x, Direction::RealForward, io, None);
        }
    }
    if x.dtype() == DType::F64 {
        host::real_forward::<f64>(x, n)
    } else {
        host::real_forward::<f32>(x, n)
    }
}

/// The real signal of length `n` (default `2 (m - 1)`) whose DFT starts with the complex
/// `[..., m, 2]` half-spectrum `x`, as a real `[..., n]` tensor (divided by n).
pub fn irfft(x: &Tensor, n: Option<usize>) -> Result<Tensor> {
    let place = place(x)?;
    check_complex("irfft", x, 1)?;
    let shape = &x.shape()[..x.shape().len() - 1];
    let m = *shape.last().expect("rank checked");
    let n = n.unwrap_or(2 * m.saturating_sub(1));
    if n == 0 {
        return Err(fft_error(
            "irfft",
            format!("the output length is 0 (half-spectrum of {m}); pass n ≥ 1"),
        ));
    }
    let mut out_shape = shape.to_vec();
    *out_shape.last_mut().expect("rank checked") = n;
    // n is the caller's: the result must fit the address space and the memory.
    checked_numel("irfft", &out_shape, x.dtype())?;
    // The n / 2 + 1 coefficients each line's transform reads: the given ones, trimmed or
    // zero-padded (Hermitian symmetry gives the rest), as (real, imaginary) pairs. The
    // imaginary parts of X[0] and (even n) X[n/2] do not take part, as in PyTorch.
    let width = n / 2 + 1;
    let values = x.to_f64()?;
    let lines = values.len() / (2 * m);
    let mut half = host_filled("irfft", lines * width * 2, 0.0)?;
    for (line, spectrum) in half
        .chunks_exact_mut(2 * width)
        .zip(values.chunks_exact(2 * m))
    {
        let kept = 2 * width.min(m);
        line[..kept].copy_from_slice(&spectrum[..kept]);
        line[1] = 0.0;
        if n.is_multiple_of(2) {
            line[2 * (n / 2) + 1] = 0.0;
        }
    }
    if let Place::Cuda(ordinal) = place {
        // cuFFT's C2R reads the n / 2 + 1 coefficients prepared above.
        let mut half_shape = out_shape.clone();
        *half_shape.last_mut().expect("rank checked") = width;
        half_shape.push(2);
        let prepared = Tensor::from_f64(&half, &half_shape, x.dtype(), x.device())?;
        let io = (vec![n], out_shape);
        return on_cuda(
            "irfft",
            ordinal,
            x,
            Direction::RealInverse,
            io,
            Some(prepared),
        );
    }
    if x.dtype() == DType::F64 {
        host::real_inverse::<f64>(x, &half, n, &out_shape)
    } else {
        host::real_inverse::<f32>(x, &half, n, &out_shape)
    }
}
