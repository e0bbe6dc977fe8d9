//! candle's CUDA tensors in this library's ops (the `candle-cuda` feature): the inputs are
//! read in place (candle's `CudaSlice` memory lent to this library's CUDA tensors, with
//! candle's layout), the result is one device copy into new memory of candle's.
//!
//! candle queues its work on a stream of its own and this library on the device's default
//! stream, both in the device's primary context: this library's stream waits for the work
//! queued on candle's before the op, and candle's for the op's copy after it.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{CudaDevice, CudaStorage, Layout, Shape};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, DriverError};

use crate::runtime::cuda::device::CudaDevice as Ours;
use crate::runtime::cuda::memory::{CudaBuffer, lent_tensor};
use crate::{DType, Error, Tensor};

/// Lends candle's CUDA storages to this library as tensors, on one device, for one op.
pub(super) struct Lender {
    ordinal: usize,
    stream: Arc<CudaStream>,
}

impl Lender {
    /// A tensor of this library over `storage` seen through `layout`, read in place.
    pub(super) fn lend(&self, storage: &CudaStorage, layout: &Layout) -> crate::Result<Tensor> {
        let ordinal = ordinal(&storage.device);
        if ordinal != self.ordinal {
            return Err(Error::DeviceMismatch {
                op: "candle",
                a: crate::Device::Cuda(self.ordinal),
                b: crate::Device::Cuda(ordinal),
            });
        }
        let (address, elements, dtype) = match &storage.slice {
            CudaStorageSlice::F32(s) => (self.address(s), s.len(), DType::F32),
            CudaStorageSlice::F64(s) => (self.address(s), s.len(), DType::F64),
            CudaStorageSlice::F16(s) => (self.address(s), s.len(), DType::F16),
            CudaStorageSlice::BF16(s) => (self.address(s), s.len(), DType::Bf16),
            CudaStorageSlice::I32(s) => (self.address(s), s.len(), DType::I32),
            _ => {
                return Err(Error::Unavailable {
                    what: "this candle dtype",
                    why: format!(
                        "{:?} has no counterpart here; convert it to f32, f64, f16 or bf16 first",
                        storage.dtype()
                    ),
                });
            }
        };
        // SAFETY: candle keeps the storage allocated for the op (the caller holds it), and
        // nothing writes it while the op's work, which candle's stream waits for, runs.
        unsafe {
            lent_tensor(
                self.ordinal,
                dtype,
                (address, elements),
                layout.dims(),
                layout.stride(),
                layout.start_offset(),
            )
        }
    }

    /// As [`Lender::lend`], for a tensor that may sit off the device (an attention mask,
    /// which candle does not check against the op's device): there it is an error.
    pub(super) fn lend_any(
        &self,
        storage: &candle_core::Storage,
        layout: &Layout,
    ) -> crate::Result<Tensor> {
        match storage {
            candle_core::Storage::Cuda(storage) => self.lend(storage, layout),
            // CPU storage (candle's Metal storage is not built with these features).
            _ => Err(Error::DeviceMismatch {
                op: "candle",
                a: crate::Device::Cuda(self.ordinal),
                b: crate::Device::Cpu,
            }),
        }
    }

    /// The device address of `slice`, read on this library's stream.
    fn address<T>(&self, slice: &CudaSlice<T>) -> u64 {
        // The guard records the read on the slice's event (where candle tracks events);
        // candle's stream also waits for the whole op (see [`run`]).
        let (address, _read) = slice.device_ptr(&self.stream);
        address
    }
}

/// The ordinal of candle's device.
fn ordinal(device: &CudaDevice) -> usize {
    device.cuda_stream().context().ordinal()
}

/// Runs `body` on candle's device `device` with a [`Lender`] of candle's storages, and
/// hands its result (a CUDA tensor of this library) to candle as new storage.
pub(super) fn run(
    device: &CudaDevice,
    body: impl FnOnce(&Lender) -> crate::Result<Tensor>,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let theirs = device.cuda_stream();
    let ordinal = ordinal(device);
    let wrap = |e: Error| candle_core::Error::wrap(e);
    let wait = |result: Result<(), DriverError>| {
        result.map_err(|e| {
            wrap(Error::Driver {
                call: "cuStreamWaitEvent",
                detail: format!("{e:?}"),
            })
        })
    };
    let ours = Ours::get(ordinal).and_then(|d| d.stream()).map_err(wrap)?;
    wait(ours.join(&theirs))?;
    let out = body(&Lender {
        ordinal,
        stream: ours.clone(),
    })
    .map_err(wrap)?;
    let shape = Shape::from_dims(out.shape());
    let out = out.contiguous().map_err(wrap)?;
    let buffer = out.device_memory::<CudaBuffer>().ok_or_else(|| {
        wrap(Error::DeviceMismatch {
            op: "candle",
            a: crate::Device::Cuda(ordinal),
            b: out.device(),
        })
    })?;
    let bytes = buffer
        .driver_view(out.offset() * out.dtype().size())
        .map_err(wrap)?;
    wait(theirs.join(&ours))?;
    let numel = out.numel();
    let slice = match out.dtype() {
        DType::F32 => CudaStorageSlice::F32(copy(&theirs, &bytes, numel)?),
        DType::F64 => CudaStorageSlice::F64(copy(&theirs, &bytes, numel)?),
        DType::F16 => CudaStorageSlice::F16(copy(&theirs, &bytes, numel)?),
        DType::Bf16 => CudaStorageSlice::BF16(copy(&theirs, &bytes, numel)?),
        DType::I32 => CudaStorageSlice::I32(copy(&theirs, &bytes, numel)?),
        DType::Bool => CudaStorageSlice::U8(copy(&theirs, &bytes, numel)?),
    };
    // This library's buffer is freed on its stream: after candle's copy of it.
    wait(ours.join(&theirs))?;
    Ok((
        CudaStorage {
            slice,
            device: device.clone(),
        },
        shape,
    ))
}

/// `len` elements of `T` from `bytes`, copied into new memory on `stream`.
fn copy<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    bytes: &CudaView<'_, u8>,
    len: usize,
) -> candle_core::Result<CudaSlice<T>> {
    // SAFETY: the bytes hold `len` elements of `T` (the tensor's dtype) from their start.
    let elements = unsafe { bytes.transmute::<T>(len) }
        .ok_or_else(|| candle_core::Error::Msg("backends: a short output buffer".into()))?;
    stream
        .clone_dtod(&elements)
        .map_err(candle_core::Error::wrap)
}
