//! `torch.backends.cpu`: the vector level the CPU kernels dispatch on (detected once, capped
//! by `ATEN_CPU_CAPABILITY`; see [`crate::runtime::cpu`]).

pub use crate::runtime::cpu::{
    CAPABILITY_ENV, CpuCapability, bf16_dot_speedup, detected_cpu_capability, features,
    get_cpu_capability, has_amx_bf16, has_avx512_bf16, l2_cache_bytes, model_name,
};

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "model": model_name(),
        "arch": std::env::consts::ARCH,
        "capability": get_cpu_capability().to_string(),
        "l2_cache_bytes": l2_cache_bytes(),
        "bf16_gemm_kernel": crate::kernels::dispatch::cpu_kernels().gemm_bf16.name,
        "capability_detected": detected_cpu_capability().to_string(),
        "capability_source": crate::runtime::cpu::capability_source(),
        "features": features(),
        "logical_cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}
