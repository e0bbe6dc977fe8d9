//! Device buffers holding wgpu tensors' elements.

use super::device::{Gpu, gpu};
use crate::{DType, Device, Error, Result};

/// A device buffer holding a tensor's elements.
#[derive(Debug)]
pub(crate) struct WgpuBuffer {
    gpu: usize,
    buffer: wgpu::Buffer,
    len: usize,
}

impl WgpuBuffer {
    /// A buffer on adapter `index` holding `bytes`.
    pub(crate) fn upload(index: usize, dtype: DType, bytes: &[u8]) -> Result<WgpuBuffer> {
        let gpu = gpu(index)?;
        if dtype == DType::F16 && !gpu.has_f16 {
            return Err(Error::Unavailable {
                what: "f16 on this adapter",
                why: format!("wgpu:{index} lacks shader-f16; use f32 tensors there"),
            });
        }
        if dtype == DType::F64 {
            return Err(Error::DTypeMismatch {
                op: "upload to wgpu",
                expected: DType::F32,
                got: dtype,
            });
        }
        let buffer = Self::zeroed(gpu, bytes.len())?;
        if !bytes.is_empty() {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4), 0);
            gpu.queue.write_buffer(&buffer.buffer, 0, &padded);
        }
        Ok(buffer)
    }

    /// An output buffer of `len` bytes for a kernel to fill: in debug builds every byte is
    /// 0xff (NaN in f32 and f16), so that elements a kernel fails to write show.
    pub(crate) fn output(gpu: &Gpu, len: usize) -> Result<WgpuBuffer> {
        let buffer = Self::zeroed(gpu, len)?;
        if cfg!(debug_assertions) && len > 0 {
            gpu.queue
                .write_buffer(&buffer.buffer, 0, &vec![0xff; len.next_multiple_of(4)]);
        }
        Ok(buffer)
    }

    /// A zero-filled buffer of `len` bytes.
    pub(crate) fn zeroed(gpu: &Gpu, len: usize) -> Result<WgpuBuffer> {
        let size = len.next_multiple_of(4).max(4) as u64;
        if size > gpu.device.limits().max_storage_buffer_binding_size {
            return Err(Error::OutOfMemory {
                device: Device::Wgpu(gpu.index),
                bytes: size,
                why: format!(
                    "larger than the adapter's largest storage binding ({} bytes)",
                    gpu.device.limits().max_storage_buffer_binding_size
                ),
            });
        }
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(Error::OutOfMemory {
                device: Device::Wgpu(gpu.index),
                bytes: size,
                why: err.to_string(),
            });
        }
        Ok(WgpuBuffer {
            gpu: gpu.index,
            buffer,
            len,
        })
    }

    /// Copies the buffer's bytes to the host.
    pub(crate) fn download(&self) -> Result<Vec<u8>> {
        let gpu = gpu(self.gpu)?;
        let size = self.buffer.size();
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, size);
        gpu.queue.submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (sender, receiver) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |result| {
            let _ = sender.send(result);
        });
        gpu.wait()?;
        receiver
            .recv()
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|why| Error::Driver {
                call: "wgpu map_async",
                detail: why,
            })?;
        let view = slice.get_mapped_range().map_err(|e| Error::Driver {
            call: "wgpu get_mapped_range",
            detail: e.to_string(),
        })?;
        Ok(view[..self.len].to_vec())
    }

    /// The size of the contents in bytes (the buffer may be padded past them).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The underlying wgpu buffer.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl crate::core::tensor::DeviceMemory for WgpuBuffer {
    fn download(&self) -> Result<Vec<u8>> {
        WgpuBuffer::download(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
