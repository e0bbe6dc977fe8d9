//! The Cholesky family on cuSOLVER: `potrf`, and `potrs` for `cholesky_solve` and
//! `cholesky_inverse`.

use std::ffi::c_void;

use cudarc::cusolver::sys as sol;

use super::{
    Call, Real, address, check, fresh, host_matrices, keep_triangle, right_sides, solve, transposed,
};
use crate::core::error::LinAlgFailure;
use crate::core::tensor::Tensor;
use crate::{DType, Device, Error, Result};

use sol::cublasFillMode_t::{CUBLAS_FILL_MODE_LOWER as LOWER, CUBLAS_FILL_MODE_UPPER as UPPER};

/// `cholesky` of the contiguous `[count, n, n]` batch `a` (its lower triangle, or upper).
pub(in crate::ops::linalg) fn cholesky(
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
            let mut work = call.workspace("cusolverDnXpotrf_bufferSize", |device, host| {
                // SAFETY: a size query for the first matrix (live, n x n, lda n).
                unsafe {
                    sol::cusolverDnXpotrf_bufferSize(
                        call.solver.handle,
                        call.solver.params,
                        uplo,
                        n as i64,
                        T::DATA,
                        base as *const c_void,
                        n as i64,
                        T::DATA,
                        device,
                        host,
                    )
                }
            })?;
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
                        work.device_ptr as *mut c_void,
                        work.device_bytes,
                        work.host.as_mut_ptr().cast(),
                        work.host_bytes,
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
pub(in crate::ops::linalg) fn cholesky_inverse(
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
pub(in crate::ops::linalg) fn cholesky_solve(
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
