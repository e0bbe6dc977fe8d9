//! A candle model's attention block with this library's attention and matmul:
//! `cargo run --release --features candle --example candle_attention`. Prints each result's
//! error against candle's own ops and the time of both.

use std::time::Instant;

use candle_core::{D, Device, Result, Tensor};

fn main() -> Result<()> {
    let (b, l, e, h) = (2, 256, 512, 8);
    let cpu = Device::Cpu;
    let x = Tensor::randn(0f32, 1.0, (b, l, e), &cpu)?;
    let w = || Tensor::randn(0f32, (e as f32).powf(-0.5), (e, e), &cpu);
    let (wq, wk, wv, wo) = (w()?, w()?, w()?, w()?);
    // Projections with candle, heads as a [B, H, L, D] view of [B, L, H, D] (no copy).
    let heads = |w: &Tensor| -> Result<Tensor> {
        x.broadcast_matmul(&w.t()?)?
            .reshape((b, l, h, e / h))?
            .transpose(1, 2)
    };
    let (q, k, v) = (heads(&wq)?, heads(&wk)?, heads(&wv)?);

    let start = Instant::now();
    let attention = backends::candle::Attention {
        is_causal: true,
        ..Default::default()
    };
    let ours = backends::candle::sdpa(&q, &k, &v, &attention)?;
    let ours = backends::candle::matmul(&ours.transpose(1, 2)?.reshape((b, l, e))?, &wo.t()?)?;
    let ours_time = start.elapsed();

    let start = Instant::now();
    let scale = (e as f64 / h as f64).sqrt();
    let scores = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? / scale)?;
    let causal: Vec<f32> = (0..l * l)
        .map(|i| {
            if i % l > i / l {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let scores = scores.broadcast_add(&Tensor::from_vec(causal, (l, l), &cpu)?)?;
    let weights = scores
        .broadcast_sub(&scores.max_keepdim(D::Minus1)?)?
        .exp()?;
    let weights = weights.broadcast_div(&weights.sum_keepdim(D::Minus1)?)?;
    let theirs = weights.matmul(&v.contiguous()?)?;
    let theirs = theirs
        .transpose(1, 2)?
        .reshape((b, l, e))?
        .broadcast_matmul(&wo.t()?)?;
    let theirs_time = start.elapsed();

    let diff = (&ours - &theirs)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let norm = theirs.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let error = (diff / norm).sqrt();
    println!("attention block [B={b}, L={l}, E={e}, H={h}], causal");
    println!("  relative error vs candle's ops: {error:.2e}");
    println!("  backends: {ours_time:.2?}   candle: {theirs_time:.2?}");
    assert!(error < 1e-5, "the two disagree");
    Ok(())
}
