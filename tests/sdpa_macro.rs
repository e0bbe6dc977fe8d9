//! `#[sdpa_kernel]` at run time: only the listed backends serve inside, the state comes
//! back after return, `?` and panic, scopes nest, `causal` sets the default, and a pinned
//! variant runs (checking only its backend) with the same numbers as a plain selection.
//!
//! The attribute's settings are thread-scoped (an async fn's follow its future), so the tests
//! here run in parallel with each other; one of them hammers that from 8 threads.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use backends::attention::{SdpBackend, pinned, selected_backend};
use backends::cuda::{flash_sdp_enabled, math_sdp_enabled, mem_efficient_sdp_enabled};
use backends::sdpa::params;
use backends::{Device, Error, Result, SdpaOptions, Tensor, sdpa, sdpa_kernel};
use common::{adapter, attention_reference, random, rel_err};

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
        Some(backends::CausalVariant::UpperLeft),
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
        None,
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

/// The backend that served a small CPU call and the `is_causal` default, in this scope.
fn served(q: &Tensor) -> (SdpBackend, bool) {
    let options = SdpaOptions::default();
    (sdpa(q, q, q, &options).unwrap().backend, options.is_causal)
}

#[sdpa_kernel(math, device = cpu)]
fn served_by_math(q: &Tensor) -> (SdpBackend, bool) {
    served(q)
}

#[sdpa_kernel(flash, math, causal, device = cpu)]
fn served_causal_flash(q: &Tensor) -> (SdpBackend, bool) {
    served(q)
}

#[sdpa_kernel(math, flash, set_priority, causal, device = cpu)]
fn served_math_first(q: &Tensor) -> (SdpBackend, bool) {
    served(q)
}

/// The process-wide SDPA state: enabled flags, priority order, causal default, pin.
fn process_state() -> String {
    format!(
        "{:?} {} {} {:?}",
        flags(),
        backends::cuda::sdp_priority_order(),
        SdpaOptions::default().is_causal,
        pinned()
    )
}

#[test]
fn annotated_calls_on_8_threads_see_only_their_own_settings() {
    let before = process_state();
    let deadline = Instant::now() + Duration::from_secs(2);
    let calls: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                scope.spawn(move || {
                    let (q, _) = qkv(4, 8, Device::Cpu);
                    let mut n = 0;
                    while Instant::now() < deadline {
                        // Each thread starts the cycle at another place, so that every kind of
                        // call overlaps every other kind.
                        match (t + n) % 4 {
                            0 => assert_eq!(served_by_math(&q[0]), (SdpBackend::Math, false)),
                            1 => assert_eq!(served_causal_flash(&q[0]), (SdpBackend::Flash, true)),
                            2 => assert_eq!(served_math_first(&q[0]), (SdpBackend::Math, true)),
                            _ => {
                                assert_eq!(served(&q[0]), (SdpBackend::Flash, false));
                                assert_eq!(pinned(), None);
                            }
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert!(calls >= 8 * 4, "only {calls} calls ran");
    assert_eq!(process_state(), before);
}

#[sdpa_kernel(math, device = cpu)]
fn inner_math_after_outer(q: &Tensor) -> (SdpBackend, bool) {
    served(q)
}

#[sdpa_kernel(flash, math, causal, device = cpu)]
fn outer_around_a_panicking_inner(q: &Tensor) -> [(SdpBackend, bool); 3] {
    let first = served(q);
    let inner = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        inner_math_after_outer(q);
        panics();
    }));
    assert!(inner.is_err());
    // The inner scopes ended with the panic: the outer one decides again.
    [first, inner_math_after_outer(q), served(q)]
}

#[test]
fn nested_scopes_survive_a_panic_inside() {
    let (q, _) = qkv(4, 8, Device::Cpu);
    let before = process_state();
    assert_eq!(
        outer_around_a_panicking_inner(&q[0]),
        [
            (SdpBackend::Flash, true),
            (SdpBackend::Math, false),
            (SdpBackend::Flash, true)
        ]
    );
    assert_eq!(process_state(), before);
}

/// Returns `Pending` once (waking itself), then `Ready`: an await point where the future
/// can move to another thread.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[sdpa_kernel(math, set_priority, causal, device = cpu)]
async fn served_across_an_await(
    q: Tensor,
) -> Result<[(SdpBackend, bool, std::thread::ThreadId); 2]> {
    let (backend, causal) = served(&q);
    let before = (backend, causal, std::thread::current().id());
    YieldOnce(false).await;
    let (backend, causal) = served(&q);
    let options = SdpaOptions::default();
    // `?` inside the async body returns the function's own error type.
    sdpa(&q, &q, &q, &options)?;
    Ok([before, (backend, causal, std::thread::current().id())])
}

#[test]
fn an_async_fn_keeps_its_settings_across_threads_and_only_while_polled() {
    let (q, _) = qkv(4, 8, Device::Cpu);
    let mut future = Box::pin(served_across_an_await(q[0].clone()));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(future.as_mut().poll(&mut cx).is_pending());
    // Between polls the settings are not in force on the thread that polled.
    assert_eq!(served(&q[0]), (SdpBackend::Flash, false));
    let (done, second) = std::thread::spawn(move || {
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(done) = future.as_mut().poll(&mut cx) else {
            panic!("the second poll finishes")
        };
        (done.unwrap(), std::thread::current().id())
    })
    .join()
    .unwrap();
    let first = std::thread::current().id();
    assert_ne!(first, second);
    assert_eq!(
        done,
        [
            (SdpBackend::Math, true, first),
            (SdpBackend::Math, true, second)
        ]
    );
    assert_eq!(served(&q[0]), (SdpBackend::Flash, false));
}
