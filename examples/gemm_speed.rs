//! Times `matmul` on the CPU for square f32 and bf16 sizes and prints GFLOP/s (median of
//! runs). `cargo run --release --example gemm_speed -- 1024 2048 4096`

use std::time::Instant;

use backends::{DType, Device, Tensor, matmul};

fn main() -> backends::Result<()> {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![256, 512, 1024, 2048]
    } else {
        sizes
    };
    for dtype in [DType::F32, DType::Bf16] {
        for &n in &sizes {
            let a: Vec<f64> = (0..n * n).map(|i| (i % 7) as f64 - 3.0).collect();
            let b: Vec<f64> = (0..n * n).map(|i| (i % 5) as f64 - 2.0).collect();
            let a = Tensor::from_f64(&a, &[n, n], dtype, Device::Cpu)?;
            let b = Tensor::from_f64(&b, &[n, n], dtype, Device::Cpu)?;
            let runs = if n >= 2048 { 5 } else { 10 };
            let mut times: Vec<f64> = (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    let _ = matmul(&a, &b);
                    start.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let median = times[runs / 2];
            println!(
                "{dtype} {n:5}: {:8.1} GFLOP/s ({:.2} ms)",
                2.0 * (n as f64).powi(3) / median / 1e9,
                median * 1e3
            );
        }
    }
    Ok(())
}
