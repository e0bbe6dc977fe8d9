//! fp32 math precision: the `fp32_precision` hierarchy and `set_float32_matmul_precision`.
//!
//! The primary form is [`Fp32Precision`]: a root value ([`fp32_precision`], default
//! `ieee`) and a matmul leaf ([`crate::core::precision::matmul::fp32_precision`], default `none`,
//! meaning "inherit from the root"). `allow_tf32` and `float32_matmul_precision` are views
//! of the effective matmul value. The CPU and wgpu kernels read the same value: where
//! their hardware has no relaxed path, the value is accepted and has no effect.

pub mod matmul;

use crate::core::flag::{Flag, Guard, ScopedGuard, option_enum};

option_enum! {
    /// How fp32 math may be carried out, in PyTorch's `fp32_precision` spellings.
    pub enum Fp32Precision ("fp32 precision") {
        /// Inherit the parent's value (at the root: `ieee`).
        None = "none",
        /// IEEE fp32 throughout.
        Ieee = "ieee",
        /// TF32 inputs (10-bit mantissa), fp32 accumulate.
        Tf32 = "tf32",
        /// bf16 inputs, fp32 accumulate.
        Bf16 = "bf16",
    }
}

option_enum! {
    /// The argument of `set_float32_matmul_precision`.
    pub enum Float32MatmulPrecision ("float32 matmul precision") {
        /// IEEE fp32.
        Highest = "highest",
        /// TF32 (or bf16x3 where TF32 is absent).
        High = "high",
        /// bf16 inputs with fp32 accumulate.
        Medium = "medium",
    }
}

impl Float32MatmulPrecision {
    /// The `fp32_precision` value this level stands for.
    pub fn as_fp32_precision(self) -> Fp32Precision {
        match self {
            Float32MatmulPrecision::Highest => Fp32Precision::Ieee,
            Float32MatmulPrecision::High => Fp32Precision::Tf32,
            Float32MatmulPrecision::Medium => Fp32Precision::Bf16,
        }
    }
}

/// The root of the `fp32_precision` hierarchy (`torch.backends.fp32_precision`).
pub static FP32_PRECISION: Flag<Fp32Precision> =
    Flag::new("fp32_precision", Fp32Precision::Ieee, None);

/// The root fp32 precision; leaves set to `none` inherit it.
pub fn fp32_precision() -> Fp32Precision {
    FP32_PRECISION.get()
}

/// Sets the root fp32 precision (`none` at the root behaves as `ieee`).
pub fn set_fp32_precision(precision: Fp32Precision) {
    FP32_PRECISION.set(precision);
}

/// Resolves a leaf value against the root: `none` inherits, and a root of `none` is `ieee`.
pub(crate) fn resolve(leaf: Fp32Precision) -> Fp32Precision {
    match (leaf, fp32_precision()) {
        (Fp32Precision::None, Fp32Precision::None) => Fp32Precision::Ieee,
        (Fp32Precision::None, root) => root,
        (leaf, _) => leaf,
    }
}

/// `torch.set_float32_matmul_precision`: sets the matmul leaf of the hierarchy.
pub fn set_float32_matmul_precision(precision: Float32MatmulPrecision) {
    crate::core::precision::matmul::FP32_PRECISION.set(precision.as_fp32_precision());
}

/// `torch.get_float32_matmul_precision`: the effective matmul precision as a level.
pub fn get_float32_matmul_precision() -> Float32MatmulPrecision {
    match crate::core::precision::matmul::fp32_precision_effective() {
        Fp32Precision::Tf32 => Float32MatmulPrecision::High,
        Fp32Precision::Bf16 => Float32MatmulPrecision::Medium,
        Fp32Precision::Ieee | Fp32Precision::None => Float32MatmulPrecision::Highest,
    }
}

/// Sets the matmul precision level until the guard drops.
pub fn float32_matmul_precision(precision: Float32MatmulPrecision) -> Guard {
    crate::core::precision::matmul::FP32_PRECISION.guard(precision.as_fp32_precision())
}

/// Sets the matmul precision level for the current thread until the guard drops.
pub fn float32_matmul_precision_scoped(precision: Float32MatmulPrecision) -> ScopedGuard {
    crate::core::precision::matmul::FP32_PRECISION.guard_scoped(precision.as_fp32_precision())
}
