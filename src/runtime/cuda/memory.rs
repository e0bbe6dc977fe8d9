//! Device memory of CUDA tensors: byte buffers on the default stream of a device's primary
//! context, and the launch of generated kernels on that stream.

use cudarc::driver::{CudaSlice, CudaView, DriverError, sys::CUresult};

use super::device::CudaDevice;
use crate::{Device, Error, Result};

/// A CUDA allocation holding a tensor's elements.
pub(crate) struct CudaBuffer {
    ordinal: usize,
    memory: Memory,
    len: usize,
}

/// Where a buffer's bytes are.
enum Memory {
    /// Driver memory. Never empty: a zero-byte tensor holds one byte, as the driver
    /// allocates no zero bytes.
    Driver(CudaSlice<u8>),
    /// Driver memory another owner lends for the length of one op (candle's tensors):
    /// read and written in place, never freed here.
    #[cfg(feature = "candle-cuda")]
    Lent(CudaSlice<u8>),
    /// The interpreter's global memory, at this address.
    Interpreted(u64),
}

/// A buffer from a byte offset on, as a kernel argument.
pub(crate) enum View<'a> {
    /// Driver memory.
    Driver(CudaView<'a, u8>),
    /// The interpreter's memory: the address.
    Interpreted(u64),
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
        let device = CudaDevice::get(ordinal)?;
        let memory = match device.interpreter() {
            Some(interpreter) => Memory::Interpreted(
                interpreter
                    .memory
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .upload(bytes),
            ),
            None => {
                let data = if bytes.is_empty() { &[0u8][..] } else { bytes };
                Memory::Driver(device.stream()?.clone_htod(data).map_err(driver_error(
                    "cuMemcpyHtoD",
                    ordinal,
                    bytes.len(),
                ))?)
            }
        };
        Ok(CudaBuffer {
            ordinal,
            memory,
            len: bytes.len(),
        })
    }

    /// The `len` bytes at `address` on device `ordinal`, lent by their owner (driver memory
    /// of candle's tensors; an address of the interpreter's memory).
    ///
    /// # Safety
    /// The bytes must stay allocated until the work queued on the buffer has run, and
    /// nothing else may write them meanwhile.
    #[cfg(any(test, feature = "candle-cuda"))]
    pub(crate) unsafe fn lent(ordinal: usize, address: u64, len: usize) -> Result<CudaBuffer> {
        let device = CudaDevice::get(ordinal)?;
        let memory = match device.interpreter() {
            Some(_) => Memory::Interpreted(address),
            // SAFETY: the caller keeps the bytes allocated while the buffer is used; the
            // slice is leaked, never freed, when the buffer drops.
            #[cfg(feature = "candle-cuda")]
            None => Memory::Lent(unsafe { device.stream()?.upgrade_device_ptr(address, len) }),
            #[cfg(not(feature = "candle-cuda"))]
            None => {
                return Err(Error::Unavailable {
                    what: "lent driver memory",
                    why: "only candle's CUDA tensors lend it (the `candle-cuda` feature)".into(),
                });
            }
        };
        Ok(CudaBuffer {
            ordinal,
            memory,
            len,
        })
    }

    /// `len` zero bytes on device `ordinal`.
    pub(crate) fn zeroed(ordinal: usize, len: usize) -> Result<CudaBuffer> {
        let device = CudaDevice::get(ordinal)?;
        if device.interpreter().is_some() {
            let zeros =
                crate::core::tensor::host_zeros::<u8>("cuda (interpreted)", len).map_err(|_| {
                    Error::OutOfMemory {
                        device: Device::Cuda(ordinal),
                        bytes: len as u64,
                        why: "the PTX interpreter's memory is the host's".into(),
                    }
                })?;
            return CudaBuffer::upload(ordinal, &zeros);
        }
        let slice = device
            .stream()?
            .alloc_zeros::<u8>(len.max(1))
            .map_err(driver_error("cuMemAlloc", ordinal, len))?;
        Ok(CudaBuffer {
            ordinal,
            memory: Memory::Driver(slice),
            len,
        })
    }

    /// A copy of `len` bytes from `offset` on the device (driver memory: what a vendor
    /// library factors in place; the interpreted device has none, which the error says).
    pub(crate) fn duplicate(&self, offset: usize, len: usize) -> Result<CudaBuffer> {
        let view = self.driver_view(offset)?;
        let source = view.slice(..len.min(view.len()));
        let copy = CudaDevice::get(self.ordinal)?
            .stream()?
            .clone_dtod(&source)
            .map_err(driver_error("cuMemcpyDtoD", self.ordinal, len))?;
        Ok(CudaBuffer {
            ordinal: self.ordinal,
            memory: Memory::Driver(copy),
            len,
        })
    }

    /// The bytes, copied to the host (waits for the kernels that write them).
    pub(crate) fn download(&self) -> Result<Vec<u8>> {
        let device = CudaDevice::get(self.ordinal)?;
        match (&self.memory, device.interpreter()) {
            (Memory::Interpreted(address), Some(interpreter)) => Ok(interpreter
                .memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .download(*address, self.len)
                .expect("a live buffer's bytes")
                .to_vec()),
            (_, None) => {
                let bytes = self.driver_view(0)?;
                let mut out = device.stream()?.clone_dtoh(&bytes).map_err(driver_error(
                    "cuMemcpyDtoH",
                    self.ordinal,
                    self.len,
                ))?;
                out.truncate(self.len);
                Ok(out)
            }
            _ => unreachable!("a buffer lives on its device's backend"),
        }
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes from `offset` on, as a generated kernel's argument.
    pub(crate) fn view(&self, offset: usize) -> View<'_> {
        let offset = offset.min(self.len);
        match &self.memory {
            Memory::Driver(bytes) => View::Driver(bytes.slice(offset..)),
            #[cfg(feature = "candle-cuda")]
            Memory::Lent(bytes) => View::Driver(bytes.slice(offset..)),
            Memory::Interpreted(address) => View::Interpreted(address + offset as u64),
        }
    }

    /// The bytes from `offset` on, as driver memory for a vendor library, or why there is
    /// none (the interpreted device).
    pub(crate) fn driver_view(&self, offset: usize) -> Result<CudaView<'_, u8>> {
        match &self.memory {
            Memory::Driver(bytes) => Ok(bytes.slice(offset.min(self.len)..)),
            #[cfg(feature = "candle-cuda")]
            Memory::Lent(bytes) => Ok(bytes.slice(offset.min(self.len)..)),
            Memory::Interpreted(_) => Err(Error::Unavailable {
                what: "driver memory",
                why: format!(
                    "cuda:{} is the PTX interpreter: vendor libraries do not run on it",
                    self.ordinal
                ),
            }),
        }
    }
}

/// A CUDA tensor of `dtype` over the `elements` elements at `address` on device `ordinal`,
/// lent by their owner (as [`CudaBuffer::lent`]), seen with `shape`, `strides` and `offset`
/// (in elements), which must reach only those elements.
///
/// # Safety
/// As for [`CudaBuffer::lent`]: the elements stay allocated, and written by nothing else,
/// until the work queued on the tensor and its views has run.
#[cfg(any(test, feature = "candle-cuda"))]
pub(crate) unsafe fn lent_tensor(
    ordinal: usize,
    dtype: crate::DType,
    (address, elements): (u64, usize),
    shape: &[usize],
    strides: &[usize],
    offset: usize,
) -> Result<crate::Tensor> {
    use crate::core::tensor::{Storage, Tensor};
    crate::core::borrow::check_layout(
        "lent device memory",
        elements,
        shape,
        strides,
        offset,
        dtype,
    )?;
    // SAFETY: as the caller promises.
    let buffer = unsafe { CudaBuffer::lent(ordinal, address, elements * dtype.size())? };
    let storage = Storage::Device(Box::new(buffer));
    Ok(
        Tensor::from_storage(storage, dtype, Device::Cuda(ordinal), &[]).with_layout(
            shape.to_vec(),
            strides.to_vec(),
            offset,
        ),
    )
}

/// Lent memory goes back to its owner untouched: its slice is leaked, not freed.
#[cfg(feature = "candle-cuda")]
impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if matches!(self.memory, Memory::Lent(_))
            && let Memory::Lent(bytes) = std::mem::replace(&mut self.memory, Memory::Interpreted(0))
        {
            bytes.leak();
        }
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
