//! The generated kernel table and the CUDA code behind it.
//!
//! `build.rs` renders every specialisation declared in `backends-codegen` and embeds the
//! results here: WGSL and MSL per wgpu variant, the CUDA source of each family, and its PTX
//! for [`PTX_ARCHS`] when NVRTC was present at build time (ahead of time, "AOT"). Without
//! PTX for a device, [`ptx_for`] compiles the embedded source with NVRTC at run time
//! ("JIT"), caching the result in the process and on disk.

use std::borrow::Cow;

pub use backends_spec::keys::*;
pub use backends_spec::rules;
pub use backends_spec::table::*;
pub use backends_spec::variants::{CUDA_ARCHS, FLASH_HEAD_DIMS, MEM_EFF_HEAD_DIMS};

pub(crate) mod attention;
pub(crate) mod convert;
pub(crate) mod dispatch;
pub(crate) mod gemm;
mod jit;

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}
pub use generated::{CUDA_MODULES, ENTRIES, PTX_ARCHS, lookup};

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

/// The CUDA module source of `family`.
pub fn cuda_module(family: Family) -> Option<&'static CudaModuleSource> {
    CUDA_MODULES.iter().find(|m| m.family == family)
}

/// The PTX of `family` for a device of compute capability `sm` (× 10): the embedded PTX of
/// the newest architecture not above `sm`, or else PTX compiled now by NVRTC (cached).
pub fn ptx_for(family: Family, sm: u32) -> Result<Cow<'static, str>> {
    let module = cuda_module(family).ok_or_else(|| Error::Unavailable {
        what: "CUDA kernel family",
        why: format!("{family} has no CUDA variant"),
    })?;
    if !aot_disabled()
        && let Some((_, ptx)) = module
            .ptx
            .iter()
            .filter(|(arch, _)| *arch <= sm)
            .max_by_key(|(arch, _)| *arch)
    {
        return Ok(Cow::Borrowed(ptx));
    }
    jit::compiled(module, sm).map(|ptx| Cow::Owned(ptx.to_string()))
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
    serde_json::json!({
        "code": cuda_code().to_string(),
        "ptx_archs": PTX_ARCHS.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>(),
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
