//! NNPACK (loaded at run time), its `enabled` flag, and the CPU convolutions it runs: those
//! PyTorch gives it ([`refusal`]) while `mkldnn.enabled` is off. `torch.backends.nnpack`
//! (the `nnpack` facade) sets and reports the flag.
//!
//! NNPACK is found as its own `libnnpack.so` or inside PyTorch's `libtorch_cpu.so`, which
//! links NNPACK in and exports its C API (put `torch/lib` of a PyTorch install on
//! `LD_LIBRARY_PATH`).

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use super::Geometry;
use crate::core::flag::Flag;
use crate::core::tensor::host_zeros;
use crate::runtime::dylib::{self, Loaded};
use crate::runtime::threads::get_num_threads;
use crate::{DType, Device, Error, Result, Tensor};

/// NNPACK may be used where it is available.
pub static ENABLED: Flag<bool> = Flag::new("nnpack.enabled", true, None);

/// Whether NNPACK may be used.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// `struct nnp_size`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Size {
    width: usize,
    height: usize,
}

/// `struct nnp_padding`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Padding {
    top: usize,
    right: usize,
    bottom: usize,
    left: usize,
}

/// `nnp_convolution_algorithm_auto`: NNPACK picks Fourier or Winograd tiles by the sizes.
const ALGORITHM_AUTO: i32 = 0;
/// `nnp_convolution_transform_strategy_compute`: the kernel transformed in each call.
const TRANSFORM_COMPUTE: i32 = 1;
/// `nnp_activation_identity`.
const ACTIVATION_IDENTITY: i32 = 0;

/// `nnp_convolution_output`: a batch at unit stride.
type ConvolutionOutput = unsafe extern "C" fn(
    algorithm: i32,
    batch_size: usize,
    input_channels: usize,
    output_channels: usize,
    input_size: Size,
    input_padding: Padding,
    kernel_size: Size,
    input: *const f32,
    kernel: *const f32,
    bias: *const f32,
    output: *mut f32,
    workspace_buffer: *mut c_void,
    workspace_size: *mut usize,
    activation: i32,
    activation_parameters: *const c_void,
    threadpool: *mut c_void,
    profile: *mut c_void,
) -> i32;

/// `nnp_convolution_inference`: one image, with a stride (`output_subsampling`).
type ConvolutionInference = unsafe extern "C" fn(
    algorithm: i32,
    transform_strategy: i32,
    input_channels: usize,
    output_channels: usize,
    input_size: Size,
    input_padding: Padding,
    kernel_size: Size,
    output_subsampling: Size,
    input: *const f32,
    kernel: *const f32,
    bias: *const f32,
    output: *mut f32,
    workspace_buffer: *mut c_void,
    workspace_size: *mut usize,
    activation: i32,
    activation_parameters: *const c_void,
    threadpool: *mut c_void,
    profile: *mut c_void,
) -> i32;

/// `pthreadpool_create` and `pthreadpool_destroy`.
type PoolCreate = unsafe extern "C" fn(threads: usize) -> *mut c_void;
type PoolDestroy = unsafe extern "C" fn(pool: *mut c_void);

/// The initialised library's entry points.
struct Api {
    output: ConvolutionOutput,
    inference: ConvolutionInference,
    /// The thread pool NNPACK parallelises on, where the library exports one.
    pool: Option<(PoolCreate, PoolDestroy)>,
}

/// The loaded library, if one loads and exports NNPACK's API.
pub(crate) fn library() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| {
        ["nnpack", "torch_cpu"].into_iter().find_map(|stem| {
            let loaded = dylib::load(stem, &[])?;
            // SAFETY: only the symbol's presence is checked here.
            let exported = unsafe {
                loaded
                    .lib
                    .get::<unsafe extern "C" fn() -> i32>(b"nnp_initialize\0")
            }
            .is_ok();
            exported.then_some(loaded)
        })
    })
    .as_ref()
}

/// The entry points, once `nnp_initialize` succeeded on this CPU.
fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = &library()?.lib;
        // SAFETY: each symbol is NNPACK's (or pthreadpool's) C function of the declared
        // signature (`nnpack.h`, `pthreadpool.h`); the library stays loaded for the process.
        unsafe {
            let initialize = *lib
                .get::<unsafe extern "C" fn() -> i32>(b"nnp_initialize\0")
                .ok()?;
            // nnp_initialize() takes no arguments, returns 0 on success and may be called
            // more than once.
            if initialize() != 0 {
                return None;
            }
            let pool = lib
                .get::<PoolCreate>(b"pthreadpool_create\0")
                .ok()
                .zip(lib.get::<PoolDestroy>(b"pthreadpool_destroy\0").ok())
                .map(|(create, destroy)| (*create, *destroy));
            Some(Api {
                output: *lib
                    .get::<ConvolutionOutput>(b"nnp_convolution_output\0")
                    .ok()?,
                inference: *lib
                    .get::<ConvolutionInference>(b"nnp_convolution_inference\0")
                    .ok()?,
                pool,
            })
        }
    })
    .as_ref()
}

/// Whether NNPACK loads here and initialises on this CPU.
pub fn is_available() -> bool {
    api().is_some()
}

/// Why NNPACK does not take a convolution with `mkldnn.enabled` off, or `None` where it
/// does: PyTorch's rule (`use_nnpack`): the flag on, f32, no dilation, kernels up to 16×16,
/// padding less than the kernel, a batch of 16 or more; then NNPACK must load. Groups are
/// convolved one after another, as PyTorch does.
pub(super) fn refusal(g: &Geometry, dtype: DType) -> Option<&'static str> {
    Some(if !enabled() {
        "nnpack off (nnpack.flags)"
    } else if dtype != DType::F32 {
        "nnpack: f32 only"
    } else if g.dilation != [1, 1] {
        "nnpack: no dilation"
    } else if g.kernel.iter().any(|&k| k > 16) {
        "nnpack: kernels up to 16x16"
    } else if (0..2).any(|d| g.pad_before[d] >= g.kernel[d]) {
        "nnpack: padding must be less than the kernel"
    } else if g.batch < 16 {
        "nnpack: batches of 16 or more (PyTorch's rule)"
    } else if g.channels == 0 {
        "nnpack: no input channels"
    } else if !is_available() {
        "nnpack not loadable here (libnnpack.so, or PyTorch's libtorch_cpu.so, on \
         LD_LIBRARY_PATH)"
    } else {
        return None;
    })
}

/// A pthreadpool of NNPACK's library.
struct Pool(*mut c_void);

// SAFETY: a pthreadpool may be used from any thread; its calls serialise on its own lock,
// and this one is only reached under `POOL`'s mutex.
unsafe impl Send for Pool {}

/// Runs `body` with a thread pool of [`get_num_threads`] threads (null, NNPACK's "on the
/// calling thread", for one thread or where no pool can be made), created once per count.
fn with_pool<R>(api: &Api, body: impl FnOnce(*mut c_void) -> R) -> R {
    static POOL: Mutex<Option<(usize, Pool)>> = Mutex::new(None);
    let threads = get_num_threads();
    let Some((create, destroy)) = api.pool.filter(|_| threads > 1) else {
        return body(std::ptr::null_mut());
    };
    let mut kept = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if kept.as_ref().is_none_or(|(count, _)| *count != threads) {
        if let Some((_, old)) = kept.take() {
            // SAFETY: `old` came from `create` and no call uses it (the lock is held).
            unsafe { destroy(old.0) };
        }
        // SAFETY: pthreadpool_create takes a thread count and returns a pool or null.
        let pool = unsafe { create(threads) };
        if !pool.is_null() {
            *kept = Some((threads, Pool(pool)));
        }
    }
    body(
        kept.as_ref()
            .map_or(std::ptr::null_mut(), |(_, pool)| pool.0),
    )
}

/// `conv2d` of f32 CPU tensors through NNPACK (see [`refusal`]): one call for a batch of
/// one group at unit stride, otherwise one per image and group, as PyTorch makes them.
pub(super) fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
) -> Result<Tensor> {
    let api = api().ok_or_else(|| Error::Unavailable {
        what: "NNPACK",
        why: "it does not load here; put libnnpack.so or PyTorch's libtorch_cpu.so on \
              LD_LIBRARY_PATH"
            .into(),
    })?;
    let x = input.elements::<f32>()?;
    let w = weight.elements::<f32>()?;
    let (o, p) = (g.out_channels, g.pixels());
    let b = match bias {
        Some(bias) => bias.to_vec::<f32>()?,
        None => host_zeros::<f32>(super::OP, o)?,
    };
    let mut out = host_zeros::<f32>(super::OP, g.batch * o * p)?;
    let after = g.pad_after();
    let padding = Padding {
        top: g.pad_before[0],
        right: after[1],
        bottom: after[0],
        left: g.pad_before[1],
    };
    let size = |[height, width]: [usize; 2]| Size { width, height };
    let (input_size, kernel_size) = (size(g.input), size(g.kernel));
    let (cg, og) = (g.group_channels(), g.group_out_channels());
    let (image_len, group_len) = (
        g.channels * g.input[0] * g.input[1],
        cg * g.input[0] * g.input[1],
    );
    let weight_len = og * cg * g.kernel[0] * g.kernel[1];
    let status = with_pool(api, |pool| {
        let null = std::ptr::null_mut();
        if g.groups == 1 && g.stride == [1, 1] {
            // SAFETY: the slices hold what NNPACK reads and writes for these sizes: x is
            // [N, C, H, W], w [O, C, kH, kW], b [O], out [N, O, H', W'] (H', W' NNPACK's
            // output size for this padding, equal to g's); `refusal` checked its limits.
            return unsafe {
                (api.output)(
                    ALGORITHM_AUTO,
                    g.batch,
                    g.channels,
                    o,
                    input_size,
                    padding,
                    kernel_size,
                    x.as_ptr(),
                    w.as_ptr(),
                    b.as_ptr(),
                    out.as_mut_ptr(),
                    null,
                    std::ptr::null_mut(),
                    ACTIVATION_IDENTITY,
                    std::ptr::null(),
                    pool,
                    null,
                )
            };
        }
        for image in 0..g.batch {
            for group in 0..g.groups {
                // SAFETY: as above, per image and group: the group's [C/g, H, W] of the
                // image, its [O/g, C/g, kH, kW] weights and [O/g] biases, and its
                // [O/g, H', W'] of the output, each contiguous and inside its slice.
                let status = unsafe {
                    (api.inference)(
                        ALGORITHM_AUTO,
                        TRANSFORM_COMPUTE,
                        cg,
                        og,
                        input_size,
                        padding,
                        kernel_size,
                        size(g.stride),
                        x[image * image_len + group * group_len..].as_ptr(),
                        w[group * weight_len..].as_ptr(),
                        b[group * og..].as_ptr(),
                        out[(image * g.groups + group) * og * p..].as_mut_ptr(),
                        null,
                        std::ptr::null_mut(),
                        ACTIVATION_IDENTITY,
                        std::ptr::null(),
                        pool,
                        null,
                    )
                };
                if status != 0 {
                    return status;
                }
            }
        }
        0
    });
    if status != 0 {
        let what = match status {
            52 => "out of memory for its transforms",
            51 => "unsupported hardware",
            20..=28 => "unsupported sizes",
            _ => "invalid arguments",
        };
        return Err(Error::Unavailable {
            what: "NNPACK's convolution",
            why: format!(
                "NNPACK refused it ({what}: nnp_status {status}); turn NNPACK off with \
                 nnpack::flags(false) to convolve with the library's kernels"
            ),
        });
    }
    Tensor::from_vec(out, &[g.batch, o, g.output[0], g.output[1]], Device::Cpu)
}
