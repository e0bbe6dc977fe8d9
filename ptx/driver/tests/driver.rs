//! The driver API of `backends-ptx-driver`, called as a program calls libcuda: a module of
//! PTX loads and its kernel runs over a grid on memory copied in and out, fresh memory is
//! poisoned, and misuse (a cubin, PTX for a newer arch, an address outside
//! every allocation, an unknown handle) gives the driver's statuses.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::{null, null_mut};

use backends_ptx_driver::*;

/// `x[i] += 1` for `i < n`, one thread per element.
const ADD_ONE: &str = "
.version 8.0
.target sm_80
.address_size 64

.visible .entry add_one(
    .param .u64 add_one_param_0,
    .param .u32 add_one_param_1
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [add_one_param_0];
    ld.param.u32 %r1, [add_one_param_1];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra $L__BB0_2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd4], %f2;
$L__BB0_2:
    ret;
}
";

fn ok(status: CUresult) {
    let mut name: *const c_char = null();
    // SAFETY: a valid out-pointer.
    unsafe { cuGetErrorName(status, &mut name) };
    assert_eq!(
        status,
        0,
        "{:?}",
        (!name.is_null()).then(|| {
            // SAFETY: the driver's static, NUL-terminated name.
            unsafe { CStr::from_ptr(name) }
        })
    );
}

fn init() {
    // SAFETY: no pointers.
    ok(unsafe { cuInit(0) });
}

fn load(ptx: &str) -> Result<Handle, CUresult> {
    let text = std::ffi::CString::new(ptx).unwrap();
    let mut module = null_mut();
    // SAFETY: valid out-pointer and NUL-terminated image.
    match unsafe { cuModuleLoadData(&mut module, text.as_ptr().cast()) } {
        0 => Ok(module),
        status => Err(status),
    }
}

#[test]
fn a_kernel_runs_on_memory_copied_in_and_out() {
    init();
    let module = load(ADD_ONE).unwrap();
    let mut function = null_mut();
    // SAFETY: valid pointers, NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut function, module, c"add_one".as_ptr()) });
    let n = 1000u32;
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let bytes = host.len() * 4;
    let mut x = 0;
    let mut stream = null_mut();
    // SAFETY: valid out-pointers; `host` holds `bytes` bytes.
    unsafe {
        ok(cuMemAlloc_v2(&mut x, bytes));
        ok(cuStreamCreate(&mut stream, 0));
        ok(cuMemcpyHtoDAsync_v2(x, host.as_ptr().cast(), bytes, stream));
    }
    let mut n_arg = n;
    let mut params = [(&raw mut x).cast::<c_void>(), (&raw mut n_arg).cast()];
    // SAFETY: one pointer per parameter, each to the parameter's bytes.
    ok(unsafe {
        cuLaunchKernel(
            function,
            4,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null_mut(),
        )
    });
    let mut out = vec![f32::NAN; host.len()];
    // SAFETY: `out` holds `bytes` bytes.
    unsafe {
        ok(cuStreamSynchronize(stream));
        ok(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), x, bytes));
        ok(cuMemFree_v2(x));
        ok(cuStreamDestroy_v2(stream));
        ok(cuModuleUnload(module));
    }
    let want: Vec<f32> = host.iter().map(|v| v + 1.0).collect();
    assert_eq!(out, want);
    // The function went with its module.
    // SAFETY: as above.
    let status = unsafe {
        cuLaunchKernel(
            function,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(status, 400);
}

#[test]
fn fresh_memory_is_poisoned_and_copies_stay_inside_allocations() {
    init();
    let (mut a, mut b) = (0, 0);
    let mut seen = [0u8; 8];
    // SAFETY: valid out-pointers; `seen` holds 8 bytes.
    unsafe {
        ok(cuMemAlloc_v2(&mut a, 8));
        ok(cuMemAlloc_v2(&mut b, 8));
        ok(cuMemcpyDtoH_v2(seen.as_mut_ptr().cast(), a, 8));
        assert_eq!(seen, [0xff; 8]);
        ok(cuMemsetD8_v2(a + 2, 7, 4));
        ok(cuMemcpyDtoD_v2(b, a, 8));
        ok(cuMemcpyDtoH_v2(seen.as_mut_ptr().cast(), b, 8));
        assert_eq!(seen, [0xff, 0xff, 7, 7, 7, 7, 0xff, 0xff]);
        // Past the end of an allocation, and a freed one.
        assert_eq!(cuMemcpyDtoH_v2(seen.as_mut_ptr().cast(), a + 4, 8), 1);
        ok(cuMemFree_v2(a));
        assert_eq!(cuMemsetD8_v2(a, 0, 1), 1);
        assert_eq!(cuMemFree_v2(a), 1);
        ok(cuMemFree_v2(b));
        // Stream-ordered, on the per-thread stream (CU_STREAM_PER_THREAD), which is idle.
        let (mut c, mut capturing) = (0, 7);
        let per_thread: Handle = std::ptr::without_provenance_mut(2);
        ok(cuMemAllocAsync(&mut c, 4, per_thread));
        ok(cuStreamIsCapturing(per_thread, &mut capturing));
        assert_eq!(capturing, 0);
        ok(cuMemFreeAsync(c, per_thread));
        assert_eq!(
            cuMemFreeAsync(c, std::ptr::without_provenance_mut(0x7777)),
            400
        );
    }
}

#[test]
fn images_it_cannot_run_are_refused_as_a_driver_refuses_them() {
    init();
    let mut module = null_mut();
    // SAFETY: a four-byte ELF header followed by NUL.
    let status = unsafe { cuModuleLoadData(&mut module, c"\x7fELF".as_ptr().cast()) };
    assert_eq!(status, 209);
    assert_eq!(load(&ADD_ONE.replace("sm_80", "sm_120")), Err(218));
    let module = load(ADD_ONE).unwrap();
    let mut function = null_mut();
    // SAFETY: valid pointers, NUL-terminated name.
    let status = unsafe { cuModuleGetFunction(&mut function, module, c"add_two".as_ptr()) };
    assert_eq!(status, 500);
}

#[test]
fn a_launch_outside_memory_is_an_illegal_address() {
    init();
    let module = load(ADD_ONE).unwrap();
    let mut function = null_mut();
    let mut x = 0;
    // SAFETY: valid pointers, NUL-terminated name.
    unsafe {
        ok(cuModuleGetFunction(
            &mut function,
            module,
            c"add_one".as_ptr(),
        ));
        ok(cuMemAlloc_v2(&mut x, 16));
    }
    // Five elements in a four-element allocation.
    let mut n = 5u32;
    let mut params = [(&raw mut x).cast::<c_void>(), (&raw mut n).cast()];
    // SAFETY: one pointer per parameter, each to the parameter's bytes.
    let status = unsafe {
        cuLaunchKernel(
            function,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(status, 700);

    // An instruction the interpreter does not run fails the launch (the interpreter reads
    // each kernel's instructions when it runs them).
    let module = load(&ADD_ONE.replace("add.f32", "frobnicate.f32")).unwrap();
    let mut four = 4u32;
    let mut params = [(&raw mut x).cast::<c_void>(), (&raw mut four).cast()];
    // SAFETY: as above.
    let status = unsafe {
        ok(cuModuleGetFunction(
            &mut function,
            module,
            c"add_one".as_ptr(),
        ));
        cuLaunchKernel(
            function,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(status, 719);
}

#[test]
fn the_device_and_its_events_answer_as_a_driver_does() {
    init();
    let (mut count, mut major, mut minor, mut version) = (0, 0, 0, 0);
    let mut name = [0 as c_char; 64];
    // SAFETY: valid out-pointers; `name` holds 64 bytes.
    unsafe {
        ok(cuDeviceGetCount(&mut count));
        ok(cuDriverGetVersion(&mut version));
        ok(cuDeviceGetAttribute(&mut major, 75, 0));
        ok(cuDeviceGetAttribute(&mut minor, 76, 0));
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert_eq!(cuDeviceGetAttribute(&mut major, 75, 1), 101);
    }
    assert_eq!((count, version), (1, 13000));
    let arch = std::env::var("BACKENDS_PTX_DRIVER_ARCH")
        .map_or(100, |a| a.trim_start_matches("sm_").parse().unwrap());
    assert_eq!(major * 10 + minor, arch);
    // SAFETY: NUL-terminated by the driver.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap();
    assert!(name.starts_with("PTX interpreter"), "{name}");

    let (mut start, mut end, mut ms) = (null_mut(), null_mut(), -1.0f32);
    // SAFETY: valid out-pointers.
    unsafe {
        ok(cuEventCreate(&mut start, 0));
        ok(cuEventCreate(&mut end, 0));
        // Never recorded: no time between them.
        assert_eq!(cuEventElapsedTime(&mut ms, start, end), 400);
        ok(cuEventRecord(start, null_mut()));
        std::thread::sleep(std::time::Duration::from_millis(5));
        ok(cuEventRecord(end, null_mut()));
        ok(cuEventSynchronize(end));
        ok(cuEventElapsedTime(&mut ms, start, end));
        ok(cuEventDestroy_v2(start));
        assert_eq!(cuEventDestroy_v2(start), 400);
        ok(cuEventDestroy_v2(end));
    }
    assert!(ms >= 5.0, "{ms} ms");
}
