//! `torch.use_deterministic_algorithms`: bit-identical results run to run.
//!
//! Kernels ask [`deterministic_required`], which is on when this switch or
//! [`crate::core::cudnn::deterministic`] is on; then no kernel may use a reduction whose
//! order depends on timing (atomics, racing split-K partials).
//!
//! Which kernels are deterministic (bit-identical run to run for the same inputs, flags,
//! device and thread count):
//! - CPU: GEMM, attention (fused and math), einsum, FFT, MHA: every sum runs in an order
//!   fixed by the shapes and the thread count, never by timing.
//! - wgpu: the generated GEMM and attention kernels use no atomics.
//! - CUDA generated kernels: GEMM (split-K partials are summed by a separate kernel in a
//!   fixed order), flash and memory-efficient attention forward (no atomics).
//! - cuBLAS / cuBLASLt and cuFFT: deterministic on the one stream this library uses.
//! - cuDNN attention: **not** deterministic (as PyTorch says). SDPA selection consults
//!   [`deterministic_required`]: it refuses cuDNN attention with
//!   [`crate::core::sdp::Reason::Nondeterministic`], or under `warn_only` lets it run with a
//!   warning (`crate::ops::sdpa::backend::runtime_disabled`).
//! - Dropout draws are a pure function of (seed, offset, element index) on every device.

use crate::core::flag::Flag;

/// Whether deterministic algorithms are required.
pub static DETERMINISTIC_ALGORITHMS: Flag<bool> =
    Flag::new("deterministic_algorithms", false, None);
/// Whether a nondeterministic kernel only warns instead of failing.
pub static DETERMINISTIC_WARN_ONLY: Flag<bool> =
    Flag::new("deterministic_algorithms_warn_only", false, None);

/// Turns the requirement for deterministic algorithms on or off. With `warn_only`, an
/// operation that has no deterministic kernel warns instead of returning an error.
pub fn use_deterministic_algorithms(mode: bool, warn_only: bool) {
    DETERMINISTIC_ALGORITHMS.set(mode);
    DETERMINISTIC_WARN_ONLY.set(warn_only);
}

/// Whether `use_deterministic_algorithms(true, _)` is in force.
pub fn are_deterministic_algorithms_enabled() -> bool {
    DETERMINISTIC_ALGORITHMS.get()
}

/// Whether determinism is only warned about.
pub fn is_deterministic_algorithms_warn_only_enabled() -> bool {
    DETERMINISTIC_WARN_ONLY.get()
}

/// What kernels obey: the global switch or `cudnn::deterministic`.
pub fn deterministic_required() -> bool {
    are_deterministic_algorithms_enabled() || crate::core::cudnn::deterministic()
}
