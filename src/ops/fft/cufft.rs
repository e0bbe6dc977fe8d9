//! The FFTs of CUDA tensors through cuFFT (loaded at run time): plans from `cufftPlanMany`,
//! kept in the device's plan cache and bound to its default stream; the inverse transforms
//! are scaled by 1/n with the generated `scale` kernel (cuFFT leaves them unnormalised).

use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

use cudarc::cufft::{result, sys};
use cudarc::driver::{CudaView, DevicePtr};

use super::{Direction, PlanKey, plan_cache};
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{Elem, KernelKey, ScaleKey};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, long_arg};
use crate::{DType, Device, Error, Result};

/// A cuFFT plan; cuFFT plans are not to run concurrently, so execution takes the lock.
struct Plan {
    handle: Mutex<sys::cufftHandle>,
}

// SAFETY: the handle is only used under its mutex, and cuFFT plans may move between threads.
unsafe impl Send for Plan {}
// SAFETY: as above.
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        let handle = *self.handle.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the handle came from cufftPlanMany and is destroyed once, here. A failure
        // leaves nothing to undo.
        let _ = unsafe { result::destroy(handle) };
    }
}

fn cufft_error(call: &'static str) -> impl Fn(result::CufftError) -> Error {
    move |e| Error::Driver {
        call,
        detail: format!("{e:?}"),
    }
}

/// A transform of CUDA tensor `x` through cuFFT: `sizes` per signal, `batch` signals, a
/// result of `out_shape`, inverses divided by the product of `sizes`. `input` replaces
/// x's data where the caller prepared it (the real inverse's half-spectrum).
pub(super) fn transform(
    op: &'static str,
    ordinal: usize,
    x: &Tensor,
    direction: Direction,
    (sizes, out_shape): (Vec<usize>, Vec<usize>),
    input: Option<Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let dtype = x.dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: dtype,
        });
    }
    let norm: usize = sizes.iter().product();
    let out_numel: usize = out_shape.iter().product();
    if norm == 0 || out_numel == 0 {
        return Tensor::from_f64(&vec![0.0; out_numel], &out_shape, dtype, x.device());
    }
    // cuFFT reads contiguous signals; a strided view is copied first.
    let input = match input {
        Some(prepared) => prepared,
        None if x.is_contiguous() => x.clone(),
        None => x.to_device(x.device())?,
    };
    let signal_in: usize = match direction {
        Direction::RealInverse => sizes[0] / 2 + 1,
        _ => norm,
    };
    let complex_in = direction != Direction::RealForward;
    let batch = input.numel() / (signal_in * if complex_in { 2 } else { 1 });
    let key = PlanKey {
        sizes,
        batch,
        dtype,
        direction,
        strides: input.strides().to_vec(),
    };
    let plan = plan_cache(x.device())?.get(key.clone(), || plan(ordinal, &key))?;
    let buffer = input.cuda_buffer().expect("a CUDA tensor has a buffer");
    let out = run(
        ordinal,
        &plan,
        &key,
        (buffer, input.offset() * dtype.size()),
        out_numel * dtype.size(),
        scale,
    )?;
    Ok(tensor(out, &out_shape, dtype, ordinal))
}

/// Checks that libcufft loads (probed once: cudarc panics on a missing library).
fn library() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    if *PRESENT.get_or_init(|| crate::runtime::cuda::library_present!(sys::is_culib_present)) {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: "cuFFT",
            why: "libcufft is not loadable here: install the CUDA toolkit's cuFFT (or the \
                  nvidia-cufft wheel) on the library path, or move the tensor to the CPU"
                .into(),
        })
    }
}

/// The cuFFT transform type for a key.
fn kind(key: &PlanKey) -> sys::cufftType {
    use sys::cufftType as K;
    let double = key.dtype == DType::F64;
    match (key.direction, double) {
        (Direction::Forward | Direction::Inverse, false) => K::CUFFT_C2C,
        (Direction::Forward | Direction::Inverse, true) => K::CUFFT_Z2Z,
        (Direction::RealForward, false) => K::CUFFT_R2C,
        (Direction::RealForward, true) => K::CUFFT_D2Z,
        (Direction::RealInverse, false) => K::CUFFT_C2R,
        (Direction::RealInverse, true) => K::CUFFT_Z2D,
    }
}

/// A plan for `key` on device `ordinal`: `key.batch` contiguous signals of `key.sizes`.
fn plan(ordinal: usize, key: &PlanKey) -> Result<Plan> {
    library()?;
    let op = "a cuFFT plan";
    let mut n = key
        .sizes
        .iter()
        .map(|&s| crate::runtime::cuda::int_arg(op, s))
        .collect::<Result<Vec<c_int>>>()?;
    let rank = n.len() as c_int;
    let batch = crate::runtime::cuda::int_arg(op, key.batch)?;
    let stream = CudaDevice::get(ordinal)?.stream()?;
    CudaDevice::get(ordinal)?.bind()?;
    crate::core::verbose::creation_event(|| {
        format!(
            "cufft plan {:?} x{} {:?}",
            key.sizes, key.batch, key.direction
        )
    });
    // SAFETY: `n` holds `rank` sizes; null embeddings ask for the basic contiguous layout
    // (strides and distances are then ignored).
    let handle = unsafe {
        result::plan_many(
            rank,
            n.as_mut_ptr(),
            std::ptr::null_mut(),
            1,
            0,
            std::ptr::null_mut(),
            1,
            0,
            kind(key),
            batch,
        )
    }
    .map_err(|e| match e.0 {
        sys::cufftResult::CUFFT_ALLOC_FAILED => Error::OutOfMemory {
            device: Device::Cuda(ordinal),
            bytes: 0,
            why: format!("cufftPlanMany for {:?} x{}: {e:?}", key.sizes, key.batch),
        },
        _ => cufft_error("cufftPlanMany")(e),
    })?;
    let plan = Plan {
        handle: Mutex::new(handle),
    };
    // SAFETY: a live plan and the device's live default stream.
    unsafe { sys::cufftSetStream(handle, stream.cu_stream() as _) }
        .result()
        .map_err(cufft_error("cufftSetStream"))?;
    Ok(plan)
}

/// Runs `plan` (made for `key`) on the contiguous signals at byte `offset` of `input`, into
/// a new buffer of `out_len` bytes, then multiplies the result by `factor` (the
/// normalisation; nothing to do for 1). C2R
/// transforms overwrite their input: pass them a scratch copy.
fn run(
    ordinal: usize,
    plan: &Plan,
    key: &PlanKey,
    (input, offset): (&CudaBuffer, usize),
    out_len: usize,
    factor: f64,
) -> Result<CudaBuffer> {
    let out = CudaBuffer::zeroed(ordinal, out_len)?;
    execute(
        ordinal,
        plan,
        key,
        input.driver_view(offset)?,
        out.driver_view(0)?,
    )?;
    if factor != 1.0 {
        scale(ordinal, &out, key.dtype, factor)?;
    }
    Ok(out)
}

/// One `cufftExec*` call of `plan` from `source` into `target`.
fn execute(
    ordinal: usize,
    plan: &Plan,
    key: &PlanKey,
    source: CudaView<'_, u8>,
    target: CudaView<'_, u8>,
) -> Result<()> {
    CudaDevice::get(ordinal)?.bind()?;
    let stream = CudaDevice::get(ordinal)?.stream()?;
    let (from, _from_sync) = source.device_ptr(&stream);
    let (to, _to_sync) = target.device_ptr(&stream);
    let (from, to) = (from as *mut std::ffi::c_void, to as *mut std::ffi::c_void);
    // cuFFT's direction constants.
    let sign: c_int = if key.direction == Direction::Inverse {
        1
    } else {
        -1
    };
    let handle = plan.handle.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the plan was made for this key (transform type, sizes, batch), the input holds
    // batch contiguous signals and the output was sized for the plan's result; execution is
    // serialised by the plan's lock.
    unsafe {
        match kind(key) {
            sys::cufftType::CUFFT_C2C => result::exec_c2c(*handle, from.cast(), to.cast(), sign),
            sys::cufftType::CUFFT_Z2Z => result::exec_z2z(*handle, from.cast(), to.cast(), sign),
            sys::cufftType::CUFFT_R2C => result::exec_r2c(*handle, from.cast(), to.cast()),
            sys::cufftType::CUFFT_D2Z => result::exec_d2z(*handle, from.cast(), to.cast()),
            sys::cufftType::CUFFT_C2R => result::exec_c2r(*handle, from.cast(), to.cast()),
            _ => result::exec_z2d(*handle, from.cast(), to.cast()),
        }
    }
    .map_err(cufft_error("cufftExec"))
}

/// `buffer *= factor`, elementwise, on the device.
fn scale(ordinal: usize, buffer: &CudaBuffer, dtype: DType, factor: f64) -> Result<()> {
    let elem = if dtype == DType::F64 {
        Elem::F64
    } else {
        Elem::F32
    };
    let kernel = Kernel::get(ordinal, &KernelKey::Scale(ScaleKey { elem }))?;
    let n = buffer.len() / dtype.size();
    if n == 0 {
        return Ok(());
    }
    let view = buffer.view(0);
    let count = long_arg(n);
    let grid = (grid_dim("an inverse FFT's scaling", n.div_ceil(256))?, 1, 1);
    let mut args = kernel.args();
    args.ptr(&view).long(&count).double(&factor);
    // SAFETY: scale.cu takes (T*, long long n, double); the buffer holds n elements of T.
    unsafe { kernel.launch(args, grid) }
}

/// A CUDA tensor over `buffer`.
fn tensor(buffer: CudaBuffer, shape: &[usize], dtype: DType, ordinal: usize) -> Tensor {
    Tensor::from_storage(
        Storage::Device(Box::new(buffer)),
        dtype,
        Device::Cuda(ordinal),
        shape,
    )
}
