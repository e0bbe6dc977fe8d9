//! Element types.

use crate::core::flag::option_enum;
use backends_spec::keys::Elem;

option_enum! {
    /// An element type. Spelled short (`bf16`); PyTorch's names (`bfloat16`) are accepted.
    pub enum DType ("dtype") {
        /// IEEE binary16.
        F16 = "f16" | "float16" | "half",
        /// bfloat16.
        Bf16 = "bf16" | "bfloat16",
        /// IEEE binary32.
        F32 = "f32" | "float32" | "float",
        /// IEEE binary64 (CPU reference math).
        F64 = "f64" | "float64" | "double",
        /// Boolean (attention masks).
        Bool = "bool",
        /// 32-bit signed integer (`lu_factor`'s pivots).
        I32 = "i32" | "int32" | "int",
    }
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(self, DType::Bool | DType::I32)
    }

    /// The kernel element type it is stored as (`None` for `Bool`).
    pub fn elem(self) -> Option<Elem> {
        match self {
            DType::F16 => Some(Elem::F16),
            DType::Bf16 => Some(Elem::Bf16),
            DType::F32 => Some(Elem::F32),
            DType::F64 => Some(Elem::F64),
            DType::Bool | DType::I32 => None,
        }
    }
}

impl From<Elem> for DType {
    fn from(elem: Elem) -> DType {
        match elem {
            Elem::F16 => DType::F16,
            Elem::Bf16 => DType::Bf16,
            Elem::F32 => DType::F32,
            Elem::F64 => DType::F64,
        }
    }
}
