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

use crate::kernels::Family;
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
        let backend = if super::driver::state().interpreted {
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
                    super::driver::INTERPRET_ENV
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

    /// The driver module of `family`, loaded on first use (see [`super::loader::load`]).
    pub(crate) fn module(&self, family: Family) -> Result<Arc<CudaModule>> {
        let context = self.context()?;
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(&family) {
            return Ok(module.clone());
        }
        let module = super::loader::load(context, self.ordinal, family)?;
        modules.insert(family, module.clone());
        Ok(module)
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
