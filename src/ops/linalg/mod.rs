//! Linear algebra (`torch.linalg`'s `inv`, `cholesky`, `lu_factor`, `lu`, `lu_solve`, `qr`,
//! `eigh`, `eigvalsh`, `svd`, `svdvals`, and `torch.cholesky_solve` / `cholesky_inverse`).
//!
//! Every function takes a batch of matrices `[*, m, n]` (any leading dimensions, 0 too) of
//! f32 or f64 and factors each matrix in the input's dtype, as PyTorch's LAPACK calls do; the
//! two-operand solves broadcast their batch dimensions. Results are contiguous tensors on
//! the CPU. A matrix without the asked-for factorization is [`Error::LinAlg`] naming its
//! index in the flattened batch and what failed ([`LinAlgFailure`]), with PyTorch's messages;
//! `eigh`, `eigvalsh`, `svd` and `svdvals` of a matrix holding a non-finite value (in the
//! triangle `eigh` reads) give NaN for that matrix, as PyTorch's batched calls do.
//!
//! The CPU runs `faer` (`linalg/cpu.rs`), one matrix per pool thread, each single-threaded;
//! where a batch has fewer matrices than the pool has threads, each matrix of order 512 or
//! more is factored on the threads left over (faer's rayon parallelism). Every faer call is
//! given its parallelism: faer's default under its `rayon` feature, rayon for every call,
//! oversubscribed the pool (a 256 x 256 QR ran 20x slower). CUDA tensors
//! factor on their device through cuSOLVER (`linalg/cusolver/`, loaded at run time), which
//! `cuda::preferred_linalg_library` (`linalg/library.rs`) keeps under every preference as
//! MAGMA's calls are not wired in; the trace says why. On CUDA a failed factorization of
//! `eigh` or `svd` (a non-finite input among them) is [`LinAlgFailure::NoConvergence`]
//! rather than NaN. wgpu tensors are refused with a typed error; move them to the CPU.
//!
//! [`LinAlgFailure`]: crate::core::error::LinAlgFailure

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

mod cpu;
#[cfg(feature = "cuda")]
mod cusolver;
pub mod library;

use std::sync::Mutex;

use cpu::{Failure, Real};

use crate::core::tensor::{checked_numel, host_zeros};
use crate::core::trace::{self, Call};
use crate::{DType, Device, Error, Result, Tensor};

/// `torch.linalg.qr`'s `mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QrMode {
    /// `Q` is `m × k`, `R` is `k × n` (`k = min(m, n)`).
    #[default]
    Reduced,
    /// `Q` is `m × m`, `R` is `m × n`.
    Complete,
    /// Only `R` (`k × n`); `Q` is an empty tensor.
    R,
}

/// `lu_factor`'s result: `L` (unit diagonal, not stored) and `U` packed in one matrix, and
/// LAPACK's row interchanges (`i32`, from 1).
#[derive(Clone, Debug)]
pub struct LuFactor {
    /// `[*, m, n]`: `U` on and above the diagonal, `L` below it; each matrix column-major
    /// (strides `[.., 1, m]`, the transpose of a contiguous `[*, n, m]`), as PyTorch returns
    /// it.
    pub lu: Tensor,
    /// `[*, min(m, n)]`, i32: at step `i`, row `i` was swapped with row `pivots[i] - 1`.
    pub pivots: Tensor,
}

/// `lu`'s result: `A = P L U`.
#[derive(Clone, Debug)]
pub struct Lu {
    /// `[*, m, m]`, a permutation matrix.
    pub p: Tensor,
    /// `[*, m, k]`, unit lower triangular.
    pub l: Tensor,
    /// `[*, k, n]`, upper triangular.
    pub u: Tensor,
}

/// `qr`'s result: `A = Q R`.
#[derive(Clone, Debug)]
pub struct Qr {
    /// Orthonormal columns (empty with [`QrMode::R`]).
    pub q: Tensor,
    /// Upper triangular.
    pub r: Tensor,
}

/// `eigh`'s result: `A = V diag(w) Vᵀ`.
#[derive(Clone, Debug)]
pub struct Eigh {
    /// `[*, n]`, ascending.
    pub eigenvalues: Tensor,
    /// `[*, n, n]`, one eigenvector per column.
    pub eigenvectors: Tensor,
}

/// `svd`'s result: `A = U diag(S) Vh`.
#[derive(Clone, Debug)]
pub struct Svd {
    /// `[*, m, m]` (full) or `[*, m, k]`.
    pub u: Tensor,
    /// `[*, k]`, descending, non-negative.
    pub s: Tensor,
    /// `[*, n, n]` (full) or `[*, k, n]`.
    pub vh: Tensor,
}

/// A batch of matrices: its batch shape, rows and columns.
struct Batch {
    dims: Vec<usize>,
    count: usize,
    rows: usize,
    cols: usize,
}

impl Batch {
    fn of(op: &'static str, t: &Tensor) -> Result<Batch> {
        if let Device::Wgpu(_) = t.device() {
            return Err(Error::Unavailable {
                what: "linear algebra on wgpu",
                why: format!(
                    "{op} runs on the CPU (faer) and on CUDA (cuSOLVER); move the input with \
                     to_device(Device::Cpu)"
                ),
            });
        }
        if !matches!(t.dtype(), DType::F32 | DType::F64) {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: t.dtype(),
            });
        }
        let rank = t.shape().len();
        if rank < 2 {
            return Err(Error::ShapeMismatch {
                op,
                detail: format!(
                    "the input must have at least 2 dimensions (a batch of matrices), got {:?}",
                    t.shape()
                ),
            });
        }
        let dims = t.shape()[..rank - 2].to_vec();
        let (rows, cols) = (t.shape()[rank - 2], t.shape()[rank - 1]);
        // LAPACK's (and the pivots') indices are i32.
        if i32::try_from(rows.max(cols)).is_err() {
            return Err(Error::ShapeMismatch {
                op,
                detail: format!("matrices of {rows} x {cols} are larger than LAPACK's i32 sizes"),
            });
        }
        Ok(Batch {
            count: checked_numel(op, &dims, t.dtype())?,
            dims,
            rows,
            cols,
        })
    }

    fn square(op: &'static str, t: &Tensor) -> Result<Batch> {
        let batch = Batch::of(op, t)?;
        if batch.rows != batch.cols {
            return Err(Error::ShapeMismatch {
                op,
                detail: format!(
                    "A must be batches of square matrices, but they are {} by {} matrices",
                    batch.rows, batch.cols
                ),
            });
        }
        Ok(batch)
    }

    /// `dims` followed by `tail`.
    fn shape(&self, tail: &[usize]) -> Vec<usize> {
        self.dims.iter().chain(tail).copied().collect()
    }
}

/// One batch element's outputs.
struct Item<'a, T> {
    index: usize,
    outs: Vec<&'a mut [T]>,
    pivots: &'a mut [i32],
}

/// `buffer` in `parts` runs of `per · size` elements (the last shorter; empty runs where
/// `size` is 0).
fn runs<T>(buffer: &mut [T], parts: usize, per: usize, size: usize) -> Vec<&mut [T]> {
    if size == 0 {
        (0..parts).map(|_| <&mut [T]>::default()).collect()
    } else {
        buffer.chunks_mut(per * size).collect()
    }
}

/// One thread's share of a batch: elements `first..first + len`, and its runs of each
/// output (and of the pivots).
struct Share<'a, T> {
    first: usize,
    len: usize,
    outs: Vec<&'a mut [T]>,
    pivots: &'a mut [i32],
}

/// Runs `work` on each of `count` batch elements over the thread pool, with outputs of
/// `sizes` elements each (and `pivots` i32s each); the failure of the lowest batch index is
/// the error. (Each thread takes one contiguous share: nothing is made per element up front,
/// and a batch whose every output is empty is not walked.) A batch smaller than the pool
/// factors each matrix on the threads it leaves over.
fn batched<T: Real>(
    op: &'static str,
    count: usize,
    sizes: &[usize],
    pivots: usize,
    work: impl Fn(&mut Item<'_, T>) -> Result<(), Failure> + Sync,
) -> Result<(Vec<Vec<T>>, Vec<i32>)> {
    let total = |size: usize| {
        size.checked_mul(count).ok_or_else(|| Error::ShapeMismatch {
            op,
            detail: format!("{count} results of {size} elements overflow the address space"),
        })
    };
    let mut buffers = sizes
        .iter()
        .map(|&size| host_zeros::<T>(op, total(size)?))
        .collect::<Result<Vec<_>>>()?;
    let mut pivot_buffer = host_zeros::<i32>(op, total(pivots)?)?;
    if count == 0 || (pivots == 0 && sizes.iter().all(|&s| s == 0)) {
        return Ok((buffers, pivot_buffer));
    }
    let threads = crate::get_num_threads();
    let parts = threads.clamp(1, count);
    let per = count.div_ceil(parts);
    let parts = count.div_ceil(per);
    // Threads left over by a batch smaller than the pool go to each matrix's factorization.
    let inner_threads = (threads / parts).max(1);
    let mut shares: Vec<Share<'_, T>> = runs(&mut pivot_buffer, parts, per, pivots)
        .into_iter()
        .enumerate()
        .map(|(p, pivots)| Share {
            first: p * per,
            len: per.min(count - p * per),
            outs: Vec::with_capacity(sizes.len()),
            pivots,
        })
        .collect();
    for (buffer, &size) in buffers.iter_mut().zip(sizes) {
        for (share, run) in shares.iter_mut().zip(runs(buffer, parts, per, size)) {
            share.outs.push(run);
        }
    }
    let first_failure: Mutex<Option<(usize, Failure)>> = Mutex::new(None);
    let run = |share: Share<'_, T>| {
        let Share {
            first,
            len,
            mut outs,
            pivots: share_pivots,
        } = share;
        let mut pivot_runs = share_pivots.chunks_mut(pivots.max(1));
        for i in 0..len {
            let mut item = Item {
                index: first + i,
                outs: outs
                    .iter_mut()
                    .zip(sizes)
                    .map(|(run, &size)| &mut run[i * size..(i + 1) * size])
                    .collect(),
                pivots: if pivots == 0 {
                    &mut []
                } else {
                    pivot_runs.next().expect("a run per element")
                },
            };
            if let Err(failure) = cpu::with_threads(inner_threads, || work(&mut item)) {
                let mut first = first_failure.lock().unwrap_or_else(|p| p.into_inner());
                if first.as_ref().is_none_or(|(index, _)| item.index < *index) {
                    *first = Some((item.index, failure));
                }
                // (The lowest failing index of this share is found: later ones lose to it.)
                break;
            }
        }
    };
    crate::runtime::threads::for_each(shares, &run);
    match first_failure
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        Some((index, Failure::LinAlg(failure))) => Err(Error::LinAlg {
            op,
            batch: (count > 1).then_some(index),
            failure,
        }),
        Some((_, Failure::Memory(error))) => Err(error),
        None => Ok((buffers, pivot_buffer)),
    }
}

/// Runs `body` under the trace as the kernel `op` over the inputs `shapes`.
fn traced<R>(
    op: &'static str,
    dtype: DType,
    shapes: &[&Tensor],
    body: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let device = shapes.first().map_or(Device::Cpu, |t| t.device());
    let describe = || Call {
        kernel: op.into(),
        backend: match device {
            Device::Cpu => "cpu/faer".into(),
            device => format!("{device}/cusolver"),
        },
        dtype,
        shapes: shapes
            .iter()
            .map(|t| format!("{:?}", t.shape()))
            .collect::<Vec<_>>()
            .join("x"),
        precision: match device {
            Device::Cpu => format!(
                "{dtype} factorization, batch over {} threads",
                crate::get_num_threads()
            ),
            _ => format!(
                "{dtype} factorization, one matrix at a time; {}",
                library::choice()
            ),
        },
    };
    trace::kernel(describe, body)
}

fn output(data: Vec<impl crate::Element>, shape: Vec<usize>) -> Result<Tensor> {
    Tensor::from_vec(data, &shape, Device::Cpu)
}

/// The matrices of the contiguous `t` (`[*, c, r]`) seen transposed: `[*, r, c]`, each
/// column-major.
fn column_major(t: Tensor) -> Result<Tensor> {
    let rank = t.shape().len();
    t.transpose(rank - 2, rank - 1)
}

/// `torch.linalg.inv`: the inverse of each square matrix; a singular one is an error.
pub fn inv(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.inv";
    let batch = Batch::square(OP, a)?;
    let n = batch.rows;
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(OP, a.dtype(), &[a], || {
            cusolver::inv(OP, &a.contiguous()?, batch.count, n)?.view(&batch.shape(&[n, n]))
        });
    }
    traced(OP, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (mut outs, _) = batched::<T>(OP, batch.count, &[n * n], 0, |item| {
                let i = item.index;
                cpu::inv(&data[i * n * n..][..n * n], n, item.outs[0])
            })?;
            output(outs.remove(0), batch.shape(&[n, n]))
        })
    })
}

/// `torch.linalg.cholesky`: `L` with `A = L Lᵀ` read from A's lower triangle, or, with
/// `upper`, `U = Lᵀ` read from the upper one; a matrix that is not positive-definite is an
/// error naming the first leading minor that is not.
pub fn cholesky(a: &Tensor, upper: bool) -> Result<Tensor> {
    const OP: &str = "linalg.cholesky";
    let batch = Batch::square(OP, a)?;
    let n = batch.rows;
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(OP, a.dtype(), &[a], || {
            cusolver::cholesky(OP, &a.contiguous()?, batch.count, n, upper)?
                .view(&batch.shape(&[n, n]))
        });
    }
    traced(OP, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (mut outs, _) = batched::<T>(OP, batch.count, &[n * n], 0, |item| {
                let i = item.index;
                cpu::cholesky(&data[i * n * n..][..n * n], n, upper, item.outs[0])
            })?;
            output(outs.remove(0), batch.shape(&[n, n]))
        })
    })
}

/// `torch.cholesky_inverse`: `A⁻¹` from A's Cholesky factor (lower, or upper with `upper`);
/// a zero on the factor's diagonal is an error.
pub fn cholesky_inverse(factor: &Tensor, upper: bool) -> Result<Tensor> {
    const OP: &str = "cholesky_inverse";
    let batch = Batch::square(OP, factor)?;
    let n = batch.rows;
    #[cfg(feature = "cuda")]
    if factor.device() != Device::Cpu {
        return traced(OP, factor.dtype(), &[factor], || {
            cusolver::cholesky_inverse(OP, &factor.contiguous()?, batch.count, n, upper)?
                .view(&batch.shape(&[n, n]))
        });
    }
    traced(OP, factor.dtype(), &[factor], || {
        by_dtype!(factor.dtype(), T => {
            let data = factor.elements::<T>()?;
            let (mut outs, _) = batched::<T>(OP, batch.count, &[n * n], 0, |item| {
                let i = item.index;
                cpu::cholesky_inverse(&data[i * n * n..][..n * n], n, upper, item.outs[0])
            })?;
            output(outs.remove(0), batch.shape(&[n, n]))
        })
    })
}

/// The broadcast of two batch shapes, and for each of its elements the (flattened) index
/// into each side's batch.
fn broadcast(op: &'static str, a: &[usize], b: &[usize]) -> Result<(Vec<usize>, Vec<[usize; 2]>)> {
    let rank = a.len().max(b.len());
    let padded = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, rank - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (pa, pb) = (padded(a), padded(b));
    let mut shape = Vec::with_capacity(rank);
    for (&x, &y) in pa.iter().zip(&pb) {
        if x != y && x != 1 && y != 1 {
            return Err(Error::ShapeMismatch {
                op,
                detail: format!("the batch dimensions {a:?} and {b:?} do not broadcast"),
            });
        }
        shape.push(if x == 1 { y } else { x });
    }
    let count = checked_numel(op, &shape, DType::F64)?;
    let mut pairs = Vec::with_capacity(count);
    for flat in 0..count {
        let (mut rest, mut ia, mut ib, mut sa, mut sb) = (flat, 0, 0, 1, 1);
        for d in (0..rank).rev() {
            let coordinate = rest % shape[d];
            rest /= shape[d];
            if pa[d] != 1 {
                ia += coordinate * sa;
            }
            if pb[d] != 1 {
                ib += coordinate * sb;
            }
            sa *= pa[d];
            sb *= pb[d];
        }
        pairs.push([ia, ib]);
    }
    Ok((shape, pairs))
}

fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    Ok(())
}

/// `torch.cholesky_solve(B, L, upper)`: `X` with `A X = B` where `A = L Lᵀ` (or `Uᵀ U` with
/// `upper`); `B` is `[*, n, k]`, `L` `[*, n, n]`, batch dimensions broadcast.
pub fn cholesky_solve(b: &Tensor, factor: &Tensor, upper: bool) -> Result<Tensor> {
    const OP: &str = "cholesky_solve";
    let fb = Batch::square(OP, factor)?;
    let bb = Batch::of(OP, b)?;
    same_dtype(OP, factor, b)?;
    let (n, k) = (fb.rows, bb.cols);
    if bb.rows != n {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: format!(
                "B has {} rows but the factor is {n} x {n}: B must be [*, {n}, k]",
                bb.rows
            ),
        });
    }
    let (dims, pairs) = broadcast(OP, &bb.dims, &fb.dims)?;
    #[cfg(feature = "cuda")]
    if b.device() != Device::Cpu {
        return traced(OP, b.dtype(), &[b, factor], || {
            let factor = factor.contiguous()?;
            cusolver::cholesky_solve(OP, b, &factor, (&dims, &pairs), (n, k), upper)
        });
    }
    traced(OP, b.dtype(), &[b, factor], || {
        by_dtype!(b.dtype(), T => {
            let (rhs, l) = (b.elements::<T>()?, factor.elements::<T>()?);
            let (mut outs, _) = batched::<T>(OP, pairs.len(), &[n * k], 0, |item| {
                let [ib, il] = pairs[item.index];
                cpu::cholesky_solve(&rhs[ib * n * k..][..n * k], &l[il * n * n..][..n * n], n, k, upper, item.outs[0])
            })?;
            output(outs.remove(0), dims.iter().copied().chain([n, k]).collect())
        })
    })
}

/// `torch.linalg.lu_factor`: the packed LU factorisation with partial pivoting; a zero pivot
/// is an error (use [`lu`], which factors singular matrices too).
pub fn lu_factor(a: &Tensor) -> Result<LuFactor> {
    const OP: &str = "linalg.lu_factor";
    let batch = Batch::of(OP, a)?;
    let (m, n) = (batch.rows, batch.cols);
    let k = m.min(n);
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(OP, a.dtype(), &[a], || {
            let (lu, pivots) =
                cusolver::lu_factor(OP, &a.contiguous()?, batch.count, (m, n), true)?;
            Ok(LuFactor {
                lu: column_major(lu.view(&batch.shape(&[n, m]))?)?,
                pivots: Tensor::from_vec(pivots, &batch.shape(&[k]), a.device())?,
            })
        });
    }
    traced(OP, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (mut outs, pivots) = batched::<T>(OP, batch.count, &[m * n], k, |item| {
                let i = item.index;
                let Item { outs, pivots, .. } = item;
                cpu::lu_factor(&data[i * m * n..][..m * n], (m, n), outs[0], pivots)
            })?;
            Ok(LuFactor {
                lu: column_major(output(outs.remove(0), batch.shape(&[n, m]))?)?,
                pivots: output(pivots, batch.shape(&[k]))?,
            })
        })
    })
}

/// `torch.linalg.lu`: `A = P L U` with partial pivoting, for any matrix (singular too).
pub fn lu(a: &Tensor) -> Result<Lu> {
    const OP: &str = "linalg.lu";
    let batch = Batch::of(OP, a)?;
    let (m, n) = (batch.rows, batch.cols);
    let k = m.min(n);
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(OP, a.dtype(), &[a], || {
            let [p, l, u] = cusolver::lu(&a.contiguous()?, batch.count, (m, n))?;
            Ok(Lu {
                p: p.view(&batch.shape(&[m, m]))?,
                l: l.view(&batch.shape(&[m, k]))?,
                u: u.view(&batch.shape(&[k, n]))?,
            })
        });
    }
    traced(OP, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (outs, _) = batched::<T>(OP, batch.count, &[m * m, m * k, k * n], 0, |item| {
                let i = item.index;
                let [p, l, u] = &mut item.outs[..] else { unreachable!("three outputs") };
                cpu::lu(&data[i * m * n..][..m * n], (m, n), [p, l, u])
            })?;
            let [p, l, u] = <[Vec<T>; 3]>::try_from(outs).map_err(|_| unreachable!())?;
            Ok(Lu {
                p: output(p, batch.shape(&[m, m]))?,
                l: output(l, batch.shape(&[m, k]))?,
                u: output(u, batch.shape(&[k, n]))?,
            })
        })
    })
}

/// `torch.linalg.lu_solve(LU, pivots, B, left=, adjoint=)`: from `lu_factor`'s result, `X`
/// with `A X = B` (`left`; `B` is `[*, n, k]`) or `X A = B` (not `left`; `B` is
/// `[*, k, n]`), `A` replaced by `Aᵀ` with `adjoint` (the adjoint of a real matrix); batch
/// dimensions broadcast.
pub fn lu_solve(factors: &LuFactor, b: &Tensor, left: bool, adjoint: bool) -> Result<Tensor> {
    const OP: &str = "linalg.lu_solve";
    if left {
        return solve_left(factors, b, adjoint, true);
    }
    // X A = B is Aᵀ Xᵀ = Bᵀ (X Aᵀ = B is A Xᵀ = Bᵀ): solved so, the result transposed back
    // (row-major, as PyTorch returns it).
    Batch::of(OP, b)?;
    let rank = b.shape().len();
    let xt = solve_left(factors, &b.transpose(rank - 2, rank - 1)?, !adjoint, false)?;
    xt.transpose(rank - 2, rank - 1)?.contiguous()
}

/// `A X = B` (`Aᵀ X = B` with `adjoint`) for [`lu_solve`], whose `B` is this `B` (`left`)
/// or its transpose (for the messages).
fn solve_left(factors: &LuFactor, b: &Tensor, adjoint: bool, left: bool) -> Result<Tensor> {
    const OP: &str = "linalg.lu_solve";
    let fb = Batch::square(OP, &factors.lu)?;
    let bb = Batch::of(OP, b)?;
    same_dtype(OP, &factors.lu, b)?;
    let n = fb.rows;
    let pivots_shape = fb.shape(&[n]);
    if factors.pivots.dtype() != DType::I32 || factors.pivots.shape() != pivots_shape {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: format!(
                "pivots must be i32 of shape {pivots_shape:?} (lu_factor's), got {} of {:?}",
                factors.pivots.dtype(),
                factors.pivots.shape()
            ),
        });
    }
    let pivots = factors.pivots.to_vec::<i32>()?;
    if let Some(bad) = pivots.iter().find(|&&p| p < 1 || p as usize > n) {
        return Err(Error::InvalidArgument {
            what: "pivots",
            why: format!("{bad} is not a row of an {n} x {n} matrix (pivots count from 1)"),
        });
    }
    if bb.rows != n {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: if left {
                format!(
                    "B has {} rows but A is {n} x {n}: B must be [*, {n}, k]",
                    bb.rows
                )
            } else {
                format!(
                    "B has {} columns but A is {n} x {n}: with left = false B must be [*, k, {n}]",
                    bb.rows
                )
            },
        });
    }
    let k = bb.cols;
    let (dims, pairs) = broadcast(OP, &bb.dims, &fb.dims)?;
    #[cfg(feature = "cuda")]
    if b.device() != Device::Cpu {
        return traced(OP, b.dtype(), &[&factors.lu, b], || {
            let shapes = (&dims[..], &pairs[..]);
            cusolver::lu_solve(OP, &factors.lu, (&pivots, adjoint), b, shapes, (n, k))
        });
    }
    traced(OP, b.dtype(), &[&factors.lu, b], || {
        // lu_factor's factors are read as they are, column-major; others row-major.
        let rank = factors.lu.shape().len();
        let transposed = factors.lu.transpose(rank - 2, rank - 1)?;
        let column_major = transposed.is_contiguous();
        let packed = if column_major {
            &transposed
        } else {
            &factors.lu
        };
        by_dtype!(b.dtype(), T => {
            let (rhs, packed) = (b.elements::<T>()?, &packed.elements::<T>()?);
            let (mut outs, _) = batched::<T>(OP, pairs.len(), &[n * k], 0, |item| {
                let [ib, ia] = pairs[item.index];
                cpu::lu_solve(
                    (&packed[ia * n * n..][..n * n], column_major),
                    (&pivots[ia * n..][..n], adjoint),
                    &rhs[ib * n * k..][..n * k],
                    (n, k),
                    item.outs[0],
                )
            })?;
            output(outs.remove(0), dims.iter().copied().chain([n, k]).collect())
        })
    })
}

/// `torch.linalg.qr(A, mode)`: `A = Q R` with orthonormal `Q` and upper triangular `R`.
pub fn qr(a: &Tensor, mode: QrMode) -> Result<Qr> {
    const OP: &str = "linalg.qr";
    let batch = Batch::of(OP, a)?;
    let (m, n) = (batch.rows, batch.cols);
    let k = m.min(n);
    let complete = mode == QrMode::Complete;
    let (q_cols, r_rows) = if complete { (m, m) } else { (k, k) };
    let q_size = if mode == QrMode::R { 0 } else { m * q_cols };
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(OP, a.dtype(), &[a], || {
            let [q, r] = cusolver::qr(OP, &a.contiguous()?, batch.count, (m, n), mode)?;
            let q_shape = if mode == QrMode::R {
                vec![0]
            } else {
                batch.shape(&[m, q_cols])
            };
            Ok(Qr {
                q: q.view(&q_shape)?,
                r: r.view(&batch.shape(&[r_rows, n]))?,
            })
        });
    }
    traced(OP, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (outs, _) = batched::<T>(OP, batch.count, &[q_size, r_rows * n], 0, |item| {
                let i = item.index;
                let [q, r] = &mut item.outs[..] else { unreachable!("two outputs") };
                let q = (mode != QrMode::R).then_some(&mut **q);
                cpu::qr(&data[i * m * n..][..m * n], (m, n), complete, q, r)
            })?;
            let [q, r] = <[Vec<T>; 2]>::try_from(outs).map_err(|_| unreachable!())?;
            let q_shape = if mode == QrMode::R { vec![0] } else { batch.shape(&[m, q_cols]) };
            Ok(Qr {
                q: output(q, q_shape)?,
                r: output(r, batch.shape(&[r_rows, n]))?,
            })
        })
    })
}

/// `torch.linalg.eigh(A, UPLO)`: eigenvalues (ascending) and eigenvectors of each symmetric
/// matrix, read from its lower triangle, or the upper one with `upper` (`UPLO="U"`).
pub fn eigh(a: &Tensor, upper: bool) -> Result<Eigh> {
    let (eigenvalues, eigenvectors) = eigen("linalg.eigh", a, upper, true)?;
    Ok(Eigh {
        eigenvalues,
        eigenvectors: eigenvectors.expect("asked for"),
    })
}

/// `torch.linalg.eigvalsh(A, UPLO)`: [`eigh`]'s eigenvalues alone.
pub fn eigvalsh(a: &Tensor, upper: bool) -> Result<Tensor> {
    Ok(eigen("linalg.eigvalsh", a, upper, false)?.0)
}

fn eigen(
    op: &'static str,
    a: &Tensor,
    upper: bool,
    vectors: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let batch = Batch::square(op, a)?;
    let n = batch.rows;
    let vector_size = if vectors { n * n } else { 0 };
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(op, a.dtype(), &[a], || {
            let (w, v) = cusolver::eigh(op, &a.contiguous()?, batch.count, n, upper, vectors)?;
            let v = v.map(|v| v.view(&batch.shape(&[n, n]))).transpose()?;
            Ok((w.view(&batch.shape(&[n]))?, v))
        });
    }
    traced(op, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let (outs, _) = batched::<T>(op, batch.count, &[n, vector_size], 0, |item| {
                let i = item.index;
                let [w, v] = &mut item.outs[..] else { unreachable!("two outputs") };
                let v = vectors.then_some(&mut **v);
                cpu::eigh(&data[i * n * n..][..n * n], n, upper, w, v)
            })?;
            let [w, v] = <[Vec<T>; 2]>::try_from(outs).map_err(|_| unreachable!())?;
            let v = vectors.then(|| output(v, batch.shape(&[n, n]))).transpose()?;
            Ok((output(w, batch.shape(&[n]))?, v))
        })
    })
}

/// `torch.linalg.svd(A, full_matrices)`: `A = U diag(S) Vh`.
pub fn svd(a: &Tensor, full_matrices: bool) -> Result<Svd> {
    let (s, vectors) = singular("linalg.svd", a, Some(full_matrices))?;
    let [u, vh] = vectors.expect("asked for");
    Ok(Svd { u, s, vh })
}

/// `torch.linalg.svdvals`: [`svd`]'s singular values alone (descending).
pub fn svdvals(a: &Tensor) -> Result<Tensor> {
    Ok(singular("linalg.svdvals", a, None)?.0)
}

/// Singular values and, with `Some(full)`, the singular vectors.
fn singular(
    op: &'static str,
    a: &Tensor,
    full: Option<bool>,
) -> Result<(Tensor, Option<[Tensor; 2]>)> {
    let batch = Batch::of(op, a)?;
    let (m, n) = (batch.rows, batch.cols);
    let k = m.min(n);
    let (u_cols, v_rows) = match full {
        Some(true) => (m, n),
        Some(false) => (k, k),
        None => (0, 0),
    };
    #[cfg(feature = "cuda")]
    if a.device() != Device::Cpu {
        return traced(op, a.dtype(), &[a], || {
            let (s, vectors) = cusolver::svd(op, &a.contiguous()?, batch.count, (m, n), full)?;
            let vectors = match vectors {
                Some([u, vh]) => Some([
                    u.view(&batch.shape(&[m, u_cols]))?,
                    vh.view(&batch.shape(&[v_rows, n]))?,
                ]),
                None => None,
            };
            Ok((s.view(&batch.shape(&[k]))?, vectors))
        });
    }
    traced(op, a.dtype(), &[a], || {
        by_dtype!(a.dtype(), T => {
            let data = a.elements::<T>()?;
            let sizes = [k, m * u_cols, v_rows * n];
            let (outs, _) = batched::<T>(op, batch.count, &sizes, 0, |item| {
                let i = item.index;
                let [s, u, vh] = &mut item.outs[..] else { unreachable!("three outputs") };
                let vectors = full.map(|_| [&mut **u, &mut **vh]);
                cpu::svd(&data[i * m * n..][..m * n], (m, n), full == Some(true), s, vectors)
            })?;
            let [s, u, vh] = <[Vec<T>; 3]>::try_from(outs).map_err(|_| unreachable!())?;
            let vectors = match full {
                Some(_) => Some([
                    output(u, batch.shape(&[m, u_cols]))?,
                    output(vh, batch.shape(&[v_rows, n]))?,
                ]),
                None => None,
            };
            Ok((output(s, batch.shape(&[k]))?, vectors))
        })
    })
}
