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

/// A CUDA device: context, stream, loaded modules and per-device state.
pub(crate) struct CudaDevice {
    ordinal: usize,
    context: Arc<CudaContext>,
    modules: Mutex<HashMap<Family, Arc<CudaModule>>>,
    state: Mutex<HashMap<TypeId, &'static (dyn Any + Send + Sync)>>,
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
        let context = CudaContext::new(ordinal).map_err(|e| Error::Driver {
            call: "cuDevicePrimaryCtxRetain",
            detail: format!("{e:?}"),
        })?;
        // One per ordinal, for the process: leaking it gives every user a plain reference.
        let device: &'static CudaDevice = Box::leak(Box::new(CudaDevice {
            ordinal,
            context,
            modules: Mutex::default(),
            state: Mutex::default(),
        }));
        devices.insert(ordinal, device);
        Ok(device)
    }

    /// The default stream: every buffer and kernel of the device uses it, so operations are
    /// ordered without events.
    pub(crate) fn stream(&self) -> Arc<CudaStream> {
        self.context.default_stream()
    }

    /// Makes the device's context current on this thread, as the vendor libraries (cuBLAS,
    /// cuDNN, cuFFT), which run on the caller's context, need.
    pub(crate) fn bind(&self) -> Result<()> {
        self.context.bind_to_thread().map_err(|e| Error::Driver {
            call: "cuCtxSetCurrent",
            detail: format!("{e:?}"),
        })
    }

    /// The module of `family`, loaded on first use (see [`super::loader::load`]).
    pub(crate) fn module(&self, family: Family) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(&family) {
            return Ok(module.clone());
        }
        let module = super::loader::load(&self.context, self.ordinal, family)?;
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
