//! One CUDA device as one object: [`CudaDevice`] owns the device's primary context and
//! default stream, the kernel modules loaded on it (one per family, loaded on first use),
//! and the per-device state of the vendor libraries and ops (cuBLAS handles, cuDNN handle
//! and plans, ...), each created on first use and kept with the device.
//!
//! Every operation on a device goes through it: the driver today, and later an interpreter
//! that runs the same PTX on the CPU can stand behind the same methods (stream, module,
//! launch through [`super::launch::Kernel`]).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::{CudaContext, CudaModule, CudaStream};

use crate::kernels::{Family, ModuleImage};
use crate::{Error, Result};

/// A CUDA device: its backend, loaded modules and per-device state.
pub(crate) struct CudaDevice {
    ordinal: usize,
    backend: Backend,
    modules: Mutex<HashMap<Family, Arc<CudaModule>>>,
    state: Mutex<HashMap<TypeId, &'static (dyn Any + Send + Sync)>>,
}

/// What runs a device's work.
enum Backend {
    /// The CUDA driver: the device's primary context.
    Driver(Arc<CudaContext>),
    /// The PTX interpreter.
    Interpreter(Interpreter),
}

/// The interpreted device: its global memory and the modules parsed for it.
pub(crate) struct Interpreter {
    /// Global memory (allocations at distinct addresses).
    pub(crate) memory: Mutex<backends_ptx::Memory>,
    modules: Mutex<HashMap<Family, Arc<backends_ptx::Module>>>,
}

impl Interpreter {
    /// The module of `family`, parsed on first use from the PTX for the device's arch.
    pub(crate) fn module(&self, family: Family, sm: u32) -> Result<Arc<backends_ptx::Module>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(&family) {
            return Ok(module.clone());
        }
        let ptx = crate::kernels::ptx_for(family, sm)?;
        let module = Arc::new(backends_ptx::parse::parse(&ptx).map_err(|e| Error::Driver {
            call: "the PTX interpreter's parser",
            detail: e.to_string(),
        })?);
        modules.insert(family, module.clone());
        Ok(module)
    }
}

impl CudaDevice {
    /// Device `ordinal`, opened (its primary context retained) on first use and kept for
    /// the life of the process; an ordinal past the device count is an error.
    pub(crate) fn get(ordinal: usize) -> Result<&'static CudaDevice> {
        static DEVICES: LazyLock<Mutex<HashMap<usize, &'static CudaDevice>>> =
            LazyLock::new(Default::default);
        if ordinal >= super::device_count() {
            return Err(Error::Unavailable {
                what: "CUDA device",
                why: format!(
                    "there is no cuda:{ordinal} ({} device(s); {})",
                    super::device_count(),
                    super::unavailable_reason().unwrap_or("pick a lower ordinal")
                ),
            });
        }
        let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(device) = devices.get(&ordinal) {
            return Ok(device);
        }
        let backend = if super::is_interpreted() {
            Backend::Interpreter(Interpreter {
                memory: Mutex::default(),
                modules: Mutex::default(),
            })
        } else {
            Backend::Driver(CudaContext::new(ordinal).map_err(|e| Error::Driver {
                call: "cuDevicePrimaryCtxRetain",
                detail: format!("{e:?}"),
            })?)
        };
        // One per ordinal, for the process: leaking it gives every user a plain reference.
        let device: &'static CudaDevice = Box::leak(Box::new(CudaDevice {
            ordinal,
            backend,
            modules: Mutex::default(),
            state: Mutex::default(),
        }));
        devices.insert(ordinal, device);
        Ok(device)
    }

    /// The interpreter, where this device is the interpreted one.
    pub(crate) fn interpreter(&self) -> Option<&Interpreter> {
        match &self.backend {
            Backend::Interpreter(interpreter) => Some(interpreter),
            Backend::Driver(_) => None,
        }
    }

    /// The driver context, or why there is none (the interpreted device).
    fn context(&self) -> Result<&Arc<CudaContext>> {
        match &self.backend {
            Backend::Driver(context) => Ok(context),
            Backend::Interpreter(_) => Err(Error::Unavailable {
                what: "the CUDA driver",
                why: format!(
                    "cuda:{} is the PTX interpreter ({}=1): vendor libraries (cuBLAS, cuDNN, \
                     cuFFT) and driver streams do not run on it",
                    self.ordinal,
                    super::INTERPRET_ENV
                ),
            }),
        }
    }

    /// The default stream: every buffer and kernel of the device uses it, so operations are
    /// ordered without events (the driver's only).
    pub(crate) fn stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.context()?.default_stream())
    }

    /// Makes the device's context current on this thread, as the vendor libraries (cuBLAS,
    /// cuDNN, cuFFT), which run on the caller's context, need (the driver's only).
    pub(crate) fn bind(&self) -> Result<()> {
        self.context()?.bind_to_thread().map_err(|e| Error::Driver {
            call: "cuCtxSetCurrent",
            detail: format!("{e:?}"),
        })
    }

    /// Waits for every kernel and copy queued on the device (at once on the interpreter,
    /// which runs each launch to its end).
    pub(crate) fn synchronize(&self) -> Result<()> {
        match &self.backend {
            Backend::Interpreter(_) => Ok(()),
            Backend::Driver(context) => {
                context
                    .default_stream()
                    .synchronize()
                    .map_err(|e| Error::Driver {
                        call: "cuStreamSynchronize",
                        detail: format!("{e:?}"),
                    })
            }
        }
    }

    /// The driver module of `family`, loaded on first use: the image
    /// [`crate::kernels::image_for`] picks (cubin, PTX once the driver is known to accept
    /// its ISA version, or NVRTC's PTX).
    pub(crate) fn module(&self, family: Family) -> Result<Arc<CudaModule>> {
        let context = self.context()?;
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(&family) {
            return Ok(module.clone());
        }
        let image = crate::kernels::image_for(family, self.sm())?;
        crate::core::verbose::creation_event(|| {
            format!("load module {family} on cuda:{} ({image})", self.ordinal)
        });
        let code = match image {
            ModuleImage::Cubin { bytes, .. } => cudarc::nvrtc::Ptx::from_binary(bytes.to_vec()),
            ModuleImage::Ptx { text, .. } => {
                if let Some(driver) = super::driver_version() {
                    super::loader::check_ptx_version(&text, driver)?;
                }
                cudarc::nvrtc::Ptx::from_src(text.into_owned())
            }
        };
        let module = context.load_module(code).map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            detail: format!("{e:?}"),
        })?;
        modules.insert(family, module.clone());
        Ok(module)
    }

    /// The compute capability as one number (90 for sm_90).
    fn sm(&self) -> u32 {
        let (major, minor) = super::get_device_capability(self.ordinal).unwrap_or((0, 0));
        major * 10 + minor
    }

    /// Loads (or parses, on the interpreter) every module the device can run and resolves
    /// each kernel in it; how many resolved (see [`super::loader::check_modules`]).
    pub(crate) fn check_modules(&self) -> Result<usize> {
        let sm = self.sm();
        let mut resolved = 0;
        for family in Family::ALL {
            let names: Vec<&str> = crate::kernels::ENTRIES
                .iter()
                .filter(|e| e.key.family() == family)
                .filter(|e| e.runs_on_sm(sm))
                .map(|e| e.name)
                .collect();
            if names.is_empty() {
                continue;
            }
            let missing = |name: &str, why: String| Error::Driver {
                call: "resolving a kernel",
                detail: format!("{name} in the {family} module for sm_{sm}: {why}"),
            };
            match self.interpreter() {
                Some(interpreter) => {
                    let module = interpreter.module(family, sm)?;
                    for name in names {
                        module
                            .kernel(name)
                            .ok_or_else(|| missing(name, "not in the PTX".into()))?;
                        resolved += 1;
                    }
                }
                None => {
                    let module = self.module(family)?;
                    for name in names {
                        module
                            .load_function(name)
                            .map_err(|e| missing(name, format!("{e:?}")))?;
                        resolved += 1;
                    }
                }
            }
        }
        Ok(resolved)
    }

    /// The device's state of type `T` (an op's or a vendor library's: its handles, its
    /// plans), created with `T::default()` on first use and kept with the device.
    pub(crate) fn state<T: Default + Send + Sync + 'static>(&self) -> &'static T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let value: &'static (dyn Any + Send + Sync) = *state
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::leak(Box::new(T::default())));
        value
            .downcast_ref::<T>()
            .expect("the state of a type is stored under that type's id")
    }
}
