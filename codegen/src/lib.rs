//! # backends-codegen
//!
//! The kernel generator of `backends`. Kernels are written once, as templates in
//! `kernels/` (CUDA C++ for NVRTC, WGSL for wgpu and naga), and specialised at build time
//! from the variants that `backends-spec` declares:
//!
//! - `generate` (feature `build`, run from the `backends` crate's `build.rs`) renders
//!   each variant by injecting its constants (`#define` / WGSL `alias` and `const`),
//!   validates the WGSL with naga and translates it to MSL, compiles each CUDA family to
//!   PTX with NVRTC per tier (`backends_spec::variants::PTX_TIERS`), assembles cubins with
//!   ptxas for `backends_spec::variants::CUBIN_ARCHS`, and writes the Rust dispatch table;
//! - `nvrtc` (feature `nvrtc`) finds and drives NVRTC through cudarc, at build time and for
//!   the run-time fallback.

#[cfg(feature = "build")]
pub mod generate;
#[cfg(feature = "nvrtc")]
pub mod nvrtc;
