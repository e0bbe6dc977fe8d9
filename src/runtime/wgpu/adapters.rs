//! The wgpu adapters (Vulkan, Metal, DX12) this machine offers, enumerated once. Builds
//! without the `wgpu` feature find none, and their report says why.

use std::sync::OnceLock;

/// One wgpu adapter as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The graphics API it is reached through.
    pub api: Api,
    /// Discrete, integrated, virtual or CPU.
    pub device_type: DeviceType,
    /// Driver name and version text.
    pub driver: String,
    /// Whether it supports `shader-f16` (f16 kernels may run on it).
    pub shader_f16: bool,
    /// Whether it supports subgroup operations.
    pub subgroups: bool,
}

/// The graphics API an adapter is reached through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Vulkan (Linux, Windows, Android; lavapipe on machines without a GPU).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
    /// OpenGL or WebGL.
    Gl,
    /// A browser's WebGPU.
    WebGpu,
    /// wgpu's no-op test backend.
    Noop,
}

impl Api {
    /// The lower-case name wgpu uses (`vulkan`, `metal`, `dx12`, `gl`, `webgpu`, `noop`).
    pub fn name(self) -> &'static str {
        match self {
            Api::Vulkan => "vulkan",
            Api::Metal => "metal",
            Api::Dx12 => "dx12",
            Api::Gl => "gl",
            Api::WebGpu => "webgpu",
            Api::Noop => "noop",
        }
    }
}

/// What kind of processor an adapter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceType {
    /// A GPU of its own.
    DiscreteGpu,
    /// A GPU sharing the CPU's memory.
    IntegratedGpu,
    /// A GPU behind a hypervisor.
    VirtualGpu,
    /// A software rasteriser running on the CPU (lavapipe, WARP).
    Cpu,
    /// Unknown.
    Other,
}

impl Adapter {
    /// Whether this is a real GPU rather than a software rasteriser running on the CPU.
    pub fn is_gpu(&self) -> bool {
        !matches!(self.device_type, DeviceType::Cpu | DeviceType::Other)
    }
}

/// Every adapter wgpu finds on the compiled-in backends (honouring `WGPU_BACKEND`);
/// empty where there is no driver, or no `wgpu` feature.
pub fn list() -> &'static [Adapter] {
    &found().0
}

/// The wgpu handle of adapter `index`.
#[cfg(feature = "wgpu")]
pub(crate) fn handle(index: usize) -> Option<&'static wgpu::Adapter> {
    found().1.get(index)
}

/// The adapters, enumerated once: descriptions and handles in the same order.
#[cfg(feature = "wgpu")]
fn found() -> &'static (Vec<Adapter>, Vec<wgpu::Adapter>) {
    static ADAPTERS: OnceLock<(Vec<Adapter>, Vec<wgpu::Adapter>)> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let handles = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let infos = handles.iter().map(describe).collect();
        (infos, handles)
    })
}

/// No adapters: this build has no wgpu.
#[cfg(not(feature = "wgpu"))]
fn found() -> &'static (Vec<Adapter>, ()) {
    static NONE: OnceLock<(Vec<Adapter>, ())> = OnceLock::new();
    NONE.get_or_init(|| (Vec::new(), ()))
}

/// `adapter` in this crate's words.
#[cfg(feature = "wgpu")]
fn describe(adapter: &wgpu::Adapter) -> Adapter {
    let info = adapter.get_info();
    let features = adapter.features();
    Adapter {
        name: info.name,
        api: match info.backend {
            wgpu::Backend::Vulkan => Api::Vulkan,
            wgpu::Backend::Metal => Api::Metal,
            wgpu::Backend::Dx12 => Api::Dx12,
            wgpu::Backend::Gl => Api::Gl,
            wgpu::Backend::BrowserWebGpu => Api::WebGpu,
            wgpu::Backend::Noop => Api::Noop,
        },
        device_type: match info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceType::DiscreteGpu,
            wgpu::DeviceType::IntegratedGpu => DeviceType::IntegratedGpu,
            wgpu::DeviceType::VirtualGpu => DeviceType::VirtualGpu,
            wgpu::DeviceType::Cpu => DeviceType::Cpu,
            wgpu::DeviceType::Other => DeviceType::Other,
        },
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
    }
}

pub(crate) fn report() -> serde_json::Value {
    let adapters: Vec<serde_json::Value> = list()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            serde_json::json!({
                "index": i,
                "name": a.name,
                "backend": a.api.name(),
                "device_type": format!("{:?}", a.device_type),
                "driver": a.driver,
                "shader_f16": a.shader_f16,
                "subgroups": a.subgroups,
            })
        })
        .collect();
    if cfg!(feature = "wgpu") {
        serde_json::json!({ "adapters": adapters })
    } else {
        serde_json::json!({ "adapters": adapters, "why": super::UNBUILT })
    }
}
