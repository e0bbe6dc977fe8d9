//! The `sdpa_kernel` guards: which SDPA backends may serve calls, and in which order.

use crate::core::flag::{FlagGuard, Guard, ScopedGuard};
use crate::core::sdp::SdpBackend;
use crate::ops::sdpa::flags as sdp;

/// Enables only `backends` until the guard drops; with `set_priority`, their order in
/// the list also becomes the priority order (the others follow in their old order).
pub fn sdpa_kernel(backends: &[SdpBackend], set_priority: bool) -> Guard {
    only(backends, set_priority)
}

/// [`sdpa_kernel`] for the current thread only.
pub fn sdpa_kernel_scoped(backends: &[SdpBackend], set_priority: bool) -> ScopedGuard {
    only(backends, set_priority)
}

pub(crate) fn only<G: FlagGuard>(backends: &[SdpBackend], set_priority: bool) -> G {
    let mut guard = G::default();
    for &b in SdpBackend::ALL {
        guard.push(sdp::enabled_flag(b), backends.contains(&b));
    }
    if set_priority {
        guard.push(&sdp::PRIORITY, sdp::PRIORITY.get().with_first(backends));
    }
    guard
}
