//! Tensors in and out of memory: the constructors that place a tensor's elements on a
//! device, and the copies between devices (core's [`Tensor`] only reads device memory back).

use half::{bf16, f16};

use crate::core::tensor::{
    CpuData, DeviceMemory, Element, HostMemory, Storage, checked_numel, host_filled, host_zeros,
};
use crate::{DType, Device, Error, Result, Tensor};

/// Device memory holding `bytes` of `dtype` for `device`, or host memory for the CPU
/// (`host` builds it from the typed values).
fn upload(
    device: Device,
    dtype: DType,
    bytes: &[u8],
    host: impl FnOnce() -> CpuData,
) -> Result<Storage> {
    let memory: Box<dyn DeviceMemory> = match device {
        Device::Cpu => return Ok(Storage::Host(HostMemory::owned(host()))),
        Device::Wgpu(index) => Box::new(crate::runtime::wgpu::WgpuBuffer::upload(
            index, dtype, bytes,
        )?),
        Device::Cuda(ordinal) => Box::new(crate::runtime::cuda::memory::CudaBuffer::upload(
            ordinal, bytes,
        )?),
    };
    Ok(Storage::Device(memory))
}

impl Tensor {
    /// A contiguous tensor of `shape` holding `data` (row-major) on `device`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        let numel = checked_numel("from_vec", shape, T::DTYPE)?;
        if data.len() != numel {
            return Err(Error::ShapeMismatch {
                op: "from_vec",
                detail: format!(
                    "{} elements cannot fill shape {shape:?} ({numel} elements)",
                    data.len()
                ),
            });
        }
        let bytes: Vec<u8> = match device {
            Device::Cpu => Vec::new(),
            _ => bytemuck::cast_slice(&data).to_vec(),
        };
        let storage = upload(device, T::DTYPE, &bytes, || T::wrap(data))?;
        Ok(Tensor::from_storage(storage, T::DTYPE, device, shape))
    }

    /// A boolean tensor (an attention mask: `true` takes part) of `shape` on `device`.
    pub fn from_bools(values: &[bool], shape: &[usize], device: Device) -> Result<Tensor> {
        let numel = checked_numel("from_bools", shape, DType::Bool)?;
        if values.len() != numel {
            return Err(Error::ShapeMismatch {
                op: "from_bools",
                detail: format!(
                    "{} elements cannot fill shape {shape:?} ({numel} elements)",
                    values.len()
                ),
            });
        }
        let bytes: Vec<u8> = values.iter().map(|&b| u8::from(b)).collect();
        let storage = upload(device, DType::Bool, &bytes.clone(), || CpuData::Bool(bytes))?;
        Ok(Tensor::from_storage(storage, DType::Bool, device, shape))
    }

    /// A tensor of `shape` on `device` whose every element is `value` ([`Error::OutOfMemory`]
    /// where it does not fit).
    pub fn full<T: Element>(value: T, shape: &[usize], device: Device) -> Result<Tensor> {
        let numel = checked_numel("full", shape, T::DTYPE)?;
        Tensor::from_vec(host_filled("full", numel, value)?, shape, device)
    }

    /// A tensor of `dtype` on `device` from f64 values in row-major order (rounded to
    /// nearest; `Bool` is true where a value is non-zero).
    pub fn from_f64(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        fn convert<T: Element>(values: &[f64], shape: &[usize], device: Device) -> Result<Tensor> {
            let mut data = host_zeros::<T>("from_f64", values.len())?;
            for (d, &x) in data.iter_mut().zip(values) {
                *d = T::from_f64(x);
            }
            Tensor::from_vec(data, shape, device)
        }
        match dtype {
            DType::F32 => convert::<f32>(values, shape, device),
            DType::F64 => convert::<f64>(values, shape, device),
            DType::F16 => convert::<f16>(values, shape, device),
            DType::Bf16 => convert::<bf16>(values, shape, device),
            DType::I32 => convert::<i32>(values, shape, device),
            DType::Bool => {
                let bools: Vec<bool> = values.iter().map(|&x| x != 0.0).collect();
                Tensor::from_bools(&bools, shape, device)
            }
        }
    }

    /// A contiguous copy on `device`.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        macro_rules! copy {
            ($t:ty) => {
                Tensor::from_vec(self.to_vec::<$t>()?, self.shape(), device)
            };
        }
        match self.dtype() {
            DType::F32 => copy!(f32),
            DType::F64 => copy!(f64),
            DType::F16 => copy!(f16),
            DType::Bf16 => copy!(bf16),
            DType::I32 => copy!(i32),
            DType::Bool => Tensor::from_bools(&self.to_bools()?, self.shape(), device),
        }
    }

    /// The device buffer of a wgpu tensor.
    pub(crate) fn wgpu_buffer(&self) -> Option<&crate::runtime::wgpu::WgpuBuffer> {
        self.device_memory()
    }

    /// The device buffer of a CUDA tensor.
    pub(crate) fn cuda_buffer(&self) -> Option<&crate::runtime::cuda::memory::CudaBuffer> {
        self.device_memory()
    }
}
