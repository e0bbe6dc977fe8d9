//! Device memory of CUDA tensors: byte buffers on the default stream of a device's primary
//! context, and the launch of generated kernels on that stream.

use cudarc::driver::{CudaSlice, CudaView, DriverError, sys::CUresult};

use super::device::CudaDevice;
use crate::{Device, Error, Result};

/// A CUDA allocation holding a tensor's elements.
pub(crate) struct CudaBuffer {
    ordinal: usize,
    /// Never empty: a zero-byte tensor holds one byte, as the driver allocates no zero bytes.
    bytes: CudaSlice<u8>,
    len: usize,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{} buffer of {} bytes", self.ordinal, self.len)
    }
}

/// A driver error as this crate's error: out of memory as [`Error::OutOfMemory`].
pub(crate) fn driver_error(
    call: &'static str,
    ordinal: usize,
    bytes: usize,
) -> impl Fn(DriverError) -> Error {
    move |e| {
        if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory {
                device: Device::Cuda(ordinal),
                bytes: bytes as u64,
                why: format!("{call}: {e:?}"),
            }
        } else {
            Error::Driver {
                call,
                detail: format!("{e:?}"),
            }
        }
    }
}

impl CudaBuffer {
    /// A copy of `bytes` on device `ordinal`.
    pub(crate) fn upload(ordinal: usize, bytes: &[u8]) -> Result<CudaBuffer> {
        let stream = CudaDevice::get(ordinal)?.stream();
        let data = if bytes.is_empty() { &[0u8][..] } else { bytes };
        let slice =
            stream
                .clone_htod(data)
                .map_err(driver_error("cuMemcpyHtoD", ordinal, bytes.len()))?;
        Ok(CudaBuffer {
            ordinal,
            bytes: slice,
            len: bytes.len(),
        })
    }

    /// `len` zero bytes on device `ordinal`.
    pub(crate) fn zeroed(ordinal: usize, len: usize) -> Result<CudaBuffer> {
        let stream = CudaDevice::get(ordinal)?.stream();
        let slice = stream.alloc_zeros::<u8>(len.max(1)).map_err(driver_error(
            "cuMemAlloc",
            ordinal,
            len,
        ))?;
        Ok(CudaBuffer {
            ordinal,
            bytes: slice,
            len,
        })
    }

    /// The bytes, copied to the host (waits for the kernels that write them).
    pub(crate) fn download(&self) -> Result<Vec<u8>> {
        let stream = CudaDevice::get(self.ordinal)?.stream();
        let mut out = stream.clone_dtoh(&self.bytes).map_err(driver_error(
            "cuMemcpyDtoH",
            self.ordinal,
            self.len,
        ))?;
        out.truncate(self.len);
        Ok(out)
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes from `offset` on, as a kernel argument.
    pub(crate) fn view(&self, offset: usize) -> CudaView<'_, u8> {
        self.bytes.slice(offset.min(self.len)..)
    }
}

impl crate::core::tensor::DeviceMemory for CudaBuffer {
    fn download(&self) -> Result<Vec<u8>> {
        CudaBuffer::download(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_allocation_is_a_typed_error() {
        if super::super::device_count() == 0 {
            // Without a device the context is what fails, with its reason.
            let err = CudaBuffer::zeroed(0, 16).unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
            return;
        }
        let err = CudaBuffer::zeroed(0, 1 << 50).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        assert!(err.to_string().contains("use smaller inputs"), "{err}");
    }
}
