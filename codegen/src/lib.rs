//! # backends-codegen
//!
//! The kernel generator of `backends`: it will turn the templates in `kernels/` into
//! CUDA PTX (through NVRTC), WGSL (validated by naga) and MSL, together with the typed
//! dispatch tables, from `build.rs` of the `backends` crate.
//!
//! This crate holds no generator yet; it is part of the workspace layout so that the
//! generator lands where the rest of the project expects it.
