//! Valid uses of `#[sdpa_kernel]` on free functions, methods and async functions.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use backends::attention::{SdpBackend, pinned};
use backends::cuda::flash_sdp_enabled;
use backends::{CausalVariant, Device, Result, SdpaOptions, Tensor, sdpa, sdpa_kernel};

#[sdpa_kernel(flash, causal)]
fn on_cuda_rules() -> bool {
    SdpaOptions::default().is_causal
}

#[sdpa_kernel(efficient, math, set_priority, mask = float, dropout, dtype = f32)]
fn mem_efficient_with_a_bias() -> bool {
    flash_sdp_enabled()
}

#[sdpa_kernel(flash, dtype = bf16, head_dim = 128, causal)]
fn pinned_on_cuda() -> Option<u32> {
    pinned().map(|p| p.head_dim)
}

#[sdpa_kernel(flash, dtype = f16, head_dim = 96, device = wgpu)]
fn pinned_on_wgpu() -> bool {
    pinned().is_some_and(|p| p.entry().is_some_and(|e| e.wgsl.is_some()))
}

/// bf16 on wgpu runs the f32 kernels on widened copies: the pin names an f32 WGSL kernel.
#[sdpa_kernel(mem_efficient, dtype = bf16, head_dim = 64, device = wgpu)]
fn bf16_on_wgpu() -> bool {
    pinned().is_some_and(|p| p.entry().is_some_and(|e| e.wgsl.is_some()))
}

#[sdpa_kernel(cudnn, dtype = f16, head_dim = 256)]
fn cudnn_on_hopper() {}

#[sdpa_kernel(flash, math, mask = bool, dtype = f64, head_dim = 500, device = cpu)]
fn cpu_any_head_dim(q: &Tensor) -> Result<SdpBackend> {
    Ok(sdpa(q, q, q, &SdpaOptions::default())?.backend)
}

#[sdpa_kernel(flash, math, causal = lower_right, device = cpu)]
fn decoding_step(q: &Tensor, kv: &Tensor) -> Result<Vec<f32>> {
    let options = SdpaOptions::default();
    assert!(options.is_causal && options.causal_variant == CausalVariant::LowerRight);
    sdpa(q, kv, kv, &options)?.output.to_vec::<f32>()
}

#[sdpa_kernel(flash, dtype = f16, head_dim = 64, causal = lower_right, device = wgpu)]
fn pinned_lower_right() -> Option<Option<CausalVariant>> {
    pinned().map(|p| p.causal)
}

struct Model;

impl Model {
    #[sdpa_kernel(math)]
    fn forward(&self, q: &Tensor) -> Result<SdpBackend> {
        Ok(sdpa(q, q, q, &SdpaOptions::default())?.backend)
    }
}

#[sdpa_kernel(math, device = cpu)]
async fn attend_later(q: Tensor) -> Result<SdpBackend> {
    Ok(sdpa(&q, &q, &q, &SdpaOptions::default())?.backend)
}

fn main() {
    let q = Tensor::from_vec(vec![0.25f32; 2 * 4 * 8], &[1, 2, 4, 8], Device::Cpu).unwrap();
    assert!(on_cuda_rules());
    assert!(!SdpaOptions::default().is_causal);
    assert!(!mem_efficient_with_a_bias());
    assert!(flash_sdp_enabled());
    assert_eq!(pinned_on_cuda(), Some(128));
    assert!(pinned_on_wgpu());
    assert!(bf16_on_wgpu());
    assert_eq!(pinned_lower_right(), Some(Some(CausalVariant::LowerRight)));
    // One query against three keys, bottom-right: it sees all three (top-left: only the first).
    let one = Tensor::from_vec(vec![1f32, 0.0], &[1, 1, 1, 2], Device::Cpu).unwrap();
    let keys = Tensor::from_vec(vec![1f32, 0.0, 0.0, 1.0, 2.0, 2.0], &[1, 1, 3, 2], Device::Cpu)
        .unwrap();
    let out = decoding_step(&one, &keys).unwrap();
    assert!(out[0] > 1.0 && out[1] > 1.0, "{out:?}");
    assert_eq!(pinned(), None);
    cudnn_on_hopper();
    let q64 = Tensor::from_vec(vec![0.25f64; 2 * 4 * 8], &[1, 2, 4, 8], Device::Cpu).unwrap();
    assert_eq!(cpu_any_head_dim(&q64).unwrap(), SdpBackend::Flash);
    assert_eq!(Model.forward(&q).unwrap(), SdpBackend::Math);
    let mut future = pin!(attend_later(q));
    let done = future.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(matches!(done, Poll::Ready(Ok(SdpBackend::Math))));
}
