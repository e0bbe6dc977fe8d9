//! The runtime layer: what runs kernels. The CPU's thread pool, the CUDA driver (devices,
//! contexts, loaded modules, memory), wgpu's devices and buffers, and the probing of
//! vendor libraries loaded at run time.

pub mod cpu;
pub mod cuda;
pub(crate) mod dylib;
pub(crate) mod threads;
mod transfer;
pub mod wgpu;

use crate::Device;

impl Device {
    /// The fastest device tensors can live on here: CUDA device 0 when this build has CUDA
    /// and the driver reports a device, else a real GPU among the wgpu adapters, else the
    /// CPU.
    pub fn best() -> Device {
        if crate::runtime::cuda::is_available() {
            return Device::Cuda(0);
        }
        crate::runtime::wgpu::adapters::list()
            .iter()
            .position(|a| a.is_gpu())
            .map_or(Device::Cpu, Device::Wgpu)
    }
}
