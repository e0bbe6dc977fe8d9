//! `torch.backends.mkl`: Intel MKL (probed at run time) and the `verbose` trace guard.
//!
//! This library's own CPU kernels serve every operation; MKL is reported, not called.

use std::sync::OnceLock;

use crate::core::flag::{Guard, ScopedGuard};
pub use crate::core::verbose::{MKL_VERBOSE as VERBOSE, VERBOSE_OFF, VERBOSE_ON};
use crate::runtime::dylib::{self, Loaded};

fn library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("mkl_rt", &["2", "1"]))
        .as_ref()
}

/// Whether the MKL runtime library loads here.
pub fn is_available() -> bool {
    library().is_some()
}

/// MKL's version text, if it loads.
pub fn version() -> Option<String> {
    let lib = library()?;
    // SAFETY: `MKL_Get_Version_String(char* buffer, int len)` has had this signature in
    // every MKL release.
    let get: libloading::Symbol<unsafe extern "C" fn(*mut u8, i32)> =
        unsafe { lib.lib.get(b"MKL_Get_Version_String\0") }.ok()?;
    let mut buffer = [0u8; 256];
    // SAFETY: MKL writes at most `len` bytes, NUL-terminated, into the buffer.
    unsafe { get(buffer.as_mut_ptr(), buffer.len() as i32) };
    let text = std::ffi::CStr::from_bytes_until_nul(&buffer).ok()?;
    Some(text.to_string_lossy().trim().to_string())
}

/// Turns the kernel trace on (`VERBOSE_ON`) or off until the guard drops.
pub fn verbose(level: u32) -> crate::Result<Guard> {
    crate::core::verbose::guard(&VERBOSE, level, VERBOSE_ON)
}

/// [`verbose`] for the current thread only.
pub fn verbose_scoped(level: u32) -> crate::Result<ScopedGuard> {
    crate::core::verbose::guard_scoped(&VERBOSE, level, VERBOSE_ON)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "library": dylib::report(library()),
        "version": version(),
        "used_by_kernels": false,
        "verbose": VERBOSE.report(),
    })
}
