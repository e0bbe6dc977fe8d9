//! Times CPU attention (the selected backend) for B=2, H=16, f32 and bf16 inputs, and
//! prints TFLOP/s (medians).
//! `cargo run --release --example sdpa_speed -- 1024 2048`

use std::time::Instant;

use backends::{DType, Device, SdpaOptions, Tensor, sdpa};

fn main() -> backends::Result<()> {
    let lengths: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lengths = if lengths.is_empty() {
        vec![512, 1024, 2048]
    } else {
        lengths
    };
    let dtypes = match std::env::var("SDPA_DTYPES") {
        Ok(names) => names
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<DType>, _>>()?,
        Err(_) => vec![DType::F32, DType::Bf16],
    };
    for dtype in dtypes {
        for d in [64, 128] {
            for causal in [false, true] {
                for &l in &lengths {
                    let shape = [2, 16, l, d];
                    let n = shape.iter().product::<usize>();
                    let t = |seed: usize| {
                        let values: Vec<f64> = (0..n)
                            .map(|i| ((i * 7919 + seed * 104729) % 1000) as f64 / 500.0 - 1.0)
                            .collect();
                        Tensor::from_f64(&values, &shape, dtype, Device::Cpu)
                    };
                    let (q, k, v) = (t(1)?, t(2)?, t(3)?);
                    let options = SdpaOptions {
                        is_causal: causal,
                        ..Default::default()
                    };
                    let mut times: Vec<f64> = (0..5)
                        .map(|_| {
                            let start = Instant::now();
                            let _ = sdpa(&q, &k, &v, &options);
                            start.elapsed().as_secs_f64()
                        })
                        .collect();
                    times.sort_by(f64::total_cmp);
                    let flops =
                        4.0 * 2.0 * 16.0 * (l * l * d) as f64 / if causal { 2.0 } else { 1.0 };
                    println!(
                        "{dtype} d{d} L{l} causal={causal}: {:.3} TFLOP/s",
                        flops / times[2] / 1e12
                    );
                }
            }
        }
    }
    Ok(())
}
