//! `torch.backends.mkldnn`: oneDNN (probed at run time), the `enabled` flag and the
//! `verbose` trace guard.
//!
//! This library's own CPU kernels serve every operation; oneDNN is reported, not called.
//! `enabled` steers `conv2d` on the CPU as it steers PyTorch's: on (the default), the
//! library's convolution kernels take the call where PyTorch's would go to oneDNN; off, it
//! goes where PyTorch's goes without oneDNN: NNPACK (`nnpack::flags`) where PyTorch's rule
//! for it holds and NNPACK loads, otherwise the unfolded input times the weight.

use std::sync::OnceLock;

use crate::core::flag::{Guard, ScopedGuard};
pub use crate::core::verbose::{
    MKLDNN_VERBOSE as VERBOSE, VERBOSE_OFF, VERBOSE_ON, VERBOSE_ON_CREATION,
};
pub use crate::ops::conv::MKLDNN_ENABLED as ENABLED;
use crate::runtime::dylib::{self, Loaded};

fn library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("dnnl", &["3", "2"]))
        .as_ref()
}

/// Whether the oneDNN library loads here.
pub fn is_available() -> bool {
    library().is_some()
}

#[repr(C)]
struct DnnlVersion {
    major: i32,
    minor: i32,
    patch: i32,
}

/// oneDNN's version `(major, minor, patch)`, if it loads.
pub fn version() -> Option<(u32, u32, u32)> {
    let lib = library()?;
    // SAFETY: `dnnl_version()` returns a pointer to a static struct that starts with three
    // ints (major, minor, patch) in every oneDNN release.
    let get: libloading::Symbol<unsafe extern "C" fn() -> *const DnnlVersion> =
        unsafe { lib.lib.get(b"dnnl_version\0") }.ok()?;
    // SAFETY: as above; the pointer is to static data, or null.
    let v = unsafe { get().as_ref() }?;
    Some((
        u32::try_from(v.major).ok()?,
        u32::try_from(v.minor).ok()?,
        u32::try_from(v.patch).ok()?,
    ))
}

/// Whether the library's convolution kernels take CPU convolutions (oneDNN's place).
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Sets [`enabled`]; returns the previous setting.
pub fn set_flags(enabled: bool) -> bool {
    ENABLED.replace(enabled)
}

/// Sets [`enabled`] until the guard drops.
pub fn flags(enabled: bool) -> Guard {
    ENABLED.guard(enabled)
}

/// [`flags`] for the current thread only.
pub fn flags_scoped(enabled: bool) -> ScopedGuard {
    ENABLED.guard_scoped(enabled)
}

/// Sets the kernel trace level (`VERBOSE_OFF`, `VERBOSE_ON`, `VERBOSE_ON_CREATION`) until
/// the guard drops.
pub fn verbose(level: u32) -> crate::Result<Guard> {
    crate::core::verbose::guard(&VERBOSE, level, VERBOSE_ON_CREATION)
}

/// [`verbose`] for the current thread only.
pub fn verbose_scoped(level: u32) -> crate::Result<ScopedGuard> {
    crate::core::verbose::guard_scoped(&VERBOSE, level, VERBOSE_ON_CREATION)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "library": dylib::report(library()),
        "version": version().map(|(a, b, c)| format!("{a}.{b}.{c}")),
        "used_by_kernels": false,
        "enabled": ENABLED.report(),
        "verbose": VERBOSE.report(),
    })
}
