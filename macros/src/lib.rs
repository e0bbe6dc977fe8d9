//! # backends-macros
//!
//! Procedural macros of `backends`: `#[sdpa_kernel(...)]`, a compile-time checked choice
//! of scaled-dot-product-attention backends for a function.
//!
//! This crate holds no macro yet; it is part of the workspace layout so that the macros
//! land where the rest of the project expects them.
