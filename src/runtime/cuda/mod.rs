//! CUDA through cudarc's dynamically loaded driver API: the devices the driver reports
//! (`driver.rs`), one [`device::CudaDevice`] per device that owns its context, stream,
//! loaded modules and per-device library state (`device.rs`), module loading (`loader.rs`),
//! memory (`memory.rs`) and kernel launches (`launch.rs`). Nothing links against CUDA: without a driver the queries answer 0 / `None`.

#[cfg(feature = "cuda")]
pub(crate) mod device;
pub(crate) mod driver;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
#[cfg(feature = "cuda")]
pub mod loader;
#[cfg(feature = "cuda")]
pub(crate) mod memory;

pub use driver::DeviceProperties;

use std::sync::OnceLock;

use crate::runtime::dylib::{self, Loaded};

/// Whether CUDA can run here now: the driver loads and reports at least one device.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices the driver reports (0 without a driver).
pub fn device_count() -> usize {
    driver::state().devices.len()
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (12090 is 12.9), if a driver loads.
pub fn driver_version() -> Option<u32> {
    driver::state().version
}

/// Why CUDA is not available here, or `None` when it is.
pub fn unavailable_reason() -> Option<&'static str> {
    driver::state().problem.as_deref()
}

/// The properties of device `ordinal`, if there is such a device.
pub fn get_device_properties(ordinal: usize) -> Option<&'static DeviceProperties> {
    driver::state().devices.get(ordinal)
}

/// The compute capability `(major, minor)` of device `ordinal`.
pub fn get_device_capability(ordinal: usize) -> Option<(u32, u32)> {
    get_device_properties(ordinal).map(|p| (p.major, p.minor))
}

/// The name of device `ordinal`.
pub fn get_device_name(ordinal: usize) -> Option<&'static str> {
    get_device_properties(ordinal).map(|p| p.name.as_str())
}

/// The cuDNN library, loaded once, if it loads.
pub(crate) fn cudnn_library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("cudnn", &["9", "8"]))
        .as_ref()
}

/// cuDNN's version as `cudnnGetVersion` reports it (e.g. 90100 for 9.1.0), if it loads.
pub fn cudnn_version() -> Option<u32> {
    let lib = cudnn_library()?;
    // SAFETY: `cudnnGetVersion` takes no arguments and returns a size_t in every cuDNN release.
    let get: libloading::Symbol<unsafe extern "C" fn() -> usize> =
        unsafe { lib.lib.get(b"cudnnGetVersion\0") }.ok()?;
    // SAFETY: the symbol has the signature above.
    u32::try_from(unsafe { get() }).ok()
}
