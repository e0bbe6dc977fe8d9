//! `torch.backends.nnpack`: NNPACK (loaded at run time: `libnnpack.so`, or PyTorch's
//! `libtorch_cpu.so`, which carries it) and its `enabled` flag, read by `conv2d` on the CPU
//! while `mkldnn.enabled` is off (as PyTorch reads it).

use crate::core::flag::{Guard, ScopedGuard};
use crate::ops::conv::nnpack::library;
pub use crate::ops::conv::nnpack::{ENABLED, enabled, is_available};
use crate::runtime::dylib;

/// Sets whether NNPACK may be used; returns the previous setting.
pub fn set_flags(enabled: bool) -> bool {
    ENABLED.replace(enabled)
}

/// Sets whether NNPACK may be used until the guard drops.
pub fn flags(enabled: bool) -> Guard {
    ENABLED.guard(enabled)
}

/// [`flags`] for the current thread only.
pub fn flags_scoped(enabled: bool) -> ScopedGuard {
    ENABLED.guard_scoped(enabled)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "library": dylib::report(library()),
        "enabled": ENABLED.report(),
    })
}
