//! The wgpu runtime: the adapters this machine has (`adapters.rs`), one device per adapter
//! opened on first use with its pipeline cache and the dispatch of the generated WGSL
//! kernels (`device.rs`), and the buffers of wgpu tensors (`buffer.rs`).
//!
//! Builds without the `wgpu` feature compile `stub.rs` in place of the device and buffer
//! files, as `runtime::cuda` does without `cuda`: the same API over types that have no
//! values, whose ways in (opening a device, uploading a buffer) fail with the reason, and
//! no adapters.

pub mod adapters;
#[cfg(feature = "wgpu")]
mod buffer;
#[cfg(feature = "wgpu")]
mod device;
#[cfg(not(feature = "wgpu"))]
mod stub;
#[cfg(not(feature = "wgpu"))]
use stub::{buffer, device};

pub(crate) use buffer::WgpuBuffer;
pub(crate) use device::gpu;

/// Why nothing wgpu runs in a build without the `wgpu` feature.
#[cfg_attr(feature = "wgpu", allow(dead_code))]
const UNBUILT: &str = "this build has no wgpu support: build with the `wgpu` feature";

/// The dispatch of `groups` workgroups in a row, folded into rows of at most 65,535 (wgpu's
/// limit per dimension): `[groups_x, rows, 1]`, the kernels finding their index as
/// `wg.y * groups_x + wg.x` (they take `groups_x`, the first word, as a parameter).
pub(crate) fn folded_groups(op: &'static str, groups: usize) -> crate::Result<[u32; 3]> {
    let groups_x = groups.clamp(1, 65_535);
    Ok([
        u32_arg(op, groups_x)?,
        u32_arg(op, groups.div_ceil(groups_x))?,
        1,
    ])
}

/// A 32-bit kernel parameter or workgroup count (WGSL indexes in u32), or a typed error
/// naming `op` where the value does not fit.
pub(crate) fn u32_arg(op: &'static str, value: usize) -> crate::Result<u32> {
    u32::try_from(value).map_err(|_| crate::Error::ShapeMismatch {
        op,
        detail: format!("{value} exceeds a 32-bit kernel argument; split the call"),
    })
}
