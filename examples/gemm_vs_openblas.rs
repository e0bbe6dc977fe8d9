//! Our CPU f32 `matmul` and OpenBLAS's `cblas_sgemm`, alternating in one process: the
//! fairest comparison on a noisy machine (both sides see the same moments). Prints, per
//! size, each side's best GFLOP/s and the median and quartiles of the per-pair speed ratios
//! (ours / theirs).
//!
//! `OPENBLAS_LIB=/path/to/libopenblas.so cargo run --release --example gemm_vs_openblas --
//! 1024 2048` (`scripts/compare.sh` passes the library numpy ships). Both sides allocate a
//! fresh output per call, as numpy's `a @ b` does; `PAIRS` sets the number of pairs (15).
//! Set `OPENBLAS_THREAD_TIMEOUT=4`: OpenBLAS's idle threads otherwise spin for ~0.1 s
//! after each call, on the cores our next call needs.

use std::time::Instant;

use backends::{DType, Device, Tensor, matmul};
use libloading::{Library, Symbol};

/// `cblas_sgemm` with 64-bit integers (the ILP64 builds numpy and SciPy ship).
type Sgemm64 = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    f32,
    *const f32,
    i64,
    *const f32,
    i64,
    f32,
    *mut f32,
    i64,
);
/// `cblas_sgemm` with 32-bit integers (a distribution's libopenblas).
type Sgemm32 = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    f32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;

/// The loaded library's sgemm, whichever integer width it was built with.
enum Peer<'a> {
    Ilp64(Symbol<'a, Sgemm64>),
    Lp64(Symbol<'a, Sgemm32>),
}

impl Peer<'_> {
    /// `C = A B` for row-major n x n matrices.
    fn square(&self, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: the three buffers hold n x n floats each, and the symbol has this
        // signature (chosen by its name).
        unsafe {
            match self {
                Peer::Ilp64(f) => {
                    let n = n as i64;
                    f(
                        ROW_MAJOR, NO_TRANS, NO_TRANS, n, n, n, 1.0, a, n, b, n, 0.0, c, n,
                    )
                }
                Peer::Lp64(f) => {
                    let n = i32::try_from(n).expect("sizes fit 32-bit BLAS");
                    f(
                        ROW_MAJOR, NO_TRANS, NO_TRANS, n, n, n, 1.0, a, n, b, n, 0.0, c, n,
                    )
                }
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::var("OPENBLAS_LIB")
        .map_err(|_| "set OPENBLAS_LIB to the path of a libopenblas shared library")?;
    // SAFETY: loading OpenBLAS runs its initialisers, which only set up its thread pool.
    let lib = unsafe { Library::new(&path)? };
    let threads = backends::get_num_threads();
    // SAFETY: each name is looked up with the signature OpenBLAS gives it.
    let peer = unsafe {
        for name in [
            &b"scipy_openblas_set_num_threads64_"[..],
            b"openblas_set_num_threads64_",
            b"openblas_set_num_threads",
        ] {
            if let Ok(set) = lib.get::<unsafe extern "C" fn(i32)>(name) {
                set(threads as i32);
                break;
            }
        }
        if let Ok(f) = lib.get::<Sgemm64>(b"scipy_cblas_sgemm64_") {
            Peer::Ilp64(f)
        } else if let Ok(f) = lib.get::<Sgemm64>(b"cblas_sgemm64_") {
            Peer::Ilp64(f)
        } else {
            Peer::Lp64(lib.get::<Sgemm32>(b"cblas_sgemm")?)
        }
    };
    let pairs: usize = std::env::var("PAIRS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(15)
        .max(1);
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    for n in if sizes.is_empty() { vec![1024] } else { sizes } {
        let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
        let (ta, tb) = (
            Tensor::from_vec(a.clone(), &[n, n], Device::Cpu)?,
            Tensor::from_vec(b.clone(), &[n, n], Device::Cpu)?,
        );
        // Both once untimed, and a check that they agree.
        let ours = matmul(&ta, &tb)?.to_f64()?;
        let mut theirs = vec![0f32; n * n];
        peer.square(n, &a, &b, &mut theirs);
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(x, &y)| (x - f64::from(y)).abs() / (1.0 + x.abs()))
            .fold(0.0, f64::max);
        assert!(worst < 1e-3, "n {n}: the two products differ by {worst}");
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..pairs {
            let start = Instant::now();
            let c = matmul(&ta, &tb)?;
            ours.push(start.elapsed().as_secs_f64());
            drop(c);
            let start = Instant::now();
            let mut c = vec![0f32; n * n];
            peer.square(n, &a, &b, &mut c);
            theirs.push(start.elapsed().as_secs_f64());
            drop(c);
        }
        let mut ratios: Vec<f64> = ours.iter().zip(&theirs).map(|(o, t)| t / o).collect();
        ratios.sort_by(f64::total_cmp);
        let gflops = |times: &[f64]| {
            2.0 * (n as f64).powi(3) / times.iter().copied().fold(f64::MAX, f64::min) / 1e9
        };
        println!(
            "{} {n:5}: ours {:.1} GFLOP/s, openblas {:.1} GFLOP/s, median ratio {:.2} \
             (quartiles {:.2} {:.2})",
            DType::F32,
            gflops(&ours),
            gflops(&theirs),
            ratios[pairs / 2],
            ratios[pairs / 4],
            ratios[3 * pairs / 4]
        );
    }
    Ok(())
}
