//! On a machine with an NVIDIA GPU: the vendor libraries loaded at run time serve when they
//! load and their switches say so, against float64 references and the host's results:
//! cuBLAS / cuBLASLt `matmul` under `preferred_blas_library`, cuDNN attention (with its
//! log-sum-exp and seeded dropout), cuFFT with its plan cache, cuDNN convolution under every
//! `cudnn` flag, and cuSOLVER linear algebra. These libraries do not run on the PTX
//! interpreter: without a GPU each test prints why it was skipped (linalg asserts the
//! typed refusal where the interpreter stands in for the device).

#![cfg(feature = "cuda")]

mod common;

use backends::attention::SdpBackend;
use backends::cuda::matmul as flags;
use backends::cuda::{self, BlasBackend};
use backends::{
    CausalVariant, DType, Device, Fp32Precision, SdpaOptions, Tensor, Window, matmul, sdpa,
};
use common::cuda::{attention_error, cudnn_loadable, gpu, matmul_error, tensor};
use common::{random, reference, rel_err};

#[test]
fn cublas_and_cublaslt_serve_when_preferred_and_loadable() {
    let Some(d) = gpu() else { return };
    for (library, name) in [
        (BlasBackend::Cublas, "/cublas"),
        (BlasBackend::Cublaslt, "/cublaslt"),
    ] {
        let _b = cuda::PREFERRED_BLAS.guard_scoped(library);
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        let capture = backends::TraceCapture::start();
        let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let err = matmul_error(d, DType::F32, (129, 200, 300));
        let lines = capture.take();
        if !lines.iter().any(|l| l.contains(name)) {
            eprintln!("skipped: {library} did not serve ({lines:?})");
            continue;
        }
        assert!(err < 1e-5, "{library}: {err}");
        // Transposed operand views are read through the libraries' transpose operations.
        let (a, a_held) = tensor(&random(40 * 30), &[40, 30], DType::F32, Device::Cuda(d));
        let c = matmul(&a.t().unwrap(), &a).unwrap().to_f64().unwrap();
        let at: Vec<f64> = (0..30 * 40)
            .map(|i| a_held[(i % 40) * 30 + i / 40])
            .collect();
        assert!(rel_err(&c, &reference(&at, &a_held, 30, 30, 40)) < 1e-5);
        // Batched, with a broadcast operand.
        let (x, xh) = tensor(
            &random(3 * 20 * 10),
            &[3, 20, 10],
            DType::F32,
            Device::Cuda(d),
        );
        let (w, wh) = tensor(&random(10 * 7), &[10, 7], DType::F32, Device::Cuda(d));
        let got = matmul(&x, &w).unwrap().to_f64().unwrap();
        let want: Vec<f64> = (0..3)
            .flat_map(|i| reference(&xh[i * 200..(i + 1) * 200], &wh, 20, 7, 10))
            .collect();
        assert!(rel_err(&got, &want) < 1e-5, "{library} batched");
        let _t = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
        let tf32 = matmul_error(d, DType::F32, (129, 200, 300));
        assert!(tf32 < 1e-3, "{library} tf32: {tf32}");
        for dtype in [DType::F16, DType::Bf16] {
            let err = matmul_error(d, dtype, (129, 200, 300));
            assert!(err < 1e-2, "{library} {dtype}: {err}");
        }
    }
}

#[test]
fn cudnn_attention_matches_the_reference_and_returns_the_log_sum_exp() {
    let Some(d) = gpu() else { return };
    if !cudnn_loadable() {
        return;
    }
    let _only = backends::attention::sdpa_kernel_scoped(&[SdpBackend::Cudnn], false);
    for dtype in [DType::Bf16, DType::F16] {
        for (dims, causal) in [
            ([2, 3, 3, 17, 17, 64], false),
            ([1, 4, 4, 128, 128, 128], true),
            ([1, 2, 2, 333, 333, 64], true),
            ([1, 2, 2, 20, 50, 64], true),
            ([1, 2, 2, 50, 20, 128], false),
        ] {
            let causal = causal.then_some(CausalVariant::UpperLeft);
            let (err, backend) = attention_error(d, dtype, dims, causal, Window::UNBOUNDED, None);
            assert_eq!(backend, SdpBackend::Cudnn, "{dims:?}");
            assert!(err < 1e-2, "{dtype} {dims:?} causal={causal:?}: {err}");
        }
        // With cudnn::benchmark, a new shape's plan is the fastest of every candidate.
        {
            let _benchmark = backends::cudnn::flags_scoped(backends::cudnn::Flags {
                benchmark: Some(true),
                benchmark_limit: Some(0),
                ..Default::default()
            });
            let causal = Some(CausalVariant::UpperLeft);
            let (err, backend) = attention_error(
                d,
                dtype,
                [1, 3, 3, 96, 96, 64],
                causal,
                Window::UNBOUNDED,
                None,
            );
            assert_eq!(backend, SdpBackend::Cudnn);
            assert!(err < 1e-2, "{dtype} with benchmark: {err}");
        }
        // The log-sum-exp against the host's fused path on the same (rounded) inputs.
        let shape = [2, 2, 77, 64];
        let n: usize = shape.iter().product();
        let gpu_in: Vec<Tensor> = (0..3)
            .map(|_| Tensor::from_f64(&random(n), &shape, dtype, Device::Cuda(d)).unwrap())
            .collect();
        let host_in: Vec<Tensor> = gpu_in
            .iter()
            .map(|t| t.to_device(Device::Cpu).unwrap())
            .collect();
        let options = SdpaOptions {
            is_causal: true,
            ..Default::default()
        };
        let got = sdpa(&gpu_in[0], &gpu_in[1], &gpu_in[2], &options).unwrap();
        let want = {
            let _cpu = backends::attention::sdpa_kernel_scoped(&[SdpBackend::Flash], false);
            sdpa(&host_in[0], &host_in[1], &host_in[2], &options).unwrap()
        };
        let (got, want) = (
            got.lse
                .expect("cuDNN returns the log-sum-exp")
                .to_f64()
                .unwrap(),
            want.lse
                .expect("the CPU fused path returns it")
                .to_f64()
                .unwrap(),
        );
        assert_eq!(got.len(), 2 * 2 * 77);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 2e-2, "{dtype} log-sum-exp off by {worst}");
    }
}

#[test]
fn cudnn_dropout_is_seeded_and_keeps_the_expectation() {
    let Some(d) = gpu() else { return };
    if !cudnn_loadable() {
        return;
    }
    let _only = backends::attention::sdpa_kernel_scoped(&[SdpBackend::Cudnn], false);
    let device = Device::Cuda(d);
    let shape = [1, 4, 256, 64];
    let n: usize = shape.iter().product();
    let q = Tensor::from_f64(&random(n), &shape, DType::Bf16, device).unwrap();
    let k = Tensor::from_f64(&random(n), &shape, DType::Bf16, device).unwrap();
    // With v = 1 every output is the sum of the row's kept weights, rescaled: 1 on average.
    let v = Tensor::from_f64(&vec![1.0; n], &shape, DType::Bf16, device).unwrap();
    let run = |seed| {
        let generator = backends::Generator::new(seed);
        let options = SdpaOptions {
            dropout_p: 0.2,
            generator: Some(&generator),
            ..Default::default()
        };
        let out = sdpa(&q, &k, &v, &options).unwrap();
        assert_eq!(out.backend, SdpBackend::Cudnn);
        out.output.to_f64().unwrap()
    };
    let (a, again, other) = (run(11), run(11), run(12));
    assert_eq!(a, again, "the same seed drops the same weights");
    assert_ne!(a, other, "another seed drops other weights");
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    assert!(
        (mean - 1.0).abs() < 0.02,
        "dropout changed the expectation: {mean}"
    );
    let spread = a.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
    assert!(
        spread > 0.01,
        "dropout changed nothing (largest deviation {spread})"
    );
}

/// A complex-to-complex transform of `backends::fft`.
type Transform = fn(&Tensor) -> backends::Result<Tensor>;

#[test]
fn cufft_transforms_match_the_host_ones_and_use_the_device_plan_cache() {
    use backends::fft;
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    let cache = cuda::cufft_plan_cache(d).unwrap();
    cache.clear();
    for dtype in [DType::F32, DType::F64] {
        let bound = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
        let values = random(6 * 40 * 2);
        let host = Tensor::from_f64(&values, &[6, 40, 2], dtype, Device::Cpu).unwrap();
        let gpu_in = host.to_device(device).unwrap();
        let pairs: [(&str, Transform); 4] = [
            ("fft", fft::fft),
            ("ifft", fft::ifft),
            ("fft2", fft::fft2),
            ("ifft2", fft::ifft2),
        ];
        for (name, op) in pairs {
            let on_gpu = match op(&gpu_in) {
                Ok(t) => t,
                Err(e @ backends::Error::Unavailable { .. }) => {
                    eprintln!("skipped: {e}");
                    return;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            assert_eq!(on_gpu.device(), device);
            let want = op(&host).unwrap().to_f64().unwrap();
            let err = rel_err(&on_gpu.to_f64().unwrap(), &want);
            assert!(err < bound, "{name} {dtype}: {err}");
        }
        let real = Tensor::from_f64(&random(5 * 30), &[5, 30], dtype, Device::Cpu).unwrap();
        let spectrum = fft::rfft(&real.to_device(device).unwrap()).unwrap();
        assert_eq!(spectrum.shape(), [5, 16, 2]);
        let want = fft::rfft(&real).unwrap().to_f64().unwrap();
        assert!(
            rel_err(&spectrum.to_f64().unwrap(), &want) < bound,
            "rfft {dtype}"
        );
        for n in [None, Some(30), Some(25)] {
            let back = fft::irfft(&spectrum, n).unwrap();
            let want = fft::irfft(&spectrum.to_device(Device::Cpu).unwrap(), n).unwrap();
            assert_eq!(back.shape(), want.shape());
            let err = rel_err(&back.to_f64().unwrap(), &want.to_f64().unwrap());
            assert!(err < bound, "irfft {n:?} {dtype}: {err}");
        }
    }
    assert!(
        cache.size() > 0,
        "the CUDA transforms keep their plans in the device's cache"
    );
    cache.set_max_size(1);
    assert_eq!(cache.size(), 1);
    cache.set_max_size(backends::fft::DEFAULT_MAX_SIZE);
    // f16 has no cuFFT path here: a typed error, not a panic.
    let half = Tensor::from_f64(&random(16), &[8, 2], DType::F16, device).unwrap();
    assert!(matches!(
        fft::fft(&half),
        Err(backends::Error::DTypeMismatch { .. })
    ));
}

/// conv2d through cuDNN's graph (a GPU of the driver and cuDNN 9): every case in every type
/// against the float64 convolution, TF32 coarser than IEEE under `cudnn.allow_tf32`,
/// `cudnn.deterministic` runs bit-identical, `cudnn.benchmark` choosing among every engine,
/// and the choice in `explain` and the trace.
#[test]
fn conv2d_runs_through_cudnn_under_its_flags() {
    use common::conv::{BASE, Case, bound, cases, check_on};
    let Some(d) = gpu() else { return };
    if !cudnn_loadable() {
        return;
    }
    let device = Device::Cuda(d);
    let _ieee = backends::cudnn::ALLOW_TF32.guard_scoped(false);
    for case in cases() {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let err = check_on(&case, dtype, device);
            assert!(err < bound(dtype), "cudnn {dtype} {case:?}: {err:e}");
        }
    }
    let tensor = |shape: &[usize], dtype| {
        let n = shape.iter().product();
        Tensor::from_f64(&random(n), shape, dtype, device).unwrap()
    };
    let (x, w) = (
        tensor(&[2, 3, 4, 4], DType::F32),
        tensor(&[4, 3, 3, 3], DType::F32),
    );
    let choice = backends::conv::explain(&x, &w, &Default::default()).unwrap();
    assert_eq!(choice.lowering, "cudnn graph", "{choice:?}");
    assert_eq!(choice.backend, format!("cuda:{d}/cudnn"), "{choice:?}");
    assert!(choice.libraries.contains("heuristics"), "{choice:?}");

    // A shape large enough for tensor-core engines: TF32 is coarser than IEEE.
    let large = Case {
        n: 4,
        c: 128,
        hw: [28, 28],
        o: 128,
        padding: backends::conv::Padding::Explicit([1, 1]),
        ..BASE
    };
    let ieee = check_on(&large, DType::F32, device);
    let tf32 = {
        let _tf32 = backends::cudnn::ALLOW_TF32.guard_scoped(true);
        check_on(&large, DType::F32, device)
    };
    eprintln!("cudnn conv2d f32: ieee {ieee:e}, tf32 {tf32:e}");
    assert!(ieee < 1e-5, "ieee {ieee:e}");
    assert!(
        tf32 > 3.0 * ieee && tf32 < 1e-2,
        "tf32 {tf32:e} vs ieee {ieee:e}"
    );

    // Deterministic engines only: two runs give the same bits.
    let (x, w) = (
        tensor(&[2, 64, 20, 20], DType::Bf16),
        tensor(&[64, 64, 3, 3], DType::Bf16),
    );
    let options = backends::conv::Conv2dOptions {
        padding: backends::conv::Padding::Same,
        ..Default::default()
    };
    {
        let _deterministic = backends::cudnn::flags_scoped(backends::cudnn::Flags {
            deterministic: Some(true),
            ..Default::default()
        });
        let choice = backends::conv::explain(&x, &w, &options).unwrap();
        assert!(
            choice.libraries.contains("deterministic only"),
            "{choice:?}"
        );
        let first = backends::conv2d(&x, &w, &options)
            .unwrap()
            .to_f64()
            .unwrap();
        let second = backends::conv2d(&x, &w, &options)
            .unwrap()
            .to_f64()
            .unwrap();
        assert!(
            first
                .iter()
                .zip(&second)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "deterministic cuDNN runs differ"
        );
    }

    // Benchmarking every engine cuDNN offers for a new shape; the trace names cuDNN.
    let _benchmark = backends::cudnn::flags_scoped(backends::cudnn::Flags {
        benchmark: Some(true),
        benchmark_limit: Some(0),
        ..Default::default()
    });
    let case = Case {
        c: 24,
        o: 40,
        hw: [17, 15],
        stride: [2, 1],
        ..BASE
    };
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    for dtype in [DType::F32, DType::Bf16] {
        let err = check_on(&case, dtype, device);
        assert!(err < bound(dtype), "cudnn benchmark {dtype}: {err:e}");
    }
    let lines = capture.take();
    assert!(
        lines.iter().any(|l| l.contains(",conv2d,")
            && l.contains("/cudnn cudnn graph")
            && l.contains("fastest of all offered")),
        "{lines:?}"
    );
}

/// Linear algebra on CUDA tensors through cuSOLVER (a GPU of the driver): every identity,
/// typed error and edge case `tests/linalg.rs` checks on the CPU, on device tensors; the
/// library and the preference's outcome in the trace. On the PTX interpreter the typed
/// refusal.
#[test]
fn linalg_runs_through_cusolver() {
    use common::linalg as checks;
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    if cuda::get_device_name(d).is_some_and(|n| n.starts_with("PTX interpreter")) {
        let a = Tensor::from_f64(&[2.0, 1.0, 1.0, 3.0], &[2, 2], DType::F32, device).unwrap();
        let err = backends::linalg::inv(&a).unwrap_err();
        assert!(
            matches!(err, backends::Error::Unavailable { .. })
                && err.to_string().contains("PTX interpreter"),
            "{err}"
        );
        eprintln!("skipped: cuSOLVER runs on a GPU of the driver, not on the PTX interpreter");
        return;
    }
    checks::inv_times_input_is_the_identity(device);
    checks::a_singular_matrix_is_an_error_naming_its_batch_element(device);
    checks::cholesky_factors_reconstruct_the_input(device);
    checks::cholesky_of_an_indefinite_matrix_names_the_minor_and_batch_element(device);
    checks::cholesky_solve_and_inverse_broadcast_over_the_batch(device);
    checks::lu_factor_pivots_and_lu_solve_match_the_input(device);
    checks::lu_factor_refuses_a_zero_pivot_and_lu_accepts_it(device);
    checks::lu_gives_a_permutation_times_unit_lower_times_upper(device);
    checks::qr_is_orthonormal_times_upper_triangular_in_every_mode(device);
    checks::eigh_diagonalises_symmetric_matrices_from_the_named_triangle(device);
    checks::svd_reconstructs_the_input_full_and_thin(device);
    checks::empty_batches_and_empty_matrices(device);
    // Results stay on the device; the trace names cuSOLVER and what the preference led to.
    let _magma = cuda::PREFERRED_LINALG.guard_scoped(cuda::LinalgBackend::Magma);
    let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    let a = Tensor::from_f64(&random(2 * 16), &[2, 4, 4], DType::F32, device).unwrap();
    let s = backends::linalg::svdvals(&a).unwrap();
    assert_eq!(s.device(), device);
    let lines = capture.take();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("cuda:{d}/cusolver,linalg.svdvals"))
                && l.contains("magma preferred")),
        "{lines:?}"
    );
}

/// Without a GPU, this file's tests run again on the PTX interpreter, where the libraries
/// do not run: each test skips, but CUDA linear algebra, which asserts its typed refusal.
#[test]
fn without_a_gpu_the_library_tests_skip_on_the_interpreted_device() {
    let Some((passed, skipped)) = common::cuda::rerun_on_the_interpreter() else {
        return;
    };
    assert!(
        passed >= 7 && skipped >= 5,
        "{passed} passed, {skipped} skipped"
    );
}
