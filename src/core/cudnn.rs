//! cuDNN's settings (`torch.backends.cudnn`'s flags), read by the determinism rule and by
//! the ops that call cuDNN.

use crate::core::flag::{Flag, FlagGuard, Guard, ScopedGuard};

/// cuDNN may be used.
pub static ENABLED: Flag<bool> = Flag::new("cudnn.enabled", true, None);
/// cuDNN may use TF32 tensor cores for fp32 work.
pub static ALLOW_TF32: Flag<bool> = Flag::new("cudnn.allow_tf32", true, None);
/// Only deterministic cuDNN algorithms (see [`crate::deterministic_required`]).
pub static DETERMINISTIC: Flag<bool> = Flag::new("cudnn.deterministic", false, None);
/// Benchmark candidate algorithms and keep the fastest (cuDNN attention and convolution:
/// their plans per shape).
pub static BENCHMARK: Flag<bool> = Flag::new("cudnn.benchmark", false, None);
/// How many algorithms benchmarking tries (0: every one).
pub static BENCHMARK_LIMIT: Flag<u32> = Flag::new("cudnn.benchmark_limit", 10, None);

/// Whether cuDNN may be used.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Whether cuDNN may use TF32.
pub fn allow_tf32() -> bool {
    ALLOW_TF32.get()
}

/// Whether only deterministic algorithms may run.
pub fn deterministic() -> bool {
    DETERMINISTIC.get()
}

/// Whether algorithms are benchmarked.
pub fn benchmark() -> bool {
    BENCHMARK.get()
}

/// How many algorithms benchmarking tries (0: all).
pub fn benchmark_limit() -> u32 {
    BENCHMARK_LIMIT.get()
}

/// Settings for [`flags`]: each `Some` field is set, each `None` left as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// [`ENABLED`].
    pub enabled: Option<bool>,
    /// [`BENCHMARK`].
    pub benchmark: Option<bool>,
    /// [`BENCHMARK_LIMIT`].
    pub benchmark_limit: Option<u32>,
    /// [`DETERMINISTIC`].
    pub deterministic: Option<bool>,
    /// [`ALLOW_TF32`].
    pub allow_tf32: Option<bool>,
}

/// Sets several cuDNN flags at once until the guard drops.
pub fn flags(settings: Flags) -> Guard {
    settings.into_guard()
}

/// [`flags`] for the current thread only.
pub fn flags_scoped(settings: Flags) -> ScopedGuard {
    settings.into_guard()
}

impl Flags {
    fn into_guard<G: FlagGuard>(self) -> G {
        let mut guard = G::default();
        let bools = [
            (&ENABLED, self.enabled),
            (&BENCHMARK, self.benchmark),
            (&DETERMINISTIC, self.deterministic),
            (&ALLOW_TF32, self.allow_tf32),
        ];
        for (flag, value) in bools {
            if let Some(value) = value {
                guard.push(flag, value);
            }
        }
        if let Some(limit) = self.benchmark_limit {
            guard.push(&BENCHMARK_LIMIT, limit);
        }
        guard
    }
}
