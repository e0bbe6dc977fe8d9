//! Conversions between a half type (f16, bf16) and f32 on the devices, by the generated
//! `convert` kernels (rounded to nearest even, as PyTorch rounds).
//!
//! bf16 tensors on wgpu: WGSL has no bf16 type, so the ops that take a bf16 wgpu tensor
//! widen its buffer to f32 on the device, compute in f32 and round the result back to bf16.
//! The values are those of the f32 computation on bf16 inputs, as PyTorch's bf16 kernels
//! accumulate in f32. Math attention on wgpu and CUDA converts its half-type inputs to f32
//! and its result back the same way ([`to_f32`], [`from_f32`]).

use crate::core::tensor::Storage;
use crate::core::trace::{self, Call};
use crate::kernels::{ConvertKey, Elem, KernelKey};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, long_arg};
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

/// Whether `device` (wgpu or CUDA) converts `dtype` (f16 or bf16) to and from f32 itself: a
/// CUDA device older than the conversion kernels' compute capability does not (bf16's need
/// sm_80).
pub(crate) fn converts_on(device: Device, dtype: DType) -> bool {
    let Device::Cuda(ordinal) = device else {
        return true;
    };
    let Some(elem) = dtype.elem() else {
        return false;
    };
    let (major, minor) = crate::runtime::cuda::get_device_capability(ordinal).unwrap_or((0, 0));
    let key = KernelKey::Convert(ConvertKey {
        from: elem,
        to: Elem::F32,
    });
    crate::kernels::lookup(&key).is_some_and(|entry| entry.runs_on_sm(major * 10 + minor))
}

/// `t` (f16 or bf16, on wgpu or CUDA) as a contiguous f32 tensor, converted on its device.
pub(crate) fn to_f32(op: &'static str, t: &Tensor) -> Result<Tensor> {
    on_device(op, t, DType::F32)
}

/// `t` (f32, on wgpu or CUDA) rounded to `dtype` (f16 or bf16) on its device, contiguous.
pub(crate) fn from_f32(op: &'static str, t: &Tensor, dtype: DType) -> Result<Tensor> {
    on_device(op, t, dtype)
}

/// `t` converted to `dtype` on its device (one of the two a half type, the other f32).
fn on_device(op: &'static str, t: &Tensor, dtype: DType) -> Result<Tensor> {
    let t = t.contiguous()?;
    let elem = |d: DType| d.elem().expect("a half type or f32");
    let (from, to) = (elem(t.dtype()), elem(dtype));
    let (n, bytes) = (t.numel(), t.numel() * dtype.size());
    let memory: Box<dyn crate::core::tensor::DeviceMemory> = match t.device() {
        Device::Wgpu(index) => {
            let source = t.wgpu_buffer().expect("a wgpu tensor has a buffer");
            Box::new(convert(
                op,
                index,
                (from, to),
                source,
                (t.offset(), n),
                bytes,
            )?)
        }
        Device::Cuda(ordinal) => Box::new(cuda_convert(op, ordinal, (from, to), &t, bytes)?),
        Device::Cpu => unreachable!("host tensors convert on the host"),
    };
    Ok(Tensor::from_storage(
        Storage::Device(memory),
        dtype,
        t.device(),
        t.shape(),
    ))
}

/// The conversion `from -> to` of the contiguous CUDA tensor `t` into a new buffer of
/// `bytes` bytes on device `ordinal`.
fn cuda_convert(
    op: &'static str,
    ordinal: usize,
    (from, to): (Elem, Elem),
    t: &Tensor,
    bytes: usize,
) -> Result<CudaBuffer> {
    let out = CudaBuffer::zeroed(ordinal, bytes)?;
    let n = t.numel();
    if n == 0 {
        return Ok(out);
    }
    let kernel = Kernel::get(ordinal, &KernelKey::Convert(ConvertKey { from, to }))?;
    let source = t
        .cuda_buffer()
        .expect("a CUDA tensor has a buffer")
        .view(t.offset() * t.dtype().size());
    let (target, count) = (out.view(0), long_arg(n));
    let mut args = kernel.args();
    args.ptr(&source).ptr(&target).long(&count);
    // SAFETY: the arguments follow convert.cu's parameter list; `t` holds `n` contiguous
    // elements from its offset and the output `n` of the target type.
    unsafe { kernel.launch(args, (grid_dim(op, n.div_ceil(256))?, 1, 1)) }?;
    Ok(out)
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
        .expect("the half-type conversions are declared");
    let kernel = entry.wgsl.as_ref().expect("a conversion has WGSL");
    let invocations = if to == Elem::F32 { n } else { n.div_ceil(2) };
    let groups = folded_groups(op, invocations.div_ceil(256))?;
    let params = [u32_arg(op, n)?, groups[0], u32_arg(op, offset)?, 0];
    let describe = || Call {
        kernel: entry.name.into(),
        backend: format!("wgpu:{index}"),
        dtype: DType::from(from),
        shapes: format!("[{n}] for {op}"),
        precision: match to {
            Elem::F32 => format!("{} -> f32, exact", from.name()),
            _ => format!("f32 -> {}, rounded to nearest even", to.name()),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 values whose rounding to the half types is easy to get wrong: ties to even, the
    /// largest finite values and what overflows them, subnormals and what underflows, signed
    /// zeros, infinities; then random ones.
    fn hard_values() -> Vec<f32> {
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.5,
            1.0 + 2f32.powi(-11),       // f16 tie, to even (1.0)
            1.0 + 3.0 * 2f32.powi(-11), // f16 tie, to even (up)
            1.0 + 2f32.powi(-8),        // bf16 tie
            65504.0,
            65519.99,
            65520.0, // rounds to f16 infinity
            -70000.0,
            2f32.powi(-14),                  // smallest normal f16
            2f32.powi(-14) - 2f32.powi(-25), // a subnormal tie
            2f32.powi(-24),                  // smallest subnormal f16
            2f32.powi(-25),                  // its half: ties to 0
            1.5 * 2f32.powi(-25),            // rounds up to the smallest
            3.0 * 2f32.powi(-26),
            1e-30,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let mut state = 0x2545_f491u32;
        for _ in 0..1000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            // Exponents from 2^-30 to 2^20, both signs.
            let exponent = (state % 51) as i32 - 30;
            values.push(
                (state as f32 / u32::MAX as f32 + 0.5)
                    * 2f32.powi(exponent)
                    * if state & 1 == 0 { 1.0 } else { -1.0 },
            );
        }
        values
    }

    /// `from_f32` and `to_f32` on `device` against the host's rounding, bit for bit.
    fn check_round_trips(device: Device) {
        let values = hard_values();
        let t = Tensor::from_vec(values.clone(), &[values.len()], device).unwrap();
        for dtype in [DType::F16, DType::Bf16] {
            let narrowed = from_f32("test", &t, dtype).unwrap();
            assert_eq!((narrowed.dtype(), narrowed.device()), (dtype, device));
            let host = |x: f32| match dtype {
                DType::F16 => half::f16::from_f32(x).to_f32(),
                _ => half::bf16::from_f32(x).to_f32(),
            };
            let widened = to_f32("test", &narrowed).unwrap().to_vec::<f32>().unwrap();
            for (x, got) in values.iter().zip(widened) {
                assert_eq!(
                    got.to_bits(),
                    host(*x).to_bits(),
                    "{dtype} {x:e} on {device}"
                );
            }
            let nan = Tensor::from_vec(vec![f32::NAN], &[1], device).unwrap();
            let back = to_f32("test", &from_f32("test", &nan, dtype).unwrap()).unwrap();
            assert!(back.to_vec::<f32>().unwrap()[0].is_nan(), "{dtype} NaN");
        }
    }

    #[test]
    fn wgpu_conversions_round_as_the_host() {
        if crate::adapters::list().is_empty() {
            eprintln!("skipped: no wgpu adapter");
            return;
        }
        check_round_trips(Device::Wgpu(0));
    }

    /// On the PTX interpreter (in a child process where `cuda:0` is the interpreter).
    #[test]
    fn cuda_conversions_round_as_the_host() {
        let name = "ops::convert::tests::cuda_conversions_round_as_the_host";
        if !crate::runtime::cuda::in_interpreter_child(name) {
            return;
        }
        if crate::kernels::cuda_code() == crate::kernels::CudaCode::None {
            eprintln!("skipped: no CUDA kernels in this build");
            return;
        }
        check_round_trips(Device::Cuda(0));
    }
}
