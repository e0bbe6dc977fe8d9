//! `backends::linalg` against float64 identities (A·A⁻¹ = I, L Lᵀ = A, P L U = A, QᵀQ = I,
//! A V = V diag(w), U diag(S) Vh = A) on fresh random batches in f32 and f64, the typed
//! errors PyTorch gives (naming the batch element), broadcasting, empty batches and views.

mod common;

use backends::linalg;
use backends::{DType, Device, Error, Tensor};
use common::linalg::{eye, well_conditioned};
use common::random;

fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    common::linalg::tensor(Device::Cpu, values, shape, dtype)
}

#[test]
fn inv_times_input_is_the_identity() {
    common::linalg::inv_times_input_is_the_identity(Device::Cpu);
}

#[test]
fn a_singular_matrix_is_an_error_naming_its_batch_element() {
    common::linalg::a_singular_matrix_is_an_error_naming_its_batch_element(Device::Cpu);
}

#[test]
fn cholesky_factors_reconstruct_the_input() {
    common::linalg::cholesky_factors_reconstruct_the_input(Device::Cpu);
}

#[test]
fn cholesky_of_an_indefinite_matrix_names_the_minor_and_batch_element() {
    common::linalg::cholesky_of_an_indefinite_matrix_names_the_minor_and_batch_element(Device::Cpu);
}

#[test]
fn cholesky_solve_and_inverse_broadcast_over_the_batch() {
    common::linalg::cholesky_solve_and_inverse_broadcast_over_the_batch(Device::Cpu);
}

#[test]
fn lu_factor_pivots_and_lu_solve_match_the_input() {
    common::linalg::lu_factor_pivots_and_lu_solve_match_the_input(Device::Cpu);
}

#[test]
fn lu_factor_refuses_a_zero_pivot_and_lu_accepts_it() {
    common::linalg::lu_factor_refuses_a_zero_pivot_and_lu_accepts_it(Device::Cpu);
}

#[test]
fn lu_gives_a_permutation_times_unit_lower_times_upper() {
    common::linalg::lu_gives_a_permutation_times_unit_lower_times_upper(Device::Cpu);
}

#[test]
fn qr_is_orthonormal_times_upper_triangular_in_every_mode() {
    common::linalg::qr_is_orthonormal_times_upper_triangular_in_every_mode(Device::Cpu);
}

#[test]
fn eigh_diagonalises_symmetric_matrices_from_the_named_triangle() {
    common::linalg::eigh_diagonalises_symmetric_matrices_from_the_named_triangle(Device::Cpu);
}

#[test]
fn svd_reconstructs_the_input_full_and_thin() {
    common::linalg::svd_reconstructs_the_input_full_and_thin(Device::Cpu);
}

#[test]
fn empty_batches_and_empty_matrices() {
    common::linalg::empty_batches_and_empty_matrices(Device::Cpu);
}

#[test]
fn non_finite_inputs_give_nan_decompositions_not_errors() {
    let mut a = eye(2, 3);
    a[9 + 3] = f64::NAN; // batch element 1, row 1, column 0: in the lower triangle.
    let input = tensor(&a, &[2, 3, 3], DType::F64);
    let w = linalg::eigvalsh(&input, false).unwrap().to_f64().unwrap();
    assert_eq!(&w[..3], [1.0, 1.0, 1.0]);
    assert!(w[3..].iter().all(|x| x.is_nan()));
    let s = linalg::svdvals(&input).unwrap().to_f64().unwrap();
    assert!(s[..3].iter().all(|&x| (x - 1.0).abs() < 1e-15) && s[3..].iter().all(|x| x.is_nan()));
    // The upper triangle is not read by the lower form.
    let w = linalg::eigvalsh(&input, true).unwrap().to_f64().unwrap();
    assert!(w.iter().all(|x| x.is_finite()));
}

#[test]
fn views_give_the_results_of_their_contiguous_copies() {
    let n = 6;
    let a = tensor(&well_conditioned(2, n), &[2, n, n], DType::F64);
    let view = a.transpose(1, 2).unwrap();
    assert!(!view.is_contiguous());
    let copy =
        Tensor::from_f64(&view.to_f64().unwrap(), &[2, n, n], DType::F64, Device::Cpu).unwrap();
    assert_eq!(
        linalg::inv(&view).unwrap().to_f64().unwrap(),
        linalg::inv(&copy).unwrap().to_f64().unwrap()
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let vector = tensor(&[1.0, 2.0], &[2], DType::F64);
    assert!(matches!(
        linalg::inv(&vector),
        Err(Error::ShapeMismatch { .. })
    ));
    let wide = tensor(&random(6), &[2, 3], DType::F64);
    let err = linalg::cholesky(&wide, false).unwrap_err();
    assert!(err.to_string().contains("square"), "{err}");
    let half = Tensor::from_f64(&[1.0, 0.0, 0.0, 1.0], &[2, 2], DType::Bf16, Device::Cpu).unwrap();
    assert!(matches!(
        linalg::inv(&half),
        Err(Error::DTypeMismatch { .. })
    ));
    // Pivots of the wrong type or out of range.
    let n = 3;
    let mut factors =
        linalg::lu_factor(&tensor(&well_conditioned(1, n), &[n, n], DType::F64)).unwrap();
    let b = tensor(&random(n), &[n, 1], DType::F64);
    factors.pivots = Tensor::from_vec(vec![1i32, 9, 3], &[n], Device::Cpu).unwrap();
    assert!(matches!(
        linalg::lu_solve(&factors, &b, true, false),
        Err(Error::InvalidArgument { .. })
    ));
    factors.pivots = tensor(&[1.0, 2.0, 3.0], &[n], DType::F64);
    assert!(matches!(
        linalg::lu_solve(&factors, &b, true, false),
        Err(Error::ShapeMismatch { .. })
    ));
    // B [n, 1] against X A = B, which takes [k, n].
    let factors = linalg::lu_factor(&tensor(&well_conditioned(1, n), &[n, n], DType::F64)).unwrap();
    let err = linalg::lu_solve(&factors, &b, false, false).unwrap_err();
    assert!(
        err.to_string()
            .contains("B has 1 columns but A is 3 x 3: with left = false B must be [*, k, 3]"),
        "{err}"
    );
    // Batch dimensions that do not broadcast; mixed dtypes.
    let l = tensor(&eye(2, 2), &[2, 2, 2], DType::F64);
    let b = tensor(&random(12), &[3, 2, 2], DType::F64);
    assert!(matches!(
        linalg::cholesky_solve(&b, &l, false),
        Err(Error::ShapeMismatch { .. })
    ));
    let b32 = tensor(&random(4), &[2, 2], DType::F32);
    assert!(matches!(
        linalg::cholesky_solve(&b32, &l, false),
        Err(Error::DTypeMismatch { .. })
    ));
    match common::adapter() {
        Some(device) => {
            let on_gpu = Tensor::from_f64(&eye(1, 2), &[2, 2], DType::F32, device).unwrap();
            let err = linalg::inv(&on_gpu).unwrap_err();
            assert!(
                matches!(err, Error::Unavailable { .. }) && err.to_string().contains("to_device")
            );
        }
        None => eprintln!("skipped: the wgpu half (no adapter here)"),
    }
}

#[test]
fn the_trace_names_the_library() {
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    linalg::svdvals(&tensor(&random(12), &[3, 4], DType::F32)).unwrap();
    let lines = capture.take();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("backends_verbose,exec,cpu/faer,linalg.svdvals,f32,[3, 4]"),
        "{}",
        lines[0]
    );
}

#[test]
fn pivots_are_i32_tensors_that_move_between_devices() {
    let factors = linalg::lu_factor(&tensor(&random(16), &[4, 4], DType::F64)).unwrap();
    let pivots = factors.pivots.to_vec::<i32>().unwrap();
    assert!(
        pivots
            .iter()
            .enumerate()
            .all(|(i, &p)| p as usize > i && p <= 4),
        "{pivots:?}"
    );
    assert_eq!(
        factors.pivots.to_f64().unwrap(),
        pivots.iter().map(|&p| f64::from(p)).collect::<Vec<_>>()
    );
    match common::adapter() {
        Some(device) => {
            let moved = factors.pivots.to_device(device).unwrap();
            assert_eq!(moved.dtype(), DType::I32);
            assert_eq!(moved.to_vec::<i32>().unwrap(), pivots);
            // A strided view on the device is gathered by the copy kernel.
            let grid = Tensor::from_vec((0..12).collect::<Vec<i32>>(), &[3, 4], device).unwrap();
            let column = grid.t().unwrap().contiguous().unwrap();
            assert_eq!(
                column.to_vec::<i32>().unwrap(),
                [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
            );
        }
        None => eprintln!("skipped: the wgpu half (no adapter here)"),
    }
}

/// Large matrices (the column-major copies in tiles with ragged edges, the kept scratch and
/// workspace reused by the next call): the identities hold, and a batch of two such
/// matrices gives the single matrix's result.
#[test]
fn large_matrices_alone_and_in_a_batch() {
    let n = 600;
    let a = well_conditioned(1, n);
    let x = linalg::inv(&tensor(&a, &[n, n], DType::F64)).unwrap();
    let product = common::reference(&a, &x.to_f64().unwrap(), n, n, n);
    let err = common::rel_err(&product, &eye(1, n));
    assert!(err < 1e-12, "inv {n}: {err:e}");
    let two: Vec<f64> = a.iter().chain(&a).copied().collect();
    let batched = linalg::inv(&tensor(&two, &[2, n, n], DType::F64)).unwrap();
    let err = common::rel_err(&batched.to_f64().unwrap()[..n * n], &x.to_f64().unwrap());
    assert!(err < 1e-13, "inv {n} batched: {err:e}");

    let n = 1030;
    let a = well_conditioned(1, n);
    let factors = linalg::lu_factor(&tensor(&a, &[n, n], DType::F64)).unwrap();
    let b = random(n * 2);
    let x = linalg::lu_solve(&factors, &tensor(&b, &[n, 2], DType::F64), true, false).unwrap();
    let err = common::rel_err(&common::reference(&a, &x.to_f64().unwrap(), n, 2, n), &b);
    assert!(err < 1e-12, "lu_factor {n}: {err:e}");
}

/// One matrix of order 512 or more on a pool of two threads is factored on both (faer's
/// rayon parallelism on a pool of the library's own): every decomposition still satisfies
/// its identity.
#[test]
fn one_large_matrix_factors_on_the_threads_its_batch_leaves() {
    use common::linalg::{bmm, bt, spd};
    use common::rel_err;
    let _t = backends::NUM_THREADS.guard_scoped(2);
    let (m, n) = (530, 520);
    let bound = 1e-10;
    let a = well_conditioned(1, n);
    let inv = linalg::inv(&tensor(&a, &[n, n], DType::F64)).unwrap();
    let err = rel_err(&bmm(&a, &inv.to_f64().unwrap(), 1, (n, n, n)), &eye(1, n));
    assert!(err < bound, "A A⁻¹: {err:e}");
    let s = spd(1, n);
    let l = linalg::cholesky(&tensor(&s, &[n, n], DType::F64), false)
        .unwrap()
        .to_f64()
        .unwrap();
    let err = rel_err(&bmm(&l, &bt(&l, 1, n, n), 1, (n, n, n)), &s);
    assert!(err < bound, "L Lᵀ: {err:e}");
    let r = random(m * n);
    let lu = linalg::lu(&tensor(&r, &[m, n], DType::F64)).unwrap();
    let (p, l, u) = (
        lu.p.to_f64().unwrap(),
        lu.l.to_f64().unwrap(),
        lu.u.to_f64().unwrap(),
    );
    let plu = bmm(&p, &bmm(&l, &u, 1, (m, n, n)), 1, (m, m, n));
    assert!(rel_err(&plu, &r) < bound, "P L U");
    let qr = linalg::qr(&tensor(&r, &[m, n], DType::F64), linalg::QrMode::Reduced).unwrap();
    let (q, rr) = (qr.q.to_f64().unwrap(), qr.r.to_f64().unwrap());
    assert!(rel_err(&bmm(&q, &rr, 1, (m, n, n)), &r) < bound, "Q R");
    let qtq = bmm(&bt(&q, 1, m, n), &q, 1, (n, m, n));
    assert!(rel_err(&qtq, &eye(1, n)) < bound, "QᵀQ");
    let eigh = linalg::eigh(&tensor(&s, &[n, n], DType::F64), false).unwrap();
    let (w, v) = (
        eigh.eigenvalues.to_f64().unwrap(),
        eigh.eigenvectors.to_f64().unwrap(),
    );
    let vw: Vec<f64> = v.iter().enumerate().map(|(e, x)| x * w[e % n]).collect();
    assert!(
        rel_err(&bmm(&s, &v, 1, (n, n, n)), &vw) < bound,
        "A V = V W"
    );
    let svd = linalg::svd(&tensor(&r, &[m, n], DType::F64), false).unwrap();
    let (u, sv, vh) = (
        svd.u.to_f64().unwrap(),
        svd.s.to_f64().unwrap(),
        svd.vh.to_f64().unwrap(),
    );
    let us: Vec<f64> = u.iter().enumerate().map(|(e, x)| x * sv[e % n]).collect();
    assert!(rel_err(&bmm(&us, &vh, 1, (m, n, n)), &r) < bound, "U S Vh");
    // The factorizations ran on the library's linear-algebra threads.
    #[cfg(target_os = "linux")]
    {
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("backends-linalg")),
            "{names:?}"
        );
    }
}

/// An LU of order 512 or more with the whole pool of two threads is factored in panels of
/// columns on the pool: square, tall and wide, its pivots are those of the one-thread
/// factorization (faer's own) and its factors agree with them; P L U gives A back in f32
/// too; a zero column is refused with the index the one-thread factorization gives.
#[test]
fn large_lu_in_panels_gives_the_one_thread_pivots_and_factors() {
    use common::rel_err;
    let lu_factor = |a: &Tensor, threads: u32| {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        linalg::lu_factor(a)
    };
    for (m, n) in [(700, 700), (900, 530), (530, 820)] {
        let a = random(m * n);
        let t = tensor(&a, &[m, n], DType::F64);
        let (one, two) = (lu_factor(&t, 1).unwrap(), lu_factor(&t, 2).unwrap());
        assert_eq!(
            two.pivots.to_vec::<i32>().unwrap(),
            one.pivots.to_vec::<i32>().unwrap(),
            "{m} x {n}"
        );
        let err = rel_err(&two.lu.to_f64().unwrap(), &one.lu.to_f64().unwrap());
        assert!(err < 1e-11, "{m} x {n}: {err:e}");
        for (dtype, bound) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let lu = {
                let _t = backends::NUM_THREADS.guard_scoped(2);
                linalg::lu(&tensor(&a, &[m, n], dtype)).unwrap()
            };
            let k = m.min(n);
            let (p, l, u) = (
                lu.p.to_f64().unwrap(),
                lu.l.to_f64().unwrap(),
                lu.u.to_f64().unwrap(),
            );
            let plu = common::reference(&p, &common::reference(&l, &u, m, n, k), m, n, m);
            let err = rel_err(&plu, &a);
            assert!(err < bound, "P L U {dtype:?} {m} x {n}: {err:e}");
        }
    }
    let n = 600;
    let mut a = random(n * n);
    for row in 0..n {
        a[row * n + 300] = 0.0;
    }
    let t = tensor(&a, &[n, n], DType::F64);
    let (one, two) = (lu_factor(&t, 1).unwrap_err(), lu_factor(&t, 2).unwrap_err());
    assert_eq!(two.to_string(), one.to_string());
    assert!(two.to_string().contains("U[301,301] is zero"), "{two}");
}

/// An inverse of order 512 or more with the whole pool of two threads is solved a block of
/// columns per item on the pool: with its pivots moving rows (a diagonally dominant
/// matrix's rows shuffled) and a last block narrower than the others (n = 1030), it agrees
/// with the one-thread inverse (faer's own) and A·A⁻¹ = I, in f64 and f32; a random matrix
/// agrees too.
#[test]
fn large_inverse_in_blocks_gives_the_one_thread_inverse() {
    use common::rel_err;
    let inv = |a: &Tensor, threads: u32| {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        linalg::inv(a).unwrap().to_f64().unwrap()
    };
    for n in [700, 1030] {
        let dominant = well_conditioned(1, n);
        let shuffled: Vec<f64> = (0..n)
            .flat_map(|i| dominant[(i * 11 + 3) % n * n..][..n].to_vec())
            .collect();
        for (dtype, bound) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let t = tensor(&shuffled, &[n, n], dtype);
            let (one, two) = (inv(&t, 1), inv(&t, 2));
            let err = rel_err(&two, &one);
            assert!(err < bound, "{n} {dtype:?} against one thread: {err:e}");
            let product = common::reference(&shuffled, &two, n, n, n);
            let err = rel_err(&product, &eye(1, n));
            assert!(err < bound, "{n} {dtype:?} A A⁻¹: {err:e}");
        }
    }
    let n = 600;
    let a = random(n * n);
    let t = tensor(&a, &[n, n], DType::F64);
    let (one, two) = (inv(&t, 1), inv(&t, 2));
    let err = rel_err(&two, &one);
    assert!(err < 1e-9, "random {n} against one thread: {err:e}");
    let err = rel_err(&common::reference(&a, &two, n, n, n), &eye(1, n));
    assert!(err < 1e-8, "random {n} A A⁻¹: {err:e}");
}

/// A Cholesky of order 512 or more with the whole pool of two threads is factored in panels
/// on the pool: in both forms it agrees with the one-thread factorization (faer's own) and
/// gives A back; a matrix whose leading minor of order 301 is not positive-definite is
/// refused naming that minor, as on one thread.
#[test]
fn large_cholesky_in_panels_gives_the_one_thread_factor() {
    use common::linalg::{bmm, bt, spd};
    use common::rel_err;
    let cholesky = |a: &Tensor, upper: bool, threads: u32| {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        linalg::cholesky(a, upper)
    };
    let n = 700;
    let s = spd(1, n);
    let t = tensor(&s, &[n, n], DType::F64);
    for upper in [false, true] {
        let one = cholesky(&t, upper, 1).unwrap().to_f64().unwrap();
        let two = cholesky(&t, upper, 2).unwrap().to_f64().unwrap();
        let err = rel_err(&two, &one);
        assert!(err < 1e-12, "upper {upper}: {err:e}");
        let l = if upper { bt(&two, 1, n, n) } else { two };
        let err = rel_err(&bmm(&l, &bt(&l, 1, n, n), 1, (n, n, n)), &s);
        assert!(err < 1e-12, "L Lᵀ, upper {upper}: {err:e}");
    }
    let mut indefinite = s;
    indefinite[300 * n + 300] = -1.0;
    let t = tensor(&indefinite, &[n, n], DType::F64);
    let (one, two) = (
        cholesky(&t, false, 1).unwrap_err(),
        cholesky(&t, false, 2).unwrap_err(),
    );
    assert_eq!(two.to_string(), one.to_string());
    assert!(two.to_string().contains("minor of order 301"), "{two}");
}

/// A QR whose smaller side is 512 or more, with the whole pool of two threads, is factored in
/// panels of columns on the pool and its Q formed a block of columns per thread: square, tall
/// (reduced and complete) and wide, its factors agree with the one-thread factorization
/// (faer's own) and Q R gives A back with orthonormal Q, in f64 and f32. Rank-deficient
/// columns (a zero column, a repeated one) leave fewer reflections than columns: the
/// factorization then runs whole, and still agrees with one thread.
#[test]
fn large_qr_in_panels_gives_the_one_thread_factors() {
    use common::linalg::{bmm, bt};
    use common::rel_err;
    let qr = |a: &Tensor, mode: linalg::QrMode, threads: u32| {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        let qr = linalg::qr(a, mode).unwrap();
        (qr.q.to_f64().unwrap(), qr.r.to_f64().unwrap())
    };
    let mut deficient = random(600 * 600);
    for row in 0..600 {
        deficient[row * 600 + 300] = 0.0;
        deficient[row * 600 + 401] = deficient[row * 600 + 7];
    }
    let cases = [
        (700, 700, linalg::QrMode::Reduced, random(700 * 700)),
        (900, 530, linalg::QrMode::Complete, random(900 * 530)),
        (530, 820, linalg::QrMode::Reduced, random(530 * 820)),
        (600, 600, linalg::QrMode::Reduced, deficient),
    ];
    for (m, n, mode, a) in cases {
        let columns = if mode == linalg::QrMode::Complete {
            m
        } else {
            m.min(n)
        };
        for (dtype, bound) in [(DType::F64, 1e-11), (DType::F32, 1e-4)] {
            let t = tensor(&a, &[m, n], dtype);
            let (q1, r1) = qr(&t, mode, 1);
            let (q2, r2) = qr(&t, mode, 2);
            let what = format!("{m} x {n} {mode:?} {dtype:?}");
            assert!(rel_err(&r2, &r1) < bound, "R against one thread, {what}");
            assert!(rel_err(&q2, &q1) < bound, "Q against one thread, {what}");
            let rows = r2.len() / n;
            for i in 0..rows {
                assert!(
                    r2[i * n..i * n + i.min(n)].iter().all(|&x| x == 0.0),
                    "{what}"
                );
            }
            let product = bmm(&q2, &r2, 1, (m, columns, n));
            let err = rel_err(&product, &a);
            assert!(err < bound / 10.0, "Q R, {what}: {err:e}");
            let qtq = bmm(&bt(&q2, 1, m, columns), &q2, 1, (columns, m, columns));
            let err = rel_err(&qtq, &eye(1, columns));
            assert!(err < bound / 10.0, "QᵀQ, {what}: {err:e}");
        }
    }
}

/// Row-major `m × n` `U diag(s) Vᵀ`, `U` and `V` products of three random reflections each.
fn with_singular_values(s: &[f64], (m, n): (usize, usize)) -> Vec<f64> {
    let mut a = vec![0.0; m * n];
    for (i, &x) in s.iter().enumerate() {
        a[i * n + i] = x;
    }
    for _ in 0..3 {
        let v = random(m);
        let vv: f64 = v.iter().map(|x| x * x).sum();
        for j in 0..n {
            let dot: f64 = (0..m).map(|i| v[i] * a[i * n + j]).sum::<f64>() * 2.0 / vv;
            (0..m).for_each(|i| a[i * n + j] -= dot * v[i]);
        }
        let w = random(n);
        let ww: f64 = w.iter().map(|x| x * x).sum();
        for row in a.chunks_mut(n) {
            let dot: f64 = row.iter().zip(&w).map(|(a, w)| a * w).sum::<f64>() * 2.0 / ww;
            row.iter_mut().zip(&w).for_each(|(a, w)| *a -= dot * w);
        }
    }
    a
}

#[test]
fn singular_values_alone_match_the_values_they_were_made_with() {
    // Graded (1 to 1e-12), clustered (within 1e-10 of 1), half zero and spread values, each
    // in a square, a tall, a wide and a long shape (the long one takes faer's QR first), two
    // kinds to a batch; against the values the matrices were made with and against `svd`.
    let kinds = |k: usize| -> [Vec<f64>; 4] {
        let last = (k - 1).max(1) as f64;
        [
            (0..k)
                .map(|i| 10f64.powf(-12.0 * i as f64 / last))
                .collect(),
            (0..k).map(|i| 1.0 + 1e-10 * (k - i) as f64).collect(),
            (0..k)
                .map(|i| {
                    if i < k / 2 {
                        2.0 - i as f64 / k as f64
                    } else {
                        0.0
                    }
                })
                .collect(),
            (0..k).map(|i| 3.0 * (k - i) as f64 / k as f64).collect(),
        ]
    };
    for (m, n) in [
        (150, 150),
        (200, 120),
        (120, 200),
        (300, 100),
        (5, 3),
        (2, 2),
    ] {
        let k = m.min(n);
        let kinds = kinds(k);
        for pair in kinds.chunks(2) {
            let expect: Vec<f64> = pair.concat();
            let a: Vec<f64> = pair
                .iter()
                .flat_map(|s| with_singular_values(s, (m, n)))
                .collect();
            for dtype in [DType::F64, DType::F32] {
                let input = tensor(&a, &[2, m, n], dtype);
                let values = linalg::svdvals(&input).unwrap();
                assert_eq!(values.shape(), [2, k]);
                let values = values.to_f64().unwrap();
                let s = linalg::svd(&input, false).unwrap().s.to_f64().unwrap();
                let tolerance = if dtype == DType::F64 { 1e-12 } else { 1e-4 };
                for b in 0..2 {
                    let (ours, made, svd) = (
                        &values[b * k..][..k],
                        &expect[b * k..][..k],
                        &s[b * k..][..k],
                    );
                    let largest = made[0];
                    for i in 0..k {
                        assert!(
                            (ours[i] - made[i]).abs() <= tolerance * largest
                                && (ours[i] - svd[i]).abs() <= tolerance * largest,
                            "{dtype} {m}x{n} batch {b} value {i}: {} made {} svd {}",
                            ours[i],
                            made[i],
                            svd[i]
                        );
                    }
                }
            }
        }
    }
    // A row, a column, one element and no rows: |(3, 4)| = 5 either way, |-2| = 2.
    for (values, shape, expect) in [
        (&[3.0, 4.0][..], [1, 2], &[5.0][..]),
        (&[3.0, 4.0], [2, 1], &[5.0]),
        (&[-2.0], [1, 1], &[2.0]),
        (&[], [0, 3], &[]),
    ] {
        for dtype in [DType::F64, DType::F32] {
            let s = linalg::svdvals(&tensor(values, &shape, dtype)).unwrap();
            let s = s.to_f64().unwrap();
            assert_eq!(s.len(), expect.len(), "{dtype} {shape:?}");
            for (s, x) in s.iter().zip(expect) {
                assert!((s - x).abs() < 1e-6, "{dtype} {shape:?}: {s} against {x}");
            }
        }
    }
}
