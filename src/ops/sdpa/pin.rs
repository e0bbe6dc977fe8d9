//! What `#[sdpa_kernel(...)]` sets for a function body: the backend list (as the
//! [`super::backend::sdpa_kernel_scoped`] guard), the default of `is_causal` and its
//! alignment, and, when the attribute
//! names a single variant, that variant pinned so that calls matching it skip the
//! selection walk. The settings are thread-scoped (an `async fn`'s follow its future from
//! poll to poll), never process-wide.

use std::pin::Pin as Pinned;
use std::task::{Context, Poll};

use super::backend::only;
use super::select::{DeviceCaps, check, runtime_disabled, validate, warn_all};
use crate::core::flag::{Flag, FlagGuard, FlagValue, ScopedGuard};
use crate::core::sdp::SdpBackend;
use crate::core::sdp::Verdict;
use crate::kernels::rules::{self, DeviceKind};
use crate::kernels::{KernelEntry, KernelKey, MaskKind, lookup};
use crate::ops::sdpa::params::SDPAParams;
use crate::{CausalVariant, DType, Error, Result};

/// One attention variant fixed at compile time by `#[sdpa_kernel]`: the backend, the
/// device kind, and the call's dtype, head dim, causal flag and mask kind, with the
/// generated kernel that serves it on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    /// The backend that runs.
    pub backend: SdpBackend,
    /// The kind of device the calls run on.
    pub device: DeviceKind,
    /// The inputs' element type.
    pub dtype: DType,
    /// The head dimension of q, k and v (at most 4095).
    pub head_dim: u32,
    /// Whether calls are causal, and in which alignment.
    pub causal: Option<CausalVariant>,
    /// The kind of mask calls pass.
    pub mask: MaskKind,
    /// The dispatch-table entry (flash and memory-efficient on a GPU).
    pub kernel: Option<KernelKey>,
}

impl Pin {
    /// The table entry of [`Pin::kernel`].
    pub fn entry(&self) -> Option<&'static KernelEntry> {
        self.kernel.as_ref().and_then(lookup)
    }

    /// Whether `p` is a call of this variant (same device kind, dtype, head dims, causal
    /// flag and mask kind, and no sliding window: a windowed call is selected as usual).
    pub fn matches(&self, p: &SDPAParams) -> bool {
        let mask = match p.attn_mask.as_ref().map(|m| m.dtype) {
            None => MaskKind::None,
            Some(DType::Bool) => MaskKind::Bool,
            Some(_) => MaskKind::Additive,
        };
        let d = self.head_dim as usize;
        p.query.device.kind() == self.device
            && p.query.dtype == self.dtype
            && [&p.query, &p.key, &p.value]
                .iter()
                .all(|t| t.shape.last() == Some(&d))
            && self.causal == p.is_causal.then_some(p.causal_variant)
            && mask == self.mask
            && !p.window.is_bounded()
    }

    /// The pin of these fields, with the generated kernel that serves it: the one
    /// `#[sdpa_kernel]` names (none on the CPU).
    pub fn new(
        backend: SdpBackend,
        device: DeviceKind,
        dtype: DType,
        head_dim: u32,
        causal: Option<CausalVariant>,
        mask: MaskKind,
    ) -> Pin {
        let kernel = (device != DeviceKind::Cpu)
            .then(|| dtype.elem())
            .flatten()
            .and_then(|elem| {
                let d = head_dim as usize;
                let elem = rules::compute_elem(device, elem);
                rules::kernel_key(backend.into(), elem, d, causal.is_some(), mask)
            });
        Pin {
            backend,
            device,
            dtype,
            head_dim,
            causal,
            mask,
            kernel,
        }
    }

    // Bits: backend (3, +1 so that 0 is "no pin"), device (2), dtype (3), causal (2: none,
    // upper-left, lower-right), mask (2), head dim (12). The kernel follows from them.
    fn encode(&self) -> u32 {
        (self.backend.to_bits() + 1)
            | (self.device as u32) << 3
            | self.dtype.to_bits() << 5
            | causal_code(self.causal) << 8
            | (self.mask.code()) << 10
            | self.head_dim.min(4095) << 12
    }

    fn decode(bits: u32) -> Option<Pin> {
        let backend = (bits & 7).checked_sub(1).map(SdpBackend::from_bits)?;
        let device =
            [DeviceKind::Cpu, DeviceKind::Wgpu, DeviceKind::Cuda][(bits >> 3 & 3) as usize % 3];
        let mask =
            [MaskKind::None, MaskKind::Bool, MaskKind::Additive][(bits >> 10 & 3) as usize % 3];
        Some(Pin::new(
            backend,
            device,
            DType::from_bits(bits >> 5 & 7),
            bits >> 12 & 4095,
            causal_of_code(bits >> 8 & 3),
            mask,
        ))
    }
}

/// A causal setting as 2 bits: 0 not causal, 1 upper-left, 2 lower-right.
fn causal_code(causal: Option<CausalVariant>) -> u32 {
    match causal {
        None => 0,
        Some(CausalVariant::UpperLeft) => 1,
        Some(CausalVariant::LowerRight) => 2,
    }
}

/// The causal setting of [`causal_code`]'s bits.
fn causal_of_code(code: u32) -> Option<CausalVariant> {
    match code {
        1 => Some(CausalVariant::UpperLeft),
        2 => Some(CausalVariant::LowerRight),
        _ => None,
    }
}

/// The pinned variant in force (0: none).
static PIN: Flag<u32> = Flag::new("attention.pinned_kernel", 0, None);

/// The default of `is_causal` and its alignment for [`crate::SdpaOptions::default`], as
/// [`causal_code`] writes it.
static CAUSAL_DEFAULT: Flag<u32> = Flag::new("attention.causal_default", 0, None);

/// Whether calls in this scope are causal unless they say otherwise, and in which
/// alignment (set by `#[sdpa_kernel(causal)]` or `#[sdpa_kernel(causal = lower_right)]`;
/// read by [`crate::SdpaOptions::default`]).
pub fn causal_default() -> Option<CausalVariant> {
    causal_of_code(CAUSAL_DEFAULT.get())
}

/// What one `#[sdpa_kernel(...)]` attribute sets for its function body: only `backends`
/// are enabled (with `set_priority`, in that order), `is_causal` defaults to `causal`, and
/// `pin` (or no pin) is in force. The settings are thread-scoped: they hold on the thread
/// that runs the body and nowhere else, so concurrent annotated calls never see each other's
/// settings. Scopes nest; the innermost decides.
#[derive(Clone, Copy, Debug)]
pub struct SdpaKernelScope {
    /// The backends enabled in the body.
    pub backends: &'static [SdpBackend],
    /// Whether the list order is the priority order.
    pub set_priority: bool,
    /// The default of `is_causal` (and its alignment) in the body.
    pub causal: Option<CausalVariant>,
    /// The pinned variant, if the attribute names one.
    pub pin: Option<Pin>,
}

impl SdpaKernelScope {
    /// Puts the settings in force on the current thread until the guard drops (also on
    /// early return and panic).
    #[must_use = "the settings end when the guard drops"]
    pub fn enter(&self) -> ScopedGuard {
        let mut guard: ScopedGuard = only(self.backends, self.set_priority);
        guard.push(&CAUSAL_DEFAULT, causal_code(self.causal));
        guard.push(&PIN, self.pin.map_or(0, |p| p.encode()));
        guard
    }

    /// The scope of an `async fn`: `future` with the settings in force during each of its
    /// polls, on whichever thread polls it, and not between polls.
    pub fn wrap<F: Future>(self, future: F) -> ScopedFuture<F> {
        ScopedFuture {
            scope: self,
            future,
        }
    }
}

/// A future that runs each poll of the future inside it within an [`SdpaKernelScope`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct ScopedFuture<F> {
    scope: SdpaKernelScope,
    future: F,
}

impl<F: Future> Future for ScopedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pinned<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _scope = self.scope.enter();
        // SAFETY: `future` is structurally pinned: it is never moved out of `self` (no
        // method hands it out by value or by `&mut`, and `ScopedFuture` has no `Drop` impl),
        // and `ScopedFuture` is `Unpin` only when `F` is (the auto trait).
        let future = unsafe { self.map_unchecked_mut(|s| &mut s.future) };
        future.poll(cx)
    }
}

/// The pinned variant in force, if any.
pub fn pinned() -> Option<Pin> {
    Pin::decode(PIN.get())
}

/// The backend and kernel for `p` when a pin is in force and `p` is its variant: only
/// the pinned backend's checks run (no walk over the priority order). `None`: no pin
/// applies, select as usual.
pub(super) fn select_pinned(p: &SDPAParams) -> Option<Result<(SdpBackend, Option<Pin>)>> {
    let pin = pinned().filter(|pin| pin.matches(p))?;
    Some(validate(p).and_then(|()| {
        let mut reasons = runtime_disabled(pin.backend);
        reasons.extend(check(pin.backend, p, &DeviceCaps::of(p.query.device)));
        if reasons.is_empty() {
            return Ok((pin.backend, Some(pin)));
        }
        let verdicts: Vec<Verdict> = vec![(pin.backend, reasons)];
        warn_all(&verdicts);
        Err(Error::NoAvailableKernel { reasons: verdicts })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_round_trip_through_bits() {
        let causal = Some(CausalVariant::LowerRight);
        let pin = Pin::new;
        for pin in [
            pin(
                SdpBackend::Flash,
                DeviceKind::Wgpu,
                DType::F16,
                64,
                causal,
                MaskKind::None,
            ),
            pin(
                SdpBackend::MemEfficient,
                DeviceKind::Cuda,
                DType::F32,
                100,
                Some(CausalVariant::UpperLeft),
                MaskKind::None,
            ),
            pin(
                SdpBackend::Math,
                DeviceKind::Cpu,
                DType::F64,
                4095,
                None,
                MaskKind::Additive,
            ),
        ] {
            assert_eq!(pin.entry().is_some(), pin.device != DeviceKind::Cpu);
            assert_eq!(Pin::decode(pin.encode()), Some(pin));
        }
        assert_eq!(Pin::decode(0), None);
    }
}
