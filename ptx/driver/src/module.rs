//! Modules of PTX text, their functions, and launches run on the interpreter.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use backends_ptx::{ExecError, Launch};

use crate::stream::known_stream;
use crate::*;

/// Loads a module from NUL-terminated PTX text (parsed by the interpreter; PTX for a newer
/// arch than the device's is refused, as a driver refuses it).
///
/// # Safety
/// `module` is valid for a write; `image` points to a NUL-terminated image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    status(|| {
        if image.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: a module image starts with at least four bytes (an ELF or fatbin header,
        // or PTX text, whose first line is longer).
        let magic = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), 4) };
        if magic == b"ELF" || magic == [0x50, 0xed, 0x55, 0xba] {
            eprintln!(
                "backends-ptx-driver: a cubin or fatbin was loaded; this device runs PTX only"
            );
            return Err(NO_BINARY_FOR_GPU);
        }
        // SAFETY: PTX text is NUL-terminated (the caller's contract).
        let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) };
        let text = text.to_str().map_err(|_| INVALID_PTX)?;
        let parsed = backends_ptx::parse::parse(text).map_err(|e| {
            eprintln!("backends-ptx-driver: the interpreter cannot read this PTX: {e}");
            INVALID_PTX
        })?;
        let target: u32 = parsed
            .target
            .trim_start_matches("sm_")
            .trim_end_matches(['a', 'f'])
            .parse()
            .map_err(|_| INVALID_PTX)?;
        if target > arch() {
            eprintln!(
                "backends-ptx-driver: PTX for {} does not run on sm_{}",
                parsed.target,
                arch()
            );
            return Err(INVALID_PTX);
        }
        let mut driver = initialised()?;
        let handle = driver.handle();
        driver.modules.insert(handle, parsed);
        // SAFETY: the caller's contract.
        unsafe { put(module, handle_ptr(handle)) }
    })
}

/// Loads a module from a file of PTX text, as [`cuModuleLoadData`].
///
/// # Safety
/// `module` is valid for a write; `path` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut Handle, path: *const c_char) -> CUresult {
    if path.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: NUL-terminated (the caller's contract).
    let path = unsafe { CStr::from_ptr(path) };
    let Some(mut image) = path.to_str().ok().and_then(|p| std::fs::read(p).ok()) else {
        return FILE_NOT_FOUND;
    };
    image.push(0);
    // SAFETY: `image` is NUL-terminated; `module` as the caller's contract says.
    unsafe { cuModuleLoadData(module, image.as_ptr().cast()) }
}

/// Unloads a module (its functions become invalid handles).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    status(|| {
        let mut driver = initialised()?;
        driver
            .modules
            .remove(&module.addr())
            .ok_or(INVALID_HANDLE)?;
        driver.functions.retain(|_, (m, _)| *m != module.addr());
        Ok(())
    })
}

/// The kernel `name` of a module.
///
/// # Safety
/// `function` is valid for a write; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    status(|| {
        if name.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: NUL-terminated (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| NOT_FOUND)?;
        let mut driver = initialised()?;
        let parsed = driver.modules.get(&module.addr()).ok_or(INVALID_HANDLE)?;
        let index = parsed
            .kernels
            .iter()
            .position(|k| k.name == name)
            .ok_or(NOT_FOUND)?;
        let handle = driver.handle();
        driver.functions.insert(handle, (module.addr(), index));
        // SAFETY: the caller's contract.
        unsafe { put(function, handle_ptr(handle)) }
    })
}

/// One attribute of a function: its limits are the device's.
///
/// # Safety
/// `value` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    function: Handle,
) -> CUresult {
    status(|| {
        if !initialised()?.functions.contains_key(&function.addr()) {
            return Err(INVALID_HANDLE);
        }
        let answer = match attribute {
            0 => 1024,      // MAX_THREADS_PER_BLOCK
            8 => 227 << 10, // MAX_DYNAMIC_SHARED_SIZE_BYTES
            _ => return Err(NOT_SUPPORTED),
        };
        // SAFETY: the caller's contract.
        unsafe { put(value, answer) }
    })
}

/// Sets an attribute of a function: accepted and without effect (the interpreter has no
/// carve-outs or caches to configure); dynamic shared memory is not run (see
/// [`cuLaunchKernel`]).
///
/// # Safety
/// None beyond the driver API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(
    function: Handle,
    _attribute: c_uint,
    _value: c_int,
) -> CUresult {
    status(|| {
        if initialised()?.functions.contains_key(&function.addr()) {
            Ok(())
        } else {
            Err(INVALID_HANDLE)
        }
    })
}

/// Runs a kernel over a grid on the interpreter, to its end. Each of `params` points to
/// one parameter's bytes, sized by the kernel's PTX parameter list; `extra` and dynamic
/// shared memory are `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `params` holds one valid pointer per kernel parameter, each to as many bytes as the
/// parameter's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    function: Handle,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    status(|| {
        if shared_bytes != 0 || !extra.is_null() {
            return Err(NOT_SUPPORTED);
        }
        known_stream(stream)?;
        let mut guard = initialised()?;
        let driver = &mut *guard;
        let &(module, index) = driver
            .functions
            .get(&function.addr())
            .ok_or(INVALID_HANDLE)?;
        let kernel = &driver.modules.get(&module).ok_or(INVALID_HANDLE)?.kernels[index];
        if !kernel.params.is_empty() && params.is_null() {
            return Err(INVALID_VALUE);
        }
        let values = kernel
            .params
            .iter()
            .enumerate()
            .map(|(i, param)| {
                // SAFETY: `params` holds one pointer per parameter, each to the parameter's
                // bytes (the caller's contract).
                unsafe {
                    let value = *params.add(i);
                    std::slice::from_raw_parts(value.cast::<u8>(), param.bytes).to_vec()
                }
            })
            .collect();
        let launch = Launch {
            grid: [grid_x, grid_y, grid_z],
            block: [block_x, block_y, block_z],
            params: values,
            counters: false,
        };
        backends_ptx::run(kernel, &launch, &mut driver.memory)
            .map(drop)
            .map_err(|e| {
                eprintln!("backends-ptx-driver: {} failed: {e}", kernel.name);
                match e {
                    ExecError::BadAccess { .. } => ILLEGAL_ADDRESS,
                    _ => LAUNCH_FAILED,
                }
            })
    })
}
