//! What the CUDA driver reports, probed once through cudarc's dynamically loaded driver API
//! (or the interpreted device, where it is asked for).

use super::{DeviceProperties, DriverState, INTERPRET_ARCH_ENV, INTERPRET_ENV};

/// One interpreted device, where `BACKENDS_CUDA_INTERPRET=1` asks for it.
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
            // An H100/H200's count: the launchers size grids and split-K by it, so the
            // interpreter sees the launches a large GPU gets.
            multi_processor_count: 132,
            total_memory: 1 << 34,
        }],
        problem: None,
        interpreted: true,
    })
}

/// What the driver reports, or the interpreted device.
pub(crate) fn probe() -> DriverState {
    use cudarc::driver::{result, sys};

    if let Some(state) = interpreted() {
        return state;
    }
    if !super::library_present!(sys::is_culib_present) {
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
