//! Run-time compilation of the embedded CUDA source with NVRTC, where no embedded PTX
//! serves a device: per module and architecture, cached in memory and under the cache
//! folder (`BACKENDS_CACHE_DIR`, else `~/.cache/backends/ptx`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use super::{CACHE_DIR_ENV, CudaModuleSource};
use crate::{Error, Result};

#[cfg(feature = "cuda")]
pub(super) fn nvrtc() -> Result<&'static str> {
    let built_with = Some(env!("BACKENDS_BUILD_NVRTC")).filter(|p| !p.is_empty());
    backends_codegen::nvrtc::load(built_with)
        .map_err(|why| Error::Unavailable { what: "NVRTC", why })
}

#[cfg(not(feature = "cuda"))]
pub(super) fn nvrtc() -> Result<&'static str> {
    Err(Error::Unavailable {
        what: "NVRTC",
        why: "this build has no CUDA support: enable the `cuda` feature".into(),
    })
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os(CACHE_DIR_ENV)
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("backends"))
        })?;
    Some(base.join("ptx"))
}

/// The PTX of `module`, compiled by NVRTC for its tier; cached in memory and on disk
/// (keyed by content hash, which covers the tier).
pub(super) fn compiled(module: &'static CudaModuleSource) -> Result<Arc<str>> {
    type Compiled = HashMap<u64, Arc<str>>;
    static MEMORY: LazyLock<Mutex<Compiled>> = LazyLock::new(Default::default);
    let arch = module.tier;
    let key = module.hash;
    if let Some(ptx) = MEMORY.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
    let file = cache_dir().map(|d| {
        d.join(format!(
            "{}-{:016x}.compute_{arch}.ptx",
            module.family, module.hash
        ))
    });
    let cached = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
    let ptx: Arc<str> = match cached {
        Some(ptx) => ptx.into(),
        None => {
            let compiled = compile(module, arch)?;
            if let Some(file) = &file {
                // A cache that cannot be written only costs a compile next time.
                let _ = std::fs::create_dir_all(file.parent().expect("a cache file has a folder"))
                    .and_then(|()| std::fs::write(file, &compiled));
            }
            compiled.into()
        }
    };
    MEMORY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, ptx.clone());
    Ok(ptx)
}

#[cfg(feature = "cuda")]
fn compile(module: &CudaModuleSource, arch: u32) -> Result<String> {
    nvrtc()?;
    crate::core::verbose::creation_event(|| {
        format!("nvrtc compile {}.cu for compute_{arch}", module.family)
    });
    backends_codegen::nvrtc::compile(module.source, &format!("{}.cu", module.family), arch)
        .map_err(Error::Compile)
}

#[cfg(not(feature = "cuda"))]
fn compile(_: &CudaModuleSource, _: u32) -> Result<String> {
    Err(nvrtc().expect_err("without the cuda feature NVRTC is never available"))
}
