//! `torch.use_deterministic_algorithms`: bit-identical results run to run.
//!
//! Kernels ask [`deterministic_required`], which is on when this switch or
//! [`crate::cudnn::deterministic`] is on; then no kernel may use a reduction whose
//! order depends on timing (atomics, racing split-K partials).

use crate::flag::Flag;

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
    are_deterministic_algorithms_enabled() || crate::cudnn::deterministic()
}
