//! `torch.nn.attention`: the SDPA backends, the `sdpa_kernel` guard, and the selection of
//! the backend that serves a call.

mod pin;
mod select;

pub use pin::{Pin, ScopedFuture, SdpaKernelScope, causal_default, pinned};
pub use select::{
    DeviceCaps, Reason, Verdict, can_use_cudnn_attention, can_use_efficient_attention,
    can_use_flash_attention, check, explain, explain_with, runtime_disabled, select_with,
    selected_backend, validate,
};
pub(crate) use select::{no_kernel_message, select};

use std::fmt;

pub use crate::kernels::rules::HeadDims;

use crate::cuda::sdp;
use crate::flag::{FlagGuard, FlagValue, Guard, ScopedGuard, option_enum};

option_enum! {
    /// A scaled-dot-product-attention backend, spelled as PyTorch's `SDPBackend` names.
    pub enum SdpBackend ("SDPA backend") {
        /// The reference implementation (any input).
        Math = "MATH",
        /// Flash attention (tiled, online softmax).
        Flash = "FLASH_ATTENTION",
        /// Memory-efficient attention.
        MemEfficient = "EFFICIENT_ATTENTION",
        /// cuDNN's fused attention.
        Cudnn = "CUDNN_ATTENTION",
    }
}

impl From<SdpBackend> for crate::kernels::rules::Backend {
    fn from(backend: SdpBackend) -> Self {
        match backend {
            SdpBackend::Math => Self::Math,
            SdpBackend::Flash => Self::Flash,
            SdpBackend::MemEfficient => Self::MemEfficient,
            SdpBackend::Cudnn => Self::Cudnn,
        }
    }
}

/// The order in which SDPA backends are tried: a permutation of all four.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpPriority([SdpBackend; 4]);

impl SdpPriority {
    /// Flash, then memory-efficient, then math, then cuDNN.
    pub const DEFAULT: SdpPriority = SdpPriority([
        SdpBackend::Flash,
        SdpBackend::MemEfficient,
        SdpBackend::Math,
        SdpBackend::Cudnn,
    ]);

    /// `first` in the given order (repeats ignored), then the rest in `self`'s order.
    pub fn with_first(self, first: &[SdpBackend]) -> SdpPriority {
        let mut order = Vec::with_capacity(4);
        for &b in first.iter().chain(&self.0) {
            if !order.contains(&b) {
                order.push(b);
            }
        }
        SdpPriority([order[0], order[1], order[2], order[3]])
    }

    /// The backends, highest priority first.
    pub fn as_slice(&self) -> &[SdpBackend] {
        &self.0
    }
}

impl fmt::Display for SdpPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|b| b.as_str()).collect();
        f.write_str(&names.join(" > "))
    }
}

impl FlagValue for SdpPriority {
    fn to_bits(self) -> u32 {
        self.0
            .iter()
            .enumerate()
            .map(|(i, b)| b.to_bits() << (4 * i))
            .sum()
    }

    fn from_bits(bits: u32) -> Self {
        let order = [0, 1, 2, 3].map(|i| SdpBackend::from_bits((bits >> (4 * i)) & 0xf));
        SdpPriority::DEFAULT.with_first(&order)
    }

    fn to_json(self) -> serde_json::Value {
        self.0.iter().map(|b| b.as_str()).collect::<Vec<_>>().into()
    }
}

/// Enables only `backends` until the guard drops; with `set_priority`, their order in
/// the list also becomes the priority order (the others follow in their old order).
pub fn sdpa_kernel(backends: &[SdpBackend], set_priority: bool) -> Guard {
    only(backends, set_priority)
}

/// [`sdpa_kernel`] for the current thread only.
pub fn sdpa_kernel_scoped(backends: &[SdpBackend], set_priority: bool) -> ScopedGuard {
    only(backends, set_priority)
}

fn only<G: FlagGuard>(backends: &[SdpBackend], set_priority: bool) -> G {
    let mut guard = G::default();
    for &b in SdpBackend::ALL {
        guard.push(sdp::enabled_flag(b), backends.contains(&b));
    }
    if set_priority {
        guard.push(&sdp::PRIORITY, sdp::PRIORITY.get().with_first(backends));
    }
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use SdpBackend::*;

    #[test]
    fn priority_round_trips_through_bits() {
        let p = SdpPriority::DEFAULT.with_first(&[Cudnn, Math]);
        assert_eq!(p.as_slice(), [Cudnn, Math, Flash, MemEfficient]);
        assert_eq!(SdpPriority::from_bits(p.to_bits()), p);
        assert_eq!(
            p.to_string(),
            "CUDNN_ATTENTION > MATH > FLASH_ATTENTION > EFFICIENT_ATTENTION"
        );
    }

    #[test]
    fn repeated_backends_count_once() {
        let p = SdpPriority::DEFAULT.with_first(&[Math, Math, Flash]);
        assert_eq!(p.as_slice(), [Math, Flash, MemEfficient, Cudnn]);
    }
}
