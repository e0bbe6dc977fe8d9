//! The LU family on cuSOLVER: `getrf`, and `getrs` for `inv` and `lu_solve`.

use std::ffi::{c_int, c_void};

use cudarc::cusolver::sys as sol;

use super::{
    Call, Real, address, check, fresh, host_matrices, keep_triangle, right_sides, solve, transposed,
};
use crate::core::error::LinAlgFailure;
use crate::core::tensor::Tensor;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{DType, Device, Result};

/// `inv` of the contiguous `[count, n, n]` batch `a`: `getrf`, then `getrs` on the identity.
pub(in crate::ops::linalg) fn inv(
    op: &'static str,
    a: &Tensor,
    count: usize,
    n: usize,
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    by_dtype!(a.dtype(), T => {
        let factors = transposed(&a.view(&[count, n, n])?)?;
        let x = host_matrices::<T>(ordinal, count, [n, n], |_, r, c| r == c)?;
        solve(ordinal, count, 2, |call| {
            let (lu, x) = (address(&factors, &call.stream)?, address(&x, &call.stream)?);
            let step = (n * n * size_of::<T>()) as u64;
            lu_in_place::<T>(call, &factors, count, [n, n], |i, pivots| {
                let at = i as u64 * step;
                // SAFETY: matrix `i` of the factors and of the identity (n x n), the pivots
                // `getrf` wrote for it and its info slot are live on the device.
                unsafe { getrs::<T>(call, (n, n, false), lu + at, pivots, x + at, call.info(i, 1)) }
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
    let mut work = call.workspace("cusolverDnXgetrf_bufferSize", |device, host| {
        // SAFETY: a size query for the first matrix (live, column-major, lda = rows).
        unsafe {
            sol::cusolverDnXgetrf_bufferSize(
                call.solver.handle,
                call.solver.params,
                m,
                n,
                T::DATA,
                a as *const c_void,
                m,
                T::DATA,
                device,
                host,
            )
        }
    })?;
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
                work.device_ptr as *mut c_void,
                work.device_bytes,
                work.host.as_mut_ptr().cast(),
                work.host_bytes,
                call.info(i, 0),
            )
        };
        check(status, "cusolverDnXgetrf")?;
        then(i, ipiv)?;
    }
    Ok(pivots)
}

/// `getrs`: solves `A X = B` in place for the `k` right sides at `rhs` (column-major `n × k`)
/// from `getrf`'s factors at `lu` (column-major `n × n`) and their `pivots`, reporting into
/// `info`.
///
/// # Safety
/// The four addresses are device memory of those sizes, live until the stream runs the call.
unsafe fn getrs<T: Real>(
    call: &Call,
    (n, k, adjoint): (usize, usize, bool),
    lu: u64,
    pivots: *const i64,
    rhs: u64,
    info: *mut c_int,
) -> Result<()> {
    // SAFETY: the caller's promise.
    let status = unsafe {
        sol::cusolverDnXgetrs(
            call.solver.handle,
            call.solver.params,
            if adjoint {
                sol::cublasOperation_t::CUBLAS_OP_T
            } else {
                sol::cublasOperation_t::CUBLAS_OP_N
            },
            n as i64,
            k as i64,
            T::DATA,
            lu as *const c_void,
            n as i64,
            pivots,
            T::DATA,
            rhs as *mut c_void,
            n as i64,
            info,
        )
    };
    check(status, "cusolverDnXgetrs")
}

/// The i64 pivots cuSOLVER wrote, as LAPACK's i32s.
fn pivots_i32(pivots: &CudaBuffer) -> Result<Vec<i32>> {
    Ok(pivots
        .download()?
        .chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().expect("8 bytes")) as i32)
        .collect())
}

/// `lu_factor` of the contiguous `[count, m, n]` batch `a`: packed factors, each matrix
/// column-major (`[count, n, m]`), and i32 pivots (a zero pivot is an error, with `checked`).
pub(in crate::ops::linalg) fn lu_factor(
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
    Ok((factors, pivots))
}

/// `lu` of the contiguous `[count, m, n]` batch `a`: `P` (`[count, m, m]`), `L` (`[count, m,
/// k]`), `U` (`[count, k, n]`).
pub(in crate::ops::linalg) fn lu(
    a: &Tensor,
    count: usize,
    (m, n): (usize, usize),
) -> Result<[Tensor; 3]> {
    let Device::Cuda(ordinal) = a.device() else {
        unreachable!("a CUDA tensor")
    };
    let k = m.min(n);
    let (packed, pivots) = lu_factor("linalg.lu", a, count, (m, n), false)?;
    let packed = packed.transpose(1, 2)?;
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

/// `lu_solve` of `b` (broadcast along `pairs`) against the packed factors (`[.., n, n]`, any
/// layout; lu_factor's column-major ones are read as they are) and their (checked) pivots,
/// or against their transpose with `adjoint`.
pub(in crate::ops::linalg) fn lu_solve(
    op: &'static str,
    packed: &Tensor,
    (pivots, adjoint): (&[i32], bool),
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
                    // SAFETY: factors `ia` (n x n), their pivots, right side `i` (n x k) and
                    // info slot `i` are live on the device.
                    unsafe {
                        getrs::<T>(
                            call,
                            (n, k, adjoint),
                            lu + (ia * n * n) as u64 * size,
                            (ipiv + (8 * ia * n) as u64) as *const i64,
                            rhs + (i * n * k) as u64 * size,
                            call.info(i, 0),
                        )?;
                    }
                }
            }
            call.check(op, 0, |_| None)
        })?;
    });
    let shape: Vec<usize> = dims.iter().copied().chain([n, k]).collect();
    transposed(&x)?.view(&shape)
}
