//! The generated kernel table and the CUDA code behind it.
//!
//! `build.rs` renders every specialisation declared in `backends-spec` and embeds the
//! results here: WGSL and MSL per wgpu variant; per CUDA family and tier
//! ([`PTX_TIERS`]) the source, its PTX when NVRTC was present at build time, and cubins
//! for [`CUBIN_ARCHS`] when ptxas was (ahead of time, "AOT"). A device loads, in order of
//! preference ([`image_for`]): the cubin of its arch (or of an older minor of its major),
//! the PTX of its tier (the driver JIT-compiles it), or PTX compiled now from the embedded
//! source by NVRTC ("JIT", cached in the process and on disk).

use std::borrow::Cow;

pub use backends_spec::keys::*;
pub use backends_spec::rules;
pub use backends_spec::table::*;
pub use backends_spec::variants::{
    CUBIN_ARCHS, FLASH_HEAD_DIMS, MEM_EFF_HEAD_DIMS, PTX_TIERS, tier_for,
};

pub(crate) mod attention;
pub(crate) mod convert;
pub(crate) mod dispatch;
pub(crate) mod gemm;
mod jit;
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd;
pub(crate) mod transpose;

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}
pub use generated::{CUBIN_ARCHS_BUILT, CUDA_MODULES, ENTRIES, PTX_ARCHS, lookup};

use crate::{Error, Result};

/// The environment variable that makes the loader ignore the embedded PTX (to exercise JIT).
pub const DISABLE_AOT_ENV: &str = "BACKENDS_DISABLE_AOT";
/// The environment variable that overrides the on-disk PTX cache folder.
pub const CACHE_DIR_ENV: &str = "BACKENDS_CACHE_DIR";

/// Where the CUDA kernels come from in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaCode {
    /// PTX generated at build time and embedded.
    Aot,
    /// Compiled at run time by NVRTC from the embedded source.
    Jit,
    /// Neither: no PTX was built and NVRTC cannot be loaded.
    None,
}

impl std::fmt::Display for CudaCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CudaCode::Aot => "AOT",
            CudaCode::Jit => "JIT",
            CudaCode::None => "none",
        })
    }
}

fn aot_disabled() -> bool {
    std::env::var(DISABLE_AOT_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Where the CUDA kernels come from: AOT when PTX is embedded (and not disabled), else JIT
/// when NVRTC loads, else none.
pub fn cuda_code() -> CudaCode {
    if !cfg!(feature = "cuda") {
        CudaCode::None
    } else if !PTX_ARCHS.is_empty() && !aot_disabled() {
        CudaCode::Aot
    } else if jit::nvrtc().is_ok() {
        CudaCode::Jit
    } else {
        CudaCode::None
    }
}

/// The CUDA module of `family` that serves a device of arch `sm` (× 10): the module of the
/// newest tier not above `sm`.
pub fn cuda_module(family: Family, sm: u32) -> Option<&'static CudaModuleSource> {
    let tier = tier_for(sm)?;
    CUDA_MODULES
        .iter()
        .find(|m| m.family == family && m.tier == tier)
}

fn no_module(family: Family, sm: u32) -> Error {
    Error::Unavailable {
        what: "CUDA kernels",
        why: match tier_for(sm) {
            None => format!(
                "sm_{sm} is older than every architecture the kernels are built for \
                 (compute_{PTX_TIERS:?}); use an sm_{} or newer GPU",
                PTX_TIERS[0]
            ),
            Some(tier) => {
                format!("{family} has no kernel that runs on sm_{sm} (tier compute_{tier})")
            }
        },
    }
}

/// What the driver is handed to load a module on a device.
#[derive(Clone, Debug)]
pub enum ModuleImage {
    /// SASS assembled at build time for `arch` (× 10).
    Cubin {
        /// The arch the cubin was assembled for.
        arch: u32,
        /// The ELF image.
        bytes: &'static [u8],
    },
    /// PTX for `compute_{tier}`, which the driver compiles on load.
    Ptx {
        /// The module's tier.
        tier: u32,
        /// The PTX text.
        text: Cow<'static, str>,
        /// Compiled by NVRTC in this process (JIT) rather than embedded.
        jit: bool,
    },
}

impl std::fmt::Display for ModuleImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleImage::Cubin { arch, .. } => write!(f, "cubin sm_{arch}"),
            ModuleImage::Ptx {
                tier, jit: false, ..
            } => write!(f, "PTX compute_{tier}"),
            ModuleImage::Ptx {
                tier, jit: true, ..
            } => write!(f, "NVRTC JIT compute_{tier}"),
        }
    }
}

/// The cubin of `module` for a device of arch `sm`: the one assembled for `sm`, else for the
/// newest older minor version of the same major (SASS runs within a major, not across).
fn cubin_for(module: &CudaModuleSource, sm: u32) -> Option<(u32, &'static [u8])> {
    module
        .cubins
        .iter()
        .copied()
        .filter(|&(arch, _)| arch / 10 == sm / 10 && arch <= sm)
        .max_by_key(|&(arch, _)| arch)
}

/// The image of `family` a device of arch `sm` loads: its cubin, else the PTX of its tier,
/// else PTX compiled now by NVRTC. `BACKENDS_DISABLE_AOT=1` skips the embedded images.
pub fn image_for(family: Family, sm: u32) -> Result<ModuleImage> {
    let module = cuda_module(family, sm).ok_or_else(|| no_module(family, sm))?;
    if !aot_disabled() {
        if let Some((arch, bytes)) = cubin_for(module, sm) {
            return Ok(ModuleImage::Cubin { arch, bytes });
        }
        if let Some(ptx) = module.ptx {
            return Ok(ModuleImage::Ptx {
                tier: module.tier,
                text: Cow::Borrowed(ptx),
                jit: false,
            });
        }
    }
    Ok(ModuleImage::Ptx {
        tier: module.tier,
        text: Cow::Owned(jit::compiled(module)?.to_string()),
        jit: true,
    })
}

/// The PTX of `family` for a device of arch `sm`: the embedded PTX of its tier, or PTX
/// compiled now by NVRTC (cached). What the PTX interpreter runs, and where launches read
/// each kernel's parameter list.
pub fn ptx_for(family: Family, sm: u32) -> Result<Cow<'static, str>> {
    let module = cuda_module(family, sm).ok_or_else(|| no_module(family, sm))?;
    match module.ptx {
        Some(ptx) if !aot_disabled() => Ok(Cow::Borrowed(ptx)),
        _ => jit::compiled(module).map(|ptx| Cow::Owned(ptx.to_string())),
    }
}

/// The `.version` of a PTX text as `(major, minor)`.
pub fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version"))?;
    let (major, minor) = line.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.trim().parse().ok()?))
}

/// A kernel parameter's PTX type: what a launch must pass in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxParam {
    /// 32-bit integer (`int`).
    B32,
    /// 64-bit integer or pointer (`long long`, `T*`).
    B64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

/// The parameter list of entry point `entry` in `ptx`, or `None` where the PTX has no such
/// entry (or a parameter type this library never uses).
pub fn ptx_params(ptx: &str, entry: &str) -> Option<Vec<PtxParam>> {
    let start = ptx.find(&format!(".entry {entry}("))?;
    let list = &ptx[start..];
    let list = &list[list.find('(')? + 1..list.find(')')?];
    list.split(',')
        .map(|param| {
            let ty = param.split_whitespace().nth(1)?;
            Some(match ty {
                ".u32" | ".s32" | ".b32" => PtxParam::B32,
                ".u64" | ".s64" | ".b64" => PtxParam::B64,
                ".f32" => PtxParam::F32,
                ".f64" => PtxParam::F64,
                _ => return None,
            })
        })
        .collect()
}

pub(crate) fn report() -> serde_json::Value {
    let isa = CUDA_MODULES
        .iter()
        .filter_map(|m| m.ptx.and_then(ptx_isa))
        .max()
        .map(|(major, minor)| format!("{major}.{minor}"));
    serde_json::json!({
        "code": cuda_code().to_string(),
        "cubin_archs": CUBIN_ARCHS_BUILT.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>(),
        "ptx_targets": PTX_ARCHS.iter().map(|a| format!("compute_{a}")).collect::<Vec<_>>(),
        "ptx_isa": isa,
        "nvrtc": jit::nvrtc().map_err(|e| e.to_string()).map_or_else(|e| serde_json::json!({"error": e}), |p| serde_json::json!(p)),
        "kernels": ENTRIES.len(),
        "cuda_kernels": ENTRIES.iter().filter(|e| e.cuda.is_some()).count(),
        "wgsl_kernels": ENTRIES.iter().filter(|e| e.wgsl.is_some()).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::{PtxParam, ptx_params};

    #[test]
    fn ptx_parameter_lists_are_read_by_entry() {
        let ptx = ".visible .entry k1(\n\t.param .u64 k1_param_0,\n\t.param .u32 k1_param_1,\n\
                   \t.param .f32 k1_param_2,\n\t.param .f64 k1_param_3\n)\n{\n}\n\
                   .visible .entry k2(\n\t.param .s64 k2_param_0\n)\n";
        use PtxParam::*;
        assert_eq!(ptx_params(ptx, "k1"), Some(vec![B64, B32, F32, F64]));
        assert_eq!(ptx_params(ptx, "k2"), Some(vec![B64]));
        assert_eq!(ptx_params(ptx, "k3"), None);
        assert_eq!(ptx_params(".entry k4(\n.param .b8 x\n)", "k4"), None);
    }
}
