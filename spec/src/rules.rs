//! What each scaled-dot-product-attention backend accepts (`docs/behaviour.md` §2): the one
//! description read both by the run-time selection (`backends::attention::check`) and by
//! the compile-time checks of `#[backends::sdpa_kernel]`, so the two cannot disagree.
//!
//! The rules are static facts about a backend on a kind of device ([`Target`]); the
//! checks that need the call's data (lengths, strides, presence) stay in the selection.

use std::fmt;

use crate::keys::{Elem, FlashKey, KernelKey, MaskKind, MemEffKey};
use crate::variants::{FLASH_HEAD_DIMS, MEM_EFF_HEAD_DIMS};

/// An SDPA backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Flash attention (tiled, online softmax).
    Flash,
    /// Memory-efficient attention.
    MemEfficient,
    /// The reference implementation.
    Math,
    /// cuDNN's fused attention.
    Cudnn,
}

impl Backend {
    /// The name PyTorch's warnings and errors use.
    pub fn title(self) -> &'static str {
        match self {
            Backend::Flash => "Flash attention",
            Backend::MemEfficient => "Memory efficient attention",
            Backend::Math => "Math attention",
            Backend::Cudnn => "cuDNN attention",
        }
    }
}

/// A kind of device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A wgpu adapter.
    Wgpu,
    /// An NVIDIA GPU.
    Cuda,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

/// The facts about a device that the rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The kind of device.
    pub kind: DeviceKind,
    /// CUDA compute capability `(major, minor)`, where known.
    pub sm: Option<(u32, u32)>,
    /// wgpu: the adapter has `shader-f16`.
    pub shader_f16: bool,
    /// cuDNN's version where it loads (e.g. 90100).
    pub cudnn_version: Option<u32>,
}

impl Target {
    /// The most capable device of `kind` (sm 9.0, `shader-f16`, a recent cuDNN): what a
    /// compile-time check assumes, so that it rejects only what no such device accepts.
    pub fn most_capable(kind: DeviceKind) -> Target {
        Target {
            kind,
            sm: (kind == DeviceKind::Cuda).then_some((9, 0)),
            shader_f16: kind == DeviceKind::Wgpu,
            cudnn_version: (kind == DeviceKind::Cuda).then_some(u32::MAX),
        }
    }
}

/// Whether `backend` has kernels for devices of `kind` at all.
pub fn has_kernel(backend: Backend, kind: DeviceKind) -> bool {
    use {Backend as B, DeviceKind as K};
    match (backend, kind) {
        (B::Math | B::Flash, _) => true,
        (B::MemEfficient, K::Wgpu | K::Cuda) => true,
        (B::Cudnn, K::Cuda) => true,
        (B::MemEfficient | B::Cudnn, _) => false,
    }
}

/// The element types `backend` takes on `target`.
pub fn dtypes(backend: Backend, target: &Target) -> &'static [Elem] {
    use {Backend as B, DeviceKind as K, Elem::*};
    match (backend, target.kind) {
        (B::Math, _) | (B::Flash, K::Cpu) => &[F32, F64, Bf16, F16],
        // bf16 on wgpu runs the f32 kernels on widened copies (see `compute_elem`).
        (B::Flash, K::Wgpu) if target.shader_f16 => &[F16, F32, Bf16],
        (B::MemEfficient, K::Wgpu) if target.shader_f16 => &[F32, F16, Bf16],
        (B::Flash | B::MemEfficient, K::Wgpu) => &[F32, Bf16],
        (B::Flash | B::Cudnn, K::Cuda) => &[F16, Bf16],
        (B::MemEfficient, K::Cuda) if target.sm.is_none_or(|sm| sm >= (8, 0)) => &[F32, F16, Bf16],
        (B::MemEfficient, K::Cuda) => &[F32, F16],
        (B::MemEfficient | B::Cudnn, K::Cpu) | (B::Cudnn, K::Wgpu) => &[],
    }
}

/// The element type the kernels compute `elem` inputs in on devices of `kind`: bf16 on wgpu
/// is widened to f32 on the device (WGSL has no bf16) and the result rounded back; every
/// other type is computed as itself.
pub fn compute_elem(kind: DeviceKind, elem: Elem) -> Elem {
    match (kind, elem) {
        (DeviceKind::Wgpu, Elem::Bf16) => Elem::F32,
        _ => elem,
    }
}

/// The oldest CUDA compute capability `backend` runs on: the oldest arch a built kernel of
/// it serves (the SIMT memory-efficient kernels are built for the sm_70 tier, see
/// [`crate::variants::PTX_TIERS`]), so older GPUs fall back instead of failing at load.
pub fn min_arch(backend: Backend) -> Option<(u32, u32)> {
    match backend {
        Backend::Flash | Backend::Cudnn => Some((8, 0)),
        Backend::MemEfficient => Some((7, 0)),
        Backend::Math => None,
    }
}

/// A rule on the head dimension: q, k and v share it, it is at most `max` and a multiple
/// of `multiple_of`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadDims {
    /// The largest head dimension.
    pub max: usize,
    /// What it must be a multiple of (1: anything).
    pub multiple_of: usize,
}

impl HeadDims {
    /// Whether q, k and v head dimensions `[q, k, v]` keep the rule.
    pub fn allows(&self, [q, k, v]: [usize; 3]) -> bool {
        q == k && k == v && q <= self.max && q % self.multiple_of == 0
    }
}

impl fmt::Display for HeadDims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("q,k,v to have the same last dimension")?;
        if self.multiple_of > 1 {
            write!(f, ", divisible by {},", self.multiple_of)?;
        }
        write!(f, " and to be less than or equal to {}", self.max)
    }
}

/// The head-dimension rule of `backend` on `target` for `elem` inputs (`None`: any).
pub fn head_dims(backend: Backend, target: &Target, elem: Elem) -> Option<HeadDims> {
    let gpu = matches!(target.kind, DeviceKind::Wgpu | DeviceKind::Cuda);
    let sixteen_bit = matches!(compute_elem(target.kind, elem), Elem::F16 | Elem::Bf16);
    match backend {
        Backend::Flash if gpu => Some(HeadDims {
            max: 256,
            multiple_of: 1,
        }),
        Backend::MemEfficient if gpu => Some(HeadDims {
            max: 256,
            multiple_of: if sixteen_bit { 8 } else { 4 },
        }),
        Backend::Cudnn => {
            let hopper = target.sm.is_some_and(|sm| sm.0 >= 9);
            let new_cudnn = target.cudnn_version.is_some_and(|v| v >= 90500);
            Some(HeadDims {
                max: if hopper && new_cudnn { 256 } else { 128 },
                multiple_of: 8,
            })
        }
        _ => None,
    }
}

/// Whether `backend` takes an `attn_mask` on devices of `kind`.
pub fn takes_mask(backend: Backend, kind: DeviceKind) -> bool {
    match backend {
        Backend::Math | Backend::MemEfficient => true,
        Backend::Flash => kind == DeviceKind::Cpu,
        Backend::Cudnn => false,
    }
}

/// Whether `backend` applies dropout on devices of `kind`. The CPU fused path and the
/// WGSL kernels apply none; such calls take math.
pub fn takes_dropout(backend: Backend, kind: DeviceKind) -> bool {
    backend == Backend::Math || kind == DeviceKind::Cuda
}

/// Whether `backend` does grouped-query attention (`enable_gqa` with fewer kv heads).
pub fn takes_gqa(backend: Backend) -> bool {
    matches!(backend, Backend::Math | Backend::Flash)
}

/// Whether `backend` takes `is_causal` (top-left aligned) with query length != key length.
/// PyTorch's GPU flash kernels align the causal mask bottom-right, so PyTorch refuses it
/// there, and so do we (the same call selects the same backend).
pub fn causal_any_lengths(backend: Backend, kind: DeviceKind) -> bool {
    !(backend == Backend::Flash && kind != DeviceKind::Cpu)
}

/// Whether `backend` takes a bottom-right aligned causal mask (`causal_lower_right`) with
/// query length != key length. Our cuDNN graph builds the top-left mask only.
pub fn causal_lower_right(backend: Backend) -> bool {
    backend != Backend::Cudnn
}

/// Whether `backend` takes a sliding window (keys hidden beyond a band around the
/// diagonal). Our cuDNN graph builds no band mask.
pub fn takes_window(backend: Backend) -> bool {
    backend != Backend::Cudnn
}

/// The generated kernel that serves a wgpu or CUDA call of `backend` with `elem` inputs,
/// head dimension `head_dim` (padded up to the next built one), causal flag and mask.
pub fn kernel_key(
    backend: Backend,
    elem: Elem,
    head_dim: usize,
    causal: bool,
    mask: MaskKind,
) -> Option<KernelKey> {
    let fits = |dims: &[u32]| dims.iter().copied().find(|&d| d as usize >= head_dim);
    match backend {
        Backend::Flash => fits(&FLASH_HEAD_DIMS).map(|head_dim| {
            KernelKey::FlashFwd(FlashKey {
                elem,
                head_dim,
                causal,
            })
        }),
        Backend::MemEfficient => fits(&MEM_EFF_HEAD_DIMS).map(|head_dim_max| {
            KernelKey::MemEffFwd(MemEffKey {
                elem,
                mask,
                head_dim_max,
            })
        }),
        Backend::Math | Backend::Cudnn => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variants;

    #[test]
    fn every_accepted_gpu_call_has_a_built_kernel_for_that_gpu() {
        let built: Vec<_> = variants::all();
        let cuda = |sm| Target {
            sm: Some(sm),
            ..Target::most_capable(DeviceKind::Cuda)
        };
        let targets = [
            Target::most_capable(DeviceKind::Wgpu),
            Target::most_capable(DeviceKind::Cuda),
            // V100, T4, A100, A10, H100: each accepted call has a kernel built for its arch.
            cuda((7, 0)),
            cuda((7, 5)),
            cuda((8, 0)),
            cuda((8, 6)),
            cuda((9, 0)),
        ];
        for target in targets {
            let kind = target.kind;
            for backend in [Backend::Flash, Backend::MemEfficient] {
                if let (Some(sm), Some(min)) = (target.sm, min_arch(backend))
                    && sm < min
                {
                    continue;
                }
                for &elem in dtypes(backend, &target) {
                    let rule = head_dims(backend, &target, elem).expect("GPU rule");
                    for d in (1..=rule.max).filter(|d| rule.allows([*d; 3])) {
                        let mask = if takes_mask(backend, kind) {
                            MaskKind::Bool
                        } else {
                            MaskKind::None
                        };
                        let key = kernel_key(backend, compute_elem(kind, elem), d, false, mask)
                            .unwrap_or_else(|| panic!("{backend:?} {elem:?} d={d}"));
                        let served = built.iter().any(|v| {
                            v.key == key
                                && match (kind, target.sm) {
                                    (DeviceKind::Cuda, Some((major, minor))) => {
                                        let sm = major * 10 + minor;
                                        v.cuda.as_ref().is_some_and(|c| c.min_sm <= sm)
                                            && variants::tier_for(sm).is_some()
                                    }
                                    _ => v.wgsl.is_some(),
                                }
                        });
                        assert!(
                            served,
                            "{kind} {:?} {key:?} is accepted but not built",
                            target.sm
                        );
                    }
                }
            }
        }
        // Older than every tier: nothing fused is accepted, math serves.
        for backend in [Backend::Flash, Backend::MemEfficient, Backend::Cudnn] {
            assert!(
                min_arch(backend).is_some_and(|min| min > (6, 1)),
                "{backend:?}"
            );
        }
        assert_eq!(
            min_arch(Backend::MemEfficient).map(|(major, minor)| major * 10 + minor),
            Some(variants::PTX_TIERS[0])
        );
    }

    #[test]
    fn head_dim_rule_reads_as_pytorch_words() {
        let flash = head_dims(
            Backend::Flash,
            &Target::most_capable(DeviceKind::Cuda),
            Elem::F16,
        );
        assert_eq!(
            flash.unwrap().to_string(),
            "q,k,v to have the same last dimension and to be less than or equal to 256"
        );
        let mem = head_dims(
            Backend::MemEfficient,
            &Target::most_capable(DeviceKind::Cuda),
            Elem::F32,
        );
        assert_eq!(
            mem.unwrap().to_string(),
            "q,k,v to have the same last dimension, divisible by 4, and to be less than or equal to 256"
        );
    }
}
