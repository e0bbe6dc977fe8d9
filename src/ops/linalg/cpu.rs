//! One matrix at a time on the CPU, through `faer`: each function reads a row-major matrix
//! and writes its row-major results into the slices it is given (one batch element of the
//! caller's outputs). Every buffer a factorization needs (scratch, faer's workspace) is
//! allocated fallibly: a failed allocation is [`Failure::Memory`].

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

use bytemuck::Pod;

use faer::diag::DiagMut;
use faer::dyn_stack::{MemBuffer, MemStack, StackReq};
use faer::linalg::cholesky::llt::factor as llt;
use faer::linalg::lu::partial_pivoting;
use faer::linalg::qr::no_pivoting::factor as qr_factor;
use faer::linalg::svd::{ComputeSvdVectors, bidiag};
use faer::linalg::{evd, householder, svd as svd_of, triangular_solve as triangular};
use faer::perm::PermRef;
use faer::{Conj, MatMut, MatRef, Par};

use crate::core::error::LinAlgFailure;
use crate::core::tensor::{Element, host_zeros};
use crate::kernels::transpose::transpose_on;
use crate::{Device, Error};

mod bidiagonal;
mod panels;

/// What the scratch of a factorization is called in an out-of-memory error.
const SCRATCH: &str = "linalg: a factorization's scratch";

/// Why a factorization of one matrix failed: the matrix (PyTorch's `LinAlgError`) or an
/// allocation of its scratch (`Error::OutOfMemory`).
#[derive(Debug)]
pub(crate) enum Failure {
    LinAlg(LinAlgFailure),
    Memory(Error),
}

impl From<LinAlgFailure> for Failure {
    fn from(failure: LinAlgFailure) -> Self {
        Failure::LinAlg(failure)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Memory(error)
    }
}

/// The `rows x cols` identity, column-major, in a fallibly allocated vector.
fn identity<T: Real>(rows: usize, cols: usize) -> Result<Vec<T>, Failure> {
    let mut x = host_zeros::<T>(SCRATCH, rows * cols)?;
    for i in 0..rows.min(cols) {
        x[i * rows + i] = T::from_f64(1.0);
    }
    Ok(x)
}

/// The element types `faer` factors here: f32 and f64.
pub(crate) trait Real: Element + faer::traits::RealField {
    /// This thread's kept scratch buffer of the type (see [`with_scratch`]).
    fn kept() -> &'static LocalKey<Cell<Vec<Self>>>;
}

thread_local! {
    static KEPT_F32: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static KEPT_F64: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
    /// faer's workspace of this thread's last factorization.
    static WORKSPACE: Cell<Option<MemBuffer>> = const { Cell::new(None) };
    /// Threads a factorization on this thread may use (see [`with_threads`]).
    static INNER_THREADS: Cell<usize> = const { Cell::new(1) };
}

/// Matrices of at least this order are factored on several threads where their batch leaves
/// threads idle (faer's rayon parallelism; an LU, an inverse, a Cholesky or a QR with the
/// whole pool in [`panels`]); smaller ones ran slower so (one f64 matrix on 2 threads of a
/// Xeon, against 1, through faer's own calls: at n = 1024 LU 1.23x, inverse 1.8x, Cholesky
/// 1.2x, QR 1.6x; at n = 256, with faer's AVX-512 kernels, Cholesky 0.61x, QR 0.37x, LU
/// 0.75x). Eigendecompositions and SVDs gain sooner: [`SPECTRAL_PARALLEL_FROM`].
const PARALLEL_FROM: usize = 512;

/// The order from which an eigendecomposition or an SVD runs on several threads where its
/// batch leaves threads idle: their reductions and divide-and-conquer steps gain sooner (one
/// f64 matrix on 2 threads of a Xeon, against 1, with faer's AVX-512 kernels: SVD 1.17x at
/// n = 128, 1.19x at 256; eigh 1.0x at 128, 1.19x at 256).
const SPECTRAL_PARALLEL_FROM: usize = 128;

/// An SVD's bidiagonal reduction runs its steps on several threads only while the rest of
/// the matrix it updates holds at least this many elements (faer's default, 192 x 256, ran
/// an f64 SVD of n = 512 1.15x slower on 2 threads of a Xeon; n = 768 and 1024 gained less
/// than 3% from any other bound).
const SVD_REDUCTION_PARALLEL_FROM: usize = 512 * 512;

/// Singular values alone of matrices whose smaller side is under this are found by dqds on
/// faer's bidiagonal ([`values_by_dqds`]); larger ones by faer's divide and conquer, which
/// runs on several threads (against it, on 2 threads of a Xeon, the benchmark's matrices:
/// f64 1.66x at n = 64, 1.21x at 256, 1.04x at 512, 1.05x at 1024; f32 1.36x at 64, 1.21x
/// at 256, 0.98x at 512, 0.96x at 1024).
const VALUES_BY_DQDS_BELOW: usize = 512;

/// Runs `body` with the factorizations it makes on this thread using up to `threads`
/// threads (where a matrix is large enough; see [`PARALLEL_FROM`]).
pub(crate) fn with_threads<R>(threads: usize, body: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            INNER_THREADS.set(self.0);
        }
    }
    let _restore = Restore(INNER_THREADS.replace(threads));
    body()
}

/// The rayon pool of `threads` threads the factorizations run on (`None` where its threads
/// cannot be started: the factorizations then run on one thread).
fn pool(threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, pool)) = pools.iter().find(|(t, _)| *t == threads) {
        return Some(Arc::clone(pool));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("backends-linalg-{}", i + 1))
        .build()
        .ok()?;
    pools.push((threads, Arc::new(pool)));
    pools.last().map(|(_, pool)| Arc::clone(pool))
}

/// The parallelism of a factorization of a matrix of `order` on this thread.
fn par(order: usize) -> Par {
    par_from(order, PARALLEL_FROM)
}

/// The parallelism of a factorization of a matrix of `order` on this thread, where one of
/// at least order `from` gains from threads.
fn par_from(order: usize, from: usize) -> Par {
    match INNER_THREADS.get() {
        threads if threads > 1 && order >= from && pool(threads).is_some() => Par::rayon(threads),
        _ => Par::Seq,
    }
}

/// The threads of the library's pool this thread's factorization may call on itself: more
/// than one only where its batch left the whole pool to it (so that its calls of the pool
/// do not nest in the batch's).
fn whole_pool() -> usize {
    match INNER_THREADS.get() {
        threads if threads > 1 && threads == crate::get_num_threads() => threads,
        _ => 1,
    }
}

/// The threads an LU or a Cholesky of parallelism `par` whose smaller side is `side` runs
/// on in [`panels`], where it does.
fn panel_threads(par: Par, side: usize) -> Option<usize> {
    let threads = whole_pool();
    (matches!(par, Par::Rayon(_)) && threads > 1 && side >= panels::FROM).then_some(threads)
}

impl Real for f32 {
    fn kept() -> &'static LocalKey<Cell<Vec<f32>>> {
        &KEPT_F32
    }
}

impl Real for f64 {
    fn kept() -> &'static LocalKey<Cell<Vec<f64>>> {
        &KEPT_F64
    }
}

/// Bytes of scratch a thread keeps for its next factorization, at most: fresh pages for the
/// column-major copy of a 1024 x 1024 f64 matrix cost a sixth of its LU on an AMD EPYC VM.
const KEPT_BYTES: usize = 16 << 20;

/// Room a kept workspace holds beyond a request, for its alignment.
const WORKSPACE_SLACK: usize = 4096;

/// faer's workspace of `req`, allocated fallibly.
fn workspace(req: StackReq) -> Result<MemBuffer, Failure> {
    MemBuffer::try_new(req).map_err(|_| {
        Failure::Memory(Error::OutOfMemory {
            device: Device::Cpu,
            bytes: req.size_bytes() as u64,
            why: "linalg: faer's workspace: the allocation failed".into(),
        })
    })
}

/// Runs `body` on a faer workspace of `req`: this thread's kept one where it is large
/// enough, which is kept for the next call while it is at most [`KEPT_BYTES`]. With rayon
/// parallelism `body` runs on [`pool`]'s threads: faer's parallel steps, called from outside
/// a pool, each hand their work to rayon's threads and wait (a 1024 x 1024 SVD on 2 threads
/// ran 1.29x one thread's speed so, 1.59x inside the pool).
fn with_workspace<R: Send>(
    (req, par): (StackReq, Par),
    body: impl FnOnce(&mut MemStack) -> R + Send,
) -> Result<R, Failure> {
    let req = req.and(StackReq::new::<u8>(WORKSPACE_SLACK));
    let mut buffer = match WORKSPACE.take().filter(|b| b.len() >= req.size_bytes()) {
        Some(kept) => kept,
        None => workspace(req)?,
    };
    let stack = MemStack::new(&mut buffer);
    let result = match par {
        Par::Rayon(threads) => match pool(threads.get()) {
            Some(pool) => pool.install(|| body(stack)),
            None => body(stack),
        },
        Par::Seq => body(stack),
    };
    if buffer.len() <= KEPT_BYTES {
        WORKSPACE.set(Some(buffer));
    }
    Ok(result)
}

/// Runs `body` on `len` elements of this thread's scratch buffer (holding whatever the last
/// use left), which is kept for the next call while it is at most [`KEPT_BYTES`].
fn with_scratch<T: Real, R>(
    len: usize,
    body: impl FnOnce(&mut [T]) -> Result<R, Failure>,
) -> Result<R, Failure> {
    let mut buffer = T::kept().take();
    if buffer.len() < len {
        buffer = host_zeros(SCRATCH, len)?;
    }
    let result = body(&mut buffer[..len]);
    if buffer.len() * size_of::<T>() <= KEPT_BYTES {
        T::kept().set(buffer);
    }
    result
}

/// Writes the column-major `rows × cols` matrix in `src`, its columns `stride` apart,
/// row-major into `out`.
fn store<T: Pod + Send + Sync>(
    (src, stride): (&[T], usize),
    (rows, cols): (usize, usize),
    out: &mut [T],
) {
    transpose_into((src, stride), (cols, rows), out);
}

/// Elements of a matrix from which [`transpose_into`] shares its work out over the
/// [`whole_pool`] (a 1024 x 1024 f64 transpose took 6% of an LU on 2 threads).
const PARALLEL_TRANSPOSE: usize = 1 << 18;

/// The `rows × cols` matrix whose rows start `stride` apart in `src` transposed into `dst`
/// (row-major `cols × rows`), in the register tiles of [`transpose_on`], on the
/// [`whole_pool`] where the matrix is large.
fn transpose_into<T: Pod + Send + Sync>(
    (src, stride): (&[T], usize),
    (rows, cols): (usize, usize),
    dst: &mut [T],
) {
    let threads = if rows * cols < PARALLEL_TRANSPOSE {
        1
    } else {
        whole_pool()
    };
    transpose_on(threads, (src, stride), (rows, cols), dst);
}

/// Runs `body` on the row-major `m × n` matrix `a` copied column-major (faer's layout) into
/// this thread's scratch: faer's decompositions copy their input, fast from a column-major
/// view and element by element from a row-major one.
fn column_major<T: Real, R>(
    a: &[T],
    (m, n): (usize, usize),
    body: impl FnOnce(MatRef<'_, T>) -> Result<R, Failure>,
) -> Result<R, Failure> {
    with_scratch(m * n, |buffer: &mut [T]| {
        transpose_into((a, n), (m, n), buffer);
        body(MatRef::from_column_major_slice(buffer, m, n))
    })
}

fn fill_nan<T: Real>(out: &mut [T]) {
    out.fill(T::from_f64(f64::NAN));
}

/// The first zero on the diagonal of `u` (from 1).
fn zero_diagonal<T: Real>(u: MatRef<'_, T>) -> Option<usize> {
    let k = u.nrows().min(u.ncols());
    (0..k)
        .find(|&i| u[(i, i)] == T::from_f64(0.0))
        .map(|i| i + 1)
}

/// Factors the column-major `lu` in place with partial pivoting (L below the diagonal, its
/// unit diagonal implied; U on and above it: LAPACK's packed form), then runs `then` on the
/// factors, the row permutation and a workspace that also has room for `extra`, on `par`.
/// A parallel factorization with the [`whole_pool`] runs in [`panels`] on it.
fn factor_in_place<T: Real, R: Send>(
    mut lu: MatMut<'_, T>,
    (extra, par): (StackReq, Par),
    then: impl FnOnce(MatRef<'_, T>, PermRef<'_, usize>, &mut MemStack) -> R + Send,
) -> Result<R, Failure> {
    let (m, n) = (lu.nrows(), lu.ncols());
    let (mut forward, mut inverse) = (host_zeros(SCRATCH, m)?, host_zeros(SCRATCH, m)?);
    if let Some(threads) = panel_threads(par, m.min(n)) {
        panels::factor(lu.as_mut(), threads, &mut forward)?;
        for (i, &row) in forward.iter().enumerate() {
            inverse[row] = i;
        }
        let perm = PermRef::new_checked(&forward, &inverse, m);
        // (On this thread: `then` calls on the pool itself, through `panels`, where it does.)
        return with_workspace((extra, Par::Seq), |stack| then(lu.as_ref(), perm, stack));
    }
    let req =
        partial_pivoting::factor::lu_in_place_scratch::<usize, T>(m, n, par, Default::default())
            .or(extra);
    with_workspace((req, par), |stack| {
        let (_, perm) = partial_pivoting::factor::lu_in_place(
            lu.as_mut(),
            &mut forward,
            &mut inverse,
            par,
            stack,
            Default::default(),
        );
        then(lu.as_ref(), perm, stack)
    })
}

/// `A⁻¹` of the `n × n` matrix `a`.
pub(crate) fn inv<T: Real>(a: &[T], n: usize, out: &mut [T]) -> Result<(), Failure> {
    // Row-major A read column-major is Aᵀ, and (Aᵀ)⁻¹ written column-major is A⁻¹ row-major:
    // the factors of Aᵀ, in this thread's kept scratch, give the inverse with no transposes
    // (two transposes took a ninth of a 1024 x 1024 inverse). The inverse in `panels` solves
    // in the scratch's second half (n² elements: a product of two sizes of an existing
    // tensor, so twice it fits).
    let par = par(n);
    let threads = panel_threads(par, n);
    let halves = if threads.is_some() { 2 } else { 1 };
    let zero = with_scratch(n * n * halves, |scratch: &mut [T]| {
        let (factors, room) = scratch.split_at_mut(n * n);
        factors.copy_from_slice(a);
        let lu = MatMut::from_column_major_slice_mut(factors, n, n);
        let extra = match threads {
            Some(_) => StackReq::EMPTY,
            None => partial_pivoting::inverse::inverse_scratch::<usize, T>(n, par),
        };
        factor_in_place(lu, (extra, par), |lu, perm, stack| {
            if let Some(diagonal) = zero_diagonal(lu) {
                return Ok(Some(diagonal));
            }
            if let Some(threads) = threads {
                panels::inverse(lu, perm, (room, out), threads)?;
                return Ok(None);
            }
            // L (unit, below the diagonal) and U (on and above it) are read from the packed
            // factors; the inverse reads only the triangles it writes.
            partial_pivoting::inverse::inverse(
                MatMut::from_column_major_slice_mut(out, n, n),
                lu,
                lu,
                perm,
                par,
                stack,
            );
            Ok(None)
        })?
    })?;
    let Some(zero) = zero else { return Ok(()) };
    // Singular: the zero diagonal element named is that of A's own factors, as PyTorch's.
    let (mut packed, mut pivots) = (host_zeros(SCRATCH, n * n)?, host_zeros(SCRATCH, n)?);
    let diagonal = match lu_factor(a, (n, n), &mut packed, &mut pivots) {
        Err(Failure::LinAlg(LinAlgFailure::ZeroPivot { index })) => index,
        Err(memory @ Failure::Memory(_)) => return Err(memory),
        // (Rounding can leave A's own factors without a zero where Aᵀ's have one.)
        _ => zero,
    };
    Err(LinAlgFailure::Singular { diagonal }.into())
}

/// The Cholesky factor of `a` (`n × n`), read from and returned as the lower triangle, or
/// the upper one with `upper`.
pub(crate) fn cholesky<T: Real>(
    a: &[T],
    n: usize,
    upper: bool,
    out: &mut [T],
) -> Result<(), Failure> {
    // Factored in place in `out`, where faer reads and writes the lower triangle: of A
    // itself for the lower form (a row-major view), of Aᵀ for the upper one (the column-major
    // view of A); faer's own column-major copy of the input cost as long as the
    // factorization at n = 1024.
    out.copy_from_slice(a);
    let view = if upper {
        MatMut::from_column_major_slice_mut(out, n, n)
    } else {
        MatMut::from_row_major_slice_mut(out, n, n)
    };
    let par = par(n);
    if let Some(threads) = panel_threads(par, n) {
        panels::cholesky(view, threads)?;
    } else {
        let req = llt::cholesky_in_place_scratch::<T>(n, par, Default::default());
        with_workspace((req, par), |stack| {
            llt::cholesky_in_place(view, Default::default(), par, stack, Default::default())
        })?
        .map_err(|e| match e {
            llt::LltError::NonPositivePivot { index } => {
                LinAlgFailure::NotPositiveDefinite { minor: index + 1 }
            }
        })?;
    }
    // The other triangle still holds the input.
    for (i, row) in out.chunks_exact_mut(n).enumerate() {
        if upper {
            row[..i].fill(T::from_f64(0.0));
        } else {
            row[i + 1..].fill(T::from_f64(0.0));
        }
    }
    Ok(())
}

/// The lower Cholesky factor from `factor` (`n × n`, lower, or upper with `upper`).
fn lower_factor<T: Real>(factor: &[T], n: usize, upper: bool) -> MatRef<'_, T> {
    let f = MatRef::from_row_major_slice(factor, n, n);
    if upper { f.transpose() } else { f }
}

/// Solves `L Lᵀ X = B` for `B` (`n × k`) given the Cholesky factor.
pub(crate) fn cholesky_solve<T: Real>(
    b: &[T],
    factor: &[T],
    n: usize,
    k: usize,
    upper: bool,
    out: &mut [T],
) -> Result<(), Failure> {
    let l = lower_factor(factor, n, upper);
    solve_in_place(b, (n, k), out, |mut x| {
        triangular::solve_lower_triangular_in_place(l, x.as_mut(), Par::Seq);
        triangular::solve_upper_triangular_in_place(l.transpose(), x.as_mut(), Par::Seq);
    })
}

/// Runs `body` on the row-major `rows × cols` matrix `b` copied column-major into this
/// thread's scratch, as a matrix to solve in place, and writes the result row-major into
/// `out`.
fn solve_in_place<T: Real>(
    b: &[T],
    (rows, cols): (usize, usize),
    out: &mut [T],
    body: impl FnOnce(MatMut<'_, T>),
) -> Result<(), Failure> {
    with_scratch(rows * cols, |buffer: &mut [T]| {
        transpose_into((b, cols), (rows, cols), buffer);
        body(MatMut::from_column_major_slice_mut(buffer, rows, cols));
        store((buffer, rows), (rows, cols), out);
        Ok(())
    })
}

/// `(L Lᵀ)⁻¹` from the Cholesky factor (`n × n`).
pub(crate) fn cholesky_inverse<T: Real>(
    factor: &[T],
    n: usize,
    upper: bool,
    out: &mut [T],
) -> Result<(), Failure> {
    let l = lower_factor(factor, n, upper);
    if let Some(diagonal) = zero_diagonal(l) {
        return Err(LinAlgFailure::Singular { diagonal }.into());
    }
    let mut x = identity::<T>(n, n)?;
    let mut view = MatMut::from_column_major_slice_mut(&mut x, n, n);
    triangular::solve_lower_triangular_in_place(l, view.as_mut(), Par::Seq);
    triangular::solve_upper_triangular_in_place(l.transpose(), view.as_mut(), Par::Seq);
    store((&x, n), (n, n), out);
    Ok(())
}

/// LAPACK's pivots (from 1: row `i` was swapped with row `pivots[i]` at step `i`) of the row
/// order `rows` (row `i` of `L U` is row `rows[i]` of `A`).
fn pivots_of(rows: &[usize], steps: usize, pivots: &mut [i32]) {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    let mut position: Vec<usize> = (0..rows.len()).collect();
    for (i, pivot) in pivots.iter_mut().enumerate().take(steps) {
        let j = position[rows[i]];
        let (row_i, row_j) = (order[i], order[j]);
        order.swap(i, j);
        position[row_i] = j;
        position[row_j] = i;
        // Matrix sizes fit an i32 (checked by the caller), as LAPACK's pivots do.
        *pivot = i32::try_from(j + 1).unwrap_or(i32::MAX);
    }
}

/// `lu_factor` of `a` (`m × n`): `L` (unit diagonal, not stored) and `U` packed into `packed`
/// column-major (as LAPACK and PyTorch keep them), LAPACK's pivots into `pivots`
/// (`min(m, n)`); a zero pivot is an error.
pub(crate) fn lu_factor<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    packed: &mut [T],
    pivots: &mut [i32],
) -> Result<(), Failure> {
    // Factored in place, column-major (faer's fast layout).
    transpose_into((a, n), (m, n), packed);
    let lu = MatMut::from_column_major_slice_mut(packed, m, n);
    factor_in_place(lu, (StackReq::EMPTY, par(m.max(n))), |lu, perm, _| {
        if let Some(index) = zero_diagonal(lu) {
            return Err(LinAlgFailure::ZeroPivot { index }.into());
        }
        pivots_of(perm.arrays().0, m.min(n), pivots);
        Ok(())
    })?
}

/// `A = P L U` of `a` (`m × n`): `P` (`m × m`), `L` (`m × k`), `U` (`k × n`), `k = min(m, n)`.
pub(crate) fn lu<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    [p, l, u]: [&mut [T]; 3],
) -> Result<(), Failure> {
    let k = m.min(n);
    with_scratch(m * n, |factors: &mut [T]| {
        transpose_into((a, n), (m, n), factors);
        let packed = MatMut::from_column_major_slice_mut(factors, m, n);
        factor_in_place(packed, (StackReq::EMPTY, par(m.max(n))), |_, perm, _| {
            for (i, &row) in perm.arrays().0.iter().enumerate() {
                p[row * m + i] = T::from_f64(1.0);
            }
        })?;
        // The packed factors' first k columns and rows, then L's unit diagonal and the zeros
        // on each factor's other side.
        store((factors, m), (m, k), l);
        store((factors, m), (k, n), u);
        for i in 0..k {
            l[i * k + i] = T::from_f64(1.0);
            l[i * k + i + 1..(i + 1) * k].fill(T::from_f64(0.0));
            u[i * n..i * n + i].fill(T::from_f64(0.0));
        }
        Ok(())
    })
}

/// Solves `A X = B`, or `Aᵀ X = B` with `adjoint` (`B` is `n × k`), from `lu_factor`'s
/// packed factors (column-major with `column_major`, else row-major) and pivots: with
/// `P A = L U`, `X = U⁻¹ L⁻¹ P B`, or `X = Pᵀ L⁻ᵀ U⁻ᵀ B` (LAPACK's `getrs`).
pub(crate) fn lu_solve<T: Real>(
    (packed, column_major): (&[T], bool),
    (pivots, adjoint): (&[i32], bool),
    b: &[T],
    (n, k): (usize, usize),
    out: &mut [T],
) -> Result<(), Failure> {
    let lu = if column_major {
        MatRef::from_column_major_slice(packed, n, n)
    } else {
        MatRef::from_row_major_slice(packed, n, n)
    };
    solve_in_place(b, (n, k), out, |mut x| {
        if adjoint {
            // Uᵀ is lower triangular, Lᵀ unit upper; Pᵀ undoes the swaps in reverse.
            triangular::solve_lower_triangular_in_place(lu.transpose(), x.as_mut(), Par::Seq);
            triangular::solve_unit_upper_triangular_in_place(lu.transpose(), x.as_mut(), Par::Seq);
            for (i, &pivot) in pivots.iter().enumerate().rev() {
                swap_rows(x.as_mut(), i, pivot);
            }
        } else {
            for (i, &pivot) in pivots.iter().enumerate() {
                swap_rows(x.as_mut(), i, pivot);
            }
            triangular::solve_unit_lower_triangular_in_place(lu, x.as_mut(), Par::Seq);
            triangular::solve_upper_triangular_in_place(lu, x.as_mut(), Par::Seq);
        }
    })
}

/// Swaps row `i` of `x` with row `pivot` (from 1, LAPACK's), where that is another row.
fn swap_rows<T: Real>(mut x: MatMut<'_, T>, i: usize, pivot: i32) {
    let j = usize::try_from(pivot - 1).unwrap_or(i);
    if j != i && j < x.nrows() {
        for c in 0..x.ncols() {
            let (xi, xj) = (x[(i, c)], x[(j, c)]);
            x[(i, c)] = xj;
            x[(j, c)] = xi;
        }
    }
}

/// Factors the row-major `a` (`m × n`) as faer's `qr_in_place` does into `factors`
/// (column-major), in [`panels`] where a parallel factorization has the [`whole_pool`];
/// returns the block coefficients (`block × min(m, n)`, column-major) and the block size.
fn qr_factors<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    par: Par,
    factors: &mut [T],
) -> Result<(Vec<T>, usize), Failure> {
    let k = m.min(n);
    transpose_into((a, n), (m, n), factors);
    if let Some(threads) = panel_threads(par, k) {
        let block = panels::QR_BLOCK;
        let mut coefficients = host_zeros::<T>(SCRATCH, block * k)?;
        let view = MatMut::from_column_major_slice_mut(&mut coefficients, block, k);
        let matrix = MatMut::from_column_major_slice_mut(factors, m, n);
        if panels::qr(matrix, view, threads)? {
            return Ok((coefficients, block));
        }
        // Rank-deficient columns: the whole matrix again, by faer.
        transpose_into((a, n), (m, n), factors);
    }
    let block = qr_factor::recommended_block_size::<T>(m, n);
    let mut coefficients = host_zeros::<T>(SCRATCH, block * k)?;
    let req = qr_factor::qr_in_place_scratch::<T>(m, n, block, par, Default::default());
    with_workspace((req, par), |stack| {
        qr_factor::qr_in_place(
            MatMut::from_column_major_slice_mut(factors, m, n),
            MatMut::from_column_major_slice_mut(&mut coefficients, block, k),
            par,
            stack,
            Default::default(),
        )
    })?;
    Ok((coefficients, block))
}

/// `A = Q R` of `a` (`m × n`): `Q` is `m × m` with `complete`, else `m × k`; `R` is `m × n`
/// with `complete`, else `k × n`; `q` is `None` where only `R` is wanted.
pub(crate) fn qr<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    complete: bool,
    q: Option<&mut [T]>,
    r: &mut [T],
) -> Result<(), Failure> {
    let (k, par) = (m.min(n), par(m.max(n)));
    with_scratch(m * n, |buffer: &mut [T]| {
        let (coefficients, block) = qr_factors(a, (m, n), par, buffer)?;
        let coefficients = MatRef::from_column_major_slice(&coefficients, block, k);
        // R on and above the diagonal; the Householder vectors below it.
        let rows = if complete { m } else { k };
        store((buffer, m), (rows, n), r);
        for i in 0..rows {
            r[i * n..i * n + i.min(n)].fill(T::from_f64(0.0));
        }
        let Some(q) = q else { return Ok(()) };
        // Q: the reflections applied to the identity; each vector has an implicit unit head.
        let mut basis = MatMut::from_column_major_slice_mut(buffer, m, n).subcols_mut(0, k);
        for j in 0..k {
            basis[(j, j)] = T::from_f64(1.0);
            for i in 0..j {
                basis[(i, j)] = T::from_f64(0.0);
            }
        }
        let columns = if complete { m } else { k };
        let mut x = identity::<T>(m, columns)?;
        let view = MatMut::from_column_major_slice_mut(&mut x, m, columns);
        let reflections = (basis.as_ref(), coefficients);
        match panel_threads(par, k) {
            Some(threads) => panels::apply_reflections(reflections, view, threads)?,
            None => {
                let req = householder::apply_block_householder_on_the_left_in_place_scratch::<T>(
                    m, block, columns,
                );
                with_workspace((req, par), |stack| {
                    reflect_identity(reflections, (0, view), par, stack)
                })?
            }
        }
        store((&x, m), (m, columns), q);
        Ok(())
    })
}

/// Applies a QR's reflections (`basis`: `m × k`, the vectors below the diagonal;
/// `coefficients`: their block coefficients, a block's rows by `k`) to `columns`, the
/// identity's columns from `first` on, as LAPACK's `orgqr` does: the last block that reaches
/// them first, each on the rows and columns from its first. A block leaves the identity's
/// columns before its first as they are, and so do the blocks before it: two thirds of the
/// work of applying every block to every column (a 1024 x 1024 Q took 23 ms on 2 threads of
/// an AMD EPYC VM so). A block reaching past the columns is applied in part: its
/// reflections past a column leave that column as it is.
fn reflect_identity<T: Real>(
    (basis, coefficients): (MatRef<'_, T>, MatRef<'_, T>),
    (first, mut columns): (usize, MatMut<'_, T>),
    par: Par,
    stack: &mut MemStack,
) {
    let block = coefficients.nrows();
    let mut end = basis.ncols().min(first + columns.ncols());
    while end > 0 {
        let start = (end - 1) / block * block;
        householder::apply_block_householder_on_the_left_in_place_with_conj(
            basis.get(start.., start..end),
            coefficients.get(..end - start, start..end),
            Conj::No,
            columns
                .as_mut()
                .get_mut(start.., start.max(first) - first..),
            par,
            stack,
        );
        end = start;
    }
}

/// Eigenvalues (ascending) and, with `vectors`, eigenvectors (columns) of the symmetric
/// `a` (`n × n`) read from its lower triangle, or the upper one with `upper`.
pub(crate) fn eigh<T: Real>(
    a: &[T],
    n: usize,
    upper: bool,
    values: &mut [T],
    vectors: Option<&mut [T]>,
) -> Result<(), Failure> {
    if n == 0 {
        return Ok(()); // (faer's eigensolver needs a row.)
    }
    // faer reads the lower triangle: row-major A's own is the lower triangle of the
    // column-major view's transpose.
    let column_major = MatRef::from_column_major_slice(a, n, n);
    let a = if upper {
        column_major
    } else {
        column_major.transpose()
    };
    if (0..n).any(|i| (0..=i).any(|j| !a[(i, j)].to_f64().is_finite())) {
        // As PyTorch's batched calls: the matrix's results are NaN, not an error.
        fill_nan(values);
        if let Some(vectors) = vectors {
            fill_nan(vectors);
        }
        return Ok(());
    }
    let par = par_from(n, SPECTRAL_PARALLEL_FROM);
    let compute = match vectors {
        Some(_) => evd::ComputeEigenvectors::Yes,
        None => evd::ComputeEigenvectors::No,
    };
    // The eigenvalues go straight into `values`; the eigenvectors (column-major) are
    // stored row-major after.
    let mut u = match vectors {
        Some(_) => Some(host_zeros::<T>(SCRATCH, n * n)?),
        None => None,
    };
    let req = evd::self_adjoint_evd_scratch::<T>(n, compute, par, Default::default());
    with_workspace((req, par), |stack| {
        let u = u
            .as_mut()
            .map(|u| MatMut::from_column_major_slice_mut(u, n, n));
        let s = DiagMut::from_slice_mut(values);
        evd::self_adjoint_evd(a, s, u, par, stack, Default::default())
    })?
    .map_err(|_| LinAlgFailure::NoConvergence)?;
    if let (Some(vectors), Some(u)) = (vectors, u) {
        store((&u, n), (n, n), vectors);
    }
    Ok(())
}

/// Singular values (descending) of `a` (`m × n`) and, with `vectors`, `U` and `Vᴴ`: full
/// (`m × m`, `n × n`) with `full`, else thin (`m × k`, `k × n`).
pub(crate) fn svd<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    full: bool,
    values: &mut [T],
    vectors: Option<[&mut [T]; 2]>,
) -> Result<(), Failure> {
    if a.iter().any(|x| !x.to_f64().is_finite()) {
        fill_nan(values);
        for v in vectors.into_iter().flatten() {
            fill_nan(v);
        }
        return Ok(());
    }
    let (k, par) = (m.min(n), par_from(m.max(n), SPECTRAL_PARALLEL_FROM));
    let mut params: svd_of::SvdParams = faer::auto!(T);
    params.bidiag.par_threshold = SVD_REDUCTION_PARALLEL_FROM;
    // Values alone of a near-square matrix (one faer reduces without a QR first) by dqds;
    // where it gives up, faer's whole SVD below.
    let near_square = m.max(n) as f64 <= params.qr_ratio_threshold * k as f64;
    let dqds = vectors.is_none() && near_square && k < VALUES_BY_DQDS_BELOW;
    if dqds && values_by_dqds(a, (m, n), values, (par, params))? {
        return Ok(());
    }
    let compute = match (&vectors, full) {
        (None, _) => ComputeSvdVectors::No,
        (Some(_), true) => ComputeSvdVectors::Full,
        (Some(_), false) => ComputeSvdVectors::Thin,
    };
    let (cu, cv) = if full { (m, n) } else { (k, k) };
    // The singular values go straight into `values`; U and V (column-major) are stored
    // row-major after.
    let mut uv = match vectors {
        Some(_) => Some((
            host_zeros::<T>(SCRATCH, m * cu)?,
            host_zeros::<T>(SCRATCH, n * cv)?,
        )),
        None => None,
    };
    column_major(a, (m, n), |a| {
        let params = faer::Spec::new(params);
        let req = svd_of::svd_scratch::<T>(m, n, compute, compute, par, params);
        with_workspace((req, par), |stack| {
            let (u, v) = match uv.as_mut() {
                Some((u, v)) => (
                    Some(MatMut::from_column_major_slice_mut(u, m, cu)),
                    Some(MatMut::from_column_major_slice_mut(v, n, cv)),
                ),
                None => (None, None),
            };
            let s = DiagMut::from_slice_mut(values);
            svd_of::svd(a, s, u, v, par, stack, params)
        })
    })?
    .map_err(|_| LinAlgFailure::NoConvergence)?;
    if let (Some([u_out, vh_out]), Some((u, v))) = (vectors, uv) {
        store((&u, m), (m, cu), u_out);
        // Vᴴ row-major is V column-major.
        vh_out.copy_from_slice(&v[..n * cv]);
    }
    Ok(())
}

/// The singular values (descending) of the row-major `m × n` matrix `a` into `values`:
/// faer's bidiagonal reduction, then [`bidiagonal::singular_values`] in f64 on its diagonals.
/// `false` where that iteration gave up (`values` then holds nothing useful).
fn values_by_dqds<T: Real>(
    a: &[T],
    (m, n): (usize, usize),
    values: &mut [T],
    (par, params): (Par, svd_of::SvdParams),
) -> Result<bool, Failure> {
    // The reduction wants rows >= cols: the row-major `a` read column-major is `aᵀ`.
    let (rows, cols) = (m.max(n), m.min(n));
    if cols == 0 {
        return Ok(true);
    }
    let block = qr_factor::recommended_block_size::<T>(rows, cols);
    let mut householder = host_zeros::<T>(SCRATCH, block * 2 * cols)?;
    let mut diagonals = host_zeros::<f64>(SCRATCH, 6 * cols)?;
    with_scratch(rows * cols, |buffer: &mut [T]| {
        if m >= n {
            transpose_into((a, n), (m, n), buffer);
        } else {
            buffer.copy_from_slice(a);
        }
        let mut reduced = MatMut::from_column_major_slice_mut(buffer, rows, cols);
        let (left, right) = householder.split_at_mut(block * cols);
        let left = MatMut::from_column_major_slice_mut(left, block, cols);
        let right = &mut right[..block * (cols - 1)];
        let right = MatMut::from_column_major_slice_mut(right, block, cols - 1);
        let params = faer::Spec::new(params.bidiag);
        let req = bidiag::bidiag_in_place_scratch::<T>(rows, cols, par, params);
        let matrix = reduced.as_mut();
        with_workspace((req, par), |stack| {
            bidiag::bidiag_in_place(matrix, left, right, par, stack, params)
        })?;
        let (d, rest) = diagonals.split_at_mut(cols);
        let (e, work) = rest.split_at_mut(cols - 1);
        for (i, d) in d.iter_mut().enumerate() {
            *d = reduced[(i, i)].to_f64();
        }
        for (i, e) in e.iter_mut().enumerate() {
            *e = reduced[(i, i + 1)].to_f64();
        }
        if !bidiagonal::singular_values(d, e, work) {
            return Ok(false);
        }
        for (value, d) in values.iter_mut().zip(d.iter()) {
            *value = T::from_f64(*d);
        }
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::{Error, Failure, StackReq, pivots_of, with_scratch, with_workspace};
    use faer::Par;

    #[test]
    fn scratch_and_workspace_past_memory_are_typed_failures() {
        // Neither size can be allocated (more than the address space holds): the failure
        // comes back instead of an abort, and nothing runs.
        let scratch = with_scratch::<f64, ()>(usize::MAX / 4, |_| unreachable!("not run"));
        assert!(
            matches!(scratch, Err(Failure::Memory(Error::OutOfMemory { bytes, .. })) if bytes >= u64::MAX / 2),
            "{scratch:?}"
        );
        let req = StackReq::new::<f64>(usize::MAX / 16);
        let workspace: Result<(), _> = with_workspace((req, Par::Seq), |_| unreachable!("not run"));
        assert!(
            matches!(workspace, Err(Failure::Memory(Error::OutOfMemory { .. }))),
            "{workspace:?}"
        );
        // And a size that fits still runs, on the thread's kept buffers.
        assert_eq!(
            with_scratch::<f32, usize>(17, |b| Ok(b.len())).ok(),
            Some(17)
        );
    }

    #[test]
    fn pivots_replay_the_row_order() {
        // Rows 2, 0, 3, 1 of A: step 0 brings row 2 up, step 1 finds row 0 where row 2 was...
        let rows = [2, 0, 3, 1];
        let mut pivots = [0; 3];
        pivots_of(&rows, 3, &mut pivots);
        let mut order: Vec<usize> = (0..4).collect();
        for (i, &p) in pivots.iter().enumerate() {
            order.swap(i, p as usize - 1);
        }
        assert_eq!(order, rows);
    }
}
