//! Copies of views on their device: [`Tensor::contiguous`] and [`Tensor::reshape`] (a view
//! where the strides allow one). On CUDA (2-, 4- and 8-byte elements) and wgpu (4-byte
//! elements) the generated strided-copy kernel gathers the view into a fresh buffer on the
//! device; on the CPU, and for what those kernels do not move (booleans; 2-byte elements on
//! wgpu; views of more than 8 dimensions that do not merge), the copy runs on the host in
//! the tensor's dtype.

use crate::core::tensor::{Storage, checked_numel, coalesced};
use crate::core::trace::{self, Call};
use crate::core::view::view_strides;
use crate::kernels::{Elem, KernelKey, StridedCopyKey};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::long_arg;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::wgpu::WgpuBuffer;
use crate::{DType, Device, Error, Result, Tensor};

/// Dimensions the kernels walk.
const RANK: usize = 8;

impl Tensor {
    /// The same elements laid out row-major: this view where it already is, else one copy on
    /// the tensor's device (see the module docs for where that copy runs).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        match self.device() {
            Device::Cpu => self.to_device(Device::Cpu),
            device => {
                let describe = |how: &str| {
                    let how = how.to_string();
                    move || Call {
                        kernel: "strided_copy".into(),
                        backend: device.to_string(),
                        dtype: self.dtype(),
                        shapes: format!("{:?} strides {:?}", self.shape(), self.strides()),
                        precision: how,
                    }
                };
                match trace::kernel(describe("on the device"), || on_device(self))? {
                    Some(copy) => Ok(copy),
                    None => trace::kernel(describe("through the host"), || self.to_device(device)),
                }
            }
        }
    }

    /// The same elements as `shape` (same element count), as PyTorch's `reshape`: a view
    /// where the strides allow one ([`Tensor::view`]), else a view of a contiguous copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let count = checked_numel("reshape", shape, self.dtype())?;
        if count != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                detail: format!(
                    "shape {shape:?} has {count} elements; the tensor {:?} has {}",
                    self.shape(),
                    self.numel()
                ),
            });
        }
        match view_strides(self.shape(), self.strides(), shape) {
            Some(_) => self.view(shape),
            None => self.contiguous()?.view(shape),
        }
    }
}

/// The element type whose size the kernels copy for `dtype`, if they copy it.
fn word(dtype: DType) -> Option<Elem> {
    match dtype {
        DType::F16 | DType::Bf16 => Some(Elem::F16),
        // 4-byte words: an i32 moves as an f32's bits do.
        DType::F32 | DType::I32 => Some(Elem::F32),
        DType::F64 => Some(Elem::F64),
        DType::Bool => None,
    }
}

/// A device tensor's view gathered into a fresh buffer by the strided-copy kernel, or `None`
/// where no kernel moves it (the caller copies through the host).
fn on_device(t: &Tensor) -> Result<Option<Tensor>> {
    let Some(elem) = word(t.dtype()) else {
        return Ok(None);
    };
    let (sizes, strides) = coalesced(t.shape(), t.strides());
    if sizes.len() > RANK {
        return Ok(None);
    }
    // Leading dimensions of size 1 (stride 0) pad the view to RANK.
    let pad = RANK - sizes.len();
    let shape: Vec<usize> = std::iter::repeat_n(1, pad).chain(sizes).collect();
    let steps: Vec<usize> = std::iter::repeat_n(0, pad).chain(strides).collect();
    let n = t.numel();
    let bytes = n * t.dtype().size();
    let key = KernelKey::StridedCopy(StridedCopyKey { elem });
    let storage = match t.device() {
        Device::Cuda(ordinal) => {
            let kernel = Kernel::get(ordinal, &key)?;
            let out = CudaBuffer::zeroed(ordinal, bytes)?;
            let src = t.cuda_buffer().expect("a CUDA tensor has a buffer").view(0);
            let dst = out.view(0);
            let (count, offset) = (long_arg(n), long_arg(t.offset()));
            let sizes = shape.iter().map(|&x| long_arg(x)).collect::<Vec<_>>();
            let steps = steps.iter().map(|&x| long_arg(x)).collect::<Vec<_>>();
            let mut args = kernel.args();
            args.ptr(&src).ptr(&dst).long(&count).long(&offset);
            for x in sizes.iter().chain(&steps) {
                args.long(x);
            }
            let grid = (
                crate::runtime::cuda::grid_dim("contiguous", n.div_ceil(256))?,
                1,
                1,
            );
            // SAFETY: the arguments follow strided_copy.cu's parameter list; the view's
            // elements (offset, sizes, strides) lie in the source buffer, and the output
            // holds n elements.
            unsafe { kernel.launch(args, grid) }?;
            Storage::Device(Box::new(out))
        }
        Device::Wgpu(index) => {
            let entry = crate::kernels::lookup(&key).expect("the strided copies are declared");
            let Some(kernel) = entry.wgsl.as_ref() else {
                return Ok(None);
            };
            let word = |x: usize| u32::try_from(x).ok();
            let Ok(dispatch) = crate::runtime::wgpu::folded_groups("contiguous", n.div_ceil(256))
            else {
                return Ok(None);
            };
            let mut words = Vec::with_capacity(4 + 2 * RANK);
            for x in [n, t.offset(), dispatch[0] as usize, 0]
                .into_iter()
                .chain(shape)
                .chain(steps)
            {
                let Some(w) = word(x) else { return Ok(None) };
                words.push(w);
            }
            let gpu = crate::runtime::wgpu::gpu(index)?;
            let out = WgpuBuffer::output(gpu, bytes)?;
            let params: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let src = t.wgpu_buffer().expect("a wgpu tensor has a buffer");
            if n > 0 {
                gpu.run(
                    entry.name,
                    kernel,
                    &[src.raw(), out.raw()],
                    &params,
                    dispatch,
                )?;
            }
            Storage::Device(Box::new(out))
        }
        Device::Cpu => unreachable!("the CPU copies on the host"),
    };
    Ok(Some(Tensor::from_storage(
        storage,
        t.dtype(),
        t.device(),
        t.shape(),
    )))
}
