//! The operations: one folder per op, each with its public API and its dispatch by device
//! (`mod.rs`) next to the device-specific parts.

pub mod conv;
pub(crate) mod convert;
pub mod copy;
pub mod einsum;
pub mod fft;
pub mod linalg;
pub mod matmul;
pub mod mha;
pub mod sdpa;
