//! `runtime::wgpu` in builds without the `wgpu` feature: the device and buffer API of the
//! real files over types that have no values. The ways in, opening a device
//! ([`device::gpu`]) and uploading a buffer, fail with the reason, so the ops' wgpu paths
//! compile unchanged and end there; the methods on the value-less types are never reached
//! (`match` on an empty type).

use crate::Error;

/// Why `wgpu:{index}` cannot be used.
fn unbuilt(index: usize) -> Error {
    Error::Unavailable {
        what: "wgpu",
        why: format!("wgpu:{index} is out of reach: {}", super::UNBUILT),
    }
}

/// The opened device, which cannot be opened in this build.
pub(super) mod device {
    use std::convert::Infallible;

    use crate::Result;
    use crate::kernels::WgslKernel;

    /// An opened wgpu device (none exists in this build).
    pub(crate) enum Gpu {}

    /// Fails: this build has no wgpu.
    pub(crate) fn gpu(index: usize) -> Result<&'static Gpu> {
        Err(super::unbuilt(index))
    }

    impl Gpu {
        /// Never reached (no device exists).
        pub(crate) fn max_workgroups(&self) -> u32 {
            match *self {}
        }

        /// Never reached (no device exists).
        pub(crate) fn run(
            &self,
            _name: &'static str,
            _kernel: &WgslKernel,
            _buffers: &[&Infallible],
            _params: &[u32],
            _workgroups: [u32; 3],
        ) -> Result<()> {
            match *self {}
        }
    }
}

/// Device buffers, which cannot be made in this build.
pub(super) mod buffer {
    use std::convert::Infallible;

    use super::device::Gpu;
    use crate::{DType, Result};

    /// A device buffer (none exists in this build).
    #[derive(Debug)]
    pub(crate) enum WgpuBuffer {}

    impl WgpuBuffer {
        /// Fails: this build has no wgpu.
        pub(crate) fn upload(index: usize, _dtype: DType, _bytes: &[u8]) -> Result<WgpuBuffer> {
            Err(super::unbuilt(index))
        }

        /// Never reached (no device exists).
        pub(crate) fn output(gpu: &Gpu, _len: usize) -> Result<WgpuBuffer> {
            match *gpu {}
        }

        /// Never reached (no device exists).
        pub(crate) fn zeroed(gpu: &Gpu, _len: usize) -> Result<WgpuBuffer> {
            match *gpu {}
        }

        /// Never reached (no buffer exists).
        pub(crate) fn len(&self) -> usize {
            match *self {}
        }

        /// Never reached (no buffer exists).
        pub(crate) fn raw(&self) -> &Infallible {
            match *self {}
        }
    }

    impl crate::core::tensor::DeviceMemory for WgpuBuffer {
        fn download(&self) -> Result<Vec<u8>> {
            match *self {}
        }

        fn as_any(&self) -> &dyn std::any::Any {
            match *self {}
        }
    }
}
