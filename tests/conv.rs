//! `conv2d` / `conv1d` against a direct float64 convolution: odd sizes, every padding mode,
//! stride, dilation, groups (depthwise too), bias, batch 0, unbatched inputs, views, each
//! dtype within its bound, the precision flag's effect, the trace, and typed errors.

mod common;

use backends::conv::{Conv1dOptions, Conv2dOptions, Padding};
use backends::{DType, Device, Error, Tensor, conv1d, conv2d};
use common::{random, rel_err};

/// One convolution's sizes and options.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    c: usize,
    hw: [usize; 2],
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    padding: Padding<2>,
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
}

const BASE: Case = Case {
    n: 2,
    c: 3,
    hw: [9, 7],
    o: 4,
    k: [3, 3],
    stride: [1, 1],
    padding: Padding::Explicit([0, 0]),
    dilation: [1, 1],
    groups: 1,
    bias: true,
};

/// Padding before and after each dimension, as PyTorch resolves `same` / `valid`.
fn pads(case: &Case) -> ([usize; 2], [usize; 2]) {
    match case.padding {
        Padding::Explicit(p) => (p, p),
        Padding::Valid => ([0, 0], [0, 0]),
        Padding::Same => {
            let total = [0, 1].map(|d| case.dilation[d] * (case.k[d] - 1));
            let before = [total[0] / 2, total[1] / 2];
            (before, [total[0] - before[0], total[1] - before[1]])
        }
    }
}

/// The direct float64 convolution and its output shape.
fn reference(case: &Case, x: &[f64], w: &[f64], b: &[f64]) -> (Vec<f64>, [usize; 4]) {
    let (before, after) = pads(case);
    let out: [usize; 2] = [0, 1].map(|d| {
        (case.hw[d] + before[d] + after[d] - case.dilation[d] * (case.k[d] - 1) - 1)
            / case.stride[d]
            + 1
    });
    let (cg, og) = (case.c / case.groups, case.o / case.groups);
    let [h, wd] = case.hw;
    let mut y = Vec::new();
    for n in 0..case.n {
        for o in 0..case.o {
            let group = o / og;
            for oy in 0..out[0] {
                for ox in 0..out[1] {
                    let mut sum = if case.bias { b[o] } else { 0.0 };
                    for c in 0..cg {
                        for ki in 0..case.k[0] {
                            for kj in 0..case.k[1] {
                                let iy = (oy * case.stride[0] + ki * case.dilation[0]) as isize
                                    - before[0] as isize;
                                let ix = (ox * case.stride[1] + kj * case.dilation[1]) as isize
                                    - before[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let ci = group * cg + c;
                                let xv =
                                    x[((n * case.c + ci) * h + iy as usize) * wd + ix as usize];
                                let wv = w[((o * cg + c) * case.k[0] + ki) * case.k[1] + kj];
                                sum += xv * wv;
                            }
                        }
                    }
                    y.push(sum);
                }
            }
        }
    }
    (y, [case.n, case.o, out[0], out[1]])
}

fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64(values, shape, dtype, Device::Cpu).unwrap()
}

fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-13,
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// Runs `case` in `dtype` and returns (relative error against the reference, shape).
fn check(case: &Case, dtype: DType) -> f64 {
    let x = random(case.n * case.c * case.hw[0] * case.hw[1]);
    let w = random(case.o * (case.c / case.groups) * case.k[0] * case.k[1]);
    let b = random(case.o);
    let (want, shape) = reference(case, &x, &w, &b);
    let bias = tensor(&b, &[case.o], dtype);
    let options = Conv2dOptions {
        bias: case.bias.then_some(&bias),
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    };
    let out = conv2d(
        &tensor(&x, &[case.n, case.c, case.hw[0], case.hw[1]], dtype),
        &tensor(
            &w,
            &[case.o, case.c / case.groups, case.k[0], case.k[1]],
            dtype,
        ),
        &options,
    )
    .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    assert_eq!(out.shape(), shape, "{case:?}");
    assert_eq!(out.dtype(), dtype);
    if want.is_empty() {
        return 0.0;
    }
    rel_err(&out.to_f64().unwrap(), &want)
}

fn cases() -> Vec<Case> {
    vec![
        BASE,
        Case {
            padding: Padding::Explicit([1, 2]),
            ..BASE
        },
        Case {
            padding: Padding::Same,
            ..BASE
        },
        Case {
            padding: Padding::Same,
            k: [4, 2],
            dilation: [2, 3],
            hw: [11, 13],
            ..BASE
        },
        Case {
            padding: Padding::Valid,
            k: [2, 5],
            ..BASE
        },
        Case {
            stride: [2, 3],
            padding: Padding::Explicit([1, 1]),
            hw: [10, 11],
            ..BASE
        },
        Case {
            dilation: [2, 2],
            hw: [12, 9],
            ..BASE
        },
        Case {
            groups: 3,
            c: 6,
            o: 9,
            padding: Padding::Explicit([1, 0]),
            ..BASE
        },
        // Depthwise: one filter per channel (times a multiplier of 2).
        Case {
            groups: 5,
            c: 5,
            o: 10,
            padding: Padding::Same,
            bias: false,
            ..BASE
        },
        Case {
            groups: 4,
            c: 4,
            o: 4,
            stride: [2, 3],
            dilation: [2, 1],
            padding: Padding::Explicit([2, 1]),
            hw: [12, 11],
            ..BASE
        },
        // Pointwise: 1x1, read as it stands; and 1x1 strided (unfolded).
        Case {
            k: [1, 1],
            c: 17,
            o: 5,
            ..BASE
        },
        Case {
            k: [1, 1],
            stride: [2, 2],
            ..BASE
        },
        // A kernel as large as the input; a 1-pixel input with padding.
        Case {
            k: [9, 7],
            bias: false,
            ..BASE
        },
        Case {
            hw: [1, 1],
            padding: Padding::Explicit([1, 1]),
            ..BASE
        },
        // A larger case: tiles and threads.
        Case {
            n: 3,
            c: 16,
            hw: [23, 19],
            o: 24,
            stride: [2, 1],
            padding: Padding::Explicit([1, 1]),
            ..BASE
        },
    ]
}

#[test]
fn matches_the_direct_convolution_in_every_dtype() {
    for case in cases() {
        for dtype in [DType::F64, DType::F32, DType::Bf16, DType::F16] {
            let err = check(&case, dtype);
            assert!(err < bound(dtype), "{dtype} {case:?}: {err:e}");
        }
    }
}

#[test]
fn empty_batches_and_unbatched_inputs() {
    assert_eq!(check(&Case { n: 0, ..BASE }, DType::F32), 0.0);
    let x = random(3 * 6 * 5);
    let w = random(4 * 3 * 3 * 3);
    let (want, _) = reference(
        &Case {
            n: 1,
            hw: [6, 5],
            bias: false,
            ..BASE
        },
        &x,
        &w,
        &[],
    );
    let out = conv2d(
        &tensor(&x, &[3, 6, 5], DType::F64),
        &tensor(&w, &[4, 3, 3, 3], DType::F64),
        &Conv2dOptions::default(),
    )
    .unwrap();
    assert_eq!(out.shape(), [4, 4, 3]);
    assert!(rel_err(&out.to_f64().unwrap(), &want) < 1e-13);
}

#[test]
fn views_convolve_as_their_contiguous_copies() {
    // A channels-last buffer [N, H, W, C] seen as [N, C, H, W].
    let (n, c, h, w) = (2, 3, 8, 6);
    let nhwc = tensor(&random(n * h * w * c), &[n, h, w, c], DType::F32);
    let view = nhwc.permute(&[0, 3, 1, 2]).unwrap();
    let copy = view.contiguous().unwrap();
    let weight = tensor(&random(4 * c * 9), &[4, c, 3, 3], DType::F32);
    for k in [3, 1] {
        let weight = if k == 3 {
            weight.clone()
        } else {
            tensor(&random(4 * c), &[4, c, 1, 1], DType::F32)
        };
        let a = conv2d(&view, &weight, &Conv2dOptions::default()).unwrap();
        let b = conv2d(&copy, &weight, &Conv2dOptions::default()).unwrap();
        assert_eq!(a.to_f64().unwrap(), b.to_f64().unwrap(), "kernel {k}");
    }
}

#[test]
fn conv1d_is_conv2d_with_one_row() {
    for (padding, stride, dilation, groups) in [
        (Padding::Explicit([2]), 1, 1, 1),
        (Padding::Same, 1, 3, 2),
        (Padding::Valid, 2, 1, 1),
    ] {
        let (n, c, l, o, k) = (2, 4, 19, 6, 4);
        let x = random(n * c * l);
        let w = random(o * (c / groups) * k);
        let b = random(o);
        let case = Case {
            n,
            c,
            hw: [1, l],
            o,
            k: [1, k],
            stride: [1, stride],
            padding: match padding {
                Padding::Explicit([p]) => Padding::Explicit([0, p]),
                Padding::Same => Padding::Same,
                Padding::Valid => Padding::Valid,
            },
            dilation: [1, dilation],
            groups,
            bias: true,
        };
        let (want, shape) = reference(&case, &x, &w, &b);
        let bias = tensor(&b, &[o], DType::F64);
        let options = Conv1dOptions {
            bias: Some(&bias),
            stride,
            padding,
            dilation,
            groups,
        };
        let out = conv1d(
            &tensor(&x, &[n, c, l], DType::F64),
            &tensor(&w, &[o, c / groups, k], DType::F64),
            &options,
        )
        .unwrap();
        assert_eq!(out.shape(), [n, o, shape[3]]);
        assert!(rel_err(&out.to_f64().unwrap(), &want) < 1e-13);
        // Unbatched.
        let one = conv1d(
            &tensor(&x[..c * l], &[c, l], DType::F64),
            &tensor(&w, &[o, c / groups, k], DType::F64),
            &options,
        )
        .unwrap();
        assert_eq!(one.shape(), [o, shape[3]]);
        assert_eq!(one.to_f64().unwrap(), out.to_f64().unwrap()[..o * shape[3]]);
    }
}

#[test]
fn the_matmul_precision_flag_steers_f32_convolutions() {
    let case = Case {
        c: 32,
        o: 16,
        hw: [16, 16],
        ..BASE
    };
    let err = |level| {
        let _g = backends::float32_matmul_precision_scoped(level);
        check(&case, DType::F32)
    };
    let (highest, medium) = (
        err(backends::Float32MatmulPrecision::Highest),
        err(backends::Float32MatmulPrecision::Medium),
    );
    assert!(highest < 1e-5, "{highest}");
    if backends::cpu::has_avx512_bf16() {
        assert!(
            medium > 10.0 * highest && medium < 1e-2,
            "bf16 {medium} vs ieee {highest}"
        );
    } else {
        assert!(
            medium < 1e-5,
            "no bf16 dot products here: IEEE either way ({medium})"
        );
        eprintln!("skipped: the bf16 half (this CPU has no AVX512-BF16)");
    }
}

#[test]
fn the_trace_names_the_lowering_and_nnpack() {
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let x = tensor(&random(2 * 3 * 5 * 5), &[2, 3, 5, 5], DType::F32);
    let w = tensor(&random(4 * 3 * 9), &[4, 3, 3, 3], DType::F32);
    for enabled in [true, false] {
        let _n = backends::nnpack::flags_scoped(enabled);
        let capture = backends::TraceCapture::start();
        conv2d(&x, &w, &Conv2dOptions::default()).unwrap();
        let lines = capture.take();
        let conv = lines
            .iter()
            .find(|l| l.contains(",conv2d,"))
            .expect("a conv2d line");
        assert!(
            conv.starts_with(
                "backends_verbose,exec,cpu/im2col+gemm,conv2d,f32,[2, 3, 5, 5]x[4, 3, 3, 3]"
            ),
            "{conv}"
        );
        let nnpack = if enabled {
            "nnpack not loadable here"
        } else {
            "nnpack off (nnpack.flags)"
        };
        if backends::nnpack::is_available() {
            eprintln!("skipped: the nnpack wording (libnnpack loads here)");
        } else {
            assert!(conv.contains(nnpack), "{conv}");
        }
        assert!(
            lines.iter().any(|l| l.contains(",gemm_f32")),
            "the GEMM's own line: {lines:?}"
        );
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let x = tensor(&random(2 * 4 * 6 * 6), &[2, 4, 6, 6], DType::F32);
    let w = tensor(&random(6 * 2 * 3 * 3), &[6, 2, 3, 3], DType::F32);
    let run = |options: Conv2dOptions| conv2d(&x, &w, &options);
    // The weight needs groups = 2.
    let err = run(Conv2dOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected input[2, 4, 6, 6] to have 2 channels"),
        "{err}"
    );
    assert!(
        run(Conv2dOptions {
            groups: 2,
            ..Default::default()
        })
        .is_ok()
    );
    let bad = [
        Conv2dOptions {
            groups: 0,
            ..Default::default()
        },
        Conv2dOptions {
            groups: 2,
            stride: [0, 1],
            ..Default::default()
        },
        Conv2dOptions {
            groups: 2,
            dilation: [1, 0],
            ..Default::default()
        },
        Conv2dOptions {
            groups: 2,
            stride: [2, 1],
            padding: Padding::Same,
            ..Default::default()
        },
    ];
    for options in bad {
        assert!(
            matches!(run(options), Err(Error::InvalidArgument { .. })),
            "{options:?}"
        );
    }
    let err = run(Conv2dOptions {
        groups: 2,
        dilation: [4, 1],
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Kernel size can't be greater than actual input size"),
        "{err}"
    );
    let bias = tensor(&random(5), &[5], DType::F32);
    let err = run(Conv2dOptions {
        groups: 2,
        bias: Some(&bias),
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let w64 = tensor(&random(6 * 2 * 9), &[6, 2, 3, 3], DType::F64);
    assert!(matches!(
        conv2d(
            &x,
            &w64,
            &Conv2dOptions {
                groups: 2,
                ..Default::default()
            }
        ),
        Err(Error::DTypeMismatch { .. })
    ));
    let flat = tensor(&random(4), &[4], DType::F32);
    assert!(matches!(
        conv2d(&flat, &w, &Conv2dOptions::default()),
        Err(Error::ShapeMismatch { .. })
    ));
    // Sizes whose product overflows are errors, not aborts.
    let huge = Conv2dOptions {
        groups: 2,
        padding: Padding::Explicit([usize::MAX / 2, 0]),
        ..Default::default()
    };
    assert!(run(huge).is_err());
    match common::adapter() {
        Some(device) => {
            let on_gpu = x.to_device(device).unwrap();
            let w_gpu = w.to_device(device).unwrap();
            let err = conv2d(
                &on_gpu,
                &w_gpu,
                &Conv2dOptions {
                    groups: 2,
                    ..Default::default()
                },
            )
            .unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        }
        None => eprintln!("skipped: the wgpu half (no adapter here)"),
    }
}
