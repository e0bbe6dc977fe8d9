//! The fuzz cases of linalg.

use super::*;

pub(super) fn linalg_case(rng: &mut Rng) -> Result<(), String> {
    use backends::linalg;
    let batch: Vec<usize> = (0..rng.below(3)).map(|_| rng.dim(3)).collect();
    let (m, n) = (rng.dim(6), if rng.chance(60) { 0 } else { rng.dim(6) });
    let n = if n == 0 && rng.chance(90) { m } else { n };
    let dt = [DType::F32, DType::F64, DType::F64, DType::F16, DType::I32][rng.below(5)];
    let shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
    // An empty input with a huge batch asks for huge outputs (lu's P, the identity of each
    // of them): valid, but not made here.
    let side = m.max(n).max(1);
    if numel(&batch)
        .and_then(|count| count.checked_mul(side.checked_mul(side)?))
        .is_none_or(|c| c > 1 << 20)
    {
        return Ok(());
    }
    let Some((a, ah)) = tensor(rng, &shape, if dt == DType::I32 { DType::F64 } else { dt }) else {
        return Ok(());
    };
    let a = if dt == DType::I32 {
        Tensor::full(1i32, &shape, Device::Cpu).map_err(|e| e.to_string())?
    } else {
        a
    };
    let upper = rng.chance(50);
    let values = |t: &Tensor| t.to_f64().unwrap();
    match rng.below(8) {
        0 => {
            typed(linalg::inv(&a));
        }
        1 => {
            typed(linalg::cholesky(&a, upper));
        }
        2 => {
            let columns = rng.dim(3);
            let rhs = tensor(rng, &[m, columns], dt).map(|t| t.0);
            if let (Some(factors), Some(rhs)) = (typed(linalg::lu_factor(&a)), rhs) {
                typed(linalg::lu_solve(&factors, &rhs, true, false));
            }
        }
        3 => {
            typed(linalg::qr(
                &a,
                [
                    linalg::QrMode::Reduced,
                    linalg::QrMode::Complete,
                    linalg::QrMode::R,
                ][rng.below(3)],
            ));
        }
        4 => {
            if let (Some(e), Some(w)) = (
                typed(linalg::eigh(&a, upper)),
                typed(linalg::eigvalsh(&a, upper)),
            ) {
                compared();
                let (ev, wv) = (values(&e.eigenvalues), values(&w));
                let finite = ev.iter().all(|x| x.is_finite());
                if finite
                    && !close(
                        &ev,
                        &wv,
                        &ev.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
                        dt,
                    )
                {
                    return Err(format!("eigh and eigvalsh differ: {ev:?} vs {wv:?}"));
                }
            }
        }
        5 => {
            if let (Some(s), Some(v)) = (
                typed(linalg::svd(&a, rng.chance(50))),
                typed(linalg::svdvals(&a)),
            ) {
                compared();
                let (sv, vv) = (values(&s.s), values(&v));
                if !close(
                    &sv,
                    &vv,
                    &sv.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
                    dt,
                ) {
                    return Err(format!("svd and svdvals differ: {sv:?} vs {vv:?}"));
                }
            }
        }
        6 => {
            typed(linalg::cholesky_inverse(&a, upper));
            let columns = rng.dim(3);
            let rhs = tensor(rng, &[m, columns], dt).map(|t| t.0);
            if let Some(rhs) = rhs {
                typed(linalg::cholesky_solve(&rhs, &a, upper));
            }
        }
        _ => {
            // P L U reproduces A (partial pivoting is backward stable: within the dtype's
            // bound of |P| |L| |U|).
            if let Some(lu) = typed(linalg::lu(&a)) {
                compared();
                let k = m.min(n);
                let count = batch.iter().product::<usize>();
                let (p, l, u) = (values(&lu.p), values(&lu.l), values(&lu.u));
                for i in 0..count {
                    let (pi, li, ui) = (
                        &p[i * m * m..][..m * m],
                        &l[i * m * k..][..m * k],
                        &u[i * k * n..][..k * n],
                    );
                    let got = product(pi, &product(li, ui, m, k, n), m, m, n);
                    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
                    let magnitude =
                        product(&abs(pi), &product(&abs(li), &abs(ui), m, k, n), m, m, n);
                    if !close(&got, &ah[i * m * n..][..m * n], &magnitude, dt) {
                        return Err(format!("P L U is not A for {shape:?} {dt}"));
                    }
                }
            }
        }
    }
    Ok(())
}
