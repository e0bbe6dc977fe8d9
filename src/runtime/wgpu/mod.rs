//! The wgpu runtime: the adapters this machine has (`adapters.rs`), one device per adapter
//! opened on first use with its pipeline cache and the dispatch of the generated WGSL
//! kernels (`device.rs`), and the buffers of wgpu tensors (`buffer.rs`).

pub mod adapters;
mod buffer;
mod device;

pub(crate) use buffer::WgpuBuffer;
pub(crate) use device::gpu;
