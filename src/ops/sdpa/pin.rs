//! What `#[sdpa_kernel(...)]` sets for a function body: the backend list (as the
//! [`super::backend::sdpa_kernel_scoped`] guard), the default of `is_causal`, and, when the attribute
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
use crate::kernels::rules::DeviceKind;
use crate::kernels::{ENTRIES, KernelEntry, KernelKey, MaskKind, lookup};
use crate::ops::sdpa::params::SDPAParams;
use crate::{DType, Error, Result};

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
    /// Whether calls are causal.
    pub causal: bool,
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
    /// flag and mask kind).
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
            && p.is_causal == self.causal
            && mask == self.mask
    }

    // Bits: backend (3, +1 so that 0 is "no pin"), device (2), dtype (3), causal (1),
    // mask (2), head dim (12), entry index + 1 (9).
    fn encode(&self) -> u32 {
        let entry = self
            .entry()
            .and_then(|e| ENTRIES.iter().position(|x| std::ptr::eq(x, e)))
            .filter(|&i| i < 511)
            .map_or(0, |i| i as u32 + 1);
        (self.backend.to_bits() + 1)
            | (self.device as u32) << 3
            | self.dtype.to_bits() << 5
            | u32::from(self.causal) << 8
            | (self.mask.code()) << 9
            | self.head_dim.min(4095) << 11
            | entry << 23
    }

    fn decode(bits: u32) -> Option<Pin> {
        let backend = (bits & 7).checked_sub(1).map(SdpBackend::from_bits)?;
        let device =
            [DeviceKind::Cpu, DeviceKind::Wgpu, DeviceKind::Cuda][(bits >> 3 & 3) as usize % 3];
        let mask =
            [MaskKind::None, MaskKind::Bool, MaskKind::Additive][(bits >> 9 & 3) as usize % 3];
        let entry = (bits >> 23)
            .checked_sub(1)
            .and_then(|i| ENTRIES.get(i as usize));
        Some(Pin {
            backend,
            device,
            dtype: DType::from_bits(bits >> 5 & 7),
            head_dim: bits >> 11 & 4095,
            causal: bits >> 8 & 1 == 1,
            mask,
            kernel: entry.map(|e| e.key),
        })
    }
}

/// The pinned variant in force (0: none).
static PIN: Flag<u32> = Flag::new("attention.pinned_kernel", 0, None);

/// The default of `is_causal` for [`crate::SdpaOptions::default`].
static CAUSAL_DEFAULT: Flag<bool> = Flag::new("attention.causal_default", false, None);

/// Whether calls in this scope are causal unless they say otherwise (set by
/// `#[sdpa_kernel(causal)]`; read by [`crate::SdpaOptions::default`]).
pub fn causal_default() -> bool {
    CAUSAL_DEFAULT.get()
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
    /// The default of `is_causal` in the body.
    pub causal: bool,
    /// The pinned variant, if the attribute names one.
    pub pin: Option<Pin>,
}

impl SdpaKernelScope {
    /// Puts the settings in force on the current thread until the guard drops (also on
    /// early return and panic).
    #[must_use = "the settings end when the guard drops"]
    pub fn enter(&self) -> ScopedGuard {
        let mut guard: ScopedGuard = only(self.backends, self.set_priority);
        guard.push(&CAUSAL_DEFAULT, self.causal);
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
        let key = crate::kernels::rules::kernel_key(
            crate::kernels::rules::Backend::Flash,
            crate::kernels::Elem::F16,
            64,
            true,
            MaskKind::None,
        );
        for pin in [
            Pin {
                backend: SdpBackend::Flash,
                device: DeviceKind::Wgpu,
                dtype: DType::F16,
                head_dim: 64,
                causal: true,
                mask: MaskKind::None,
                kernel: key,
            },
            Pin {
                backend: SdpBackend::Math,
                device: DeviceKind::Cpu,
                dtype: DType::F64,
                head_dim: 4095,
                causal: false,
                mask: MaskKind::Additive,
                kernel: None,
            },
        ] {
            assert!(pin.entry().is_some() == pin.kernel.is_some());
            assert_eq!(Pin::decode(pin.encode()), Some(pin));
        }
        assert_eq!(Pin::decode(0), None);
    }
}
