//! `scaled_dot_product_attention` on the CPU (fused and math) and on wgpu (flash and
//! memory-efficient) against a float64 reference on fresh inputs.

mod common;

use backends::attention::{SdpBackend, sdpa_kernel_scoped};
use backends::{CausalVariant, DType, Device, Element, Error, SdpaOptions, Tensor, Window, sdpa};
use common::{adapter, attention_reference, in_child, random, rel_err};
use half::{bf16, f16};

fn tensor<T: Element>(values: &[f64], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_vec(
        values.iter().map(|&v| T::from_f64(v)).collect(),
        shape,
        device,
    )
    .unwrap()
}

fn host(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::Bf16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::Bool | DType::I32 => panic!("not a float tensor"),
    }
}

/// What one case asks for.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    hk: usize,
    lq: usize,
    lk: usize,
    d: usize,
    causal: bool,
    /// The causal mask and the window bottom-right aligned (`causal_lower_right`).
    lower_right: bool,
    window: Window,
    mask: Option<bool>, // Some(true): boolean, Some(false): additive
}

fn case(lq: usize, lk: usize, d: usize) -> Case {
    Case {
        b: 2,
        h: 3,
        hk: 3,
        lq,
        lk,
        d,
        causal: false,
        lower_right: false,
        window: Window::UNBOUNDED,
        mask: None,
    }
}

/// `c` with a sliding window of `left` keys before and `right` after the diagonal.
fn windowed(c: Case, left: Option<usize>, right: Option<usize>) -> Case {
    Case {
        window: Window::new(left, right),
        ..c
    }
}

/// `c` with a bottom-right aligned causal mask.
fn lower_right(c: Case) -> Case {
    Case {
        causal: true,
        lower_right: true,
        ..c
    }
}

/// Runs one case in `T` on `device`; returns (relative error, backend that ran).
fn run<T: Element>(c: Case, device: Device) -> (f64, SdpBackend) {
    let (q, k, v) = (
        random(c.b * c.h * c.lq * c.d),
        random(c.b * c.hk * c.lk * c.d),
        random(c.b * c.hk * c.lk * c.d),
    );
    let round = |x: &[f64]| {
        x.iter()
            .map(|&y| T::from_f64(y).to_f64())
            .collect::<Vec<_>>()
    };
    let (q, k, v) = (round(&q), round(&k), round(&v));
    // A [lq, lk] mask broadcast over batch and heads, keeping at least the diagonal.
    let keep: Vec<bool> = (0..c.lq * c.lk)
        .map(|e| !(e * 7 + e / c.lk).is_multiple_of(3) || e % c.lk == e / c.lk % c.lk)
        .collect();
    let additive: Vec<f64> = round(&random(c.lq * c.lk));
    let mask = match c.mask {
        Some(true) => Some(Tensor::from_bools(&keep, &[c.lq, c.lk], device).unwrap()),
        Some(false) => Some(tensor::<T>(&additive, &[c.lq, c.lk], device)),
        None => None,
    };
    let options = SdpaOptions {
        attn_mask: mask.as_ref(),
        is_causal: c.causal,
        causal_variant: if c.lower_right {
            CausalVariant::LowerRight
        } else {
            CausalVariant::UpperLeft
        },
        window: c.window,
        enable_gqa: c.h != c.hk,
        ..Default::default()
    };
    let out = sdpa(
        &tensor::<T>(&q, &[c.b, c.h, c.lq, c.d], device),
        &tensor::<T>(&k, &[c.b, c.hk, c.lk, c.d], device),
        &tensor::<T>(&v, &[c.b, c.hk, c.lk, c.d], device),
        &options,
    )
    .unwrap();
    assert_eq!(out.output.shape(), [c.b, c.h, c.lq, c.d]);
    let variant = if c.lower_right {
        CausalVariant::LowerRight
    } else {
        CausalVariant::UpperLeft
    };
    let bias = |_: usize, _: usize, i: usize, j: usize| match c.mask {
        _ if common::window_hides(c.window, variant, (c.lq, c.lk), i, j) => f64::NEG_INFINITY,
        Some(true) if !keep[i * c.lk + j] => f64::NEG_INFINITY,
        Some(false) => additive[i * c.lk + j],
        _ => 0.0,
    };
    let want = attention_reference(
        &q,
        &k,
        &v,
        [c.b, c.h, c.hk, c.lq, c.lk, c.d, c.d],
        1.0 / (c.d as f64).sqrt(),
        c.causal.then_some(variant),
        &bias,
    );
    let got = host(&out.output);
    assert!(
        got.iter().all(|x| x.is_finite()),
        "unwritten or NaN outputs"
    );
    (rel_err(&got, &want), out.backend)
}

fn shapes() -> Vec<Case> {
    let mut cases = vec![
        case(1, 1, 16),
        case(17, 17, 32),
        case(128, 128, 64),
        case(333, 333, 64),
        case(17, 333, 128),
    ];
    cases.push(Case {
        causal: true,
        ..case(128, 128, 64)
    });
    cases.push(Case {
        causal: true,
        ..case(333, 200, 32)
    });
    cases.push(Case {
        mask: Some(true),
        ..case(65, 130, 64)
    });
    cases.push(Case {
        mask: Some(false),
        ..case(65, 97, 64)
    });
    cases.push(Case {
        h: 4,
        hk: 2,
        ..case(40, 70, 32)
    });
    // Bottom-right causal masks: square (the top-left mask), more keys than queries (a
    // prefill chunk against its cache), more queries than keys (the first rows see none),
    // lengths off the tiles, GQA.
    cases.push(lower_right(case(128, 128, 64)));
    cases.push(lower_right(case(37, 300, 64)));
    cases.push(lower_right(case(333, 200, 32)));
    cases.push(lower_right(case(17, 333, 128)));
    cases.push(lower_right(Case {
        h: 4,
        hk: 2,
        ..case(40, 70, 32)
    }));
    cases.extend(window_cases());
    cases
}

/// Sliding windows: causal local attention (Mistral's), both sides bounded, one side only,
/// bottom-right aligned without causal, rows whose window holds no key, with a mask, GQA;
/// windows narrower and wider than a key block.
fn window_cases() -> Vec<Case> {
    vec![
        windowed(
            Case {
                causal: true,
                ..case(300, 300, 64)
            },
            Some(64),
            Some(0),
        ),
        windowed(case(200, 333, 32), Some(10), Some(5)),
        windowed(case(130, 130, 64), Some(100), None),
        windowed(case(130, 130, 16), None, Some(0)),
        windowed(
            Case {
                lower_right: true,
                ..case(37, 300, 64)
            },
            Some(40),
            Some(3),
        ),
        windowed(lower_right(case(50, 20, 32)), Some(2), Some(0)),
        windowed(
            Case {
                mask: Some(false),
                ..case(65, 97, 64)
            },
            Some(7),
            Some(70),
        ),
        windowed(
            Case {
                h: 4,
                hk: 2,
                causal: true,
                ..case(90, 90, 128)
            },
            Some(17),
            None,
        ),
    ]
}

#[test]
fn cpu_fused_path_matches_the_reference() {
    for c in shapes() {
        let (err, backend) = run::<f32>(c, Device::Cpu);
        assert_eq!(backend, SdpBackend::Flash);
        assert!(err < 1e-5, "f32 {c:?}: {err}");
        // f64 computes in f64, as PyTorch's CPU flash kernel does for it.
        let (err, backend) = run::<f64>(c, Device::Cpu);
        assert_eq!(backend, SdpBackend::Flash);
        assert!(err < 1e-12, "f64: {err}");
    }
}

/// An additive bias `(b, h, i, j)` for [`attention_reference`].
type Bias<'a> = dyn Fn(usize, usize, usize, usize) -> f64 + 'a;

/// Float masks whose values along the keys are one broadcast value (`[lq, 1]`; every
/// fifth row -inf, which the fused path answers with zeros), strided (a transposed view) or
/// broadcast along the queries (`[1, lk]`, key padding), through the fused path at head dims
/// that fill its SIMD tiles or not.
#[test]
fn cpu_fused_path_takes_masks_broadcast_or_strided_along_the_keys() {
    let (b, h, lq, lk) = (1, 2, 70, 150);
    let hidden = |i: usize| i % 5 == 2;
    for d in [40, 64, 128] {
        let (q, k, v) = (
            random(b * h * lq * d),
            random(b * h * lk * d),
            random(b * h * lk * d),
        );
        let per_row: Vec<f64> = random(lq)
            .into_iter()
            .enumerate()
            .map(|(i, x)| if hidden(i) { f64::NEG_INFINITY } else { x })
            .collect();
        let full = random(lq * lk);
        let transposed: Vec<f64> = (0..lk * lq).map(|e| full[(e % lq) * lk + e / lq]).collect();
        let padding: Vec<f64> = (0..lk)
            .map(|j| if j % 7 == 3 { f64::NEG_INFINITY } else { 0.5 })
            .collect();
        let masks: [(Tensor, Box<Bias>); 3] = [
            (
                tensor::<f32>(&per_row, &[lq, 1], Device::Cpu),
                // A row's constant shifts nothing; the hidden rows are 0.
                Box::new(|_, _, i, _| per_row[i]),
            ),
            (
                tensor::<f32>(&transposed, &[lk, lq], Device::Cpu)
                    .t()
                    .unwrap(),
                Box::new(|_, _, i, j| full[i * lk + j]),
            ),
            (
                tensor::<f32>(&padding, &[1, lk], Device::Cpu),
                Box::new(|_, _, _, j| padding[j]),
            ),
        ];
        for (mask, bias) in &masks {
            let options = SdpaOptions {
                attn_mask: Some(mask),
                ..Default::default()
            };
            let out = sdpa(
                &tensor::<f32>(&q, &[b, h, lq, d], Device::Cpu),
                &tensor::<f32>(&k, &[b, h, lk, d], Device::Cpu),
                &tensor::<f32>(&v, &[b, h, lk, d], Device::Cpu),
                &options,
            )
            .unwrap();
            assert_eq!(out.backend, SdpBackend::Flash);
            let want = attention_reference(
                &q,
                &k,
                &v,
                [b, h, h, lq, lk, d, d],
                1.0 / (d as f64).sqrt(),
                None,
                bias,
            );
            let err = rel_err(&host(&out.output), &want);
            assert!(
                err < 1e-5,
                "d {d}, mask strides {:?}: {err}",
                mask.strides()
            );
        }
    }
}

#[test]
fn an_explicit_mask_with_is_causal_is_refused_as_in_pytorch() {
    let t = tensor::<f32>(&random(2 * 5 * 8), &[1, 2, 5, 8], Device::Cpu);
    let mask = Tensor::from_bools(&[true; 25], &[5, 5], Device::Cpu).unwrap();
    let options = SdpaOptions {
        attn_mask: Some(&mask),
        is_causal: true,
        ..Default::default()
    };
    let err = sdpa(&t, &t, &t, &options).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                what: "attn_mask",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("fold the causal mask into attn_mask")
    );
    // Either alone is fine.
    for (attn_mask, is_causal) in [(Some(&mask), false), (None, true)] {
        let options = SdpaOptions {
            attn_mask,
            is_causal,
            ..Default::default()
        };
        sdpa(&t, &t, &t, &options).unwrap();
    }
}

/// Runs the fused-path tests (and at AVX2 the decoding ones) in a child process whose CPU
/// level is capped at `cap` (the AVX-512 and AVX2 kernels share their code but not their
/// tiles; the portable kernel reads the keys transposed).
fn fused_path_at_level(test: &str, cap: &str, shown: &str) {
    if !in_child(test, &[("ATEN_CPU_CAPABILITY", cap)]) {
        return;
    }
    assert_eq!(backends::cpu::get_cpu_capability().to_string(), shown);
    cpu_fused_path_matches_the_reference();
    cpu_fused_path_takes_masks_broadcast_or_strided_along_the_keys();
    if cap == "avx2" {
        // The decoding kernel's tiles are narrower at this level.
        decoding_shapes_run_the_decoding_kernel_and_match_the_reference();
    }
}

#[test]
fn cpu_fused_path_matches_the_reference_at_the_avx2_level() {
    use backends::cpu::CpuCapability::{Avx2, Avx512};
    if !matches!(backends::cpu::detected_cpu_capability(), Avx2 | Avx512) {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    fused_path_at_level(
        "cpu_fused_path_matches_the_reference_at_the_avx2_level",
        "avx2",
        "AVX2",
    );
}

#[test]
fn cpu_fused_path_matches_the_reference_at_the_default_level() {
    fused_path_at_level(
        "cpu_fused_path_matches_the_reference_at_the_default_level",
        "default",
        "DEFAULT",
    );
}

/// Decoding shapes (Lq ≤ 4): the decoding kernel (each key/value head group's rows
/// against all keys, K and V read once per group) on f32 and bf16, with GQA, causal rows
/// that see 1..Lq keys, boolean and additive masks, head dims that fill no vector, fully
/// masked rows; named in the trace where the CPU has the vector level it runs on.
#[test]
fn decoding_shapes_run_the_decoding_kernel_and_match_the_reference() {
    let _t = backends::NUM_THREADS.guard_scoped(1);
    let mut cases = vec![case(1, 300, 64), case(2, 33, 16)];
    cases.push(Case {
        h: 8,
        hk: 2,
        ..case(1, 257, 40)
    });
    cases.push(Case {
        h: 4,
        hk: 2,
        causal: true,
        ..case(3, 50, 64)
    });
    // Decoding steps: the last query sees every key.
    cases.push(lower_right(Case {
        h: 4,
        hk: 2,
        ..case(3, 50, 64)
    }));
    cases.push(lower_right(case(1, 300, 64)));
    // 15 rows in one group (tiles of 8, 4, 2 and 1 rows), a head dim of whole and partial
    // vector tiles, keys over more than one block of the weighted sum.
    cases.push(Case {
        b: 1,
        h: 5,
        hk: 1,
        ..case(3, 1100, 72)
    });
    cases.push(Case {
        mask: Some(true),
        ..case(2, 100, 32)
    });
    cases.push(Case {
        mask: Some(false),
        ..case(4, 77, 128)
    });
    // A decoding step of a sliding-window model; a window past the keys (no key seen).
    cases.push(windowed(lower_right(case(2, 300, 64)), Some(100), None));
    cases.push(windowed(
        Case {
            lower_right: true,
            ..case(3, 90, 32)
        },
        Some(5),
        Some(1),
    ));
    cases.push(windowed(case(2, 50, 16), None, Some(0)));
    for c in cases {
        decodes_within_bounds(c, "decoding kernel");
    }
    // Rows that see no key give zeros and -inf, as on the other kernels.
    for d in [8, 64] {
        fully_masked_row::<f32>(d, Device::Cpu);
    }
}

/// Runs decoding case `c` on the CPU in f32 and bf16 against the reference (bounds 1e-5 and
/// 1e-2), on the fused path, with `trace` in its trace where the CPU has a vector level the
/// decoding kernel runs on.
fn decodes_within_bounds(c: Case, trace: &str) {
    let vector_level = matches!(
        backends::cpu::get_cpu_capability(),
        backends::cpu::CpuCapability::Avx2 | backends::cpu::CpuCapability::Avx512
    );
    for dtype in [DType::F32, DType::Bf16] {
        let capture = backends::TraceCapture::start();
        let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let (err, backend) = match dtype {
            DType::F32 => run::<f32>(c, Device::Cpu),
            _ => run::<bf16>(c, Device::Cpu),
        };
        let lines = capture.take();
        assert_eq!(backend, SdpBackend::Flash);
        let bound = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        assert!(err < bound, "{dtype} {c:?}: {err}");
        if vector_level {
            assert!(lines.iter().any(|l| l.contains(trace)), "{c:?}: {lines:?}");
        }
    }
}

/// Decoding with fewer key/value head groups than threads: each group's keys are split into
/// runs computed in parallel and combined by their log-sum-exps (named in the trace), with
/// GQA, bottom-right causal rows, masks read from each run's first key, f32 and bf16.
#[test]
fn split_key_decoding_matches_the_reference() {
    let _t = backends::NUM_THREADS.guard_scoped(4);
    let one_group = |c: Case| Case { b: 1, hk: 1, ..c };
    let cases = [
        one_group(Case {
            h: 1,
            ..case(1, 4100, 64)
        }),
        one_group(Case {
            h: 4,
            ..case(1, 4500, 128)
        }),
        lower_right(one_group(Case {
            h: 2,
            ..case(3, 4097, 32)
        })),
        one_group(Case {
            h: 2,
            mask: Some(true),
            ..case(2, 4200, 64)
        }),
        one_group(Case {
            h: 1,
            mask: Some(false),
            ..case(1, 4096, 16)
        }),
        // Windows: the runs split the window's span, not the whole cache (from key 0, and
        // from key 2998 of 9000).
        windowed(one_group(case(1, 9000, 32)), None, Some(5000)),
        windowed(lower_right(one_group(case(2, 9000, 32))), Some(6000), None),
    ];
    for c in cases {
        decodes_within_bounds(c, "keys split into");
    }
    // A window of 1001 keys at the end of a 4200-key cache is one run: its span, not the
    // cache, is what the threads would share.
    let capture = backends::TraceCapture::start();
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let (err, _) = run::<f32>(
        windowed(lower_right(one_group(case(1, 4200, 32))), Some(1000), None),
        Device::Cpu,
    );
    let lines = capture.take();
    assert!(err < 1e-5, "{err}");
    if lines.iter().any(|l| l.contains("decoding kernel")) {
        assert!(!lines.iter().any(|l| l.contains("split")), "{lines:?}");
    }
    // Across runs: a row that sees no key is 0 with lse -inf; a NaN key in one run makes its
    // rows NaN.
    let (lq, lk, d) = (2, 4200, 8);
    let q = tensor::<f32>(&random(lq * d), &[1, 1, lq, d], Device::Cpu);
    let mut keys = random(lk * d);
    let v = tensor::<f32>(&random(lk * d), &[1, 1, lk, d], Device::Cpu);
    let keep: Vec<bool> = (0..lq * lk).map(|e| e >= lk).collect();
    let mask = Tensor::from_bools(&keep, &[lq, lk], Device::Cpu).unwrap();
    let k = tensor::<f32>(&keys, &[1, 1, lk, d], Device::Cpu);
    let options = SdpaOptions {
        attn_mask: Some(&mask),
        ..Default::default()
    };
    let out = sdpa(&q, &k, &v, &options).unwrap();
    let (o, lse) = (host(&out.output), host(&out.lse.unwrap()));
    assert!(o[..d].iter().all(|&x| x == 0.0) && lse[0] == f64::NEG_INFINITY);
    assert!(o[d..].iter().all(|x| x.is_finite()) && lse[1].is_finite());
    keys[(lk - 3) * d] = f64::NAN;
    let k = tensor::<f32>(&keys, &[1, 1, lk, d], Device::Cpu);
    let out = sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap();
    let (o, lse) = (host(&out.output), host(&out.lse.unwrap()));
    assert!(o.iter().chain(&lse).all(|x| x.is_nan()), "{o:?} {lse:?}");
}

#[test]
fn cpu_fused_path_matches_the_reference_on_16_bit_inputs() {
    for c in shapes() {
        let (err, backend) = run::<bf16>(c, Device::Cpu);
        assert_eq!(backend, SdpBackend::Flash);
        assert!(err < 1e-2, "bf16 {c:?}: {err}");
        let (err, backend) = run::<f16>(c, Device::Cpu);
        assert_eq!(backend, SdpBackend::Flash);
        assert!(err < 2e-3, "f16 {c:?}: {err}");
    }
}

#[test]
fn cpu_fused_path_reads_16_bit_views_as_it_reads_contiguous_tensors() {
    // [B, L, H, D] storage seen as [B, H, L, D]: a view, which the fused path widens whole
    // instead of piece by piece.
    let (b, h, l, d) = (2, 3, 50, 32);
    let blhd = tensor::<bf16>(&random(b * l * h * d), &[b, l, h, d], Device::Cpu);
    let view = blhd.transpose(1, 2).unwrap();
    assert!(!view.is_contiguous());
    let copy = tensor::<bf16>(&view.to_f64().unwrap(), &[b, h, l, d], Device::Cpu);
    let options = SdpaOptions {
        is_causal: true,
        ..Default::default()
    };
    let from_view = sdpa(&view, &copy, &view, &options).unwrap();
    let from_copy = sdpa(&copy, &copy, &copy, &options).unwrap();
    assert_eq!(from_view.backend, SdpBackend::Flash);
    assert_eq!(host(&from_view.output), host(&from_copy.output));
}

#[test]
fn cpu_math_matches_the_reference() {
    let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
    for c in shapes() {
        let (err, backend) = run::<f32>(c, Device::Cpu);
        assert_eq!(backend, SdpBackend::Math);
        assert!(
            err < 1e-5,
            "{:?}: {err}",
            (c.lq, c.lk, c.d, c.causal, c.mask)
        );
        assert!(run::<f64>(c, Device::Cpu).0 < 1e-12);
    }
}

#[test]
fn fully_masked_rows_are_zero_on_every_backend() {
    // Head dims of part of a vector and of whole vectors, and the f64 kernel.
    for d in [8, 64] {
        fully_masked_row::<f32>(d, Device::Cpu);
    }
    fully_masked_row::<f64>(8, Device::Cpu);
    if let Some(gpu) = adapter() {
        fully_masked_row::<f32>(16, gpu);
    }
}

/// Row 2 of q sees no key: 0 (and lse -inf) on the fused backend and on math, as PyTorch
/// 2.15 gives on every backend.
fn fully_masked_row<T: Element>(d: usize, device: Device) {
    let (lq, lk) = (4, 5);
    let q = tensor::<T>(&random(lq * d), &[1, 1, lq, d], device);
    let k = tensor::<T>(&random(lk * d), &[1, 1, lk, d], device);
    let v = tensor::<T>(&random(lk * d), &[1, 1, lk, d], device);
    let keep: Vec<bool> = (0..lq * lk).map(|e| e / lk != 2).collect();
    let bool_mask = Tensor::from_bools(&keep, &[lq, lk], device).unwrap();
    let additive: Vec<f64> = keep
        .iter()
        .map(|&k| if k { 0.0 } else { f64::NEG_INFINITY })
        .collect();
    let float_mask = tensor::<T>(&additive, &[lq, lk], device);
    for mask in [&bool_mask, &float_mask] {
        let options = SdpaOptions {
            attn_mask: Some(mask),
            ..Default::default()
        };
        let fused = sdpa(&q, &k, &v, &options).unwrap();
        assert_ne!(fused.backend, SdpBackend::Math);
        let out = host(&fused.output);
        assert!(out[2 * d..3 * d].iter().all(|&x| x == 0.0), "{device}");
        assert!(out[..2 * d].iter().all(|x| x.is_finite() && *x != 0.0));
        let lse = host(&fused.lse.unwrap());
        assert_eq!(lse[2], f64::NEG_INFINITY);
        assert!(lse[0].is_finite());
        let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
        let math = host(&sdpa(&q, &k, &v, &options).unwrap().output);
        assert!(
            math[2 * d..3 * d].iter().all(|&x| x == 0.0),
            "PyTorch's safe softmax gives 0 on {device}: {math:?}"
        );
        assert!(rel_err(&math, &out) < 1e-5);
    }
}

#[test]
fn a_nan_in_q_gives_a_nan_row_and_lse_at_this_cpu_level() {
    nan_row_and_lse();
}

#[test]
fn a_nan_in_q_gives_a_nan_row_and_lse_at_the_portable_level() {
    if in_child(
        "a_nan_in_q_gives_a_nan_row_and_lse_at_the_portable_level",
        &[("ATEN_CPU_CAPABILITY", "default")],
    ) {
        assert_eq!(backends::cpu::get_cpu_capability().to_string(), "DEFAULT");
        nan_row_and_lse();
    }
}

#[test]
fn a_nan_in_q_gives_a_nan_row_and_lse_at_the_avx2_level() {
    if in_child(
        "a_nan_in_q_gives_a_nan_row_and_lse_at_the_avx2_level",
        &[("ATEN_CPU_CAPABILITY", "avx2")],
    ) {
        nan_row_and_lse();
    }
}

/// Row 1 of q holds a NaN: that row is NaN on every path (its lse too), the others finite.
fn nan_row_and_lse() {
    let (l, d) = (6, 16);
    let mut qv = random(l * d);
    qv[d + 3] = f64::NAN;
    for device in [Some(Device::Cpu), adapter()].into_iter().flatten() {
        for dtype in [DType::F32, DType::F64] {
            if dtype == DType::F64 && device != Device::Cpu {
                continue;
            }
            let q = Tensor::from_f64(&qv, &[1, 1, l, d], dtype, device).unwrap();
            let k = Tensor::from_f64(&random(l * d), &[1, 1, l, d], dtype, device).unwrap();
            let fused = sdpa(&q, &k, &k, &SdpaOptions::default()).unwrap();
            assert_ne!(fused.backend, SdpBackend::Math);
            let out = host(&fused.output);
            let lse = host(&fused.lse.unwrap());
            let what = format!("{device} {dtype}");
            assert!(out[d..2 * d].iter().all(|x| x.is_nan()), "{what}: {out:?}");
            assert!(lse[1].is_nan(), "{what}: lse {lse:?}");
            assert!(out[..d].iter().chain(&out[2 * d..]).all(|x| x.is_finite()));
            let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
            let math = host(&sdpa(&q, &k, &k, &SdpaOptions::default()).unwrap().output);
            assert!(math[d..2 * d].iter().all(|x| x.is_nan()), "{what} math");
            assert!(math[..d].iter().all(|x| x.is_finite()));
        }
    }
}

#[test]
fn the_lse_is_the_log_of_the_softmax_denominator() {
    let (l, d) = (9, 16);
    let (qv, kv) = (random(l * d), random(l * d));
    let q = tensor::<f32>(&qv, &[1, 1, l, d], Device::Cpu);
    let k = tensor::<f32>(&kv, &[1, 1, l, d], Device::Cpu);
    let out = sdpa(&q, &k, &k, &SdpaOptions::default()).unwrap();
    let lse = out.lse.unwrap().to_vec::<f32>().unwrap();
    for i in 0..l {
        let s: Vec<f64> = (0..l)
            .map(|j| (0..d).map(|x| qv[i * d + x] * kv[j * d + x]).sum::<f64>() / 4.0)
            .collect();
        let want = s.iter().map(|x| x.exp()).sum::<f64>().ln();
        assert!(
            (f64::from(lse[i]) - want).abs() < 1e-4,
            "row {i}: {} vs {want}",
            lse[i]
        );
    }
}

#[test]
fn dropout_is_seeded_and_unbiased_in_expectation() {
    let (l, d) = (64, 16);
    let q = tensor::<f32>(&random(l * d), &[1, 2, l / 2, d], Device::Cpu);
    let k = tensor::<f32>(&random(l * d), &[1, 2, l / 2, d], Device::Cpu);
    let ones = Tensor::full(1f32, &[1, 2, l / 2, d], Device::Cpu).unwrap();
    let with = |seed, p| {
        let generator = backends::Generator::new(seed);
        let options = SdpaOptions {
            dropout_p: p,
            generator: Some(&generator),
            ..Default::default()
        };
        let out = sdpa(&q, &k, &ones, &options).unwrap();
        assert_eq!(
            out.backend,
            SdpBackend::Math,
            "dropout takes math on the CPU"
        );
        host(&out.output)
    };
    assert_eq!(with(7, 0.3), with(7, 0.3));
    assert_ne!(with(7, 0.3), with(8, 0.3));
    // With v = 1 every output is the kept weights' sum / (1 - p): 1 on average.
    let mean = with(1, 0.3).iter().sum::<f64>() / (l * d) as f64;
    assert!((mean - 1.0).abs() < 0.1, "{mean}");
}

#[test]
fn unbatched_3d_inputs() {
    let (h, l, d) = (2, 10, 8);
    let t = |n| tensor::<f32>(&random(n), &[h, l, d], Device::Cpu);
    let out = backends::scaled_dot_product_attention(
        &t(h * l * d),
        &t(h * l * d),
        &t(h * l * d),
        None,
        0.0,
        true,
        Some(0.5),
        false,
    )
    .unwrap();
    assert_eq!(out.shape(), [h, l, d]);
}

/// Empty dimensions on the CPU: a zero head dim gives every key the same weight (the mean
/// of the values), zero value dims or queries an empty output, zero keys zeros (PyTorch's
/// empty sum).
#[test]
fn zero_sized_dimensions() {
    for (lq, lk, d, dv) in [(5, 7, 0, 4), (5, 7, 8, 0), (0, 5, 8, 8), (5, 0, 8, 8)] {
        let (q, k, v) = (random(2 * lq * d), random(2 * lk * d), random(2 * lk * dv));
        let out = sdpa(
            &tensor::<f32>(&q, &[1, 2, lq, d], Device::Cpu),
            &tensor::<f32>(&k, &[1, 2, lk, d], Device::Cpu),
            &tensor::<f32>(&v, &[1, 2, lk, dv], Device::Cpu),
            &SdpaOptions::default(),
        )
        .unwrap();
        assert_eq!(out.output.shape(), [1, 2, lq, dv]);
        let got = host(&out.output);
        if d == 0 {
            // Every score is 0 times the default scale 1/sqrt(0) = inf: NaN, as math and
            // PyTorch give.
            assert!(got.iter().all(|x| x.is_nan()), "head dim 0: {got:?}");
        } else if lk > 0 {
            let want = attention_reference(
                &q,
                &k,
                &v,
                [1, 2, 2, lq, lk, d, dv],
                1.0,
                None,
                &|_, _, _, _| 0.0,
            );
            assert!(
                got.is_empty() || rel_err(&got, &want) < 1e-6,
                "{:?}",
                (lq, lk, d, dv)
            );
        } else {
            assert!(got.iter().all(|&x| x == 0.0), "no keys: {got:?}");
        }
    }
}

#[test]
fn wgpu_flash_and_mem_efficient_match_the_reference() {
    let Some(device) = adapter() else { return };
    let small = [
        case(1, 1, 16),
        case(17, 17, 32),
        case(70, 70, 64),
        case(33, 90, 128),
        Case {
            causal: true,
            ..case(70, 70, 64)
        },
        lower_right(case(20, 90, 64)),
        lower_right(case(90, 20, 32)),
        windowed(
            Case {
                causal: true,
                ..case(150, 150, 64)
            },
            Some(20),
            Some(0),
        ),
        windowed(
            Case {
                lower_right: true,
                ..case(30, 140, 32)
            },
            Some(70),
            Some(4),
        ),
    ];
    for c in small {
        let (err, backend) = run::<f32>(c, device);
        assert_eq!(backend, SdpBackend::Flash, "no mask: flash");
        assert!(err < 1e-5, "flash {:?}: {err}", (c.lq, c.lk, c.d, c.causal));
    }
    for c in [
        Case {
            mask: Some(true),
            ..case(33, 65, 64)
        },
        Case {
            mask: Some(false),
            ..case(40, 40, 32)
        },
        Case {
            causal: true,
            ..case(20, 50, 64)
        },
        windowed(
            Case {
                mask: Some(false),
                ..case(70, 90, 32)
            },
            Some(9),
            Some(9),
        ),
    ] {
        let (err, backend) = run::<f32>(c, device);
        assert_eq!(
            backend,
            SdpBackend::MemEfficient,
            "{:?}",
            (c.mask, c.causal)
        );
        assert!(
            err < 1e-5,
            "mem-efficient {:?}: {err}",
            (c.lq, c.lk, c.mask, c.causal)
        );
    }
    {
        let _only = sdpa_kernel_scoped(&[SdpBackend::MemEfficient], false);
        let (err, backend) = run::<f32>(case(50, 60, 256), device);
        assert_eq!(backend, SdpBackend::MemEfficient);
        assert!(err < 1e-5, "head dim 256: {err}");
        for c in [lower_right(case(20, 50, 64)), lower_right(case(50, 20, 64))] {
            let (err, backend) = run::<f32>(c, device);
            assert_eq!(backend, SdpBackend::MemEfficient);
            assert!(
                err < 1e-5,
                "mem-efficient lower-right {:?}: {err}",
                (c.lq, c.lk)
            );
        }
    }
    if backends::adapters::list()[0].shader_f16 {
        let (err, backend) = run::<f16>(case(40, 40, 64), device);
        assert_eq!(backend, SdpBackend::Flash);
        assert!(err < 2e-3, "f16: {err}");
    }
    let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
    for c in [
        case(10, 12, 16),
        windowed(lower_right(case(10, 30, 16)), Some(4), None),
    ] {
        let (err, backend) = run::<f32>(c, device);
        assert_eq!(backend, SdpBackend::Math);
        assert!(err < 1e-5, "math {:?}: {err}", c.window);
    }
}

#[test]
fn wgpu_math_runs_on_the_device() {
    let Some(device) = adapter() else { return };
    let shader_f16 = backends::adapters::list()[0].shader_f16;
    let mut dtypes = vec![(DType::F32, 1e-5), (DType::Bf16, 1e-2)];
    if shader_f16 {
        dtypes.push((DType::F16, 1e-3));
    }
    for (dtype, bound) in dtypes {
        let err = common::device_math_error(device, dtype);
        assert!(err < bound, "{dtype} math on wgpu vs the CPU: {err:e}");
    }
    // Where the host serves math attention, the trace says why.
    let on_the_host = |dtype, options: &SdpaOptions, why: &str| {
        let q = Tensor::from_f64(&random(64), &[1, 1, 4, 16], dtype, device).unwrap();
        let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
        let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        sdpa(&q, &q, &q, options).unwrap();
        let trace = capture.take();
        let line = format!("math on the host: {why}");
        assert!(trace.iter().any(|l| l.contains(&line)), "{trace:?}");
    };
    // Half-type intermediates asked for: f16 (wgpu's bf16 tensors are computed in f32
    // throughout).
    if shader_f16 {
        let _reduced = backends::cuda::sdp::MATH_SDP_REDUCTION.guard_scoped(true);
        let why = "allow_fp16_bf16_reduction_math_sdp";
        on_the_host(DType::F16, &SdpaOptions::default(), why);
    }
    // Dropout needs 64-bit integers WGSL lacks.
    let dropout = SdpaOptions {
        dropout_p: 0.2,
        ..SdpaOptions::default()
    };
    on_the_host(DType::F32, &dropout, "WGSL has no 64-bit");
}

#[test]
fn an_additive_mask_may_be_of_another_float_type() {
    // PyTorch accepts a float mask whose type differs from q's; the result is the one with
    // the mask in q's type.
    let (l, d) = (6, 16);
    let (qv, kv, vv) = (random(l * d), random(l * d), random(l * d));
    let mask_values: Vec<f64> = random(l * l).iter().map(|x| x * 2.0).collect();
    let mut cases = vec![
        (Device::Cpu, DType::F64, DType::F32),
        (Device::Cpu, DType::Bf16, DType::F32),
        (Device::Cpu, DType::F16, DType::F32),
        (Device::Cpu, DType::F32, DType::F64),
    ];
    if let Some(gpu) = adapter() {
        cases.push((gpu, DType::F32, DType::F16));
    }
    for (device, dtype, mask_dtype) in cases {
        let t = |v: &[f64], shape: &[usize], dt| Tensor::from_f64(v, shape, dt, device).unwrap();
        let (q, k, v) = (
            t(&qv, &[1, 1, l, d], dtype),
            t(&kv, &[1, 1, l, d], dtype),
            t(&vv, &[1, 1, l, d], dtype),
        );
        let other = t(&mask_values, &[l, l], mask_dtype);
        let same = Tensor::from_f64(&other.to_f64().unwrap(), &[l, l], dtype, device).unwrap();
        for backends in [
            &[SdpBackend::Flash, SdpBackend::MemEfficient][..],
            &[SdpBackend::Math],
        ] {
            let _only = sdpa_kernel_scoped(backends, false);
            let run = |mask| {
                let options = SdpaOptions {
                    attn_mask: Some(mask),
                    ..Default::default()
                };
                host(&sdpa(&q, &k, &v, &options).unwrap().output)
            };
            let (got, want) = (run(&other), run(&same));
            let bound = if matches!(dtype, DType::Bf16 | DType::F16) {
                1e-2
            } else {
                1e-6
            };
            assert!(
                rel_err(&got, &want) < bound,
                "{device} q {dtype} mask {mask_dtype} {backends:?}"
            );
        }
    }
}
