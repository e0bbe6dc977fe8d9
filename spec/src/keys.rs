//! Typed keys of the kernel table: what a caller asks for, not a string.

use std::fmt;

/// The element type a kernel stores and loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Elem {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE binary64 (CPU kernels only).
    F64,
}

impl Elem {
    /// Short name used in kernel names (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
            Elem::F64 => "f64",
        }
    }

    /// The CUDA template's type for it.
    pub fn cuda_type(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F16 => "half_t",
            Elem::Bf16 => "bf16_t",
            Elem::F64 => "double",
        }
    }

    /// The WGSL type for it; WGSL has no bf16 or f64.
    pub fn wgsl_type(self) -> Option<&'static str> {
        match self {
            Elem::F32 => Some("f32"),
            Elem::F16 => Some("f16"),
            Elem::Bf16 | Elem::F64 => None,
        }
    }
}

/// How a GEMM multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GemmMath {
    /// fp32 fused multiply-adds (IEEE).
    Ieee,
    /// TF32 inputs (10-bit mantissa), fp32 accumulate.
    Tf32,
    /// bf16 inputs, fp32 accumulate (bf16 data, or fp32 data rounded to bf16).
    Bf16,
    /// fp16 inputs on tensor cores.
    F16,
}

/// What kind of attention mask a kernel applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MaskKind {
    /// No mask.
    None,
    /// Boolean: `false` hides a key.
    Bool,
    /// Additive bias on the scores.
    Additive,
}

impl MaskKind {
    /// The template's `MASK_KIND` code.
    pub fn code(self) -> u32 {
        match self {
            MaskKind::None => 0,
            MaskKind::Bool => 1,
            MaskKind::Additive => 2,
        }
    }

    /// Short name used in kernel names.
    pub fn name(self) -> &'static str {
        match self {
            MaskKind::None => "nomask",
            MaskKind::Bool => "boolmask",
            MaskKind::Additive => "addmask",
        }
    }
}

/// A batched GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmKey {
    /// Element type of A, B and C.
    pub elem: Elem,
    /// How products are formed.
    pub math: GemmMath,
    /// Accumulate in fp16 (`allow_fp16_accumulation`).
    pub acc_f16: bool,
    /// Type of split-K partial sums: `F32`, or the 16-bit input type when
    /// reduced-precision reduction is allowed.
    pub partials: Elem,
    /// B is a convolution's input, unfolded as the kernel reads it (an implicit GEMM per
    /// image and group; the convolution's sizes are extra arguments).
    pub conv: bool,
}

/// The sum of split-K partials into C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SplitKReduceKey {
    /// Element type of C.
    pub elem: Elem,
    /// Type of the partials.
    pub partials: Elem,
}

/// In-place scaling (the inverse FFTs' normalisation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScaleKey {
    /// Element type.
    pub elem: Elem,
}

/// One triangle of each matrix of a batch kept in place, the other zeroed (the factors
/// linear algebra returns on CUDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TriangleKey {
    /// Element type.
    pub elem: Elem,
}

/// Flash attention forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashKey {
    /// Element type of q, k, v, o.
    pub elem: Elem,
    /// Head dimension (exact).
    pub head_dim: u32,
    /// Causal (top-left) masking.
    pub causal: bool,
}

/// Memory-efficient attention forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemEffKey {
    /// Element type of q, k, v, o.
    pub elem: Elem,
    /// The mask's kind.
    pub mask: MaskKind,
    /// Largest head dimension served.
    pub head_dim_max: u32,
}

/// The softmax step of math attention on a device (scale, causal, mask, dropout on rows
/// of raw scores).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaskedSoftmaxKey {
    /// Element type of the scores and weights.
    pub elem: Elem,
    /// The mask's kind.
    pub mask: MaskKind,
}

/// The copy of a strided view into a contiguous buffer (elements moved as words of the
/// element's size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StridedCopyKey {
    /// An element type of the size copied.
    pub elem: Elem,
}

/// A per-channel bias added in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BiasAddKey {
    /// The element type.
    pub elem: Elem,
}

/// Split-KV attention's combination of its chunks' partial results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttentionCombineKey {
    /// The element type of the partial and final outputs.
    pub elem: Elem,
}

/// An element-wise conversion between a half type and f32 (wgpu's bf16 tensors widened to
/// f32 for the kernels and their results rounded back; math attention's half-type inputs
/// on a device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConvertKey {
    /// The element type read.
    pub from: Elem,
    /// The element type written.
    pub to: Elem,
}

/// A kernel family: one template per target, one CUDA module per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Batched GEMM.
    Gemm,
    /// Split-K reduction.
    SplitKReduce,
    /// Flash attention forward.
    FlashFwd,
    /// Memory-efficient attention forward.
    MemEffFwd,
    /// In-place scaling.
    Scale,
    /// Math attention's softmax step.
    MaskedSoftmax,
    /// Strided views made contiguous.
    StridedCopy,
    /// Per-channel bias additions.
    BiasAdd,
    /// Split-KV attention's combine step.
    AttentionCombine,
    /// Element-wise type conversions.
    Convert,
    /// Triangles of matrices kept, the rest zeroed.
    Triangle,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 11] = [
        Family::Gemm,
        Family::SplitKReduce,
        Family::FlashFwd,
        Family::MemEffFwd,
        Family::Scale,
        Family::MaskedSoftmax,
        Family::StridedCopy,
        Family::BiasAdd,
        Family::AttentionCombine,
        Family::Convert,
        Family::Triangle,
    ];

    /// The family's name: its CUDA template's file stem.
    pub fn name(self) -> &'static str {
        match self {
            Family::Gemm => "gemm",
            Family::SplitKReduce => "splitk_reduce",
            Family::FlashFwd => "flash_fwd",
            Family::MemEffFwd => "mem_eff_fwd",
            Family::Scale => "scale",
            Family::MaskedSoftmax => "masked_softmax",
            Family::StridedCopy => "strided_copy",
            Family::BiasAdd => "bias_add",
            Family::AttentionCombine => "attention_combine",
            Family::Convert => "convert",
            Family::Triangle => "triangle",
        }
    }

    /// The WGSL template's file stem (flash and memory-efficient attention share one).
    pub fn wgsl_template(self) -> Option<&'static str> {
        match self {
            Family::Gemm => Some("gemm"),
            Family::SplitKReduce | Family::Scale | Family::Triangle => None,
            Family::FlashFwd | Family::MemEffFwd => Some("attention_fwd"),
            Family::MaskedSoftmax => Some("masked_softmax"),
            Family::StridedCopy => Some("strided_copy"),
            Family::BiasAdd => Some("bias_add"),
            Family::AttentionCombine => Some("attention_combine"),
            Family::Convert => Some("convert"),
        }
    }
}

impl Family {
    /// The shared WGSL files (stems under `kernels/wgsl/`) the generator prepends to this
    /// family's template: the mask readers for the families that take a mask.
    pub fn wgsl_preludes(self) -> &'static [&'static str] {
        match self {
            Family::FlashFwd | Family::MemEffFwd | Family::MaskedSoftmax => &["mask"],
            _ => &[],
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Any kernel's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelKey {
    /// A GEMM.
    Gemm(GemmKey),
    /// A split-K reduction.
    SplitKReduce(SplitKReduceKey),
    /// Flash attention forward.
    FlashFwd(FlashKey),
    /// Memory-efficient attention forward.
    MemEffFwd(MemEffKey),
    /// In-place scaling.
    Scale(ScaleKey),
    /// Math attention's softmax step.
    MaskedSoftmax(MaskedSoftmaxKey),
    /// A strided view made contiguous.
    StridedCopy(StridedCopyKey),
    /// A per-channel bias added.
    BiasAdd(BiasAddKey),
    /// Split-KV partial results combined.
    AttentionCombine(AttentionCombineKey),
    /// An element-wise conversion.
    Convert(ConvertKey),
    /// A triangle of each matrix kept.
    Triangle(TriangleKey),
}

impl KernelKey {
    /// The key's family.
    pub fn family(&self) -> Family {
        match self {
            KernelKey::Gemm(_) => Family::Gemm,
            KernelKey::SplitKReduce(_) => Family::SplitKReduce,
            KernelKey::FlashFwd(_) => Family::FlashFwd,
            KernelKey::MemEffFwd(_) => Family::MemEffFwd,
            KernelKey::Scale(_) => Family::Scale,
            KernelKey::MaskedSoftmax(_) => Family::MaskedSoftmax,
            KernelKey::StridedCopy(_) => Family::StridedCopy,
            KernelKey::BiasAdd(_) => Family::BiasAdd,
            KernelKey::AttentionCombine(_) => Family::AttentionCombine,
            KernelKey::Convert(_) => Family::Convert,
            KernelKey::Triangle(_) => Family::Triangle,
        }
    }

    /// The key as a Rust expression over `backends_spec::keys` (for generated tables).
    pub fn rust_expr(&self) -> String {
        let elem = |e: Elem| format!("Elem::{e:?}");
        let mask = |m: MaskKind| format!("MaskKind::{m:?}");
        match *self {
            KernelKey::Gemm(k) => format!(
                "KernelKey::Gemm(GemmKey {{ elem: {}, math: GemmMath::{:?}, acc_f16: {}, partials: {}, conv: {} }})",
                elem(k.elem),
                k.math,
                k.acc_f16,
                elem(k.partials),
                k.conv
            ),
            KernelKey::SplitKReduce(k) => format!(
                "KernelKey::SplitKReduce(SplitKReduceKey {{ elem: {}, partials: {} }})",
                elem(k.elem),
                elem(k.partials)
            ),
            KernelKey::Scale(k) => {
                format!("KernelKey::Scale(ScaleKey {{ elem: {} }})", elem(k.elem))
            }
            KernelKey::Triangle(k) => format!(
                "KernelKey::Triangle(TriangleKey {{ elem: {} }})",
                elem(k.elem)
            ),
            KernelKey::FlashFwd(k) => format!(
                "KernelKey::FlashFwd(FlashKey {{ elem: {}, head_dim: {}, causal: {} }})",
                elem(k.elem),
                k.head_dim,
                k.causal
            ),
            KernelKey::StridedCopy(k) => format!(
                "KernelKey::StridedCopy(StridedCopyKey {{ elem: {} }})",
                elem(k.elem)
            ),
            KernelKey::BiasAdd(k) => {
                format!(
                    "KernelKey::BiasAdd(BiasAddKey {{ elem: {} }})",
                    elem(k.elem)
                )
            }
            KernelKey::AttentionCombine(k) => format!(
                "KernelKey::AttentionCombine(AttentionCombineKey {{ elem: {} }})",
                elem(k.elem)
            ),
            KernelKey::Convert(k) => format!(
                "KernelKey::Convert(ConvertKey {{ from: {}, to: {} }})",
                elem(k.from),
                elem(k.to)
            ),
            KernelKey::MaskedSoftmax(k) => format!(
                "KernelKey::MaskedSoftmax(MaskedSoftmaxKey {{ elem: {}, mask: {} }})",
                elem(k.elem),
                mask(k.mask)
            ),
            KernelKey::MemEffFwd(k) => format!(
                "KernelKey::MemEffFwd(MemEffKey {{ elem: {}, mask: {}, head_dim_max: {} }})",
                elem(k.elem),
                mask(k.mask),
                k.head_dim_max
            ),
        }
    }
}
