//! bf16 tensors on wgpu (lavapipe here): WGSL has no bf16, so the ops widen the buffers to
//! f32 on the device, compute in f32 and round back. Each op against float64 on the same
//! bf16-rounded inputs (bound 1e-2), the rounding against PyTorch's (nearest, ties to even),
//! views with odd offsets, and the trace naming the conversions.

mod common;

use backends::attention::{SdpBackend, sdpa_kernel_scoped};
use backends::conv::Conv2dOptions;
use backends::{DType, Device, SdpaOptions, Tensor, conv2d, einsum, matmul, sdpa};
use common::serving::{Masking, NONE, paged_error, varlen_error};
use common::{adapter, attention_reference, random, reference, rel_err};
use half::bf16;

/// `values` rounded to bf16 on `device`, and the rounded values.
fn bf16_tensor(values: &[f64], shape: &[usize], device: Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_f64(values, shape, DType::Bf16, device).unwrap();
    let held = t.to_f64().unwrap();
    (t, held)
}

#[test]
fn bf16_tensors_live_on_wgpu_and_round_as_pytorch() {
    let Some(gpu) = adapter() else { return };
    let values = random(37);
    let (t, held) = bf16_tensor(&values, &[37], gpu);
    assert_eq!((t.dtype(), t.device()), (DType::Bf16, gpu));
    let on_cpu = Tensor::from_f64(&values, &[37], DType::Bf16, Device::Cpu).unwrap();
    assert_eq!(held, on_cpu.to_f64().unwrap());
    // Products whose f32 sums lie between bf16 values: 1 + 2^-9 rounds down, 1 + 3·2^-9 up,
    // the ties 1 + 2^-8 and 1 + 3·2^-8 to the even neighbours 1 and 1 + 2^-6.
    let x = 2f64.powi(-9);
    let a = [1.0, x, 1.0, 3.0 * x, 1.0, 2.0 * x, 1.0, 6.0 * x];
    let (a, _) = bf16_tensor(&a, &[4, 2], gpu);
    let (ones, _) = bf16_tensor(&[1.0, 1.0], &[2, 1], gpu);
    let product = matmul(&a, &ones).unwrap();
    assert_eq!((product.dtype(), product.device()), (DType::Bf16, gpu));
    let expected = [1.0, 1.0 + 2f64.powi(-7), 1.0, 1.0 + 2f64.powi(-6)];
    assert_eq!(product.to_f64().unwrap(), expected);
    let nan = bf16::from_f32(f32::NAN);
    let (nan_row, _) = bf16_tensor(&[f64::from(nan), 1.0], &[1, 2], gpu);
    assert!(matmul(&nan_row, &ones).unwrap().to_f64().unwrap()[0].is_nan());
}

#[test]
fn matmul_and_einsum_compute_bf16_on_wgpu() {
    let Some(gpu) = adapter() else { return };
    let (m, k, n) = (9, 70, 33);
    // x @ Wᵀ with W a [n, k] weight seen through its transpose, x a narrow at an odd offset.
    let (x, xv) = bf16_tensor(&random(m * (k + 1)), &[m, k + 1], gpu);
    let x = x.narrow(1, 1, k).unwrap();
    let xv: Vec<f64> = (0..m * k)
        .map(|i| xv[(i / k) * (k + 1) + 1 + i % k])
        .collect();
    let (w, wv) = bf16_tensor(&random(n * k), &[n, k], gpu);
    let wt: Vec<f64> = (0..k * n).map(|i| wv[(i % n) * k + i / n]).collect();
    let y = matmul(&x, &w.t().unwrap()).unwrap();
    assert_eq!((y.dtype(), y.shape()), (DType::Bf16, &[m, n][..]));
    let err = rel_err(&y.to_f64().unwrap(), &reference(&xv, &wt, m, n, k));
    assert!(err < 1e-2, "matmul {err}");

    let (a, av) = bf16_tensor(&random(2 * 3 * 4 * 8), &[2, 3, 4, 8], gpu);
    let (b, bv) = bf16_tensor(&random(2 * 3 * 5 * 8), &[2, 3, 5, 8], gpu);
    let e = einsum("bhld,bhmd->bhlm", &[&a, &b]).unwrap();
    assert_eq!((e.dtype(), e.device()), (DType::Bf16, gpu));
    let mut want = Vec::new();
    for batch in 0..6 {
        let bt: Vec<f64> = (0..8 * 5)
            .map(|i| bv[batch * 40 + (i % 5) * 8 + i / 5])
            .collect();
        want.extend(reference(&av[batch * 32..][..32], &bt, 4, 5, 8));
    }
    let err = rel_err(&e.to_f64().unwrap(), &want);
    assert!(err < 1e-2, "einsum {err}");
}

#[test]
fn attention_computes_bf16_on_wgpu_with_each_backend() {
    let Some(gpu) = adapter() else { return };
    let (b, h, hk, lq, lk, d) = (2, 4, 2, 19, 23, 32);
    let (q, qv) = bf16_tensor(&random(b * h * lq * d), &[b, h, lq, d], gpu);
    let (k, kv) = bf16_tensor(&random(b * hk * lk * d), &[b, hk, lk, d], gpu);
    let (v, vv) = bf16_tensor(&random(b * hk * lk * d), &[b, hk, lk, d], gpu);
    let scale = 1.0 / (d as f64).sqrt();
    // Flash: grouped-query heads, causal bottom-right.
    let options = SdpaOptions {
        enable_gqa: true,
        ..SdpaOptions::default().causal_lower_right()
    };
    let _flash = sdpa_kernel_scoped(&[SdpBackend::Flash], false);
    let out = sdpa(&q, &k, &v, &options).unwrap();
    assert_eq!(out.backend, SdpBackend::Flash);
    assert_eq!(
        (out.output.dtype(), out.output.device()),
        (DType::Bf16, gpu)
    );
    let want = attention_reference(
        &qv,
        &kv,
        &vv,
        [b, h, hk, lq, lk, d, d],
        scale,
        Some(backends::CausalVariant::LowerRight),
        &|_, _, _, _| 0.0,
    );
    let err = rel_err(&out.output.to_f64().unwrap(), &want);
    assert!(err < 1e-2, "flash {err}");
    drop(_flash);

    // Memory-efficient: an additive bf16 mask, broadcast over heads, with -inf entries.
    let kfull = k.repeat_heads(h / hk);
    let vfull = v.repeat_heads(h / hk);
    let mask_values: Vec<f64> = random(b * lq * lk)
        .into_iter()
        .enumerate()
        .map(|(i, x)| if i % 7 == 3 { f64::NEG_INFINITY } else { x })
        .collect();
    let (mask, maskv) = bf16_tensor(&mask_values, &[b, 1, lq, lk], gpu);
    let _mem = sdpa_kernel_scoped(&[SdpBackend::MemEfficient], false);
    let options = SdpaOptions {
        attn_mask: Some(&mask),
        ..SdpaOptions::default()
    };
    let out = sdpa(&q, &kfull.0, &vfull.0, &options).unwrap();
    assert_eq!(out.backend, SdpBackend::MemEfficient);
    let want = attention_reference(
        &qv,
        &kfull.1,
        &vfull.1,
        [b, h, h, lq, lk, d, d],
        scale,
        None,
        &|bi, _, i, j| maskv[(bi * lq + i) * lk + j],
    );
    let err = rel_err(&out.output.to_f64().unwrap(), &want);
    assert!(err < 1e-2, "memory-efficient {err}");
}

/// `[B, Hk, L, D]` key/value heads repeated for each query head of their group.
trait RepeatHeads {
    fn repeat_heads(&self, group: usize) -> (Tensor, Vec<f64>);
}

impl RepeatHeads for Tensor {
    fn repeat_heads(&self, group: usize) -> (Tensor, Vec<f64>) {
        let [b, hk, l, d] = *self.shape() else {
            panic!("4-D")
        };
        let expanded = self
            .unsqueeze(2)
            .unwrap()
            .expand(&[b, hk, group, l, d])
            .unwrap()
            .reshape(&[b, hk * group, l, d])
            .unwrap();
        let values = expanded.to_f64().unwrap();
        (expanded, values)
    }
}

#[test]
fn serving_attention_and_conv2d_compute_bf16_on_wgpu() {
    let Some(gpu) = adapter() else { return };
    let causal = Masking {
        causal: Some(backends::CausalVariant::LowerRight),
        ..NONE
    };
    let err = varlen_error::<bf16>(&[5, 17, 1], &[5, 17, 9], (4, 2, 32), causal, gpu);
    assert!(err < 1e-2, "varlen {err}");
    let (err, lines) = paged_error::<bf16>(&[9, 30], (4, 2, 1, 32, 8), causal, gpu);
    assert!(err < 1e-2, "paged {err}");
    assert!(
        lines.iter().any(|l| l.contains("convert_bf16_to_f32")),
        "the trace names the widening: {lines:?}"
    );

    let case = common::conv::Case {
        bias: true,
        ..common::conv::BASE
    };
    let err = common::conv::check_on(&case, DType::Bf16, gpu);
    assert!(err < 1e-2, "conv2d {case:?}: {err}");
    let (x, _) = bf16_tensor(&random(2 * 3 * 6 * 6), &[2, 3, 6, 6], gpu);
    let (w, _) = bf16_tensor(&random(4 * 3 * 9), &[4, 3, 3, 3], gpu);
    let y = conv2d(&x, &w, &Conv2dOptions::default()).unwrap();
    assert_eq!(
        (y.dtype(), y.device(), y.shape()),
        (DType::Bf16, gpu, &[2, 4, 4, 4][..])
    );
}

#[test]
fn multi_head_attention_runs_bf16_on_wgpu_as_on_the_cpu() {
    use backends::mha::{self, MhaOptions, MhaWeights};
    let Some(gpu) = adapter() else { return };
    let (n, l, e, h) = (2, 11, 32, 4);
    let values = [
        random(n * l * e),
        random(3 * e * e),
        random(3 * e),
        random(e * e),
    ];
    let run = |device: Device| {
        let t = |v: &[f64], shape: &[usize]| bf16_tensor(v, shape, device).0;
        let x = t(&values[0], &[n, l, e]);
        let (w_in, b_in, w_out) = (
            t(&values[1], &[3 * e, e]),
            t(&values[2], &[3 * e]),
            t(&values[3], &[e, e]),
        );
        let weights = MhaWeights::packed(&w_in, Some(&b_in), &w_out, None);
        let options = MhaOptions {
            batch_first: true,
            is_causal: false,
            ..Default::default()
        };
        let out = mha::multi_head_attention_forward(&x, &x, &x, h, &weights, &options)
            .unwrap()
            .output;
        assert_eq!((out.dtype(), out.device()), (DType::Bf16, device));
        out.to_f64().unwrap()
    };
    // Both compute in f32 from the same bf16 values and round each step to bf16.
    let err = rel_err(&run(gpu), &run(Device::Cpu));
    assert!(err < 1e-2, "{err}");
}
