//! `torch.backends.cusparselt`: the cuSPARSELt library, probed at run time.

use std::sync::OnceLock;

use crate::runtime::dylib::{self, Loaded};

fn library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("cusparseLt", &["0"]))
        .as_ref()
}

/// cuSPARSELt's version as `major * 1000 + minor * 100 + patch` (PyTorch's form), if it loads.
pub fn version() -> Option<u32> {
    let lib = library()?;
    type GetProperty = unsafe extern "C" fn(i32, *mut i32) -> i32;
    // SAFETY: `cusparseLtGetProperty(libraryPropertyType, int*)` has had this signature
    // since cuSPARSELt 0.1.
    let get: libloading::Symbol<GetProperty> =
        unsafe { lib.lib.get(b"cusparseLtGetProperty\0") }.ok()?;
    let property = |kind: i32| {
        let mut value = 0;
        // SAFETY: `kind` is MAJOR_VERSION (0), MINOR_VERSION (1) or PATCH_LEVEL (2);
        // `value` outlives the call.
        let status = unsafe { get(kind, &mut value) };
        (status == 0)
            .then_some(value)
            .and_then(|v| u32::try_from(v).ok())
    };
    Some(property(0)? * 1000 + property(1)? * 100 + property(2)?)
}

/// Whether cuSPARSELt can run here: the library loads and a CUDA device is present.
pub fn is_available() -> bool {
    version().is_some() && crate::cuda::is_available()
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "version": version(),
        "library": dylib::report(library()),
        "is_available": is_available(),
    })
}
