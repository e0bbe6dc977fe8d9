//! `torch.backends.nnpack`: NNPACK (probed at run time) and its `enabled` flag.

use std::sync::OnceLock;

use crate::core::flag::{Flag, Guard, ScopedGuard};
use crate::runtime::dylib::{self, Loaded};

/// NNPACK may be used where it is available.
pub static ENABLED: Flag<bool> = Flag::new("nnpack.enabled", true, None);

fn library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("nnpack", &[])).as_ref()
}

/// Whether NNPACK loads here and initialises on this CPU.
pub fn is_available() -> bool {
    static INITIALISED: OnceLock<bool> = OnceLock::new();
    *INITIALISED.get_or_init(|| {
        library().is_some_and(|lib| {
            // SAFETY: `nnp_initialize()` takes no arguments and returns an enum status
            // (0 = success); it is safe to call more than once.
            unsafe {
                lib.lib
                    .get::<unsafe extern "C" fn() -> i32>(b"nnp_initialize\0")
            }
            .is_ok_and(|init| unsafe { init() } == 0)
        })
    })
}

/// Whether NNPACK may be used.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Sets whether NNPACK may be used; returns the previous setting.
pub fn set_flags(enabled: bool) -> bool {
    let previous = ENABLED.global();
    ENABLED.set(enabled);
    previous
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
