//! Fuzzing every public entry point with a seeded generator: random valid and invalid
//! shapes, dtypes, strides (transposed views), masks, flags. Every call must return a typed
//! error or a result that matches a naive float64 reference; a panic fails the case, with
//! its seed, and the whole run happens in a child process, so that an abort fails the test
//! instead of ending the run. Seeds of failures once found are kept in `REGRESSIONS`.
//!
//! `BACKENDS_FUZZ_SEED=n` reruns from another seed; `BACKENDS_FUZZ_CALLS=n` sets the calls
//! per entry point (2000 by default: well under a minute in CI).

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use backends::attention::{SdpBackend, sdpa_kernel_scoped};
use backends::mha::{self, MhaOptions, MhaWeights};
use backends::{DType, Device, SdpaOptions, Tensor, einsum, einsum_path, fft, matmul, sdpa};
use common::{attention_reference, in_child, rel_err};

/// Seeds whose cases once failed; they run first, every time.
const REGRESSIONS: &[u64] = &[];

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
        .unwrap_or(2000);
    let seeds = REGRESSIONS
        .iter()
        .copied()
        .chain((0..calls).map(|i| base.wrapping_mul(1_000_003).wrapping_add(i)));
    for seed in seeds {
        let outcome = catch_unwind(AssertUnwindSafe(|| case(&mut Rng(seed))));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(wrong)) => panic!("{what}, seed {seed}: {wrong}"),
            Err(_) => panic!("{what}, seed {seed}: panicked"),
        }
    }
    let checked = COMPARED.load(Ordering::Relaxed);
    eprintln!("{what}: {calls} calls, {checked} results compared with the reference");
    checked
}

/// A typed error is a fine answer to any input; a result must then be checked.
fn typed<T>(result: backends::Result<T>) -> Option<T> {
    result.ok()
}

fn construction_and_views(rng: &mut Rng) -> Result<(), String> {
    let rank = rng.below(5);
    let shape: Vec<usize> = (0..rank).map(|_| rng.dim(6)).collect();
    let dt = dtype(rng);
    let n = numel(&shape).unwrap_or(usize::MAX);
    // A wrong element count, sometimes.
    let given = if rng.chance(20) {
        rng.below(20)
    } else {
        n.min(4096)
    };
    let made = match dt {
        DType::Bool => Tensor::from_bools(&vec![true; given], &shape, Device::Cpu),
        _ => Tensor::from_f64(&vec![0.25; given], &shape, dt, Device::Cpu),
    };
    if let Some(t) = typed(made) {
        if t.numel() != given || t.shape() != shape.as_slice() {
            return Err(format!("{shape:?} made {:?} of {}", t.shape(), t.numel()));
        }
        let (d0, d1) = (rng.below(rank + 1), rng.below(rank + 1));
        if let Some(view) = typed(t.transpose(d0, d1)) {
            let back = view.transpose(d0, d1).map_err(|e| e.to_string())?;
            if back.to_f64().ok() != t.to_f64().ok() {
                return Err("transposing twice changed the values".into());
            }
            compared();
        }
    }
    if rng.chance(10) {
        let _ = Tensor::full(1f32, &shape, Device::Cpu);
    }
    Ok(())
}

fn matmul_case(rng: &mut Rng) -> Result<(), String> {
    let (m, n, k) = (rng.dim(5), rng.dim(5), rng.dim(5));
    let batch = |rng: &mut Rng| match rng.below(4) {
        0 => vec![],
        1 => vec![1],
        _ => vec![rng.dim(3)],
    };
    let (ba, bb) = (batch(rng), batch(rng));
    let k2 = if rng.chance(10) { rng.dim(5) } else { k };
    let dt = [DType::F32, DType::F64, DType::Bf16][rng.below(3)];
    let shape_a = [ba.clone(), vec![m, k]].concat();
    // B sometimes as the transposed view of a [.., n, k] tensor.
    let transposed = rng.chance(30);
    let shape_b = [
        bb.clone(),
        if transposed { vec![n, k2] } else { vec![k2, n] },
    ]
    .concat();
    let (Some((a, av)), Some((b, bv))) = (tensor(rng, &shape_a, dt), tensor(rng, &shape_b, dt))
    else {
        return Ok(());
    };
    let b = if transposed { b.t().unwrap() } else { b };
    // Empty operands can still ask for an output larger than this machine's memory: the
    // allocation may succeed (overcommit) and filling it would not.
    let out_len = [&ba, &bb, &vec![m, n]]
        .iter()
        .try_fold(1usize, |n, dims| numel(dims).and_then(|d| n.checked_mul(d)));
    if out_len.is_none_or(|n| n > 1 << 20) {
        return Ok(());
    }
    let Some(out) = typed(matmul(&a, &b)) else {
        return Ok(());
    };
    if k != k2 {
        return Err(format!("inner dims {k} and {k2} were accepted"));
    }
    let (nba, nbb) = (
        ba.first().copied().unwrap_or(1),
        bb.first().copied().unwrap_or(1),
    );
    let nb = if nba == 1 { nbb } else { nba };
    let got = out.to_f64().map_err(|e| e.to_string())?;
    if got.is_empty() {
        return match numel(&[nb, m, n]) {
            Some(0) => Ok(()),
            _ => Err(format!("{shape_a:?} x {shape_b:?} gave no elements")),
        };
    }
    let mut want = vec![0.0; nb * m * n];
    for bi in 0..nb {
        let (ia, ib) = (if nba == 1 { 0 } else { bi }, if nbb == 1 { 0 } else { bi });
        for i in 0..m {
            for j in 0..n {
                want[(bi * m + i) * n + j] = (0..k)
                    .map(|p| {
                        let bvalue = if transposed {
                            bv[(ib * n + j) * k + p]
                        } else {
                            bv[(ib * k + p) * n + j]
                        };
                        av[(ia * m + i) * k + p] * bvalue
                    })
                    .sum();
            }
        }
    }
    compared();
    if got.len() != want.len() || rel_err(&got, &want) > bound(dt).max(1e-5) {
        return Err(format!("{shape_a:?} x {shape_b:?}: {:?}", out.shape()));
    }
    Ok(())
}

fn sdpa_case(rng: &mut Rng) -> Result<(), String> {
    let (b, hk, lq, lk) = (rng.dim(2), rng.dim(2), rng.dim(5), rng.dim(5));
    let groups = if rng.chance(30) { 1 + rng.below(3) } else { 1 };
    let h = hk.saturating_mul(groups);
    let (d, dv) = (rng.dim(8), if rng.chance(20) { rng.dim(8) } else { 0 });
    let dv = if dv == 0 { d } else { dv };
    let dt = [DType::F32, DType::F64, DType::F16, DType::Bf16][rng.below(4)];
    let four = rng.chance(80);
    let lead = |x: usize| if four { vec![b, x] } else { vec![x] };
    let shapes = [
        [lead(h), vec![lq, d]].concat(),
        [lead(hk), vec![lk, d]].concat(),
        [lead(hk), vec![lk, dv]].concat(),
    ];
    let mut made = Vec::new();
    for s in &shapes {
        match tensor(rng, s, dt) {
            Some(t) => made.push(t),
            None => return Ok(()),
        }
    }
    let small_mask = lq.checked_mul(lk).is_some_and(|n| n <= 4096);
    let (mask, bias): (Option<Tensor>, Option<Vec<f64>>) = match rng.below(4) {
        _ if !small_mask => (None, None),
        0 => {
            // Boolean, every row keeping its first key (no row fully masked here).
            let keep: Vec<bool> = (0..lq * lk)
                .map(|e| e % lk == 0 || rng.chance(60))
                .collect();
            let bias = keep
                .iter()
                .map(|&k| if k { 0.0 } else { f64::NEG_INFINITY })
                .collect();
            (
                Tensor::from_bools(&keep, &[lq, lk], Device::Cpu).ok(),
                Some(bias),
            )
        }
        1 => {
            let values = rng.values(lq * lk);
            let mdt = [DType::F32, DType::F64, dt][rng.below(3)];
            let t = Tensor::from_f64(&values, &[lq, lk], mdt, Device::Cpu).ok();
            let rounded = t.as_ref().map(|t| t.to_f64().unwrap());
            (t, rounded)
        }
        _ => (None, None),
    };
    let causal = mask.is_none() && rng.chance(30);
    let dropout = if rng.chance(10) {
        [0.3, 1.0, 1.5, -0.1][rng.below(4)]
    } else {
        0.0
    };
    let options = SdpaOptions {
        attn_mask: mask.as_ref(),
        dropout_p: dropout,
        is_causal: causal,
        enable_gqa: groups > 1 || rng.chance(10),
        ..SdpaOptions::default()
    };
    let _only = rng.chance(20).then(|| {
        let all = [
            SdpBackend::Math,
            SdpBackend::Flash,
            SdpBackend::MemEfficient,
        ];
        sdpa_kernel_scoped(&all[..1 + rng.below(3)], rng.chance(50))
    });
    // As for matmul: no output larger than memory (q can be empty at head dim 0).
    if numel(&[b, h, lq, dv]).is_none_or(|n| n > 1 << 20) {
        return Ok(());
    }
    let Some(out) = typed(sdpa(&made[0].0, &made[1].0, &made[2].0, &options)) else {
        return Ok(());
    };
    if !(0.0..=1.0).contains(&dropout) {
        return Err(format!("dropout_p {dropout} was accepted"));
    }
    if dropout > 0.0 || d == 0 || lk == 0 {
        return Ok(()); // random, NaN by definition, or empty: the shape is all there is
    }
    let got = out.output.to_f64().map_err(|e| e.to_string())?;
    if got.is_empty() {
        return match numel(&[if four { b } else { 1 }, h, lq, dv]) {
            Some(0) => Ok(()),
            _ => Err(format!("{shapes:?} gave no elements")),
        };
    }
    let want = attention_reference(
        &made[0].1,
        &made[1].1,
        &made[2].1,
        [if four { b } else { 1 }, h, hk, lq, lk, d, dv],
        1.0 / (d as f64).sqrt(),
        causal,
        &|_, _, i, j| bias.as_ref().map_or(0.0, |m| m[i * lk + j]),
    );
    compared();
    if got.len() != want.len() || rel_err(&got, &want) > bound(dt) {
        return Err(format!(
            "{shapes:?} {dt} mask {:?} causal {causal}: error {} on {}",
            mask.as_ref().map(|m| m.dtype()),
            rel_err(&got, &want),
            out.backend
        ));
    }
    Ok(())
}

/// The naive einsum of `terms -> output` over labels a-e.
fn naive_einsum(
    terms: &[Vec<u8>],
    output: &[u8],
    values: &[Vec<f64>],
    sizes: &[usize; 5],
) -> Vec<f64> {
    let labels: Vec<u8> = (0..5)
        .filter(|&l| terms.iter().any(|t| t.contains(&l)))
        .collect();
    let out_len: usize = output.iter().map(|&l| sizes[l as usize]).product();
    let mut out = vec![0.0; out_len];
    let total: usize = labels.iter().map(|&l| sizes[l as usize]).product();
    let mut at = [0usize; 5];
    for mut flat in 0..total {
        for &l in labels.iter().rev() {
            at[l as usize] = flat % sizes[l as usize];
            flat /= sizes[l as usize];
        }
        let index = |ls: &[u8]| {
            ls.iter()
                .fold(0, |i, &l| i * sizes[l as usize] + at[l as usize])
        };
        let product: f64 = terms.iter().zip(values).map(|(t, v)| v[index(t)]).product();
        out[index(output)] += product;
    }
    out
}

fn einsum_case(rng: &mut Rng) -> Result<(), String> {
    let sizes: [usize; 5] = std::array::from_fn(|_| rng.below(4));
    let operands = 1 + rng.below(4);
    let terms: Vec<Vec<u8>> = (0..operands)
        .map(|_| (0..rng.below(4)).map(|_| rng.below(5) as u8).collect())
        .collect();
    let output: Vec<u8> = (0..5u8)
        .filter(|l| terms.iter().any(|t| t.contains(l)) && rng.chance(40))
        .collect();
    let text = |t: &[u8]| t.iter().map(|&l| (b'a' + l) as char).collect::<String>();
    let mut equation = format!(
        "{}->{}",
        terms.iter().map(|t| text(t)).collect::<Vec<_>>().join(","),
        text(&output)
    );
    // Noise: whitespace (also outside ASCII), a stray character, an extra label. Whitespace
    // keeps the meaning; anything else may change it, so that no reference applies.
    let noise = rng
        .chance(10)
        .then(|| [" ", "\u{3000}", "é", "1", "->", ".", "a"][rng.below(7)]);
    if let Some(noise) = noise {
        let at = equation
            .char_indices()
            .map(|(i, _)| i)
            .nth(rng.below(equation.chars().count() + 1))
            .unwrap_or(equation.len());
        equation.insert_str(at, noise);
    }
    let shapes: Vec<Vec<usize>> = terms
        .iter()
        .map(|t| t.iter().map(|&l| sizes[l as usize]).collect())
        .collect();
    let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
    let _ = einsum_path(&equation, &shape_refs);
    let mut made = Vec::new();
    for s in &shapes {
        match tensor(rng, s, DType::F64) {
            Some(t) => made.push(t),
            None => return Ok(()),
        }
    }
    let refs: Vec<&Tensor> = made.iter().map(|(t, _)| t).collect();
    let Some(out) = typed(einsum(&equation, &refs)) else {
        return Ok(());
    };
    if noise.is_some_and(|n| n.trim() != "") {
        return Ok(()); // an equation changed by the noise that still parsed: no reference
    }
    let values: Vec<Vec<f64>> = made.iter().map(|(_, v)| v.clone()).collect();
    let want = naive_einsum(&terms, &output, &values, &sizes);
    let got = out.to_f64().map_err(|e| e.to_string())?;
    let scale: f64 = want.iter().map(|x| x * x).sum::<f64>().sqrt();
    let diff: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    compared();
    if got.len() != want.len() || diff > 1e-10 * scale.max(1.0) {
        return Err(format!("{equation} on {shapes:?}: {diff}"));
    }
    Ok(())
}

fn fft_case(rng: &mut Rng) -> Result<(), String> {
    let rank = 1 + rng.below(3);
    let mut shape: Vec<usize> = (0..rank).map(|_| rng.dim(9)).collect();
    let complex = rng.chance(70);
    if complex {
        shape.push(if rng.chance(90) { 2 } else { 3 });
    }
    let dt = [DType::F32, DType::F64, DType::Bool][rng.below(3)];
    let Some((x, xv)) = tensor(rng, &shape, dt) else {
        return Ok(());
    };
    let which = rng.below(6);
    let irfft_n = rng.chance(50).then(|| rng.below(10));
    let result = match which {
        0 => fft::fft(&x),
        1 => fft::ifft(&x),
        2 => fft::fft2(&x),
        3 => fft::ifft2(&x),
        4 => fft::rfft(&x),
        _ => fft::irfft(&x, irfft_n),
    };
    let Some(out) = typed(result) else {
        return Ok(());
    };
    if dt == DType::Bool {
        return Err(format!("transform {which} of a bool tensor gave a result"));
    }
    // The reference: direct DFT sums in f64 over the same dimensions.
    let pairs = |v: &[f64]| -> Vec<(f64, f64)> { v.chunks(2).map(|p| (p[0], p[1])).collect() };
    let flat = |v: &[(f64, f64)]| -> Vec<f64> { v.iter().flat_map(|&(r, i)| [r, i]).collect() };
    let (want, out_shape) = match which {
        0..=3 => {
            let dims = shape[..shape.len() - 1].to_vec();
            let mut v = pairs(&xv);
            let inverse = which % 2 == 1;
            for axis in (dims.len() - 1 - (which / 2)..dims.len()).rev() {
                v = direct_dft(&v, &dims, axis, inverse);
            }
            (flat(&v), shape.clone())
        }
        4 => {
            let n = shape[shape.len() - 1];
            let v: Vec<(f64, f64)> = xv.iter().map(|&r| (r, 0.0)).collect();
            let v = direct_dft(&v, &shape, shape.len() - 1, false);
            let kept: Vec<(f64, f64)> = v
                .chunks(n)
                .flat_map(|line| line[..n / 2 + 1].to_vec())
                .collect();
            let mut out_shape = shape.clone();
            *out_shape.last_mut().unwrap() = n / 2 + 1;
            out_shape.push(2);
            (flat(&kept), out_shape)
        }
        _ => {
            let m = shape[shape.len() - 2];
            let n = irfft_n.unwrap_or(2 * (m - 1));
            // The Hermitian spectrum of length n from the first m coefficients (0 past them),
            // the imaginary parts of X[0] and X[n/2] dropped.
            let mut full = Vec::new();
            for half in pairs(&xv).chunks(m) {
                for k in 0..n {
                    let (j, mirrored) = if k <= n / 2 {
                        (k, false)
                    } else {
                        (n - k, true)
                    };
                    let (re, im) = half.get(j).copied().unwrap_or_default();
                    let im = if j == 0 || 2 * j == n { 0.0 } else { im };
                    full.push((re, if mirrored { -im } else { im }));
                }
            }
            let mut out_shape = shape[..shape.len() - 1].to_vec();
            *out_shape.last_mut().unwrap() = n;
            let v = direct_dft(&full, &out_shape, out_shape.len() - 1, true);
            (v.iter().map(|c| c.0).collect(), out_shape)
        }
    };
    if out.shape() != out_shape.as_slice() {
        return Err(format!(
            "transform {which} of {shape:?}: shape {:?}, want {out_shape:?}",
            out.shape()
        ));
    }
    let got = out.to_f64().map_err(|e| e.to_string())?;
    compared();
    if rel_err(&got, &want) > bound(dt).max(1e-5) {
        return Err(format!(
            "transform {which} of {shape:?} (n {irfft_n:?}): {}",
            rel_err(&got, &want)
        ));
    }
    Ok(())
}

/// The DFT (inverse: divided by the length) of complex `v` of `shape` along `axis`, by
/// direct sums.
fn direct_dft(v: &[(f64, f64)], shape: &[usize], axis: usize, inverse: bool) -> Vec<(f64, f64)> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut out = vec![(0.0, 0.0); v.len()];
    for (block, out) in v.chunks(n * inner).zip(out.chunks_mut(n * inner)) {
        for i in 0..inner {
            for f in 0..n {
                let (mut re, mut im) = (0.0, 0.0);
                for t in 0..n {
                    let angle = sign * 2.0 * std::f64::consts::PI * ((f * t) % n) as f64 / n as f64;
                    let (a, b) = block[t * inner + i];
                    re += a * angle.cos() - b * angle.sin();
                    im += a * angle.sin() + b * angle.cos();
                }
                let scale = if inverse { n as f64 } else { 1.0 };
                out[f * inner + i] = (re / scale, im / scale);
            }
        }
    }
    out
}

fn mha_case(rng: &mut Rng) -> Result<(), String> {
    let (n, l, s, e) = (rng.dim(2), rng.dim(4), rng.dim(4), rng.dim(8));
    let heads = rng.dim(4);
    let dt = [DType::F32, DType::F64][rng.below(2)];
    let (Some((x, _)), Some((kv, _)), Some((w_in, _)), Some((w_out, _))) = (
        tensor(rng, &[n, l, e], dt),
        tensor(rng, &[n, s, e], dt),
        tensor(rng, &[e.saturating_mul(3), e], dt),
        tensor(rng, &[e, e], dt),
    ) else {
        return Ok(());
    };
    let padding: Vec<bool> = (0..n.saturating_mul(s).min(4096))
        .map(|_| rng.chance(20))
        .collect();
    let mask = Tensor::from_bools(&padding, &[n, s], Device::Cpu).ok();
    let options = MhaOptions {
        key_padding_mask: mask.as_ref().filter(|_| rng.chance(50)),
        need_weights: rng.chance(30),
        is_causal: rng.chance(20),
    };
    let weights = MhaWeights {
        in_proj_weight: &w_in,
        in_proj_bias: None,
        out_proj_weight: &w_out,
        out_proj_bias: None,
    };
    let key = if rng.chance(50) { &x } else { &kv };
    if let Some(out) = typed(mha::multi_head_attention_forward(
        &x, key, key, heads, &weights, &options,
    )) {
        compared();
        if out.output.shape() != [n, l, e] {
            return Err(format!(
                "output {:?} for [{n}, {l}, {e}]",
                out.output.shape()
            ));
        }
    }
    Ok(())
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
    let cases: [(&str, Case); 7] = [
        ("tensor construction and views", construction_and_views),
        ("matmul", matmul_case),
        ("scaled_dot_product_attention", sdpa_case),
        ("einsum", einsum_case),
        ("fft", fft_case),
        ("multi_head_attention_forward", mha_case),
        ("flag guards", guards_case),
    ];
    for (what, case) in cases {
        let checked = fuzz(what, case);
        assert!(
            checked > 0,
            "{what}: no result was compared with a reference"
        );
    }
}
