//! Device memory: allocations in the interpreter's global memory, copies and fills.

use std::ffi::c_void;

use crate::stream::on_stream;
use crate::*;

/// `bytes` of new device memory, filled with `0xff` (NaN in every float type).
///
/// # Safety
/// `address` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(address: *mut CUdeviceptr, bytes: usize) -> CUresult {
    status(|| {
        if bytes == 0 {
            return Err(INVALID_VALUE);
        }
        let mut fill = Vec::new();
        fill.try_reserve_exact(bytes).map_err(|_| OUT_OF_MEMORY)?;
        fill.resize(bytes, 0xff);
        let base = initialised()?.memory.upload(&fill);
        // SAFETY: the caller's contract.
        unsafe { put(address, base) }
    })
}

/// Frees device memory.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(address: CUdeviceptr) -> CUresult {
    status(|| {
        if initialised()?.memory.free(address) {
            Ok(())
        } else {
            Err(INVALID_VALUE)
        }
    })
}

/// As [`cuMemAlloc_v2`], ordered on a stream (done at once).
///
/// # Safety
/// `address` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    address: *mut CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: the same contract.
    on_stream(stream, || unsafe { cuMemAlloc_v2(address, bytes) })
}

/// As [`cuMemFree_v2`], ordered on a stream (done at once).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(address: CUdeviceptr, stream: Handle) -> CUresult {
    // SAFETY: no pointer is dereferenced.
    on_stream(stream, || unsafe { cuMemFree_v2(address) })
}

/// Copies `bytes` from the host to the device.
///
/// # Safety
/// `source` is valid for `bytes` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    target: CUdeviceptr,
    source: *const c_void,
    bytes: usize,
) -> CUresult {
    status(|| {
        if bytes == 0 {
            return Ok(());
        }
        if source.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `source` holds `bytes` bytes (the caller's contract).
        let data = unsafe { std::slice::from_raw_parts(source.cast::<u8>(), bytes) };
        write(&mut *initialised()?, target, data)
    })
}

/// As [`cuMemcpyHtoD_v2`], on a stream (done at once).
///
/// # Safety
/// `source` is valid for `bytes` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    target: CUdeviceptr,
    source: *const c_void,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: the same contract.
    on_stream(stream, || unsafe { cuMemcpyHtoD_v2(target, source, bytes) })
}

/// Copies `bytes` from the device to the host.
///
/// # Safety
/// `target` is valid for `bytes` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    target: *mut c_void,
    source: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    status(|| {
        if bytes == 0 {
            return Ok(());
        }
        if target.is_null() {
            return Err(INVALID_VALUE);
        }
        let driver = initialised()?;
        let data = driver.memory.download(source, bytes).ok_or(INVALID_VALUE)?;
        // SAFETY: `target` holds `bytes` bytes (the caller's contract) and is host memory,
        // apart from the driver's.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), target.cast::<u8>(), bytes) };
        Ok(())
    })
}

/// As [`cuMemcpyDtoH_v2`], on a stream (done at once).
///
/// # Safety
/// `target` is valid for `bytes` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    target: *mut c_void,
    source: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: the same contract.
    on_stream(stream, || unsafe { cuMemcpyDtoH_v2(target, source, bytes) })
}

/// Copies `bytes` between device addresses.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    target: CUdeviceptr,
    source: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    status(|| {
        if bytes == 0 {
            return Ok(());
        }
        let mut driver = initialised()?;
        let data = driver
            .memory
            .download(source, bytes)
            .ok_or(INVALID_VALUE)?
            .to_vec();
        write(&mut driver, target, &data)
    })
}

/// As [`cuMemcpyDtoD_v2`], on a stream (done at once).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    target: CUdeviceptr,
    source: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: no pointer is dereferenced.
    on_stream(stream, || unsafe { cuMemcpyDtoD_v2(target, source, bytes) })
}

/// Sets `count` bytes at `target` to `value`.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(target: CUdeviceptr, value: u8, count: usize) -> CUresult {
    status(|| {
        if count == 0 {
            return Ok(());
        }
        let mut fill = Vec::new();
        fill.try_reserve_exact(count).map_err(|_| OUT_OF_MEMORY)?;
        fill.resize(count, value);
        write(&mut *initialised()?, target, &fill)
    })
}

/// As [`cuMemsetD8_v2`], on a stream (done at once).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async(
    target: CUdeviceptr,
    value: u8,
    count: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: no pointer is dereferenced.
    on_stream(stream, || unsafe { cuMemsetD8_v2(target, value, count) })
}

/// Copies `bytes` between the memory of two contexts: there is one, so a device copy.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    target: CUdeviceptr,
    target_context: Handle,
    source: CUdeviceptr,
    source_context: Handle,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    if target_context.addr() != CONTEXT || source_context.addr() != CONTEXT {
        return INVALID_CONTEXT;
    }
    // SAFETY: no pointer is dereferenced.
    unsafe { cuMemcpyDtoDAsync_v2(target, source, bytes, stream) }
}

/// Writes `bytes` at `target`, or `CUDA_ERROR_INVALID_VALUE` where they leave every
/// allocation.
fn write(driver: &mut Driver, target: CUdeviceptr, bytes: &[u8]) -> Result<(), CUresult> {
    if driver.memory.write(target, bytes) {
        Ok(())
    } else {
        Err(INVALID_VALUE)
    }
}
