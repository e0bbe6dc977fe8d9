//! `backends::linalg` checks against float64 identities (A·A⁻¹ = I, L Lᵀ = A, P L U = A,
//! QᵀQ = I, A V = V diag(w), U diag(S) Vh = A) on fresh random batches in f32 and f64, the
//! typed errors PyTorch gives (naming the batch element), broadcasting and empty batches,
//! on any device: `tests/linalg.rs` runs them on the CPU, `tests/cuda.rs` on a GPU
//! (cuSOLVER).

use backends::linalg::{self, LuFactor, QrMode};
use backends::{DType, Device, Error, LinAlgFailure, Tensor};

use super::{random, rel_err};

/// The bound on an identity's relative error for matrices of condition number ≲ 100.
pub fn bound(dtype: DType) -> f64 {
    if dtype == DType::F64 { 1e-12 } else { 2e-5 }
}

pub fn tensor(device: Device, values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64(values, shape, dtype, device).unwrap()
}

/// Row-major product of the batches `a [count, m, k]` and `b [count, k, n]`.
pub fn bmm(a: &[f64], b: &[f64], count: usize, (m, k, n): (usize, usize, usize)) -> Vec<f64> {
    (0..count)
        .flat_map(|i| super::reference(&a[i * m * k..][..m * k], &b[i * k * n..][..k * n], m, n, k))
        .collect()
}

/// The batch `a [count, m, n]` transposed.
pub fn bt(a: &[f64], count: usize, m: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; a.len()];
    for b in 0..count {
        for i in 0..m {
            for j in 0..n {
                out[b * m * n + j * m + i] = a[b * m * n + i * n + j];
            }
        }
    }
    out
}

pub fn eye(count: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; count * n * n];
    for b in 0..count {
        for i in 0..n {
            out[b * n * n + i * n + i] = 1.0;
        }
    }
    out
}

/// Random square matrices with `n` added on the diagonal (well conditioned).
pub fn well_conditioned(count: usize, n: usize) -> Vec<f64> {
    let mut a = random(count * n * n);
    for b in 0..count {
        for i in 0..n {
            a[b * n * n + i * n + i] += n as f64;
        }
    }
    a
}

/// Symmetric positive-definite matrices `M Mᵀ + n I`.
pub fn spd(count: usize, n: usize) -> Vec<f64> {
    let m = random(count * n * n);
    let mut a = bmm(&m, &bt(&m, count, n, n), count, (n, n, n));
    for b in 0..count {
        for i in 0..n {
            a[b * n * n + i * n + i] += n as f64;
        }
    }
    a
}

pub const DTYPES: [DType; 2] = [DType::F32, DType::F64];

/// The permutation (row `i` of `P A` is row `order[i]` of A) the pivots make.
pub fn replay(pivots: &[i32], m: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..m).collect();
    for (i, &p) in pivots.iter().enumerate() {
        order.swap(i, p as usize - 1);
    }
    order
}

pub fn inv_times_input_is_the_identity(device: Device) {
    for dtype in DTYPES {
        for (batch, n) in [(vec![2, 3], 5), (vec![], 17), (vec![4], 1), (vec![1], 64)] {
            let count: usize = batch.iter().product();
            let a = well_conditioned(count, n);
            let shape: Vec<usize> = batch.iter().copied().chain([n, n]).collect();
            let x = linalg::inv(&tensor(device, &a, &shape, dtype)).unwrap();
            assert_eq!(x.shape(), shape);
            assert_eq!(x.dtype(), dtype);
            let product = bmm(&a, &x.to_f64().unwrap(), count, (n, n, n));
            let err = rel_err(&product, &eye(count, n));
            assert!(err < bound(dtype), "{dtype} {shape:?}: {err:e}");
        }
    }
}

pub fn a_singular_matrix_is_an_error_naming_its_batch_element(device: Device) {
    let mut a = well_conditioned(3, 3);
    // Batch element 1: its third row is zero, singular under any rounding (a repeated row
    // can leave a pivot of 1e-18 instead of 0, which LAPACK and faer both take).
    for j in 0..3 {
        a[9 + 6 + j] = 0.0;
    }
    let err = linalg::inv(&tensor(device, &a, &[3, 3, 3], DType::F64)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LinAlg {
                op: "linalg.inv",
                batch: Some(1),
                failure: LinAlgFailure::Singular { diagonal: 3 }
            }
        ),
        "{err:?}"
    );
    // An exactly singular matrix (a zero column) names the zero diagonal element.
    let err = linalg::inv(&tensor(device, &[1.0, 0.0, 2.0, 0.0], &[2, 2], DType::F32)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "linalg.inv: The diagonal element 2 is zero, the inversion could not be completed \
         because the input matrix is singular; check the matrix's rank"
    );
}

pub fn cholesky_factors_reconstruct_the_input(device: Device) {
    for dtype in DTYPES {
        let (count, n) = (3, 19);
        let a = spd(count, n);
        let l = linalg::cholesky(&tensor(device, &a, &[count, n, n], dtype), false)
            .unwrap()
            .to_f64()
            .unwrap();
        for b in 0..count {
            for i in 0..n {
                for j in i + 1..n {
                    assert_eq!(l[b * n * n + i * n + j], 0.0, "L is lower triangular");
                }
            }
        }
        let err = rel_err(&bmm(&l, &bt(&l, count, n, n), count, (n, n, n)), &a);
        assert!(err < bound(dtype), "{dtype}: {err:e}");
        // The lower form reads only the lower triangle (the upper one holds garbage here).
        let mut garbage = a.clone();
        for b in 0..count {
            for i in 0..n {
                for j in i + 1..n {
                    garbage[b * n * n + i * n + j] = -1e3;
                }
            }
        }
        let l2 = linalg::cholesky(&tensor(device, &garbage, &[count, n, n], dtype), false)
            .unwrap()
            .to_f64()
            .unwrap();
        assert_eq!(l2, l, "{dtype}: the upper triangle was read");
        // upper = true reads the upper triangle (the lower one holds garbage here) and
        // returns U with Uᵀ U = A.
        let mut garbage = a.clone();
        for b in 0..count {
            for i in 0..n {
                for j in 0..i {
                    garbage[b * n * n + i * n + j] = -1e3;
                }
            }
        }
        let u = linalg::cholesky(&tensor(device, &garbage, &[count, n, n], dtype), true)
            .unwrap()
            .to_f64()
            .unwrap();
        let err = rel_err(&bmm(&bt(&u, count, n, n), &u, count, (n, n, n)), &a);
        assert!(err < bound(dtype), "{dtype} upper: {err:e}");
        for b in 0..count {
            for i in 0..n {
                for j in 0..i {
                    assert_eq!(u[b * n * n + i * n + j], 0.0, "U is upper triangular");
                }
            }
        }
    }
}

pub fn cholesky_of_an_indefinite_matrix_names_the_minor_and_batch_element(device: Device) {
    let mut a = spd(3, 4);
    // Batch element 2's second leading minor: [[a00, a01], [a01, a11]] with a11 = -1.
    a[2 * 16 + 5] = -1.0;
    let err = linalg::cholesky(&tensor(device, &a, &[3, 4, 4], DType::F64), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "linalg.cholesky: (Batch element 2): The factorization could not be completed because \
         the input is not positive-definite (the leading minor of order 2 is not positive-definite)"
    );
    assert!(matches!(
        err,
        Error::LinAlg {
            batch: Some(2),
            failure: LinAlgFailure::NotPositiveDefinite { minor: 2 },
            ..
        }
    ));
}

pub fn cholesky_solve_and_inverse_broadcast_over_the_batch(device: Device) {
    for dtype in DTYPES {
        let (n, k) = (7, 3);
        let a = spd(1, n);
        let l = linalg::cholesky(&tensor(device, &a, &[n, n], dtype), false).unwrap();
        // B [2, 3, n, k] against one factor [n, n].
        let b = random(6 * n * k);
        let x =
            linalg::cholesky_solve(&tensor(device, &b, &[2, 3, n, k], dtype), &l, false).unwrap();
        assert_eq!(x.shape(), [2, 3, n, k]);
        let x = x.to_f64().unwrap();
        let a6: Vec<f64> = (0..6).flat_map(|_| a.clone()).collect();
        let err = rel_err(&bmm(&a6, &x, 6, (n, n, k)), &b);
        assert!(err < bound(dtype), "{dtype} solve: {err:e}");
        // The upper factor gives the same solution.
        let u = linalg::cholesky(&tensor(device, &a, &[n, n], dtype), true).unwrap();
        let xu =
            linalg::cholesky_solve(&tensor(device, &b, &[2, 3, n, k], dtype), &u, true).unwrap();
        assert!(rel_err(&xu.to_f64().unwrap(), &x) < bound(dtype));
        let inverse = linalg::cholesky_inverse(&l, false)
            .unwrap()
            .to_f64()
            .unwrap();
        let err = rel_err(&super::reference(&a, &inverse, n, n, n), &eye(1, n));
        assert!(err < bound(dtype), "{dtype} inverse: {err:e}");
    }
    let zero_diagonal = tensor(device, &[1.0, 0.0, 2.0, 0.0], &[2, 2], DType::F64);
    assert!(matches!(
        linalg::cholesky_inverse(&zero_diagonal, false),
        Err(Error::LinAlg {
            failure: LinAlgFailure::Singular { diagonal: 2 },
            ..
        })
    ));
    let l = tensor(device, &eye(2, 3), &[2, 3, 3], DType::F64);
    let b = tensor(device, &random(3 * 3), &[3, 3, 1], DType::F64);
    assert!(matches!(
        linalg::cholesky_solve(&b, &l, false),
        Err(Error::ShapeMismatch { .. })
    ));
}

pub fn lu_factor_pivots_and_lu_solve_match_the_input(device: Device) {
    for dtype in DTYPES {
        for (m, n) in [(6, 6), (7, 4), (3, 5)] {
            let count = 2;
            let a = random(count * m * n);
            let LuFactor { lu, pivots } =
                linalg::lu_factor(&tensor(device, &a, &[count, m, n], dtype)).unwrap();
            let k = m.min(n);
            assert_eq!(lu.shape(), [count, m, n]);
            assert_eq!(lu.strides(), [m * n, 1, m], "column-major, as PyTorch's");
            assert_eq!(
                (pivots.shape(), pivots.dtype()),
                (&[count, k][..], DType::I32)
            );
            let (packed, pivots) = (lu.to_f64().unwrap(), pivots.to_vec::<i32>().unwrap());
            for b in 0..count {
                let f = &packed[b * m * n..][..m * n];
                let l: Vec<f64> = (0..m * k)
                    .map(|e| {
                        let (i, j) = (e / k, e % k);
                        if i == j {
                            1.0
                        } else if i > j {
                            f[i * n + j]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let u: Vec<f64> = (0..k * n)
                    .map(|e| if e % n >= e / n { f[e] } else { 0.0 })
                    .collect();
                let order = replay(&pivots[b * k..][..k], m);
                let pa: Vec<f64> = order
                    .iter()
                    .flat_map(|&r| a[b * m * n + r * n..][..n].to_vec())
                    .collect();
                let err = rel_err(&super::reference(&l, &u, m, n, k), &pa);
                assert!(err < bound(dtype), "{dtype} {m}x{n}: {err:e}");
            }
        }
        // Solve with a square factor, B broadcast against two factors.
        let n = 8;
        let a = well_conditioned(2, n);
        let factors = linalg::lu_factor(&tensor(device, &a, &[2, n, n], dtype)).unwrap();
        let b = random(n * 3);
        let b2: Vec<f64> = b.iter().chain(&b).copied().collect();
        let at = bt(&a, 2, n, n);
        // A X = B, Aᵀ X = B (B [1, n, 3]); X A = B, X Aᵀ = B (B [1, 3, n]).
        for (left, adjoint) in [(true, false), (true, true), (false, false), (false, true)] {
            let shape = if left { [1, n, 3] } else { [1, 3, n] };
            let x = linalg::lu_solve(&factors, &tensor(device, &b, &shape, dtype), left, adjoint);
            let x = x.unwrap().to_f64().unwrap();
            let a = if adjoint { &at } else { &a };
            let product = if left {
                bmm(a, &x, 2, (n, n, 3))
            } else {
                bmm(&x, a, 2, (3, n, n))
            };
            let err = rel_err(&product, &b2);
            assert!(
                err < bound(dtype),
                "{dtype} lu_solve left={left} adjoint={adjoint}: {err:e}"
            );
        }
        let x = linalg::lu_solve(
            &factors,
            &tensor(device, &b, &[1, n, 3], dtype),
            true,
            false,
        );
        let x = x.unwrap();
        assert_eq!(x.shape(), [2, n, 3]);
        // The same factors made row-major solve alike.
        let row_major = LuFactor {
            lu: factors.lu.contiguous().unwrap(),
            pivots: factors.pivots.clone(),
        };
        let b = tensor(device, &b, &[1, n, 3], dtype);
        let again = linalg::lu_solve(&row_major, &b, true, false).unwrap();
        let err = rel_err(&again.to_f64().unwrap(), &x.to_f64().unwrap());
        assert!(
            err < bound(dtype),
            "{dtype} lu_solve of row-major factors: {err:e}"
        );
    }
}

pub fn lu_factor_refuses_a_zero_pivot_and_lu_accepts_it(device: Device) {
    let singular = [1.0, 2.0, 2.0, 4.0];
    let err = linalg::lu_factor(&tensor(device, &singular, &[2, 2], DType::F64)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("linalg.lu_factor: U[2,2] is zero"),
        "{err}"
    );
    let lu = linalg::lu(&tensor(device, &singular, &[2, 2], DType::F64)).unwrap();
    let (p, l, u) = (
        lu.p.to_f64().unwrap(),
        lu.l.to_f64().unwrap(),
        lu.u.to_f64().unwrap(),
    );
    let plu = super::reference(&p, &super::reference(&l, &u, 2, 2, 2), 2, 2, 2);
    assert!(rel_err(&plu, &singular) < 1e-15);
}

pub fn lu_gives_a_permutation_times_unit_lower_times_upper(device: Device) {
    for dtype in DTYPES {
        for (m, n) in [(5, 5), (6, 3), (2, 7)] {
            let k = m.min(n);
            let a = random(3 * m * n);
            let lu = linalg::lu(&tensor(device, &a, &[3, m, n], dtype)).unwrap();
            assert_eq!(lu.p.shape(), [3, m, m]);
            assert_eq!(lu.l.shape(), [3, m, k]);
            assert_eq!(lu.u.shape(), [3, k, n]);
            let (p, l, u) = (
                lu.p.to_f64().unwrap(),
                lu.l.to_f64().unwrap(),
                lu.u.to_f64().unwrap(),
            );
            for b in 0..3 {
                let pb = &p[b * m * m..][..m * m];
                assert!(pb.iter().all(|&x| x == 0.0 || x == 1.0));
                assert!(
                    pb.chunks(m).all(|row| row.iter().sum::<f64>() == 1.0),
                    "a permutation"
                );
                assert!(
                    (0..k).all(|i| l[b * m * k + i * k + i] == 1.0),
                    "unit diagonal"
                );
            }
            let plu = bmm(&p, &bmm(&l, &u, 3, (m, k, n)), 3, (m, m, n));
            let err = rel_err(&plu, &a);
            assert!(err < bound(dtype), "{dtype} {m}x{n}: {err:e}");
        }
    }
}

pub fn qr_is_orthonormal_times_upper_triangular_in_every_mode(device: Device) {
    for dtype in DTYPES {
        for (m, n) in [(6, 4), (4, 6), (5, 5)] {
            let k = m.min(n);
            let a = random(2 * m * n);
            let input = tensor(device, &a, &[2, m, n], dtype);
            for (mode, q_cols, r_rows) in [(QrMode::Reduced, k, k), (QrMode::Complete, m, m)] {
                let qr = linalg::qr(&input, mode).unwrap();
                assert_eq!(qr.q.shape(), [2, m, q_cols]);
                assert_eq!(qr.r.shape(), [2, r_rows, n]);
                let (q, r) = (qr.q.to_f64().unwrap(), qr.r.to_f64().unwrap());
                let err = rel_err(&bmm(&q, &r, 2, (m, q_cols, n)), &a);
                assert!(err < bound(dtype), "{dtype} {mode:?} {m}x{n}: {err:e}");
                let qtq = bmm(&bt(&q, 2, m, q_cols), &q, 2, (q_cols, m, q_cols));
                assert!(
                    rel_err(&qtq, &eye(2, q_cols)) < bound(dtype),
                    "{dtype} {mode:?}: QᵀQ"
                );
                for b in 0..2 {
                    for i in 0..r_rows {
                        for j in 0..i.min(n) {
                            assert_eq!(r[b * r_rows * n + i * n + j], 0.0, "R is upper triangular");
                        }
                    }
                }
            }
            let only_r = linalg::qr(&input, QrMode::R).unwrap();
            assert_eq!(only_r.q.numel(), 0);
            let reduced = linalg::qr(&input, QrMode::Reduced).unwrap();
            assert_eq!(only_r.r.to_f64().unwrap(), reduced.r.to_f64().unwrap());
        }
    }
}

pub fn eigh_diagonalises_symmetric_matrices_from_the_named_triangle(device: Device) {
    for dtype in DTYPES {
        let (count, n) = (3, 10);
        let m = random(count * n * n);
        let a: Vec<f64> = m
            .iter()
            .zip(bt(&m, count, n, n))
            .map(|(x, y)| x + y)
            .collect();
        let eigh = linalg::eigh(&tensor(device, &a, &[count, n, n], dtype), false).unwrap();
        let (w, v) = (
            eigh.eigenvalues.to_f64().unwrap(),
            eigh.eigenvectors.to_f64().unwrap(),
        );
        assert_eq!(eigh.eigenvalues.shape(), [count, n]);
        for b in 0..count {
            assert!(
                w[b * n..][..n].windows(2).all(|p| p[0] <= p[1]),
                "ascending"
            );
        }
        let av = bmm(&a, &v, count, (n, n, n));
        let vw: Vec<f64> = v
            .iter()
            .enumerate()
            .map(|(e, x)| x * w[(e / (n * n)) * n + e % n])
            .collect();
        let err = rel_err(&av, &vw);
        assert!(err < 10.0 * bound(dtype), "{dtype} A V = V W: {err:e}");
        let vtv = bmm(&bt(&v, count, n, n), &v, count, (n, n, n));
        assert!(
            rel_err(&vtv, &eye(count, n)) < 10.0 * bound(dtype),
            "{dtype} VᵀV"
        );
        // eigvalsh agrees; the upper form ignores a garbage lower triangle.
        let mut garbage = a.clone();
        garbage[n] = 1e6;
        let values =
            linalg::eigvalsh(&tensor(device, &garbage, &[count, n, n], dtype), true).unwrap();
        assert!(rel_err(&values.to_f64().unwrap(), &w) < 10.0 * bound(dtype));
    }
}

pub fn svd_reconstructs_the_input_full_and_thin(device: Device) {
    for dtype in DTYPES {
        for (m, n) in [(7, 4), (4, 7), (6, 6)] {
            let k = m.min(n);
            let a = random(2 * m * n);
            let input = tensor(device, &a, &[2, m, n], dtype);
            for (full, u_cols, v_rows) in [(true, m, n), (false, k, k)] {
                let svd = linalg::svd(&input, full).unwrap();
                assert_eq!(svd.u.shape(), [2, m, u_cols]);
                assert_eq!(svd.s.shape(), [2, k]);
                assert_eq!(svd.vh.shape(), [2, v_rows, n]);
                let (u, s, vh) = (
                    svd.u.to_f64().unwrap(),
                    svd.s.to_f64().unwrap(),
                    svd.vh.to_f64().unwrap(),
                );
                for b in 0..2 {
                    let sb = &s[b * k..][..k];
                    assert!(sb.windows(2).all(|p| p[0] >= p[1]) && sb.iter().all(|&x| x >= 0.0));
                }
                // U[:, :k] diag(S) Vh[:k, :].
                let mut us = vec![0.0; 2 * m * k];
                for b in 0..2 {
                    for i in 0..m {
                        for j in 0..k {
                            us[b * m * k + i * k + j] =
                                u[b * m * u_cols + i * u_cols + j] * s[b * k + j];
                        }
                    }
                }
                let vh_k: Vec<f64> = (0..2)
                    .flat_map(|b| vh[b * v_rows * n..][..k * n].to_vec())
                    .collect();
                let err = rel_err(&bmm(&us, &vh_k, 2, (m, k, n)), &a);
                assert!(
                    err < 10.0 * bound(dtype),
                    "{dtype} full={full} {m}x{n}: {err:e}"
                );
                let utu = bmm(&bt(&u, 2, m, u_cols), &u, 2, (u_cols, m, u_cols));
                assert!(rel_err(&utu, &eye(2, u_cols)) < 10.0 * bound(dtype), "UᵀU");
                let vvt = bmm(&vh, &bt(&vh, 2, v_rows, n), 2, (v_rows, n, v_rows));
                assert!(
                    rel_err(&vvt, &eye(2, v_rows)) < 10.0 * bound(dtype),
                    "Vh Vhᵀ"
                );
            }
            let values = linalg::svdvals(&input).unwrap().to_f64().unwrap();
            let s = linalg::svd(&input, false).unwrap().s.to_f64().unwrap();
            assert!(rel_err(&values, &s) < 10.0 * bound(dtype));
        }
    }
}

pub fn empty_batches_and_empty_matrices(device: Device) {
    let none = tensor(device, &[], &[0, 3, 3], DType::F32);
    assert_eq!(linalg::inv(&none).unwrap().shape(), [0, 3, 3]);
    let f = linalg::lu_factor(&none).unwrap();
    assert_eq!(
        (f.lu.shape(), f.pivots.shape()),
        (&[0, 3, 3][..], &[0, 3][..])
    );
    assert_eq!(linalg::svd(&none, true).unwrap().s.shape(), [0, 3]);
    let zero = tensor(device, &[], &[2, 0, 0], DType::F64);
    assert_eq!(linalg::inv(&zero).unwrap().shape(), [2, 0, 0]);
    assert_eq!(
        linalg::eigh(&zero, false).unwrap().eigenvalues.shape(),
        [2, 0]
    );
    let eigh = linalg::eigh(&zero, true).unwrap();
    assert_eq!(eigh.eigenvectors.shape(), [2, 0, 0]);
    // One side empty: PyTorch's shapes, and the identities that still hold.
    let tall = tensor(device, &[], &[3, 0], DType::F64);
    let qr = linalg::qr(&tall, QrMode::Complete).unwrap();
    assert_eq!((qr.q.shape(), qr.r.shape()), (&[3, 3][..], &[3, 0][..]));
    assert_eq!(
        qr.q.to_f64().unwrap(),
        eye(1, 3),
        "Q of nothing is the identity"
    );
    assert_eq!(
        linalg::qr(&tall, QrMode::Reduced).unwrap().r.shape(),
        [0, 0]
    );
    let lu = linalg::lu(&tall).unwrap();
    assert_eq!(
        (lu.p.shape(), lu.l.shape(), lu.u.shape()),
        (&[3, 3][..], &[3, 0][..], &[0, 0][..])
    );
    assert_eq!(lu.p.to_f64().unwrap(), eye(1, 3));
    let svd = linalg::svd(&tall, true).unwrap();
    assert_eq!(
        (svd.u.shape(), svd.s.shape(), svd.vh.shape()),
        (&[3, 3][..], &[0][..], &[0, 0][..])
    );
    assert_eq!(svd.u.to_f64().unwrap(), eye(1, 3));
    assert_eq!(linalg::svd(&tall, false).unwrap().u.shape(), [3, 0]);
    assert_eq!(linalg::lu_factor(&tall).unwrap().pivots.shape(), [0]);
    assert_eq!(linalg::cholesky(&zero, false).unwrap().shape(), [2, 0, 0]);
}
