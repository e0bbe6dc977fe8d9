//! Generates the kernels: WGSL + MSL for every wgpu variant, PTX for every CUDA module
//! (where NVRTC is found) and cubins from it (where ptxas is found), and the Rust dispatch
//! table that embeds them.

use std::path::PathBuf;

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=kernels");
    for var in [
        "BACKENDS_NO_NVRTC",
        "BACKENDS_NVRTC_LIB",
        "BACKENDS_PTXAS",
        "CUDA_HOME",
        "CUDA_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // With candle-cuda, cudarc links the CUDA libraries (candle's choice) but names no cuFFT
    // among them (cudarc 0.19); the FFT's CUDA path calls it.
    if std::env::var_os("CARGO_FEATURE_CANDLE_CUDA").is_some() {
        println!("cargo:rustc-link-lib=dylib=cufft");
    }

    // scripts/setup.sh installs NVRTC from PyPI into .cuda/ of the checkout.
    let local = manifest
        .join(".cuda/nvidia/cuda_nvrtc/lib")
        .join("libnvrtc.so.12");
    let hint = local.exists().then(|| local.display().to_string());
    let compile_ptx = std::env::var_os("CARGO_FEATURE_CUDA").is_some();

    // The PTX assembler: cubins at build time and the test that reads its resource report
    // (scripts/setup.sh installs it).
    let ptxas = std::env::var("BACKENDS_PTXAS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join(".cuda/nvidia/cuda_nvcc/bin/ptxas"));
    let ptxas = ptxas.exists().then_some(ptxas);

    let generated = match backends_codegen::generate::generate(
        &manifest.join("kernels"),
        &out,
        compile_ptx.then_some(hint.as_deref()),
        ptxas.as_deref(),
    ) {
        Ok(generated) => generated,
        Err(err) => {
            eprintln!("kernel generation failed:\n{err}");
            std::process::exit(1);
        }
    };
    match &generated.nvrtc {
        Ok(path) => {
            println!("cargo:rustc-env=BACKENDS_BUILD_NVRTC={path}");
            // Tests that check the PTX run only when there is some.
            println!("cargo:rustc-cfg=backends_ptx");
        }
        Err(why) => {
            println!("cargo:rustc-env=BACKENDS_BUILD_NVRTC=");
            if compile_ptx {
                println!(
                    "cargo:warning=CUDA kernels were not pre-compiled to PTX ({why}); the library will compile \
                     them with NVRTC at run time where it finds NVRTC. Run scripts/setup.sh to install it."
                );
            }
        }
    }

    if let Some(why) = &generated.no_cubins
        && generated.nvrtc.is_ok()
    {
        println!(
            "cargo:warning=no cubins were assembled ({why}); devices will load the PTX through the driver's JIT"
        );
    }
    if let Some(ptxas) = &ptxas {
        println!("cargo:rustc-cfg=backends_ptxas");
        println!("cargo:rustc-env=BACKENDS_PTXAS_PATH={}", ptxas.display());
    }
}
