//! `torch.backends.opt_einsum`: whether einsum orders its contractions, and by which
//! strategy (the flags and the path search live with the op, in
//! [`crate::ops::einsum::path`]).

pub use crate::ops::einsum::path::{
    ContractionPath, ENABLED, STRATEGY, Strategy, enabled, flags, flags_scoped, is_available,
    set_enabled, set_strategy, strategy,
};
