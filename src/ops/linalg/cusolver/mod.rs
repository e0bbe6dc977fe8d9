//! Linear algebra on CUDA tensors through cuSOLVER's dense API (loaded at run time; one
//! handle per device, on the device's stream): each matrix of a batch is factored in turn by
//! the 64-bit generic calls (`potrf`, `potrs`, `getrf`, `getrs`, `geqrf`, `syevd`, `gesvd`;
//! `ormqr` for `Q`), and the infos of the whole batch are read back once.
//!
//! cuSOLVER is column-major and our tensors row-major: a row-major `m × n` matrix is the
//! column-major `n × m` matrix `Aᵀ`. Symmetric inputs are read through that directly (the
//! lower triangle row-major is the upper one column-major); general ones are transposed on
//! the device (one strided copy), and so are results where `Aᵀ` is not what is wanted. The
//! triangular factors are cut out by the generated `triangle` kernel; `lu`'s permutation
//! matrix and the pivots are made from the pivots read back to the host, which is also
//! where the factorizations' infos are checked.

//!
//! `lu.rs` holds the LU family (`inv`, `lu_factor`, `lu`, `lu_solve`), `cholesky.rs` the
//! Cholesky one, `orthogonal.rs` `qr`, `eigh` and `svd`; this file the handle, the batch
//! call and the device helpers they share.

mod cholesky;
mod lu;
mod orthogonal;

pub(super) use cholesky::{cholesky, cholesky_inverse, cholesky_solve};
pub(super) use lu::{inv, lu, lu_factor, lu_solve};
pub(super) use orthogonal::{eigh, qr, svd};

use std::ffi::c_int;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cusolver::sys as sol;
use cudarc::driver::{CudaStream, DevicePtr};

use crate::core::error::LinAlgFailure;
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{KernelKey, TriangleKey};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg, long_arg};
use crate::{Device, Error, Result};

/// Whether cuSOLVER's shared library loads (probed once: cudarc panics on a missing one).
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| crate::runtime::cuda::library_present!(sol::is_culib_present))
}

fn check(status: sol::cusolverStatus_t, call: &'static str) -> Result<()> {
    if status == sol::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
        return Ok(());
    }
    Err(Error::Driver {
        call,
        detail: format!("{status:?}"),
    })
}

/// One device's cuSOLVER handle and 64-bit API parameters.
struct Solver {
    handle: sol::cusolverDnHandle_t,
    params: sol::cusolverDnParams_t,
}

// SAFETY: the handle and parameters are used from one thread at a time, under the lock of
// their `DeviceSolver`.
unsafe impl Send for Solver {}

/// cuSOLVER's state on one device (created on first use), kept with the device.
#[derive(Default)]
struct DeviceSolver(Mutex<Option<Solver>>);

/// The element type's cuSOLVER names: its data type and the legacy `ormqr` calls.
trait Real: Copy + crate::Element {
    const DATA: sol::cudaDataType;
    /// # Safety
    /// As `cusolverDn?ormqr_bufferSize`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn ormqr_size(
        handle: sol::cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: *const Self,
        lda: c_int,
        tau: *const Self,
        c: *const Self,
        ldc: c_int,
        lwork: *mut c_int,
    ) -> sol::cusolverStatus_t;
    /// # Safety
    /// As `cusolverDn?ormqr`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn ormqr(
        handle: sol::cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: *const Self,
        lda: c_int,
        tau: *const Self,
        c: *mut Self,
        ldc: c_int,
        work: *mut Self,
        lwork: c_int,
        info: *mut c_int,
    ) -> sol::cusolverStatus_t;
    fn from_f64(value: f64) -> Self;
}

macro_rules! real {
    ($t:ty, $data:ident, $size:ident, $ormqr:ident) => {
        impl Real for $t {
            const DATA: sol::cudaDataType = sol::cudaDataType::$data;
            unsafe fn ormqr_size(
                handle: sol::cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                k: c_int,
                a: *const Self,
                lda: c_int,
                tau: *const Self,
                c: *const Self,
                ldc: c_int,
                lwork: *mut c_int,
            ) -> sol::cusolverStatus_t {
                use sol::cublasOperation_t::CUBLAS_OP_N;
                use sol::cublasSideMode_t::CUBLAS_SIDE_LEFT;
                // SAFETY: the caller's promise.
                unsafe {
                    sol::$size(
                        handle,
                        CUBLAS_SIDE_LEFT,
                        CUBLAS_OP_N,
                        m,
                        n,
                        k,
                        a,
                        lda,
                        tau,
                        c,
                        ldc,
                        lwork,
                    )
                }
            }
            unsafe fn ormqr(
                handle: sol::cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                k: c_int,
                a: *const Self,
                lda: c_int,
                tau: *const Self,
                c: *mut Self,
                ldc: c_int,
                work: *mut Self,
                lwork: c_int,
                info: *mut c_int,
            ) -> sol::cusolverStatus_t {
                use sol::cublasOperation_t::CUBLAS_OP_N;
                use sol::cublasSideMode_t::CUBLAS_SIDE_LEFT;
                // SAFETY: the caller's promise.
                unsafe {
                    sol::$ormqr(
                        handle,
                        CUBLAS_SIDE_LEFT,
                        CUBLAS_OP_N,
                        m,
                        n,
                        k,
                        a,
                        lda,
                        tau,
                        c,
                        ldc,
                        work,
                        lwork,
                        info,
                    )
                }
            }
            fn from_f64(value: f64) -> Self {
                value as $t
            }
        }
    };
}
real!(
    f32,
    CUDA_R_32F,
    cusolverDnSormqr_bufferSize,
    cusolverDnSormqr
);
real!(
    f64,
    CUDA_R_64F,
    cusolverDnDormqr_bufferSize,
    cusolverDnDormqr
);

/// Why cuSOLVER cannot serve device `ordinal`, if it cannot.
pub(super) fn why_unusable(ordinal: usize) -> Option<String> {
    if crate::runtime::cuda::is_interpreted() {
        return Some(format!(
            "cuda:{ordinal} is the PTX interpreter, where cuSOLVER does not run; move the \
             tensors to the CPU with to_device(Device::Cpu)"
        ));
    }
    (!present()).then(|| {
        "libcusolver.so is not loadable; put cuSOLVER (CUDA 12) on LD_LIBRARY_PATH or move the \
         tensors to the CPU with to_device(Device::Cpu)"
            .to_string()
    })
}

/// One batched call on device `ordinal`: the solver, the stream, and the infos of its
/// matrices (`calls` slots per matrix), read back and checked at the end.
struct Call<'a> {
    ordinal: usize,
    solver: &'a Solver,
    stream: Arc<CudaStream>,
    infos: CudaBuffer,
    base_info: u64,
    calls: usize,
}

impl Call<'_> {
    /// The device address of info slot `call` of matrix `index`.
    fn info(&self, index: usize, call: usize) -> *mut c_int {
        (self.base_info + 4 * (index * self.calls + call) as u64) as *mut c_int
    }

    /// The infos, read back: the first matrix whose call `primary` reports a failure
    /// (`info > 0`), mapped by `failure`; a negative info (an argument cuSOLVER rejects) is an
    /// error of this module.
    fn check(
        &self,
        op: &'static str,
        primary: usize,
        failure: impl Fn(usize) -> Option<LinAlgFailure>,
    ) -> Result<()> {
        let bytes = self.infos.download()?;
        let infos: Vec<i32> = bytes
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let count = infos.len() / self.calls.max(1);
        if let Some(bad) = infos.iter().position(|&i| i < 0) {
            return Err(Error::Driver {
                call: "cusolverDn",
                detail: format!(
                    "{op}: call {} of matrix {} rejected argument {}",
                    bad % self.calls,
                    bad / self.calls,
                    -infos[bad]
                ),
            });
        }
        for index in 0..count {
            let info = infos[index * self.calls + primary];
            if info > 0
                && let Some(failure) = failure(info as usize)
            {
                return Err(Error::LinAlg {
                    op,
                    batch: (count > 1).then_some(index),
                    failure,
                });
            }
        }
        Ok(())
    }

    /// The device and host workspaces of the sizes `query` (a 64-bit `_bufferSize` call, named
    /// `name`, given where to write the device and the host bytes) reports.
    fn workspace(
        &self,
        name: &'static str,
        query: impl FnOnce(&mut usize, &mut usize) -> sol::cusolverStatus_t,
    ) -> Result<Workspace> {
        let (mut device_bytes, mut host_bytes) = (0, 0);
        check(query(&mut device_bytes, &mut host_bytes), name)?;
        let device = CudaBuffer::zeroed(self.ordinal, device_bytes.max(1))?;
        Ok(Workspace {
            device_ptr: self.address(&device)?,
            _device: device,
            device_bytes,
            host: vec![0u8; host_bytes.max(1)],
            host_bytes,
        })
    }

    /// The device address of a buffer.
    fn address(&self, buffer: &CudaBuffer) -> Result<u64> {
        let view = buffer.driver_view(0)?;
        let (ptr, _sync) = view.device_ptr(&self.stream);
        Ok(ptr)
    }
}

/// The workspaces of one factorization's calls, as its `_bufferSize` query sized them.
struct Workspace {
    _device: CudaBuffer,
    device_ptr: u64,
    device_bytes: usize,
    host: Vec<u8>,
    host_bytes: usize,
}

/// Runs `body` with device `ordinal`'s solver and `calls` info slots for each of `count`
/// matrices.
fn solve<R>(
    ordinal: usize,
    count: usize,
    calls: usize,
    body: impl FnOnce(&Call) -> Result<R>,
) -> Result<R> {
    if let Some(why) = why_unusable(ordinal) {
        return Err(Error::Unavailable {
            what: "cuSOLVER",
            why,
        });
    }
    let device = CudaDevice::get(ordinal)?;
    device.bind()?;
    let stream = device.stream()?;
    let mut slot = device
        .state::<DeviceSolver>()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let solver = match &mut *slot {
        Some(solver) => solver,
        empty => {
            let mut handle = std::ptr::null_mut();
            // SAFETY: creates a handle on the context bound above.
            let status = unsafe { sol::cusolverDnCreate(&mut handle) };
            check(status, "cusolverDnCreate")?;
            // SAFETY: a fresh handle and the device's live default stream.
            let status = unsafe { sol::cusolverDnSetStream(handle, stream.cu_stream() as _) };
            check(status, "cusolverDnSetStream")?;
            let mut params = std::ptr::null_mut();
            // SAFETY: creates a parameter object with the default algorithms.
            let status = unsafe { sol::cusolverDnCreateParams(&mut params) };
            check(status, "cusolverDnCreateParams")?;
            empty.insert(Solver { handle, params })
        }
    };
    let infos = CudaBuffer::zeroed(ordinal, 4 * count * calls)?;
    let base_info = {
        let view = infos.driver_view(0)?;
        let (ptr, _sync) = view.device_ptr(&stream);
        ptr
    };
    body(&Call {
        ordinal,
        solver,
        stream,
        infos,
        base_info,
        calls,
    })
}

/// A fresh contiguous device copy of `t` (cuSOLVER overwrites its inputs).
fn fresh(t: &Tensor) -> Result<Tensor> {
    if !t.is_contiguous() || t.numel() == 0 {
        return t.contiguous();
    }
    let size = t.dtype().size();
    let buffer = t
        .cuda_buffer()
        .expect("a CUDA tensor has a buffer")
        .duplicate(t.offset() * size, t.numel() * size)?;
    Ok(Tensor::from_storage(
        Storage::Device(Box::new(buffer)),
        t.dtype(),
        t.device(),
        t.shape(),
    ))
}

/// A fresh copy of each matrix of `t` (`[.., r, c]`) transposed (`[.., c, r]`): the
/// matrices column-major.
fn transposed(t: &Tensor) -> Result<Tensor> {
    let rank = t.shape().len();
    fresh(&t.transpose(rank - 2, rank - 1)?)
}

/// The device address of the contiguous tensor `t`'s first element.
fn address(t: &Tensor, stream: &Arc<CudaStream>) -> Result<u64> {
    let buffer = t.cuda_buffer().expect("a CUDA tensor has a buffer");
    let view = buffer.driver_view(t.offset() * t.dtype().size())?;
    let (ptr, _sync) = view.device_ptr(stream);
    Ok(ptr)
}

/// A batch of `count` host matrices of `rows × cols` (row-major) with ones where `one`
/// says, on device `ordinal`.
fn host_matrices<T: Real>(
    ordinal: usize,
    count: usize,
    [rows, cols]: [usize; 2],
    one: impl Fn(usize, usize, usize) -> bool,
) -> Result<Tensor> {
    let mut data = crate::core::tensor::host_zeros::<T>("linalg on CUDA", count * rows * cols)?;
    for (i, matrix) in data.chunks_mut((rows * cols).max(1)).enumerate() {
        for (e, value) in matrix.iter_mut().enumerate() {
            if one(i, e / cols.max(1), e % cols.max(1)) {
                *value = <T as Real>::from_f64(1.0);
            }
        }
    }
    Tensor::from_vec(data, &[count, rows, cols], Device::Cuda(ordinal))
}

/// Keeps one triangle of each matrix of the contiguous `t` (`[.., rows, cols]`) in place,
/// zeroing the rest (see `kernels/cuda/triangle.cu`).
fn keep_triangle(t: &Tensor, upper: bool, unit_diagonal: bool) -> Result<()> {
    let n = t.numel();
    if n == 0 {
        return Ok(());
    }
    let Device::Cuda(ordinal) = t.device() else {
        unreachable!("a CUDA tensor")
    };
    let rank = t.shape().len();
    let (rows, cols) = (t.shape()[rank - 2], t.shape()[rank - 1]);
    let elem = t.dtype().elem().expect("f32 or f64");
    let kernel = Kernel::get(ordinal, &KernelKey::Triangle(TriangleKey { elem }))?;
    let x = t
        .cuda_buffer()
        .expect("a CUDA tensor has a buffer")
        .view(t.offset() * t.dtype().size());
    let longs = [n, rows, cols, 0].map(long_arg);
    let ints = [
        int_arg("linalg", usize::from(upper))?,
        int_arg("linalg", usize::from(unit_diagonal))?,
    ];
    let mut args = kernel.args();
    args.ptr(&x);
    for value in &longs {
        args.long(value);
    }
    for value in &ints {
        args.int(value);
    }
    let grid = (grid_dim("linalg", n.div_ceil(256))?, 1, 1);
    // SAFETY: the arguments follow triangle.cu's parameter list; `t` holds `n` contiguous
    // elements from its offset.
    unsafe { kernel.launch(args, grid) }
}

/// `b` broadcast to the batch `dims` and transposed: `[count, k, n]`, each right side
/// column-major, fresh (the solves overwrite it).
fn right_sides(b: &Tensor, dims: &[usize], (n, k): (usize, usize), count: usize) -> Result<Tensor> {
    let full: Vec<usize> = dims.iter().copied().chain([n, k]).collect();
    let expanded = b.expand(&full)?.contiguous()?.view(&[count, n, k])?;
    transposed(&expanded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// The triangle kernel on the PTX interpreter (this test reruns itself in a child
    /// process where `cuda:0` is the interpreter): lower, unit lower and upper triangles of
    /// wide and tall matrices of a batch, against the same cut made on the host.
    #[test]
    fn the_triangle_kernel_keeps_one_triangle() {
        let name = "ops::linalg::cusolver::tests::the_triangle_kernel_keeps_one_triangle";
        if !crate::runtime::cuda::in_interpreter_child(name) {
            return;
        }
        for dtype in [DType::F32, DType::F64] {
            for (rows, cols) in [(4, 6), (5, 3)] {
                for (upper, unit) in [(false, false), (false, true), (true, false)] {
                    let count = 2;
                    let values: Vec<f64> =
                        (0..count * rows * cols).map(|i| i as f64 + 0.5).collect();
                    let t = Tensor::from_f64(&values, &[count, rows, cols], dtype, Device::Cuda(0))
                        .unwrap();
                    match keep_triangle(&t, upper, unit) {
                        Err(Error::Unavailable { why, .. }) => {
                            eprintln!("skipped: no CUDA kernels here ({why})");
                            return;
                        }
                        other => other.unwrap(),
                    }
                    let want: Vec<f64> = values
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| {
                            let (r, c) = ((i / cols % rows) as i64, (i % cols) as i64);
                            match (upper, unit) {
                                (true, _) if c < r => 0.0,
                                (false, _) if c > r => 0.0,
                                (false, true) if c == r => 1.0,
                                _ => v,
                            }
                        })
                        .collect();
                    assert_eq!(
                        t.to_f64().unwrap(),
                        want,
                        "{dtype} {rows}x{cols} upper={upper}"
                    );
                }
            }
        }
    }
}
