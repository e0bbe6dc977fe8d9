//! Helpers of the tests run on a CUDA device (tests/cuda.rs, tests/cuda_libraries.rs):
//! device 0 or the reason there is none, tensors with the values their dtype holds, and
//! `matmul` and attention against the float64 references.

use backends::attention::SdpBackend;
use backends::{CausalVariant, DType, Device, SdpaOptions, Tensor, Window, cuda, matmul, sdpa};

use super::{attention_reference, random, reference, rel_err};

/// Device 0, or `None` after printing why not.
pub fn gpu() -> Option<usize> {
    if cuda::device_count() == 0 {
        eprintln!(
            "skipped: no CUDA device ({})",
            cuda::unavailable_reason().unwrap_or("the driver reports none")
        );
        return None;
    }
    Some(0)
}

/// `values` in `dtype` on `device`, and the values as that dtype holds them.
pub fn tensor(values: &[f64], shape: &[usize], dtype: DType, device: Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_f64(values, shape, dtype, device).unwrap();
    let held = Tensor::from_f64(values, shape, dtype, Device::Cpu)
        .unwrap()
        .to_f64()
        .unwrap();
    (t, held)
}

/// The relative error of `matmul` on device `d` for `(m, n, k)` in `dtype`.
pub fn matmul_error(d: usize, dtype: DType, (m, n, k): (usize, usize, usize)) -> f64 {
    let (a, a_held) = tensor(&random(m * k), &[m, k], dtype, Device::Cuda(d));
    let (b, b_held) = tensor(&random(k * n), &[k, n], dtype, Device::Cuda(d));
    let c = matmul(&a, &b).unwrap();
    assert_eq!(c.device(), Device::Cuda(d));
    let got = c.to_f64().unwrap();
    assert!(got.iter().all(|x| x.is_finite()), "unwritten outputs");
    rel_err(&got, &reference(&a_held, &b_held, m, n, k))
}

/// Attention on device `d` against the f64 reference: (relative error, backend).
#[allow(clippy::too_many_arguments)]
pub fn attention_error(
    d: usize,
    dtype: DType,
    [b, h, hk, lq, lk, dim]: [usize; 6],
    causal: Option<CausalVariant>,
    window: Window,
    mask: Option<DType>,
) -> (f64, SdpBackend) {
    let device = Device::Cuda(d);
    let (q, qh) = tensor(&random(b * h * lq * dim), &[b, h, lq, dim], dtype, device);
    let (k, kh) = tensor(&random(b * hk * lk * dim), &[b, hk, lk, dim], dtype, device);
    let (v, vh) = tensor(&random(b * hk * lk * dim), &[b, hk, lk, dim], dtype, device);
    let keep: Vec<bool> = (0..lq * lk).map(|e| e % 3 != 1 || e % lk == 0).collect();
    let (additive, additive_held) = tensor(&random(lq * lk), &[lq, lk], dtype, device);
    let mask_tensor = match mask {
        Some(DType::Bool) => Some(Tensor::from_bools(&keep, &[lq, lk], device).unwrap()),
        Some(_) => Some(additive),
        None => None,
    };
    let options = SdpaOptions {
        attn_mask: mask_tensor.as_ref(),
        is_causal: causal.is_some(),
        causal_variant: causal.unwrap_or_default(),
        window,
        enable_gqa: h != hk,
        ..Default::default()
    };
    let out = sdpa(&q, &k, &v, &options).unwrap();
    let variant = causal.unwrap_or_default();
    let bias = |_: usize, _: usize, i: usize, j: usize| match mask {
        _ if super::window_hides(window, variant, (lq, lk), i, j) => f64::NEG_INFINITY,
        Some(DType::Bool) if !keep[i * lk + j] => f64::NEG_INFINITY,
        Some(DType::Bool) | None => 0.0,
        Some(_) => additive_held[i * lk + j],
    };
    let want = attention_reference(
        &qh,
        &kh,
        &vh,
        [b, h, hk, lq, lk, dim, dim],
        1.0 / (dim as f64).sqrt(),
        causal,
        &bias,
    );
    let got = out.output.to_f64().unwrap();
    assert!(got.iter().all(|x| x.is_finite()), "unwritten outputs");
    (rel_err(&got, &want), out.backend)
}

/// Whether cuDNN can serve on cuda:0, after printing why not.
pub fn cudnn_loadable() -> bool {
    if cuda::get_device_name(0).is_some_and(|n| n.starts_with("PTX interpreter")) {
        eprintln!("skipped: cuDNN runs on a GPU of the driver, not on the PTX interpreter");
        return false;
    }
    let loadable = backends::cudnn::version().is_some_and(|v| v >= 90000);
    if !loadable {
        eprintln!("skipped: cuDNN 9 is not loadable (put libcudnn.so.9 on LD_LIBRARY_PATH)");
    }
    loadable
}

/// Without a GPU: runs this test binary again on the PTX interpreter
/// (`BACKENDS_CUDA_INTERPRET=1`, in a child process: the device list is read once per
/// process), asserts that it passed and returns its counts of passed tests and `skipped:`
/// lines. `None` where there is a GPU (the tests ran on it) or no CUDA kernels in the build.
pub fn rerun_on_the_interpreter() -> Option<(usize, usize)> {
    rerun_without_a_gpu("on the interpreter", &[("BACKENDS_CUDA_INTERPRET", "1")])
}

/// Without a GPU: runs this test binary again through the CUDA driver API, as on a GPU
/// (cudarc's calls, streams, events, copies, module loads and launches), with
/// `backends-ptx-driver` as the driver library: a `libcuda.so` whose device is the PTX
/// interpreter. As [`rerun_on_the_interpreter`] otherwise; also `None` where that library
/// is not built (`cargo test --workspace` builds it).
pub fn rerun_through_the_driver_api() -> Option<(usize, usize)> {
    if cuda::device_count() > 0 {
        return None;
    }
    if !cfg!(target_os = "linux") {
        eprintln!("skipped: the interpreter's driver library is built for Linux only");
        return None;
    }
    // The test binary is target/<profile>/deps/<name>; the library is built beside it.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let Some(library) = [deps, deps.parent().unwrap()]
        .into_iter()
        .map(|dir| dir.join("libbackends_ptx_driver.so"))
        .find(|path| path.exists())
    else {
        eprintln!(
            "skipped: libbackends_ptx_driver.so is not built (`cargo build -p \
             backends-ptx-driver`, or run `cargo test --workspace`)"
        );
        return None;
    };
    // A folder where the library is libcuda, first on the library path of the child.
    let folder = deps.join(format!("ptx-driver-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = folder.join(name);
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&library, &link).unwrap();
    }
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(rest) if !rest.is_empty() => format!("{}:{rest}", folder.display()),
        _ => folder.display().to_string(),
    };
    let counts = rerun_without_a_gpu(
        "through the driver API",
        &[("LD_LIBRARY_PATH", &path), ("BACKENDS_CUDA_INTERPRET", "0")],
    );
    let _ = std::fs::remove_dir_all(&folder);
    counts
}

/// Runs this test binary again with `vars`, where they give it a device, and returns the
/// child's counts of passed tests and `skipped:` lines after asserting that it passed.
fn rerun_without_a_gpu(how: &str, vars: &[(&str, &str)]) -> Option<(usize, usize)> {
    if cuda::device_count() > 0 {
        return None;
    }
    if backends::kernels::cuda_code() == backends::kernels::CudaCode::None {
        eprintln!("skipped: no CUDA kernels in this build (no PTX, no NVRTC)");
        return None;
    }
    let (passed, log) = super::rerun(&["--test-threads=2", "--nocapture"], vars);
    assert!(passed, "{how}:\n{log}");
    let skipped = log.lines().filter(|l| l.starts_with("skipped:")).count();
    let passed = log
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum();
    eprintln!("{how}: {passed} passed, {skipped} skipped");
    Some((passed, skipped))
}
