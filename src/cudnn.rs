//! `torch.backends.cudnn`: the cuDNN library (probed at run time) and its flags (defined in
//! [`crate::core::cudnn`], where the determinism rule and the cuDNN ops read them).

pub use crate::core::cudnn::*;
pub use crate::runtime::cuda::cudnn_version as version;

/// Whether cuDNN can run here: the library loads and a CUDA device is present.
pub fn is_available() -> bool {
    version().is_some() && crate::cuda::is_available()
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "version": version(),
        "library": crate::runtime::dylib::report(crate::runtime::cuda::cudnn_library()),
        "is_available": is_available(),
        "enabled": ENABLED.report(),
        "allow_tf32": ALLOW_TF32.report(),
        "deterministic": DETERMINISTIC.report(),
        "benchmark": BENCHMARK.report(),
        "benchmark_limit": BENCHMARK_LIMIT.report(),
    })
}
