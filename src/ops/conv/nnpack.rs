//! NNPACK (probed at run time) and its `enabled` flag, which `conv2d` reads on the CPU;
//! `torch.backends.nnpack` (the `nnpack` facade) sets and reports them.

use std::sync::OnceLock;

use crate::core::flag::Flag;
use crate::runtime::dylib::{self, Loaded};

/// NNPACK may be used where it is available.
pub static ENABLED: Flag<bool> = Flag::new("nnpack.enabled", true, None);

/// The loaded library, if one loads.
pub(crate) fn library() -> Option<&'static Loaded> {
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
