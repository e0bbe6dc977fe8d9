//! The wgpu runtime: the adapters this machine has (`adapters.rs`), one device per adapter
//! opened on first use with its pipeline cache and the dispatch of the generated WGSL
//! kernels (`device.rs`), and the buffers of wgpu tensors (`buffer.rs`).

pub mod adapters;
mod buffer;
mod device;

pub(crate) use buffer::WgpuBuffer;
pub(crate) use device::gpu;

/// A 32-bit kernel parameter or workgroup count (WGSL indexes in u32), or a typed error
/// naming `op` where the value does not fit.
pub(crate) fn u32_arg(op: &'static str, value: usize) -> crate::Result<u32> {
    u32::try_from(value).map_err(|_| crate::Error::ShapeMismatch {
        op,
        detail: format!("{value} exceeds a 32-bit kernel argument; split the call"),
    })
}
