//! Times this library's CUDA kernels on device 0 for `scripts/device-check.sh`, which
//! prints them next to PyTorch's: GEMM (generated kernels, cuBLAS, cuBLASLt), attention (flash,
//! memory-efficient, cuDNN), a 3x3 convolution (cuDNN, generated kernels) and linear algebra
//! (cuSOLVER: `inv`, `cholesky`, `eigh`, at nominal flop counts), medians of timed runs with the device synchronised, and each one's
//! relative error against a float64 reference on a smaller problem. One line per work:
//! `name<TAB>TFLOP/s<TAB>relative error`.
//!
//! `cargo run --release --example cuda_speed`

use std::time::Instant;

use backends::attention::{SdpBackend, sdpa_kernel};
use backends::conv::{Conv2dOptions, Padding};
use backends::cuda::{self, BlasBackend, PREFERRED_BLAS, matmul::FP32_PRECISION};
use backends::{DType, Device, Fp32Precision, SdpaOptions, Tensor, matmul, sdpa};

/// Pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// The median seconds of `run` on device 0 (after one warm-up run).
fn median(reps: usize, mut run: impl FnMut() -> backends::Result<()>) -> backends::Result<f64> {
    run()?;
    cuda::synchronize(0)?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        run()?;
        cuda::synchronize(0)?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (diff / norm).sqrt()
}

/// `matmul` in `dtype`: throughput at n = 8192 and the error at n = 512.
fn gemm(dtype: DType) -> backends::Result<(f64, f64)> {
    let device = Device::Cuda(0);
    let n = 8192;
    let a = Tensor::from_f64(&values(n * n, 1), &[n, n], dtype, device)?;
    let b = Tensor::from_f64(&values(n * n, 2), &[n, n], dtype, device)?;
    let seconds = median(10, || matmul(&a, &b).map(drop))?;
    let m = 512;
    let a = Tensor::from_f64(&values(m * m, 3), &[m, m], dtype, device)?;
    let b = Tensor::from_f64(&values(m * m, 4), &[m, m], dtype, device)?;
    let (ah, bh) = (a.to_f64()?, b.to_f64()?);
    let mut want = vec![0.0; m * m];
    for i in 0..m {
        for p in 0..m {
            for j in 0..m {
                want[i * m + j] += ah[i * m + p] * bh[p * m + j];
            }
        }
    }
    let got = matmul(&a, &b)?.to_f64()?;
    Ok((
        2.0 * (n as f64).powi(3) / seconds / 1e12,
        rel_err(&got, &want),
    ))
}

/// Attention in f64 over `[heads, l, d]` (no mask), top-left causal.
fn attention_reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    heads: usize,
    l: usize,
    d: usize,
    causal: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; heads * l * d];
    let scale = 1.0 / (d as f64).sqrt();
    for h in 0..heads {
        let at = |t: &[f64], i: usize, x: usize| t[(h * l + i) * d + x];
        for i in 0..l {
            let visible = if causal { i + 1 } else { l };
            let scores: Vec<f64> = (0..visible)
                .map(|j| (0..d).map(|x| at(q, i, x) * at(k, j, x)).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for x in 0..d {
                out[(h * l + i) * d + x] =
                    (0..visible).map(|j| weights[j] * at(v, j, x)).sum::<f64>() / sum;
            }
        }
    }
    out
}

/// A bf16 tensor of `shape` on device 0, filled from `values(_, seed)`.
fn on(shape: &[usize], seed: u64) -> backends::Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_f64(&values(n, seed), shape, DType::Bf16, Device::Cuda(0))
}

/// `backend` in bf16 on [2, 16, l, d]: throughput, and the error on [1, 2, 512, d].
fn attention(
    backend: SdpBackend,
    d: usize,
    l: usize,
    causal: bool,
) -> backends::Result<(f64, f64)> {
    let _only = sdpa_kernel(&[backend], false);
    let options = SdpaOptions {
        is_causal: causal,
        ..Default::default()
    };
    let shape = [2, 16, l, d];
    let (q, k, v) = (on(&shape, 5)?, on(&shape, 6)?, on(&shape, 7)?);
    let seconds = median(10, || sdpa(&q, &k, &v, &options).map(drop))?;
    let small = [1, 2, 512, d];
    let (q, k, v) = (on(&small, 8)?, on(&small, 9)?, on(&small, 10)?);
    let got = sdpa(&q, &k, &v, &options)?.output.to_f64()?;
    let want = attention_reference(&q.to_f64()?, &k.to_f64()?, &v.to_f64()?, 2, 512, d, causal);
    let flops = 4.0 * 2.0 * 16.0 * (l * l * d) as f64 / if causal { 2.0 } else { 1.0 };
    Ok((flops / seconds / 1e12, rel_err(&got, &want)))
}

/// One decoding step in bf16 under the default selection: q `[b, 32, 1, 128]` against a
/// `[b, 32, lk, 128]` cache: throughput, and the error on a `[1, 2, 1, 128]` query against 512 keys.
fn decode(b: usize, lk: usize) -> backends::Result<(f64, f64)> {
    let (h, d) = (32, 128);
    let options = SdpaOptions::default();
    let (q, k, v) = (
        on(&[b, h, 1, d], 11)?,
        on(&[b, h, lk, d], 12)?,
        on(&[b, h, lk, d], 13)?,
    );
    let seconds = median(20, || sdpa(&q, &k, &v, &options).map(drop))?;
    let (q, k, v) = (
        on(&[1, 2, 1, d], 14)?,
        on(&[1, 2, 512, d], 15)?,
        on(&[1, 2, 512, d], 16)?,
    );
    let got = sdpa(&q, &k, &v, &options)?.output.to_f64()?;
    // The reference takes square [heads, l, d] blocks: widen q to 512 rows of which row 0 counts.
    let (qh, kh, vh) = (q.to_f64()?, k.to_f64()?, v.to_f64()?);
    let mut q_rows = vec![0.0; 2 * 512 * d];
    for head in 0..2 {
        q_rows[head * 512 * d..head * 512 * d + d].copy_from_slice(&qh[head * d..(head + 1) * d]);
    }
    let full = attention_reference(&q_rows, &kh, &vh, 2, 512, d, false);
    let want: Vec<f64> = (0..2)
        .flat_map(|head| full[head * 512 * d..head * 512 * d + d].to_vec())
        .collect();
    let flops = 4.0 * (b * h * lk * d) as f64;
    Ok((flops / seconds / 1e12, rel_err(&got, &want)))
}

/// A 3x3 convolution (padding 1) in `dtype`: throughput at `[32, 256, 28, 28]` by
/// `[256, 256, 3, 3]` and the error at `[2, 64, 14, 14]` by `[64, 64, 3, 3]` against the CPU's
/// float64 convolution of the same (rounded) inputs.
fn conv(dtype: DType) -> backends::Result<(f64, f64)> {
    let device = Device::Cuda(0);
    let options = Conv2dOptions {
        padding: Padding::Explicit([1, 1]),
        ..Default::default()
    };
    let operands = |n: usize, c: usize, hw: usize, seed: u64| -> backends::Result<[Tensor; 2]> {
        Ok([
            Tensor::from_f64(
                &values(n * c * hw * hw, seed),
                &[n, c, hw, hw],
                dtype,
                device,
            )?,
            Tensor::from_f64(&values(c * c * 9, seed + 1), &[c, c, 3, 3], dtype, device)?,
        ])
    };
    let (n, c, hw) = (32, 256, 28);
    let [x, w] = operands(n, c, hw, 5)?;
    let seconds = median(10, || backends::conv2d(&x, &w, &options).map(drop))?;
    let flops = 2.0 * (n * c * hw * hw * c * 9) as f64;
    let [x, w] = operands(2, 64, 14, 7)?;
    let got = backends::conv2d(&x, &w, &options)?.to_f64()?;
    let on_host = |t: &Tensor| Tensor::from_f64(&t.to_f64()?, t.shape(), DType::F64, Device::Cpu);
    let want = backends::conv2d(&on_host(&x)?, &on_host(&w)?, &options)?.to_f64()?;
    Ok((flops / seconds / 1e12, rel_err(&got, &want)))
}

/// `linalg` op `name` in f32 at n = 1024 (a well-conditioned symmetric positive-definite
/// input): throughput at a nominal flop count and the error against the CPU's float64
/// result at n = 128.
fn linalg(name: &str) -> backends::Result<(f64, f64)> {
    use backends::linalg;
    let device = Device::Cuda(0);
    let spd = |n: usize, dtype: DType, on: Device| -> backends::Result<Tensor> {
        let mut a = values(n * n, 9);
        for i in 0..n {
            for j in 0..i {
                a[i * n + j] = a[j * n + i];
            }
            a[i * n + i] += n as f64;
        }
        Tensor::from_f64(&a, &[n, n], dtype, on)
    };
    let run = |a: &Tensor| -> backends::Result<Tensor> {
        match name {
            "inv" => linalg::inv(a),
            "cholesky" => linalg::cholesky(a, false),
            _ => linalg::eigvalsh(a, false),
        }
    };
    let n = 1024;
    let a = spd(n, DType::F32, device)?;
    let seconds = median(5, || run(&a).map(drop))?;
    let cube = (n * n * n) as f64;
    let flops = match name {
        "inv" => 2.0 * cube,
        "cholesky" => cube / 3.0,
        _ => 4.0 / 3.0 * cube,
    };
    let got = run(&spd(128, DType::F32, device)?)?.to_f64()?;
    let want = run(&spd(128, DType::F64, Device::Cpu)?)?.to_f64()?;
    Ok((flops / seconds / 1e12, rel_err(&got, &want)))
}

fn main() -> backends::Result<()> {
    if cuda::device_count() == 0 {
        eprintln!(
            "no CUDA device: {}",
            cuda::unavailable_reason().unwrap_or("the driver reports none")
        );
        return Ok(());
    }
    let print = |name: String, result: backends::Result<(f64, f64)>| match result {
        Ok((tflops, err)) => println!("{name}\t{tflops:.2}\t{err:.1e}"),
        Err(e) => println!("{name}\terror\t{e}"),
    };
    for (dtype, name, precision) in [
        (DType::Bf16, "bf16", Fp32Precision::Ieee),
        (DType::F16, "f16", Fp32Precision::Ieee),
        (DType::F32, "f32 ieee", Fp32Precision::Ieee),
        (DType::F32, "f32 tf32", Fp32Precision::Tf32),
    ] {
        let _precision = FP32_PRECISION.guard(precision);
        for (library, path) in [
            (BlasBackend::Default, "generated"),
            (BlasBackend::Cublas, "cublas"),
            (BlasBackend::Cublaslt, "cublaslt"),
        ] {
            let _library = PREFERRED_BLAS.guard(library);
            print(format!("GEMM {name} n=8192 {path}"), gemm(dtype));
        }
    }
    for (backend, name) in [
        (SdpBackend::Flash, "flash"),
        (SdpBackend::MemEfficient, "mem-efficient"),
        (SdpBackend::Cudnn, "cudnn"),
    ] {
        for d in [64, 128] {
            for causal in [false, true] {
                for l in [1024, 4096] {
                    let work = format!(
                        "SDPA {name} bf16 d{d} L{l}{}",
                        if causal { " causal" } else { "" }
                    );
                    print(work, attention(backend, d, l, causal));
                }
            }
        }
    }
    for (b, lk) in [(1, 8192), (8, 8192)] {
        print(
            format!("SDPA decode bf16 b{b} h32 d128 Lk{lk}"),
            decode(b, lk),
        );
    }
    for (dtype, name, tf32) in [
        (DType::Bf16, "bf16", false),
        (DType::F32, "f32 ieee", false),
        (DType::F32, "f32 tf32", true),
    ] {
        let _tf32 = backends::cudnn::ALLOW_TF32.guard(tf32);
        for (enabled, path) in [(true, "cudnn"), (false, "generated")] {
            let _cudnn = backends::cudnn::ENABLED.guard(enabled);
            print(
                format!("conv2d {name} 3x3 n32 c256 28x28 {path}"),
                conv(dtype),
            );
        }
    }
    for op in ["inv", "cholesky", "eigvalsh"] {
        print(format!("linalg {op} f32 n=1024"), linalg(op));
    }
    Ok(())
}
