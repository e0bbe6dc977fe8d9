//! `torch.backends.opt_einsum`: how einsum orders its pairwise contractions.

use crate::flag::{Flag, FlagGuard, Guard, ScopedGuard, option_enum};

option_enum! {
    /// How the contraction path is searched.
    pub enum Strategy ("opt_einsum strategy") {
        /// `optimal` up to 4 operands, cheaper searches beyond (as opt_einsum 3.4).
        Auto = "auto",
        /// Cheapest pair first.
        Greedy = "greedy",
        /// Exhaustive search with pruning.
        Optimal = "optimal",
    }
}

/// Contraction paths are optimised (otherwise operands contract left to right).
pub static ENABLED: Flag<bool> = Flag::new("opt_einsum.enabled", true, None);
/// The path search strategy.
pub static STRATEGY: Flag<Strategy> = Flag::new("opt_einsum.strategy", Strategy::Auto, None);

/// Whether the contraction-path optimizer is part of this build. It is not yet: einsum
/// and its path search are planned work, and these flags only hold their values until then.
pub fn is_available() -> bool {
    false
}

/// Whether contraction paths are optimised.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Turns path optimisation on or off.
pub fn set_enabled(enabled: bool) {
    ENABLED.set(enabled);
}

/// The path search strategy.
pub fn strategy() -> Strategy {
    STRATEGY.get()
}

/// Sets the path search strategy.
pub fn set_strategy(strategy: Strategy) {
    STRATEGY.set(strategy);
}

/// Sets the given settings until the guard drops (`None` leaves one as it is).
pub fn flags(enabled: Option<bool>, strategy: Option<Strategy>) -> Guard {
    settings(enabled, strategy)
}

/// [`flags`] for the current thread only.
pub fn flags_scoped(enabled: Option<bool>, strategy: Option<Strategy>) -> ScopedGuard {
    settings(enabled, strategy)
}

fn settings<G: FlagGuard>(enabled: Option<bool>, strategy: Option<Strategy>) -> G {
    let mut guard = G::default();
    if let Some(enabled) = enabled {
        guard.push(&ENABLED, enabled);
    }
    if let Some(strategy) = strategy {
        guard.push(&STRATEGY, strategy);
    }
    guard
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "enabled": ENABLED.report(),
        "strategy": STRATEGY.report(),
    })
}
