//! CUDA through cudarc's dynamically loaded driver API: the devices the driver reports
//! (`driver.rs`), one `CudaDevice` per device that owns its context, stream,
//! loaded modules and per-device library state (`device.rs`), the choice of module image
//! (`loader.rs`), memory (`memory.rs`), kernel launches (`launch.rs`) and cuDNN's backend
//! graph API with its per-device plans (`cudnn.rs`). Nothing links
//! against CUDA (except with `candle-cuda`, where candle links the driver and libraries):
//! without a driver the queries answer 0 / `None`.
//!
//! Builds without the `cuda` feature compile `stub.rs` in place of the device, driver,
//! memory and launch files: the same API over types that have no values, whose one way in
//! (opening a device) fails with the reason. The ops' CUDA paths compile unchanged in both
//! builds; only the vendor-library bindings (cuBLAS, cuDNN, cuFFT) are feature-gated.

#[cfg(feature = "cuda")]
pub(crate) mod cudnn;
#[cfg(feature = "cuda")]
pub(crate) mod device;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
pub mod loader;
#[cfg(feature = "cuda")]
pub(crate) mod memory;
#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub(crate) use stub::{device, driver, launch, memory};

use std::sync::OnceLock;

/// Whether a CUDA library of cudarc's is there, given its `is_culib_present` probe: probed
/// by loading it (cudarc panics on a missing one), or there since the program started where
/// candle links the libraries into it (`candle-cuda`; the probe does not exist then).
#[cfg(feature = "cuda")]
macro_rules! library_present {
    ($probe:path) => {{
        #[cfg(not(feature = "candle-cuda"))]
        // SAFETY: the probe only tries to dlopen the library by its standard names.
        let present = unsafe { $probe() };
        #[cfg(feature = "candle-cuda")]
        let present = true;
        present
    }};
}
#[cfg(feature = "cuda")]
pub(crate) use library_present;

use crate::runtime::dylib::{self, Loaded};
use crate::{Error, Result};

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
pub const INTERPRET_ENV: &str = "BACKENDS_CUDA_INTERPRET";
/// The compute capability the interpreter reports (`90` or `sm_90`; 90 by default).
pub const INTERPRET_ARCH_ENV: &str = "BACKENDS_CUDA_INTERPRET_ARCH";
/// Set, the interpreter prints each launch's counters.
pub const INTERPRET_STATS_ENV: &str = "BACKENDS_CUDA_INTERPRET_STATS";

/// What the driver reported, probed once.
pub(crate) fn state() -> &'static DriverState {
    static STATE: OnceLock<DriverState> = OnceLock::new();
    STATE.get_or_init(driver::probe)
}

/// Whether the devices are the PTX interpreter's (`BACKENDS_CUDA_INTERPRET=1`).
pub(crate) fn is_interpreted() -> bool {
    state().interpreted
}

/// Whether CUDA can run here now: the driver loads and reports at least one device.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices the driver reports (0 without a driver).
pub fn device_count() -> usize {
    state().devices.len()
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (12090 is 12.9), if a driver loads.
pub fn driver_version() -> Option<u32> {
    state().version
}

/// Why CUDA is not available here, or `None` when it is.
pub fn unavailable_reason() -> Option<&'static str> {
    state().problem.as_deref()
}

/// The properties of device `ordinal`, if there is such a device.
pub fn get_device_properties(ordinal: usize) -> Option<&'static DeviceProperties> {
    state().devices.get(ordinal)
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

/// A grid dimension as the driver takes it.
pub(crate) fn grid_dim(op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks).map_err(|_| Error::ShapeMismatch {
        op,
        detail: format!("{blocks} blocks exceed the CUDA grid; split the call"),
    })
}

/// An `int` kernel argument.
pub(crate) fn int_arg(op: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::ShapeMismatch {
        op,
        detail: format!("{value} exceeds a 32-bit kernel argument; split the call"),
    })
}

/// A `long long` kernel argument.
pub(crate) fn long_arg(value: usize) -> i64 {
    i64::try_from(value).expect("a buffer index fits in 63 bits")
}

/// For a unit test whose kernels run on the PTX interpreter: in the test process, runs test
/// `name` (its full path) again in a child process where `cuda:0` is the interpreter (the
/// device list is read once per process), asserts that it passed, passes its `skipped:`
/// lines on and returns false; in that child, returns true.
#[cfg(test)]
pub(crate) fn in_interpreter_child(name: &str) -> bool {
    const CHILD: &str = "BACKENDS_INTERPRETER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env(INTERPRET_ENV, "1")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success() && log.contains("1 passed"), "{log}");
    for line in log.lines().filter(|l| l.starts_with("skipped:")) {
        eprintln!("{line}");
    }
    false
}
