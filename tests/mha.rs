//! `multi_head_attention_forward`: the fast and composed paths against a float64
//! reference and each other; the switch and the conditions that pick the path.

mod common;

use backends::mha::{self, MhaOptions, MhaOutput, MhaPath, MhaWeights};
use backends::{DType, Device, Error, Tensor};
use common::{random, rel_err};

const N: usize = 2;
const L: usize = 9;
const E: usize = 16;
const H: usize = 4;

struct Layer {
    w_in: Vec<f64>,
    b_in: Vec<f64>,
    w_out: Vec<f64>,
    b_out: Vec<f64>,
}

impl Layer {
    fn random() -> Layer {
        let scale = |v: Vec<f64>| v.into_iter().map(|x| x * 0.3).collect();
        Layer {
            w_in: scale(random(3 * E * E)),
            b_in: random(3 * E),
            w_out: scale(random(E * E)),
            b_out: random(E),
        }
    }

    fn tensors(&self) -> [Tensor; 4] {
        self.tensors_in(DType::F32, Device::Cpu)
    }

    fn tensors_in(&self, dtype: DType, device: Device) -> [Tensor; 4] {
        let t = |v: &[f64], s: &[usize]| Tensor::from_f64(v, s, dtype, device).unwrap();
        [
            t(&self.w_in, &[3 * E, E]),
            t(&self.b_in, &[3 * E]),
            t(&self.w_out, &[E, E]),
            t(&self.b_out, &[E]),
        ]
    }

    /// Multi-head attention in float64, written out directly.
    fn reference(
        &self,
        x: &[f64],
        kv: &[f64],
        s: usize,
        padding: &[bool],
        causal: bool,
    ) -> Vec<f64> {
        let d = E / H;
        let proj = |input: &[f64], rows: usize, part: usize| -> Vec<f64> {
            let mut out = vec![0.0; rows * E];
            for r in 0..rows {
                for o in 0..E {
                    let w = &self.w_in[(part * E + o) * E..(part * E + o + 1) * E];
                    out[r * E + o] = self.b_in[part * E + o]
                        + (0..E).map(|i| input[r * E + i] * w[i]).sum::<f64>();
                }
            }
            out
        };
        let (q, k, v) = (proj(x, N * L, 0), proj(kv, N * s, 1), proj(kv, N * s, 2));
        let mut merged = vec![0.0; N * L * E];
        for b in 0..N {
            for h in 0..H {
                for i in 0..L {
                    let mut w: Vec<f64> = (0..s)
                        .map(|j| {
                            if padding.get(b * s + j) == Some(&true) || (causal && j > i) {
                                return f64::NEG_INFINITY;
                            }
                            (0..d)
                                .map(|x| {
                                    q[(b * L + i) * E + h * d + x] * k[(b * s + j) * E + h * d + x]
                                })
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = w.iter().map(|x| (x - max).exp()).sum();
                    w.iter_mut().for_each(|x| *x = (*x - max).exp() / sum);
                    for x in 0..d {
                        merged[(b * L + i) * E + h * d + x] =
                            (0..s).map(|j| w[j] * v[(b * s + j) * E + h * d + x]).sum();
                    }
                }
            }
        }
        let mut out = vec![0.0; N * L * E];
        for r in 0..N * L {
            for o in 0..E {
                out[r * E + o] = self.b_out[o]
                    + (0..E)
                        .map(|i| merged[r * E + i] * self.w_out[o * E + i])
                        .sum::<f64>();
            }
        }
        out
    }
}

fn run(layer: &[Tensor; 4], q: &Tensor, kv: &Tensor, options: &MhaOptions) -> MhaOutput {
    let weights = MhaWeights::packed(&layer[0], Some(&layer[1]), &layer[2], Some(&layer[3]));
    mha::multi_head_attention_forward(q, kv, kv, H, &weights, options).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_f64().unwrap()
}

#[test]
fn fast_and_composed_paths_agree_with_the_reference() {
    let layer = Layer::random();
    let tensors = layer.tensors();
    let xv = random(N * L * E);
    let x = Tensor::from_f64(&xv, &[N, L, E], DType::F32, Device::Cpu).unwrap();
    let xv = values(&x);
    // Keys 7 and 8 of batch entry 1 are padding.
    let padding: Vec<bool> = (0..N * L).map(|i| i >= L + 7).collect();
    let mask = Tensor::from_bools(&padding, &[N, L], Device::Cpu).unwrap();
    for causal in [false, true] {
        let options = MhaOptions {
            key_padding_mask: Some(&mask),
            is_causal: causal,
            ..MhaOptions::default()
        };
        let fast = run(&tensors, &x, &x, &options);
        assert_eq!(fast.path, MhaPath::Fast);
        let composed = {
            let _off = mha::FASTPATH.guard_scoped(false);
            run(&tensors, &x, &x, &options)
        };
        assert_eq!(
            composed.path,
            MhaPath::Composed,
            "the switch forces the composed path"
        );
        let reference = layer.reference(&xv, &xv, L, &padding, causal);
        for out in [&fast, &composed] {
            let err = rel_err(&values(&out.output), &reference);
            assert!(err < 1e-5, "{:?} causal={causal}: {err:e}", out.path);
        }
        let between = rel_err(&values(&fast.output), &values(&composed.output));
        assert!(between < 1e-5, "{between:e}");
    }
}

/// Both paths keep the inputs' dtype (f64 to within f64 rounding, bf16 within its bound,
/// against the reference on the same rounded values), and run on wgpu.
#[test]
fn both_paths_keep_the_dtype_and_run_on_wgpu() {
    let mut runs = vec![
        (DType::F64, Device::Cpu, 1e-12),
        (DType::Bf16, Device::Cpu, 1e-2),
    ];
    runs.extend(common::adapter().map(|device| (DType::F32, device, 1e-5)));
    for (dtype, device, bound) in runs {
        let layer = Layer::random();
        let tensors = layer.tensors_in(dtype, device);
        let rounded = |t: &Tensor| t.to_f64().unwrap();
        let layer = Layer {
            w_in: rounded(&tensors[0]),
            b_in: rounded(&tensors[1]),
            w_out: rounded(&tensors[2]),
            b_out: rounded(&tensors[3]),
        };
        let x = Tensor::from_f64(&random(N * L * E), &[N, L, E], dtype, device).unwrap();
        let xv = values(&x);
        let padding: Vec<bool> = (0..N * L).map(|i| i >= L + 6).collect();
        let mask = Tensor::from_bools(&padding, &[N, L], device).unwrap();
        let options = MhaOptions {
            key_padding_mask: Some(&mask),
            ..MhaOptions::default()
        };
        let reference = layer.reference(&xv, &xv, L, &padding, false);
        let fast = run(&tensors, &x, &x, &options);
        let composed = {
            let _off = mha::FASTPATH.guard_scoped(false);
            run(&tensors, &x, &x, &options)
        };
        for out in [&fast, &composed] {
            assert_eq!(out.output.dtype(), dtype);
            assert_eq!(out.output.device(), device);
            let err = rel_err(&values(&out.output), &reference);
            assert!(err < bound, "{dtype} {device} {:?}: {err:e}", out.path);
        }
    }
}

#[test]
fn the_conditions_pick_the_path_and_the_trace_names_it() {
    let layer = Layer::random().tensors();
    let x = Tensor::from_f64(&random(N * L * E), &[N, L, E], DType::F32, Device::Cpu).unwrap();
    let other = Tensor::from_f64(&random(N * 5 * E), &[N, 5, E], DType::F32, Device::Cpu).unwrap();
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    assert_eq!(
        run(&layer, &x, &x, &MhaOptions::default()).path,
        MhaPath::Fast
    );
    assert!(capture.take().iter().any(|l| l.contains(",mha_fast_path,")));
    // Cross-attention: no single packed projection.
    assert_eq!(
        run(&layer, &x, &other, &MhaOptions::default()).path,
        MhaPath::Composed
    );
    assert!(capture.take().iter().any(|l| l.contains(",mha_composed,")));
    // Weights asked for: composed, and each row of weights sums to one.
    let with_weights = MhaOptions {
        need_weights: true,
        ..MhaOptions::default()
    };
    let out = run(&layer, &x, &x, &with_weights);
    assert_eq!(out.path, MhaPath::Composed);
    let w = values(out.weights.as_ref().unwrap());
    assert_eq!(out.weights.unwrap().shape(), &[N, L, L]);
    for row in w.chunks(L) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
    // A batch entry whose every key is padding: composed; it attends to nothing, so its
    // output is the output projection's bias, as PyTorch gives.
    let all_padded: Vec<bool> = (0..N * L).map(|i| i < L).collect();
    let mask = Tensor::from_bools(&all_padded, &[N, L], Device::Cpu).unwrap();
    let padded = MhaOptions {
        key_padding_mask: Some(&mask),
        ..MhaOptions::default()
    };
    let out = run(&layer, &x, &x, &padded);
    assert_eq!(out.path, MhaPath::Composed);
    let v = values(&out.output);
    let bias = values(&layer[3]);
    for row in v[..L * E].chunks(E) {
        assert!(rel_err(row, &bias) < 1e-6, "{row:?} vs the bias {bias:?}");
    }
    assert!(v[L * E..].iter().all(|x| x.is_finite()));
    // With weights asked for, PyTorch's explicit softmax gives NaN rows, weights and output.
    let padded_weights = MhaOptions {
        need_weights: true,
        ..padded
    };
    let out = run(&layer, &x, &x, &padded_weights);
    let (v, w) = (values(&out.output), values(out.weights.as_ref().unwrap()));
    assert!(v[..L * E].iter().all(|x| x.is_nan()));
    assert!(w[..L * L].iter().all(|x| x.is_nan()));
    assert!(w[L * L..].iter().all(|x| x.is_finite()));
}

#[test]
fn the_cross_attention_path_matches_the_reference() {
    let layer = Layer::random();
    let tensors = layer.tensors();
    let x = Tensor::from_f64(&random(N * L * E), &[N, L, E], DType::F32, Device::Cpu).unwrap();
    let kv = Tensor::from_f64(&random(N * 5 * E), &[N, 5, E], DType::F32, Device::Cpu).unwrap();
    let out = run(&tensors, &x, &kv, &MhaOptions::default());
    let reference = layer.reference(&values(&x), &values(&kv), 5, &[], false);
    assert!(rel_err(&values(&out.output), &reference) < 1e-5);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let layer = Layer::random().tensors();
    let weights = MhaWeights::packed(&layer[0], Some(&layer[1]), &layer[2], None);
    let x = Tensor::full(0.5f32, &[N, L, E], Device::Cpu).unwrap();
    let heads = mha::multi_head_attention_forward(&x, &x, &x, 3, &weights, &MhaOptions::default());
    assert!(matches!(heads, Err(Error::InvalidArgument { .. })));
    let flat = Tensor::full(0.5f32, &[L, E], Device::Cpu).unwrap();
    let rank =
        mha::multi_head_attention_forward(&flat, &flat, &flat, H, &weights, &MhaOptions::default());
    assert!(matches!(rank, Err(Error::ShapeMismatch { .. })));
    let bad_mask = Tensor::full(1f32, &[N, L], Device::Cpu).unwrap();
    let options = MhaOptions {
        key_padding_mask: Some(&bad_mask),
        ..MhaOptions::default()
    };
    let mask = mha::multi_head_attention_forward(&x, &x, &x, H, &weights, &options);
    assert!(matches!(mask, Err(Error::ShapeMismatch { .. })));
}

/// `F.multi_head_attention_forward`'s other arguments, against a float64 reference written
/// out here: sequence-first tensors, separate projections with keys and values of their own
/// widths, `bias_k` / `bias_v`, `add_zero_attn`, boolean and per-head float `attn_mask`s
/// (with key padding), weights per head and averaged; and the equivalences with the
/// packed, batch-first call. (Checked against PyTorch 2.15 on the same inputs to 1e-16 by a
/// script when written.)
#[test]
fn torch_arguments_match_the_reference() {
    let (l, s, n, e, h, kdim, vdim) = (5, 7, 2, 8, 2, 6, 10);
    let d = e / h;
    let t =
        |v: &[f64], shape: &[usize]| Tensor::from_f64(v, shape, DType::F64, Device::Cpu).unwrap();
    let small = |count: usize| {
        random(count)
            .into_iter()
            .map(|x| x * 0.4)
            .collect::<Vec<f64>>()
    };
    // Sequence-first inputs, as values [L, N, E] / [S, N, width].
    let (qv, kv, vv) = (small(l * n * e), small(s * n * kdim), small(s * n * vdim));
    let (wq, wk, wv) = (small(e * e), small(e * kdim), small(e * vdim));
    let (b_in, w_out, b_out) = (small(3 * e), small(e * e), small(e));
    let (bias_k, bias_v) = (small(e), small(e));
    let float_mask = random(n * h * l * s);
    let keep_out: Vec<bool> = (0..l * s).map(|x| x % 3 == 1).collect();
    let padding: Vec<bool> = (0..n * s).map(|x| x % s == 5).collect();
    // The reference: q, k, v projected, bias_k / bias_v and a zero key appended, scores
    // with the masks, softmax, weights per head, output projection.
    let linear = |x: &[f64], w: &[f64], bias: &[f64], width: usize| -> Vec<f64> {
        x.chunks(width)
            .flat_map(|row| {
                (0..e).map(move |o| {
                    bias[o] + (0..width).map(|i| row[i] * w[o * width + i]).sum::<f64>()
                })
            })
            .collect()
    };
    let reference = |bool_mask: bool| -> (Vec<f64>, Vec<f64>) {
        let q = linear(&qv, &wq, &b_in[..e], e); // [L, N, E]
        let k = linear(&kv, &wk, &b_in[e..2 * e], kdim); // [S, N, E]
        let v = linear(&vv, &wv, &b_in[2 * e..], vdim);
        let s_all = s + 2;
        let key = |b: usize, j: usize, x: usize, of: &[f64], bias: &[f64]| match j {
            j if j < s => of[(j * n + b) * e + x],
            j if j == s => bias[x],
            _ => 0.0,
        };
        let mut out = vec![0.0; l * n * e];
        let mut weights = vec![0.0; n * h * l * s_all];
        for b in 0..n {
            for hh in 0..h {
                for i in 0..l {
                    let mut w: Vec<f64> = (0..s_all)
                        .map(|j| {
                            let hidden = j < s && padding[b * s + j];
                            let mask = match (j < s, bool_mask) {
                                (false, _) => 0.0,
                                (true, true) if keep_out[i * s + j] => f64::NEG_INFINITY,
                                (true, true) => 0.0,
                                (true, false) => float_mask[((b * h + hh) * l + i) * s + j],
                            };
                            if hidden {
                                return f64::NEG_INFINITY;
                            }
                            (0..d)
                                .map(|x| {
                                    q[(i * n + b) * e + hh * d + x]
                                        * key(b, j, hh * d + x, &k, &bias_k)
                                })
                                .sum::<f64>()
                                / (d as f64).sqrt()
                                + mask
                        })
                        .collect();
                    let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = w.iter().map(|x| (x - max).exp()).sum();
                    w.iter_mut().for_each(|x| *x = (*x - max).exp() / sum);
                    weights[((b * h + hh) * l + i) * s_all..][..s_all].copy_from_slice(&w);
                    for x in 0..d {
                        out[(i * n + b) * e + hh * d + x] = (0..s_all)
                            .map(|j| w[j] * key(b, j, hh * d + x, &v, &bias_v))
                            .sum();
                    }
                }
            }
        }
        (linear(&out, &w_out, &b_out, e), weights)
    };
    let (q, k, v) = (
        t(&qv, &[l, n, e]),
        t(&kv, &[s, n, kdim]),
        t(&vv, &[s, n, vdim]),
    );
    let (wq_t, wk_t, wv_t) = (t(&wq, &[e, e]), t(&wk, &[e, kdim]), t(&wv, &[e, vdim]));
    let (b_in_t, w_out_t, b_out_t) = (t(&b_in, &[3 * e]), t(&w_out, &[e, e]), t(&b_out, &[e]));
    let (bk, bv) = (t(&bias_k, &[1, 1, e]), t(&bias_v, &[1, 1, e]));
    let weights = MhaWeights {
        in_proj: mha::InProj::Separate {
            q: &wq_t,
            k: &wk_t,
            v: &wv_t,
        },
        in_proj_bias: Some(&b_in_t),
        out_proj_weight: &w_out_t,
        out_proj_bias: Some(&b_out_t),
        bias_kv: Some((&bk, &bv)),
    };
    let bool_mask = Tensor::from_bools(&keep_out, &[l, s], Device::Cpu).unwrap();
    let float_mask_t = t(&float_mask, &[n * h, l, s]);
    let padding_t = Tensor::from_bools(&padding, &[n, s], Device::Cpu).unwrap();
    for (boolean, mask) in [(true, &bool_mask), (false, &float_mask_t)] {
        let options = MhaOptions {
            attn_mask: Some(mask),
            key_padding_mask: Some(&padding_t),
            need_weights: true,
            average_attn_weights: false,
            add_zero_attn: true,
            batch_first: false,
            ..MhaOptions::default()
        };
        let out = mha::multi_head_attention_forward(&q, &k, &v, h, &weights, &options).unwrap();
        let (want, want_weights) = reference(boolean);
        assert_eq!(out.output.shape(), &[l, n, e]);
        assert!(
            rel_err(&values(&out.output), &want) < 1e-12,
            "boolean mask {boolean}"
        );
        let got_weights = out.weights.unwrap();
        assert_eq!(got_weights.shape(), &[n, h, l, s + 2]);
        assert!(rel_err(&values(&got_weights), &want_weights) < 1e-12);
        // Averaged over heads: the mean of the per-head weights.
        let averaged = mha::multi_head_attention_forward(
            &q,
            &k,
            &v,
            h,
            &weights,
            &MhaOptions {
                average_attn_weights: true,
                ..options
            },
        )
        .unwrap()
        .weights
        .unwrap();
        let mean: Vec<f64> = (0..n * l * (s + 2))
            .map(|x| {
                let (b, rest) = (x / (l * (s + 2)), x % (l * (s + 2)));
                (0..h)
                    .map(|hh| want_weights[(b * h + hh) * l * (s + 2) + rest])
                    .sum::<f64>()
                    / h as f64
            })
            .collect();
        assert!(rel_err(&values(&averaged), &mean) < 1e-12);
    }
    // Separate projections equal to the packed one's rows, and a sequence-first call equal
    // to the batch-first call on the transposed tensors.
    let layer = Layer::random().tensors();
    let part = |i: usize| layer[0].narrow(0, i * E, E).unwrap();
    let (pq, pk, pv) = (part(0), part(1), part(2));
    let separate = MhaWeights {
        in_proj: mha::InProj::Separate {
            q: &pq,
            k: &pk,
            v: &pv,
        },
        ..MhaWeights::packed(&layer[0], Some(&layer[1]), &layer[2], Some(&layer[3]))
    };
    let x = Tensor::from_f64(&random(N * L * E), &[N, L, E], DType::F32, Device::Cpu).unwrap();
    let packed = run(&layer, &x, &x, &MhaOptions::default());
    let split = mha::multi_head_attention_forward(&x, &x, &x, H, &separate, &MhaOptions::default())
        .unwrap();
    assert_eq!(split.path, MhaPath::Composed);
    assert!(rel_err(&values(&split.output), &values(&packed.output)) < 1e-5);
    let seq_first = x.permute(&[1, 0, 2]).unwrap().contiguous().unwrap();
    let transposed = run(
        &layer,
        &seq_first,
        &seq_first,
        &MhaOptions {
            batch_first: false,
            ..MhaOptions::default()
        },
    );
    let back = transposed
        .output
        .permute(&[1, 0, 2])
        .unwrap()
        .contiguous()
        .unwrap();
    assert!(rel_err(&values(&back), &values(&packed.output)) < 1e-6);
}
