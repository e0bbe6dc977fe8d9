//! What the CUDA driver reports, probed once through cudarc's dynamically loaded driver API.

use std::sync::OnceLock;

/// One CUDA device as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability major version (8 for sm_80).
    pub major: u32,
    /// Compute capability minor version.
    pub minor: u32,
    /// Streaming multiprocessors.
    pub multi_processor_count: u32,
    /// Global memory in bytes.
    pub total_memory: u64,
}

/// The driver's answer, or why there is none.
#[derive(Debug, Default)]
pub(crate) struct DriverState {
    /// `cuDriverGetVersion`, e.g. 12090 for CUDA 12.9.
    pub version: Option<u32>,
    pub devices: Vec<DeviceProperties>,
    /// Why no device can be used, when none can.
    pub problem: Option<String>,
    /// The devices are the PTX interpreter's (`BACKENDS_CUDA_INTERPRET=1`), not the driver's.
    pub interpreted: bool,
}

/// The variable that makes `cuda:0` the PTX interpreter.
#[cfg(feature = "cuda")]
pub const INTERPRET_ENV: &str = "BACKENDS_CUDA_INTERPRET";
/// The compute capability the interpreter reports (`90` or `sm_90`; 90 by default).
#[cfg(feature = "cuda")]
pub const INTERPRET_ARCH_ENV: &str = "BACKENDS_CUDA_INTERPRET_ARCH";
/// Set, the interpreter prints each launch's counters.
#[cfg(feature = "cuda")]
pub const INTERPRET_STATS_ENV: &str = "BACKENDS_CUDA_INTERPRET_STATS";

/// One interpreted device, where `BACKENDS_CUDA_INTERPRET=1` asks for it.
#[cfg(feature = "cuda")]
fn interpreted() -> Option<DriverState> {
    if std::env::var(INTERPRET_ENV).ok()?.trim() != "1" {
        return None;
    }
    let arch = std::env::var(INTERPRET_ARCH_ENV)
        .ok()
        .and_then(|a| a.trim().trim_start_matches("sm_").parse::<u32>().ok())
        .filter(|a| (50..=120).contains(a))
        .unwrap_or(90);
    Some(DriverState {
        version: None,
        devices: vec![DeviceProperties {
            name: format!("PTX interpreter (sm_{arch})"),
            major: arch / 10,
            minor: arch % 10,
            multi_processor_count: 1,
            total_memory: 1 << 34,
        }],
        problem: None,
        interpreted: true,
    })
}

pub(crate) fn state() -> &'static DriverState {
    static STATE: OnceLock<DriverState> = OnceLock::new();
    STATE.get_or_init(probe)
}

#[cfg(feature = "cuda")]
fn probe() -> DriverState {
    use cudarc::driver::{result, sys};

    if let Some(state) = interpreted() {
        return state;
    }
    // SAFETY: only tries to dlopen the driver library by its standard names.
    if !unsafe { sys::is_culib_present() } {
        return DriverState {
            problem: Some(
                "the CUDA driver library (libcuda) was not found: install the NVIDIA driver".into(),
            ),
            ..DriverState::default()
        };
    }
    let mut version = 0;
    // SAFETY: the driver library is present (checked above); the out-pointer is valid.
    let version = unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .ok()
        .and_then(|()| u32::try_from(version).ok());
    if let Err(err) = result::init() {
        return DriverState {
            version,
            problem: Some(format!("cuInit failed: {err:?}")),
            ..DriverState::default()
        };
    }
    let count = result::device::get_count().unwrap_or(0);
    let devices: Vec<DeviceProperties> = (0..count).filter_map(describe).collect();
    let problem = devices
        .is_empty()
        .then(|| "the CUDA driver reports no device".to_string());
    DriverState {
        version,
        devices,
        problem,
        interpreted: false,
    }
}

#[cfg(feature = "cuda")]
fn describe(ordinal: i32) -> Option<DeviceProperties> {
    use cudarc::driver::result::device;
    use cudarc::driver::sys::CUdevice_attribute as Attr;

    let dev = device::get(ordinal).ok()?;
    let attr = |a| {
        // SAFETY: `dev` was returned by cuDeviceGet for a valid ordinal.
        unsafe { device::get_attribute(dev, a) }
            .ok()
            .and_then(|v| u32::try_from(v).ok())
    };
    Some(DeviceProperties {
        name: device::get_name(dev).ok()?,
        major: attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        minor: attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        multi_processor_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        // SAFETY: as above.
        total_memory: unsafe { device::total_mem(dev) }.ok()? as u64,
    })
}

#[cfg(not(feature = "cuda"))]
fn probe() -> DriverState {
    DriverState {
        problem: Some("this build has no CUDA support: build with the `cuda` feature".into()),
        ..DriverState::default()
    }
}
