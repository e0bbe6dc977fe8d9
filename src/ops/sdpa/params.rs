//! What the backend checks look at: one SDPA call's tensors as metadata
//! (`torch.backends.cuda.SDPAParams`; device-neutral despite the name).

use crate::{DType, Device};

/// Shape, strides, dtype and device of a tensor: what the SDPA checks look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Element strides, one per dimension.
    pub strides: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Where the data lives.
    pub device: Device,
}

impl TensorMeta {
    /// A contiguous (row-major) tensor of `shape`.
    pub fn contiguous(shape: &[usize], dtype: DType, device: Device) -> Self {
        TensorMeta {
            shape: shape.to_vec(),
            strides: crate::core::tensor::contiguous_strides(shape),
            dtype,
            device,
        }
    }
}

/// The parameters of one SDPA call, as `torch.backends.cuda.SDPAParams` holds them:
/// metadata only, no data.
#[derive(Clone, Debug, PartialEq)]
pub struct SDPAParams {
    /// Query `[B, H, Lq, D]` (or 3-D unbatched).
    pub query: TensorMeta,
    /// Key `[B, Hk, Lk, D]`.
    pub key: TensorMeta,
    /// Value `[B, Hk, Lk, Dv]`.
    pub value: TensorMeta,
    /// Optional mask, broadcastable to `[B, H, Lq, Lk]`: boolean or additive float.
    pub attn_mask: Option<TensorMeta>,
    /// Dropout probability.
    pub dropout: f64,
    /// Causal masking.
    pub is_causal: bool,
    /// Which diagonal the causal mask and the window follow.
    pub causal_variant: super::CausalVariant,
    /// A sliding window of keys around that diagonal.
    pub window: super::Window,
    /// Grouped-query attention: key/value heads shared by groups of query heads.
    pub enable_gqa: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides() {
        let t = TensorMeta::contiguous(&[2, 3, 4, 5], DType::F32, Device::Cpu);
        assert_eq!(t.strides, [60, 20, 5, 1]);
    }
}
