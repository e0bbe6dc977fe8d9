//! `matmul` on the CPU and on wgpu against a float64 reference, the precision flags'
//! effects, determinism, the trace, and bad input.

mod common;

use backends::cuda::matmul as flags;
use backends::{DType, Device, Element, Error, Fp32Precision, Tensor, matmul};
use common::linalg::bt as transposed;
use common::{adapter, random, reference, rel_err};
use half::{bf16, f16};

/// Sizes that are and are not multiples of every tile: (m, n, k).
const SIZES: [(usize, usize, usize); 7] = [
    (1, 1, 1),
    (7, 7, 7),
    (63, 63, 63),
    (129, 129, 129),
    (1000, 63, 129),
    (129, 1000, 7),
    (33, 17, 1000),
];

fn tensor<T: Element>(values: &[f64], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_vec(
        values.iter().map(|&v| T::from_f64(v)).collect(),
        shape,
        device,
    )
    .unwrap()
}

fn values<T: Element>(t: &Tensor) -> Vec<f64> {
    t.to_vec::<T>()
        .unwrap()
        .into_iter()
        .map(T::to_f64)
        .collect()
}

/// Rounds values through `T` (what the kernel actually sees).
fn through<T: Element>(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| T::from_f64(x).to_f64()).collect()
}

/// The relative error of one `m x k · k x n` product in `T` on `device`.
fn error_of<T: Element>(device: Device, (m, n, k): (usize, usize, usize)) -> f64 {
    let (a, b) = (random(m * k), random(k * n));
    let out = matmul(
        &tensor::<T>(&a, &[m, k], device),
        &tensor::<T>(&b, &[k, n], device),
    )
    .unwrap();
    assert_eq!(out.shape(), [m, n]);
    let got = values::<T>(&out);
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{m}x{n}x{k} on {device}: unwritten (NaN) elements"
    );
    rel_err(
        &got,
        &reference(&through::<T>(&a), &through::<T>(&b), m, n, k),
    )
}

fn ieee() -> backends::ScopedGuard {
    flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee)
}

#[test]
fn cpu_f32_matches_the_f64_reference() {
    let _p = ieee();
    for size in SIZES {
        let err = error_of::<f32>(Device::Cpu, size);
        assert!(err < 1e-5, "{size:?}: {err}");
    }
}

#[test]
fn cpu_f32_spans_several_packed_blocks_and_threads() {
    // More than one packed block of B's columns (2048) and of K (384), on two threads.
    let _p = ieee();
    let _t = backends::NUM_THREADS.guard_scoped(2);
    let size = (97, 2100, 400);
    let err = error_of::<f32>(Device::Cpu, size);
    assert!(err < 1e-5, "{size:?}: {err}");
}

/// f64 products (faer's kernels) on two threads, C split along its rows (`m >= n`) or its
/// columns, with contiguous, transposed, narrowed and broadcast (stride 0) operands, against
/// the float64 reference; and bit for bit the same on 1, 2 and 3 threads.
#[test]
fn cpu_f64_splits_over_the_threads_and_reads_every_operand_layout() {
    let _t = backends::NUM_THREADS.guard_scoped(2);
    for (m, k, n) in [
        (67, 129, 33),
        (9, 70, 300),
        (1, 50, 41),
        (130, 1, 7),
        (2, 3, 1),
    ] {
        let (a, b) = (random(m * k), random(k * n));
        let plain = tensor::<f64>(&a, &[m, k], Device::Cpu);
        let expected = reference(&a, &b, m, n, k);
        // B as given, as the transpose of its [n, k] transpose, and narrowed out of a wider one.
        let bt = transposed(&b, 1, k, n);
        let wide: Vec<f64> = (0..k * (n + 3))
            .map(|e| match e % (n + 3) {
                j if (2..n + 2).contains(&j) => b[(e / (n + 3)) * n + j - 2],
                _ => f64::NAN,
            })
            .collect();
        let operands = [
            tensor::<f64>(&b, &[k, n], Device::Cpu),
            tensor::<f64>(&bt, &[n, k], Device::Cpu).t().unwrap(),
            tensor::<f64>(&wide, &[k, n + 3], Device::Cpu)
                .narrow(1, 2, n)
                .unwrap(),
        ];
        for (layout, b) in operands.iter().enumerate() {
            let err = rel_err(&values::<f64>(&matmul(&plain, b).unwrap()), &expected);
            assert!(err < 1e-13, "{m}x{k}x{n}, layout {layout}: {err:e}");
        }
        let runs: Vec<Vec<u64>> = [1, 2, 3, 2]
            .into_iter()
            .map(|threads| {
                let _t = backends::NUM_THREADS.guard_scoped(threads);
                let out = matmul(&plain, &operands[0])
                    .unwrap()
                    .to_vec::<f64>()
                    .unwrap();
                out.into_iter().map(f64::to_bits).collect()
            })
            .collect();
        assert!(
            runs.iter().all(|r| *r == runs[0]),
            "{m}x{k}x{n}: bits differ"
        );
    }
    // A row broadcast over 40 rows (stride 0) times B.
    let (k, n) = (23, 31);
    let (row, b) = (random(k), random(k * n));
    let a = tensor::<f64>(&row, &[1, k], Device::Cpu)
        .expand(&[40, k])
        .unwrap();
    let out = values::<f64>(&matmul(&a, &tensor::<f64>(&b, &[k, n], Device::Cpu)).unwrap());
    let once = reference(&row, &b, 1, n, k);
    let err = rel_err(&out, &once.repeat(40));
    assert!(err < 1e-13, "broadcast rows: {err:e}");
}

#[test]
fn cpu_half_types_accumulate_in_f32() {
    for size in SIZES {
        let err = error_of::<bf16>(Device::Cpu, size);
        assert!(err < 1e-2, "bf16 {size:?}: {err}");
        let err = error_of::<f16>(Device::Cpu, size);
        assert!(err < 2e-3, "f16 {size:?}: {err}");
        let err = error_of::<f64>(Device::Cpu, size);
        assert!(err < 1e-12, "f64 {size:?}: {err}");
    }
}

#[test]
fn cpu_half_types_span_several_packed_blocks_threads_and_a_bias() {
    // bf16 and f16 outputs keep each tile's sums over every K block (1100: two blocks for
    // either kernel) and column block (2100 columns: two) in f32 and round them once, with
    // the bias: `linear` against the f64 product of the rounded values, on 1, 2 and 3
    // threads, bit-identical across them.
    let (m, n, k) = (40, 2100, 1100);
    let (x, w, bias) = (random(m * k), random(n * k), random(n));
    let weight_t = transposed(&w, 1, n, k);
    for dtype in [DType::Bf16, DType::F16] {
        let round = |v: &[f64]| match dtype {
            DType::Bf16 => through::<bf16>(v),
            _ => through::<f16>(v),
        };
        let bound = if dtype == DType::Bf16 { 1e-2 } else { 2e-3 };
        let mut want = reference(&round(&x), &round(&weight_t), m, n, k);
        for (e, v) in want.iter_mut().enumerate() {
            *v += round(&bias)[e % n];
        }
        let make =
            |v: &[f64], shape: &[usize]| Tensor::from_f64(v, shape, dtype, Device::Cpu).unwrap();
        let (xt, wt, bt) = (make(&x, &[m, k]), make(&w, &[n, k]), make(&bias, &[n]));
        let mut first: Option<Vec<f64>> = None;
        for threads in [1, 2, 3] {
            let _t = backends::NUM_THREADS.guard_scoped(threads);
            let got = backends::linear(&xt, &wt, Some(&bt))
                .unwrap()
                .to_f64()
                .unwrap();
            let err = rel_err(&got, &want);
            assert!(err < bound, "{dtype} {threads} threads: {err}");
            let first = first.get_or_insert_with(|| got.clone());
            assert!(
                first
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: {threads} threads differ from one"
            );
        }
    }
}

#[test]
fn transposed_and_batched_views() {
    let _p = ieee();
    let (batch, m, n, k) = (3, 37, 29, 45);
    let (a, b) = (random(batch * k * m), random(batch * n * k));
    // a is stored [batch, k, m] and b [batch, n, k]: multiply the transposed views.
    let at = tensor::<f32>(&a, &[batch, k, m], Device::Cpu).t().unwrap();
    let bt = tensor::<f32>(&b, &[batch, n, k], Device::Cpu).t().unwrap();
    assert!(!at.is_contiguous());
    let out = matmul(&at, &bt).unwrap();
    assert_eq!(out.shape(), [batch, m, n]);
    let got = values::<f32>(&out);
    for i in 0..batch {
        let ai = transposed(&a[i * k * m..][..k * m], 1, k, m);
        let bi = transposed(&b[i * n * k..][..n * k], 1, n, k);
        let err = rel_err(
            &got[i * m * n..(i + 1) * m * n],
            &reference(&ai, &bi, m, n, k),
        );
        assert!(err < 1e-5, "batch {i}: {err}");
    }
    // A 2-D operand broadcasts over the batch.
    let shared = random(k * n);
    let out = matmul(
        &tensor::<f32>(&a, &[batch, m, k], Device::Cpu),
        &tensor::<f32>(&shared, &[k, n], Device::Cpu),
    )
    .unwrap();
    assert_eq!(out.shape(), [batch, m, n]);
    let got = values::<f32>(&out);
    let err = rel_err(
        &got[m * n..2 * m * n],
        &reference(&a[m * k..2 * m * k], &shared, m, n, k),
    );
    assert!(err < 1e-5, "{err}");
}

#[test]
fn tf32_has_no_effect_on_the_cpu_unless_emulated() {
    let size = (129, 129, 257);
    let (a, b) = (random(size.0 * size.2), random(size.2 * size.1));
    let run = || {
        let out = matmul(
            &tensor::<f32>(&a, &[size.0, size.2], Device::Cpu),
            &tensor::<f32>(&b, &[size.2, size.1], Device::Cpu),
        );
        values::<f32>(&out.unwrap())
    };
    let want = reference(&a, &b, size.0, size.1, size.2);
    let exact = {
        let _p = ieee();
        run()
    };
    let _tf32 = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
    assert_eq!(
        run(),
        exact,
        "TF32 without emulation is IEEE fp32 on the CPU"
    );
    let _emulate = backends::EMULATE_REDUCED_PRECISION.guard_scoped(true);
    let coarse = rel_err(&run(), &want);
    let fine = rel_err(&exact, &want);
    assert!(
        coarse > 10.0 * fine && coarse < 1e-3,
        "tf32 {coarse} vs ieee {fine}"
    );
}

#[test]
fn medium_precision_rounds_to_bf16_where_the_cpu_has_it() {
    let size = (100, 90, 300);
    let (a, b) = (random(size.0 * size.2), random(size.2 * size.1));
    let want = reference(&a, &b, size.0, size.1, size.2);
    let err = |level| {
        let _g = backends::float32_matmul_precision_scoped(level);
        let out = matmul(
            &tensor::<f32>(&a, &[size.0, size.2], Device::Cpu),
            &tensor::<f32>(&b, &[size.2, size.1], Device::Cpu),
        );
        rel_err(&values::<f32>(&out.unwrap()), &want)
    };
    let (highest, medium) = (
        err(backends::Float32MatmulPrecision::Highest),
        err(backends::Float32MatmulPrecision::Medium),
    );
    assert!(highest < 1e-5);
    if backends::cpu::has_avx512_bf16() {
        assert!(
            medium > 10.0 * highest && medium < 1e-2,
            "bf16 {medium} vs ieee {highest}"
        );
    } else {
        assert_eq!(medium, highest);
    }
}

/// Few rows of A (a decoding step's `x @ W`: up to 32 of f32 or of bf16 on bf16 dot
/// products, 8 of bf16 widened): B read in place, row-major (in register tiles) or as the
/// transposed view of a `[N, K]` weight, f32 and bf16,
/// against the reference, bit-identical on 1, 2 and 3 threads, and named in the trace.
#[test]
fn few_rows_against_a_plain_or_transposed_weight() {
    let _p = ieee();
    // (2, 2000, 2100) is large enough to be split among the threads.
    for (m, n, k) in [
        (1, 1, 1),
        (1, 700, 300),
        (2, 37, 1000),
        (3, 1030, 17),
        (4, 513, 129),
        (7, 300, 50),
        (8, 1000, 333),
        (2, 2000, 2100),
        // Up to 32 rows of f32 values or bf16 ones on bf16 dot products; the packed path
        // otherwise. Register tiles of 8 (4 with AVX2) rows over blocks of 256 rows of B,
        // the last block partial; columns past the last panel, and a B narrower than one.
        (13, 517, 70),
        (32, 300, 200),
        (32, 1000, 700),
        (9, 47, 40),
        // Groups of 8 rows over several blocks of K, an odd K and a masked last tile.
        (20, 130, 301),
    ] {
        let (a, w) = (random(m * k), random(n * k));
        // w is the weight [n, k]; `plain` holds its transpose [k, n] as a plain matrix.
        let plain = transposed(&w, 1, n, k);
        let want = |t: &dyn Fn(&[f64]) -> Vec<f64>| reference(&t(&a), &t(&plain), m, n, k);
        for dtype in [DType::F32, DType::Bf16] {
            let bound = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let round = |v: &[f64]| match dtype {
                DType::F32 => through::<f32>(v),
                _ => through::<bf16>(v),
            };
            let make = |v: &[f64], shape: &[usize]| {
                Tensor::from_f64(v, shape, dtype, Device::Cpu).unwrap()
            };
            let x = make(&a, &[m, k]);
            let weight_t = make(&w, &[n, k]).t().unwrap();
            let b = make(&plain, &[k, n]);
            for (name, b) in [("plain", &b), ("transposed", &weight_t)] {
                let capture = backends::TraceCapture::start();
                let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
                let first = matmul(&x, b).unwrap();
                let lines = capture.take();
                assert_eq!(first.shape(), [m, n]);
                let got = first.to_f64().unwrap();
                let err = rel_err(&got, &want(&|v| round(v)));
                assert!(err < bound, "{dtype} {name} {m}x{n}x{k}: {err}");
                if matches!(
                    backends::cpu::get_cpu_capability(),
                    backends::cpu::CpuCapability::Avx2 | backends::cpu::CpuCapability::Avx512
                ) {
                    // bf16 takes up to 32 rows where it runs as dot products (as the packed
                    // GEMM's kernel choice: AVX-512 and faster), as f32 does.
                    let bf16_dots = backends::cpu::get_cpu_capability()
                        == backends::cpu::CpuCapability::Avx512
                        && backends::cpu::bf16_dot_speedup().is_some_and(|s| s > 1.5);
                    let skinny = m <= 8 || dtype == DType::F32 || bf16_dots;
                    assert_eq!(
                        lines.iter().any(|l| l.contains("skinny")),
                        skinny,
                        "{dtype} {name} {m}: {lines:?}"
                    );
                }
                for threads in [1, 3] {
                    let _t = backends::NUM_THREADS.guard_scoped(threads);
                    let again = matmul(&x, b).unwrap().to_f64().unwrap();
                    assert!(
                        got.iter()
                            .zip(&again)
                            .all(|(p, q)| p.to_bits() == q.to_bits()),
                        "{dtype} {name} {m}x{n}x{k} on {threads} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn results_are_bit_identical_across_runs_and_thread_counts() {
    let _p = ieee();
    let _d = backends::DETERMINISTIC_ALGORITHMS.guard_scoped(true);
    let (m, n, k) = (150, 170, 600);
    let a = tensor::<f32>(&random(m * k), &[m, k], Device::Cpu);
    let b = tensor::<f32>(&random(k * n), &[k, n], Device::Cpu);
    let first = matmul(&a, &b).unwrap().to_vec::<f32>().unwrap();
    for threads in [1, 2, 3] {
        let _t = backends::NUM_THREADS.guard_scoped(threads);
        let again = matmul(&a, &b).unwrap().to_vec::<f32>().unwrap();
        assert!(
            first
                .iter()
                .zip(&again)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{threads} threads"
        );
    }
}

#[test]
fn nan_propagates_to_its_row_only() {
    let (m, n, k) = (9, 11, 13);
    let mut a = random(m * k);
    a[2 * k + 5] = f64::NAN;
    let out = matmul(
        &tensor::<f32>(&a, &[m, k], Device::Cpu),
        &tensor::<f32>(&random(k * n), &[k, n], Device::Cpu),
    )
    .unwrap();
    let got = values::<f32>(&out);
    for (i, row) in got.chunks(n).enumerate() {
        assert_eq!(row.iter().all(|v| v.is_nan()), i == 2, "row {i}: {row:?}");
        assert!(i == 2 || row.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn zero_sized_dimensions() {
    let empty = matmul(
        &Tensor::full(1f32, &[0, 5], Device::Cpu).unwrap(),
        &Tensor::full(1f32, &[5, 3], Device::Cpu).unwrap(),
    );
    assert_eq!(empty.unwrap().shape(), [0, 3]);
    let zeros = matmul(
        &Tensor::full(1f32, &[4, 0], Device::Cpu).unwrap(),
        &Tensor::full(1f32, &[0, 3], Device::Cpu).unwrap(),
    )
    .unwrap();
    assert_eq!(zeros.shape(), [4, 3]);
    assert!(zeros.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn a_batch_of_one_broadcasts_to_a_batch_of_zero() {
    // As in PyTorch, 1 broadcasts to any size, 0 included.
    let t = |shape: &[usize], device| Tensor::full(1f32, shape, device).unwrap();
    for device in [Some(Device::Cpu), adapter()].into_iter().flatten() {
        for (a, b) in [
            (&[0, 33, 17][..], &[1, 17, 9][..]),
            (&[1, 33, 17], &[0, 17, 9]),
            (&[0, 33, 17], &[17, 9]),
            (&[33, 17], &[0, 17, 9]),
        ] {
            let out = matmul(&t(a, device), &t(b, device)).unwrap();
            assert_eq!(out.shape(), [0, 33, 9], "{a:?} x {b:?} on {device}");
        }
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let a = Tensor::full(1f32, &[3, 4], Device::Cpu).unwrap();
    let err = matmul(&a, &Tensor::full(1f32, &[5, 2], Device::Cpu).unwrap()).unwrap_err();
    assert!(
        matches!(err, Error::ShapeMismatch { .. }) && err.to_string().contains("4 != 5"),
        "{err}"
    );
    let err = matmul(&a, &Tensor::full(bf16::ONE, &[4, 2], Device::Cpu).unwrap()).unwrap_err();
    assert_eq!(
        err,
        Error::DTypeMismatch {
            op: "matmul",
            expected: DType::F32,
            got: DType::Bf16
        }
    );
    let err = matmul(&Tensor::full(1f32, &[4], Device::Cpu).unwrap(), &a).unwrap_err();
    assert!(err.to_string().contains("4 != 3"), "{err}");
    let scalar = Tensor::full(1f32, &[], Device::Cpu).unwrap();
    let err = matmul(&scalar, &a).unwrap_err();
    assert!(err.to_string().contains("at least one dimension"), "{err}");
    let err = matmul(
        &Tensor::full(1f32, &[2, 3, 4], Device::Cpu).unwrap(),
        &Tensor::full(1f32, &[3, 4, 2], Device::Cpu).unwrap(),
    );
    assert!(err.unwrap_err().to_string().contains("do not broadcast"));
    assert!(Tensor::from_vec(vec![1f32; 5], &[2, 3], Device::Cpu).is_err());
    assert!(matches!(
        a.to_vec::<f64>().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    if !backends::adapters::list().is_empty() {
        let w = Tensor::full(1f32, &[4, 2], Device::Wgpu(0)).unwrap();
        let err = matmul(&a, &w).unwrap_err();
        assert_eq!(
            err,
            Error::DeviceMismatch {
                op: "matmul",
                a: Device::Cpu,
                b: Device::Wgpu(0)
            }
        );
    }
    let missing = Tensor::full(1f32, &[2, 2], Device::Wgpu(99)).unwrap_err();
    assert!(matches!(missing, Error::Unavailable { .. }), "{missing}");
}

#[test]
fn the_trace_names_kernel_backend_dtype_shapes_and_precision() {
    let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    let a = Tensor::full(1f32, &[8, 4], Device::Cpu).unwrap();
    matmul(&a, &a.t().unwrap()).unwrap();
    let lines = capture.take();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    let micro = match backends::cpu::get_cpu_capability() {
        backends::cpu::CpuCapability::Avx512 => "avx512",
        backends::cpu::CpuCapability::Avx2 => "avx2",
        _ => "portable",
    };
    assert!(line.starts_with("backends_verbose,exec,cpu/"), "{line}");
    assert!(
        line.contains(micro) && line.contains("f32") && line.contains("[8, 4]x[4, 8]"),
        "{line}"
    );
    assert!(
        line.contains("tf32 requested") && line.contains("no effect") && line.ends_with("ms"),
        "{line}"
    );
    drop(_v);
    matmul(&a, &a.t().unwrap()).unwrap();
    assert!(capture.take().is_empty(), "no trace with verbose off");
}

#[test]
fn every_cpu_micro_kernel_level_gives_the_same_answer() {
    // One child process per capability cap: AVX2 and the portable kernel must agree with the
    // reference as the default level does.
    if let Ok(level) = std::env::var("BACKENDS_TEST_CHILD_LEVEL") {
        assert_eq!(backends::cpu::get_cpu_capability().to_string(), level);
        let _p = ieee();
        for size in SIZES {
            let err = error_of::<f32>(Device::Cpu, size);
            assert!(err < 1e-5, "{level} {size:?}: {err}");
        }
        // A transposed weight (its panels packed by register transposes where the level
        // has vectors).
        let (m, n, k) = (40, 200, 77);
        let (a, w) = (random(m * k), random(n * k));
        let wt = tensor::<f32>(&w, &[n, k], Device::Cpu).t().unwrap();
        let out = matmul(&tensor::<f32>(&a, &[m, k], Device::Cpu), &wt).unwrap();
        let want = reference(&through::<f32>(&a), &values::<f32>(&wt), m, n, k);
        let err = rel_err(&values::<f32>(&out), &want);
        assert!(err < 1e-5, "{level} x W.t(): {err}");
        return;
    }
    let detected = backends::cpu::detected_cpu_capability();
    for (cap, shown) in [("avx2", "AVX2"), ("default", "DEFAULT")] {
        if cap == "avx2"
            && !matches!(
                detected,
                backends::cpu::CpuCapability::Avx2 | backends::cpu::CpuCapability::Avx512
            )
        {
            continue;
        }
        let (passed, log) = common::rerun(
            &[
                "every_cpu_micro_kernel_level_gives_the_same_answer",
                "--exact",
                "--test-threads=1",
            ],
            &[
                ("ATEN_CPU_CAPABILITY", cap),
                ("BACKENDS_TEST_CHILD_LEVEL", shown),
            ],
        );
        assert!(passed && log.contains("1 passed"), "{cap}: {log}");
    }
}

#[test]
fn wgpu_f32_matches_the_f64_reference() {
    let Some(device) = adapter() else { return };
    let _p = ieee();
    for size in [
        (1, 1, 1),
        (7, 7, 7),
        (63, 65, 63),
        (129, 129, 129),
        (200, 63, 129),
        (33, 17, 300),
    ] {
        let err = error_of::<f32>(device, size);
        assert!(err < 1e-5, "{size:?}: {err}");
    }
}

/// A product needing more workgroups along a dimension than the adapter takes (here over
/// 4 million columns: 65,536 tiles of 64) is a typed error, not wgpu's validation panic.
/// (A batch of more than 65,535 runs in several dispatches; on lavapipe that takes about 18 s
/// for 70,000 tiny products, too long for this suite.)
#[test]
fn wgpu_refuses_a_dispatch_larger_than_the_adapter_takes() {
    let Some(device) = adapter() else { return };
    let n = 65_536 * 64 + 1;
    let a = Tensor::from_f64(&[2.0], &[1, 1], DType::F32, device).unwrap();
    let b = Tensor::from_f64(&vec![1.0; n], &[1, n], DType::F32, device).unwrap();
    let err = matmul(&a, &b).unwrap_err();
    assert!(
        matches!(err, backends::Error::ShapeMismatch { .. })
            && err.to_string().contains("workgroups"),
        "{err}"
    );
}

#[test]
fn wgpu_f16_where_the_adapter_has_it() {
    let Some(device) = adapter() else { return };
    if !backends::adapters::list()[0].shader_f16 {
        let err = Tensor::full(f16::ONE, &[2, 2], device).unwrap_err();
        assert!(err.to_string().contains("shader-f16"), "{err}");
        return;
    }
    for size in [(7, 7, 7), (65, 63, 130)] {
        let err = error_of::<f16>(device, size);
        assert!(err < 2e-3, "{size:?}: {err}");
    }
}

#[test]
fn wgpu_views_batches_emulation_and_determinism() {
    let Some(device) = adapter() else { return };
    let _p = ieee();
    let (batch, m, n, k) = (2, 40, 24, 70);
    let (a, b) = (random(batch * k * m), random(k * n));
    let at = tensor::<f32>(&a, &[batch, k, m], device).t().unwrap();
    let bw = tensor::<f32>(&b, &[k, n], device);
    let out = matmul(&at, &bw).unwrap();
    assert_eq!(out.shape(), [batch, m, n]);
    let got = values::<f32>(&out);
    let a1: Vec<f64> = (0..m * k).map(|e| a[k * m + (e % k) * m + e / k]).collect();
    let exact = reference(&a1, &b, m, n, k);
    let fine = rel_err(&got[m * n..], &exact);
    assert!(fine < 1e-5, "{fine}");
    assert_eq!(
        values::<f32>(&matmul(&at, &bw).unwrap()),
        got,
        "bit-identical run to run"
    );
    let _tf32 = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
    assert_eq!(
        values::<f32>(&matmul(&at, &bw).unwrap()),
        got,
        "no TF32 on wgpu without emulation"
    );
    let _emulate = backends::EMULATE_REDUCED_PRECISION.guard_scoped(true);
    let coarse = rel_err(&values::<f32>(&matmul(&at, &bw).unwrap())[m * n..], &exact);
    assert!(
        coarse > 10.0 * fine && coarse < 1e-3,
        "tf32 {coarse} vs {fine}"
    );
}

/// With "medium" precision on a CPU with AVX512-BF16 the inputs are rounded to bf16 and
/// accumulated in f32: on AMX tiles where the CPU has them, by the dot-product kernel where
/// the CPU runs it faster than f32 FMAs, else by the f32 kernel on the rounded values (the
/// trace names which).
#[test]
fn medium_precision_rounds_the_inputs_to_bf16_and_accumulates_in_f32() {
    if !backends::cpu::has_avx512_bf16()
        || backends::cpu::get_cpu_capability() != backends::cpu::CpuCapability::Avx512
    {
        eprintln!("skipped: no AVX512-BF16 here");
        return;
    }
    let _g = backends::float32_matmul_precision_scoped(backends::Float32MatmulPrecision::Medium);
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    for (m, n, k) in [(1, 1, 1), (7, 65, 7), (63, 129, 385), (13, 70, 1000)] {
        let (mut a, b) = (random(m * k), random(k * n));
        // A tie, which PyTorch's conversion rounds to even.
        a[0] = 1.0 + 1.0 / 256.0;
        let out = matmul(
            &tensor::<f32>(&a, &[m, k], Device::Cpu),
            &tensor::<f32>(&b, &[k, n], Device::Cpu),
        )
        .unwrap();
        // Against the exact product of the inputs rounded to bf16 (to nearest even): only
        // f32 accumulation error, far below the 4e-3 of rounding the inputs.
        let want = reference(&through::<bf16>(&a), &through::<bf16>(&b), m, n, k);
        let err = rel_err(&values::<f32>(&out), &want);
        assert!(err < 1e-5, "{m}x{n}x{k}: {err}");
        // And measurably off the f32 product (over many elements: one may round by little).
        if m * n > 1 {
            let exact = reference(&a, &b, m, n, k);
            assert!(
                rel_err(&values::<f32>(&out), &exact) > 1e-4,
                "{m}x{n}x{k}: not rounded"
            );
        }
    }
    let kernel = if backends::cpu::has_amx_bf16() {
        "cpu/amx_bf16,"
    } else if backends::cpu::bf16_dot_speedup().is_some_and(|s| s > 1.5) {
        "cpu/avx512_bf16,"
    } else {
        "cpu/avx512,"
    };
    let lines = capture.take();
    assert!(
        lines.iter().all(|l| l.contains(kernel)),
        "{kernel}: {lines:?}"
    );
}

#[test]
fn a_product_too_large_for_the_machine_is_an_out_of_memory_error() {
    // With overcommit "always" (mode 1) the kernel would grant the allocation and the
    // writes would meet the OOM killer instead.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        eprintln!("skipped: vm.overcommit_memory = 1 grants any allocation");
        return;
    }
    // [2^20, 1] x [1, 2^20]: a 4 TiB output.
    let a = Tensor::full(1f32, &[1 << 20, 1], Device::Cpu).unwrap();
    let err = matmul(&a, &a.t().unwrap()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(err.to_string().contains("use smaller inputs"), "{err}");
}

/// `linear` (`x · Wᵀ + b`) on an N-D input: the bias joins the f32 accumulators on the
/// CPU (one rounding to bf16), and is added on wgpu; the result keeps the input's leading
/// dimensions. Operands with offsets (a narrowed weight) on both devices.
#[test]
fn linear_adds_the_bias_and_keeps_leading_dimensions() {
    let (batch, rows, width, out) = (2, 5, 37, 11);
    let mut runs = vec![
        (DType::F32, Device::Cpu, 1e-5),
        (DType::F64, Device::Cpu, 1e-12),
        (DType::Bf16, Device::Cpu, 1e-2),
    ];
    runs.extend(adapter().map(|device| (DType::F32, device, 1e-5)));
    for (dtype, device, bound) in runs {
        let x = Tensor::from_f64(
            &random(batch * rows * width),
            &[batch, rows, width],
            dtype,
            device,
        )
        .unwrap();
        // Rows 1..=out of a taller weight, and its bias likewise: views with offsets.
        let w = Tensor::from_f64(&random((out + 2) * width), &[out + 2, width], dtype, device)
            .unwrap()
            .narrow(0, 1, out)
            .unwrap();
        let b = Tensor::from_f64(&random(out + 2), &[out + 2], dtype, device)
            .unwrap()
            .narrow(0, 2, out)
            .unwrap();
        let y = backends::linear(&x, &w, Some(&b)).unwrap();
        assert_eq!(y.shape(), [batch, rows, out]);
        assert_eq!(y.dtype(), dtype);
        let (xv, wv, bv) = (
            x.to_f64().unwrap(),
            w.to_f64().unwrap(),
            b.to_f64().unwrap(),
        );
        let wt: Vec<f64> = (0..width * out)
            .map(|e| wv[(e % out) * width + e / out])
            .collect();
        let mut expected = reference(&xv, &wt, batch * rows, out, width);
        for (e, value) in expected.iter_mut().enumerate() {
            *value += bv[e % out];
        }
        let err = rel_err(&y.to_f64().unwrap(), &expected);
        assert!(err < bound, "{dtype} on {device}: {err:e}");
        // Without a bias: the plain product.
        let plain = backends::linear(&x, &w, None).unwrap();
        let expected = reference(&xv, &wt, batch * rows, out, width);
        assert!(rel_err(&plain.to_f64().unwrap(), &expected) < bound);
    }
    let x = Tensor::full(1f32, &[3, 4], Device::Cpu).unwrap();
    let w = Tensor::full(1f32, &[2, 4], Device::Cpu).unwrap();
    for (weight, bias) in [
        (Tensor::full(1f32, &[2, 5], Device::Cpu).unwrap(), None),
        (Tensor::full(1f32, &[8], Device::Cpu).unwrap(), None),
        (
            w.clone(),
            Some(Tensor::full(1f32, &[3], Device::Cpu).unwrap()),
        ),
        (
            w.clone(),
            Some(Tensor::full(1f64, &[2], Device::Cpu).unwrap()),
        ),
    ] {
        let r = backends::linear(&x, &weight, bias.as_ref());
        assert!(
            matches!(
                r,
                Err(Error::ShapeMismatch { .. } | Error::DTypeMismatch { .. })
            ),
            "{r:?}"
        );
    }
}

/// bf16 products on AMX tiles where the CPU has them: sizes off every tile multiple, K over
/// several packed blocks, N over several column blocks, a transposed and a strided operand;
/// against the f64 product of the same bf16 values, and the trace names the kernel.
#[test]
fn amx_tiles_where_the_cpu_has_them() {
    if !backends::cpu::has_amx_bf16()
        || backends::cpu::get_cpu_capability() != backends::cpu::CpuCapability::Avx512
    {
        eprintln!("skipped: no AMX-BF16 here (or the AVX-512 level is not in force)");
        return;
    }
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    for (m, n, k, transposed) in [
        (33, 65, 2100, false),
        (40, 1100, 70, true),
        (9, 31, 33, false),
        (64, 64, 64, true),
    ] {
        let (a, b) = (random(m * (k + 1)), random(k * n));
        // A: the first k of k + 1 columns (a strided view); B plain or W.t().
        let a = tensor::<bf16>(&a, &[m, k + 1], Device::Cpu)
            .narrow(1, 0, k)
            .unwrap();
        let b = if transposed {
            tensor::<bf16>(&b, &[n, k], Device::Cpu).t().unwrap()
        } else {
            tensor::<bf16>(&b, &[k, n], Device::Cpu)
        };
        let capture = backends::TraceCapture::start();
        let out = matmul(&a, &b).unwrap();
        let lines = capture.take();
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.contains("cpu/amx_bf16,")),
            "{lines:?}"
        );
        let want = reference(&values::<bf16>(&a), &values::<bf16>(&b), m, n, k);
        let err = rel_err(&values::<bf16>(&out), &want);
        assert!(err < 1e-2, "{m}x{n}x{k} transposed={transposed}: {err}");
        // f32 accumulation: far tighter than the output's bf16 rounding, checked before it.
        let exact_f32 = {
            let _m =
                backends::float32_matmul_precision_scoped(backends::Float32MatmulPrecision::Medium);
            let a32 = tensor::<f32>(&values::<bf16>(&a), &[m, k], Device::Cpu);
            let b32 = tensor::<f32>(&values::<bf16>(&b), &[k, n], Device::Cpu);
            values::<f32>(&matmul(&a32, &b32).unwrap())
        };
        let err = rel_err(&exact_f32, &want);
        assert!(err < 1e-5, "{m}x{n}x{k} f32 at medium precision: {err}");
    }
}

/// `torch.matmul`'s shapes (checked against PyTorch 2.15): 1-D operands as row or column
/// vectors whose dimension the result drops, and batch dimensions that broadcast beyond
/// three dimensions; values against the f64 product of each batch entry.
#[test]
fn torch_matmul_semantics() {
    let cases: [(&[usize], &[usize], &[usize]); 9] = [
        (&[4], &[4], &[]),
        (&[4], &[4, 5], &[5]),
        (&[3, 4], &[4], &[3]),
        (&[4], &[2, 4, 5], &[2, 5]),
        (&[2, 3, 4], &[4], &[2, 3]),
        (&[2, 1, 3, 4], &[5, 4, 6], &[2, 5, 3, 6]),
        (&[3, 4], &[2, 5, 4, 6], &[2, 5, 3, 6]),
        (&[2, 3, 4], &[4, 5], &[2, 3, 5]),
        (&[1, 2, 3, 4], &[2, 4, 1], &[1, 2, 3, 1]),
    ];
    for (sa, sb, want) in cases {
        let (va, vb) = (random(sa.iter().product()), random(sb.iter().product()));
        let (a, b) = (
            tensor::<f64>(&va, sa, Device::Cpu),
            tensor::<f64>(&vb, sb, Device::Cpu),
        );
        let out = matmul(&a, &b).unwrap();
        assert_eq!(out.shape(), want, "{sa:?} x {sb:?}");
        // The reference: each operand as a (batch of) matrices, batch indices broadcast.
        let matrix = |shape: &[usize], left: bool| -> (Vec<usize>, usize, usize) {
            match (shape.len(), left) {
                (1, true) => (vec![], 1, shape[0]),
                (1, false) => (vec![], shape[0], 1),
                (r, _) => (shape[..r - 2].to_vec(), shape[r - 2], shape[r - 1]),
            }
        };
        let ((ba, m, k), (bb, _, n)) = (matrix(sa, true), matrix(sb, false));
        let rank = ba.len().max(bb.len());
        let dim = |b: &[usize], i: usize| (i + b.len()).checked_sub(rank).map_or(1, |at| b[at]);
        let batch: Vec<usize> = (0..rank).map(|i| dim(&ba, i).max(dim(&bb, i))).collect();
        let count: usize = batch.iter().product();
        let index = |b: &[usize], mut flat: usize| -> usize {
            // The flat batch index of `b` (broadcast dimensions read index 0).
            let mut at = 0;
            let mut scale = 1;
            for i in (0..rank).rev() {
                let here = flat % batch[i];
                flat /= batch[i];
                let size = dim(b, i);
                at += if size == 1 { 0 } else { here * scale };
                scale *= size;
            }
            at
        };
        let mut expected = Vec::new();
        for e in 0..count {
            let (ia, ib) = (index(&ba, e), index(&bb, e));
            expected.extend(reference(
                &va[ia * m * k..(ia + 1) * m * k],
                &vb[ib * k * n..(ib + 1) * k * n],
                m,
                n,
                k,
            ));
        }
        let err = rel_err(&out.to_f64().unwrap(), &expected);
        assert!(err < 1e-12, "{sa:?} x {sb:?}: {err}");
    }
    let err = matmul(
        &Tensor::full(1f32, &[2, 1, 3, 4], Device::Cpu).unwrap(),
        &Tensor::full(1f32, &[3, 3, 4, 2], Device::Cpu).unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("do not broadcast"), "{err}");
}
