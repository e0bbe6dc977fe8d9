//! `#[sdpa_kernel]` at run time: only the listed backends serve inside, the state comes
//! back after return, `?` and panic, scopes nest, `causal` sets the default, and a pinned
//! variant runs (checking only its backend) with the same numbers as a plain selection.
//!
//! The attribute sets process-wide flags, as PyTorch's `sdpa_kernel` does, so the tests in
//! this file take one lock each.

mod common;

use std::sync::Mutex;

use backends::attention::{SdpBackend, pinned, selected_backend};
use backends::cuda::{flash_sdp_enabled, math_sdp_enabled, mem_efficient_sdp_enabled};
use backends::sdpa::params;
use backends::{Device, Error, Result, SdpaOptions, Tensor, sdpa, sdpa_kernel};
use common::{adapter, attention_reference, random, rel_err};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Random `[1, 2, l, d]` q, k, v on `device`, with their f64 values.
fn qkv(l: usize, d: usize, device: Device) -> ([Tensor; 3], [Vec<f64>; 3]) {
    let values = [random(2 * l * d), random(2 * l * d), random(2 * l * d)];
    let tensors = values.clone().map(|v| {
        let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v32, &[1, 2, l, d], device).unwrap()
    });
    (tensors, values)
}

fn flags() -> [bool; 3] {
    [
        flash_sdp_enabled(),
        mem_efficient_sdp_enabled(),
        math_sdp_enabled(),
    ]
}

#[sdpa_kernel(math, device = cpu)]
fn only_math(q: &Tensor) -> Result<SdpBackend> {
    assert_eq!(flags(), [false, false, true]);
    selected_backend(&params(q, q, q, &SdpaOptions::default()))
}

#[sdpa_kernel(flash, math, device = cpu)]
fn flash_then_math(q: &Tensor, dropout_p: f64) -> Result<SdpBackend> {
    let options = SdpaOptions {
        dropout_p,
        ..SdpaOptions::default()
    };
    Ok(sdpa(q, q, q, &options)?.backend)
}

#[test]
fn only_the_listed_backends_serve_inside() {
    let _s = serial();
    let (q, _) = qkv(8, 16, Device::Cpu);
    assert_eq!(only_math(&q[0]).unwrap(), SdpBackend::Math);
    assert_eq!(
        flash_then_math(&q[0], 0.0).unwrap(),
        SdpBackend::Flash,
        "CPU flash serves f32 without dropout"
    );
    assert_eq!(
        flash_then_math(&q[0], 0.2).unwrap(),
        SdpBackend::Math,
        "dropout rules CPU flash out"
    );
    assert_eq!(flags(), [true, true, true]);
}

/// Checked against CUDA's rules (the default), called with CPU tensors.
#[sdpa_kernel(mem_efficient)]
fn nothing_can_serve(q: &Tensor) -> Result<Tensor> {
    let out = sdpa(q, q, q, &SdpaOptions::default())?;
    Ok(out.output)
}

#[sdpa_kernel(math, set_priority, device = cpu)]
fn panics() {
    assert!(!flash_sdp_enabled());
    panic!("on purpose");
}

#[test]
fn the_state_comes_back_after_return_question_mark_and_panic() {
    let _s = serial();
    let (q, _) = qkv(4, 8, Device::Cpu);
    let before = backends::cuda::sdp_priority_order();
    let err = nothing_can_serve(&q[0]).unwrap_err();
    let Error::NoAvailableKernel { reasons } = &err else {
        panic!("{err}")
    };
    assert_eq!(reasons.len(), 1, "only mem-efficient was enabled: {err}");
    assert_eq!(flags(), [true, true, true], "after ?");
    let caught = std::panic::catch_unwind(panics);
    assert!(caught.is_err());
    assert_eq!(flags(), [true, true, true], "after a panic");
    assert_eq!(backends::cuda::sdp_priority_order(), before);
}

#[sdpa_kernel(flash, math, set_priority, causal, device = cpu)]
fn outer(q: &Tensor) -> Result<(SdpBackend, SdpBackend, bool)> {
    let inner = only_math(q)?;
    // Back from the inner scope: flash and math again, causal by default.
    assert_eq!(flags(), [true, false, true]);
    let here = selected_backend(&params(q, q, q, &SdpaOptions::default()))?;
    Ok((inner, here, SdpaOptions::default().is_causal))
}

#[test]
fn scopes_nest_and_causal_is_the_default_inside() {
    let _s = serial();
    let (q, _) = qkv(8, 16, Device::Cpu);
    let (inner, here, causal) = outer(&q[0]).unwrap();
    assert_eq!(
        (inner, here, causal),
        (SdpBackend::Math, SdpBackend::Flash, true)
    );
    assert!(!SdpaOptions::default().is_causal);
}

#[sdpa_kernel(flash, dtype = f32, head_dim = 32, causal, device = cpu)]
fn pinned_cpu(q: &[Tensor; 3]) -> Result<backends::SdpaOutput> {
    assert!(pinned().is_some());
    sdpa(&q[0], &q[1], &q[2], &SdpaOptions::default())
}

#[test]
fn a_pinned_cpu_variant_runs_and_matches_the_selected_path() {
    let _s = serial();
    let (t, v) = qkv(33, 32, Device::Cpu);
    let _verbose = backends::mkl::verbose(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    let out = pinned_cpu(&t).unwrap();
    let lines = capture.take();
    assert!(
        lines.len() == 1 && lines[0].contains("pinned by #[sdpa_kernel]"),
        "{lines:?}"
    );
    let plain = SdpaOptions {
        is_causal: true,
        ..SdpaOptions::default()
    };
    let again = sdpa(&t[0], &t[1], &t[2], &plain).unwrap();
    assert!(!capture.take()[0].contains("pinned"));
    assert_eq!(out.backend, SdpBackend::Flash);
    assert_eq!(
        out.output.to_vec::<f32>().unwrap(),
        again.output.to_vec::<f32>().unwrap()
    );
    let reference = attention_reference(
        &v[0],
        &v[1],
        &v[2],
        [1, 2, 2, 33, 33, 32, 32],
        1.0 / 32f64.sqrt(),
        true,
        &|_, _, _, _| 0.0,
    );
    let got: Vec<f64> = out
        .output
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    assert!(rel_err(&got, &reference) < 1e-5);
}

#[sdpa_kernel(flash, dtype = f32, head_dim = 16, device = cpu)]
fn pinned_but_called_with_dropout(q: &Tensor) -> Result<Tensor> {
    let options = SdpaOptions {
        dropout_p: 0.5,
        ..SdpaOptions::default()
    };
    Ok(sdpa(q, q, q, &options)?.output)
}

#[test]
fn a_pinned_call_reports_only_its_backend() {
    let _s = serial();
    let (q, _) = qkv(4, 16, Device::Cpu);
    let err = pinned_but_called_with_dropout(&q[0]).unwrap_err();
    let Error::NoAvailableKernel { reasons } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        reasons,
        &[(
            SdpBackend::Flash,
            vec![backends::attention::Reason::Dropout(0.5)]
        )]
    );
}

#[sdpa_kernel(flash, dtype = f32, head_dim = 64, device = wgpu)]
fn pinned_wgpu(q: &[Tensor; 3]) -> Result<backends::SdpaOutput> {
    let pin = pinned().expect("pinned");
    assert!(pin.entry().is_some_and(|e| e.wgsl.is_some()));
    sdpa(&q[0], &q[1], &q[2], &SdpaOptions::default())
}

#[test]
fn a_pinned_wgpu_variant_runs_its_table_entry() {
    let _s = serial();
    let Some(device) = adapter() else { return };
    let (t, v) = qkv(17, 64, device);
    let out = pinned_wgpu(&t).unwrap();
    assert_eq!(out.backend, SdpBackend::Flash);
    let reference = attention_reference(
        &v[0],
        &v[1],
        &v[2],
        [1, 2, 2, 17, 17, 64, 64],
        0.125,
        false,
        &|_, _, _, _| 0.0,
    );
    let got: Vec<f64> = out
        .output
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    assert!(rel_err(&got, &reference) < 1e-5);
}
