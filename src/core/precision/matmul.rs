//! `torch.backends.cuda.matmul`: precision flags for matrix products on every device.

use crate::core::flag::{EnvInit, Flag};
use crate::core::precision::{Fp32Precision, resolve};

/// The matmul leaf of the `fp32_precision` hierarchy (default `none`: inherit the root).
/// `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1` starts it at `tf32`, as in PyTorch.
pub static FP32_PRECISION: Flag<Fp32Precision> = Flag::new(
    "cuda.matmul.fp32_precision",
    Fp32Precision::None,
    Some(EnvInit {
        var: "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        parse: |s| (s == "1").then_some(Fp32Precision::Tf32),
    }),
);
/// fp16 GEMM may hold some partial sums (split-K) in fp16.
pub static ALLOW_FP16_REDUCED_PRECISION_REDUCTION: Flag<bool> = Flag::new(
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    true,
    None,
);
/// bf16 GEMM may hold some partial sums (split-K) in bf16.
pub static ALLOW_BF16_REDUCED_PRECISION_REDUCTION: Flag<bool> = Flag::new(
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
    true,
    None,
);
/// fp16 GEMM may accumulate in fp16.
pub static ALLOW_FP16_ACCUMULATION: Flag<bool> =
    Flag::new("cuda.matmul.allow_fp16_accumulation", false, None);

/// The matmul `fp32_precision` as set (`none` means inherit).
pub fn fp32_precision() -> Fp32Precision {
    FP32_PRECISION.get()
}

/// Sets the matmul `fp32_precision` (`none` inherits the root).
pub fn set_fp32_precision(precision: Fp32Precision) {
    FP32_PRECISION.set(precision);
}

/// The precision fp32 matmuls run at, with `none` resolved against the root.
pub fn fp32_precision_effective() -> Fp32Precision {
    resolve(FP32_PRECISION.get())
}

/// Whether fp32 matmuls may use TF32 (true for `tf32`, and for the coarser `bf16`).
pub fn allow_tf32() -> bool {
    matches!(
        fp32_precision_effective(),
        Fp32Precision::Tf32 | Fp32Precision::Bf16
    )
}

/// `true` sets the matmul precision to `tf32`, `false` to `ieee`.
pub fn set_allow_tf32(allow: bool) {
    FP32_PRECISION.set(if allow {
        Fp32Precision::Tf32
    } else {
        Fp32Precision::Ieee
    });
}

/// Whether fp16 GEMM may reduce split-K partials in fp16.
pub fn allow_fp16_reduced_precision_reduction() -> bool {
    ALLOW_FP16_REDUCED_PRECISION_REDUCTION.get()
}

/// Sets [`allow_fp16_reduced_precision_reduction`].
pub fn set_allow_fp16_reduced_precision_reduction(allow: bool) {
    ALLOW_FP16_REDUCED_PRECISION_REDUCTION.set(allow);
}

/// Whether bf16 GEMM may reduce split-K partials in bf16.
pub fn allow_bf16_reduced_precision_reduction() -> bool {
    ALLOW_BF16_REDUCED_PRECISION_REDUCTION.get()
}

/// Sets [`allow_bf16_reduced_precision_reduction`].
pub fn set_allow_bf16_reduced_precision_reduction(allow: bool) {
    ALLOW_BF16_REDUCED_PRECISION_REDUCTION.set(allow);
}

/// Whether fp16 GEMM may accumulate in fp16.
pub fn allow_fp16_accumulation() -> bool {
    ALLOW_FP16_ACCUMULATION.get()
}

/// Sets [`allow_fp16_accumulation`].
pub fn set_allow_fp16_accumulation(allow: bool) {
    ALLOW_FP16_ACCUMULATION.set(allow);
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "fp32_precision": FP32_PRECISION.report(),
        "fp32_precision_effective": fp32_precision_effective().to_string(),
        "allow_tf32": allow_tf32(),
        "float32_matmul_precision": crate::get_float32_matmul_precision().to_string(),
        "allow_fp16_reduced_precision_reduction": ALLOW_FP16_REDUCED_PRECISION_REDUCTION.report(),
        "allow_bf16_reduced_precision_reduction": ALLOW_BF16_REDUCED_PRECISION_REDUCTION.report(),
        "allow_fp16_accumulation": ALLOW_FP16_ACCUMULATION.report(),
    })
}
