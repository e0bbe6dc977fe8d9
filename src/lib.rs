//! # backends
//!
//! PyTorch's `torch.backends` for Rust: the controls that decide how the math runs
//! (TF32 or IEEE fp32, reduced-precision GEMM reductions, which scaled-dot-product
//! attention backend serves a call, which CPU vector level is used, …), the queries that
//! say what this machine can run, and the kernels those controls select.
//!
//! Every PyTorch submodule has a module of the same name here ([`cpu`], [`cuda`],
//! [`cudnn`], [`cusparselt`], [`mha`], [`mps`], [`mkl`], [`mkldnn`], [`nnpack`],
//! [`openmp`], [`opt_einsum`], [`xeon`]); `torch.nn.attention` is [`attention`].
//!
//! Conventions (see [`flag`]):
//! - a flag is a process-wide atomic with a getter and a setter, initialised once from the
//!   environment where PyTorch reads one;
//! - a PyTorch context manager is an RAII guard ([`Guard`]) that restores the previous
//!   state on drop (also on early return and panic); every guard has a `_scoped` form
//!   ([`ScopedGuard`]) that overrides the setting for the current thread only;
//! - string options are enums whose `FromStr` takes PyTorch's spellings;
//! - queries (`is_built`, `is_available`, `version`) never panic: a missing library,
//!   driver or device gives `false` / `None`.
//!
//! No input takes the caller's process down: bad input is a typed [`Error`]. Sizes follow
//! one rule (chosen over `clippy::arithmetic_side_effects`, whose 450 sites are mostly
//! kernel indexing that the rule already bounds, and where wrapping or checked forms would
//! hide real indexing bugs instead of catching them):
//! - a tensor's extent (element count, and each row-major stride, in bytes) fits
//!   `isize::MAX`, checked where a tensor is made; so any index arithmetic inside one
//!   tensor cannot overflow;
//! - a size that combines several inputs (a product's output, attention's output and
//!   scores, an einsum intermediate, irfft's `n`, MHA's `3E`) is checked the same way
//!   before anything is computed from it;
//! - host buffers sized by the input are allocated fallibly ([`Error::OutOfMemory`]), and
//!   the thread pool runs with the threads it could start.
//!
//! `tests/fuzz/` calls every entry point with random valid and invalid input in a child
//! process; `tests/robustness.rs` keeps every input that once crashed.
//!
//! ```
//! use backends::attention::{SdpBackend, sdpa_kernel};
//!
//! backends::cuda::matmul::set_allow_tf32(true);
//! assert_eq!(backends::get_float32_matmul_precision().to_string(), "high");
//! {
//!     let _only_math = sdpa_kernel(&[SdpBackend::Math], false);
//!     assert!(!backends::cuda::flash_sdp_enabled());
//! }
//! assert!(backends::cuda::flash_sdp_enabled());
//! ```

// Layers, each importing only those above it in this list (see the README's architecture
// section): core, runtime, kernels, ops; then the torch.backends facades and the report.
pub mod core;
pub mod kernels;
pub mod ops;
pub mod runtime;

pub mod attention;
#[cfg(feature = "candle")]
pub mod candle;
pub mod cpu;
pub mod cuda;
pub mod cudnn;
pub mod cusparselt;
pub mod info;
pub mod mha;
pub mod mkl;
pub mod mkldnn;
pub mod mps;
pub mod nnpack;
pub mod openmp;
pub mod opt_einsum;
pub mod selfcheck;
pub mod xeon;

pub use crate::core::borrow::{BorrowScope, borrow_scope};
pub use crate::core::determinism::{
    DETERMINISTIC_ALGORITHMS, DETERMINISTIC_WARN_ONLY, are_deterministic_algorithms_enabled,
    deterministic_required, is_deterministic_algorithms_warn_only_enabled,
    use_deterministic_algorithms,
};
pub use crate::core::device::Device;
pub use crate::core::dtype::DType;
pub use crate::core::error::{Error, LinAlgFailure, Result};
pub use crate::core::flag::{Flag, FlagSource, Guard, ScopedGuard};
pub use crate::core::generator::{Generator, initial_seed, manual_seed};
pub use crate::core::host_cache::empty_host_cache;
pub use crate::core::precision::{
    FP32_PRECISION, Float32MatmulPrecision, Fp32Precision, float32_matmul_precision,
    float32_matmul_precision_scoped, fp32_precision, get_float32_matmul_precision,
    set_float32_matmul_precision, set_fp32_precision,
};
pub use crate::core::tensor::{Element, Tensor};
pub use crate::core::trace::Capture as TraceCapture;
pub use crate::core::{device, dtype, flag, generator, tensor, verbose};
pub use crate::ops::conv::{conv1d, conv2d};
pub use crate::ops::einsum::{einsum, einsum_out, einsum_path};
pub use crate::ops::matmul::{EMULATE_REDUCED_PRECISION, linear, matmul, matmul_out};
pub use crate::ops::sdpa::serving::{PagedKv, Varlen, sdpa_paged, sdpa_varlen};
pub use crate::ops::sdpa::{
    CausalVariant, SdpaOptions, SdpaOutput, Window, scaled_dot_product_attention, sdpa, sdpa_out,
};
pub use crate::ops::{conv, einsum, fft, linalg, sdpa};
pub use crate::runtime::threads::{MAX_THREADS, NUM_THREADS, get_num_threads, set_num_threads};
pub use crate::runtime::wgpu::adapters;
pub use backends_macros::sdpa_kernel;

/// The README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
