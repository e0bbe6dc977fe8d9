//! `torch.backends.mha`: the fused multi-head-attention fast path switch.

use crate::flag::Flag;

/// The fused MHA path (one QKV projection + SDPA) may run when its conditions hold.
pub static FASTPATH: Flag<bool> = Flag::new("mha.fastpath_enabled", true, None);

/// Whether the fused MHA fast path may run.
pub fn get_fastpath_enabled() -> bool {
    FASTPATH.get()
}

/// Allows or forbids the fused MHA fast path.
pub fn set_fastpath_enabled(enabled: bool) {
    FASTPATH.set(enabled);
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({ "fastpath_enabled": FASTPATH.report() })
}
