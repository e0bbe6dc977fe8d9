//! `torch.nn.attention`: the SDPA backends, the `sdpa_kernel` guards and scopes, and the
//! selection of the backend that serves a call (all defined with the op, in
//! [`crate::ops::sdpa`]).

pub use crate::core::sdp::{Reason, SdpBackend, SdpPriority, Verdict};
pub use crate::kernels::rules::HeadDims;
pub use crate::ops::sdpa::backend::{sdpa_kernel, sdpa_kernel_scoped};
pub use crate::ops::sdpa::pin::{Pin, ScopedFuture, SdpaKernelScope, causal_default, pinned};
pub use crate::ops::sdpa::select::{
    DeviceCaps, can_use_cudnn_attention, can_use_efficient_attention, can_use_flash_attention,
    check, explain, explain_with, runtime_disabled, select_with, selected_backend, validate,
};
