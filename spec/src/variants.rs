//! The declaration of every kernel specialisation that is built: the one place to add one.
//!
//! Each [`Variant`] names its typed key, and for each target that serves it, the constants
//! injected into the template (CUDA: `#define NAME value`; WGSL: `alias NAME = type;` or
//! `const NAME: u32 = value;`) and its launch geometry.

use crate::keys::*;

/// The virtual architectures (compute capability × 10) PTX is generated for. Each is a tier:
/// its module of a family holds the variants that run there (`min_sm` at most the tier),
/// and a device uses the newest tier not above its own arch. 70 serves the SIMT kernels
/// (IEEE fp32 GEMM, memory-efficient attention in f32/f16) from Volta on; 80 serves every
/// kernel, tensor-core ones included, from Ampere on (and later GPUs through the driver's
/// PTX JIT).
pub const PTX_TIERS: [u32; 2] = [70, 80];

/// The real architectures a cubin (SASS) is assembled for, each from the PTX of the newest
/// tier not above it: Turing (T4), Ampere (A100, A10/RTX 30), Ada (L4/RTX 40), Hopper.
pub const CUBIN_ARCHS: [u32; 5] = [75, 80, 86, 89, 90];

/// The tier whose module serves a device of arch `sm`: the newest tier not above it.
pub fn tier_for(sm: u32) -> Option<u32> {
    PTX_TIERS.iter().copied().filter(|&t| t <= sm).max()
}

/// The head dimensions flash attention is specialised for (a call of another head dim runs
/// the next larger one, its tiles zero past the call's).
pub const FLASH_HEAD_DIMS: [u32; 5] = [32, 64, 96, 128, 256];

/// The largest head dimensions memory-efficient attention is specialised for.
pub const MEM_EFF_HEAD_DIMS: [u32; 3] = [64, 128, 256];

/// A WGSL declaration injected before a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WgslDecl {
    /// `alias NAME = TYPE;`
    Alias(&'static str, &'static str),
    /// `const NAME: u32 = VALUEu;`
    Const(&'static str, u32),
}

/// How a kernel is launched: threads per block (workgroup) and the output tile one block covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Threads per block, x/y/z.
    pub threads: [u32; 3],
    /// Output rows and columns (or elements, as `[n, 1]`) one block covers.
    pub tile: [u32; 2],
    /// Static shared (workgroup) memory in bytes.
    pub shared_bytes: u32,
}

/// One element per thread, 256 threads per block: the launch of the element-wise kernels.
const ELEMENTWISE: Launch = Launch {
    threads: [256, 1, 1],
    tile: [256, 1],
    shared_bytes: 0,
};

/// The CUDA side of a variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaSpec {
    /// `#define` names and values.
    pub defines: Vec<(&'static str, String)>,
    /// Launch geometry.
    pub launch: Launch,
    /// Lowest compute capability (× 10) the kernel runs on.
    pub min_sm: u32,
}

/// The WGSL side of a variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslSpec {
    /// Declarations injected before the template.
    pub decls: Vec<WgslDecl>,
    /// Launch geometry.
    pub launch: Launch,
    /// Whether it needs the adapter feature `shader-f16`.
    pub needs_f16: bool,
}

/// One specialisation of a kernel template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// What it computes.
    pub key: KernelKey,
    /// Its entry point name (CUDA) and file stem, unique in the table.
    pub name: String,
    /// The CUDA build, where CUDA serves this key.
    pub cuda: Option<CudaSpec>,
    /// The WGSL build, where wgpu serves this key.
    pub wgsl: Option<WgslSpec>,
}

impl Variant {
    /// The key's family.
    pub fn family(&self) -> Family {
        self.key.family()
    }
}

fn cuda_t(elem: Elem) -> (&'static str, String) {
    ("T", elem.cuda_type().to_string())
}

fn wgsl_t(elem: Elem) -> Option<WgslDecl> {
    elem.wgsl_type().map(|t| WgslDecl::Alias("T", t))
}

/// A GEMM variant, WGSL too where `wgsl` says.
fn gemm(elem: Elem, math: GemmMath, acc_f16: bool, partials: Elem, wgsl: bool) -> Variant {
    gemm_of(elem, math, acc_f16, partials, false, wgsl)
}

/// The implicit-GEMM convolution of `elem` under `math` (f32 accumulators and partials, as
/// cuDNN's convolutions keep them whatever matmul's reduced-precision flags say), on CUDA
/// where `cuda` says, in WGSL too where `wgsl` says.
fn conv_gemm(elem: Elem, math: GemmMath, cuda: bool, wgsl: bool) -> Variant {
    let variant = gemm_of(elem, math, false, Elem::F32, true, wgsl);
    Variant {
        cuda: variant.cuda.filter(|_| cuda),
        ..variant
    }
}

fn gemm_of(
    elem: Elem,
    math: GemmMath,
    acc_f16: bool,
    partials: Elem,
    conv: bool,
    wgsl: bool,
) -> Variant {
    let math_code = match math {
        GemmMath::Ieee => 0,
        GemmMath::Tf32 => 1,
        GemmMath::Bf16 => 2,
        GemmMath::F16 => 3,
    };
    let smem_elem = if math_code <= 1 { 4 } else { 2 };
    let name = format!(
        "{}_{}_{:?}_acc{}_p{}",
        if conv { "conv_gemm" } else { "gemm" },
        elem.name(),
        math,
        if acc_f16 { 16 } else { 32 },
        partials.name()
    )
    .to_lowercase();
    let cuda = CudaSpec {
        defines: vec![
            cuda_t(elem),
            ("MATH", math_code.to_string()),
            ("ACC_F16", u32::from(acc_f16).to_string()),
            ("P", partials.cuda_type().to_string()),
            ("CONV", u32::from(conv).to_string()),
            ("BM", "64".into()),
            ("BN", "64".into()),
            ("BK", "32".into()),
        ],
        launch: Launch {
            threads: [128, 1, 1],
            tile: [64, 64],
            shared_bytes: 2 * 64 * 33 * smem_elem,
        },
        min_sm: if math == GemmMath::Ieee { 70 } else { 80 },
    };
    // wgpu has no tensor cores: TF32 and bf16 are emulated by rounding the inputs.
    let wgsl = wgsl.then(|| WgslSpec {
        decls: vec![
            wgsl_t(elem).expect("wgsl gemm for a WGSL type"),
            WgslDecl::Const("MATH", if math == GemmMath::F16 { 0 } else { math_code }),
            WgslDecl::Const("BM", 64),
            WgslDecl::Const("BN", 64),
            WgslDecl::Const("BK", 16),
            WgslDecl::Const("CONV", u32::from(conv)),
        ],
        launch: Launch {
            threads: [16, 16, 1],
            tile: [64, 64],
            shared_bytes: 4 * 2 * 64 * 16,
        },
        needs_f16: elem == Elem::F16,
    });
    Variant {
        key: KernelKey::Gemm(GemmKey {
            elem,
            math,
            acc_f16,
            partials,
            conv,
        }),
        name,
        cuda: Some(cuda),
        wgsl,
    }
}

fn splitk_reduce(elem: Elem, partials: Elem) -> Variant {
    Variant {
        key: KernelKey::SplitKReduce(SplitKReduceKey { elem, partials }),
        name: format!("splitk_reduce_{}_p{}", elem.name(), partials.name()),
        cuda: Some(CudaSpec {
            defines: vec![
                cuda_t(elem),
                ("P", partials.cuda_type().to_string()),
                ("REDUCE_IN_P", u32::from(partials != Elem::F32).to_string()),
            ],
            launch: ELEMENTWISE,
            // bf16 conversions (`cvt.rn.bf16.f32`) need sm_80.
            min_sm: if elem == Elem::Bf16 || partials == Elem::Bf16 {
                80
            } else {
                70
            },
        }),
        wgsl: None,
    }
}

fn scale(elem: Elem) -> Variant {
    Variant {
        key: KernelKey::Scale(ScaleKey { elem }),
        name: format!("scale_{}", elem.name()),
        cuda: Some(CudaSpec {
            defines: vec![cuda_t(elem)],
            launch: ELEMENTWISE,
            min_sm: 70,
        }),
        wgsl: None,
    }
}

fn triangle(elem: Elem) -> Variant {
    Variant {
        key: KernelKey::Triangle(TriangleKey { elem }),
        name: format!("triangle_{}", elem.name()),
        cuda: Some(CudaSpec {
            defines: vec![cuda_t(elem)],
            launch: ELEMENTWISE,
            min_sm: 70,
        }),
        wgsl: None,
    }
}

fn masked_softmax(elem: Elem, mask: MaskKind) -> Variant {
    let cuda_mask = if mask == MaskKind::Bool {
        "unsigned char"
    } else {
        elem.cuda_type()
    };
    Variant {
        key: KernelKey::MaskedSoftmax(MaskedSoftmaxKey { elem, mask }),
        name: format!("masked_softmax_{}_{}", elem.name(), mask.name()),
        cuda: Some(CudaSpec {
            defines: vec![
                cuda_t(elem),
                ("M", cuda_mask.to_string()),
                ("MASK_KIND", mask.code().to_string()),
            ],
            launch: Launch {
                threads: [256, 1, 1],
                tile: [1, 1],
                shared_bytes: 4 * 8,
            },
            min_sm: 70,
        }),
        wgsl: wgsl_t(elem).map(|t| WgslSpec {
            decls: vec![
                t,
                wgsl_mask_t(elem, mask),
                WgslDecl::Const("MASK_KIND", mask.code()),
            ],
            launch: Launch {
                threads: [256, 1, 1],
                tile: [1, 1],
                shared_bytes: 4 * 256,
            },
            needs_f16: elem == Elem::F16,
        }),
    }
}

/// The strided copy, which moves elements as opaque words of `elem`'s size: one element per
/// thread, 256 threads per block; WGSL moves 32-bit words only.
fn strided_copy(elem: Elem) -> Variant {
    let word = match elem {
        Elem::F16 | Elem::Bf16 => "unsigned short",
        Elem::F32 => "unsigned int",
        Elem::F64 => "unsigned long long",
    };
    Variant {
        key: KernelKey::StridedCopy(StridedCopyKey { elem }),
        name: format!("strided_copy_{}", elem.name()),
        cuda: Some(CudaSpec {
            defines: vec![("T", word.to_string())],
            launch: ELEMENTWISE,
            min_sm: 70,
        }),
        wgsl: (elem == Elem::F32).then(|| WgslSpec {
            decls: vec![WgslDecl::Alias("T", "u32")],
            launch: ELEMENTWISE,
            needs_f16: false,
        }),
    }
}

fn bias_add(elem: Elem) -> Variant {
    Variant {
        key: KernelKey::BiasAdd(BiasAddKey { elem }),
        name: format!("bias_add_{}", elem.name()),
        cuda: Some(CudaSpec {
            defines: vec![
                cuda_t(elem),
                ("IS_F64", u32::from(elem == Elem::F64).to_string()),
            ],
            launch: ELEMENTWISE,
            // bf16 conversions (`cvt.rn.bf16.f32`) need sm_80.
            min_sm: if elem == Elem::Bf16 { 80 } else { 70 },
        }),
        wgsl: (elem == Elem::F32).then(|| WgslSpec {
            decls: vec![WgslDecl::Alias("T", "f32")],
            launch: ELEMENTWISE,
            needs_f16: false,
        }),
    }
}

fn attention_combine(elem: Elem) -> Variant {
    Variant {
        key: KernelKey::AttentionCombine(AttentionCombineKey { elem }),
        name: format!("attention_combine_{}", elem.name()),
        cuda: Some(CudaSpec {
            defines: vec![cuda_t(elem)],
            launch: ELEMENTWISE,
            min_sm: if elem == Elem::Bf16 { 80 } else { 70 },
        }),
        wgsl: wgsl_t(elem).map(|t| WgslSpec {
            decls: vec![t],
            launch: ELEMENTWISE,
            needs_f16: elem == Elem::F16,
        }),
    }
}

/// A half type (f16, bf16) <-> f32: bf16 wgpu tensors widened for kernels that compute in
/// f32 and their results rounded back (WGSL has no bf16), and half-type inputs of math
/// attention on a device, which computes in f32, on wgpu and CUDA.
fn convert(from: Elem, to: Elem) -> Variant {
    let half = if from == Elem::F32 { to } else { from };
    Variant {
        key: KernelKey::Convert(ConvertKey { from, to }),
        name: format!("convert_{}_to_{}", from.name(), to.name()),
        cuda: Some(CudaSpec {
            defines: vec![
                ("FROM", from.cuda_type().to_string()),
                ("TO", to.cuda_type().to_string()),
            ],
            launch: ELEMENTWISE,
            // bf16 conversions (`cvt.rn.bf16.f32`) need sm_80.
            min_sm: if half == Elem::Bf16 { 80 } else { 70 },
        }),
        // Both sides as u32 words: WGSL has no bf16, and f16 needs no extension this way.
        wgsl: Some(WgslSpec {
            decls: vec![
                WgslDecl::Const("NARROW", u32::from(to != Elem::F32)),
                WgslDecl::Const("F16", u32::from(half == Elem::F16)),
            ],
            launch: ELEMENTWISE,
            needs_f16: false,
        }),
    }
}

fn wgsl_mask_t(elem: Elem, mask: MaskKind) -> WgslDecl {
    match mask {
        MaskKind::Additive => WgslDecl::Alias("MASK_T", elem.wgsl_type().unwrap_or("f32")),
        MaskKind::Bool | MaskKind::None => WgslDecl::Alias("MASK_T", "u32"),
    }
}

/// WGSL attention tiles (query rows, keys per step) for a head dimension, sized for 32 KiB
/// of workgroup memory.
fn wgsl_attention_tiles(d: u32) -> (u32, u32) {
    match d {
        0..=64 => (16, 32),
        65..=128 => (16, 16),
        _ => (8, 8),
    }
}

fn wgsl_attention(elem: Elem, d: u32, mask: MaskKind, causal_code: u32) -> Option<WgslSpec> {
    let (bm, bn) = wgsl_attention_tiles(d);
    Some(WgslSpec {
        decls: vec![
            wgsl_t(elem)?,
            wgsl_mask_t(elem, mask),
            WgslDecl::Const("MASK_KIND", mask.code()),
            WgslDecl::Const("CAUSAL", causal_code),
            WgslDecl::Const("D_MAX", d),
            WgslDecl::Const("BLOCK_M", bm),
            WgslDecl::Const("BLOCK_N", bn),
        ],
        launch: Launch {
            threads: [64, 1, 1],
            tile: [bm, 1],
            shared_bytes: 4 * (bm * d + 2 * bn * d + bm * bn),
        },
        needs_f16: elem == Elem::F16,
    })
}

fn flash(elem: Elem, head_dim: u32, causal: bool) -> Variant {
    let (warps, block_n) = if head_dim <= 128 { (4, 64) } else { (2, 32) };
    let cuda = (elem != Elem::F32).then(|| CudaSpec {
        defines: vec![
            cuda_t(elem),
            ("HEAD_DIM", head_dim.to_string()),
            ("WARPS", warps.to_string()),
            ("BLOCK_N", block_n.to_string()),
            ("CAUSAL", u32::from(causal).to_string()),
        ],
        launch: Launch {
            threads: [32 * warps, 1, 1],
            tile: [16 * warps, 1],
            shared_bytes: 2 * head_dim * (16 * warps + 2 * block_n),
        },
        min_sm: 80,
    });
    Variant {
        key: KernelKey::FlashFwd(FlashKey {
            elem,
            head_dim,
            causal,
        }),
        name: format!(
            "flash_fwd_{}_d{head_dim}{}",
            elem.name(),
            if causal { "_causal" } else { "" }
        ),
        cuda,
        wgsl: wgsl_attention(elem, head_dim, MaskKind::None, u32::from(causal)),
    }
}

fn mem_eff(elem: Elem, mask: MaskKind, head_dim_max: u32) -> Variant {
    let (bm, bn) = match head_dim_max {
        0..=64 => (32, 32),
        65..=128 => (32, 16),
        _ => (16, 8),
    };
    let cuda_mask = if mask == MaskKind::Bool {
        "unsigned char"
    } else {
        elem.cuda_type()
    };
    let d = head_dim_max;
    Variant {
        key: KernelKey::MemEffFwd(MemEffKey {
            elem,
            mask,
            head_dim_max,
        }),
        name: format!(
            "mem_eff_fwd_{}_{}_d{head_dim_max}",
            elem.name(),
            mask.name()
        ),
        cuda: Some(CudaSpec {
            defines: vec![
                cuda_t(elem),
                ("M", cuda_mask.to_string()),
                ("MASK_KIND", mask.code().to_string()),
                ("D_MAX", d.to_string()),
                ("BLOCK_M", bm.to_string()),
                ("BLOCK_N", bn.to_string()),
            ],
            launch: Launch {
                threads: [128, 1, 1],
                tile: [bm, 1],
                shared_bytes: 4 * (bm * d + bn * (d + 1) + bn * d + bm * bn),
            },
            min_sm: if elem == Elem::Bf16 { 80 } else { 70 },
        }),
        wgsl: wgsl_attention(elem, d, mask, 2),
    }
}

/// Every specialisation that is built, in a fixed order.
pub fn all() -> Vec<Variant> {
    use Elem::*;
    use GemmMath as G;
    let mut v = vec![
        gemm(F32, G::Ieee, false, F32, true),
        gemm(F32, G::Tf32, false, F32, true),
        gemm(F32, G::Bf16, false, F32, true),
        gemm(F16, G::F16, false, F32, true),
        gemm(F16, G::F16, false, F16, false),
        gemm(F16, G::F16, true, F32, false),
        gemm(F16, G::F16, true, F16, false),
        gemm(Bf16, G::Bf16, false, F32, false),
        gemm(Bf16, G::Bf16, false, Bf16, false),
        // wgpu's f32 convolutions follow matmul's fp32_precision, CUDA's cudnn.allow_tf32.
        conv_gemm(F32, G::Ieee, true, true),
        conv_gemm(F32, G::Tf32, true, true),
        conv_gemm(F32, G::Bf16, false, true),
        conv_gemm(F16, G::F16, true, false),
        conv_gemm(Bf16, G::Bf16, true, false),
    ];
    for (elem, partials) in [
        (F32, F32),
        (F16, F32),
        (F16, F16),
        (Bf16, F32),
        (Bf16, Bf16),
    ] {
        v.push(splitk_reduce(elem, partials));
    }
    for elem in [F32, F64] {
        v.push(scale(elem));
        v.push(triangle(elem));
    }
    // One copy per element size: 2 (f16 and bf16), 4 and 8 bytes.
    for elem in [F16, F32, F64] {
        v.push(strided_copy(elem));
    }
    for elem in [F32, F64, F16, Bf16] {
        v.push(bias_add(elem));
    }
    for elem in [F32, F16, Bf16] {
        v.push(attention_combine(elem));
    }
    for half in [F16, Bf16] {
        v.push(convert(half, F32));
        v.push(convert(F32, half));
    }
    // Math attention on a device computes in f32 (half-type inputs converted on the device).
    for mask in [MaskKind::None, MaskKind::Bool, MaskKind::Additive] {
        v.push(masked_softmax(F32, mask));
    }
    // Flash in f32 runs on wgpu only, in bf16 on CUDA only (WGSL has no bf16).
    for elem in [F32, F16, Bf16] {
        for d in FLASH_HEAD_DIMS {
            for causal in [false, true] {
                v.push(flash(elem, d, causal));
            }
        }
    }
    for elem in [F32, F16, Bf16] {
        for mask in [MaskKind::None, MaskKind::Bool, MaskKind::Additive] {
            for d in MEM_EFF_HEAD_DIMS {
                v.push(mem_eff(elem, mask, d));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys_are_unique() {
        let all = all();
        let mut names: Vec<&str> = all.iter().map(|v| v.name.as_str()).collect();
        let mut keys: Vec<KernelKey> = all.iter().map(|v| v.key).collect();
        names.sort_unstable();
        names.dedup();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(keys.len(), all.len());
    }

    #[test]
    fn every_variant_has_a_target_and_fits_its_memory() {
        for v in all() {
            assert!(v.cuda.is_some() || v.wgsl.is_some(), "{}", v.name);
            if let Some(c) = &v.cuda {
                assert!(
                    c.launch.shared_bytes <= 48 * 1024,
                    "{} static shared memory",
                    v.name
                );
            }
            if let Some(w) = &v.wgsl {
                assert!(
                    w.launch.shared_bytes <= 32 * 1024,
                    "{} workgroup memory",
                    v.name
                );
                assert!(
                    w.launch.threads.iter().product::<u32>() <= 256,
                    "{}",
                    v.name
                );
            }
        }
    }

    #[test]
    fn flash_covers_every_head_dim_on_cuda_in_16_bit() {
        let all = all();
        for elem in [Elem::F16, Elem::Bf16] {
            for head_dim in FLASH_HEAD_DIMS {
                for causal in [false, true] {
                    let key = KernelKey::FlashFwd(FlashKey {
                        elem,
                        head_dim,
                        causal,
                    });
                    assert!(
                        all.iter().any(|v| v.key == key && v.cuda.is_some()),
                        "{key:?}"
                    );
                }
            }
        }
    }
}
