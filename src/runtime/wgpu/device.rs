//! An opened wgpu device per adapter (opened on first use), with its queue and pipeline
//! cache, and the dispatch of the generated WGSL kernels on it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::kernels::WgslKernel;
use crate::{Error, Result};

/// An opened wgpu device.
pub(crate) struct Gpu {
    pub(super) index: usize,
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) has_f16: bool,
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

impl Gpu {
    pub(super) fn wait(&self) -> Result<()> {
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

    /// Workgroups a dispatch may have along each dimension (65,535 on most adapters).
    pub(crate) fn max_workgroups(&self) -> u32 {
        self.device.limits().max_compute_workgroups_per_dimension
    }

    /// Runs kernel `name` once over `workgroups`, binding `buffers` in order and then a
    /// uniform buffer holding the 32-bit words `params` (the kernel's `Params` struct, in
    /// field order); returns when the device is done. More workgroups along a dimension than
    /// the adapter takes ([`Gpu::max_workgroups`]) is a typed error.
    pub(crate) fn run(
        &self,
        name: &'static str,
        kernel: &WgslKernel,
        buffers: &[&wgpu::Buffer],
        params: &[u32],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let limit = self.max_workgroups();
        if workgroups.iter().any(|&count| count > limit) {
            return Err(crate::Error::ShapeMismatch {
                op: name,
                detail: format!(
                    "{workgroups:?} workgroups: this adapter takes at most {limit} along each \
                     dimension; split the call, or run it on the CPU"
                ),
            });
        }
        let pipeline = self.pipeline(name, kernel);
        // Uniform buffers are sized in 16-byte steps: pad with zero words.
        let mut padded = params.to_vec();
        padded.resize(params.len().next_multiple_of(4), 0);
        let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (padded.len() * 4) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue
            .write_buffer(&uniform, 0, bytemuck::cast_slice(&padded));
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
