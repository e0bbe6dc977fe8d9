//! Launching generated kernels on a CUDA device: the kernel for a key (checked against the
//! device's compute capability), its arguments checked against the parameter list read
//! from its PTX before every launch, and the conversions of sizes into kernel arguments.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::{CudaFunction, CudaStream, LaunchArgs, LaunchConfig, PushKernelArg};

use super::device::CudaDevice;
use super::memory::View;
use crate::kernels::{self, KernelEntry, KernelKey, PtxParam};
use crate::{Error, Result};

/// A generated kernel ready to launch on device `ordinal`: its table entry, the code that
/// runs it and its parameter list (read from its PTX).
pub(crate) struct Kernel {
    /// The table entry (name, launch geometry).
    pub entry: &'static KernelEntry,
    code: Code,
    params: Vec<PtxParam>,
}

/// What runs a kernel: a driver function on a stream, or the interpreter's parsed module.
enum Code {
    Driver(CudaFunction, Arc<CudaStream>),
    Interpreted(&'static CudaDevice, Arc<backends_ptx::Module>),
}

/// A kernel's arguments in order, each with its PTX type, so that [`Kernel::launch`] can
/// check them against the kernel's parameter list: a mismatch is an error, not a kernel
/// reading garbage.
pub(crate) struct Args<'a> {
    values: Values<'a>,
    kinds: Vec<PtxParam>,
}

/// The arguments as the backend takes them: the driver's builder, or their bytes.
enum Values<'a> {
    Driver(LaunchArgs<'a>),
    Interpreted(Vec<Vec<u8>>),
}

impl<'a> Args<'a> {
    fn push<T: cudarc::driver::DeviceRepr>(
        &mut self,
        value: &'a T,
        bytes: Vec<u8>,
        kind: PtxParam,
    ) {
        match &mut self.values {
            Values::Driver(args) => {
                args.arg(value);
            }
            Values::Interpreted(list) => list.push(bytes),
        }
        self.kinds.push(kind);
    }

    /// A device pointer (`T*`).
    pub(crate) fn ptr<'c: 'a>(&mut self, view: &'a View<'c>) -> &mut Self {
        match (view, &mut self.values) {
            (View::Driver(view), Values::Driver(args)) => {
                args.arg(view);
            }
            (View::Interpreted(address), Values::Interpreted(list)) => {
                list.push(address.to_le_bytes().to_vec());
            }
            // A view of the other backend's memory: caught by the kinds check below.
            _ => return self,
        }
        self.kinds.push(PtxParam::B64);
        self
    }

    /// An `int`.
    pub(crate) fn int(&mut self, value: &'a i32) -> &mut Self {
        self.push(value, value.to_le_bytes().to_vec(), PtxParam::B32);
        self
    }

    /// A `long long`.
    pub(crate) fn long(&mut self, value: &'a i64) -> &mut Self {
        self.push(value, value.to_le_bytes().to_vec(), PtxParam::B64);
        self
    }

    /// An `unsigned long long`.
    pub(crate) fn ulong(&mut self, value: &'a u64) -> &mut Self {
        self.push(value, value.to_le_bytes().to_vec(), PtxParam::B64);
        self
    }

    /// A `float`.
    pub(crate) fn float(&mut self, value: &'a f32) -> &mut Self {
        self.push(value, value.to_le_bytes().to_vec(), PtxParam::F32);
        self
    }

    /// A `double`.
    pub(crate) fn double(&mut self, value: &'a f64) -> &mut Self {
        self.push(value, value.to_le_bytes().to_vec(), PtxParam::F64);
        self
    }
}

/// The parameter list of `entry` in the PTX for `sm`, read from the text once per kernel
/// and architecture (a family's PTX runs to megabytes: scanning it on every launch cost
/// more than a decoding step).
fn params_of(entry: &'static KernelEntry, sm: u32) -> Result<Vec<PtxParam>> {
    type Cache = Mutex<HashMap<(&'static str, u32), Vec<PtxParam>>>;
    static PARAMS: LazyLock<Cache> = LazyLock::new(Default::default);
    if let Some(params) = PARAMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(entry.name, sm))
    {
        return Ok(params.clone());
    }
    let family = entry.key.family();
    let ptx = kernels::ptx_for(family, sm)?;
    let params = kernels::ptx_params(&ptx, entry.name).ok_or_else(|| Error::Driver {
        call: "reading the kernel's parameters",
        detail: format!("the PTX of {family} has no readable entry {}", entry.name),
    })?;
    PARAMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((entry.name, sm), params.clone());
    Ok(params)
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
        let device = CudaDevice::get(ordinal)?;
        let params = params_of(entry, major * 10 + minor)?;
        let code = match device.interpreter() {
            Some(interpreter) => Code::Interpreted(
                device,
                interpreter.module(key.family(), major * 10 + minor)?,
            ),
            None => {
                let function = device
                    .module(key.family())?
                    .load_function(entry.name)
                    .map_err(|e| Error::Driver {
                        call: "cuModuleGetFunction",
                        detail: format!("{}: {e:?}", entry.name),
                    })?;
                Code::Driver(function, device.stream()?)
            }
        };
        Ok(Kernel {
            entry,
            code,
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
            values: match &self.code {
                Code::Driver(function, stream) => Values::Driver(stream.launch_builder(function)),
                Code::Interpreted(..) => Values::Interpreted(Vec::new()),
            },
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
        let (x, y, z) = self.threads();
        match (args.values, &self.code) {
            (Values::Driver(mut args), Code::Driver(..)) => {
                let config = LaunchConfig {
                    grid_dim: grid,
                    block_dim: (x, y, z),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the caller guarantees the arguments (see above); the kernels use
                // static shared memory only, so the launch needs no dynamic shared memory.
                unsafe { args.launch(config) }
                    .map(|_| ())
                    .map_err(|e| Error::Driver {
                        call: "cuLaunchKernel",
                        detail: format!("{}: {e:?}", self.entry.name),
                    })
            }
            (Values::Interpreted(params), Code::Interpreted(device, module)) => {
                let kernel = module
                    .kernel(self.entry.name)
                    .ok_or_else(|| Error::Driver {
                        call: "the PTX interpreter",
                        detail: format!("the PTX has no entry {}", self.entry.name),
                    })?;
                let counters = std::env::var_os(super::INTERPRET_STATS_ENV).is_some();
                let launch = backends_ptx::Launch {
                    grid: [grid.0, grid.1, grid.2],
                    block: [x, y, z],
                    params,
                    counters,
                };
                let interpreter = device.interpreter().expect("an interpreted device");
                let mut memory = interpreter.memory.lock().unwrap_or_else(|p| p.into_inner());
                let stats =
                    backends_ptx::run(kernel, &launch, &mut memory).map_err(|e| Error::Driver {
                        call: "the PTX interpreter",
                        detail: format!("{}: {e}", self.entry.name),
                    })?;
                if counters {
                    eprintln!(
                        "backends_ptx,{},grid {:?},block {:?},{stats}",
                        self.entry.name, launch.grid, launch.block
                    );
                }
                Ok(())
            }
            _ => unreachable!("arguments are built by the kernel's own `args`"),
        }
    }
}
