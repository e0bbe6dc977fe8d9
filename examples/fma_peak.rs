//! Measures this CPU's fp32 FMA throughput: every thread runs independent fused
//! multiply-add chains in the widest vectors the CPU has (AVX-512, AVX2+FMA, or scalar) and
//! the best of five runs is printed in GFLOP/s, the ceiling a GEMM or attention kernel can
//! approach.
//! `cargo run --release --example fma_peak` (threads: `OMP_NUM_THREADS`, else all CPUs).

use std::time::Instant;

const ITERATIONS: u64 = 20_000_000;

/// 12 independent chains of 16-lane FMAs: enough to cover the FMA latency on two ports.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chains_avx512() -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..ITERATIONS {
        for x in &mut acc {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
}

/// The same with 8-lane AVX2 FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains_avx2() -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..ITERATIONS {
        for x in &mut acc {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut lanes = [0f32; 8];
    acc.iter()
        .map(|&x| {
            // SAFETY: `lanes` holds 8 floats; the store is unaligned.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
            lanes.iter().sum::<f32>()
        })
        .sum()
}

/// Lanes per FMA and one thread's run of the widest kernel here.
fn kernel() -> (u64, fn() -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            return (16, || unsafe { chains_avx512() });
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return (8, || unsafe { chains_avx2() });
        }
    }
    (1, || {
        let mut acc = [1f32; 12];
        for _ in 0..ITERATIONS {
            for x in &mut acc {
                *x = x.mul_add(0.999_999, 1e-7);
            }
        }
        acc.iter().sum()
    })
}

fn main() {
    let threads = std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (lanes, run) = kernel();
    let flops = (threads as u64 * ITERATIONS * 12 * lanes * 2) as f64;
    // The best of several runs: the first ones also wait for the clock to ramp up.
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            let sums: Vec<f32> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads).map(|_| s.spawn(run)).collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(sums.iter().all(|s| s.is_finite()));
            flops / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max);
    println!("fp32 FMA peak: {best:.1} GFLOP/s ({threads} threads, {lanes} lanes)");
}
