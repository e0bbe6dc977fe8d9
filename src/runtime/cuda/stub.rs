//! `runtime::cuda` in builds without the `cuda` feature: the device, driver, memory and
//! launch API of the real files over types that have no values. The one way in, opening a
//! device ([`device::CudaDevice::get`], which every buffer and kernel goes through), fails
//! with the reason, so the ops' CUDA paths compile unchanged and end there; the methods on
//! the value-less types are never reached (`match` on an empty type).

use crate::Error;

/// Why nothing CUDA runs in this build.
const WHY: &str = "this build has no CUDA support: build with the `cuda` feature";

/// Why `cuda:{ordinal}` cannot be used.
fn unbuilt(ordinal: usize) -> Error {
    Error::Unavailable {
        what: "CUDA",
        why: format!("cuda:{ordinal} is out of reach: {WHY}"),
    }
}

/// The driver's report in this build: no devices, and why.
pub(crate) mod driver {
    use super::super::DriverState;

    /// No driver is probed: the state says why.
    pub(crate) fn probe() -> DriverState {
        DriverState {
            problem: Some(super::WHY.into()),
            ..DriverState::default()
        }
    }
}

/// The device object, which cannot be opened in this build.
pub(crate) mod device {
    use crate::Result;

    /// A CUDA device (none exists in this build).
    pub(crate) enum CudaDevice {}

    impl CudaDevice {
        /// Fails: this build has no CUDA.
        pub(crate) fn get(ordinal: usize) -> Result<&'static CudaDevice> {
            Err(super::unbuilt(ordinal))
        }

        /// Never reached (no device exists).
        pub(crate) fn synchronize(&self) -> Result<()> {
            match *self {}
        }

        /// Never reached (no device exists).
        pub(crate) fn check_modules(&self) -> Result<usize> {
            match *self {}
        }

        /// Never reached (no device exists).
        pub(crate) fn state<T: Default + Send + Sync + 'static>(&self) -> &'static T {
            match *self {}
        }
    }
}

/// Device memory, which cannot be allocated in this build.
pub(crate) mod memory {
    use std::convert::Infallible;
    use std::marker::PhantomData;

    use crate::Result;

    /// A CUDA allocation (none exists in this build).
    pub(crate) enum CudaBuffer {}

    /// A buffer from an offset on (none exists in this build).
    pub(crate) struct View<'a>(Infallible, PhantomData<&'a ()>);

    impl CudaBuffer {
        /// Fails: this build has no CUDA.
        pub(crate) fn upload(ordinal: usize, _bytes: &[u8]) -> Result<CudaBuffer> {
            Err(super::unbuilt(ordinal))
        }

        /// Fails: this build has no CUDA.
        pub(crate) fn zeroed(ordinal: usize, _len: usize) -> Result<CudaBuffer> {
            Err(super::unbuilt(ordinal))
        }

        /// Never reached (no buffer exists).
        pub(crate) fn view(&self, _offset: usize) -> View<'_> {
            match *self {}
        }
    }

    impl std::fmt::Debug for CudaBuffer {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match *self {}
        }
    }

    impl crate::core::tensor::DeviceMemory for CudaBuffer {
        fn download(&self) -> Result<Vec<u8>> {
            match *self {}
        }

        fn as_any(&self) -> &dyn std::any::Any {
            match *self {}
        }
    }
}

/// Kernel launches, which cannot happen in this build.
pub(crate) mod launch {
    use std::convert::Infallible;
    use std::marker::PhantomData;

    use super::memory::View;
    use crate::Result;
    use crate::kernels::{KernelEntry, KernelKey};

    /// A kernel ready to launch (none exists in this build).
    pub(crate) struct Kernel {
        /// The table entry.
        pub entry: &'static KernelEntry,
        never: Infallible,
    }

    /// A kernel's arguments (none exist in this build).
    pub(crate) struct Args<'a>(Infallible, PhantomData<&'a ()>);

    impl Kernel {
        /// Fails: this build has no CUDA.
        pub(crate) fn get(ordinal: usize, _key: &KernelKey) -> Result<Kernel> {
            Err(super::unbuilt(ordinal))
        }

        /// Never reached (no kernel exists).
        pub(crate) fn args(&self) -> Args<'_> {
            match self.never {}
        }

        /// Never reached (no kernel exists).
        ///
        /// # Safety
        /// As the real launch's: arguments that match the kernel's parameters.
        pub(crate) unsafe fn launch(&self, _args: Args<'_>, _grid: (u32, u32, u32)) -> Result<()> {
            match self.never {}
        }
    }

    impl<'a> Args<'a> {
        /// Never reached (no argument list exists).
        pub(crate) fn ptr<'c: 'a>(&mut self, _view: &'a View<'c>) -> &mut Self {
            match self.0 {}
        }

        /// Never reached (no argument list exists).
        pub(crate) fn int(&mut self, _value: &'a i32) -> &mut Self {
            match self.0 {}
        }

        /// Never reached (no argument list exists).
        pub(crate) fn long(&mut self, _value: &'a i64) -> &mut Self {
            match self.0 {}
        }

        /// Never reached (no argument list exists).
        pub(crate) fn ulong(&mut self, _value: &'a u64) -> &mut Self {
            match self.0 {}
        }

        /// Never reached (no argument list exists).
        pub(crate) fn float(&mut self, _value: &'a f32) -> &mut Self {
            match self.0 {}
        }

        /// Never reached (no argument list exists).
        pub(crate) fn double(&mut self, _value: &'a f64) -> &mut Self {
            match self.0 {}
        }
    }
}
