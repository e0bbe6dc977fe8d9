//! Discrete Fourier transforms (`torch.fft`'s `fft`, `ifft`, `rfft`, `irfft`, `fft2`,
//! `ifft2`, `fftn`, `ifftn`, `rfft2`, `irfft2`, `rfftn`, `irfftn`), with their plans kept
//! in the per-device LRU [`PlanCache`] of
//! `torch.backends.cuda.cufft_plan_cache`. The plain forms transform the last dimension
//! (two for the 2-D forms) with PyTorch's default normalisation ("backward": the inverse
//! transforms divide by the length); the `*_with` forms and the n-D ones take PyTorch's
//! other arguments as [`FftArgs`]: signal sizes (`n` / `s`: trimmed or zero-padded), any
//! dimensions (`dim`) and [`Norm`] (`"backward"`, `"ortho"`, `"forward"`).
//!
//! Complex tensors are stored as PyTorch's `view_as_real` shows them: a trailing dimension
//! of 2 holding the real and imaginary parts (the `dim` of a complex tensor counts the
//! dimensions before it). Results have the input's dtype; f64 is transformed in f64 and
//! every other float dtype in f32, as PyTorch does.
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

/// Checks that `x` is a float complex tensor stored as `[..., n, 2]`.
fn check_complex(op: &'static str, x: &Tensor) -> Result<()> {
    let s = x.shape();
    if s.len() < 2 || s[s.len() - 1] != 2 {
        return Err(fft_error(
            op,
            format!(
                "expected a complex tensor stored as [..., n, 2] (real and imaginary parts last); got {s:?}"
            ),
        ));
    }
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
    scale: f64,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    return cufft::transform(op, ordinal, x, direction, io, input, scale);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, x, direction, io, input, scale);
        Err(Error::Unavailable {
            what: op,
            why: "this build has no cuFFT bindings: build with the `cuda` feature".into(),
        })
    }
}

/// How a transform is normalised (`torch.fft`'s `norm`), for a signal of n points.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Norm {
    /// No scaling forward, 1/n on the inverse (`"backward"`, PyTorch's default).
    #[default]
    Backward,
    /// 1/sqrt(n) both ways (`"ortho"`: the transform is unitary).
    Ortho,
    /// 1/n forward, none on the inverse (`"forward"`).
    Forward,
}

impl Norm {
    /// PyTorch's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Norm::Backward => "backward",
            Norm::Ortho => "ortho",
            Norm::Forward => "forward",
        }
    }

    /// The factor of a transform of `n` points (the product of the signal sizes).
    fn factor(self, n: usize, inverse: bool) -> f64 {
        let n = n as f64;
        match (self, inverse) {
            (Norm::Backward, false) | (Norm::Forward, true) => 1.0,
            (Norm::Backward, true) | (Norm::Forward, false) => 1.0 / n,
            (Norm::Ortho, _) => 1.0 / n.sqrt(),
        }
    }
}

impl std::str::FromStr for Norm {
    type Err = Error;

    fn from_str(s: &str) -> Result<Norm> {
        match s {
            "backward" => Ok(Norm::Backward),
            "ortho" => Ok(Norm::Ortho),
            "forward" => Ok(Norm::Forward),
            _ => Err(Error::InvalidArgument {
                what: "norm",
                why: format!("{s:?} is not a normalisation: use backward, ortho or forward"),
            }),
        }
    }
}

/// What `torch.fft`'s functions take beyond the input: the signal sizes, the transformed
/// dimensions and the normalisation. The default is PyTorch's: the input's sizes, the last
/// dimension (last two for the 2-D forms, all for the n-D ones), `"backward"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FftArgs {
    /// Signal sizes along the transformed dimensions (`n` of the 1-D forms, `s` of the
    /// others): the input is trimmed or zero-padded to them (irfft's is its output length).
    pub s: Option<Vec<usize>>,
    /// The transformed dimensions, negative ones counted from the end. A complex tensor's
    /// dimensions are those before its trailing 2.
    pub dim: Option<Vec<isize>>,
    /// The normalisation.
    pub norm: Norm,
}

impl FftArgs {
    /// A 1-D transform of `n` points along `dim`, normalised as `norm` (PyTorch's
    /// `fft(x, n, dim, norm)`).
    pub fn along(n: Option<usize>, dim: isize, norm: Norm) -> FftArgs {
        FftArgs {
            s: n.map(|n| vec![n]),
            dim: Some(vec![dim]),
            norm,
        }
    }
}

/// The dimensions `args` names, of a tensor of `rank` (logical) dimensions, checked: in
/// range, no repeats, as many as the signal sizes; `default` of the last ones where none
/// are named (`None`: as many as the signal sizes given, else all of them, as PyTorch's
/// n-D forms take them).
fn dims_of(
    op: &'static str,
    args: &FftArgs,
    rank: usize,
    default: Option<usize>,
) -> Result<Vec<usize>> {
    let dims: Vec<usize> = match &args.dim {
        None => {
            let count = default.or(args.s.as_ref().map(Vec::len)).unwrap_or(rank);
            if count > rank {
                return Err(fft_error(
                    op,
                    format!(
                        "Dimension out of range: a transform over the last {count} dimensions \
                         needs a tensor of at least {count}; got {rank}"
                    ),
                ));
            }
            (rank - count..rank).collect()
        }
        Some(dims) => dims
            .iter()
            .map(|&d| {
                let at = if d < 0 { d + rank as isize } else { d };
                usize::try_from(at)
                    .ok()
                    .filter(|&at| at < rank)
                    .ok_or_else(|| {
                        fft_error(
                            op,
                            format!("dimension {d} is out of range for {rank} dimensions"),
                        )
                    })
            })
            .collect::<Result<_>>()?,
    };
    if dims.is_empty() || (1..dims.len()).any(|i| dims[..i].contains(&dims[i])) {
        return Err(fft_error(
            op,
            format!("the dimensions {dims:?} must be at least one and all different"),
        ));
    }
    if args.s.as_ref().is_some_and(|s| s.len() != dims.len()) {
        return Err(fft_error(
            op,
            format!(
                "{} signal sizes for {} dimensions: give one per transformed dimension",
                args.s.as_ref().map_or(0, Vec::len),
                dims.len()
            ),
        ));
    }
    Ok(dims)
}

/// The permutation of `rank` dimensions that moves `dims` (in their order) to the end,
/// with `extra` further dimensions (a complex trailing 2) left in place after them.
fn to_end(rank: usize, dims: &[usize], extra: usize) -> Vec<usize> {
    (0..rank)
        .filter(|d| !dims.contains(d))
        .chain(dims.iter().copied())
        .chain(rank..rank + extra)
        .collect()
}

/// The inverse of permutation `perm`.
fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut back = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        back[p] = i;
    }
    back
}

/// `t` with dimension `axis` trimmed (a view) or zero-padded (a copy) to `len`.
fn resized(op: &'static str, t: Tensor, axis: usize, len: usize) -> Result<Tensor> {
    let shape = t.shape().to_vec();
    if len <= shape[axis] {
        return if len == shape[axis] {
            Ok(t)
        } else {
            t.narrow(axis, 0, len)
        };
    }
    let mut out_shape = shape.clone();
    out_shape[axis] = len;
    checked_numel(op, &out_shape, t.dtype())?;
    let values = t.to_f64()?;
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = host_filled(op, out_shape.iter().product(), 0.0)?;
    // (A line of no points pads to zeros alone.)
    if inner > 0 && shape[axis] > 0 {
        for (from, to) in values
            .chunks_exact(shape[axis] * inner)
            .zip(out.chunks_exact_mut(len * inner))
        {
            to[..from.len()].copy_from_slice(from);
        }
    }
    Tensor::from_f64(&out, &out_shape, t.dtype(), t.device())
}

/// A complex transform over the dimensions `args` names (`default` of the last ones
/// otherwise): moved to the end, resized, transformed with the norm's factor, moved back.
fn complex_with(
    op: &'static str,
    x: &Tensor,
    args: &FftArgs,
    default: Option<usize>,
    direction: Direction,
) -> Result<Tensor> {
    let place = place(x)?;
    check_complex(op, x)?;
    let rank = x.shape().len() - 1;
    let dims = dims_of(op, args, rank, default)?;
    let perm = to_end(rank, &dims, 1);
    let mut moved = x.permute(&perm)?;
    let k = dims.len();
    let sizes: Vec<usize> = match &args.s {
        Some(s) => s.clone(),
        None => dims.iter().map(|&d| x.shape()[d]).collect(),
    };
    check_lengths(op, &sizes)?;
    for (i, &len) in sizes.iter().enumerate() {
        moved = resized(op, moved, rank - k + i, len)?;
    }
    let points = sizes.iter().try_fold(1usize, |n, &s| n.checked_mul(s));
    let scale = args.norm.factor(
        points.unwrap_or(usize::MAX),
        direction == Direction::Inverse,
    );
    let out = complex(op, place, &moved, k, direction, scale)?;
    back(out, &perm)
}

/// `out` with the permutation `perm` undone (a copy where it moved anything).
fn back(out: Tensor, perm: &[usize]) -> Result<Tensor> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(out);
    }
    out.permute(&inverse(perm))?.contiguous()
}

fn complex(
    op: &'static str,
    place: Place,
    x: &Tensor,
    dims: usize,
    direction: Direction,
    scale: f64,
) -> Result<Tensor> {
    if let Place::Cuda(ordinal) = place {
        let s = x.shape();
        let sizes = s[s.len() - 1 - dims..s.len() - 1].to_vec();
        return on_cuda(op, ordinal, x, direction, (sizes, s.to_vec()), None, scale);
    }
    if x.dtype() == DType::F64 {
        host::complex_transform::<f64>(x, dims, direction, scale)
    } else {
        host::complex_transform::<f32>(x, dims, direction, scale)
    }
}

/// The DFT over the last dimension of a complex `[..., n, 2]` tensor.
pub fn fft(x: &Tensor) -> Result<Tensor> {
    fft_with(x, &FftArgs::default())
}

/// The inverse DFT (divided by n) over the last dimension of a complex `[..., n, 2]` tensor.
pub fn ifft(x: &Tensor) -> Result<Tensor> {
    ifft_with(x, &FftArgs::default())
}

/// The 2-D DFT over the last two dimensions of a complex `[..., h, w, 2]` tensor.
pub fn fft2(x: &Tensor) -> Result<Tensor> {
    fft2_with(x, &FftArgs::default())
}

/// The inverse 2-D DFT (divided by h·w) of a complex `[..., h, w, 2]` tensor.
pub fn ifft2(x: &Tensor) -> Result<Tensor> {
    ifft2_with(x, &FftArgs::default())
}

/// The `out=` forms of the transforms with PyTorch's arguments: each computes its transform
/// and writes it into `out`, a CPU tensor of the result's shape and dtype (such as a
/// [`crate::BorrowScope::borrow_mut`] over caller memory).
macro_rules! out_forms {
    ($($name:ident = $transform:ident, $torch:literal;)*) => {$(
        #[doc = concat!("[`", stringify!($transform), "`] written into `out` (PyTorch's `",
            $torch, "(..., out=out)`).")]
        pub fn $name(x: &Tensor, args: &FftArgs, out: &Tensor) -> Result<()> {
            crate::ops::copy::write_out($torch, &$transform(x, args)?, out)
        }
    )*};
}

out_forms! {
    fft_out = fft_with, "fft.fft";
    ifft_out = ifft_with, "fft.ifft";
    fft2_out = fft2_with, "fft.fft2";
    ifft2_out = ifft2_with, "fft.ifft2";
    fftn_out = fftn, "fft.fftn";
    ifftn_out = ifftn, "fft.ifftn";
    rfft_out = rfft_with, "fft.rfft";
    irfft_out = irfft_with, "fft.irfft";
    rfft2_out = rfft2_with, "fft.rfft2";
    irfft2_out = irfft2_with, "fft.irfft2";
    rfftn_out = rfftn, "fft.rfftn";
    irfftn_out = irfftn, "fft.irfftn";
}

/// PyTorch's `fft(x, n, dim, norm)`: the DFT along one dimension (the last by default).
pub fn fft_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    one_dim("fft", args)?;
    complex_with("fft", x, args, Some(1), Direction::Forward)
}

/// PyTorch's `ifft(x, n, dim, norm)`.
pub fn ifft_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    one_dim("ifft", args)?;
    complex_with("ifft", x, args, Some(1), Direction::Inverse)
}

/// PyTorch's `fft2(x, s, dim, norm)`: the DFT over two dimensions (the last two by default).
pub fn fft2_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    complex_with("fft2", x, args, Some(2), Direction::Forward)
}

/// PyTorch's `ifft2(x, s, dim, norm)`.
pub fn ifft2_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    complex_with("ifft2", x, args, Some(2), Direction::Inverse)
}

/// PyTorch's `fftn(x, s, dim, norm)`: the DFT over the named dimensions (all by default).
pub fn fftn(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    complex_with("fftn", x, args, None, Direction::Forward)
}

/// PyTorch's `ifftn(x, s, dim, norm)`.
pub fn ifftn(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    complex_with("ifftn", x, args, None, Direction::Inverse)
}

/// PyTorch's `rfft2(x, s, dim, norm)` with its defaults: the last two dimensions of a real
/// tensor, the last holding its `n / 2 + 1` coefficients.
pub fn rfft2(x: &Tensor) -> Result<Tensor> {
    rfft2_with(x, &FftArgs::default())
}

/// PyTorch's `rfft2(x, s, dim, norm)`: [`rfftn`] over two dimensions (the last two by
/// default).
pub fn rfft2_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    real_forward_n("rfft2", x, args, Some(2))
}

/// PyTorch's `rfftn(x, s, dim, norm)`: the DFT of real signals over the named dimensions
/// (all by default, or the last `s.len()`), the last of them holding its `n / 2 + 1`
/// coefficients: [`rfft_with`] along that one, then the complex transform along the others.
pub fn rfftn(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    real_forward_n("rfftn", x, args, None)
}

/// PyTorch's `irfft2(x, s, dim, norm)` with its defaults.
pub fn irfft2(x: &Tensor) -> Result<Tensor> {
    irfft2_with(x, &FftArgs::default())
}

/// PyTorch's `irfft2(x, s, dim, norm)`: [`irfftn`] over two dimensions (the last two by
/// default).
pub fn irfft2_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    real_inverse_n("irfft2", x, args, Some(2))
}

/// PyTorch's `irfftn(x, s, dim, norm)`: the real signals whose [`rfftn`] is the complex `x`
/// over the named dimensions: the inverse complex transform along all but the last of them
/// (trimmed or zero-padded to `s`), then [`irfft_with`] along the last (`s`'s last size, by
/// default `2 (m - 1)`).
pub fn irfftn(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    real_inverse_n("irfftn", x, args, None)
}

/// `args` split into the last transformed dimension's arguments (1-D) and the others'
/// (`None` where it names one dimension only), for a tensor of `rank` logical dimensions.
fn split_last(
    op: &'static str,
    args: &FftArgs,
    rank: usize,
    default: Option<usize>,
) -> Result<(FftArgs, Option<FftArgs>)> {
    if let Some(s) = &args.s {
        check_lengths(op, s)?;
    }
    let dims = dims_of(op, args, rank, default)?;
    let dims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    let k = dims.len();
    let last = FftArgs {
        s: args.s.as_ref().map(|s| vec![s[k - 1]]),
        dim: Some(vec![dims[k - 1]]),
        norm: args.norm,
    };
    let others = (k > 1).then(|| FftArgs {
        s: args.s.as_ref().map(|s| s[..k - 1].to_vec()),
        dim: Some(dims[..k - 1].to_vec()),
        norm: args.norm,
    });
    Ok((last, others))
}

/// [`rfftn`] with `op`'s name and default dimensions.
fn real_forward_n(
    op: &'static str,
    x: &Tensor,
    args: &FftArgs,
    default: Option<usize>,
) -> Result<Tensor> {
    float(op, x)?;
    let (last, others) = split_last(op, args, x.shape().len(), default)?;
    let half = rfft_with(x, &last)?;
    match others {
        Some(others) => complex_with(op, &half, &others, None, Direction::Forward),
        None => Ok(half),
    }
}

/// [`irfftn`] with `op`'s name and default dimensions.
fn real_inverse_n(
    op: &'static str,
    x: &Tensor,
    args: &FftArgs,
    default: Option<usize>,
) -> Result<Tensor> {
    check_complex(op, x)?;
    let (last, others) = split_last(op, args, x.shape().len() - 1, default)?;
    match others {
        Some(others) => {
            let spectra = complex_with(op, x, &others, None, Direction::Inverse)?;
            irfft_with(&spectra, &last)
        }
        None => irfft_with(x, &last),
    }
}

/// The 1-D forms take one dimension and one size.
fn one_dim(op: &'static str, args: &FftArgs) -> Result<()> {
    let many = |v: Option<usize>| v.is_some_and(|n| n != 1);
    if many(args.dim.as_ref().map(Vec::len)) || many(args.s.as_ref().map(Vec::len)) {
        return Err(fft_error(
            op,
            "a 1-D transform takes one dimension and one length: use fft2 or fftn for more".into(),
        ));
    }
    Ok(())
}

/// The DFT of a real `[..., n]` tensor: its first `n / 2 + 1` coefficients as a complex
/// `[..., n / 2 + 1, 2]` tensor (the rest follow by symmetry).
pub fn rfft(x: &Tensor) -> Result<Tensor> {
    rfft_with(x, &FftArgs::default())
}

/// PyTorch's `rfft(x, n, dim, norm)`: the half-spectrum of real signals along one dimension
/// (trimmed or zero-padded to n points), the transformed dimension holding `n / 2 + 1`
/// coefficients.
pub fn rfft_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    let place = place(x)?;
    float("rfft", x)?;
    one_dim("rfft", args)?;
    let rank = x.shape().len();
    if rank == 0 {
        return Err(fft_error(
            "rfft",
            "a 0-D tensor has no dimension to transform".into(),
        ));
    }
    let dim = dims_of("rfft", args, rank, Some(1))?[0];
    let n = args.s.as_ref().map_or(x.shape()[dim], |s| s[0]);
    check_lengths("rfft", &[n])?;
    let perm = to_end(rank, &[dim], 0);
    let moved = resized("rfft", x.permute(&perm)?, rank - 1, n)?;
    let scale = args.norm.factor(n, false);
    let out = match place {
        Place::Cuda(ordinal) => {
            let mut out_shape = moved.shape().to_vec();
            *out_shape.last_mut().expect("rank checked") = n / 2 + 1;
            out_shape.push(2);
            let io = (vec![n], out_shape);
            on_cuda(
                "rfft",
                ordinal,
                &moved,
                Direction::RealForward,
                io,
                None,
                scale,
            )?
        }
        Place::Host if x.dtype() == DType::F64 => host::real_forward::<f64>(&moved, n, scale)?,
        Place::Host => host::real_forward::<f32>(&moved, n, scale)?,
    };
    back(out, &to_end(rank, &[dim], 1))
}

/// The real signal of length `n` (default `2 (m - 1)`) whose DFT starts with the complex
/// `[..., m, 2]` half-spectrum `x`, as a real `[..., n]` tensor (divided by n).
pub fn irfft(x: &Tensor, n: Option<usize>) -> Result<Tensor> {
    irfft_with(
        x,
        &FftArgs {
            s: n.map(|n| vec![n]),
            ..FftArgs::default()
        },
    )
}

/// PyTorch's `irfft(x, n, dim, norm)`: the real signals of `n` points (default `2 (m - 1)`)
/// whose DFTs start with the half-spectra of `m` coefficients along one dimension of `x`.
pub fn irfft_with(x: &Tensor, args: &FftArgs) -> Result<Tensor> {
    let place = place(x)?;
    check_complex("irfft", x)?;
    one_dim("irfft", args)?;
    let rank = x.shape().len() - 1;
    let dim = dims_of("irfft", args, rank, Some(1))?[0];
    let moved = x.permute(&to_end(rank, &[dim], 1))?;
    let out = irfft_last(place, &moved, args.s.as_ref().map(|s| s[0]), args.norm)?;
    back(out, &to_end(rank, &[dim], 0))
}

/// [`irfft_with`] along the last dimension of `x`.
fn irfft_last(place: Place, x: &Tensor, n: Option<usize>, norm: Norm) -> Result<Tensor> {
    let shape = &x.shape()[..x.shape().len() - 1];
    let m = *shape.last().expect("rank checked");
    check_lengths("irfft", &[m])?;
    let n = n.unwrap_or(2 * m.saturating_sub(1));
    if n == 0 {
        return Err(fft_error(
            "irfft",
            format!("the output length is 0 (half-spectrum of {m}); pass n ≥ 1"),
        ));
    }
    let scale = norm.factor(n, true);
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
            scale,
        );
    }
    if x.dtype() == DType::F64 {
        host::real_inverse::<f64>(x, &half, (n, scale), &out_shape)
    } else {
        host::real_inverse::<f32>(x, &half, (n, scale), &out_shape)
    }
}
