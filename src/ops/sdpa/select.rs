//! SDPA backend selection as `docs/behaviour.md` §2 describes it: per-backend checks with typed
//! reasons, the priority walk, and PyTorch's "No available kernel" error.

use super::pin::Pin;
use crate::core::sdp::{CausalVariant, Reason, SdpBackend, Verdict, title};
use crate::kernels::rules;
use crate::ops::sdpa::params::{SDPAParams, TensorMeta};
use crate::{DType, Device, Error, Result};

/// The facts about a device that the checks read. [`DeviceCaps::of`] asks the machine;
/// tests and "what if" queries can build one by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The device.
    pub device: Device,
    /// Whether it is present and usable here.
    pub present: bool,
    /// CUDA compute capability `(major, minor)`.
    pub sm: Option<(u32, u32)>,
    /// wgpu: the adapter has `shader-f16`.
    pub shader_f16: bool,
    /// cuDNN's version where it loads (e.g. 90100).
    pub cudnn_version: Option<u32>,
}

impl DeviceCaps {
    /// The facts the shared backend rules read.
    pub fn target(&self) -> rules::Target {
        rules::Target {
            kind: self.device.kind(),
            sm: self.sm,
            shader_f16: self.shader_f16,
            cudnn_version: self.cudnn_version,
        }
    }

    /// What this machine reports about `device`.
    pub fn of(device: Device) -> DeviceCaps {
        match device {
            Device::Cpu => DeviceCaps {
                device,
                present: true,
                sm: None,
                shader_f16: false,
                cudnn_version: None,
            },
            Device::Cuda(i) => DeviceCaps {
                device,
                present: i < crate::runtime::cuda::device_count(),
                sm: crate::runtime::cuda::get_device_capability(i),
                shader_f16: false,
                // The interpreted device runs no vendor library.
                cudnn_version: crate::runtime::cuda::cudnn_version()
                    .filter(|_| !crate::runtime::cuda::is_interpreted()),
            },
            Device::Wgpu(i) => {
                let adapter = crate::runtime::wgpu::adapters::list().get(i);
                DeviceCaps {
                    device,
                    present: adapter.is_some(),
                    sm: None,
                    shader_f16: adapter.is_some_and(|a| a.shader_f16),
                    cudnn_version: None,
                }
            }
        }
    }
}

/// Checks the inputs every backend needs: ranks, batch and head counts, lengths, head
/// dims, dtypes, devices, mask (never together with `is_causal`, as in PyTorch), dropout.
/// Breaking one is an error, not a reason.
pub fn validate(p: &SDPAParams) -> Result<()> {
    let (q, k, v) = (&p.query, &p.key, &p.value);
    let bad = |detail: String| {
        Err(Error::ShapeMismatch {
            op: "scaled_dot_product_attention",
            detail,
        })
    };
    if ![q, k, v].iter().all(|t| t.shape.len() == q.shape.len())
        || !(3..=4).contains(&q.shape.len())
    {
        return bad(format!(
            "query, key and value must all be 3-D or all 4-D; got {:?}, {:?}, {:?}",
            q.shape, k.shape, v.shape
        ));
    }
    let r = q.shape.len();
    let (hq, hk, hv) = (q.shape[r - 3], k.shape[r - 3], v.shape[r - 3]);
    if r == 4 && !(q.shape[0] == k.shape[0] && k.shape[0] == v.shape[0]) {
        return bad(format!(
            "batch sizes differ: {:?}, {:?}, {:?}",
            q.shape, k.shape, v.shape
        ));
    }
    if hk != hv || (hq != hk && !(p.enable_gqa && hk > 0 && hq % hk == 0)) {
        return bad(format!(
            "query has {hq} heads and key/value {hk}/{hv}: they must match, or with enable_gqa key and value must \
             share a head count that divides the query's"
        ));
    }
    if k.shape[r - 2] != v.shape[r - 2] {
        return bad(format!(
            "key length {} != value length {}",
            k.shape[r - 2],
            v.shape[r - 2]
        ));
    }
    if q.shape[r - 1] != k.shape[r - 1] {
        return bad(format!(
            "query head dim {} != key head dim {}",
            q.shape[r - 1],
            k.shape[r - 1]
        ));
    }
    for t in [k, v] {
        if t.dtype != q.dtype {
            return Err(Error::DTypeMismatch {
                op: "scaled_dot_product_attention",
                expected: q.dtype,
                got: t.dtype,
            });
        }
        if t.device != q.device {
            return Err(Error::DeviceMismatch {
                op: "scaled_dot_product_attention",
                a: q.device,
                b: t.device,
            });
        }
    }
    if !q.dtype.is_float() {
        return Err(Error::DTypeMismatch {
            op: "scaled_dot_product_attention",
            expected: DType::F32,
            got: q.dtype,
        });
    }
    if !(0.0..=1.0).contains(&p.dropout) {
        return Err(Error::InvalidArgument {
            what: "dropout_p",
            why: format!(
                "{} is not in [0, 1] (1 drops every weight: the output is 0)",
                p.dropout
            ),
        });
    }
    if let Some(m) = &p.attn_mask {
        if p.is_causal {
            // PyTorch: "Explicit attn_mask should not be set when is_causal=True".
            return Err(Error::InvalidArgument {
                what: "attn_mask",
                why: "an explicit attn_mask cannot be set together with is_causal = true (as in PyTorch): \
                      fold the causal mask into attn_mask (false, or -inf, above the diagonal) and set \
                      is_causal = false"
                    .into(),
            });
        }
        check_mask(p, m)?;
    }
    Ok(())
}

fn check_mask(p: &SDPAParams, m: &TensorMeta) -> Result<()> {
    let r = p.query.shape.len();
    let target = [
        if r == 4 { p.query.shape[0] } else { 1 },
        p.query.shape[r - 3],
        p.query.shape[r - 2],
        p.key.shape[r - 2],
    ];
    let fits = m.shape.len() <= 4
        && m.shape
            .iter()
            .rev()
            .zip(target.iter().rev())
            .all(|(&have, &want)| have == want || have == 1);
    if !fits {
        return Err(Error::ShapeMismatch {
            op: "scaled_dot_product_attention",
            detail: format!(
                "attn_mask of shape {:?} does not broadcast to {target:?}",
                m.shape
            ),
        });
    }
    // As in PyTorch, an additive mask may be of another float type than q.
    if m.dtype != DType::Bool && !m.dtype.is_float() {
        return Err(Error::DTypeMismatch {
            op: "attn_mask (boolean or float)",
            expected: p.query.dtype,
            got: m.dtype,
        });
    }
    if m.device != p.query.device {
        return Err(Error::DeviceMismatch {
            op: "attn_mask",
            a: p.query.device,
            b: m.device,
        });
    }
    Ok(())
}

/// Sequence lengths (Lq, Lk) and head dims (q, k, v).
fn dims(p: &SDPAParams) -> ((usize, usize), [usize; 3]) {
    let r = p.query.shape.len();
    let last = |t: &TensorMeta| t.shape.last().copied().unwrap_or(0);
    (
        (
            p.query.shape.get(r.wrapping_sub(2)).copied().unwrap_or(0),
            p.key.shape.get(r.wrapping_sub(2)).copied().unwrap_or(0),
        ),
        [last(&p.query), last(&p.key), last(&p.value)],
    )
}

fn common(p: &SDPAParams, caps: &DeviceCaps, reasons: &mut Vec<Reason>) {
    let ((lq, lk), _) = dims(p);
    if !caps.present {
        reasons.push(Reason::DeviceMissing(caps.device));
    }
    if !(3..=4).contains(&p.query.shape.len()) {
        reasons.push(Reason::Rank {
            query: p.query.shape.len(),
        });
    }
    if lq == 0 || lk == 0 {
        reasons.push(Reason::ZeroLength { lq, lk });
    }
    if p.query.shape.last() == Some(&0) {
        reasons.push(Reason::ZeroHeadDim);
    }
    let strides = [&p.query, &p.key, &p.value].map(|t| t.strides.last().copied().unwrap_or(1));
    if strides.iter().any(|&s| s != 1) {
        reasons.push(Reason::LastDimStride { strides });
    }
}

/// The reasons `backend` cannot serve `params` on a device described by `caps` (empty:
/// it can), ignoring whether the backend is enabled. The static rules come from
/// [`rules`], shared with the compile-time checks of `#[sdpa_kernel]`.
pub fn check(backend: SdpBackend, p: &SDPAParams, caps: &DeviceCaps) -> Vec<Reason> {
    let b = rules::Backend::from(backend);
    let target = caps.target();
    if !rules::has_kernel(b, target.kind) {
        return vec![Reason::UnsupportedDevice(caps.device)];
    }
    let mut reasons = Vec::new();
    if b == rules::Backend::Math {
        if !caps.present {
            reasons.push(Reason::DeviceMissing(caps.device));
        }
        return reasons;
    }
    common(p, caps, &mut reasons);
    let accepted = rules::dtypes(b, &target);
    let elem = p.query.dtype.elem();
    if !elem.is_some_and(|e| accepted.contains(&e)) {
        reasons.push(Reason::Dtype {
            got: p.query.dtype,
            accepted: accepted.iter().map(|&e| DType::from(e)).collect(),
        });
    }
    if let (Some(have), Some(min)) = (caps.sm, rules::min_arch(b))
        && have < min
    {
        reasons.push(Reason::Arch { have, min });
    }
    let ((lq, lk), head @ [query, key, value]) = dims(p);
    if let Some(rule) = elem.and_then(|e| rules::head_dims(b, &target, e))
        && !rule.allows(head)
    {
        reasons.push(Reason::HeadDim {
            query,
            key,
            value,
            rule,
        });
    }
    if p.attn_mask.is_some() && !rules::takes_mask(b, target.kind) {
        reasons.push(Reason::AttnMask);
    }
    if p.is_causal && lq != lk {
        let refused = match p.causal_variant {
            CausalVariant::UpperLeft => !rules::causal_any_lengths(b, target.kind),
            CausalVariant::LowerRight => !rules::causal_lower_right(b),
        };
        if refused {
            reasons.push(Reason::CausalNonSquare {
                lq,
                lk,
                variant: p.causal_variant,
            });
        }
    }
    if p.window.is_bounded() && !rules::takes_window(b) {
        reasons.push(Reason::Window(p.window));
    }
    if gqa_heads(p) && !rules::takes_gqa(b) {
        reasons.push(Reason::Gqa);
    }
    // cuDNN's graph rescales kept weights by 1 / (1 - p): it cannot take p = 1.
    if p.dropout > 0.0
        && (!rules::takes_dropout(b, target.kind)
            || (b == rules::Backend::Cudnn && p.dropout >= 1.0))
    {
        reasons.push(Reason::Dropout(p.dropout));
    }
    if b == rules::Backend::Cudnn {
        match caps.cudnn_version {
            None => reasons.push(Reason::Library(
                "cuDNN (libcudnn.so.9) is not loadable here".into(),
            )),
            Some(v) if v < 90000 => {
                reasons.push(Reason::Library(format!("cuDNN {v} is older than 9.0")))
            }
            Some(_) => {}
        }
    }
    reasons
}

fn gqa_heads(p: &SDPAParams) -> bool {
    let r = p.query.shape.len();
    p.enable_gqa && r >= 3 && p.query.shape[r - 3] != p.key.shape[r - 3]
}

/// Why `backend` is turned off right now, before any input check (PyTorch's
/// `check_runtime_disabled_*`): its enable flag or `sdpa_kernel` list
/// ([`Reason::Disabled`], always first), and for cuDNN `cudnn.enabled` and the
/// determinism switches. cuDNN attention is the one backend that is not deterministic;
/// with `warn_only` it runs and a warning says so, as in PyTorch.
pub fn runtime_disabled(backend: SdpBackend) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if !crate::ops::sdpa::flags::enabled_flag(backend).get() {
        reasons.push(Reason::Disabled);
    }
    if backend == SdpBackend::Cudnn {
        if !crate::core::cudnn::enabled() {
            reasons.push(Reason::CudnnDisabled);
        }
        if crate::deterministic_required() {
            if crate::is_deterministic_algorithms_warn_only_enabled() {
                log::warn!("{} is not deterministic (warn_only)", title(backend));
            } else {
                reasons.push(Reason::Nondeterministic);
            }
        }
    }
    reasons
}

/// [`runtime_disabled`]'s reasons, then [`check`]'s.
pub(super) fn verdict(backend: SdpBackend, p: &SDPAParams, caps: &DeviceCaps) -> Verdict {
    let mut reasons = runtime_disabled(backend);
    reasons.extend(check(backend, p, caps));
    (backend, reasons)
}

/// Every backend's verdict for `params` on `caps`, in priority order; a disabled backend
/// gets [`Reason::Disabled`] first.
pub fn explain_with(p: &SDPAParams, caps: &DeviceCaps) -> Vec<Verdict> {
    crate::ops::sdpa::flags::sdp_priority_order()
        .as_slice()
        .iter()
        .map(|&b| verdict(b, p, caps))
        .collect()
}

/// Every backend's verdict for `params` on the device its query lives on.
pub fn explain(p: &SDPAParams) -> Vec<Verdict> {
    explain_with(p, &DeviceCaps::of(p.query.device))
}

/// The backend that serves `params`: the first in priority order that is enabled and
/// passes every check. When none does, every enabled backend's reasons are logged as
/// warnings and returned in [`Error::NoAvailableKernel`].
pub fn select_with(p: &SDPAParams, caps: &DeviceCaps) -> Result<SdpBackend> {
    validate(p)?;
    let verdicts = explain_with(p, caps);
    if let Some((backend, _)) = verdicts.iter().find(|(_, reasons)| reasons.is_empty()) {
        return Ok(*backend);
    }
    let enabled: Vec<Verdict> = verdicts
        .iter()
        .filter(|(_, r)| r.first() != Some(&Reason::Disabled))
        .cloned()
        .collect();
    // With every backend disabled, their being disabled is the reason to report.
    let reasons = if enabled.is_empty() {
        verdicts
            .into_iter()
            .map(|(b, _)| (b, vec![Reason::Disabled]))
            .collect()
    } else {
        enabled
    };
    warn_all(&reasons);
    Err(Error::NoAvailableKernel { reasons })
}

/// The backend that serves `params` on the device its query lives on (PyTorch users long
/// asked for this). Inside an `#[sdpa_kernel]` scope that pins a variant, a call of that
/// variant is checked against the pinned backend only.
pub fn selected_backend(p: &SDPAParams) -> Result<SdpBackend> {
    select(p).map(|(backend, _)| backend)
}

/// [`selected_backend`] with the pin that decided it, if one did.
pub(crate) fn select(p: &SDPAParams) -> Result<(SdpBackend, Option<Pin>)> {
    if let Some(pinned) = super::pin::select_pinned(p) {
        return pinned;
    }
    select_with(p, &DeviceCaps::of(p.query.device)).map(|backend| (backend, None))
}

pub(super) fn warn_all(verdicts: &[Verdict]) {
    for (backend, reasons) in verdicts {
        warn(*backend, reasons);
    }
}

fn warn(backend: SdpBackend, reasons: &[Reason]) {
    for reason in reasons {
        log::warn!("{} {reason}", title(backend));
    }
}

fn can_use(backend: SdpBackend, p: &SDPAParams, debug: bool) -> bool {
    let (_, reasons) = verdict(backend, p, &DeviceCaps::of(p.query.device));
    if debug {
        warn(backend, &reasons);
    }
    reasons.is_empty()
}

/// Whether flash attention can serve `params`: as in PyTorch, it must be enabled
/// ([`runtime_disabled`]) and pass every input check; with `debug`, each failed check is
/// logged as a warning.
pub fn can_use_flash_attention(p: &SDPAParams, debug: bool) -> bool {
    can_use(SdpBackend::Flash, p, debug)
}

/// Whether memory-efficient attention can serve `params`; see [`can_use_flash_attention`].
pub fn can_use_efficient_attention(p: &SDPAParams, debug: bool) -> bool {
    can_use(SdpBackend::MemEfficient, p, debug)
}

/// Whether cuDNN attention can serve `params`; see [`can_use_flash_attention`].
pub fn can_use_cudnn_attention(p: &SDPAParams, debug: bool) -> bool {
    can_use(SdpBackend::Cudnn, p, debug)
}
