//! Streams and events: every stream is in order and idle (work is done when queued), so an
//! event completes when it is recorded, at the host's time.

use std::ffi::c_uint;
use std::time::Instant;

use crate::*;

/// A new stream.
///
/// # Safety
/// `stream` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> CUresult {
    status(|| {
        let mut driver = initialised()?;
        let handle = driver.handle();
        driver.streams.push(handle);
        // SAFETY: the caller's contract.
        unsafe { put(stream, handle_ptr(handle)) }
    })
}

/// Destroys a stream.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    status(|| {
        let mut driver = initialised()?;
        let before = driver.streams.len();
        driver.streams.retain(|&s| s != stream.addr());
        if driver.streams.len() == before {
            return Err(INVALID_HANDLE);
        }
        Ok(())
    })
}

/// Checks a stream (or the null stream) exists.
pub(crate) fn known_stream(stream: Handle) -> Result<(), CUresult> {
    if initialised()?.stream_exists(stream) {
        Ok(())
    } else {
        Err(INVALID_HANDLE)
    }
}

/// `call`'s status where `stream` exists, else `CUDA_ERROR_INVALID_HANDLE`: the stream
/// forms of the calls, whose work is done when queued.
pub(crate) fn on_stream(stream: Handle, call: impl FnOnce() -> CUresult) -> CUresult {
    match known_stream(stream) {
        Ok(()) => call(),
        Err(e) => e,
    }
}

/// Waits for a stream: its work is done when queued.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    status(|| known_stream(stream))
}

/// Whether a stream is idle: always.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    status(|| known_stream(stream))
}

/// Whether a stream is capturing a graph: never (graphs are not run here).
///
/// # Safety
/// `capturing` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Handle, capturing: *mut c_uint) -> CUresult {
    status(|| {
        known_stream(stream)?;
        // SAFETY: the caller's contract; 0 is CU_STREAM_CAPTURE_STATUS_NONE.
        unsafe { put(capturing, 0) }
    })
}

/// Makes a stream wait for an event: recorded events are complete.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: Handle,
    event: Handle,
    _flags: c_uint,
) -> CUresult {
    status(|| {
        known_stream(stream)?;
        known_event(event).map(drop)
    })
}

/// A new event.
///
/// # Safety
/// `event` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    status(|| {
        let mut driver = initialised()?;
        let handle = driver.handle();
        driver.events.insert(handle, None);
        // SAFETY: the caller's contract.
        unsafe { put(event, handle_ptr(handle)) }
    })
}

/// When an event was last recorded (`None`: never).
fn known_event(event: Handle) -> Result<Option<Instant>, CUresult> {
    initialised()?
        .events
        .get(&event.addr())
        .copied()
        .ok_or(INVALID_HANDLE)
}

/// Records an event on a stream: it completes at once, now.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    status(|| {
        known_stream(stream)?;
        match initialised()?.events.get_mut(&event.addr()) {
            Some(when) => {
                *when = Some(Instant::now());
                Ok(())
            }
            None => Err(INVALID_HANDLE),
        }
    })
}

/// Waits for an event: recorded events are complete.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    status(|| known_event(event).map(drop))
}

/// Whether an event is complete: always.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    status(|| known_event(event).map(drop))
}

/// Milliseconds between two recorded events.
///
/// # Safety
/// `ms` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    status(|| {
        let (Some(start), Some(end)) = (known_event(start)?, known_event(end)?) else {
            return Err(INVALID_HANDLE);
        };
        let elapsed = end.saturating_duration_since(start).as_secs_f64() * 1e3;
        // SAFETY: the caller's contract.
        unsafe { put(ms, elapsed as f32) }
    })
}

/// As [`cuEventElapsedTime`] (the CUDA 12.8 name).
///
/// # Safety
/// `ms` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

/// Destroys an event.
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    status(|| {
        initialised()?
            .events
            .remove(&event.addr())
            .map(drop)
            .ok_or(INVALID_HANDLE)
    })
}
