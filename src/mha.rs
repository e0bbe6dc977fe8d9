//! `torch.backends.mha` and `nn.MultiheadAttention`'s forward (defined with the op, in
//! [`crate::ops::mha`]).

pub use crate::ops::mha::*;
