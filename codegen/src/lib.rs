//! # backends-codegen
//!
//! The kernel generator of `backends`. Kernels are written once, as templates in
//! `kernels/` (CUDA C++ for NVRTC, WGSL for wgpu and naga), and specialised at build time:
//!
//! - [`variants`] declares every specialisation (the one place to add one), with its typed
//!   [`keys`] and launch geometry;
//! - `generate` (feature `build`, run from the `backends` crate's `build.rs`) renders
//!   each variant by injecting its constants (`#define` / WGSL `alias` and `const`),
//!   validates the WGSL with naga and translates it to MSL, compiles each CUDA family to
//!   PTX with NVRTC for [`variants::CUDA_ARCHS`], and writes the Rust dispatch table;
//! - [`table`] holds the types of that table;
//! - [`rules`] says what each SDPA backend accepts, for the run-time selection and the
//!   compile-time checks of `#[sdpa_kernel]` alike;
//! - `nvrtc` (feature `nvrtc`) finds and drives NVRTC through cudarc, at build time and for
//!   the run-time fallback.

pub mod keys;
pub mod rules;
pub mod table;
pub mod variants;

#[cfg(feature = "build")]
pub mod generate;
#[cfg(feature = "nvrtc")]
pub mod nvrtc;
