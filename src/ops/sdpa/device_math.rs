//! Math attention on wgpu and CUDA, on the device: the scores as one batched GEMM, the
//! generated masked-softmax kernel (scale, causal, mask, and on CUDA dropout), and the
//! weighted sum as another GEMM, in f32. Grouped-query attention needs no copy: the query
//! heads that share a key/value head are one GEMM batch entry (`[B·Hk, G·Lq, D]`).
//!
//! The GEMMs are the library's [`matmul`], so they follow the fp32 precision flags as
//! PyTorch's math path does. f16 and bf16 inputs are converted to f32 on the device and the
//! result rounded back, as PyTorch's math path upcasts them (unless
//! `allow_fp16_bf16_reduction_math_sdp` asks for half-type intermediates). f64, the half
//! types under that flag, and dropout on wgpu (WGSL has no 64-bit integers for the shared
//! dropout draw) run the reference on the host ([`serves`] says which).

use super::{Job, band_args, broadcast_strides};
use crate::core::generator::Draw;
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{Elem, KernelKey, MaskKind, MaskedSoftmaxKey};
use crate::ops::matmul::matmul;
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg, long_arg};
use crate::runtime::wgpu::{WgpuBuffer, u32_arg};
use crate::{DType, Device, Result};

const OP: &str = "math attention on the device";

/// Why the device cannot run this call's math attention itself, or `None` where it can.
pub(super) fn serves(job: &Job) -> Option<&'static str> {
    match job.query.dtype() {
        DType::F32 => {}
        DType::F16 | DType::Bf16
            if !crate::ops::sdpa::flags::fp16_bf16_reduction_math_sdp_allowed() => {}
        DType::F16 | DType::Bf16 => {
            return Some(
                "allow_fp16_bf16_reduction_math_sdp rounds the scores and weights to the half \
                 type, and the device kernels keep them in f32",
            );
        }
        _ => return Some("its kernels compute in f32; f64 runs on the host"),
    }
    let device = job.query.device();
    let unconverted = [Some(job.query), job.options.attn_mask]
        .into_iter()
        .flatten()
        .map(Tensor::dtype)
        .any(|d| {
            matches!(d, DType::F16 | DType::Bf16) && !crate::ops::convert::converts_on(device, d)
        });
    if unconverted {
        return Some("its bf16 conversion kernels need sm_80 or newer");
    }
    if job.options.dropout_p > 0.0 && matches!(job.query.device(), Device::Wgpu(_)) {
        return Some("WGSL has no 64-bit integers for the dropout draw");
    }
    None
}

/// Math attention of an f32, f16 or bf16 job on its device, computed in f32.
pub(super) fn attention(job: &Job) -> Result<Tensor> {
    let s = &job.shape;
    let group = s.h / s.hk;
    let dtype = job.query.dtype();
    // Half-type inputs (and additive masks) are read as f32, converted on the device.
    let in_f32 = |t: &Tensor| match t.dtype() {
        DType::F16 | DType::Bf16 => crate::ops::convert::to_f32(OP, t),
        DType::F32 => Ok(t.clone()),
        _ => Tensor::from_f64(&t.to_f64()?, t.shape(), DType::F32, t.device()),
    };
    // [B, H, Lq, D] as [B·Hk, G·Lq, D]: the heads of one K/V head are consecutive.
    let q = in_f32(job.query)?.reshape(&[s.b * s.hk, group * s.lq, s.d])?;
    let k = in_f32(job.key)?.reshape(&[s.b * s.hk, s.lk, s.d])?;
    let v = in_f32(job.value)?.reshape(&[s.b * s.hk, s.lk, s.dv])?;
    let scores = matmul(&q, &k.t()?)?;
    let converted;
    let mask = match job.options.attn_mask {
        Some(m) if m.dtype().is_float() && m.dtype() != DType::F32 => {
            converted = in_f32(m)?;
            Some(&converted)
        }
        other => other,
    };
    let weights = match job.query.device() {
        Device::Wgpu(index) => wgpu_softmax(index, &scores, mask, job)?,
        Device::Cuda(ordinal) => cuda_softmax(ordinal, &scores, mask, job)?,
        Device::Cpu => unreachable!("the CPU runs its own math path"),
    };
    let out = matmul(&weights, &v)?.view(&job.out_shape)?;
    match dtype {
        DType::F32 => Ok(out),
        _ => crate::ops::convert::from_f32(OP, &out, dtype),
    }
}

/// The mask's kind, its element strides over `[B, H, Lq, Lk]` and its offset.
fn mask_layout(mask: Option<&Tensor>) -> (MaskKind, [usize; 4], usize) {
    match mask {
        None => (MaskKind::None, [0; 4], 0),
        Some(m) => {
            let kind = if m.dtype() == DType::Bool {
                MaskKind::Bool
            } else {
                MaskKind::Additive
            };
            (kind, broadcast_strides(m.shape(), m.strides()), m.offset())
        }
    }
}

fn key(kind: MaskKind) -> KernelKey {
    KernelKey::MaskedSoftmax(MaskedSoftmaxKey {
        elem: Elem::F32,
        mask: kind,
    })
}

fn wgpu_softmax(index: usize, scores: &Tensor, mask: Option<&Tensor>, job: &Job) -> Result<Tensor> {
    let gpu = crate::runtime::wgpu::gpu(index)?;
    let s = &job.shape;
    let (kind, strides, offset) = mask_layout(mask);
    let entry =
        crate::kernels::lookup(&key(kind)).expect("the masked softmax variants are declared");
    let kernel = entry
        .wgsl
        .as_ref()
        .expect("the masked softmax variants have WGSL");
    let rows = s.b * s.h * s.lq;
    let out = WgpuBuffer::output(gpu, rows * s.lk * 4)?;
    if rows > 0 && s.lk > 0 {
        let word = |x: usize| u32_arg(OP, x);
        let dispatch = crate::runtime::wgpu::folded_groups(OP, rows)?;
        let mut words = [rows, s.h, s.lq, s.lk]
            .map(word)
            .into_iter()
            .collect::<Result<Vec<u32>>>()?;
        words.push((job.scale as f32).to_bits());
        let [band, lo, hi, lower_right] = band_args(OP, job)?;
        words.push(band.cast_unsigned());
        for x in [dispatch[0] as usize, offset].into_iter().chain(strides) {
            words.push(word(x)?);
        }
        words.extend([lo, hi, lower_right].map(i32::cast_unsigned));
        // The last scores element must be addressable too.
        word(rows * s.lk)?;
        let dummy;
        let mask_buffer = match mask {
            Some(m) => m.wgpu_buffer().expect("a wgpu mask has a buffer").raw(),
            None => {
                dummy = WgpuBuffer::zeroed(gpu, 4)?;
                dummy.raw()
            }
        };
        let scores_buffer = scores.wgpu_buffer().expect("a wgpu tensor has a buffer");
        gpu.run(
            entry.name,
            kernel,
            &[scores_buffer.raw(), mask_buffer, out.raw()],
            &words,
            dispatch,
        )?;
    }
    Ok(Tensor::from_storage(
        Storage::Device(Box::new(out)),
        DType::F32,
        Device::Wgpu(index),
        scores.shape(),
    ))
}

fn cuda_softmax(
    ordinal: usize,
    scores: &Tensor,
    mask: Option<&Tensor>,
    job: &Job,
) -> Result<Tensor> {
    let s = &job.shape;
    let (kind, strides, offset) = mask_layout(mask);
    let kernel = Kernel::get(ordinal, &key(kind))?;
    let rows = s.b * s.h * s.lq;
    let out = CudaBuffer::zeroed(ordinal, rows * s.lk * 4)?;
    if rows > 0 && s.lk > 0 {
        let scores_view = scores
            .cuda_buffer()
            .expect("a CUDA tensor has a buffer")
            .view(scores.offset() * 4);
        let out_view = out.view(0);
        // Without a mask the kernel never reads it: any valid pointer serves.
        let mask_view = mask.map_or(out.view(0), |m| {
            m.cuda_buffer()
                .expect("a CUDA mask has a buffer")
                .view(offset * m.dtype().size())
        });
        let ints = [s.h, s.lq, s.lk]
            .map(|x| int_arg(OP, x))
            .into_iter()
            .collect::<Result<Vec<i32>>>()?;
        let scale = job.scale as f32;
        let [band, lo, hi, lower_right] = band_args(OP, job)?;
        let strides = strides.map(long_arg);
        let seed = job.dropout.map_or(0, Draw::key);
        let mut args = kernel.args();
        args.ptr(&scores_view).ptr(&mask_view).ptr(&out_view);
        for x in &ints {
            args.int(x);
        }
        args.float(&scale)
            .int(&band)
            .int(&lo)
            .int(&hi)
            .int(&lower_right);
        for x in &strides {
            args.long(x);
        }
        args.double(&job.options.dropout_p).ulong(&seed);
        // SAFETY: the arguments follow masked_softmax.cu's parameter list; the scores and the
        // output hold B·H·Lq rows of Lk f32 values, and the mask is the tensor's own view,
        // which holds every element its strides reach.
        unsafe { kernel.launch(args, (grid_dim(OP, rows)?, 1, 1)) }?;
    }
    Ok(Tensor::from_storage(
        Storage::Device(Box::new(out)),
        DType::F32,
        Device::Cuda(ordinal),
        scores.shape(),
    ))
}
