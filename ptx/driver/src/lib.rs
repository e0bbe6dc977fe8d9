//! # backends-ptx-driver
//!
//! A CUDA driver library whose one device is the PTX interpreter ([`backends_ptx`]): built
//! as a `cdylib` and loaded as `libcuda.so`, it lets a program that calls the driver API
//! (through cudarc, unchanged) run its kernels on a machine without a GPU, so that the
//! driver side of `backends` (contexts, streams, events, allocations, copies, module loads
//! and launches marshalled by cudarc) is tested, not only its kernels.
//!
//! What it serves: the calls `backends` and cudarc make (see the `cu*` functions below).
//! Work is done when it is queued: every stream is in order and always idle, so events
//! complete when recorded (their time is the host's clock). Modules are PTX text (a cubin
//! or fatbin is `CUDA_ERROR_NO_BINARY_FOR_GPU`: there is no SASS to run); fresh
//! allocations are filled with `0xff` bytes (NaN in every float type), so a kernel that
//! reads memory nobody wrote shows. A failed launch prints the interpreter's reason on
//! stderr and answers `CUDA_ERROR_LAUNCH_FAILED` (`CUDA_ERROR_ILLEGAL_ADDRESS` for an
//! access outside every allocation).
//!
//! The device is `sm_100` unless `BACKENDS_PTX_DRIVER_ARCH` names another (`86`, `sm_75`):
//! a real arch with no cubin shipped by `backends`, so that its PTX is what loads.

#![allow(non_snake_case)]

mod device;
mod memory;
mod module;
mod stream;

pub use device::*;
pub use memory::*;
pub use module::*;
pub use stream::*;

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use backends_ptx::{Memory, Module};

/// A driver call's status (`CUresult`).
pub type CUresult = c_uint;
/// A device ordinal (`CUdevice`).
pub type CUdevice = c_int;
/// A device address (`CUdeviceptr`).
pub type CUdeviceptr = u64;
/// An opaque handle (context, module, function, stream, event).
pub type Handle = *mut c_void;

/// The statuses this driver answers, with their names and messages.
const STATUSES: [(CUresult, &CStr, &CStr); 15] = [
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        209,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        c"no kernel image is available for execution on the device",
    ),
    (
        218,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];
const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const OUT_OF_MEMORY: CUresult = 2;
const NOT_INITIALIZED: CUresult = 3;
const INVALID_DEVICE: CUresult = 101;
const INVALID_CONTEXT: CUresult = 201;
const NO_BINARY_FOR_GPU: CUresult = 209;
const INVALID_PTX: CUresult = 218;
const FILE_NOT_FOUND: CUresult = 301;
const INVALID_HANDLE: CUresult = 400;
const NOT_FOUND: CUresult = 500;
const ILLEGAL_ADDRESS: CUresult = 700;
const LAUNCH_FAILED: CUresult = 719;
const NOT_SUPPORTED: CUresult = 801;

/// The CUDA version this driver reports (13.0).
const DRIVER_VERSION: c_int = 13000;
/// The device's memory as reported (the host's memory backs it).
const TOTAL_MEMORY: usize = 16 << 30;
/// The one context's handle.
const CONTEXT: usize = 1;

/// The driver's state: the device's memory and the handles it gave out.
#[derive(Default)]
struct Driver {
    initialised: bool,
    memory: Memory,
    modules: HashMap<usize, Module>,
    /// A function's module and its kernel's index there.
    functions: HashMap<usize, (usize, usize)>,
    streams: Vec<usize>,
    /// Each event and when it was last recorded.
    events: HashMap<usize, Option<Instant>>,
    last_handle: usize,
}

impl Driver {
    /// A new handle, apart from the context's and the special streams' values.
    fn handle(&mut self) -> usize {
        self.last_handle += 1;
        0x1000 + self.last_handle
    }

    /// Whether `stream` is one made by `cuStreamCreate` or a special one: the null
    /// stream, `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2).
    fn stream_exists(&self, stream: Handle) -> bool {
        stream.addr() <= 2 || self.streams.contains(&stream.addr())
    }
}

static DRIVER: LazyLock<Mutex<Driver>> = LazyLock::new(Default::default);

/// The driver's state, locked (one call at a time: the interpreter runs launches to their end).
fn driver() -> MutexGuard<'static, Driver> {
    DRIVER.lock().unwrap_or_else(|p| p.into_inner())
}

/// The driver's state once `cuInit` has run, or `CUDA_ERROR_NOT_INITIALIZED`.
fn initialised() -> Result<MutexGuard<'static, Driver>, CUresult> {
    let driver = driver();
    if driver.initialised {
        Ok(driver)
    } else {
        Err(NOT_INITIALIZED)
    }
}

/// `Ok` once `cuInit` has run, else `CUDA_ERROR_NOT_INITIALIZED`.
fn ready() -> Result<(), CUresult> {
    initialised().map(drop)
}

/// The device's compute capability, as `major * 10 + minor`.
fn arch() -> u32 {
    std::env::var("BACKENDS_PTX_DRIVER_ARCH")
        .ok()
        .and_then(|a| a.trim().trim_start_matches("sm_").parse().ok())
        .filter(|a| (50..=120).contains(a))
        .unwrap_or(100)
}

/// Runs `call`, turning its `Err` into the status it holds.
fn status(call: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    call().err().unwrap_or(SUCCESS)
}

/// Writes `value` through `out`, which must not be null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

fn handle_ptr(handle: usize) -> Handle {
    std::ptr::without_provenance_mut(handle)
}

fn device(ordinal: CUdevice) -> Result<(), CUresult> {
    if ordinal == 0 {
        Ok(())
    } else {
        Err(INVALID_DEVICE)
    }
}

/// Initialises the driver.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return INVALID_VALUE;
    }
    driver().initialised = true;
    SUCCESS
}

/// The CUDA version of this driver.
///
/// # Safety
/// `version` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller's contract.
    status(|| unsafe { put(version, DRIVER_VERSION) })
}

fn describe(error: CUresult) -> Option<&'static (CUresult, &'static CStr, &'static CStr)> {
    STATUSES.iter().find(|(code, ..)| *code == error)
}

/// A status's message.
///
/// # Safety
/// `text` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    let Some((_, _, message)) = describe(error) else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's contract; the message is static.
    status(|| unsafe { put(text, message.as_ptr()) })
}

/// A status's name.
///
/// # Safety
/// `text` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, text: *mut *const c_char) -> CUresult {
    let Some((_, name, _)) = describe(error) else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's contract; the name is static.
    status(|| unsafe { put(text, name.as_ptr()) })
}
