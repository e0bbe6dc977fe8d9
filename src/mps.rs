//! `torch.backends.mps`: Apple GPUs, reached here through wgpu's Metal backend.

/// Whether this binary carries the Metal backend (macOS and iOS builds).
pub fn is_built() -> bool {
    cfg!(any(target_os = "macos", target_os = "ios"))
}

/// Whether a Metal adapter is present.
pub fn is_available() -> bool {
    crate::runtime::wgpu::adapters::list()
        .iter()
        .any(|a| a.backend == wgpu::Backend::Metal)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({ "is_built": is_built(), "is_available": is_available() })
}
