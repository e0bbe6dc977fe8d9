//! The wgpu adapters (Vulkan, Metal, DX12) this machine offers, enumerated once.

use std::sync::OnceLock;

/// One wgpu adapter as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The graphics API it is reached through.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, virtual or CPU.
    pub device_type: wgpu::DeviceType,
    /// Driver name and version text.
    pub driver: String,
    /// Whether it supports `shader-f16` (f16 kernels may run on it).
    pub shader_f16: bool,
    /// Whether it supports subgroup operations.
    pub subgroups: bool,
}

impl Adapter {
    /// Whether this is a real GPU rather than a software rasteriser running on the CPU.
    pub fn is_gpu(&self) -> bool {
        !matches!(
            self.device_type,
            wgpu::DeviceType::Cpu | wgpu::DeviceType::Other
        )
    }
}

/// Every adapter wgpu finds on the compiled-in backends (honouring `WGPU_BACKEND`);
/// empty where there is no driver.
pub fn list() -> &'static [Adapter] {
    &found().0
}

/// The wgpu handle of adapter `index`.
pub(crate) fn handle(index: usize) -> Option<&'static wgpu::Adapter> {
    found().1.get(index)
}

/// The adapters, enumerated once: descriptions and handles in the same order.
fn found() -> &'static (Vec<Adapter>, Vec<wgpu::Adapter>) {
    static ADAPTERS: OnceLock<(Vec<Adapter>, Vec<wgpu::Adapter>)> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let handles = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let infos = handles
            .iter()
            .map(|adapter| {
                let info = adapter.get_info();
                let features = adapter.features();
                Adapter {
                    name: info.name,
                    backend: info.backend,
                    device_type: info.device_type,
                    driver: format!("{} {}", info.driver, info.driver_info)
                        .trim()
                        .to_string(),
                    shader_f16: features.contains(wgpu::Features::SHADER_F16),
                    subgroups: features.contains(wgpu::Features::SUBGROUP),
                }
            })
            .collect();
        (infos, handles)
    })
}

pub(crate) fn report() -> serde_json::Value {
    let adapters: Vec<serde_json::Value> = list()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            serde_json::json!({
                "index": i,
                "name": a.name,
                "backend": a.backend.to_str(),
                "device_type": format!("{:?}", a.device_type),
                "driver": a.driver,
                "shader_f16": a.shader_f16,
                "subgroups": a.subgroups,
            })
        })
        .collect();
    serde_json::json!({ "adapters": adapters })
}
