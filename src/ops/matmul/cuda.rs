//! `matmul` on CUDA: the generated GEMM kernels (FFMA, TF32 / bf16 / fp16 `mma.sync`, split-K
//! with a fixed-order reduction) or cuBLAS, as `preferred_blas_library` and the precision
//! flags say.
//!
//! Routing: `cublas` and `cublaslt` go to that library when it loads and takes the operand
//! views, else to the generated kernels with the reason in the trace. `default` runs the generated
//! kernels: a size rule for handing products to the vendor needs GPU measurements, which
//! `scripts/device-check.sh` takes (generated vs cuBLAS, side by side).

use super::blas::preferred_blas_library;
use super::{ConvGemm, Problem, shapes};
use crate::core::precision::matmul as flags;
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg, long_arg};

use crate::core::tensor::{Storage, Tensor};
use crate::core::trace::{self, Call};
use crate::kernels::{Elem, GemmKey, GemmMath, KernelKey, SplitKReduceKey};
use crate::{DType, Device, Error, Fp32Precision, Result};

/// K indices one split-K slice covers, at least (below this a split costs more than it
/// gains).
const MIN_K_SLICE: usize = 256;
/// Split-K slices at most.
const MAX_SPLITS: usize = 16;

/// The generated variant for `dtype` under the current flags, and what it does in words.
fn variant(dtype: DType) -> Result<(GemmKey, String)> {
    let key = |elem, math, acc_f16, partials| GemmKey {
        elem,
        math,
        acc_f16,
        partials,
        conv: false,
    };
    Ok(match dtype {
        DType::F32 => match flags::fp32_precision_effective() {
            Fp32Precision::Tf32 => (
                key(Elem::F32, GemmMath::Tf32, false, Elem::F32),
                "tf32 tensor cores, f32 accumulate".into(),
            ),
            Fp32Precision::Bf16 => (
                key(Elem::F32, GemmMath::Bf16, false, Elem::F32),
                "bf16 tensor cores (inputs rounded to bf16), f32 accumulate".into(),
            ),
            _ => (
                key(Elem::F32, GemmMath::Ieee, false, Elem::F32),
                "ieee fp32 (FFMA)".into(),
            ),
        },
        DType::F16 => {
            let acc_f16 = flags::allow_fp16_accumulation();
            let reduced = flags::allow_fp16_reduced_precision_reduction();
            let partials = if reduced { Elem::F16 } else { Elem::F32 };
            let note = format!(
                "fp16 tensor cores, {} accumulate, split-K partials in {}",
                if acc_f16 { "f16" } else { "f32" },
                partials.name()
            );
            (key(Elem::F16, GemmMath::F16, acc_f16, partials), note)
        }
        DType::Bf16 => {
            let reduced = flags::allow_bf16_reduced_precision_reduction();
            let partials = if reduced { Elem::Bf16 } else { Elem::F32 };
            let note = format!(
                "bf16 tensor cores, f32 accumulate, split-K partials in {}",
                partials.name()
            );
            (key(Elem::Bf16, GemmMath::Bf16, false, partials), note)
        }
        other => {
            return Err(Error::DTypeMismatch {
                op: "matmul on CUDA",
                expected: DType::F32,
                got: other,
            });
        }
    })
}

/// How many K slices a product is split into: enough blocks to fill the device when the
/// output alone has too few tiles, each slice at least [`MIN_K_SLICE`] deep.
fn splits(p: &Problem, tile: [u32; 2], sms: usize) -> usize {
    let tiles = p.m.div_ceil(tile[0] as usize) * p.n.div_ceil(tile[1] as usize) * p.batch;
    if tiles * 2 > sms {
        return 1;
    }
    (sms / tiles.max(1))
        .min(p.k / MIN_K_SLICE)
        .clamp(1, MAX_SPLITS)
}

/// `a · b` on CUDA device `ordinal`.
pub(super) fn matmul(ordinal: usize, a: &Tensor, b: &Tensor, p: &Problem) -> Result<Tensor> {
    let dtype = a.dtype();
    let (key, note) = variant(dtype)?;
    let out = CudaBuffer::zeroed(ordinal, p.outputs() * dtype.size())?;
    if p.batch * p.m * p.n != 0 && p.k != 0 {
        let library = preferred_blas_library(None);
        // `default` runs the generated kernels: which sizes a vendor library should take
        // instead is for the device check's side-by-side table to show, not to guess
        // (module docs).
        #[cfg(feature = "cuda")]
        let vendor_problem = match super::cublas::preferred(library, ordinal, (a, b), p, &out)? {
            super::cublas::Served::Vendor => return Ok(output(out, dtype, ordinal, p)),
            super::cublas::Served::Generated(why) => why,
        };
        // (Unreached without `cuda`: no CUDA buffer exists there.)
        #[cfg(not(feature = "cuda"))]
        let vendor_problem: Option<String> = None;
        let note = match vendor_problem {
            Some(why) => format!("{note} ({library} preferred, not used: {why})"),
            None => note,
        };
        let launch = Launch {
            op: "matmul on CUDA",
            key,
            note,
            shapes: shapes(a, b),
            conv: None,
        };
        generated(ordinal, (a, b), p, launch, &out)?;
    }
    Ok(output(out, dtype, ordinal, p))
}

/// The tensor of `p`'s shape over `out`.
fn output(out: CudaBuffer, dtype: DType, ordinal: usize, p: &Problem) -> Tensor {
    Tensor::from_storage(
        Storage::Device(Box::new(out)),
        dtype,
        Device::Cuda(ordinal),
        &p.out_shape,
    )
}

/// What one generated GEMM launch runs besides its operands.
struct Launch {
    /// The operation, for errors.
    op: &'static str,
    key: GemmKey,
    /// What the variant does, for the trace.
    note: String,
    /// The operands' shapes, for the trace.
    shapes: String,
    /// The convolution's arguments of an implicit GEMM (see gemm.cu's `CONV`).
    conv: Option<[i32; 12]>,
}

/// The generated GEMM `key` of `a · b` as `p` lays them out into `out` (split-K with the
/// fixed-order reduction where the output alone cannot fill the device).
fn generated(
    ordinal: usize,
    (a, b): (&Tensor, &Tensor),
    p: &Problem,
    launch: Launch,
    out: &CudaBuffer,
) -> Result<()> {
    let Launch {
        op,
        key,
        note,
        shapes,
        conv,
    } = launch;
    let dtype = a.dtype();
    let gemm = Kernel::get(ordinal, &KernelKey::Gemm(key))?;
    let tile = gemm.entry.cuda.as_ref().expect("a CUDA GEMM variant").tile;
    let sms = crate::runtime::cuda::get_device_properties(ordinal)
        .map_or(1, |d| d.multi_processor_count as usize);
    let k_slice = p.k.div_ceil(splits(p, tile, sms)).next_multiple_of(32);
    let splits = p.k.div_ceil(k_slice);
    let partials = (splits > 1)
        .then(|| {
            CudaBuffer::zeroed(
                ordinal,
                splits * p.batch * p.m * p.n * DType::from(key.partials).size(),
            )
        })
        .transpose()?;
    let (a_buf, b_buf) = (
        a.cuda_buffer().expect("a CUDA tensor has a buffer"),
        b.cuda_buffer().expect("a CUDA tensor has a buffer"),
    );
    let (a_view, b_view) = (
        a_buf.view(a.offset() * dtype.size()),
        b_buf.view(b.offset() * dtype.size()),
    );
    let target = partials.as_ref().unwrap_or(out).view(0);
    let sizes = [p.m, p.n, p.k, p.batch, splits, k_slice]
        .map(|v| int_arg(op, v))
        .into_iter()
        .collect::<Result<Vec<i32>>>()?;
    let strides = p.kernel_strides().map(long_arg);
    let grid = (
        grid_dim(op, p.n.div_ceil(tile[1] as usize))?,
        grid_dim(op, p.m.div_ceil(tile[0] as usize))?,
        grid_dim(op, p.batch * splits)?,
    );
    let note = if splits > 1 {
        format!("{note}, split-K x{splits}")
    } else {
        note
    };
    let describe = || Call {
        kernel: gemm.entry.name.into(),
        backend: format!("cuda:{ordinal}"),
        dtype,
        shapes,
        precision: note,
    };
    trace::kernel(describe, || {
        let mut args = gemm.args();
        args.ptr(&a_view).ptr(&b_view).ptr(&target);
        for v in &sizes {
            args.int(v);
        }
        for s in &strides {
            args.long(s);
        }
        for v in conv.iter().flatten() {
            args.int(v);
        }
        // SAFETY: the arguments follow gemm.cu's parameter list (the convolution's sizes
        // where the variant is one); the operands hold every element their strides (or the
        // convolution's unfolding) reach, the target holds batch x M x N outputs or
        // splits x batch x M x N partials (allocated above).
        unsafe { gemm.launch(args, grid) }
    })?;
    if let Some(partials) = &partials {
        let reduce = Kernel::get(
            ordinal,
            &KernelKey::SplitKReduce(SplitKReduceKey {
                elem: key.elem,
                partials: key.partials,
            }),
        )?;
        let (m, n, batch, splits) = (sizes[0], sizes[1], sizes[3], sizes[4]);
        let (c_batch, c_row) = (long_arg(p.m * p.n), long_arg(p.n));
        let (from, to) = (partials.view(0), out.view(0));
        let grid = (grid_dim(op, (p.batch * p.m * p.n).div_ceil(256))?, 1, 1);
        let mut args = reduce.args();
        args.ptr(&from)
            .ptr(&to)
            .int(&m)
            .int(&n)
            .int(&batch)
            .int(&splits)
            .long(&c_batch)
            .long(&c_row);
        // SAFETY: the arguments follow splitk_reduce.cu's parameter list; both buffers were
        // sized above for these sizes.
        unsafe { reduce.launch(args, grid) }?;
    }
    Ok(())
}

/// [`super::conv_gemm`] on CUDA device `ordinal`: fp32 follows `cudnn.allow_tf32` (as
/// PyTorch's convolutions do); f16 and bf16 run on tensor cores with f32 accumulators.
pub(super) fn conv_gemm(
    ordinal: usize,
    input: &Tensor,
    weight: &Tensor,
    conv: &ConvGemm,
) -> Result<Tensor> {
    let dtype = input.dtype();
    let (key, note) = conv_variant(dtype)?;
    let p = conv.problem(input, weight);
    let out = CudaBuffer::zeroed(ordinal, p.outputs() * dtype.size())?;
    // (Without input channels the output is zeros.)
    if p.outputs() != 0 && p.k != 0 {
        let op = "conv2d on CUDA";
        let mut args = [0; 12];
        for (to, size) in args.iter_mut().zip(conv.kernel_args()) {
            *to = int_arg(op, size)?;
        }
        // (The kernel indexes one image's group of channels in 32-bit steps.)
        int_arg(op, conv.group_input)?;
        let launch = Launch {
            op,
            key,
            note,
            shapes: shapes(input, weight),
            conv: Some(args),
        };
        generated(ordinal, (weight, input), &p, launch, &out)?;
    }
    Ok(output(out, dtype, ordinal, &p))
}

/// The implicit-GEMM variant for a convolution of `dtype`, and what it does in words.
fn conv_variant(dtype: DType) -> Result<(GemmKey, String)> {
    let key = |elem, math| GemmKey {
        elem,
        math,
        acc_f16: false,
        partials: Elem::F32,
        conv: true,
    };
    Ok(match dtype {
        DType::F32 if crate::core::cudnn::allow_tf32() => (
            key(Elem::F32, GemmMath::Tf32),
            "tf32 (cudnn.allow_tf32), f32 accumulate".into(),
        ),
        DType::F32 => (
            key(Elem::F32, GemmMath::Ieee),
            "ieee fp32 (cudnn.allow_tf32 off)".into(),
        ),
        DType::F16 => (
            key(Elem::F16, GemmMath::F16),
            "fp16 tensor cores, f32 accumulate".into(),
        ),
        DType::Bf16 => (
            key(Elem::Bf16, GemmMath::Bf16),
            "bf16 tensor cores, f32 accumulate".into(),
        ),
        other => {
            return Err(Error::DTypeMismatch {
                op: "conv2d on CUDA (f32, f16, bf16; move f64 inputs to the CPU)",
                expected: DType::F32,
                got: other,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(batch: usize, m: usize, n: usize, k: usize) -> Problem {
        Problem {
            batch,
            m,
            n,
            k,
            out_shape: vec![batch, m, n],
            a: [m * k, k, 1],
            b: [k * n, n, 1],
            offsets: [0, 0],
        }
    }

    #[test]
    fn split_k_only_when_the_output_cannot_fill_the_device() {
        let tile = [64, 64];
        // 256 tiles fill 132 SMs: no split.
        assert_eq!(splits(&problem(1, 1024, 1024, 8192), tile, 132), 1);
        // One tile with a deep K: as many slices as fit, at most MAX_SPLITS.
        assert_eq!(splits(&problem(1, 64, 64, 8192), tile, 132), 16);
        // A shallow K is not split below MIN_K_SLICE.
        assert_eq!(splits(&problem(1, 64, 64, 700), tile, 132), 2);
        assert_eq!(splits(&problem(1, 64, 64, 200), tile, 132), 1);
    }

    #[test]
    fn the_flags_choose_the_variant() {
        let _p = crate::core::precision::matmul::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
        assert_eq!(variant(DType::F32).unwrap().0.math, GemmMath::Tf32);
        let _r = flags::ALLOW_BF16_REDUCED_PRECISION_REDUCTION.guard_scoped(false);
        assert_eq!(variant(DType::Bf16).unwrap().0.partials, Elem::F32);
        let _r = flags::ALLOW_FP16_REDUCED_PRECISION_REDUCTION.guard_scoped(true);
        let _a = flags::ALLOW_FP16_ACCUMULATION.guard_scoped(true);
        let (key, note) = variant(DType::F16).unwrap();
        assert!(key.acc_f16 && key.partials == Elem::F16, "{note}");
        assert!(matches!(
            variant(DType::F64),
            Err(Error::DTypeMismatch { .. })
        ));
    }
}
