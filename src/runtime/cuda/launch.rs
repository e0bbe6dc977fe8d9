//! Launching generated kernels on a CUDA device: the kernel for a key (checked against the
//! device's compute capability), its arguments checked against the parameter list read
//! from its PTX before every launch, and the conversions of sizes into kernel arguments.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, CudaView, LaunchArgs, LaunchConfig, PushKernelArg};

use super::device::CudaDevice;
use crate::kernels::{self, KernelEntry, KernelKey, PtxParam};
use crate::{Error, Result};

/// A generated kernel ready to launch on device `ordinal`: its table entry, function and
/// parameter list (read from its PTX).
pub(crate) struct Kernel {
    /// The table entry (name, launch geometry).
    pub entry: &'static KernelEntry,
    function: CudaFunction,
    stream: Arc<CudaStream>,
    params: Vec<PtxParam>,
}

/// A kernel's arguments in order, each with its PTX type, so that [`Kernel::launch`] can
/// check them against the kernel's parameter list: a mismatch is an error, not a kernel
/// reading garbage.
pub(crate) struct Args<'a> {
    inner: LaunchArgs<'a>,
    kinds: Vec<PtxParam>,
}

impl<'a> Args<'a> {
    /// A device pointer (`T*`).
    pub(crate) fn ptr<'c: 'a>(&mut self, view: &'a CudaView<'c, u8>) -> &mut Self {
        self.inner.arg(view);
        self.kinds.push(PtxParam::B64);
        self
    }

    /// An `int`.
    pub(crate) fn int(&mut self, value: &'a i32) -> &mut Self {
        self.inner.arg(value);
        self.kinds.push(PtxParam::B32);
        self
    }

    /// A `long long`.
    pub(crate) fn long(&mut self, value: &'a i64) -> &mut Self {
        self.inner.arg(value);
        self.kinds.push(PtxParam::B64);
        self
    }

    /// An `unsigned long long`.
    pub(crate) fn ulong(&mut self, value: &'a u64) -> &mut Self {
        self.inner.arg(value);
        self.kinds.push(PtxParam::B64);
        self
    }

    /// A `float`.
    pub(crate) fn float(&mut self, value: &'a f32) -> &mut Self {
        self.inner.arg(value);
        self.kinds.push(PtxParam::F32);
        self
    }

    /// A `double`.
    pub(crate) fn double(&mut self, value: &'a f64) -> &mut Self {
        self.inner.arg(value);
        self.kinds.push(PtxParam::F64);
        self
    }
}

impl Kernel {
    /// The kernel serving `key` on device `ordinal`, checked against the device's compute
    /// capability.
    pub(crate) fn get(ordinal: usize, key: &KernelKey) -> Result<Kernel> {
        let entry = kernels::lookup(key).ok_or_else(|| Error::Unavailable {
            what: "a CUDA kernel",
            why: format!("no generated variant serves {key:?}"),
        })?;
        let cuda = entry.cuda.as_ref().ok_or_else(|| Error::Unavailable {
            what: "a CUDA kernel",
            why: format!("{} is built for wgpu only", entry.name),
        })?;
        let (major, minor) = super::get_device_capability(ordinal).unwrap_or((0, 0));
        if major * 10 + minor < cuda.min_sm {
            return Err(Error::Unavailable {
                what: "a CUDA kernel",
                why: format!(
                    "{} needs sm_{} or newer; cuda:{ordinal} is sm_{major}{minor}",
                    entry.name, cuda.min_sm
                ),
            });
        }
        let module = CudaDevice::get(ordinal)?.module(key.family())?;
        let ptx = kernels::ptx_for(key.family(), major * 10 + minor)?;
        let params = kernels::ptx_params(&ptx, entry.name).ok_or_else(|| Error::Driver {
            call: "reading the kernel's parameters",
            detail: format!(
                "the PTX of {} has no readable entry {}",
                key.family(),
                entry.name
            ),
        })?;
        let function = module
            .load_function(entry.name)
            .map_err(|e| Error::Driver {
                call: "cuModuleGetFunction",
                detail: format!("{}: {e:?}", entry.name),
            })?;
        Ok(Kernel {
            entry,
            function,
            stream: CudaDevice::get(ordinal)?.stream(),
            params,
        })
    }

    /// Threads per block, as the table declares them.
    pub(crate) fn threads(&self) -> (u32, u32, u32) {
        let [x, y, z] = self
            .entry
            .cuda
            .as_ref()
            .expect("a CUDA kernel has a CUDA build")
            .threads;
        (x, y, z)
    }

    /// An empty argument list for this kernel, to fill with `arg` (in the order of the
    /// kernel's parameters) and pass to [`Kernel::launch`].
    pub(crate) fn args(&self) -> Args<'_> {
        Args {
            inner: self.stream.launch_builder(&self.function),
            kinds: Vec::with_capacity(self.params.len()),
        }
    }

    /// Launches the kernel on `grid` blocks with `args`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list (its template's header comment) in
    /// number, order and type, and every buffer must be large enough for the indices the
    /// kernel forms from the sizes and strides passed.
    pub(crate) unsafe fn launch(&self, args: Args<'_>, grid: (u32, u32, u32)) -> Result<()> {
        if args.kinds != self.params {
            return Err(Error::Driver {
                call: "cuLaunchKernel",
                detail: format!(
                    "{} takes {:?} but the launch passes {:?} (a bug in this library: please report it)",
                    self.entry.name, self.params, args.kinds
                ),
            });
        }
        let mut args = args.inner;
        let config = LaunchConfig {
            grid_dim: grid,
            block_dim: self.threads(),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller guarantees the arguments (see above); the kernels use static
        // shared memory only, so the launch needs no dynamic shared memory.
        unsafe { args.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::Driver {
                call: "cuLaunchKernel",
                detail: format!("{}: {e:?}", self.entry.name),
            })
    }
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
