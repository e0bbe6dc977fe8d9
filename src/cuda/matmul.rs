//! `torch.backends.cuda.matmul`: the matmul precision flags (defined with the precision
//! settings in [`crate::core::precision::matmul`], which the matmul op reads).

pub use crate::core::precision::matmul::*;
