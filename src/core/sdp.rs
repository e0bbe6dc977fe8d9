//! The vocabulary of SDPA backend selection, shared by the error type and the selection:
//! the backends (`torch.nn.attention.SDPBackend`), their priority order, and why a backend
//! refuses a call.

use std::fmt;

use backends_spec::rules::{self, HeadDims};

use crate::core::flag::{FlagValue, option_enum};
use crate::{DType, Device};

option_enum! {
    /// A scaled-dot-product-attention backend, spelled as PyTorch's `SDPBackend` names.
    pub enum SdpBackend ("SDPA backend") {
        /// The reference implementation (any input).
        Math = "MATH",
        /// Flash attention (tiled, online softmax).
        Flash = "FLASH_ATTENTION",
        /// Memory-efficient attention.
        MemEfficient = "EFFICIENT_ATTENTION",
        /// cuDNN's fused attention.
        Cudnn = "CUDNN_ATTENTION",
    }
}

impl From<SdpBackend> for rules::Backend {
    fn from(backend: SdpBackend) -> Self {
        match backend {
            SdpBackend::Math => Self::Math,
            SdpBackend::Flash => Self::Flash,
            SdpBackend::MemEfficient => Self::MemEfficient,
            SdpBackend::Cudnn => Self::Cudnn,
        }
    }
}

/// The order in which SDPA backends are tried: a permutation of all four.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpPriority([SdpBackend; 4]);

impl SdpPriority {
    /// Flash, then memory-efficient, then math, then cuDNN.
    pub const DEFAULT: SdpPriority = SdpPriority([
        SdpBackend::Flash,
        SdpBackend::MemEfficient,
        SdpBackend::Math,
        SdpBackend::Cudnn,
    ]);

    /// `first` in the given order (repeats ignored), then the rest in `self`'s order.
    pub fn with_first(self, first: &[SdpBackend]) -> SdpPriority {
        let mut order = Vec::with_capacity(4);
        for &b in first.iter().chain(&self.0) {
            if !order.contains(&b) {
                order.push(b);
            }
        }
        SdpPriority([order[0], order[1], order[2], order[3]])
    }

    /// The backends, highest priority first.
    pub fn as_slice(&self) -> &[SdpBackend] {
        &self.0
    }
}

impl fmt::Display for SdpPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|b| b.as_str()).collect();
        f.write_str(&names.join(" > "))
    }
}

impl FlagValue for SdpPriority {
    fn to_bits(self) -> u32 {
        self.0
            .iter()
            .enumerate()
            .map(|(i, b)| b.to_bits() << (4 * i))
            .sum()
    }

    fn from_bits(bits: u32) -> Self {
        let order = [0, 1, 2, 3].map(|i| SdpBackend::from_bits((bits >> (4 * i)) & 0xf));
        SdpPriority::DEFAULT.with_first(&order)
    }

    fn to_json(self) -> serde_json::Value {
        self.0.iter().map(|b| b.as_str()).collect::<Vec<_>>().into()
    }
}

/// Which diagonal a causal mask follows (`torch.nn.attention.bias.CausalVariant`). With
/// Lq = Lk both are the same mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CausalVariant {
    /// Query i sees keys `0..=i` (`causal_upper_left`; what PyTorch's `is_causal` means).
    #[default]
    UpperLeft,
    /// Query i sees keys `0..=i + Lk - Lq` (`causal_lower_right`): the last query sees every
    /// key, as a decoding step or a chunk of a prefill against its cache needs. Where
    /// Lq > Lk the first Lq - Lk queries see no key (their output is 0).
    LowerRight,
}

impl CausalVariant {
    /// PyTorch's name of the mask (`causal_upper_left`, `causal_lower_right`).
    pub fn as_str(self) -> &'static str {
        match self {
            CausalVariant::UpperLeft => "causal_upper_left",
            CausalVariant::LowerRight => "causal_lower_right",
        }
    }
}

/// A sliding window over the keys (flash-attn's `window_size`; the local attention of
/// Mistral-style models): query i sees keys j with `i + diag - left <= j <= i + diag +
/// right`, where `diag` is the diagonal that [`CausalVariant`] names (0 top-left, the
/// default; `Lk - Lq` bottom-right, as flash-attn aligns its windows). A side given as
/// `None` is unbounded. With `is_causal`, keys past the diagonal stay hidden whatever
/// `right` says. A row whose window holds no key gives 0, as any fully masked row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// How many keys before the diagonal a query sees (`None`: all of them).
    pub left: Option<usize>,
    /// How many keys after the diagonal a query sees (`None`: all of them).
    pub right: Option<usize>,
}

impl Window {
    /// No window: every key is in reach (the default).
    pub const UNBOUNDED: Window = Window {
        left: None,
        right: None,
    };

    /// The window of `left` keys before and `right` keys after the diagonal.
    pub fn new(left: Option<usize>, right: Option<usize>) -> Window {
        Window { left, right }
    }

    /// Whether it hides any key (a bound on either side).
    pub fn is_bounded(self) -> bool {
        self.left.is_some() || self.right.is_some()
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: Option<usize>| s.map_or("unbounded".to_string(), |n| n.to_string());
        write!(f, "left {}, right {}", side(self.left), side(self.right))
    }
}

/// Why a backend cannot serve a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// Turned off (`enable_*_sdp(false)` or outside an `sdpa_kernel` list).
    Disabled,
    /// cuDNN attention while `cudnn.enabled` is off (`cudnn::ENABLED`, or a `cudnn::flags`
    /// guard).
    CudnnDisabled,
    /// A backend that is not deterministic while deterministic algorithms are required
    /// (`use_deterministic_algorithms(true, false)` or `cudnn::deterministic`).
    Nondeterministic,
    /// The backend has no kernel for this kind of device.
    UnsupportedDevice(Device),
    /// The device is not present on this machine.
    DeviceMissing(Device),
    /// Only 4-D (or 3-D unbatched) inputs are fused.
    Rank {
        /// Rank of q.
        query: usize,
    },
    /// The element type is not one the backend takes on this device.
    Dtype {
        /// The inputs' type.
        got: DType,
        /// What it takes.
        accepted: Vec<DType>,
    },
    /// The GPU is older than the backend needs.
    Arch {
        /// The device's compute capability.
        have: (u32, u32),
        /// The lowest it takes.
        min: (u32, u32),
    },
    /// q, k, v head dims break the backend's rule.
    HeadDim {
        /// q's last dimension.
        query: usize,
        /// k's last dimension.
        key: usize,
        /// v's last dimension.
        value: usize,
        /// The rule it breaks.
        rule: HeadDims,
    },
    /// The backend takes no `attn_mask` (only `is_causal`).
    AttnMask,
    /// Causal masking with `Lq != Lk` in an alignment the backend does not take.
    CausalNonSquare {
        /// Query length.
        lq: usize,
        /// Key length.
        lk: usize,
        /// The alignment asked for.
        variant: CausalVariant,
    },
    /// The backend has no sliding-window mask.
    Window(Window),
    /// The backend applies no dropout.
    Dropout(f64),
    /// The backend does not do grouped-query attention.
    Gqa,
    /// A head dim of 0: every score is 0 times the scale (NaN at the default scale), which
    /// only math computes as PyTorch does.
    ZeroHeadDim,
    /// A zero-length sequence.
    ZeroLength {
        /// Query length.
        lq: usize,
        /// Key length.
        lk: usize,
    },
    /// The last dimension of an input is not contiguous.
    LastDimStride {
        /// Last-dimension strides of q, k, v.
        strides: [usize; 3],
    },
    /// A library the backend needs is missing or too old.
    Library(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Disabled => write!(
                f,
                "is disabled (by its enable_*_sdp flag, or an sdpa_kernel guard or #[sdpa_kernel] \
                 attribute that does not list it): enable it or list it"
            ),
            Reason::CudnnDisabled => write!(
                f,
                "is disabled because cudnn.enabled is false (turn cuDNN on, e.g. with a backends::cudnn::flags guard)"
            ),
            Reason::Nondeterministic => write!(
                f,
                "is not deterministic, and deterministic algorithms are required \
                 (use_deterministic_algorithms or cudnn.deterministic); pass warn_only to allow it with a warning"
            ),
            Reason::UnsupportedDevice(d) => write!(f, "has no kernel for {d} tensors"),
            Reason::DeviceMissing(d) => write!(f, "cannot run: {d} is not present on this machine"),
            Reason::Rank { query } => {
                write!(
                    f,
                    "requires query, key and value to be 4-dimensional (or 3-D unbatched), but got Query dim: {query}"
                )
            }
            Reason::Dtype { got, accepted } => {
                let names: Vec<String> = accepted.iter().map(|d| d.to_string()).collect();
                write!(
                    f,
                    "requires query, key and value to be of dtype {}; got {got}",
                    names.join(", ")
                )
            }
            Reason::Arch { have, min } => write!(
                f,
                "requires a GPU of compute capability sm{}{} or newer; this one is sm{}{}",
                min.0, min.1, have.0, have.1
            ),
            Reason::HeadDim {
                query,
                key,
                value,
                rule,
            } => write!(
                f,
                "requires {rule}. Got Query.size(-1): {query}, Key.size(-1): {key}, Value.size(-1): {value} instead."
            ),
            Reason::AttnMask => write!(f, "does not support non-null attn_mask"),
            Reason::CausalNonSquare {
                lq,
                lk,
                variant: CausalVariant::UpperLeft,
            } => write!(
                f,
                "does not support is_causal with query length {lq} != key length {lk} (its causal mask is bottom-right aligned; for that mask ask for causal_lower_right)"
            ),
            Reason::CausalNonSquare {
                lq,
                lk,
                variant: CausalVariant::LowerRight,
            } => write!(
                f,
                "does not support causal_lower_right with query length {lq} != key length {lk} (its causal mask is top-left aligned)"
            ),
            Reason::Window(window) => write!(
                f,
                "does not support a sliding window; got window {window} (its graph builds no band mask)"
            ),
            Reason::Dropout(p) => write!(f, "does not support dropout; got dropout_p {p}"),
            Reason::Gqa => write!(f, "does not support enable_gqa"),
            Reason::ZeroHeadDim => write!(f, "does not support a head dim of 0"),
            Reason::ZeroLength { lq, lk } => {
                write!(
                    f,
                    "does not support zero-length sequences; got query length {lq}, key length {lk}"
                )
            }
            Reason::LastDimStride { strides } => write!(
                f,
                "requires the last dimension of query, key and value to be contiguous; got strides {}, {}, {}",
                strides[0], strides[1], strides[2]
            ),
            Reason::Library(why) => write!(f, "cannot run: {why}"),
        }
    }
}

/// One backend's verdict: the reasons it cannot serve, empty when it can.
pub type Verdict = (SdpBackend, Vec<Reason>);

/// The backend's display name in PyTorch's messages.
pub(crate) fn title(backend: SdpBackend) -> &'static str {
    rules::Backend::from(backend).title()
}

/// The text of [`Error::NoAvailableKernel`]: each backend's reasons, then PyTorch's last line.
pub(crate) fn no_kernel_message(reasons: &[Verdict]) -> String {
    let mut text = String::new();
    for (backend, why) in reasons {
        for reason in why {
            text.push_str(&format!("{} {reason}\n", title(*backend)));
        }
    }
    text.push_str("No available kernel. Aborting execution.");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use SdpBackend::*;

    #[test]
    fn priority_round_trips_through_bits() {
        let p = SdpPriority::DEFAULT.with_first(&[Cudnn, Math]);
        assert_eq!(p.as_slice(), [Cudnn, Math, Flash, MemEfficient]);
        assert_eq!(SdpPriority::from_bits(p.to_bits()), p);
        assert_eq!(
            p.to_string(),
            "CUDNN_ATTENTION > MATH > FLASH_ATTENTION > EFFICIENT_ATTENTION"
        );
    }

    #[test]
    fn repeated_backends_count_once() {
        let p = SdpPriority::DEFAULT.with_first(&[Math, Math, Flash]);
        assert_eq!(p.as_slice(), [Math, Flash, MemEfficient, Cudnn]);
    }
}
