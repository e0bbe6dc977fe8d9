//! `torch.backends.cuda`: CUDA queries, matmul precision, library preferences, the FFT
//! plan caches and the SDPA backend switches.
//!
//! The driver is reached through cudarc's dynamically loaded driver API: nothing links
//! against CUDA, so the crate builds and runs on machines without it, where the queries
//! answer `false` / `None`.

mod driver;
#[cfg(feature = "cuda")]
pub mod loader;
pub mod matmul;
#[cfg(feature = "cuda")]
pub(crate) mod memory;
pub mod sdp;

pub use crate::attention::{
    can_use_cudnn_attention, can_use_efficient_attention, can_use_flash_attention,
};
pub use driver::DeviceProperties;
#[allow(deprecated)]
pub use sdp::sdp_kernel;
pub use sdp::{
    SDPAParams, TensorMeta, allow_fp16_bf16_reduction_math_sdp, cudnn_sdp_enabled,
    enable_cudnn_sdp, enable_flash_sdp, enable_math_sdp, enable_mem_efficient_sdp,
    flash_sdp_enabled, fp16_bf16_reduction_math_sdp_allowed, math_sdp_enabled,
    mem_efficient_sdp_enabled, sdp_priority_order, set_sdp_priority_order,
};

use crate::flag::{EnvInit, Flag, option_enum};

/// Whether this binary carries CUDA kernels it can use: PTX generated at build time, or
/// NVRTC to compile the embedded kernel source at run time (see [`crate::kernels::cuda_code`]).
pub fn is_built() -> bool {
    crate::kernels::cuda_code() != crate::kernels::CudaCode::None
}

/// The FFT plan cache of CUDA device `index` (`torch.backends.cuda.cufft_plan_cache[i]`):
/// `size`, `max_size` / `set_max_size`, `clear`. See [`crate::fft`]. An index past the
/// device count is an error, as in PyTorch.
pub fn cufft_plan_cache(index: usize) -> crate::Result<&'static crate::fft::PlanCache> {
    let count = device_count();
    if index >= count {
        return Err(crate::Error::InvalidArgument {
            what: "cufft_plan_cache device index",
            why: format!(
                "expected 0 <= device index < {count} (the CUDA device count), but got {index}"
            ),
        });
    }
    Ok(crate::fft::plan_cache(crate::Device::Cuda(index)))
}

/// Whether flash attention is built in and usable here
/// (`torch.backends.cuda.is_flash_attention_available`): the CUDA kernels are built (PTX
/// or NVRTC) and a device meets flash's architecture (sm_80 or newer).
pub fn is_flash_attention_available() -> bool {
    let min = crate::kernels::rules::min_arch(crate::kernels::rules::Backend::Flash);
    is_built()
        && (0..device_count())
            .any(|i| get_device_capability(i).is_some_and(|cap| min.is_none_or(|min| cap >= min)))
}

/// Whether CUDA can run here now: the driver loads and reports at least one device.
pub fn is_available() -> bool {
    device_count() > 0
}

/// Waits until every kernel and copy queued on device `ordinal` has finished
/// (`torch.cuda.synchronize`): what a timing needs before it reads the clock.
pub fn synchronize(ordinal: usize) -> crate::Result<()> {
    #[cfg(feature = "cuda")]
    {
        memory::stream(ordinal)?
            .synchronize()
            .map_err(|e| crate::Error::Driver {
                call: "cuStreamSynchronize",
                detail: format!("{e:?}"),
            })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(crate::Error::Unavailable {
            what: "CUDA",
            why: "this build has no CUDA support: build with the `cuda` feature".into(),
        })
    }
}

/// The number of CUDA devices the driver reports (0 without a driver).
pub fn device_count() -> usize {
    driver::state().devices.len()
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (12090 is 12.9), if a driver loads.
pub fn driver_version() -> Option<u32> {
    driver::state().version
}

/// Why CUDA is not available here, or `None` when it is.
pub fn unavailable_reason() -> Option<&'static str> {
    driver::state().problem.as_deref()
}

/// The properties of device `ordinal`, if there is such a device.
pub fn get_device_properties(ordinal: usize) -> Option<&'static DeviceProperties> {
    driver::state().devices.get(ordinal)
}

/// The compute capability `(major, minor)` of device `ordinal`.
pub fn get_device_capability(ordinal: usize) -> Option<(u32, u32)> {
    get_device_properties(ordinal).map(|p| (p.major, p.minor))
}

/// The name of device `ordinal`.
pub fn get_device_name(ordinal: usize) -> Option<&'static str> {
    get_device_properties(ordinal).map(|p| p.name.as_str())
}

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

option_enum! {
    /// A linear-algebra library to prefer.
    pub enum LinalgBackend ("linalg backend") {
        /// The library's own choice.
        Default = "default",
        /// cuSOLVER.
        Cusolver = "cusolver",
        /// MAGMA.
        Magma = "magma",
    }
}

option_enum! {
    /// A flash-attention library to prefer on ROCm.
    pub enum RocmFaBackend ("ROCm flash-attention backend") {
        /// The library's own choice.
        Default = "default",
        /// AOTriton.
        Aotriton = "aotriton",
        /// Composable Kernel.
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
/// The preferred linear-algebra library. `TORCH_LINALG_PREFER_CUSOLVER=1` starts it at `cusolver`.
pub static PREFERRED_LINALG: Flag<LinalgBackend> = Flag::new(
    "cuda.preferred_linalg_library",
    LinalgBackend::Default,
    Some(EnvInit {
        var: "TORCH_LINALG_PREFER_CUSOLVER",
        parse: |s| (s == "1").then_some(LinalgBackend::Cusolver),
    }),
);
/// The preferred ROCm flash-attention library. `TORCH_ROCM_FA_PREFER_CK=1` starts it at `ck`.
pub static PREFERRED_ROCM_FA: Flag<RocmFaBackend> = Flag::new(
    "cuda.preferred_rocm_fa_library",
    RocmFaBackend::Default,
    Some(EnvInit {
        var: "TORCH_ROCM_FA_PREFER_CK",
        parse: |s| (s == "1").then_some(RocmFaBackend::Ck),
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

/// With `Some(backend)`, sets the preferred linear-algebra library; returns the one in force.
pub fn preferred_linalg_library(backend: Option<LinalgBackend>) -> LinalgBackend {
    if let Some(backend) = backend {
        PREFERRED_LINALG.set(backend);
    }
    PREFERRED_LINALG.get()
}

/// With `Some(backend)`, sets the preferred ROCm flash-attention library; returns the one in force.
pub fn preferred_rocm_fa_library(backend: Option<RocmFaBackend>) -> RocmFaBackend {
    if let Some(backend) = backend {
        PREFERRED_ROCM_FA.set(backend);
    }
    PREFERRED_ROCM_FA.get()
}

pub(crate) fn report() -> serde_json::Value {
    let devices: Vec<serde_json::Value> = driver::state()
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            serde_json::json!({
                "index": i,
                "name": d.name,
                "capability": format!("{}.{}", d.major, d.minor),
                "multi_processor_count": d.multi_processor_count,
                "total_memory_bytes": d.total_memory,
            })
        })
        .collect();
    serde_json::json!({
        "is_built": is_built(),
        "kernels": crate::kernels::report(),
        "is_available": is_available(),
        "is_flash_attention_available": is_flash_attention_available(),
        "unavailable_reason": unavailable_reason(),
        "driver_version": driver_version(),
        "device_count": device_count(),
        "devices": devices,
        "matmul": matmul::report(),
        "preferred_blas_library": PREFERRED_BLAS.report(),
        "preferred_linalg_library": PREFERRED_LINALG.report(),
        "preferred_rocm_fa_library": PREFERRED_ROCM_FA.report(),
        "sdp": sdp::report(),
    })
}
