//! NVRTC through cudarc: find the library, load it, compile CUDA C++ to PTX.
//!
//! The library is looked for, in order: the file named by `BACKENDS_NVRTC_LIB`; the one
//! found at build time; `$CUDA_HOME/lib64` and `$CUDA_PATH/lib64`; `/usr/local/cuda/lib64`;
//! then the loader's search path. `BACKENDS_NO_NVRTC=1` hides it (to test the paths that
//! run without it).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The file name NVRTC 12 is loaded by.
pub const LIB_NAME: &str = "libnvrtc.so.12";

/// Options every compile uses: part of each module's content hash. No `-lineinfo`: the
/// line tables tripled the size of the cubins every binary embeds.
pub const OPTIONS: [&str; 1] = ["--std=c++17"];

fn candidates(extra: Option<&str>) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Ok(path) = std::env::var("BACKENDS_NVRTC_LIB") {
        paths.push(PathBuf::from(path));
    }
    if let Some(path) = extra {
        paths.push(PathBuf::from(path));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(root) = std::env::var(var) {
            paths.push(PathBuf::from(root).join("lib64").join(LIB_NAME));
        }
    }
    paths.push(PathBuf::from("/usr/local/cuda/lib64").join(LIB_NAME));
    paths.push(PathBuf::from(LIB_NAME));
    paths
}

/// Whether `BACKENDS_NO_NVRTC` asks to act as if NVRTC were absent.
pub fn hidden() -> bool {
    std::env::var("BACKENDS_NO_NVRTC").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Loads NVRTC once; `also_try` is one more file to try (e.g. the one found at build time).
/// Returns where it was loaded from, or why it could not be. With `nvrtc-linked` it is
/// part of the program already.
pub fn load(also_try: Option<&str>) -> Result<&'static str, String> {
    static LOADED: OnceLock<Result<String, String>> = OnceLock::new();
    if hidden() {
        return Err("NVRTC is hidden by BACKENDS_NO_NVRTC".into());
    }
    if LINKED {
        return Ok("linked into the program");
    }
    LOADED
        .get_or_init(|| {
            for path in candidates(also_try) {
                // SAFETY: loading NVRTC runs no code beyond its initialisers.
                if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
                    // Keep it loaded for the process: cudarc then finds it by its soname.
                    std::mem::forget(lib);
                    if cudarc_loads_it() {
                        return Ok(path.display().to_string());
                    }
                }
            }
            Err(format!(
                "NVRTC ({LIB_NAME}) was not found: install the PyPI wheel nvidia-cuda-nvrtc-cu12 and set \
                 BACKENDS_NVRTC_LIB to its lib/{LIB_NAME}, or put it on LD_LIBRARY_PATH"
            ))
        })
        .as_deref()
        .map_err(|e| e.clone())
}

/// Whether NVRTC is linked into the program (`nvrtc-linked`, where candle's CUDA build
/// has cudarc link it), except in the build script's copy of this crate (`build-script`),
/// which is handed the library's features too but whose cudarc, built apart, loads NVRTC.
const LINKED: bool = cfg!(all(feature = "nvrtc-linked", not(feature = "build-script")));

/// Whether cudarc loads NVRTC by its standard names (those of the one loaded by path).
#[cfg(not(all(feature = "nvrtc-linked", not(feature = "build-script"))))]
fn cudarc_loads_it() -> bool {
    // SAFETY: only tries to dlopen NVRTC by its standard names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Never asked: NVRTC is linked (cudarc has no loader then).
#[cfg(all(feature = "nvrtc-linked", not(feature = "build-script")))]
fn cudarc_loads_it() -> bool {
    true
}

/// NVRTC's version `(major, minor)`; call after a successful [`load`].
pub fn version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (the caller checked); the out-pointers are valid.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Compiles `source` (program name `name`) to PTX for virtual architecture `compute_{sm}`.
pub fn compile(source: &str, name: &str, sm: u32) -> Result<String, String> {
    let arch: &'static str = match sm {
        70 => "compute_70",
        75 => "compute_75",
        80 => "compute_80",
        86 => "compute_86",
        89 => "compute_89",
        90 => "compute_90",
        other => return Err(format!("no PTX target is declared for sm_{other}")),
    };
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: OPTIONS.iter().map(|o| o.to_string()).collect(),
        name: Some(name.to_string()),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(format!(
            "NVRTC failed on {name} for {arch}:\n{}",
            log.to_string_lossy()
        )),
        Err(other) => Err(format!("NVRTC failed on {name} for {arch}: {other}")),
    }
}
