//! A user crate of `backends`: attention whose backend choices the compiler checks.
//!
//! `cargo run -p attention-app` runs a causal self-attention block on the CPU with the
//! fused kernel pinned at compile time, then the same call with plain selection, and
//! prints which backend served each and how far apart they are.

use backends::attention::SdpBackend;
use backends::{Device, Result, SdpaOptions, SdpaOutput, Tensor, sdpa, sdpa_kernel};

const HEADS: usize = 4;
const LEN: usize = 96;
const HEAD_DIM: usize = 64;

/// Causal attention on the CPU's fused (flash-style) kernel, f32, head dim 64: a single
/// variant, so calls that match it skip the selection walk.
#[sdpa_kernel(flash, dtype = f32, head_dim = 64, causal, device = cpu)]
fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<SdpaOutput> {
    // `is_causal` is true by default in here.
    sdpa(q, k, v, &SdpaOptions::default())
}

/// The same call, any backend that can serve it, math first.
#[sdpa_kernel(math, flash, set_priority, causal, device = cpu)]
fn reference_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<SdpaOutput> {
    sdpa(q, k, v, &SdpaOptions::default())
}

/// Deterministic inputs in [-1, 1).
fn input(seed: usize) -> Result<Tensor> {
    let n = HEADS * LEN * HEAD_DIM;
    let values = (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_vec(values, &[1, HEADS, LEN, HEAD_DIM], Device::Cpu)
}

fn main() -> Result<()> {
    let (q, k, v) = (input(1)?, input(2)?, input(3)?);
    let fused = causal_attention(&q, &k, &v)?;
    let math = reference_attention(&q, &k, &v)?;
    assert_eq!(fused.backend, SdpBackend::Flash);
    assert_eq!(math.backend, SdpBackend::Math);
    let (a, b) = (fused.output.to_vec::<f32>()?, math.output.to_vec::<f32>()?);
    let diff: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from(x - y).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    let rel = (diff / norm).sqrt();
    println!(
        "causal attention [1, {HEADS}, {LEN}, {HEAD_DIM}]: {} (pinned) vs {}: relative difference {rel:.1e}",
        fused.backend, math.backend
    );
    if rel > 1e-5 {
        eprintln!("the fused and math paths disagree");
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_app_runs_and_its_paths_agree() {
        super::main().unwrap();
    }
}
