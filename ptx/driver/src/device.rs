//! Devices and contexts: one device (ordinal 0) of the arch [`crate::arch`] names, and its
//! primary context, the only one.

use std::ffi::{c_char, c_int, c_uint};

use crate::*;

/// How many devices there are: one.
///
/// # Safety
/// `count` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    status(|| {
        ready()?;
        // SAFETY: the caller's contract.
        unsafe { put(count, 1) }
    })
}

/// The device of `ordinal` (only 0).
///
/// # Safety
/// `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(out: *mut CUdevice, ordinal: c_int) -> CUresult {
    status(|| {
        ready()?;
        device(ordinal)?;
        // SAFETY: the caller's contract.
        unsafe { put(out, ordinal) }
    })
}

/// The device's name, NUL-terminated in `len` bytes at `name`.
///
/// # Safety
/// `name` is valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    status(|| {
        ready()?;
        device(dev)?;
        let text = format!("PTX interpreter behind the driver API (sm_{})", arch());
        let len = usize::try_from(len).map_err(|_| INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(INVALID_VALUE);
        }
        let bytes = &text.as_bytes()[..text.len().min(len - 1)];
        // SAFETY: `name` holds `len` bytes (the caller's contract); `bytes` is shorter.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), name, bytes.len());
            name.add(bytes.len()).write(0);
        }
        Ok(())
    })
}

/// The device's memory in bytes.
///
/// # Safety
/// `bytes` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    status(|| {
        ready()?;
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(bytes, TOTAL_MEMORY) }
    })
}

/// Free and total device memory.
///
/// # Safety
/// `free` and `total` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    status(|| {
        ready()?;
        // SAFETY: the caller's contract.
        unsafe {
            put(free, TOTAL_MEMORY)?;
            put(total, TOTAL_MEMORY)
        }
    })
}

/// One attribute of the device: those of a large GPU of its arch; an attribute this
/// driver does not describe is `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    dev: CUdevice,
) -> CUresult {
    status(|| {
        ready()?;
        device(dev)?;
        let arch = arch() as c_int;
        let answer = match attribute {
            1 => 1024,       // MAX_THREADS_PER_BLOCK
            2 | 3 => 1024,   // MAX_BLOCK_DIM_X, _Y
            4 => 64,         // MAX_BLOCK_DIM_Z
            5 => c_int::MAX, // MAX_GRID_DIM_X
            6 | 7 => 65535,  // MAX_GRID_DIM_Y, _Z
            8 => 48 << 10,   // MAX_SHARED_MEMORY_PER_BLOCK
            10 => 32,        // WARP_SIZE
            16 => 132,       // MULTIPROCESSOR_COUNT
            41 => 1,         // UNIFIED_ADDRESSING
            75 => arch / 10, // COMPUTE_CAPABILITY_MAJOR
            76 => arch % 10, // COMPUTE_CAPABILITY_MINOR
            81 => 228 << 10, // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
            97 => 227 << 10, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            115 => 0,        // MEMORY_POOLS_SUPPORTED: no stream-ordered allocator
            _ => return Err(NOT_SUPPORTED),
        };
        // SAFETY: the caller's contract.
        unsafe { put(value, answer) }
    })
}

thread_local! {
    /// The context current on this thread (0: none).
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The device's primary context (there is one context).
///
/// # Safety
/// `context` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut Handle, dev: CUdevice) -> CUresult {
    status(|| {
        ready()?;
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(context, handle_ptr(CONTEXT)) }
    })
}

/// Releases the primary context (it lives as long as the process).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    status(|| device(dev))
}

/// Makes `context` (the one context, or none) current on this thread.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(context: Handle) -> CUresult {
    status(|| {
        ready()?;
        if !context.is_null() && context.addr() != CONTEXT {
            return Err(INVALID_CONTEXT);
        }
        CURRENT.set(context.addr());
        Ok(())
    })
}

/// Destroys a context made by `cuCtxCreate`: there are none (the primary context is
/// released, not destroyed).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(_context: Handle) -> CUresult {
    INVALID_CONTEXT
}

/// The context current on this thread (null if none).
///
/// # Safety
/// `context` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut Handle) -> CUresult {
    status(|| {
        ready()?;
        // SAFETY: the caller's contract.
        unsafe { put(context, handle_ptr(CURRENT.get())) }
    })
}

/// The current context's device.
///
/// # Safety
/// `dev` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    status(|| {
        ready()?;
        if CURRENT.get() != CONTEXT {
            return Err(INVALID_CONTEXT);
        }
        // SAFETY: the caller's contract.
        unsafe { put(dev, 0) }
    })
}

/// Waits for the context's work: done already.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    status(ready)
}
