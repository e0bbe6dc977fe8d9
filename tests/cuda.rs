//! On a machine with an NVIDIA GPU, or else on the PTX interpreter standing in for one
//! (as a device of this library, and behind the driver API as a `libcuda.so`):
//! every generated CUDA module loads for device 0 (embedded PTX or NVRTC at run time) and
//! exposes each variant's entry point; tensors round-trip through device memory; the
//! generated kernels of `matmul` (under each precision flag, split-K), flash /
//! memory-efficient / math attention (serving layouts, dropout, split-KV decoding) and
//! conv2d match float64 references; older GPUs run the kernels built for them. The vendor
//! libraries' tests are in tests/cuda_libraries.rs.

#![cfg(feature = "cuda")]

mod common;

use backends::attention::SdpBackend;
use backends::cuda::matmul as flags;
use backends::cuda::{self, BlasBackend};
use backends::kernels::ENTRIES;
use backends::{
    CausalVariant, DType, Device, Fp32Precision, SdpaOptions, Tensor, Window, matmul, sdpa,
};
use common::cuda::{attention_error, gpu, matmul_error, tensor};
use common::{attention_reference, random, reference, rel_err};

#[test]
fn every_cuda_module_loads_and_has_its_entry_points() {
    let Some(device) = gpu() else { return };
    let (major, minor) = cuda::get_device_capability(device).expect("a present device");
    let sm = major * 10 + minor;
    let expected = ENTRIES
        .iter()
        .filter(|e| e.cuda.as_ref().is_some_and(|c| c.min_sm <= sm))
        .count();
    // The driver loads each module (the interpreter parses it) and resolves every kernel.
    let resolved = cuda::loader::check_modules(device)
        .unwrap_or_else(|e| panic!("the modules for sm_{sm} on cuda:{device}: {e}"));
    assert_eq!(resolved, expected, "every kernel for sm_{sm} resolves");
    assert!(resolved > 0);
}

#[test]
fn the_device_reports_its_capability_and_name() {
    let Some(device) = gpu() else { return };
    let (major, _) = cuda::get_device_capability(device).expect("a capability");
    assert!(major >= 5, "sm_{major}x is older than any CUDA 12 target");
    assert!(!cuda::get_device_name(device).unwrap_or_default().is_empty());
    assert_eq!(
        Device::best(),
        Device::Cuda(0),
        "a CUDA device is the best device"
    );
}

#[test]
fn tensors_round_trip_through_device_memory() {
    let Some(d) = gpu() else { return };
    let x = random(1200);
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::F64] {
        let (t, held) = tensor(&x, &[30, 40], dtype, Device::Cuda(d));
        assert_eq!(t.device(), Device::Cuda(d));
        assert_eq!(t.to_f64().unwrap(), held, "{dtype}");
        // A transposed view downloads in the view's order.
        let tt = t.t().unwrap().to_f64().unwrap();
        assert_eq!(tt[1], held[40], "{dtype}");
    }
    let bools: Vec<bool> = (0..77).map(|i| i % 3 == 0).collect();
    let t = Tensor::from_bools(&bools, &[7, 11], Device::Cuda(d)).unwrap();
    assert_eq!(t.to_bools().unwrap(), bools);
    let empty = Tensor::from_vec(Vec::<f32>::new(), &[0, 4], Device::Cuda(d)).unwrap();
    assert!(empty.to_vec::<f32>().unwrap().is_empty());
}

const SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 7, 7),
    (63, 129, 65),
    (129, 1000, 7),
    (200, 300, 1000),
];

#[test]
fn generated_gemm_kernels_match_the_f64_reference_under_each_flag() {
    let Some(d) = gpu() else { return };
    let _b = cuda::PREFERRED_BLAS.guard_scoped(BlasBackend::Default);
    let mut ieee_err = 0.0;
    for size in SIZES {
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        ieee_err = matmul_error(d, DType::F32, size);
        assert!(ieee_err < 1e-5, "ieee {size:?}: {ieee_err}");
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
        let tf32 = matmul_error(d, DType::F32, size);
        assert!(tf32 < 1e-3, "tf32 {size:?}: {tf32}");
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Bf16);
        let medium = matmul_error(d, DType::F32, size);
        assert!(medium < 1e-2, "bf16 {size:?}: {medium}");
        for dtype in [DType::F16, DType::Bf16] {
            let err = matmul_error(d, dtype, size);
            assert!(err < 1e-2, "{dtype} {size:?}: {err}");
        }
        // fp16 accumulators (`allow_fp16_accumulation`): the f16 tensor-core variant.
        let _a = flags::ALLOW_FP16_ACCUMULATION.guard_scoped(true);
        let err = matmul_error(d, DType::F16, size);
        assert!(err < 1e-2, "f16, fp16 accumulation {size:?}: {err}");
    }
    // TF32 keeps 10 mantissa bits: on the largest size it is measurably coarser than IEEE.
    let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
    let tf32 = matmul_error(d, DType::F32, SIZES[4]);
    assert!(tf32 > 10.0 * ieee_err, "tf32 {tf32} vs ieee {ieee_err}");
}

#[test]
fn split_k_reduction_follows_the_reduced_precision_flags_and_is_deterministic() {
    let Some(d) = gpu() else { return };
    let _b = cuda::PREFERRED_BLAS.guard_scoped(BlasBackend::Default);
    // One output tile, a deep K: the product is split over K.
    let (m, n, k) = (64, 64, 8192);
    let (a, a_held) = tensor(&random(m * k), &[m, k], DType::Bf16, Device::Cuda(d));
    let (b, b_held) = tensor(&random(k * n), &[k, n], DType::Bf16, Device::Cuda(d));
    let want = reference(&a_held, &b_held, m, n, k);
    let run = |reduced: bool| {
        let _r = flags::ALLOW_BF16_REDUCED_PRECISION_REDUCTION.guard_scoped(reduced);
        let capture = backends::TraceCapture::start();
        let _v = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let got = matmul(&a, &b).unwrap().to_f64().unwrap();
        let lines = capture.take();
        let splits = lines
            .iter()
            .find_map(|l| l.split("split-K x").nth(1))
            .and_then(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<usize>()
                    .ok()
            });
        assert!(
            splits.is_some_and(|s| s >= 2),
            "the trace names a split of K: {lines:?}"
        );
        got
    };
    let (exact, reduced) = (run(false), run(true));
    let (exact_err, reduced_err) = (rel_err(&exact, &want), rel_err(&reduced, &want));
    assert!(
        reduced_err < 1e-2 && exact_err < 1e-2,
        "{exact_err} {reduced_err}"
    );
    assert!(
        exact_err <= reduced_err * 1.000_001,
        "f32 partials {exact_err} vs bf16 partials {reduced_err}"
    );
    assert_eq!(run(false), exact, "split-K sums in a fixed order");
}

#[test]
fn flash_attention_matches_the_reference() {
    let Some(d) = gpu() else { return };
    for dtype in [DType::Bf16, DType::F16] {
        for dims in [
            [2, 3, 3, 17, 17, 64],
            [1, 4, 2, 128, 128, 128],
            [1, 2, 2, 333, 333, 64],
            [1, 2, 2, 64, 64, 32],
            [1, 2, 2, 33, 33, 96],
            [1, 1, 1, 33, 33, 256],
            // Head dims between the built ones: the next larger kernel, its columns past
            // the call's zero (16-byte tiles where the head dim is a multiple of 8, else
            // element by element).
            [1, 2, 2, 37, 37, 16],
            [1, 2, 1, 45, 45, 40],
            [2, 2, 2, 19, 19, 20],
            [1, 2, 2, 50, 50, 72],
        ] {
            for causal in [None, Some(CausalVariant::UpperLeft)] {
                let (err, backend) =
                    attention_error(d, dtype, dims, causal, Window::UNBOUNDED, None);
                assert_eq!(backend, SdpBackend::Flash, "{dims:?}");
                assert!(err < 1e-2, "{dtype} {dims:?} causal={causal:?}: {err}");
            }
        }
        // Bottom-right causal masks with Lq != Lk (flash refuses top-left ones, as PyTorch).
        for dims in [[1, 2, 2, 17, 90, 64], [1, 4, 2, 90, 17, 64]] {
            let causal = Some(CausalVariant::LowerRight);
            let (err, backend) = attention_error(d, dtype, dims, causal, Window::UNBOUNDED, None);
            assert_eq!(backend, SdpBackend::Flash, "{dims:?}");
            assert!(err < 1e-2, "{dtype} {dims:?} lower-right: {err}");
        }
        // Sliding windows: causal local attention, and a band on both sides (the causal
        // kernel takes both edges).
        for (dims, causal, window) in [
            (
                [1, 2, 2, 150, 150, 64],
                Some(CausalVariant::UpperLeft),
                Window::new(Some(20), Some(0)),
            ),
            (
                [1, 2, 1, 40, 200, 64],
                Some(CausalVariant::LowerRight),
                Window::new(Some(70), None),
            ),
            (
                [1, 2, 2, 130, 130, 32],
                None,
                Window::new(Some(9), Some(30)),
            ),
        ] {
            let (err, backend) = attention_error(d, dtype, dims, causal, window, None);
            assert_eq!(backend, SdpBackend::Flash, "{dims:?}");
            assert!(err < 1e-2, "{dtype} {dims:?} {causal:?} {window}: {err}");
        }
    }
}

#[test]
fn memory_efficient_attention_matches_the_reference() {
    let Some(d) = gpu() else { return };
    let _f = cuda::sdp::FLASH_SDP.guard_scoped(false);
    for (dtype, bound) in [(DType::F32, 2e-5), (DType::F16, 2e-3), (DType::Bf16, 1e-2)] {
        let (upper, lower) = (
            Some(CausalVariant::UpperLeft),
            Some(CausalVariant::LowerRight),
        );
        for (dims, causal, mask) in [
            ([2, 3, 3, 17, 17, 64], None, None),
            ([1, 2, 2, 33, 90, 128], None, Some(DType::Bool)),
            ([1, 2, 2, 40, 40, 64], None, Some(dtype)),
            ([1, 2, 2, 20, 50, 64], upper, None),
            ([1, 2, 2, 20, 50, 64], lower, None),
            ([1, 2, 2, 50, 20, 64], lower, None),
            // The widest variant (head dims up to 256).
            ([1, 1, 1, 17, 23, 200], None, Some(DType::Bool)),
        ] {
            let (err, backend) = attention_error(d, dtype, dims, causal, Window::UNBOUNDED, mask);
            assert_eq!(backend, SdpBackend::MemEfficient, "{dims:?}");
            assert!(err < bound, "{dtype} {dims:?} {mask:?}: {err}");
        }
        // Sliding windows with a mask, and with the bottom-right causal mask.
        for (dims, causal, window, mask) in [
            (
                [1, 2, 2, 70, 90, 64],
                None,
                Window::new(Some(9), Some(9)),
                Some(dtype),
            ),
            (
                [1, 2, 2, 30, 140, 64],
                lower,
                Window::new(Some(50), None),
                None,
            ),
        ] {
            let (err, backend) = attention_error(d, dtype, dims, causal, window, mask);
            assert_eq!(backend, SdpBackend::MemEfficient, "{dims:?}");
            assert!(err < bound, "{dtype} {dims:?} {mask:?}: {err}");
        }
    }
}

/// Serving calls on CUDA: the memory-efficient kernel reads the sequence table (packed
/// offsets, or a paged cache's lengths and shuffled block table), with GQA, both causal
/// alignments and a window, f32 and bf16, against each sequence's float64 reference.
#[test]
fn serving_calls_read_the_sequence_table() {
    use common::serving::{Masking, NONE, paged_error, varlen_error};
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    let causal = |variant| Masking {
        causal: Some(variant),
        ..NONE
    };
    let windowed = Masking {
        window: Window::new(Some(9), Some(0)),
        ..causal(CausalVariant::LowerRight)
    };
    for masking in [NONE, causal(CausalVariant::UpperLeft), windowed] {
        let err = varlen_error::<f32>(
            &[17, 40, 0, 5],
            &[17, 40, 0, 5],
            (4, 2, 32),
            masking,
            device,
        );
        assert!(err < 2e-5, "varlen {masking:?}: {err}");
        let (err, lines) = paged_error::<f32>(&[70, 0, 33], (4, 2, 2, 32, 16), masking, device);
        assert!(err < 2e-5, "paged {masking:?}: {err}");
        assert!(
            lines.iter().any(|l| l.contains("sequence table")),
            "{lines:?}"
        );
    }
    let err = varlen_error::<half::bf16>(&[3, 30], &[40, 31], (2, 1, 64), windowed, device);
    assert!(err < 1e-2, "bf16 chunked varlen: {err}");
}

/// `contiguous()` of views on CUDA (2-, 4- and 8-byte elements) runs the strided-copy
/// kernel and gives the CPU's copy of the same view.
#[test]
fn views_are_made_contiguous_on_the_device() {
    let Some(d) = gpu() else { return };
    for dtype in [DType::F16, DType::Bf16, DType::F32, DType::F64] {
        let values = random(2 * 3 * 5 * 7);
        let host = Tensor::from_f64(&values, &[2, 3, 5, 7], dtype, Device::Cpu).unwrap();
        let device = host.to_device(Device::Cuda(d)).unwrap();
        let view = |t: &Tensor| {
            t.permute(&[3, 1, 0, 2])
                .unwrap()
                .narrow(0, 2, 4)
                .unwrap()
                .select(2, 1)
                .unwrap()
        };
        let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        let copy = view(&device).contiguous().unwrap();
        let lines = capture.take();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("strided_copy") && l.contains("on the device")),
            "{dtype}: {lines:?}"
        );
        assert!(copy.is_contiguous() && copy.offset() == 0);
        assert_eq!(
            copy.to_f64().unwrap(),
            view(&host).to_f64().unwrap(),
            "{dtype}"
        );
    }
}

#[test]
fn math_runs_on_the_device_with_the_hosts_dropout() {
    let Some(d) = gpu() else { return };
    let _ieee = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
    for (dtype, bound) in [(DType::F32, 1e-5), (DType::F16, 1e-3), (DType::Bf16, 1e-2)] {
        let err = common::device_math_error(Device::Cuda(d), dtype);
        assert!(err < bound, "{dtype} math on CUDA vs the CPU: {err:e}");
    }
    // Dropout: the same generator state drops the same weights as the host's math path.
    let shape = [1, 2, 33, 16];
    let inputs: Vec<Vec<f64>> = (0..3).map(|_| random(shape.iter().product())).collect();
    let on = |device| -> Vec<Tensor> {
        inputs
            .iter()
            .map(|x| Tensor::from_f64(x, &shape, DType::F32, device).unwrap())
            .collect()
    };
    let (gpu_in, cpu_in) = (on(Device::Cuda(d)), on(Device::Cpu));
    let _math = backends::attention::sdpa_kernel_scoped(&[SdpBackend::Math], false);
    let (device_generator, host_generator) =
        (backends::Generator::new(11), backends::Generator::new(11));
    let options = |generator| SdpaOptions {
        dropout_p: 0.25,
        generator: Some(generator),
        ..Default::default()
    };
    let run = |t: &[Tensor], generator| {
        sdpa(&t[0], &t[1], &t[2], &options(generator))
            .unwrap()
            .output
            .to_f64()
            .unwrap()
    };
    let (device, host) = (
        run(&gpu_in, &device_generator),
        run(&cpu_in, &host_generator),
    );
    let err = rel_err(&device, &host);
    assert!(err < 1e-5, "math with dropout on CUDA vs the host: {err:e}");
}

#[test]
fn fused_dropout_drops_the_weights_the_host_math_path_drops() {
    let Some(d) = gpu() else { return };
    let shape = [1, 2, 70, 64];
    let n: usize = shape.iter().product();
    for (backend, dtype, bound) in [
        (SdpBackend::Flash, DType::Bf16, 1e-2),
        (SdpBackend::MemEfficient, DType::F32, 2e-5),
    ] {
        let inputs: Vec<Vec<f64>> = (0..3).map(|_| random(n)).collect();
        let on = |device| {
            inputs
                .iter()
                .map(|x| Tensor::from_f64(x, &shape, dtype, device).unwrap())
                .collect::<Vec<_>>()
        };
        let (gpu_in, cpu_in) = (on(Device::Cuda(d)), on(Device::Cpu));
        // Two generators at one seed: a generator advances with each draw, so the two calls
        // draw the same weights only from generators in the same state.
        let (device_generator, host_generator) =
            (backends::Generator::new(7), backends::Generator::new(7));
        let options = |generator| SdpaOptions {
            dropout_p: 0.3,
            generator: Some(generator),
            ..Default::default()
        };
        let fused = {
            let _only = backends::attention::sdpa_kernel_scoped(&[backend], false);
            let out = sdpa(
                &gpu_in[0],
                &gpu_in[1],
                &gpu_in[2],
                &options(&device_generator),
            )
            .unwrap();
            assert_eq!(out.backend, backend);
            out.output.to_f64().unwrap()
        };
        let math = sdpa(
            &cpu_in[0],
            &cpu_in[1],
            &cpu_in[2],
            &options(&host_generator),
        )
        .unwrap()
        .output
        .to_f64()
        .unwrap();
        let err = rel_err(&fused, &math);
        assert!(
            err < bound,
            "{backend} with dropout vs math on the host: {err}"
        );
        let plain = sdpa(&cpu_in[0], &cpu_in[1], &cpu_in[2], &SdpaOptions::default())
            .unwrap()
            .output
            .to_f64()
            .unwrap();
        assert!(
            rel_err(&fused, &plain) > 0.1,
            "{backend}: dropout changed nothing"
        );
    }
}

/// What a GPU older than the tensor-core tier runs: the SIMT kernels built for it (IEEE
/// fp32 GEMM, memory-efficient attention in f32/f16) from its cubin (sm_75) or its tier's
/// PTX (sm_70), and the math fallback where no built kernel serves it (flash, bf16),
/// instead of a kernel that fails to load. Without a GPU, on the interpreter posing as a
/// T4 and a V100.
#[test]
fn older_gpus_run_the_kernels_built_for_them_and_fall_back_for_the_rest() {
    const NAME: &str = "older_gpus_run_the_kernels_built_for_them_and_fall_back_for_the_rest";
    if cuda::device_count() == 0 {
        if backends::kernels::cuda_code() == backends::kernels::CudaCode::None {
            eprintln!("skipped: no CUDA kernels in this build (no PTX, no NVRTC)");
            return;
        }
        for arch in ["75", "70"] {
            let vars = [
                ("BACKENDS_CUDA_INTERPRET", "1"),
                ("BACKENDS_CUDA_INTERPRET_ARCH", arch),
            ];
            // In the child the interpreted device exists, so the test runs below.
            common::in_child(NAME, &vars);
        }
        return;
    }
    let (major, minor) = cuda::get_device_capability(0).unwrap();
    let sm = major * 10 + minor;
    if sm >= 80 {
        eprintln!("skipped: cuda:0 is sm_{sm}; this test is for GPUs older than sm_80");
        return;
    }
    let images: std::collections::HashMap<_, _> = cuda::loader::images(0).into_iter().collect();
    let gemm_image = &images[&backends::kernels::Family::Gemm];
    if cuda::get_device_name(0).is_some_and(|n| n.starts_with("PTX interpreter")) {
        assert_eq!(gemm_image, "PTX compute_70 (interpreted)");
    } else if backends::kernels::CUBIN_ARCHS_BUILT.contains(&sm) {
        assert_eq!(gemm_image, &format!("cubin sm_{sm}"));
    } else {
        assert_eq!(gemm_image, "PTX compute_70");
    }
    assert!(
        images[&backends::kernels::Family::FlashFwd].contains("no kernel"),
        "{images:?}"
    );
    let _b = cuda::PREFERRED_BLAS.guard_scoped(BlasBackend::Default);
    let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
    for size in [(7, 7, 7), (63, 129, 65), (8, 8, 4000)] {
        let err = matmul_error(0, DType::F32, size);
        assert!(err < 1e-5, "sm_{sm} ieee {size:?}: {err}");
    }
    for dtype in [DType::F16, DType::F32] {
        let causal = Some(CausalVariant::UpperLeft);
        let (err, backend) = attention_error(
            0,
            dtype,
            [1, 2, 2, 33, 40, 64],
            causal,
            Window::UNBOUNDED,
            None,
        );
        assert_eq!(backend, SdpBackend::MemEfficient, "sm_{sm} {dtype}");
        assert!(err < 1e-2, "sm_{sm} {dtype}: {err}");
    }
    // bf16 kernels need sm_80: math serves, on the host.
    let (err, backend) = attention_error(
        0,
        DType::Bf16,
        [1, 2, 2, 17, 17, 64],
        None,
        Window::UNBOUNDED,
        None,
    );
    assert_eq!(backend, SdpBackend::Math, "sm_{sm} bf16");
    assert!(err < 1e-2, "sm_{sm} bf16: {err}");
}

/// Without a GPU, every test of this file runs again on the PTX interpreter, through the
/// real launchers.
#[test]
fn without_a_gpu_the_cuda_tests_run_on_the_interpreted_device() {
    let Some((passed, skipped)) = common::cuda::rerun_on_the_interpreter() else {
        return;
    };
    // Every test ran its kernels there, but this one (which has nothing to rerun inside the
    // rerun) and the older-GPU one, whose own children run at the older levels.
    assert!(
        passed >= 16 && skipped <= 1,
        "{passed} passed, {skipped} skipped"
    );
}

/// Without a GPU, every test of this file runs again through the CUDA driver API, as on a
/// GPU (cudarc's contexts, streams, events, copies, module loads and launches), with a
/// `libcuda.so` whose device is the PTX interpreter (`backends-ptx-driver`, as `sm_100`).
#[test]
fn without_a_gpu_the_cuda_tests_run_through_the_driver_api() {
    let Some((passed, skipped)) = common::cuda::rerun_through_the_driver_api() else {
        return;
    };
    // As on the interpreted device; the older-GPU test skips (the device is sm_100).
    assert!(
        passed >= 17 && skipped <= 1,
        "{passed} passed, {skipped} skipped"
    );
}

/// conv2d through the generated implicit-GEMM and bias kernels (pointwise ones through the
/// plain GEMM), in every dtype CUDA convolves, with `cudnn.allow_tf32` choosing the fp32
/// GEMM's mode as in PyTorch.
#[test]
fn conv2d_runs_the_generated_kernels_under_cudnn_allow_tf32() {
    use common::conv::{BASE, Case, bound, cases, check_on};
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    let _ieee = backends::cudnn::ALLOW_TF32.guard_scoped(false);
    // On a GPU with cuDNN loadable, cuDNN would convolve.
    let _generated = backends::cudnn::ENABLED.guard_scoped(false);
    // The small cases (the interpreter runs every thread of every launch).
    for case in cases()
        .into_iter()
        .filter(|c| c.n * c.c * c.hw[0] * c.hw[1] < 2000)
    {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let err = check_on(&case, dtype, device);
            assert!(err < bound(dtype), "cuda {dtype} {case:?}: {err:e}");
        }
    }
    // The kernels the trace names: the implicit GEMM (split over K where the output alone
    // is too small for the device: 64 channels x 3 x 3 deep, 4 x 16 outputs), and the plain
    // GEMM for a pointwise convolution.
    let deep = Case {
        n: 1,
        c: 64,
        o: 4,
        hw: [4, 4],
        padding: backends::conv::Padding::Same,
        ..BASE
    };
    let pointwise = Case { k: [1, 1], ..BASE };
    for (case, kernel) in [
        (deep, "conv_gemm_"),
        (BASE, "conv_gemm_"),
        (pointwise, ",gemm_"),
    ] {
        for dtype in [DType::F32, DType::Bf16] {
            let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
            let capture = backends::TraceCapture::start();
            let err = check_on(&case, dtype, device);
            let lines = capture.take();
            assert!(err < bound(dtype), "cuda {dtype} {case:?}: {err:e}");
            let gemm = lines.iter().find(|l| l.contains(kernel));
            assert!(gemm.is_some(), "{kernel} {dtype}: {lines:?}");
            let split = gemm.is_some_and(|l| l.contains("split-K x"));
            assert_eq!(split, case.c == 64, "{lines:?}");
        }
    }
    let case = Case {
        c: 16,
        o: 16,
        hw: [6, 6],
        ..BASE
    };
    let ieee = check_on(&case, DType::F32, device);
    let tf32 = {
        let _tf32 = backends::cudnn::ALLOW_TF32.guard_scoped(true);
        // matmul's own flag does not steer convolutions.
        let _matmul = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        let err = check_on(&case, DType::F32, device);
        let lines = capture.take();
        assert!(
            lines
                .iter()
                .any(|l| l.contains(",conv2d,") && l.contains("tf32 (cudnn.allow_tf32)")),
            "{lines:?}"
        );
        err
    };
    assert!(ieee < 1e-5, "ieee {ieee:e}");
    assert!(
        tf32 > 10.0 * ieee && tf32 < 1e-2,
        "tf32 {tf32:e} vs ieee {ieee:e}"
    );
    let x = Tensor::from_f64(&random(2 * 3 * 4 * 4), &[2, 3, 4, 4], DType::F64, device).unwrap();
    let w = Tensor::from_f64(&random(4 * 3 * 9), &[4, 3, 3, 3], DType::F64, device).unwrap();
    let err = backends::conv2d(&x, &w, &Default::default()).unwrap_err();
    assert!(
        err.to_string().contains("move f64 inputs to the CPU"),
        "{err}"
    );
    let x = Tensor::from_f64(&random(2 * 3 * 4 * 4), &[2, 3, 4, 4], DType::F32, device).unwrap();
    let w = Tensor::from_f64(&random(4 * 3 * 9), &[4, 3, 3, 3], DType::F32, device).unwrap();
    let choice = backends::conv::explain(&x, &w, &Default::default()).unwrap();
    assert_eq!(choice.lowering, "implicit gemm");
    assert!(
        choice.precision.contains("ieee (cudnn.allow_tf32 off)"),
        "{choice:?}"
    );
    assert!(choice.libraries.contains("cudnn"), "{choice:?}");
}

/// Split-KV decoding on CUDA: the memory-efficient kernel computes the key chunks as the
/// sequences of one packed call and the generated combine kernel merges them (f32, and bf16
/// with flash turned off so that the memory-efficient kernel serves).
#[test]
fn split_kv_decoding_combines_the_chunks() {
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    common::serving::split_kv_decoding_matches(device, &[DType::F32], false);
    common::serving::split_kv_paged_decoding_matches(device);
    // bf16 under the default selection: flash, which splits on its grid's third axis.
    common::serving::split_kv_decoding_matches(device, &[DType::Bf16], true);
    let _no_flash = backends::attention::sdpa_kernel_scoped(&[SdpBackend::MemEfficient], false);
    common::serving::split_kv_decoding_matches(device, &[DType::Bf16], false);
}

/// Flash splits the keys of a batched decoding call too (each chunk a slice of the grid),
/// on tensors whose rows start 16-byte aligned (its tiles copied 16 bytes at a time) and on
/// views one element off (element by element); memory-efficient attention reads both
/// unsplit.
#[test]
fn decoding_reads_aligned_and_unaligned_views_and_flash_splits_batches() {
    let Some(d) = gpu() else { return };
    let device = Device::Cuda(d);
    let (b, h, lk, dim) = (3, 4, 1500, 128);
    for (shift, backend) in [
        (0, SdpBackend::Flash),
        (1, SdpBackend::Flash),
        (0, SdpBackend::MemEfficient),
        (1, SdpBackend::MemEfficient),
    ] {
        let _only = backends::attention::sdpa_kernel_scoped(&[backend], false);
        // Grouped-query heads for flash (memory-efficient attention refuses them).
        let hk = if backend == SdpBackend::Flash { 2 } else { h };
        // Each operand a view `shift` elements into a flat buffer.
        let held = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let values = random(n + shift);
            let flat = Tensor::from_f64(&values, &[n + shift], DType::Bf16, device).unwrap();
            let view = flat.narrow(0, shift, n).unwrap().reshape(shape).unwrap();
            let rounded = flat.to_f64().unwrap()[shift..].to_vec();
            (view, rounded)
        };
        let (q, qh) = held(&[b, h, 1, dim]);
        let (k, kh) = held(&[b, hk, lk, dim]);
        let (v, vh) = held(&[b, hk, lk, dim]);
        assert_eq!(q.offset(), shift);
        let options = SdpaOptions {
            enable_gqa: hk != h,
            ..Default::default()
        };
        let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        let out = sdpa(&q, &k, &v, &options).unwrap();
        let lines = capture.take();
        assert_eq!(out.backend, backend);
        assert_eq!(
            lines.iter().any(|l| l.contains("(split-KV)")),
            backend == SdpBackend::Flash,
            "{backend} shift {shift}: {lines:?}"
        );
        let want = attention_reference(
            &qh,
            &kh,
            &vh,
            [b, h, hk, 1, lk, dim, dim],
            1.0 / (dim as f64).sqrt(),
            None,
            &|_, _, _, _| 0.0,
        );
        let err = rel_err(&out.output.to_f64().unwrap(), &want);
        assert!(err < 1e-2, "{backend} shift {shift}: {err}");
    }
}
