//! Serving attention cases shared by the CPU, wgpu and CUDA tests: packed batches and
//! paged caches against the float64 reference of each sequence alone (its rows gathered
//! here, its causal mask and window written out by the reference).

use backends::{
    CausalVariant, Device, Element, PagedKv, SdpaOptions, Tensor, Varlen, Window, sdpa_paged,
    sdpa_varlen,
};

use super::{attention_reference, random, rel_err, window_hides};

/// Masking of one case.
#[derive(Clone, Copy, Debug)]
pub struct Masking {
    pub causal: Option<CausalVariant>,
    pub window: Window,
}

pub const NONE: Masking = Masking {
    causal: None,
    window: Window::UNBOUNDED,
};

impl Masking {
    pub fn options(self, gqa: bool) -> SdpaOptions<'static> {
        SdpaOptions {
            is_causal: self.causal.is_some(),
            causal_variant: self.causal.unwrap_or_default(),
            window: self.window,
            enable_gqa: gqa,
            ..SdpaOptions::default()
        }
    }
}

/// `values` rounded to `T`, as a tensor of `shape` on `device`, and the rounded values.
fn tensor<T: Element>(values: &[f64], shape: &[usize], device: Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_f64(values, shape, T::DTYPE, device).unwrap();
    let held = t.to_f64().unwrap();
    (t, held)
}

/// The float64 attention of one sequence: q `[H, lq, D]`, k and v `[Hk, lk, D]` given by
/// element accessors.
#[allow(clippy::too_many_arguments)]
fn one_sequence(
    (h, hk, lq, lk, d): (usize, usize, usize, usize, usize),
    q: impl Fn(usize, usize, usize) -> f64,
    k: impl Fn(usize, usize, usize) -> f64,
    v: impl Fn(usize, usize, usize) -> f64,
    masking: Masking,
) -> Vec<f64> {
    let gather = |heads: usize, len: usize, f: &dyn Fn(usize, usize, usize) -> f64| {
        let mut out = Vec::with_capacity(heads * len * d);
        for head in 0..heads {
            for row in 0..len {
                for x in 0..d {
                    out.push(f(head, row, x));
                }
            }
        }
        out
    };
    let variant = masking.causal.unwrap_or_default();
    attention_reference(
        &gather(h, lq, &q),
        &gather(hk, lk, &k),
        &gather(hk, lk, &v),
        [1, h, hk, lq, lk, d, d],
        1.0 / (d as f64).sqrt(),
        masking.causal,
        &|_, _, i, j| {
            if window_hides(masking.window, variant, (lq, lk), i, j) {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        },
    )
}

/// A packed batch of `lens_q` / `lens_k` in `T`, against the reference of each sequence:
/// the relative error of the output, and the output's shape.
pub fn varlen_error<T: Element>(
    lens_q: &[usize],
    lens_k: &[usize],
    (h, hk, d): (usize, usize, usize),
    masking: Masking,
    device: Device,
) -> f64 {
    let cumulative = |lens: &[usize]| {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |total, &n| {
                *total += n;
                Some(*total)
            }))
            .collect::<Vec<_>>()
    };
    let (cu_q, cu_k) = (cumulative(lens_q), cumulative(lens_k));
    let (total_q, total_k) = (cu_q[lens_q.len()], cu_k[lens_k.len()]);
    let (q, qh) = tensor::<T>(&random(total_q * h * d), &[total_q, h, d], device);
    let (k, kh) = tensor::<T>(&random(total_k * hk * d), &[total_k, hk, d], device);
    let (v, vh) = tensor::<T>(&random(total_k * hk * d), &[total_k, hk, d], device);
    let batch = Varlen {
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
    };
    let out = sdpa_varlen(&q, &k, &v, &batch, &masking.options(h != hk)).unwrap();
    assert_eq!(out.output.shape(), [total_q, h, d]);
    assert_eq!(out.lse.as_ref().unwrap().shape(), [h, total_q]);
    let mut want = vec![f64::NAN; total_q * h * d];
    for b in 0..lens_q.len() {
        let (q0, k0) = (cu_q[b], cu_k[b]);
        let seq = one_sequence(
            (h, hk, lens_q[b], lens_k[b], d),
            |head, row, x| qh[((q0 + row) * h + head) * d + x],
            |head, row, x| kh[((k0 + row) * hk + head) * d + x],
            |head, row, x| vh[((k0 + row) * hk + head) * d + x],
            masking,
        );
        for head in 0..h {
            for i in 0..lens_q[b] {
                for x in 0..d {
                    want[((q0 + i) * h + head) * d + x] = seq[(head * lens_q[b] + i) * d + x];
                }
            }
        }
    }
    let got = out.output.to_f64().unwrap();
    assert!(
        got.iter().all(|x| x.is_finite()),
        "unwritten or NaN outputs"
    );
    rel_err(&got, &want)
}

/// A paged cache of `lens` tokens per sequence in blocks of `block` (the table shuffled,
/// one spare block per sequence so entries past the end are never read), q `[B, H, lq, D]`
/// in `T`: the relative error against each sequence's reference, and the trace.
pub fn paged_error<T: Element>(
    lens: &[usize],
    (h, hk, lq, d, block): (usize, usize, usize, usize, usize),
    masking: Masking,
    device: Device,
) -> (f64, Vec<String>) {
    let b = lens.len();
    let per_seq = lens
        .iter()
        .map(|n| n.div_ceil(block) + 1)
        .max()
        .unwrap_or(1);
    let blocks = b * per_seq + 3;
    // Sequence b's blocks: a permutation of the cache's blocks (every sequence gets its own).
    let mut order: Vec<usize> = (0..blocks).collect();
    for i in (1..blocks).rev() {
        let j = (random(1)[0].abs() * (i + 1) as f64) as usize % (i + 1);
        order.swap(i, j);
    }
    let table: Vec<usize> = order[..b * per_seq].to_vec();
    let cache = [blocks, block, hk, d];
    let (kc, kch) = tensor::<T>(&random(cache.iter().product()), &cache, device);
    let (vc, vch) = tensor::<T>(&random(cache.iter().product()), &cache, device);
    let (q, qh) = tensor::<T>(&random(b * h * lq * d), &[b, h, lq, d], device);
    let paged = PagedKv {
        key_cache: &kc,
        value_cache: &vc,
        block_table: &table,
        seq_lens: lens,
    };
    let capture = backends::TraceCapture::start();
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let out = sdpa_paged(&q, &paged, &masking.options(h != hk)).unwrap();
    let lines = capture.take();
    assert_eq!(out.output.shape(), [b, h, lq, d]);
    let mut want = Vec::with_capacity(b * h * lq * d);
    for (seq, &len) in lens.iter().enumerate() {
        let slot = |j: usize| table[seq * per_seq + j / block] * block + j % block;
        want.extend(one_sequence(
            (h, hk, lq, len, d),
            |head, i, x| qh[((seq * h + head) * lq + i) * d + x],
            |head, j, x| kch[(slot(j) * hk + head) * d + x],
            |head, j, x| vch[(slot(j) * hk + head) * d + x],
            masking,
        ));
    }
    let got = out.output.to_f64().unwrap();
    assert!(
        got.iter().all(|x| x.is_finite()),
        "unwritten or NaN outputs"
    );
    (rel_err(&got, &want), lines)
}

/// Split-KV decoding of a paged cache on a GPU `device`: sequences of different lengths
/// (one empty, one shorter than a chunk) split into chunks of whole blocks, the trace says
/// so, and each sequence matches its float64 reference.
pub fn split_kv_paged_decoding_matches(device: Device) {
    let lower = Masking {
        causal: Some(CausalVariant::LowerRight),
        ..NONE
    };
    for (masking, hk) in [(NONE, 4), (lower, 2)] {
        let (err, lines) =
            paged_error::<f32>(&[1500, 40, 0, 900], (4, hk, 1, 32, 16), masking, device);
        assert!(err < 1e-5, "{masking:?} hk={hk} on {device}: {err:e}");
        assert!(lines.iter().any(|l| l.contains("(split-KV)")), "{lines:?}");
    }
}

/// Split-KV decoding on a GPU `device`: calls whose query side is small against many keys
/// run split (the trace says so) and match the float64 reference in output and
/// log-sum-exp; a call the chunks cannot serve (upper-left causal: query 0 sees key 0 only)
/// runs whole and matches too. With `gqa` false the grouped-head cases are left out (the
/// memory-efficient backend refuses `enable_gqa` on dense calls, as PyTorch's does).
pub fn split_kv_decoding_matches(device: Device, dtypes: &[backends::DType], gqa: bool) {
    use backends::DType;
    let lower = Some(CausalVariant::LowerRight);
    // (H, Hk, Lq, Lk, causal, split)
    let cases = [
        (4, 4, 1, 1000, None, true),
        (8, 2, 1, 2049, lower, true),
        (2, 1, 3, 1300, None, true),
        (3, 3, 2, 1300, None, true),
        (2, 2, 1, 1000, Some(CausalVariant::UpperLeft), false),
    ];
    for &dtype in dtypes {
        for (h, hk, lq, lk, causal, split) in cases {
            if h != hk && !gqa {
                continue;
            }
            let d = 64;
            let (q, k, v) = (random(h * lq * d), random(hk * lk * d), random(hk * lk * d));
            let held = |x: &[f64], shape: &[usize]| {
                let cpu = Tensor::from_f64(x, shape, dtype, Device::Cpu).unwrap();
                (cpu.to_device(device).unwrap(), cpu.to_f64().unwrap())
            };
            let (qt, qh) = held(&q, &[1, h, lq, d]);
            let (kt, kh) = held(&k, &[1, hk, lk, d]);
            let (vt, vh) = held(&v, &[1, hk, lk, d]);
            let options = SdpaOptions {
                is_causal: causal.is_some(),
                causal_variant: causal.unwrap_or_default(),
                enable_gqa: h != hk,
                ..Default::default()
            };
            let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
            let capture = backends::TraceCapture::start();
            let out = backends::sdpa(&qt, &kt, &vt, &options).unwrap();
            let lines = capture.take();
            let what = format!("{dtype} h={h} hk={hk} lq={lq} lk={lk} {causal:?} on {device}");
            assert_eq!(
                lines.iter().any(|l| l.contains("(split-KV)")),
                split,
                "{what}: {lines:?}"
            );
            let scale = 1.0 / (d as f64).sqrt();
            let dims = [1, h, hk, lq, lk, d, d];
            let want = attention_reference(&qh, &kh, &vh, dims, scale, causal, &|_, _, _, _| 0.0);
            let err = rel_err(&out.output.to_f64().unwrap(), &want);
            // Flash rounds the weights to the 16-bit type for its tensor-core product.
            let bound = match (dtype, out.backend) {
                (DType::F32, _) => 1e-5,
                (_, backends::attention::SdpBackend::Flash) => 1e-2,
                _ => 3e-3,
            };
            assert!(err < bound, "{what}: {err:e}");
            // The log-sum-exp of each row: log sum_j exp(q.k_j * scale) over its visible keys.
            let lse = out.lse.expect("a fused backend").to_f64().unwrap();
            for hh in 0..h {
                let g = hh / (h / hk);
                for i in 0..lq {
                    let visible = match causal {
                        Some(CausalVariant::UpperLeft) => i + 1,
                        _ => lk,
                    };
                    let scores: Vec<f64> = (0..visible)
                        .map(|j| {
                            (0..d)
                                .map(|x| qh[(hh * lq + i) * d + x] * kh[(g * lk + j) * d + x])
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let want = top + scores.iter().map(|s| (s - top).exp()).sum::<f64>().ln();
                    let got = lse[hh * lq + i];
                    assert!(
                        (got - want).abs() < 1e-4 * want.abs().max(1.0),
                        "{what}: lse {got} vs {want}"
                    );
                }
            }
        }
    }
}
