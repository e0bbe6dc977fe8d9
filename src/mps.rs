//! `torch.backends.mps`: Apple GPUs, reached here through wgpu's Metal backend.

/// Whether this binary carries the Metal backend (macOS and iOS builds with `wgpu`).
pub fn is_built() -> bool {
    cfg!(all(
        feature = "wgpu",
        any(target_os = "macos", target_os = "ios")
    ))
}

/// Whether a Metal adapter is present.
pub fn is_available() -> bool {
    crate::runtime::wgpu::adapters::list()
        .iter()
        .any(|a| a.api == crate::adapters::Api::Metal)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({ "is_built": is_built(), "is_available": is_available() })
}
