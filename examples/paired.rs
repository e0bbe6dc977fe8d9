//! Times one CPU call per line of stdin and prints its seconds, so that a driver can
//! alternate our calls with a peer's call by call in one run (`scripts/compare.sh` does,
//! with PyTorch): on a noisy machine both sides then meet the same bursts.
//!
//! Lines: `gemm <f32|bf16> <n>` (a fresh `[n, n] x [n, n]` product, output allocated per
//! call as `a @ b` does) or `sdpa <f32|bf16> <head dim> <length> <causal 0|1>` (B = 2,
//! H = 16; a sixth word `mask` adds an additive `[2, 1, length, length]` mask), `linear <f32|bf16> <m> <k> <n> <plain|t>` (`[m, k] x [k, n]`, the right side
//! a plain matrix or the transposed view of an `[n, k]` weight, as `x @ W.t()`),
//! `decode <f32|bf16> <heads> <kv heads> <keys> <head dim>` (one query row per head, B = 1),
//! `paged <f32|bf16> <heads> <kv heads> <keys> <head dim> <block size>` (the same decoding
//! step over a paged cache of those keys, its block table shuffled; `sdpa_paged`),
//! `fft <f32|f64> <fft|rfft|fft2> <dims...>` (the transform of a signal of shape `dims`,
//! complex ones with a trailing 2 added), `einsum <dtype> <equation> <shape>;<shape>...`
//! (shapes comma-separated, e.g. `einsum f32 ij,jk->ik 64,32;32,16`) or
//! `mha <dtype> <batch> <length> <embedding> <heads>` (self-attention, both projections
//! with bias, the fast path) or
//! `linalg <f32|f64> <inv|cholesky|lu_factor|qr|eigh|eigvalsh|svd|svdvals> <n>` (one
//! `[n, n]` symmetric, diagonally dominant matrix: positive-definite) or
//! `conv <dtype> <n> <c> <h> <w> <o> <k> <stride> <padding> <groups>` (`conv2d` of an
//! `[n, c, h, w]` input with an `[o, c / groups, k, k]` weight and a bias). Inputs are made
//! once per distinct line. A line `threads <n>` sets the thread count of the calls after it
//! (and prints 0), so that one process can alternate thread counts call by call.
//! `echo "sdpa f32 64 1024 0" | cargo run --release --example paired`

use std::io::{BufRead, Write};
use std::time::Instant;

use backends::mha::{MhaOptions, MhaWeights, multi_head_attention_forward};
use backends::{
    DType, Device, PagedKv, SdpaOptions, Tensor, conv, conv2d, einsum, fft, linalg, matmul, sdpa,
    sdpa_paged,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The inputs of one kind of call.
enum Work {
    Gemm(Tensor, Tensor),
    /// q, k, v, causal, and an additive mask.
    Sdpa([Tensor; 3], bool, Option<Tensor>),
    Fft(fn(&Tensor) -> backends::Result<Tensor>, Tensor),
    Einsum(String, Vec<Tensor>),
    /// Input, heads, then the in- and out-projection weights and biases.
    Mha(Tensor, usize, [Tensor; 4]),
    Paged([Tensor; 3], Vec<usize>, usize),
    Linalg(String, Tensor),
    /// Input, weight, bias, stride, padding, groups.
    Conv([Tensor; 3], usize, usize, usize),
}

/// Values in [-1, 1) without a random generator (the timing does not depend on them).
fn filled(shape: &[usize], dtype: DType, seed: usize) -> Result<Tensor> {
    let n = shape.iter().product::<usize>();
    let values: Vec<f64> = (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    Ok(Tensor::from_f64(&values, shape, dtype, Device::Cpu)?)
}

fn parse(line: &str) -> Result<Work> {
    let bad = || format!("cannot read {line:?}: see the header of examples/paired.rs");
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> Result<usize> {
        Ok(words.get(i).and_then(|w| w.parse().ok()).ok_or_else(bad)?)
    };
    let dtype: DType = words.get(1).ok_or_else(bad)?.parse()?;
    match words.first() {
        Some(&"gemm") => {
            let n = number(2)?;
            Ok(Work::Gemm(
                filled(&[n, n], dtype, 1)?,
                filled(&[n, n], dtype, 2)?,
            ))
        }
        Some(&"sdpa") => {
            let (d, l) = (number(2)?, number(3)?);
            let shape = [2, 16, l, d];
            let mask = match words.get(5) {
                Some(&"mask") => Some(filled(&[2, 1, l, l], dtype, 4)?),
                _ => None,
            };
            Ok(Work::Sdpa(
                [
                    filled(&shape, dtype, 1)?,
                    filled(&shape, dtype, 2)?,
                    filled(&shape, dtype, 3)?,
                ],
                number(4)? == 1,
                mask,
            ))
        }
        Some(&"linear") => {
            let (m, k, n) = (number(2)?, number(3)?, number(4)?);
            let b = match words.get(5) {
                Some(&"t") => filled(&[n, k], dtype, 2)?.t()?,
                _ => filled(&[k, n], dtype, 2)?,
            };
            Ok(Work::Gemm(filled(&[m, k], dtype, 1)?, b))
        }
        Some(&"decode") => {
            let (h, hk, lk, d) = (number(2)?, number(3)?, number(4)?, number(5)?);
            let kv = [1, hk, lk, d];
            Ok(Work::Sdpa(
                [
                    filled(&[1, h, 1, d], dtype, 1)?,
                    filled(&kv, dtype, 2)?,
                    filled(&kv, dtype, 3)?,
                ],
                false,
                None,
            ))
        }
        Some(&"paged") => {
            let (h, hk, lk, d) = (number(2)?, number(3)?, number(4)?, number(5)?);
            let block = number(6)?;
            let blocks = lk.div_ceil(block.max(1));
            // A fixed shuffle of the blocks: block i of the sequence is cache block
            // (i * 7919) mod blocks where that is a permutation, else i.
            let stride = if blocks % 7919 == 0 { 1 } else { 7919 };
            let table: Vec<usize> = (0..blocks).map(|i| (i * stride) % blocks).collect();
            let cache = [blocks, block, hk, d];
            Ok(Work::Paged(
                [
                    filled(&[1, h, 1, d], dtype, 1)?,
                    filled(&cache, dtype, 2)?,
                    filled(&cache, dtype, 3)?,
                ],
                table,
                lk,
            ))
        }
        Some(&"fft") => {
            let mut dims: Vec<usize> = (3..words.len()).map(number).collect::<Result<_>>()?;
            let transform: fn(&Tensor) -> backends::Result<Tensor> = match words.get(2) {
                Some(&"fft") => fft::fft,
                Some(&"fft2") => fft::fft2,
                Some(&"rfft") => fft::rfft,
                _ => return Err(bad().into()),
            };
            if words[2] != "rfft" {
                dims.push(2);
            }
            Ok(Work::Fft(transform, filled(&dims, dtype, 1)?))
        }
        Some(&"einsum") => {
            let equation = words.get(2).ok_or_else(bad)?.to_string();
            let operands = words
                .get(3)
                .ok_or_else(bad)?
                .split(';')
                .enumerate()
                .map(|(seed, dims)| {
                    let shape: Vec<usize> = dims
                        .split(',')
                        .map(|d| d.parse().map_err(|_| bad()))
                        .collect::<std::result::Result<_, _>>()?;
                    filled(&shape, dtype, seed + 1)
                })
                .collect::<Result<_>>()?;
            Ok(Work::Einsum(equation, operands))
        }
        Some(&"mha") => {
            let (n, l, e, h) = (number(2)?, number(3)?, number(4)?, number(5)?);
            Ok(Work::Mha(
                filled(&[n, l, e], dtype, 1)?,
                h,
                [
                    filled(&[3 * e, e], dtype, 2)?,
                    filled(&[3 * e], dtype, 3)?,
                    filled(&[e, e], dtype, 4)?,
                    filled(&[e], dtype, 5)?,
                ],
            ))
        }
        Some(&"conv") => {
            let [n, c, h, w, o, k, stride, padding, groups] =
                [2, 3, 4, 5, 6, 7, 8, 9, 10].map(number);
            let (c, o, k, groups) = (c?, o?, k?, groups?);
            Ok(Work::Conv(
                [
                    filled(&[n?, c, h?, w?], dtype, 1)?,
                    filled(&[o, c / groups.max(1), k, k], dtype, 2)?,
                    filled(&[o], dtype, 3)?,
                ],
                stride?,
                padding?,
                groups,
            ))
        }
        Some(&"linalg") => {
            let n = number(3)?;
            // Symmetric, and each diagonal element n exceeds its row's other n - 1 in sum.
            let values: Vec<f64> = (0..n * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    let (lo, hi) = (i.min(j), i.max(j));
                    if i == j {
                        n as f64
                    } else {
                        ((lo * 7919 + hi * 104_729) % 1000) as f64 / 1000.0 - 0.5
                    }
                })
                .collect();
            let a = Tensor::from_f64(&values, &[n, n], dtype, Device::Cpu)?;
            Ok(Work::Linalg(words.get(2).ok_or_else(bad)?.to_string(), a))
        }
        _ => Err(bad().into()),
    }
}

fn main() -> Result<()> {
    let mut current: Option<(String, Work)> = None;
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if let Some(count) = line.strip_prefix("threads ") {
            backends::set_num_threads(count.trim().parse()?)?;
            writeln!(stdout.lock(), "0")?;
            continue;
        }
        if current.as_ref().is_none_or(|(seen, _)| *seen != line) {
            current = Some((line.clone(), parse(&line)?));
        }
        let Some((_, work)) = &current else { continue };
        let start = Instant::now();
        match work {
            Work::Gemm(a, b) => drop(matmul(a, b)?),
            Work::Sdpa([q, k, v], causal, mask) => {
                let options = SdpaOptions {
                    is_causal: *causal,
                    attn_mask: mask.as_ref(),
                    enable_gqa: q.shape()[1] != k.shape()[1],
                    ..Default::default()
                };
                drop(sdpa(q, k, v, &options)?);
            }
            Work::Paged([q, key_cache, value_cache], table, keys) => {
                let cache = PagedKv {
                    key_cache,
                    value_cache,
                    block_table: table,
                    seq_lens: &[*keys],
                };
                let options = SdpaOptions {
                    enable_gqa: q.shape()[1] != key_cache.shape()[2],
                    ..Default::default()
                };
                drop(sdpa_paged(q, &cache, &options)?);
            }
            Work::Fft(transform, x) => drop(transform(x)?),
            Work::Einsum(equation, operands) => {
                drop(einsum(equation, &operands.iter().collect::<Vec<_>>())?)
            }
            Work::Mha(x, heads, [w_in, b_in, w_out, b_out]) => {
                let weights = MhaWeights::packed(w_in, Some(b_in), w_out, Some(b_out));
                let options = MhaOptions::default();
                drop(multi_head_attention_forward(
                    x, x, x, *heads, &weights, &options,
                )?);
            }
            Work::Conv([x, w, b], stride, padding, groups) => {
                let options = conv::Conv2dOptions {
                    bias: Some(b),
                    stride: [*stride; 2],
                    padding: conv::Padding::Explicit([*padding; 2]),
                    groups: *groups,
                    ..Default::default()
                };
                drop(conv2d(x, w, &options)?)
            }
            Work::Linalg(op, a) => match op.as_str() {
                "inv" => drop(linalg::inv(a)?),
                "cholesky" => drop(linalg::cholesky(a, false)?),
                "lu_factor" => drop(linalg::lu_factor(a)?),
                "qr" => drop(linalg::qr(a, linalg::QrMode::Reduced)?),
                "eigh" => drop(linalg::eigh(a, false)?),
                "svd" => drop(linalg::svd(a, false)?),
                "eigvalsh" => drop(linalg::eigvalsh(a, false)?),
                "svdvals" => drop(linalg::svdvals(a)?),
                other => return Err(format!("no linalg op {other:?}").into()),
            },
        }
        let seconds = start.elapsed().as_secs_f64();
        let mut out = stdout.lock();
        writeln!(out, "{seconds}")?;
        out.flush()?;
    }
    Ok(())
}
