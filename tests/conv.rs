//! `conv2d` / `conv1d` against a direct float64 convolution: odd sizes, every padding mode,
//! stride, dilation, groups (depthwise too), bias, batch 0, unbatched inputs, views, each
//! dtype within its bound, the precision flag's effect, `mkldnn.enabled` and NNPACK, the
//! trace, and typed errors.

mod common;

use backends::conv::{Conv1dOptions, Conv2dOptions, Padding};
use backends::{DType, Error, Tensor, conv1d, conv2d};
use common::conv::{BASE, Case, bound, cases, check, check_on, reference, tensor};
use common::{random, rel_err};

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
    // One group (read in place) and two (unfolded).
    for groups in [1, 2] {
        let case = Case {
            c: 32,
            o: 16,
            hw: [16, 16],
            groups,
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
}

/// Convolutions of one group whose rows are wide enough read the input in place (an
/// implicit GEMM over shifted rows of padded phase planes of it): padding on either side
/// and `same`, dilation, strides (a 7x7/2 stem, unequal strides with dilation, a strided
/// 1x1), a kernel taller than the input and a plane of padding only, several images,
/// bias or none, several B panels and K blocks, against the float64 convolution in every
/// dtype that takes this path, with the lowering and the GEMM in the trace.
#[test]
fn one_group_convolutions_read_the_input_in_place() {
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let cases = [
        Case {
            hw: [9, 23],
            ..BASE
        },
        Case {
            n: 3,
            hw: [5, 31],
            padding: Padding::Explicit([1, 2]),
            ..BASE
        },
        Case {
            hw: [11, 40],
            k: [4, 2],
            dilation: [2, 3],
            padding: Padding::Same,
            bias: false,
            ..BASE
        },
        Case {
            hw: [2, 40],
            dilation: [3, 3],
            padding: Padding::Explicit([4, 4]),
            ..BASE
        },
        Case {
            c: 61,
            o: 13,
            hw: [7, 70],
            k: [3, 5],
            padding: Padding::Same,
            ..BASE
        },
        Case {
            hw: [3, 12],
            k: [1, 3],
            ..BASE
        },
        Case {
            hw: [20, 44],
            k: [7, 7],
            stride: [2, 2],
            padding: Padding::Explicit([3, 3]),
            ..BASE
        },
        Case {
            hw: [13, 50],
            k: [3, 4],
            stride: [3, 2],
            dilation: [2, 1],
            padding: Padding::Explicit([1, 2]),
            ..BASE
        },
        Case {
            hw: [9, 30],
            k: [1, 1],
            stride: [2, 2],
            ..BASE
        },
        // A plane of padding only: columns 2x - 3 of a one-column input.
        Case {
            hw: [5, 1],
            k: [3, 1],
            stride: [1, 2],
            padding: Padding::Explicit([0, 3]),
            ..BASE
        },
    ];
    // On several threads an image left over after the full rounds runs in bands of rows,
    // one a thread: uneven ones, and bands shorter than the rows their taps read below them.
    check_lowering(&cases, &[1, 2, 3, 5], "implicit gemm");
}

/// Each case in f32, bf16 and f16 on each thread count against the float64 convolution,
/// with the trace naming the CPU `lowering` and the GEMM kernel it ran.
fn check_lowering(cases: &[Case], threads: &[u32], lowering: &str) {
    for &threads in threads {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        for case in cases {
            for dtype in [DType::F32, DType::Bf16, DType::F16] {
                let capture = backends::TraceCapture::start();
                let err = check(case, dtype);
                let lines = capture.take();
                assert!(err < bound(dtype), "{dtype} {case:?} {threads}: {err:e}");
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains(&format!("cpu/{lowering},conv2d")))
                        && lines.iter().any(|l| l.contains(&format!(",gemm_{dtype}_"))),
                    "{dtype} {case:?}: {lines:?}"
                );
            }
        }
    }
}

/// Pointwise convolutions with no more output channels than input ones and rows of at
/// least 196 pixels read the input's channel planes in place as B's rows (several images,
/// so that on several threads whole images run one a thread and the rest in bands of rows),
/// against the float64 convolution in every dtype that takes this path; with more output
/// channels the packed GEMM serves them. Both are `gemm` in the trace.
#[test]
fn pointwise_convolutions_read_the_input_in_place() {
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let pointwise = Case { k: [1, 1], ..BASE };
    let cases = [
        Case {
            n: 3,
            c: 24,
            o: 10,
            hw: [15, 14],
            ..pointwise
        },
        Case {
            n: 1,
            c: 40,
            o: 40,
            hw: [14, 17],
            bias: false,
            ..pointwise
        },
        Case {
            n: 2,
            c: 6,
            o: 20,
            hw: [15, 14],
            ..pointwise
        },
    ];
    check_lowering(&cases, &[1, 2, 3], "gemm");
}

/// The implicit GEMM's result does not depend on the thread count: every output tile sums
/// its K blocks in one order whichever thread takes it, whether an image runs whole on one
/// thread or in bands of rows on all.
#[test]
fn one_group_convolutions_are_bit_identical_across_thread_counts() {
    for (n, c, h, w, o, k) in [(2, 61, 9, 70, 13, [3, 5]), (3, 40, 14, 15, 24, [1, 1])] {
        bit_identical_across_thread_counts(n, c, [h, w], o, k);
    }
}

fn bit_identical_across_thread_counts(
    n: usize,
    c: usize,
    [h, w]: [usize; 2],
    o: usize,
    k: [usize; 2],
) {
    let x = random(n * c * h * w);
    let weight = random(o * c * k[0] * k[1]);
    for dtype in [DType::F32, DType::Bf16] {
        let x = tensor(&x, &[n, c, h, w], dtype);
        let weight = tensor(&weight, &[o, c, k[0], k[1]], dtype);
        let options = Conv2dOptions {
            padding: Padding::Same,
            ..Default::default()
        };
        let run = |threads: usize| {
            let _t = backends::NUM_THREADS.guard_scoped(threads as u32);
            conv2d(&x, &weight, &options).unwrap().to_f64().unwrap()
        };
        let one = run(1);
        assert!(one.iter().all(|v| v.is_finite()), "{dtype}");
        for threads in [2, 3] {
            assert!(
                one.iter()
                    .zip(run(threads))
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: {threads} threads"
            );
        }
    }
}

/// The implicit GEMM at the AVX2 level (whose kernel reads B in place too, on narrower
/// tiles) and at the portable one (B packed panel by panel), in child processes whose CPU
/// level is capped.
#[test]
fn one_group_convolutions_at_the_avx2_and_portable_levels() {
    use backends::cpu::CpuCapability::{Avx2, Avx512};
    const NAME: &str = "one_group_convolutions_at_the_avx2_and_portable_levels";
    if std::env::var_os(common::CHILD).is_some() {
        let level = backends::cpu::get_cpu_capability().to_string();
        assert_eq!(
            Some(level.to_lowercase()),
            std::env::var("ATEN_CPU_CAPABILITY").ok()
        );
        one_group_convolutions_read_the_input_in_place();
        return;
    }
    for cap in ["avx2", "default"] {
        if cap == "avx2" && !matches!(backends::cpu::detected_cpu_capability(), Avx2 | Avx512) {
            eprintln!("skipped: this CPU has no AVX2");
            continue;
        }
        common::in_child(NAME, &[("ATEN_CPU_CAPABILITY", cap)]);
    }
}

#[test]
fn the_trace_names_the_lowering_and_nnpack() {
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let x = tensor(&random(2 * 3 * 5 * 5), &[2, 3, 5, 5], DType::F32);
    let w = tensor(&random(4 * 3 * 9), &[4, 3, 3, 3], DType::F32);
    // With mkldnn off (the library's kernels would read these 5-wide rows unfolded anyway),
    // NNPACK is asked and says why not.
    let _m = backends::mkldnn::flags_scoped(false);
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
            "nnpack: batches of 16 or more"
        } else {
            "nnpack off (nnpack.flags)"
        };
        assert!(conv.contains(nnpack), "{conv}");
        assert!(
            lines.iter().any(|l| l.contains(",gemm_f32")),
            "the GEMM's own line: {lines:?}"
        );
    }
}

/// With `mkldnn.enabled` off (and NNPACK off) every convolution takes PyTorch's path
/// without oneDNN: the unfolded input times the weight, or the input itself for 1x1
/// kernels; never the implicit GEMM or the direct depthwise kernel.
#[test]
fn mkldnn_off_unfolds_every_convolution() {
    let _m = backends::mkldnn::flags_scoped(false);
    let _n = backends::nnpack::flags_scoped(false);
    for case in cases() {
        for dtype in [DType::F32, DType::F64, DType::Bf16] {
            let err = check(&case, dtype);
            assert!(err < bound(dtype), "{case:?} {dtype}: {err}");
        }
        let (x, w) = operands(&case, DType::F32);
        let lowering = backends::conv::explain(&x, &w, &options(&case))
            .unwrap()
            .lowering;
        assert!(
            ["im2col+gemm", "gemm"].contains(&lowering),
            "{case:?}: {lowering}"
        );
    }
    // The same wide one-group convolution reads the input in place with mkldnn on.
    let wide = Case {
        hw: [8, 24],
        ..BASE
    };
    let (x, w) = operands(&wide, DType::F32);
    let lowering = |enabled| {
        let _m = backends::mkldnn::flags_scoped(enabled);
        backends::conv::explain(&x, &w, &options(&wide))
            .unwrap()
            .lowering
    };
    assert_eq!(
        (lowering(true), lowering(false)),
        ("implicit gemm", "im2col+gemm")
    );
}

/// Random operands of `case` in `dtype`.
fn operands(case: &Case, dtype: DType) -> (Tensor, Tensor) {
    let (cg, [kh, kw]) = (case.c / case.groups, case.k);
    (
        tensor(
            &random(case.n * case.c * case.hw[0] * case.hw[1]),
            &[case.n, case.c, case.hw[0], case.hw[1]],
            dtype,
        ),
        tensor(&random(case.o * cg * kh * kw), &[case.o, cg, kh, kw], dtype),
    )
}

/// `case`'s options, without a bias.
fn options(case: &Case) -> Conv2dOptions<'static> {
    Conv2dOptions {
        bias: None,
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    }
}

/// NNPACK takes the CPU convolutions PyTorch gives it (`mkldnn.enabled` off, `nnpack.enabled`
/// on, f32, a batch of 16 or more, no dilation, kernels up to 16x16, padding less than the
/// kernel), in every layout it is called with (one call per batch; per image with a stride;
/// per image and group with groups), against the float64 convolution; everything else says
/// why not.
#[test]
fn nnpack_takes_pytorchs_convolutions_with_mkldnn_off() {
    let _m = backends::mkldnn::flags_scoped(false);
    let batch = Case { n: 16, ..BASE };
    let why = |case: &Case, dtype| {
        let (x, w) = operands(case, dtype);
        backends::conv::explain(&x, &w, &options(case)).unwrap()
    };
    let refusals = [
        (
            Case { n: 15, ..BASE },
            DType::F32,
            "nnpack: batches of 16 or more",
        ),
        (batch, DType::F64, "nnpack: f32 only"),
        (
            Case {
                dilation: [1, 2],
                ..batch
            },
            DType::F32,
            "nnpack: no dilation",
        ),
        (
            Case {
                k: [3, 17],
                hw: [9, 20],
                ..batch
            },
            DType::F32,
            "nnpack: kernels up to 16x16",
        ),
        (
            Case {
                padding: Padding::Explicit([0, 3]),
                ..batch
            },
            DType::F32,
            "nnpack: padding must be less than the kernel",
        ),
    ];
    for (case, dtype, reason) in refusals {
        let choice = why(&case, dtype);
        assert!(choice.libraries.starts_with(reason), "{case:?}: {choice:?}");
        assert_ne!(choice.lowering, "nnpack");
    }
    {
        let _n = backends::nnpack::flags_scoped(false);
        assert_eq!(
            why(&batch, DType::F32).libraries,
            "nnpack off (nnpack.flags)"
        );
    }
    {
        let _m = backends::mkldnn::flags_scoped(true);
        assert!(
            why(&batch, DType::F32)
                .libraries
                .starts_with("nnpack not tried: mkldnn.enabled")
        );
    }
    if !backends::nnpack::is_available() {
        assert!(
            why(&batch, DType::F32)
                .libraries
                .starts_with("nnpack not loadable here")
        );
        eprintln!(
            "skipped: NNPACK's convolutions (NNPACK does not load here; scripts/nnpack-check.sh \
             runs them with PyTorch's libtorch_cpu.so)"
        );
        return;
    }
    let taken = [
        batch,
        Case {
            padding: Padding::Explicit([1, 2]),
            ..batch
        },
        Case {
            padding: Padding::Same,
            k: [4, 2],
            hw: [11, 13],
            ..batch
        },
        Case {
            padding: Padding::Valid,
            k: [2, 5],
            bias: false,
            ..batch
        },
        Case {
            stride: [2, 3],
            padding: Padding::Explicit([1, 1]),
            hw: [10, 11],
            ..batch
        },
        Case {
            groups: 3,
            c: 6,
            o: 9,
            padding: Padding::Explicit([1, 0]),
            ..batch
        },
        Case {
            groups: 5,
            c: 5,
            o: 10,
            stride: [2, 1],
            padding: Padding::Explicit([1, 1]),
            ..batch
        },
        Case {
            k: [11, 11],
            hw: [20, 18],
            padding: Padding::Explicit([5, 5]),
            ..batch
        },
    ];
    for case in taken {
        assert_eq!(why(&case, DType::F32).lowering, "nnpack", "{case:?}");
        let err = check(&case, DType::F32);
        assert!(err < bound(DType::F32), "{case:?}: {err}");
    }
    let (x, w) = operands(&batch, DType::F32);
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    conv2d(&x, &w, &options(&batch)).unwrap();
    let lines = capture.take();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("backends_verbose,exec,cpu/nnpack,conv2d,f32")),
        "{lines:?}"
    );
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
    // An empty kernel or no output channels: PyTorch's errors.
    let flat_kernel = tensor(&[], &[4, 4, 0, 3], DType::F32);
    let err = conv2d(&x, &flat_kernel, &Conv2dOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("kernel size should be greater than zero"),
        "{err}"
    );
    let no_outputs = tensor(&[], &[0, 4, 3, 3], DType::F32);
    let err = conv2d(&x, &no_outputs, &Conv2dOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected weight to be at least 1 at dimension 0"),
        "{err}"
    );
    // Sizes whose product overflows are errors, not aborts.
    let huge = Conv2dOptions {
        groups: 2,
        padding: Padding::Explicit([usize::MAX / 2, 0]),
        ..Default::default()
    };
    assert!(run(huge).is_err());
}

#[test]
fn the_generated_wgpu_kernels_match_the_direct_convolution() {
    let Some(device) = common::adapter() else {
        eprintln!("skipped: no wgpu adapter here");
        return;
    };
    for case in cases() {
        let err = check_on(&case, DType::F32, device);
        assert!(err < bound(DType::F32), "wgpu {case:?}: {err:e}");
    }
    assert_eq!(check_on(&Case { n: 0, ..BASE }, DType::F32, device), 0.0);
    // matmul's fp32 precision, emulated by rounding the inputs: TF32 coarser than IEEE, bf16
    // coarser still, each kernel named in the trace.
    let _emulate = backends::EMULATE_REDUCED_PRECISION.guard_scoped(true);
    let case = Case {
        c: 16,
        o: 8,
        hw: [12, 12],
        ..BASE
    };
    let run = |level| {
        let _level = backends::float32_matmul_precision_scoped(level);
        let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        let err = check_on(&case, DType::F32, device);
        (err, capture.take().join("\n"))
    };
    use backends::Float32MatmulPrecision::{High, Highest, Medium};
    let [(ieee, ieee_trace), (tf32, tf32_trace), (bf16, bf16_trace)] =
        [Highest, High, Medium].map(run);
    assert!(ieee < 1e-5, "{ieee}");
    assert!(
        tf32 > 10.0 * ieee && tf32 < 1e-3,
        "tf32 {tf32} vs ieee {ieee}"
    );
    assert!(
        bf16 > 2.0 * tf32 && bf16 < 1e-2,
        "bf16 {bf16} vs tf32 {tf32}"
    );
    for (trace, kernel) in [
        (ieee_trace, "conv_gemm_f32_ieee"),
        (tf32_trace, "conv_gemm_f32_tf32"),
        (bf16_trace, "conv_gemm_f32_bf16"),
    ] {
        assert!(trace.contains(kernel), "{kernel}: {trace}");
    }
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    check_on(&BASE, DType::F32, device);
    let lines = capture.take();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("generated implicit gemm,conv2d,f32")),
        "{lines:?}"
    );
    let half = Tensor::from_f64(&random(2 * 3 * 5 * 5), &[2, 3, 5, 5], DType::F16, device).unwrap();
    let w = Tensor::from_f64(&random(4 * 3 * 9), &[4, 3, 3, 3], DType::F16, device).unwrap();
    assert!(matches!(
        conv2d(&half, &w, &Conv2dOptions::default()),
        Err(Error::DTypeMismatch { .. })
    ));
}

#[test]
fn explain_names_the_lowering_precision_and_libraries() {
    use backends::conv::explain;
    let x = tensor(&random(2 * 4 * 6 * 6), &[2, 4, 6, 6], DType::F32);
    let weight =
        |o: usize, cg: usize, k: usize| tensor(&random(o * cg * k * k), &[o, cg, k, k], DType::F32);
    let options = |groups| Conv2dOptions {
        groups,
        ..Default::default()
    };
    let choice = explain(&x, &weight(8, 4, 3), &options(1)).unwrap();
    assert_eq!(
        (choice.backend.as_str(), choice.lowering),
        ("cpu", "im2col+gemm")
    );
    assert_eq!(
        explain(&x, &weight(8, 4, 1), &options(1)).unwrap().lowering,
        "gemm"
    );
    // Unit stride, one group, rows wide enough: read in place; f64 unfolds (its GEMM is the
    // reference one).
    let wide = |dtype| tensor(&random(2 * 4 * 6 * 20), &[2, 4, 6, 20], dtype);
    assert_eq!(
        explain(&wide(DType::F32), &weight(8, 4, 3), &options(1))
            .unwrap()
            .lowering,
        "implicit gemm"
    );
    let weight64 = tensor(&random(8 * 4 * 9), &[8, 4, 3, 3], DType::F64);
    assert_eq!(
        explain(&wide(DType::F64), &weight64, &options(1))
            .unwrap()
            .lowering,
        "im2col+gemm"
    );
    assert_eq!(
        explain(&x, &weight(8, 2, 1), &options(2)).unwrap().lowering,
        "im2col+gemm"
    );
    assert_eq!(
        explain(&x, &weight(8, 1, 3), &options(4)).unwrap().lowering,
        "direct depthwise"
    );
    assert!(choice.precision.contains("ieee"), "{choice:?}");
    {
        let _g =
            backends::float32_matmul_precision_scoped(backends::Float32MatmulPrecision::Medium);
        let medium = explain(&x, &weight(8, 4, 3), &options(1)).unwrap();
        assert!(medium.precision.contains("bf16"), "{medium:?}");
    }
    assert!(
        choice
            .libraries
            .starts_with("nnpack not tried: mkldnn.enabled"),
        "{choice:?}"
    );
    // explain checks the operands as conv2d does; unbatched inputs are explained too.
    assert!(matches!(
        explain(&x, &weight(8, 3, 3), &options(1)),
        Err(Error::ShapeMismatch { .. })
    ));
    let one = tensor(&random(4 * 6 * 6), &[4, 6, 6], DType::F32);
    assert_eq!(
        explain(&one, &weight(8, 4, 3), &options(1)).unwrap(),
        choice
    );
}
