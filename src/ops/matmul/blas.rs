//! Which BLAS library CUDA matmuls prefer (`torch.backends.cuda.preferred_blas_library`).

use crate::core::flag::{EnvInit, Flag, option_enum};

option_enum! {
    /// A BLAS library to prefer for GEMM.
    pub enum BlasBackend ("BLAS backend") {
        /// This library's heuristic between its generated kernels and the vendor libraries.
        Default = "default",
        /// cuBLAS.
        Cublas = "cublas",
        /// cuBLASLt (`hipblaslt` on ROCm).
        Cublaslt = "cublaslt" | "hipblaslt",
        /// Composable Kernel (ROCm).
        Ck = "ck",
    }
}

/// The preferred BLAS library. `TORCH_BLAS_PREFER_CUBLASLT=1` starts it at `cublaslt`.
pub static PREFERRED_BLAS: Flag<BlasBackend> = Flag::new(
    "cuda.preferred_blas_library",
    BlasBackend::Default,
    Some(EnvInit {
        var: "TORCH_BLAS_PREFER_CUBLASLT",
        parse: |s| (s == "1").then_some(BlasBackend::Cublaslt),
    }),
);

/// With `Some(backend)`, sets the preferred BLAS library; returns the one in force.
/// A preference is a preference: an op the preferred library lacks uses another one.
pub fn preferred_blas_library(backend: Option<BlasBackend>) -> BlasBackend {
    if let Some(backend) = backend {
        PREFERRED_BLAS.set(backend);
    }
    PREFERRED_BLAS.get()
}
