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

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cusolver::sys as sol;
use cudarc::driver::{CudaStream, DevicePtr};

use super::QrMode;
use crate::core::error::LinAlgFailure;
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{KernelKey, TriangleKey};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg, long_arg};
use crate::{DType, Device, Error, Result};

use sol::cublasFillMode_t::{CUBLAS_FILL_MODE_LOWER as LOWER, CUBLAS_FILL_MODE_UPPER as UPPER};

/// Whether cuSOLVER's shared library loads (probed once: cudarc panics on a missing one).
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen libcusolver by its standard names.
    *PRESENT.get_or_init(|| unsafe { sol::is_culib_present() })
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

/// Calls `$body` with `$t` bound to the element type of `$dtype` (f32 or f64).
macro_rules! by_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F64 => {
                type $t = f64;
                $body
            }
            _ => {
                type $t = f32;
                $body
            }
        }
    };
}

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

    /// Device workspace and host workspace of the sizes a `_bufferSize` call reported.
    fn workspaces(&self, device: usize, host: usize) -> Result<(CudaBuffer, Vec<u8>)> {
        Ok((
            CudaBuffer::zeroed(self.ordinal, device.max(1))?,
            vec![0u8; host.max(1)],
        ))
    }

    /// The device address of a buffer.
    fn address(&self, buffer: &CudaBuffer) -> Result<u64> {
        let view = buffer.driver_view(0)?;
        let (ptr, _sync) = view.device_ptr(&self.stream);
        Ok(ptr)
    }
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

fn i32_len(op: &'static str, value: usize) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| Error::ShapeMismatch {
        op,
        detail: format!("{value} exceeds cuSOLVER's 32-bit sizes for this call"),
    })
}

/// `inv` of the contiguous `[count, n, n]` batch `a`: `getrf`, then `getrs` on the identity.
pub(super) fn inv(op: &'static str, a: &Tensor, count: usize, n: usize) -> Result<Tensor> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    by_dtype!(a.dtype(), T => {
        let factors = transposed(&a.view(&[count, n, n])?)?;
        let x = host_matrices::<T>(ordinal, count, [n, n], |_, r, c| r == c)?;
        solve(ordinal, count, 2, |call| {
            lu_in_place::<T>(call, &factors, count, [n, n], |i, pivots| {
                let (lu, x) = (address(&factors, &call.stream)?, address(&x, &call.stream)?);
                let step = (n * n * size_of::<T>()) as u64;
                // SAFETY: matrix `i` of the factors (n x n, lda n) and of the identity, the
                // pivots `getrf` wrote for it, and its info slot, all live on the device.
                let status = unsafe {
                    sol::cusolverDnXgetrs(
                        call.solver.handle,
                        call.solver.params,
                        sol::cublasOperation_t::CUBLAS_OP_N,
                        n as i64,
                        n as i64,
                        T::DATA,
                        (lu + i as u64 * step) as *const c_void,
                        n as i64,
                        pivots,
                        T::DATA,
                        (x + i as u64 * step) as *mut c_void,
                        n as i64,
                        call.info(i, 1),
                    )
                };
                check(status, "cusolverDnXgetrs")
            })?;
            call.check(op, 0, |diagonal| Some(LinAlgFailure::Singular { diagonal }))
        })?;
        transposed(&x)
    })
}

/// `getrf` of each column-major `rows × cols` matrix of `factors` in place, with `then(i,
/// pivots)` run after matrix `i`'s; returns the pivots buffer (`min(rows, cols)` i64s per
/// matrix). Info slot 0 of each matrix is `getrf`'s.
fn lu_in_place<T: Real>(
    call: &Call,
    factors: &Tensor,
    count: usize,
    [rows, cols]: [usize; 2],
    then: impl Fn(usize, *const i64) -> Result<()>,
) -> Result<CudaBuffer> {
    let k = rows.min(cols);
    let pivots = CudaBuffer::zeroed(call.ordinal, 8 * count * k)?;
    if count == 0 || k == 0 {
        return Ok(pivots);
    }
    let (a, pivot_base) = (address(factors, &call.stream)?, call.address(&pivots)?);
    let (m, n) = (rows as i64, cols as i64);
    let (mut device, mut host) = (0usize, 0usize);
    // SAFETY: a size query for the first matrix (live, column-major, lda = rows).
    let status = unsafe {
        sol::cusolverDnXgetrf_bufferSize(
            call.solver.handle,
            call.solver.params,
            m,
            n,
            T::DATA,
            a as *const c_void,
            m,
            T::DATA,
            &mut device,
            &mut host,
        )
    };
    check(status, "cusolverDnXgetrf_bufferSize")?;
    let (work, mut host_work) = call.workspaces(device, host)?;
    let work_ptr = call.address(&work)?;
    let step = (rows * cols * size_of::<T>()) as u64;
    for i in 0..count {
        let ipiv = (pivot_base + (8 * i * k) as u64) as *mut i64;
        // SAFETY: matrix `i` (column-major, lda = rows), its pivots and info slot, and the
        // workspaces of the sizes queried above, all live until the stream runs the call.
        let status = unsafe {
            sol::cusolverDnXgetrf(
                call.solver.handle,
                call.solver.params,
                m,
                n,
                T::DATA,
                (a + i as u64 * step) as *mut c_void,
                m,
                ipiv,
                T::DATA,
                work_ptr as *mut c_void,
                device,
                host_work.as_mut_ptr().cast(),
                host,
                call.info(i, 0),
            )
        };
        check(status, "cusolverDnXgetrf")?;
        then(i, ipiv)?;
    }
    Ok(pivots)
}

/// The i64 pivots cuSOLVER wrote, as LAPACK's i32s.
fn pivots_i32(pivots: &CudaBuffer) -> Result<Vec<i32>> {
    Ok(pivots
        .download()?
        .chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().expect("8 bytes")) as i32)
        .collect())
}

/// `cholesky` of the contiguous `[count, n, n]` batch `a` (its lower triangle, or upper).
pub(super) fn cholesky(
    op: &'static str,
    a: &Tensor,
    count: usize,
    n: usize,
    upper: bool,
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let factor = fresh(&a.view(&[count, n, n])?)?;
    by_dtype!(a.dtype(), T => {
        solve(ordinal, count, 1, |call| {
            if count == 0 || n == 0 {
                return Ok(());
            }
            // Row-major lower is column-major upper.
            let uplo = if upper { LOWER } else { UPPER };
            let base = address(&factor, &call.stream)?;
            let (mut device, mut host) = (0usize, 0usize);
            // SAFETY: a size query for the first matrix (live, n x n, lda n).
            let status = unsafe {
                sol::cusolverDnXpotrf_bufferSize(
                    call.solver.handle,
                    call.solver.params,
                    uplo,
                    n as i64,
                    T::DATA,
                    base as *const c_void,
                    n as i64,
                    T::DATA,
                    &mut device,
                    &mut host,
                )
            };
            check(status, "cusolverDnXpotrf_bufferSize")?;
            let (work, mut host_work) = call.workspaces(device, host)?;
            let work_ptr = call.address(&work)?;
            let step = (n * n * size_of::<T>()) as u64;
            for i in 0..count {
                // SAFETY: matrix `i`, its info slot and the queried workspaces are live.
                let status = unsafe {
                    sol::cusolverDnXpotrf(
                        call.solver.handle,
                        call.solver.params,
                        uplo,
                        n as i64,
                        T::DATA,
                        (base + i as u64 * step) as *mut c_void,
                        n as i64,
                        T::DATA,
                        work_ptr as *mut c_void,
                        device,
                        host_work.as_mut_ptr().cast(),
                        host,
                        call.info(i, 0),
                    )
                };
                check(status, "cusolverDnXpotrf")?;
            }
            call.check(op, 0, |minor| Some(LinAlgFailure::NotPositiveDefinite { minor }))
        })?;
    });
    keep_triangle(&factor, upper, false)?;
    Ok(factor)
}

/// `potrs` of each `[n, k]` right side (given column-major in `x`, `[count, k, n]`, solved in
/// place) against the Cholesky factor `factor(i)` (the contiguous lower factor row-major, or
/// upper with `upper`).
fn cholesky_solve_in_place<T: Real>(
    call: &Call,
    factors: &Tensor,
    factor_of: impl Fn(usize) -> usize,
    x: &Tensor,
    (count, n, k): (usize, usize, usize),
    upper: bool,
) -> Result<()> {
    if count == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    // The row-major lower factor L is the column-major upper U = Lᵀ, with A = Uᵀ U.
    let uplo = if upper { LOWER } else { UPPER };
    let (l, b) = (address(factors, &call.stream)?, address(x, &call.stream)?);
    let size = size_of::<T>() as u64;
    for i in 0..count {
        // SAFETY: factor `factor_of(i)` (n x n), right side `i` (n x k, ldb n) and info slot
        // `i` are live on the device.
        let status = unsafe {
            sol::cusolverDnXpotrs(
                call.solver.handle,
                call.solver.params,
                uplo,
                n as i64,
                k as i64,
                T::DATA,
                (l + (factor_of(i) * n * n) as u64 * size) as *const c_void,
                n as i64,
                T::DATA,
                (b + (i * n * k) as u64 * size) as *mut c_void,
                n as i64,
                call.info(i, 0),
            )
        };
        check(status, "cusolverDnXpotrs")?;
    }
    Ok(())
}

/// `cholesky_inverse` of the contiguous `[count, n, n]` factors: `potrs` on the identity.
pub(super) fn cholesky_inverse(
    op: &'static str,
    factor: &Tensor,
    count: usize,
    n: usize,
    upper: bool,
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = factor.device() else {
        unreachable!("a CUDA tensor")
    };
    let factor = factor.contiguous()?;
    // A zero on the factor's diagonal makes the inverse infinite: an error, as on the CPU
    // (the diagonals alone are read back).
    let diagonals = factor
        .with_layout(vec![count, n], vec![n * n, n + 1], factor.offset())
        .to_f64()?;
    if let Some(at) = diagonals.iter().position(|&d| d == 0.0) {
        return Err(Error::LinAlg {
            op,
            batch: (count > 1).then_some(at / n),
            failure: LinAlgFailure::Singular {
                diagonal: at % n + 1,
            },
        });
    }
    by_dtype!(factor.dtype(), T => {
        let x = host_matrices::<T>(ordinal, count, [n, n], |_, r, c| r == c)?;
        solve(ordinal, count, 1, |call| {
            cholesky_solve_in_place::<T>(call, &factor, |i| i, &x, (count, n, n), upper)?;
            call.check(op, 0, |_| None)
        })?;
        transposed(&x)
    })
}

/// `cholesky_solve` of the right sides `b` (broadcast to `[count, n, k]` along `pairs`)
/// against the contiguous factors.
pub(super) fn cholesky_solve(
    op: &'static str,
    b: &Tensor,
    factor: &Tensor,
    (dims, pairs): (&[usize], &[[usize; 2]]),
    (n, k): (usize, usize),
    upper: bool,
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = b.device() else {
        unreachable!("a CUDA tensor")
    };
    let count = pairs.len();
    let factor = factor.contiguous()?;
    let x = right_sides(b, dims, (n, k), count)?;
    by_dtype!(b.dtype(), T => {
        solve(ordinal, count, 1, |call| {
            cholesky_solve_in_place::<T>(call, &factor, |i| pairs[i][1], &x, (count, n, k), upper)?;
            call.check(op, 0, |_| None)
        })?;
    });
    let shape: Vec<usize> = dims.iter().copied().chain([n, k]).collect();
    transposed(&x)?.view(&shape)
}

/// `b` broadcast to the batch `dims` and transposed: `[count, k, n]`, each right side
/// column-major, fresh (the solves overwrite it).
fn right_sides(b: &Tensor, dims: &[usize], (n, k): (usize, usize), count: usize) -> Result<Tensor> {
    let full: Vec<usize> = dims.iter().copied().chain([n, k]).collect();
    let expanded = b.expand(&full)?.contiguous()?.view(&[count, n, k])?;
    transposed(&expanded)
}

/// `lu_factor` of the contiguous `[count, m, n]` batch `a`: packed factors and i32 pivots
/// (a zero pivot is an error, with `checked`).
pub(super) fn lu_factor(
    op: &'static str,
    a: &Tensor,
    count: usize,
    (m, n): (usize, usize),
    checked: bool,
) -> Result<(Tensor, Vec<i32>)> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let factors = transposed(&a.view(&[count, m, n])?)?;
    let pivots = by_dtype!(a.dtype(), T => {
        solve(ordinal, count, 1, |call| {
            let pivots = lu_in_place::<T>(call, &factors, count, [m, n], |_, _| Ok(()))?;
            if checked {
                call.check(op, 0, |index| Some(LinAlgFailure::ZeroPivot { index }))?;
            } else {
                call.check(op, 0, |_| None)?;
            }
            pivots_i32(&pivots)
        })?
    });
    Ok((transposed(&factors)?, pivots))
}

/// `lu` of the contiguous `[count, m, n]` batch `a`: `P` (`[count, m, m]`), `L` (`[count, m,
/// k]`), `U` (`[count, k, n]`).
pub(super) fn lu(a: &Tensor, count: usize, (m, n): (usize, usize)) -> Result<[Tensor; 3]> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let k = m.min(n);
    let (packed, pivots) = lu_factor("linalg.lu", a, count, (m, n), false)?;
    let l = fresh(&packed.narrow(2, 0, k)?)?;
    keep_triangle(&l, false, true)?;
    let u = fresh(&packed.narrow(1, 0, k)?)?;
    keep_triangle(&u, true, false)?;
    // Row `r` of L U is row `order[r]` of A: P has a one at (order[r], r).
    let orders: Vec<Vec<usize>> = (0..count)
        .map(|i| {
            let mut order: Vec<usize> = (0..m).collect();
            for (step, &p) in pivots[i * k..][..k].iter().enumerate() {
                order.swap(step, p as usize - 1);
            }
            order
        })
        .collect();
    let p = by_dtype!(a.dtype(), T => {
        host_matrices::<T>(ordinal, count, [m, m], |i, r, c| orders[i][c] == r)?
    });
    Ok([p, l, u])
}

/// `lu_solve` of `b` (broadcast along `pairs`) against the contiguous packed factors and
/// their (checked) pivots.
pub(super) fn lu_solve(
    op: &'static str,
    packed: &Tensor,
    pivots: &[i32],
    b: &Tensor,
    (dims, pairs): (&[usize], &[[usize; 2]]),
    (n, k): (usize, usize),
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = b.device() else {
        unreachable!("a CUDA tensor")
    };
    let count = pairs.len();
    let rank = packed.shape().len();
    let factors = fresh(&packed.transpose(rank - 2, rank - 1)?)?;
    let wide: Vec<u8> = pivots
        .iter()
        .flat_map(|&p| i64::from(p).to_ne_bytes())
        .collect();
    let pivots = CudaBuffer::upload(ordinal, &wide)?;
    let x = right_sides(b, dims, (n, k), count)?;
    by_dtype!(b.dtype(), T => {
        solve(ordinal, count, 1, |call| {
            if count > 0 && n > 0 && k > 0 {
                let (lu, rhs, ipiv) = (
                    address(&factors, &call.stream)?,
                    address(&x, &call.stream)?,
                    call.address(&pivots)?,
                );
                let size = size_of::<T>() as u64;
                for (i, &[_, ia]) in pairs.iter().enumerate() {
                    // SAFETY: factors `ia` (column-major n x n), their pivots, right side
                    // `i` (n x k, ldb n) and info slot `i` are live on the device.
                    let status = unsafe {
                        sol::cusolverDnXgetrs(
                            call.solver.handle,
                            call.solver.params,
                            sol::cublasOperation_t::CUBLAS_OP_N,
                            n as i64,
                            k as i64,
                            T::DATA,
                            (lu + (ia * n * n) as u64 * size) as *const c_void,
                            n as i64,
                            (ipiv + (8 * ia * n) as u64) as *const i64,
                            T::DATA,
                            (rhs + (i * n * k) as u64 * size) as *mut c_void,
                            n as i64,
                            call.info(i, 0),
                        )
                    };
                    check(status, "cusolverDnXgetrs")?;
                }
            }
            call.check(op, 0, |_| None)
        })?;
    });
    let shape: Vec<usize> = dims.iter().copied().chain([n, k]).collect();
    transposed(&x)?.view(&shape)
}

/// `qr` of the contiguous `[count, m, n]` batch `a`: `geqrf`, then `Q` by `ormqr` applied to
/// the first columns of the identity; `R` cut from the factored matrix.
pub(super) fn qr(
    op: &'static str,
    a: &Tensor,
    count: usize,
    (m, n): (usize, usize),
    mode: QrMode,
) -> Result<[Tensor; 2]> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let k = m.min(n);
    let (q_cols, r_rows) = if mode == QrMode::Complete {
        (m, m)
    } else {
        (k, k)
    };
    let factors = transposed(&a.view(&[count, m, n])?)?;
    let (ldq, q_n, reflectors) = (i32_len(op, m)?, i32_len(op, q_cols)?, i32_len(op, k)?);
    let q = by_dtype!(a.dtype(), T => {
        // Q column-major: [count, q_cols, m], the identity's first q_cols columns.
        let q = host_matrices::<T>(ordinal, count, [q_cols, m], |_, c, r| r == c)?;
        let tau = CudaBuffer::zeroed(ordinal, (count * k * size_of::<T>()).max(1))?;
        solve(ordinal, count, 2, |call| {
            if count == 0 || k == 0 {
                return Ok(());
            }
            let (base, tau_base) = (address(&factors, &call.stream)?, call.address(&tau)?);
            let (rows, cols) = (m as i64, n as i64);
            let (mut device, mut host) = (0usize, 0usize);
            // SAFETY: a size query for the first matrix (live, column-major, lda = m).
            let status = unsafe {
                sol::cusolverDnXgeqrf_bufferSize(
                    call.solver.handle,
                    call.solver.params,
                    rows,
                    cols,
                    T::DATA,
                    base as *const c_void,
                    rows,
                    T::DATA,
                    tau_base as *const c_void,
                    T::DATA,
                    &mut device,
                    &mut host,
                )
            };
            check(status, "cusolverDnXgeqrf_bufferSize")?;
            let (work, mut host_work) = call.workspaces(device, host)?;
            let work_ptr = call.address(&work)?;
            let size = size_of::<T>() as u64;
            let q_base = address(&q, &call.stream)?;
            let mut lwork: c_int = 0;
            if mode != QrMode::R {
                // SAFETY: a size query over the first matrix's reflectors, tau and Q.
                let status = unsafe {
                    T::ormqr_size(
                        call.solver.handle,
                        ldq,
                        q_n,
                        reflectors,
                        base as *const T,
                        ldq,
                        tau_base as *const T,
                        q_base as *const T,
                        ldq,
                        &mut lwork,
                    )
                };
                check(status, "cusolverDnXormqr_bufferSize")?;
            }
            let q_work = CudaBuffer::zeroed(ordinal, (lwork.max(1) as usize) * size_of::<T>())?;
            let q_work_ptr = call.address(&q_work)?;
            for i in 0..count {
                let a_i = base + (i * m * n) as u64 * size;
                let tau_i = tau_base + (i * k) as u64 * size;
                // SAFETY: matrix `i` (column-major, lda m), its k taus, its info slot and the
                // queried workspaces are live on the device.
                let status = unsafe {
                    sol::cusolverDnXgeqrf(
                        call.solver.handle,
                        call.solver.params,
                        rows,
                        cols,
                        T::DATA,
                        a_i as *mut c_void,
                        rows,
                        T::DATA,
                        tau_i as *mut c_void,
                        T::DATA,
                        work_ptr as *mut c_void,
                        device,
                        host_work.as_mut_ptr().cast(),
                        host,
                        call.info(i, 0),
                    )
                };
                check(status, "cusolverDnXgeqrf")?;
                if mode != QrMode::R {
                    // SAFETY: the reflectors and taus just written, Q `i` (m x q_cols, ldc
                    // m), the queried workspace and info slot 1 of matrix `i`.
                    let status = unsafe {
                        T::ormqr(
                            call.solver.handle,
                            ldq,
                            q_n,
                            reflectors,
                            a_i as *const T,
                            ldq,
                            tau_i as *const T,
                            (q_base + (i * m * q_cols) as u64 * size) as *mut T,
                            ldq,
                            q_work_ptr as *mut T,
                            lwork,
                            call.info(i, 1),
                        )
                    };
                    check(status, "cusolverDnXormqr")?;
                }
            }
            call.check(op, 0, |_| None)
        })?;
        q
    });
    let r = fresh(&transposed(&factors)?.narrow(1, 0, r_rows.min(m))?)?;
    keep_triangle(&r, true, false)?;
    let q = if mode == QrMode::R {
        by_dtype!(a.dtype(), T => Tensor::from_vec(Vec::<T>::new(), &[0], Device::Cuda(ordinal))?)
    } else {
        transposed(&q)?
    };
    Ok([q, r])
}

/// `eigh` / `eigvalsh` of the contiguous `[count, n, n]` batch `a` (its lower triangle, or
/// upper): `syevd`; eigenvalues `[count, n]` ascending and, with `vectors`, the eigenvectors
/// as columns `[count, n, n]`.
pub(super) fn eigh(
    op: &'static str,
    a: &Tensor,
    count: usize,
    n: usize,
    upper: bool,
    vectors: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let work_matrix = fresh(&a.view(&[count, n, n])?)?;
    let w = by_dtype!(a.dtype(), T => {
        let w = CudaBuffer::zeroed(ordinal, count * n * size_of::<T>())?;
        solve(ordinal, count, 1, |call| {
            if count == 0 || n == 0 {
                return Ok(());
            }
            let uplo = if upper { LOWER } else { UPPER };
            let jobz = if vectors {
                sol::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR
            } else {
                sol::cusolverEigMode_t::CUSOLVER_EIG_MODE_NOVECTOR
            };
            let (base, w_base) = (address(&work_matrix, &call.stream)?, call.address(&w)?);
            let (mut device, mut host) = (0usize, 0usize);
            // SAFETY: a size query for the first matrix (live, n x n, lda n) and its values.
            let status = unsafe {
                sol::cusolverDnXsyevd_bufferSize(
                    call.solver.handle,
                    call.solver.params,
                    jobz,
                    uplo,
                    n as i64,
                    T::DATA,
                    base as *const c_void,
                    n as i64,
                    T::DATA,
                    w_base as *const c_void,
                    T::DATA,
                    &mut device,
                    &mut host,
                )
            };
            check(status, "cusolverDnXsyevd_bufferSize")?;
            let (work, mut host_work) = call.workspaces(device, host)?;
            let work_ptr = call.address(&work)?;
            let size = size_of::<T>() as u64;
            for i in 0..count {
                // SAFETY: matrix `i`, its n values, its info slot and the queried workspaces
                // are live on the device.
                let status = unsafe {
                    sol::cusolverDnXsyevd(
                        call.solver.handle,
                        call.solver.params,
                        jobz,
                        uplo,
                        n as i64,
                        T::DATA,
                        (base + (i * n * n) as u64 * size) as *mut c_void,
                        n as i64,
                        T::DATA,
                        (w_base + (i * n) as u64 * size) as *mut c_void,
                        T::DATA,
                        work_ptr as *mut c_void,
                        device,
                        host_work.as_mut_ptr().cast(),
                        host,
                        call.info(i, 0),
                    )
                };
                check(status, "cusolverDnXsyevd")?;
            }
            call.check(op, 0, |_| Some(LinAlgFailure::NoConvergence))
        })?;
        w
    });
    let values = Tensor::from_storage(
        Storage::Device(Box::new(w)),
        a.dtype(),
        a.device(),
        &[count, n],
    );
    // Column j of the column-major result is eigenvector j: row-major, the transpose.
    let vectors = vectors.then(|| transposed(&work_matrix)).transpose()?;
    Ok((values, vectors))
}

/// `svd` / `svdvals` of the contiguous `[count, m, n]` batch `a` by `gesvd` (which takes
/// `rows >= cols`: `Aᵀ` is factored where `m < n`, whose row-major memory it already is).
/// With `Some(full)`, `U` (`[count, m, m]` or `[count, m, k]`) and `Vh` (`[count, n, n]` or
/// `[count, k, n]`) too.
pub(super) fn svd(
    op: &'static str,
    a: &Tensor,
    count: usize,
    (m, n): (usize, usize),
    full: Option<bool>,
) -> Result<(Tensor, Option<[Tensor; 2]>)> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let k = m.min(n);
    if k == 0 {
        // No singular values; U and Vh are identities (where they have a size).
        let (u_cols, v_rows) = if full == Some(true) { (m, n) } else { (0, 0) };
        let vectors = full
            .map(|_| {
                by_dtype!(a.dtype(), T => Ok::<_, Error>([
                    host_matrices::<T>(ordinal, count, [m, u_cols], |_, r, c| r == c)?,
                    host_matrices::<T>(ordinal, count, [v_rows, n], |_, r, c| r == c)?,
                ]))
            })
            .transpose()?;
        let values =
            by_dtype!(a.dtype(), T => Tensor::from_vec(Vec::<T>::new(), &[count, 0], a.device())?);
        return Ok((values, vectors));
    }
    let flipped = m < n;
    // The factored matrix, column-major `rows × cols` with rows >= cols.
    let (rows, cols) = if flipped { (n, m) } else { (m, n) };
    let matrix = if flipped {
        fresh(&a.view(&[count, m, n])?)?
    } else {
        transposed(&a.view(&[count, m, n])?)?
    };
    let (job, u_cols, vt_rows) = match full {
        Some(true) => (b'A', rows, cols),
        Some(false) => (b'S', k, k),
        None => (b'N', 1, 1),
    };
    let size = a.dtype().size();
    let buffers = |len: usize| CudaBuffer::zeroed(ordinal, (count * len * size).max(1));
    let (s, u, vt) = (
        buffers(k)?,
        buffers(rows * u_cols)?,
        buffers(vt_rows * cols)?,
    );
    by_dtype!(a.dtype(), T => {
        solve(ordinal, count, 1, |call| {
            if count == 0 || k == 0 {
                return Ok(());
            }
            let base = address(&matrix, &call.stream)?;
            let (s_base, u_base, vt_base) =
                (call.address(&s)?, call.address(&u)?, call.address(&vt)?);
            let (r, c) = (rows as i64, cols as i64);
            let (ldu, ldvt) = (rows as i64, vt_rows as i64);
            let (mut device, mut host) = (0usize, 0usize);
            // SAFETY: a size query for the first matrix and its outputs (live).
            let status = unsafe {
                sol::cusolverDnXgesvd_bufferSize(
                    call.solver.handle,
                    call.solver.params,
                    job as _,
                    job as _,
                    r,
                    c,
                    T::DATA,
                    base as *const c_void,
                    r,
                    T::DATA,
                    s_base as *const c_void,
                    T::DATA,
                    u_base as *const c_void,
                    ldu,
                    T::DATA,
                    vt_base as *const c_void,
                    ldvt,
                    T::DATA,
                    &mut device,
                    &mut host,
                )
            };
            check(status, "cusolverDnXgesvd_bufferSize")?;
            let (work, mut host_work) = call.workspaces(device, host)?;
            let work_ptr = call.address(&work)?;
            let step = |len: usize, i: usize| (i * len * size) as u64;
            let (u_len, vt_len) = if full.is_some() {
                (rows * u_cols, vt_rows * cols)
            } else {
                (0, 0)
            };
            for i in 0..count {
                // SAFETY: matrix `i` (column-major rows x cols, lda rows), its values and
                // vectors (ldu rows, ldvt vt_rows), its info slot and the queried workspaces
                // are live on the device.
                let status = unsafe {
                    sol::cusolverDnXgesvd(
                        call.solver.handle,
                        call.solver.params,
                        job as _,
                        job as _,
                        r,
                        c,
                        T::DATA,
                        (base + step(rows * cols, i)) as *mut c_void,
                        r,
                        T::DATA,
                        (s_base + step(k, i)) as *mut c_void,
                        T::DATA,
                        (u_base + step(u_len, i)) as *mut c_void,
                        ldu,
                        T::DATA,
                        (vt_base + step(vt_len, i)) as *mut c_void,
                        ldvt,
                        T::DATA,
                        work_ptr as *mut c_void,
                        device,
                        host_work.as_mut_ptr().cast(),
                        host,
                        call.info(i, 0),
                    )
                };
                check(status, "cusolverDnXgesvd")?;
            }
            call.check(op, 0, |_| Some(LinAlgFailure::NoConvergence))
        })?;
    });
    let tensor = |buffer: CudaBuffer, shape: &[usize]| {
        Tensor::from_storage(
            Storage::Device(Box::new(buffer)),
            a.dtype(),
            a.device(),
            shape,
        )
    };
    let values = tensor(s, &[count, k]);
    let vectors = match full {
        None => None,
        // Aᵀ = U' S V'ᵀ: U = V' is VT''s memory read row-major, Vh = U'ᵀ is U''s.
        Some(_) if flipped => Some([
            tensor(vt, &[count, m, vt_rows]),
            tensor(u, &[count, u_cols, n]),
        ]),
        // A = U S Vᵀ column-major: both transposed to row-major.
        Some(_) => Some([
            transposed(&tensor(u, &[count, u_cols, m]))?,
            transposed(&tensor(vt, &[count, n, vt_rows]))?,
        ]),
    };
    Ok((values, vectors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The triangle kernel on the PTX interpreter (this test reruns itself in a child
    /// process where `cuda:0` is the interpreter): lower, unit lower and upper triangles of
    /// wide and tall matrices of a batch, against the same cut made on the host.
    #[test]
    fn the_triangle_kernel_keeps_one_triangle() {
        const CHILD: &str = "BACKENDS_TRIANGLE_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let name = "ops::linalg::cusolver::tests::the_triangle_kernel_keeps_one_triangle";
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env(crate::runtime::cuda::INTERPRET_ENV, "1")
                .output()
                .unwrap();
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.status.success() && log.contains("1 passed"), "{log}");
            for line in log.lines().filter(|l| l.starts_with("skipped:")) {
                eprintln!("{line}");
            }
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
