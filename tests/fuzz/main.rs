//! Fuzzing every public entry point with a seeded generator: random valid and invalid
//! shapes, dtypes, strides (transposed views), masks, flags. Every call must return a typed
//! error or a result that matches a naive float64 reference; a panic fails the case, with
//! its seed, and the whole run happens in a child process, so that an abort fails the test
//! instead of ending the run. Seeds of failures once found are kept in `REGRESSIONS`.
//!
//! `BACKENDS_FUZZ_SEED=n` reruns from another seed; `BACKENDS_FUZZ_CALLS=n` sets the calls
//! per entry point (10,000 by default: a few seconds in CI).

mod attention;
mod borrow;
#[path = "../common/mod.rs"]
mod common;
mod linalg;
mod products;
mod signal;
mod views;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use attention::{mha_case, sdpa_case, serving_case};
use backends::attention::{SdpBackend, sdpa_kernel_scoped};
use backends::mha::{self, MhaOptions, MhaWeights};
use backends::{
    CausalVariant, DType, Device, PagedKv, SdpaOptions, Tensor, Varlen, Window, einsum,
    einsum_path, fft, matmul, sdpa, sdpa_paged, sdpa_varlen,
};
use borrow::borrow_case;
use common::{attention_reference, in_child, rel_err, window_hides};
use linalg::linalg_case;
use products::{einsum_case, linear_case, matmul_case};
use signal::{CONV_LOWERINGS, conv_case, fft_case};
use views::{Dense, construction_and_views, fits, laid_out, views_case};

/// Seeds whose cases once failed; they run first, every time, in every case. The
/// library's defects the fuzzing found earlier are reproduced by name in
/// `tests/robustness.rs`; the others here were the test's own (a check too strict, or a
/// test allocating gigabytes), or a change caught before it landed.
const REGRESSIONS: &[u64] = &[
    125_010_206, // matmul [2^32, 0] x [0]: a 16 GiB output of zeros, which the test skips
    132_009_851, // sdpa at head dim 1: an output that cancels, measured against |v|
    196_004_129, // matmul: a reference over a shape whose product wraps
    5_002_156,   // full(1, [2^53, 3, 0, 5]): empty, its strides fit, so it is allocated
    20_261_263_792_447, // sdpa decoding at a value dim of 0: a panic in the split-KV change
    20_261_263_784_122, // fft_with with a dimension of 0: panics padding it and in the reference
    20_261_263_783_628, // sdpa_paged at Lq 4: a test reference reading q head-major wrongly
    20_261_263_785_265, // mha with bias_k and S = 0: masks widened from empty rows (a panic)
];

/// A small seeded generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
            .collect()
    }
    /// A dimension: mostly small, sometimes 0, rarely enormous.
    fn dim(&mut self, max: usize) -> usize {
        match self.below(40) {
            0 => 0,
            1 => usize::MAX / (1 + self.below(4)),
            2 => 1 << (31 + self.below(30)),
            _ => 1 + self.below(max),
        }
    }
}

/// The element count of `shape` (0 when any dimension is, however large the others).
fn numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// A tensor of `shape` with values from `rng` where the shape is small enough to fill.
fn tensor(rng: &mut Rng, shape: &[usize], dtype: DType) -> Option<(Tensor, Vec<f64>)> {
    let n = numel(shape).filter(|&n| n <= 4096)?;
    let values = rng.values(n);
    let t = Tensor::from_f64(&values, shape, dtype, Device::Cpu).ok()?;
    // Read back: the reference sees the values as rounded to the dtype.
    let rounded = t.to_f64().unwrap();
    Some((t, rounded))
}

fn dtype(rng: &mut Rng) -> DType {
    [DType::F32, DType::F64, DType::F16, DType::Bf16, DType::Bool][rng.below(5)]
}

/// The bound of ‖out − ref‖ / ‖ref‖ for results in `dtype`.
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

/// Whether `got` matches `want` within the dtype's bound, relative to `magnitude`: the same
/// sums over the terms' magnitudes, which a result that cancels to near 0 keeps the scale
/// of its rounding error from.
fn close(got: &[f64], want: &[f64], magnitude: &[f64], dtype: DType) -> bool {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    got.len() == want.len()
        && norm(&mut got.iter().zip(want).map(|(g, w)| g - w))
            <= bound(dtype).max(1e-5) * norm(&mut magnitude.iter().copied())
}

/// One entry point's case: `Err` says what came out wrong.
type Case = fn(&mut Rng) -> Result<(), String>;

/// Results compared with a reference in the current `fuzz` run.
static COMPARED: AtomicUsize = AtomicUsize::new(0);

/// Counts one result checked against its reference.
fn compared() {
    COMPARED.fetch_add(1, Ordering::Relaxed);
}

/// Runs `case` for each seed, failing with the seed on a panic or a wrong result; returns
/// how many results were compared with a reference.
fn fuzz(what: &str, case: impl Fn(&mut Rng) -> Result<(), String>) -> usize {
    COMPARED.store(0, Ordering::Relaxed);
    let base: u64 = std::env::var("BACKENDS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_203);
    let calls: u64 = std::env::var("BACKENDS_FUZZ_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let seeds = REGRESSIONS
        .iter()
        .copied()
        .chain((0..calls).map(|i| base.wrapping_mul(1_000_003).wrapping_add(i)));
    let mut slowest = (std::time::Duration::ZERO, 0);
    for seed in seeds {
        let start = std::time::Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| case(&mut Rng(seed))));
        slowest = slowest.max((start.elapsed(), seed));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(wrong)) => panic!("{what}, seed {seed}: {wrong}"),
            Err(_) => panic!("{what}, seed {seed}: panicked"),
        }
    }
    let checked = COMPARED.load(Ordering::Relaxed);
    eprintln!(
        "{what}: {calls} calls, {checked} results compared with the reference; slowest: seed \
         {} ({:?})",
        slowest.1, slowest.0
    );
    checked
}

/// Row-major product of `a` (`m × k`) and `b` (`k × n`), entries as given.
fn product(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// A typed error is a fine answer to any input; a result must then be checked.
fn typed<T>(result: backends::Result<T>) -> Option<T> {
    result.ok()
}

fn guards_case(rng: &mut Rng) -> Result<(), String> {
    use backends::{cuda, cudnn, opt_einsum};
    let before = (
        cuda::flash_sdp_enabled(),
        cuda::matmul::allow_tf32(),
        opt_einsum::enabled(),
    );
    {
        let _a = rng
            .chance(50)
            .then(|| sdpa_kernel_scoped(&[SdpBackend::Math], rng.chance(50)));
        let _b = rng.chance(50).then(|| {
            cudnn::flags_scoped(cudnn::Flags {
                enabled: Some(rng.chance(50)),
                deterministic: Some(rng.chance(50)),
                ..Default::default()
            })
        });
        let _c = rng
            .chance(50)
            .then(|| opt_einsum::flags_scoped(Some(rng.chance(50)), None));
        let _ = backends::set_num_threads(rng.below(3000));
        let spelling = ["highest", "HIGH", "medium", "low", ""][rng.below(5)];
        if let Ok(precision) = spelling.parse::<backends::Float32MatmulPrecision>() {
            let _p = backends::float32_matmul_precision_scoped(precision);
        }
    }
    backends::set_num_threads(2).map_err(|e| e.to_string())?;
    let after = (
        cuda::flash_sdp_enabled(),
        cuda::matmul::allow_tf32(),
        opt_einsum::enabled(),
    );
    compared();
    if before != after {
        return Err(format!("scoped guards left {after:?} (was {before:?})"));
    }
    Ok(())
}

/// The whole fuzz run, in a child process (an abort there fails this test).
#[test]
fn every_entry_point_gives_a_typed_error_or_the_reference() {
    if !in_child(
        "every_entry_point_gives_a_typed_error_or_the_reference",
        &[],
    ) {
        return;
    }
    // Each entry point must also have been checked on results, not only on errors.
    let cases: [(&str, Case); 13] = [
        ("tensor construction and views", construction_and_views),
        ("views and copies", views_case),
        ("matmul", matmul_case),
        ("linear", linear_case),
        ("scaled_dot_product_attention", sdpa_case),
        ("sdpa_varlen and sdpa_paged", serving_case),
        ("einsum", einsum_case),
        ("fft", fft_case),
        ("multi_head_attention_forward", mha_case),
        ("conv2d", conv_case),
        ("linalg", linalg_case),
        ("borrow_scope, copy_ and matmul_out", borrow_case),
        ("flag guards", guards_case),
    ];
    for (what, case) in cases {
        let checked = fuzz(what, case);
        assert!(
            checked > 0,
            "{what}: no result was compared with a reference"
        );
    }
    // conv2d's results were checked on each CPU lowering (NNPACK's takes batches of 16).
    let lowerings = CONV_LOWERINGS.lock().unwrap().clone();
    eprintln!("conv2d results compared, by lowering: {lowerings:?}");
    for lowering in ["direct depthwise", "gemm", "implicit gemm", "im2col+gemm"] {
        assert!(
            lowerings.contains_key(lowering),
            "conv2d: no result of the {lowering} lowering was compared ({lowerings:?})"
        );
    }
}
