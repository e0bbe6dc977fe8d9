//! Discrete Fourier transforms (`torch.fft`'s `fft`, `ifft`, `rfft`, `irfft`, `fft2`,
//! `ifft2`) over the last dimension (two for the 2-D forms), with their plans kept in the
//! per-device LRU [`PlanCache`] of `torch.backends.cuda.cufft_plan_cache`.
//!
//! Complex tensors are stored as PyTorch's `view_as_real` shows them: a trailing dimension
//! of 2 holding the real and imaginary parts. Results have the input's dtype; the
//! arithmetic runs in f64. Normalisation is PyTorch's default ("backward"): the inverse
//! transforms divide by the length.
//!
//! The CPU kernel is an iterative radix-2 FFT for powers of two and Bluestein's chirp-z
//! algorithm (through a power-of-two FFT) for every other length. CUDA tensors (f32 and
//! f64) go through cuFFT when it loads (`fft/cufft.rs`), its plans cached per device the
//! same way. wgpu tensors have no FFT: move them to the CPU.

#[cfg(feature = "cuda")]
mod cufft;

use std::any::Any;
use std::collections::HashMap;
use std::f64::consts::PI;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::runtime::cuda::device::CudaDevice;

use crate::core::tensor::{checked_numel, host_filled};
use crate::{DType, Device, Error, Result, Tensor};

/// Host buffers here are sized by the caller's lengths (irfft's `n` above all): they are
/// allocated fallibly, so a length too long for the machine is [`Error::OutOfMemory`].
const OP: &str = "fft";

/// A complex number (real, imaginary).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct C(f64, f64);

impl C {
    fn mul(self, o: C) -> C {
        C(self.0 * o.0 - self.1 * o.1, self.0 * o.1 + self.1 * o.0)
    }
    fn add(self, o: C) -> C {
        C(self.0 + o.0, self.1 + o.1)
    }
    fn sub(self, o: C) -> C {
        C(self.0 - o.0, self.1 - o.1)
    }
    fn conj(self) -> C {
        C(self.0, -self.1)
    }
    fn unit(angle: f64) -> C {
        C(angle.cos(), angle.sin())
    }
}

/// A power-of-two forward FFT: twiddles and the bit-reversal permutation.
struct Radix2 {
    twiddles: Vec<C>,
    reversed: Vec<usize>,
}

impl Radix2 {
    fn new(n: usize) -> Result<Radix2> {
        let bits = n.trailing_zeros();
        let mut reversed = host_filled(OP, n, 0)?;
        if n > 1 {
            for (i, r) in reversed.iter_mut().enumerate() {
                *r = i.reverse_bits() >> (usize::BITS - bits);
            }
        }
        let mut twiddles = host_filled(OP, n / 2, C::default())?;
        for (j, w) in twiddles.iter_mut().enumerate() {
            *w = C::unit(-2.0 * PI * j as f64 / n as f64);
        }
        Ok(Radix2 { twiddles, reversed })
    }

    fn run(&self, x: &mut [C]) {
        let n = x.len();
        for i in 0..n {
            let j = self.reversed[i];
            if i < j {
                x.swap(i, j);
            }
        }
        let mut len = 2;
        while len <= n {
            let step = n / len;
            for start in (0..n).step_by(len) {
                for k in 0..len / 2 {
                    let w = self.twiddles[k * step];
                    let (a, b) = (x[start + k], x[start + k + len / 2].mul(w));
                    x[start + k] = a.add(b);
                    x[start + k + len / 2] = a.sub(b);
                }
            }
            len *= 2;
        }
    }
}

/// A forward transform of one length.
enum Kernel {
    Radix2(Radix2),
    /// Bluestein: the chirp, the padded power-of-two FFT and the transformed filter.
    Bluestein {
        chirp: Vec<C>,
        inner: Radix2,
        filter: Vec<C>,
    },
}

/// A planned transform of length `n` (the forward kernel; inverses conjugate around it).
pub struct FftPlan {
    n: usize,
    kernel: Kernel,
}

impl FftPlan {
    /// The plan for length `n` (≥ 1; `n` complex values fit the address space, as the
    /// signal holding them does).
    fn new(n: usize) -> Result<FftPlan> {
        if n.is_power_of_two() {
            return Ok(FftPlan {
                n,
                kernel: Kernel::Radix2(Radix2::new(n)?),
            });
        }
        let m = (2 * n - 1).next_power_of_two();
        // w_k = e^{-iπ k²/n}, with k² taken mod 2n (in u128: k² overflows usize for long
        // signals) to keep the angle small.
        let mut chirp = host_filled(OP, n, C::default())?;
        for (k, w) in chirp.iter_mut().enumerate() {
            let phase = (k as u128 * k as u128) % (2 * n as u128);
            *w = C::unit(-PI * phase as f64 / n as f64);
        }
        let inner = Radix2::new(m)?;
        let mut filter = host_filled(OP, m, C::default())?;
        filter[0] = chirp[0].conj();
        for k in 1..n {
            filter[k] = chirp[k].conj();
            filter[m - k] = chirp[k].conj();
        }
        inner.run(&mut filter);
        Ok(FftPlan {
            n,
            kernel: Kernel::Bluestein {
                chirp,
                inner,
                filter,
            },
        })
    }

    /// The scratch length [`FftPlan::apply`] needs.
    fn scratch_len(&self) -> usize {
        match &self.kernel {
            Kernel::Radix2(_) => 0,
            Kernel::Bluestein { filter, .. } => filter.len(),
        }
    }

    /// The transform's length.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The forward DFT of `x` in place (`x.len() == n`), with `scratch` of
    /// [`FftPlan::scratch_len`].
    fn forward(&self, x: &mut [C], scratch: &mut [C]) {
        match &self.kernel {
            Kernel::Radix2(r) => r.run(x),
            Kernel::Bluestein {
                chirp,
                inner,
                filter,
            } => {
                let m = filter.len();
                let a = scratch;
                a.fill(C::default());
                for k in 0..self.n {
                    a[k] = x[k].mul(chirp[k]);
                }
                inner.run(a);
                for (v, f) in a.iter_mut().zip(filter) {
                    *v = v.mul(*f).conj();
                }
                // The inverse FFT as conj(FFT(conj(·))) / m.
                inner.run(a);
                for k in 0..self.n {
                    x[k] = a[k].conj().mul(chirp[k]);
                    x[k] = C(x[k].0 / m as f64, x[k].1 / m as f64);
                }
            }
        }
    }

    /// The DFT (or with `inverse`, the inverse DFT divided by n) of `x` in place.
    fn apply(&self, x: &mut [C], scratch: &mut [C], inverse: bool) {
        if !inverse {
            return self.forward(x, scratch);
        }
        x.iter_mut().for_each(|v| *v = v.conj());
        self.forward(x, scratch);
        let n = self.n as f64;
        x.iter_mut().for_each(|v| *v = C(v.0 / n, -v.1 / n));
    }
}

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

/// Complex values of a `[..., 2]` tensor.
fn complex_values(op: &'static str, x: &Tensor, dims: usize) -> Result<Vec<C>> {
    check_complex(op, x, dims)?;
    Ok(x.to_f64()?.chunks(2).map(|p| C(p[0], p[1])).collect())
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

fn to_tensor(values: &[C], shape: &[usize], like: &Tensor) -> Result<Tensor> {
    let flat: Vec<f64> = values.iter().flat_map(|c| [c.0, c.1]).collect();
    Tensor::from_f64(&flat, shape, like.dtype(), like.device())
}

/// Transforms every length-`plan.len()` line along `axis` of `data` (complex, `shape`).
fn along(
    data: &mut [C],
    shape: &[usize],
    axis: usize,
    plan: &FftPlan,
    inverse: bool,
) -> Result<()> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut line = host_filled(OP, n, C::default())?;
    let mut scratch = host_filled(OP, plan.scratch_len(), C::default())?;
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            for (k, v) in line.iter_mut().enumerate() {
                *v = data[at(k)];
            }
            plan.apply(&mut line, &mut scratch, inverse);
            for (k, v) in line.iter().enumerate() {
                data[at(k)] = *v;
            }
        }
    }
    Ok(())
}

/// Transforms the last `dims` dimensions of complex `values` of complex shape `shape`.
fn transform(
    x: &Tensor,
    values: &mut [C],
    shape: &[usize],
    dims: usize,
    direction: Direction,
) -> Result<()> {
    let sizes = shape[shape.len() - dims..].to_vec();
    // No signal (a batch of 0, or a length of 0): nothing to plan, however long the other
    // dimensions are.
    if values.is_empty() {
        return Ok(());
    }
    let key = PlanKey {
        batch: shape[..shape.len() - dims].iter().product(),
        sizes: sizes.clone(),
        dtype: x.dtype(),
        direction,
        strides: x.strides().to_vec(),
    };
    let plans = plan_cache(Device::Cpu)?.get(key, || {
        crate::core::verbose::creation_event(|| format!("fft plan {sizes:?} {direction:?}"));
        sizes
            .iter()
            .map(|&n| FftPlan::new(n))
            .collect::<Result<Vec<_>>>()
    })?;
    let inverse = matches!(direction, Direction::Inverse | Direction::RealInverse);
    for (d, plan) in plans.iter().enumerate() {
        along(values, shape, shape.len() - dims + d, plan, inverse)?;
    }
    Ok(())
}

fn complex(op: &'static str, x: &Tensor, dims: usize, direction: Direction) -> Result<Tensor> {
    match place(x)? {
        Place::Host => {}
        Place::Cuda(ordinal) => {
            check_complex(op, x, dims)?;
            let s = x.shape();
            let sizes = s[s.len() - 1 - dims..s.len() - 1].to_vec();
            return on_cuda(op, ordinal, x, direction, (sizes, s.to_vec()), None);
        }
    }
    let mut values = complex_values(op, x, dims)?;
    let shape = &x.shape()[..x.shape().len() - 1];
    transform(x, &mut values, shape, dims, direction)?;
    to_tensor(&values, x.shape(), x)
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
    let mut values: Vec<C> = x.to_f64()?.into_iter().map(|r| C(r, 0.0)).collect();
    transform(x, &mut values, x.shape(), 1, Direction::RealForward)?;
    let half = n / 2 + 1;
    let kept: Vec<C> = values
        .chunks(n)
        .flat_map(|line| line[..half.min(line.len())].to_vec())
        .collect();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = half;
    shape.push(2);
    to_tensor(&kept, &shape, x)
}

/// The real signal of length `n` (default `2 (m - 1)`) whose DFT starts with the complex
/// `[..., m, 2]` half-spectrum `x`, as a real `[..., n]` tensor (divided by n).
pub fn irfft(x: &Tensor, n: Option<usize>) -> Result<Tensor> {
    let place = place(x)?;
    let values = complex_values("irfft", x, 1)?;
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
    let out_numel = checked_numel("irfft", &out_shape, x.dtype())?;
    let mut full = host_filled("irfft", out_numel, C::default())?;
    for (line, spectrum) in full.chunks_mut(n).zip(values.chunks(m)) {
        for (k, slot) in line.iter_mut().enumerate() {
            // Hermitian: X[n - k] = conj(X[k]); coefficients past the half-spectrum are 0.
            let (source, mirrored) = if k <= n / 2 {
                (k, false)
            } else {
                (n - k, true)
            };
            let v = spectrum.get(source).copied().unwrap_or_default();
            *slot = if mirrored { v.conj() } else { v };
        }
        // The imaginary parts of X[0] and (even n) X[n/2] do not take part, as in PyTorch.
        line[0].1 = 0.0;
        if n.is_multiple_of(2) {
            line[n / 2].1 = 0.0;
        }
    }
    match place {
        Place::Host => {}
        Place::Cuda(ordinal) => {
            // cuFFT's C2R reads n / 2 + 1 coefficients and overwrites them: hand it the
            // half-spectrum prepared above (trimmed or zero-padded, edge imaginary parts 0).
            let half: Vec<f64> = full
                .chunks(n)
                .flat_map(|line| line[..n / 2 + 1].iter().flat_map(|c| [c.0, c.1]))
                .collect();
            let mut half_shape = out_shape.clone();
            *half_shape.last_mut().expect("rank checked") = n / 2 + 1;
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
    }
    transform(x, &mut full, &out_shape, 1, Direction::RealInverse)?;
    let mut real = host_filled("irfft", out_numel, 0.0)?;
    for (r, c) in real.iter_mut().zip(&full) {
        *r = c.0;
    }
    Tensor::from_f64(&real, &out_shape, x.dtype(), x.device())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_point_and_two_point_transforms() {
        for n in [1, 2, 3] {
            let plan = FftPlan::new(n).unwrap();
            let mut x: Vec<C> = (0..n).map(|i| C(i as f64 + 1.0, 0.0)).collect();
            let mut scratch = vec![C::default(); plan.scratch_len()];
            plan.apply(&mut x, &mut scratch, false);
            let sum: f64 = (1..=n).map(|i| i as f64).sum();
            assert!((x[0].0 - sum).abs() < 1e-12 && x[0].1.abs() < 1e-12);
        }
    }
}
