//! The orthogonal factorizations on cuSOLVER: `geqrf` with `ormqr` for `qr`, `syevd` for
//! `eigh`, `gesvd` for `svd`.

use std::ffi::{c_int, c_void};

use cudarc::cusolver::sys as sol;

use super::super::QrMode;
use super::{Real, address, check, fresh, host_matrices, keep_triangle, solve, transposed};
use crate::core::error::LinAlgFailure;
use crate::core::tensor::{Storage, Tensor};
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{DType, Device, Error, Result};

use sol::cublasFillMode_t::{CUBLAS_FILL_MODE_LOWER as LOWER, CUBLAS_FILL_MODE_UPPER as UPPER};

/// `qr` of the contiguous `[count, m, n]` batch `a`: `geqrf`, then `Q` by `ormqr` applied to
/// the first columns of the identity; `R` cut from the factored matrix.
pub(in crate::ops::linalg) fn qr(
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
            let mut work = call.workspace("cusolverDnXgeqrf_bufferSize", |device, host| {
                // SAFETY: a size query for the first matrix (live, column-major, lda = m).
                unsafe {
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
                        device,
                        host,
                    )
                }
            })?;
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
                        work.device_ptr as *mut c_void,
                        work.device_bytes,
                        work.host.as_mut_ptr().cast(),
                        work.host_bytes,
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
pub(in crate::ops::linalg) fn eigh(
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
            let mut work = call.workspace("cusolverDnXsyevd_bufferSize", |device, host| {
                // SAFETY: a size query for the first matrix (live, n x n, lda n) and its values.
                unsafe {
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
                        device,
                        host,
                    )
                }
            })?;
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
                        work.device_ptr as *mut c_void,
                        work.device_bytes,
                        work.host.as_mut_ptr().cast(),
                        work.host_bytes,
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
pub(in crate::ops::linalg) fn svd(
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
            let mut work = call.workspace("cusolverDnXgesvd_bufferSize", |device, host| {
                // SAFETY: a size query for the first matrix and its outputs (live).
                unsafe {
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
                        device,
                        host,
                    )
                }
            })?;
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
                        work.device_ptr as *mut c_void,
                        work.device_bytes,
                        work.host.as_mut_ptr().cast(),
                        work.host_bytes,
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

fn i32_len(op: &'static str, value: usize) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| Error::ShapeMismatch {
        op,
        detail: format!("{value} exceeds cuSOLVER's 32-bit sizes for this call"),
    })
}
