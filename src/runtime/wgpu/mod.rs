//! The wgpu runtime: one device per adapter (opened on first use), buffers, and dispatch of
//! the generated WGSL kernels with a per-device pipeline cache.

pub mod adapters;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::kernels::WgslKernel;
use crate::{DType, Device, Error, Result};

/// An opened wgpu device.
pub(crate) struct Gpu {
    index: usize,
    device: wgpu::Device,
    queue: wgpu::Queue,
    has_f16: bool,
    pipelines: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
}

/// The device of adapter `index`, opened on first use (with `shader-f16` where offered).
pub(crate) fn gpu(index: usize) -> Result<&'static Gpu> {
    static OPEN: LazyLock<Mutex<HashMap<usize, &'static Gpu>>> = LazyLock::new(Default::default);
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(gpu) = open.get(&index) {
        return Ok(gpu);
    }
    let adapter = crate::runtime::wgpu::adapters::handle(index).ok_or_else(|| Error::Unavailable {
        what: "wgpu adapter",
        why: format!(
            "there is no wgpu:{index} ({} adapter(s) found; install a Vulkan driver, e.g. mesa-vulkan-drivers)",
            crate::runtime::wgpu::adapters::list().len()
        ),
    })?;
    let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("backends"),
        required_features: if has_f16 {
            wgpu::Features::SHADER_F16
        } else {
            wgpu::Features::empty()
        },
        required_limits: adapter.limits(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| {
        Error::Unavailable {
            what: "wgpu device",
            why: format!("wgpu:{index} refused a device: {e}"),
        }
    })?;
    let gpu: &'static Gpu = Box::leak(Box::new(Gpu {
        index,
        device,
        queue,
        has_f16,
        pipelines: Mutex::new(HashMap::new()),
    }));
    open.insert(index, gpu);
    Ok(gpu)
}

/// A device buffer holding a tensor's elements.
#[derive(Debug)]
pub(crate) struct Buffer {
    gpu: usize,
    buffer: wgpu::Buffer,
    len: usize,
}

impl Buffer {
    /// A buffer on adapter `index` holding `bytes`.
    pub(crate) fn upload(index: usize, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        let gpu = gpu(index)?;
        if dtype == DType::F16 && !gpu.has_f16 {
            return Err(Error::Unavailable {
                what: "f16 on this adapter",
                why: format!("wgpu:{index} lacks shader-f16; use f32 tensors there"),
            });
        }
        if dtype == DType::F64 || dtype == DType::Bf16 {
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
    pub(crate) fn output(gpu: &Gpu, len: usize) -> Result<Buffer> {
        let buffer = Self::zeroed(gpu, len)?;
        if cfg!(debug_assertions) && len > 0 {
            gpu.queue
                .write_buffer(&buffer.buffer, 0, &vec![0xff; len.next_multiple_of(4)]);
        }
        Ok(buffer)
    }

    /// A zero-filled buffer of `len` bytes.
    pub(crate) fn zeroed(gpu: &Gpu, len: usize) -> Result<Buffer> {
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
        Ok(Buffer {
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

    /// The wgpu buffer.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Gpu {
    fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::Driver {
                call: "wgpu poll",
                detail: e.to_string(),
            })
    }

    fn pipeline(&self, name: &'static str, kernel: &WgslKernel) -> Arc<wgpu::ComputePipeline> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry(name)
            .or_insert_with(|| {
                crate::core::verbose::creation_event(|| {
                    format!("wgpu pipeline {name} on wgpu:{}", self.index)
                });
                let module = self
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(name),
                        source: wgpu::ShaderSource::Wgsl(kernel.wgsl.into()),
                    });
                Arc::new(
                    self.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(name),
                            layout: None,
                            module: &module,
                            entry_point: Some("main"),
                            compilation_options: Default::default(),
                            cache: None,
                        }),
                )
            })
            .clone()
    }

    /// Runs kernel `name` once over `workgroups`, binding `buffers` in order and then a
    /// uniform buffer with `params`; returns when the device is done.
    pub(crate) fn run(
        &self,
        name: &'static str,
        kernel: &WgslKernel,
        buffers: &[&wgpu::Buffer],
        params: &[u8],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let pipeline = self.pipeline(name, kernel);
        let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: params.len().next_multiple_of(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut padded = params.to_vec();
        padded.resize(params.len().next_multiple_of(16), 0);
        self.queue.write_buffer(&uniform, 0, &padded);
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .copied()
            .chain(std::iter::once(&uniform))
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        }
        self.queue.submit([encoder.finish()]);
        self.wait()
    }
}

impl crate::core::tensor::DeviceMemory for Buffer {
    fn download(&self) -> Result<Vec<u8>> {
        Buffer::download(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
