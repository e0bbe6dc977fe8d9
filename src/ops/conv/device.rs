//! The convolution on wgpu and CUDA: the generated implicit GEMM
//! ([`crate::ops::matmul::conv_gemm`]) reads each group's unfolded input straight from the
//! input, batched over images and groups; pointwise convolutions multiply the input as it
//! stands (`matmul`). The generated bias kernel adds the bias in place. On CUDA the GEMMs'
//! fp32 mode follows `cudnn.allow_tf32` (as PyTorch's convolutions do), on wgpu matmul's
//! flags.

use super::{Geometry, Lowering};
use crate::kernels::{BiasAddKey, KernelKey};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::{grid_dim, long_arg};
use crate::runtime::wgpu::u32_arg;
use crate::{DType, Device, Error, Result, Tensor, matmul};

/// Whether `device` runs a convolution of `dtype`, and if not, why.
pub(crate) fn check_dtype(device: Device, dtype: DType) -> Result<()> {
    let supported = match device {
        // bf16 through f32 copies widened on the device (WGSL has no bf16).
        Device::Wgpu(_) => matches!(dtype, DType::F32 | DType::Bf16),
        Device::Cuda(_) => matches!(dtype, DType::F32 | DType::F16 | DType::Bf16),
        Device::Cpu => true,
    };
    if supported {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        op: if matches!(device, Device::Wgpu(_)) {
            "conv2d on wgpu (f32 and bf16; move f16 inputs to the CPU)"
        } else {
            "conv2d on CUDA (f32, f16, bf16; move f64 inputs to the CPU)"
        },
        expected: DType::F32,
        got: dtype,
    })
}

/// How the GEMMs round fp32 inputs here, for the trace.
pub(crate) fn precision_note(device: Device, dtype: DType) -> String {
    match (device, dtype) {
        (Device::Cuda(_), DType::F32) if crate::core::cudnn::allow_tf32() => {
            "tf32 (cudnn.allow_tf32)".into()
        }
        (Device::Cuda(_), DType::F32) => "ieee (cudnn.allow_tf32 off)".into(),
        _ => "as matmul".into(),
    }
}

/// Runs the `lowering` [`super::plan`] chose on wgpu or CUDA (`gemm`, `implicit gemm`).
pub(crate) fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    lowering: Lowering,
) -> Result<Tensor> {
    if crate::ops::convert::is_wgpu_bf16(input) {
        use crate::ops::convert::{from_f32, widened};
        let wide = |t: &Tensor| widened("conv2d", t);
        let bias = bias.map(wide).transpose()?;
        let result = conv2d(&wide(input)?, &wide(weight)?, bias.as_ref(), g, lowering)?;
        return from_f32("conv2d", &result, DType::Bf16);
    }
    let (n, o, p, kg) = (g.batch, g.out_channels, g.pixels(), g.patch_len());
    let device = input.device();
    let w = weight.contiguous()?;
    let product = if lowering == Lowering::ImplicitGemm {
        if let Device::Wgpu(_) = device {
            // The WGSL kernel finds a tap's row and column in the padded input in u32.
            for ((size, before), after) in g.input.into_iter().zip(g.pad_before).zip(g.pad_after())
            {
                u32_arg("conv2d on wgpu", size.saturating_add(before + after))?;
            }
        }
        let sizes = crate::ops::matmul::ConvGemm {
            images: n,
            groups: g.groups,
            m: g.group_out_channels(),
            n: p,
            k: kg,
            group_input: g.group_channels() * g.input[0] * g.input[1],
            args: [
                g.input[0],
                g.input[1],
                g.output[1],
                g.kernel[0],
                g.kernel[1],
                g.stride[0],
                g.stride[1],
                g.pad_before[0],
                g.pad_before[1],
                g.dilation[0],
                g.dilation[1],
            ],
        };
        crate::ops::matmul::conv_gemm(&input.contiguous()?, &w, &sizes)?
    } else {
        // Pointwise: the input is each group's B as it stands.
        let cols = input.contiguous()?.view(&[n * g.groups, kg, p])?;
        let _precision = match device {
            Device::Cuda(_) => Some(crate::core::precision::matmul::FP32_PRECISION.guard_scoped(
                if crate::core::cudnn::allow_tf32() {
                    crate::Fp32Precision::Tf32
                } else {
                    crate::Fp32Precision::Ieee
                },
            )),
            _ => None,
        };
        if g.groups == 1 {
            matmul(&w.view(&[o, kg])?, &cols.view(&[n, kg, p])?)?
        } else {
            // Each image's groups: [g, O/g, K] x [g, K, P]; the weight repeated per image (it
            // is small) so that one batched product covers every image and group.
            let per_group = [g.groups, g.group_out_channels(), kg];
            let weights = w
                .view(&[1, per_group[0], per_group[1], per_group[2]])?
                .expand(&[n, per_group[0], per_group[1], per_group[2]])?
                .reshape(&[n * g.groups, per_group[1], per_group[2]])?;
            matmul(&weights, &cols)?
        }
    };
    if let Some(bias) = bias {
        add_bias(&product, &bias.contiguous()?, o, p)?;
    }
    product.view(&[n, o, g.output[0], g.output[1]])
}

/// Adds `bias` (`[channels]`) in place to the contiguous `out` (`[.., channels, inner]`).
pub(super) fn add_bias(out: &Tensor, bias: &Tensor, channels: usize, inner: usize) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let elem = out.dtype().elem().expect("a float output");
    let key = KernelKey::BiasAdd(BiasAddKey { elem });
    match out.device() {
        Device::Cuda(ordinal) => {
            let kernel = Kernel::get(ordinal, &key)?;
            let size = out.dtype().size();
            let x = out
                .cuda_buffer()
                .expect("a CUDA tensor has a buffer")
                .view(out.offset() * size);
            let b = bias
                .cuda_buffer()
                .expect("a CUDA tensor has a buffer")
                .view(bias.offset() * size);
            let longs = [n, inner, channels].map(long_arg);
            let mut args = kernel.args();
            args.ptr(&x).ptr(&b);
            for value in &longs {
                args.long(value);
            }
            let grid = (grid_dim("conv2d", n.div_ceil(256))?, 1, 1);
            // SAFETY: the arguments follow bias_add.cu's parameter list; `out` holds n
            // contiguous elements from its offset, and `bias` holds `channels`.
            unsafe { kernel.launch(args, grid) }
        }
        Device::Wgpu(index) => {
            let entry = crate::kernels::lookup(&key).expect("the bias kernels are declared");
            let kernel = entry.wgsl.as_ref().expect("f32 bias_add has WGSL");
            let dispatch = crate::runtime::wgpu::folded_groups("conv2d", n.div_ceil(256))?;
            let arg = |v| u32_arg("conv2d", v);
            let params = [
                arg(n)?,
                arg(inner)?,
                arg(channels)?,
                dispatch[0],
                arg(out.offset())?,
                arg(bias.offset())?,
                0,
                0,
            ];
            let gpu = crate::runtime::wgpu::gpu(index)?;
            let x = out.wgpu_buffer().expect("a wgpu tensor has a buffer");
            let b = bias.wgpu_buffer().expect("a wgpu tensor has a buffer");
            gpu.run(entry.name, kernel, &[x.raw(), b.raw()], &params, dispatch)
        }
        Device::Cpu => unreachable!("the CPU adds on the host"),
    }
}
