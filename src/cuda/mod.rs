//! `torch.backends.cuda`: CUDA queries, matmul precision, library preferences, the FFT
//! plan caches and the SDPA backend switches.
//!
//! The driver is reached through cudarc's dynamically loaded driver API: nothing links
//! against CUDA, so the crate builds and runs on machines without it, where the queries
//! answer `false` / `None`.

pub mod matmul;

pub use crate::ops::linalg::library::{LinalgBackend, PREFERRED_LINALG, preferred_linalg_library};
pub use crate::ops::matmul::blas::{BlasBackend, PREFERRED_BLAS, preferred_blas_library};

/// The SDPA backend switches (defined with the op, in [`crate::ops::sdpa::flags`]).
pub use crate::ops::sdpa::flags as sdp;

pub use crate::runtime::cuda::loader;
pub use crate::runtime::cuda::{
    DeviceProperties, device_count, driver_version, get_device_capability, get_device_name,
    get_device_properties, is_available, unavailable_reason,
};

#[allow(deprecated)]
pub use crate::ops::sdpa::flags::sdp_kernel;
pub use crate::ops::sdpa::flags::{
    allow_fp16_bf16_reduction_math_sdp, cudnn_sdp_enabled, enable_cudnn_sdp, enable_flash_sdp,
    enable_math_sdp, enable_mem_efficient_sdp, flash_sdp_enabled,
    fp16_bf16_reduction_math_sdp_allowed, math_sdp_enabled, mem_efficient_sdp_enabled,
    sdp_priority_order, set_sdp_priority_order,
};
pub use crate::ops::sdpa::params::{SDPAParams, TensorMeta};
pub use crate::ops::sdpa::select::{
    can_use_cudnn_attention, can_use_efficient_attention, can_use_flash_attention,
};

use crate::core::flag::{EnvInit, Flag, option_enum};

/// Whether this binary carries CUDA kernels it can use: PTX generated at build time, or
/// NVRTC to compile the embedded kernel source at run time (see [`crate::kernels::cuda_code`]).
pub fn is_built() -> bool {
    crate::kernels::cuda_code() != crate::kernels::CudaCode::None
}

/// The FFT plan cache of CUDA device `index` (`torch.backends.cuda.cufft_plan_cache[i]`):
/// `size`, `max_size` / `set_max_size`, `clear`. See [`crate::ops::fft`]. An index past the
/// device count is an error, as in PyTorch.
pub fn cufft_plan_cache(index: usize) -> crate::Result<&'static crate::ops::fft::PlanCache> {
    let count = device_count();
    if index >= count {
        return Err(crate::Error::InvalidArgument {
            what: "cufft_plan_cache device index",
            why: format!(
                "expected 0 <= device index < {count} (the CUDA device count), but got {index}"
            ),
        });
    }
    crate::ops::fft::plan_cache(crate::Device::Cuda(index))
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

/// Waits until every kernel and copy queued on device `ordinal` has finished
/// (`torch.cuda.synchronize`): what a timing needs before it reads the clock.
pub fn synchronize(ordinal: usize) -> crate::Result<()> {
    crate::runtime::cuda::device::CudaDevice::get(ordinal)?.synchronize()
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

/// The preferred ROCm flash-attention library. `TORCH_ROCM_FA_PREFER_CK=1` starts it at `ck`.
pub static PREFERRED_ROCM_FA: Flag<RocmFaBackend> = Flag::new(
    "cuda.preferred_rocm_fa_library",
    RocmFaBackend::Default,
    Some(EnvInit {
        var: "TORCH_ROCM_FA_PREFER_CK",
        parse: |s| (s == "1").then_some(RocmFaBackend::Ck),
    }),
);

/// With `Some(backend)`, sets the preferred ROCm flash-attention library; returns the one in force.
///
/// No ROCm device is reachable from this library, so no operation reads it (`backends
/// info` says so); it is kept for code ported from PyTorch.
pub fn preferred_rocm_fa_library(backend: Option<RocmFaBackend>) -> RocmFaBackend {
    if let Some(backend) = backend {
        PREFERRED_ROCM_FA.set(backend);
    }
    PREFERRED_ROCM_FA.get()
}

pub(crate) fn report() -> serde_json::Value {
    let devices: Vec<serde_json::Value> = crate::runtime::cuda::state()
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
                "kernel_images": crate::runtime::cuda::loader::images(i)
                    .into_iter()
                    .map(|(family, image)| (family.to_string(), serde_json::json!(image)))
                    .collect::<serde_json::Map<_, _>>(),
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
        "interpreted": crate::runtime::cuda::is_interpreted(),
        "devices": devices,
        "matmul": matmul::report(),
        "preferred_blas_library": PREFERRED_BLAS.report(),
        "preferred_linalg_library": PREFERRED_LINALG.report(),
        "linalg_library": crate::ops::linalg::library::choice(),
        "magma": crate::runtime::dylib::report(crate::ops::linalg::library::magma()),
        "preferred_rocm_fa_library": PREFERRED_ROCM_FA.report(),
        "read_by_nothing": {
            "preferred_rocm_fa_library": "no ROCm device is reachable from this library",
        },
        "sdp": crate::ops::sdpa::flags::report(),
    })
}
