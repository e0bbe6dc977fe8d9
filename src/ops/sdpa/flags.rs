//! The SDPA backend switches of `torch.backends.cuda` and the metadata checks read.

use crate::core::flag::{Flag, FlagGuard, Guard};
use crate::core::sdp::{SdpBackend, SdpPriority};

/// Flash attention may serve SDPA calls.
pub static FLASH_SDP: Flag<bool> = Flag::new("cuda.flash_sdp_enabled", true, None);
/// Memory-efficient attention may serve SDPA calls.
pub static MEM_EFFICIENT_SDP: Flag<bool> = Flag::new("cuda.mem_efficient_sdp_enabled", true, None);
/// The math reference may serve SDPA calls.
pub static MATH_SDP: Flag<bool> = Flag::new("cuda.math_sdp_enabled", true, None);
/// cuDNN attention may serve SDPA calls.
pub static CUDNN_SDP: Flag<bool> = Flag::new("cuda.cudnn_sdp_enabled", true, None);
/// The math path may keep fp16/bf16 intermediates instead of upcasting to fp32.
pub static MATH_SDP_REDUCTION: Flag<bool> =
    Flag::new("cuda.fp16_bf16_reduction_math_sdp_allowed", false, None);
/// The order in which SDPA backends are tried.
pub static PRIORITY: Flag<SdpPriority> =
    Flag::new("cuda.sdp_priority_order", SdpPriority::DEFAULT, None);

/// The switch of one backend.
pub fn enabled_flag(backend: SdpBackend) -> &'static Flag<bool> {
    match backend {
        SdpBackend::Flash => &FLASH_SDP,
        SdpBackend::MemEfficient => &MEM_EFFICIENT_SDP,
        SdpBackend::Math => &MATH_SDP,
        SdpBackend::Cudnn => &CUDNN_SDP,
    }
}

/// Whether flash attention may be selected.
pub fn flash_sdp_enabled() -> bool {
    FLASH_SDP.get()
}

/// Enables or disables flash attention.
pub fn enable_flash_sdp(enabled: bool) {
    FLASH_SDP.set(enabled);
}

/// Whether memory-efficient attention may be selected.
pub fn mem_efficient_sdp_enabled() -> bool {
    MEM_EFFICIENT_SDP.get()
}

/// Enables or disables memory-efficient attention.
pub fn enable_mem_efficient_sdp(enabled: bool) {
    MEM_EFFICIENT_SDP.set(enabled);
}

/// Whether the math reference may be selected.
pub fn math_sdp_enabled() -> bool {
    MATH_SDP.get()
}

/// Enables or disables the math reference.
pub fn enable_math_sdp(enabled: bool) {
    MATH_SDP.set(enabled);
}

/// Whether cuDNN attention may be selected.
pub fn cudnn_sdp_enabled() -> bool {
    CUDNN_SDP.get()
}

/// Enables or disables cuDNN attention.
pub fn enable_cudnn_sdp(enabled: bool) {
    CUDNN_SDP.set(enabled);
}

/// Whether the math path may keep fp16/bf16 intermediates.
pub fn fp16_bf16_reduction_math_sdp_allowed() -> bool {
    MATH_SDP_REDUCTION.get()
}

/// Allows or forbids fp16/bf16 intermediates in the math path.
pub fn allow_fp16_bf16_reduction_math_sdp(allowed: bool) {
    MATH_SDP_REDUCTION.set(allowed);
}

/// The order in which SDPA backends are tried.
pub fn sdp_priority_order() -> SdpPriority {
    PRIORITY.get()
}

/// Puts `first` at the front of the priority order; the others keep their order.
pub fn set_sdp_priority_order(first: &[SdpBackend]) {
    PRIORITY.set(PRIORITY.get().with_first(first));
}

/// The old form of [`crate::ops::sdpa::backend::sdpa_kernel`]: sets each switch until the guard drops.
#[deprecated(note = "use `backends::attention::sdpa_kernel(&[backend, ...], set_priority)`")]
pub fn sdp_kernel(
    enable_flash: bool,
    enable_math: bool,
    enable_mem_efficient: bool,
    enable_cudnn: bool,
) -> Guard {
    let mut guard = Guard::default();
    guard.push(&FLASH_SDP, enable_flash);
    guard.push(&MATH_SDP, enable_math);
    guard.push(&MEM_EFFICIENT_SDP, enable_mem_efficient);
    guard.push(&CUDNN_SDP, enable_cudnn);
    guard
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "flash_sdp_enabled": FLASH_SDP.report(),
        "mem_efficient_sdp_enabled": MEM_EFFICIENT_SDP.report(),
        "math_sdp_enabled": MATH_SDP.report(),
        "cudnn_sdp_enabled": CUDNN_SDP.report(),
        "fp16_bf16_reduction_math_sdp_allowed": MATH_SDP_REDUCTION.report(),
        "sdp_priority_order": PRIORITY.report(),
    })
}
