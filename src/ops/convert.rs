//! bf16 tensors on wgpu: WGSL has no bf16 type, so the ops that take a bf16 wgpu tensor
//! widen its buffer to f32 on the device (the generated `convert` kernels), compute in f32
//! and round the result back to bf16 (to nearest even, as PyTorch rounds). The values are
//! those of the f32 computation on bf16 inputs, as PyTorch's bf16 kernels accumulate in f32.

use crate::core::tensor::Storage;
use crate::core::trace::{self, Call};
use crate::kernels::{ConvertKey, Elem, KernelKey};
use crate::runtime::wgpu::{WgpuBuffer, folded_groups, u32_arg};
use crate::{DType, Device, Result, Tensor};

/// Whether `t` is a bf16 tensor on a wgpu adapter (computed in f32 there).
pub(crate) fn is_wgpu_bf16(t: &Tensor) -> bool {
    t.dtype() == DType::Bf16 && matches!(t.device(), Device::Wgpu(_))
}

/// `t` (bf16 on wgpu) as f32 with the same layout: its whole buffer widened on the device,
/// so that the view's shape, strides and offset index the f32 copy as they did the bf16
/// elements.
pub(crate) fn widened(op: &'static str, t: &Tensor) -> Result<Tensor> {
    let Device::Wgpu(index) = t.device() else {
        unreachable!("only wgpu tensors are widened")
    };
    let source = t.wgpu_buffer().expect("a wgpu tensor has a buffer");
    let n = source.len() / 2;
    let out = convert(op, index, (Elem::Bf16, Elem::F32), source, (0, n), n * 4)?;
    let whole = Tensor::from_storage(Storage::Device(Box::new(out)), DType::F32, t.device(), &[n]);
    Ok(whole.with_layout(t.shape().to_vec(), t.strides().to_vec(), t.offset()))
}

/// `t` (f32 on wgpu) rounded to bf16, contiguous.
pub(crate) fn narrowed(op: &'static str, t: &Tensor) -> Result<Tensor> {
    let Device::Wgpu(index) = t.device() else {
        unreachable!("only wgpu tensors are narrowed")
    };
    let t = t.contiguous()?;
    let source = t.wgpu_buffer().expect("a wgpu tensor has a buffer");
    let n = t.numel();
    let out = convert(
        op,
        index,
        (Elem::F32, Elem::Bf16),
        source,
        (t.offset(), n),
        n * 2,
    )?;
    Ok(Tensor::from_storage(
        Storage::Device(Box::new(out)),
        DType::Bf16,
        t.device(),
        t.shape(),
    ))
}

/// Runs the conversion `from -> to` of `n` elements of `source` from element `offset` into
/// a new buffer of `bytes` bytes on adapter `index`.
fn convert(
    op: &'static str,
    index: usize,
    (from, to): (Elem, Elem),
    source: &WgpuBuffer,
    (offset, n): (usize, usize),
    bytes: usize,
) -> Result<WgpuBuffer> {
    let gpu = crate::runtime::wgpu::gpu(index)?;
    let out = WgpuBuffer::output(gpu, bytes)?;
    if n == 0 {
        return Ok(out);
    }
    let entry = crate::kernels::lookup(&KernelKey::Convert(ConvertKey { from, to }))
        .expect("the bf16 conversions are declared");
    let kernel = entry.wgsl.as_ref().expect("a conversion has WGSL");
    let invocations = if to == Elem::Bf16 { n.div_ceil(2) } else { n };
    let groups = folded_groups(op, invocations.div_ceil(256))?;
    let params = [u32_arg(op, n)?, groups[0], u32_arg(op, offset)?, 0];
    let describe = || Call {
        kernel: entry.name.into(),
        backend: format!("wgpu:{index}"),
        dtype: if from == Elem::Bf16 {
            DType::Bf16
        } else {
            DType::F32
        },
        shapes: format!("[{n}] for {op}"),
        precision: "WGSL has no bf16: computed in f32, rounded to nearest even".into(),
    };
    trace::kernel(describe, || {
        gpu.run(
            entry.name,
            kernel,
            &[source.raw(), out.raw()],
            &params,
            groups,
        )
    })?;
    Ok(out)
}
