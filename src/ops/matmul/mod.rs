//! `matmul` (with `torch.matmul`'s semantics: vectors, broadcast batch dimensions) and
//! `linear`: matrix products on the CPU, on wgpu and on CUDA, honouring
//! the precision flags of [`crate::core::precision::matmul`].
//!
//! On CUDA the flags pick the generated kernel (FFMA, TF32 / bf16 / fp16 tensor cores, fp16
//! accumulation, split-K partials in f32 or 16 bits) or cuBLAS's compute type and math mode,
//! as `preferred_blas_library` routes the call (see `matmul/cuda.rs`). On the CPU and wgpu
//! (the verbose trace names what ran on every call):
//! - fp32 precision `tf32`: no CPU or wgpu hardware has TF32, so the product stays IEEE fp32
//!   unless [`EMULATE_REDUCED_PRECISION`] is on, in which case inputs are rounded to TF32.
//! - fp32 precision `bf16` ("medium"): inputs are rounded to bf16 (f32 accumulate) where
//!   the CPU has AVX512-BF16, or under [`EMULATE_REDUCED_PRECISION`]; else IEEE fp32. Such
//!   products, and bf16 ones, run on AMX tiles where the CPU has AMX-BF16.
//! - fp16/bf16 inputs always accumulate in f32 with no split-K, so
//!   `allow_{fp16,bf16}_reduced_precision_reduction` and `allow_fp16_accumulation` have no
//!   effect on these devices.
//! - every path sums in a fixed order, so results are bit-identical run to run
//!   (what `use_deterministic_algorithms` asks for).

pub mod blas;
#[cfg(feature = "cuda")]
mod cublas;
mod cuda;

use half::{bf16, f16};

use crate::core::flag::{EnvInit, Flag};
use crate::core::tensor::{Element, Storage, Tensor, host_zeros};
use crate::core::trace::{self, Call};
use crate::kernels::convert::narrow;
use crate::kernels::gemm::{self, MatView, Rounding};
use crate::kernels::{Elem, GemmKey, GemmMath, KernelKey};
use crate::runtime::wgpu::u32_arg;
use crate::{DType, Device, Error, Fp32Precision, Result};

/// Opt-in: on devices without TF32 (or bf16) hardware, emulate the reduced-precision
/// fp32 matmul modes by rounding the inputs. Off by default; `BACKENDS_EMULATE_REDUCED_PRECISION=1`
/// turns it on for the process.
pub static EMULATE_REDUCED_PRECISION: Flag<bool> = Flag::new(
    "emulate_reduced_precision",
    false,
    Some(EnvInit {
        var: "BACKENDS_EMULATE_REDUCED_PRECISION",
        parse: |s| Some(s == "1"),
    }),
);

/// The shapes of one (batched) product.
struct Problem {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    out_shape: Vec<usize>,
    /// Batch, row and column strides of each operand (batch stride 0 when broadcast).
    a: [usize; 3],
    b: [usize; 3],
    /// Where each operand's first element is in its buffer.
    offsets: [usize; 2],
}

impl Problem {
    /// The element strides the GEMM kernels take, in their order: A's batch, row and column
    /// strides, B's, then C's batch and row strides (C is contiguous).
    fn kernel_strides(&self) -> [usize; 8] {
        let (a, b) = (self.a, self.b);
        [a[0], a[1], a[2], b[0], b[1], b[2], self.m * self.n, self.n]
    }

    /// The number of output elements (batch x M x N; it fits: the problem's construction
    /// checked the output's extent).
    fn outputs(&self) -> usize {
        self.batch * self.m * self.n
    }
}

/// A convolution as its implicit GEMM sees it: one product per image and group.
pub(crate) struct ConvGemm {
    pub images: usize,
    pub groups: usize,
    /// Each group's output channels (M), the output's pixels (N) and a patch's length,
    /// `C/g · kH · kW` (K).
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Input elements of one group of one image, `C/g · H · W`.
    pub group_input: usize,
    /// The GEMM kernels' `CONV` arguments after the groups: H, W, W', kH, kW, the strides,
    /// the padding before each dimension, the dilations.
    pub args: [usize; 11],
}

impl ConvGemm {
    /// The batched product of `weight` (A) and `input`'s unfolding (B).
    fn problem(&self, input: &Tensor, weight: &Tensor) -> Problem {
        let ConvGemm { m, n, k, .. } = *self;
        Problem {
            batch: self.images * self.groups,
            m,
            n,
            k,
            out_shape: vec![self.images, self.groups * m, n],
            // A's batch stride is per group (the kernels' CONV), B's per image and group.
            a: [m * k, k, 1],
            b: [self.group_input, 0, 0],
            offsets: [weight.offset(), input.offset()],
        }
    }

    /// The kernels' `CONV` arguments: the groups, then [`ConvGemm::args`].
    fn kernel_args(&self) -> [usize; 12] {
        let mut args = [self.groups; 12];
        args[1..].copy_from_slice(&self.args);
        args
    }
}

/// A convolution of the contiguous `input` (`[N, C, H, W]`) by the contiguous `weight`
/// (`[O, C/g, kH, kW]`) on a device as the generated implicit GEMM: one product of each
/// group's weight with that group's unfolded input per image, the unfolding read from the
/// input as the kernel loads B's tiles (never stored). On wgpu (f32), fp32 follows matmul's
/// flags. Returns `[N, O, H' · W']`.
pub(crate) fn conv_gemm(input: &Tensor, weight: &Tensor, conv: &ConvGemm) -> Result<Tensor> {
    match input.device() {
        Device::Cuda(ordinal) => cuda::conv_gemm(ordinal, input, weight, conv),
        Device::Wgpu(index) => {
            let args = conv.kernel_args();
            wgpu(
                index,
                weight,
                input,
                &conv.problem(input, weight),
                Some(args),
            )
        }
        Device::Cpu => unreachable!("the CPU convolves in ops::conv::cpu"),
    }
}

fn problem(a: &Tensor, b: &Tensor) -> Result<Problem> {
    let (ra, rb) = (a.shape().len(), b.shape().len());
    if !(2..=3).contains(&ra) || !(2..=3).contains(&rb) {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            detail: format!(
                "the batched kernels take 2-D or 3-D operands, got {:?} and {:?}",
                a.shape(),
                b.shape()
            ),
        });
    }
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            detail: format!(
                "inner dimensions differ: {:?} x {:?} ({k} != {k2})",
                a.shape(),
                b.shape()
            ),
        });
    }
    let batch_of = |t: &Tensor, r: usize| if r == 3 { t.shape()[0] } else { 1 };
    let (ba, bb) = (batch_of(a, ra), batch_of(b, rb));
    if ba != bb && ba != 1 && bb != 1 {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            detail: format!(
                "batch sizes {ba} and {bb} do not broadcast: {:?} x {:?}",
                a.shape(),
                b.shape()
            ),
        });
    }
    // 1 broadcasts to any batch size, 0 included.
    let batch = if ba == 1 { bb } else { ba };
    let strides = |t: &Tensor, r: usize, own: usize| {
        let s = t.strides();
        [if r == 3 && own > 1 { s[0] } else { 0 }, s[r - 2], s[r - 1]]
    };
    let out_shape = if ra == 2 && rb == 2 {
        vec![m, n]
    } else {
        vec![batch, m, n]
    };
    // The output's size in bytes fits the address space (then every product of its
    // dimensions below does too), or the call is an error.
    crate::core::tensor::checked_numel("matmul", &out_shape, a.dtype())?;
    Ok(Problem {
        batch,
        m,
        n,
        k,
        out_shape,
        a: strides(a, ra, ba),
        b: strides(b, rb, bb),
        offsets: [a.offset(), b.offset()],
    })
}

/// How an fp32 product runs on a device without TF32 hardware, and what to say about it.
fn fp32_rounding(has_bf16_hardware: bool) -> (Rounding, String) {
    let emulate = EMULATE_REDUCED_PRECISION.get();
    match crate::core::precision::matmul::fp32_precision_effective() {
        Fp32Precision::Tf32 if emulate => {
            (Rounding::Tf32, "tf32 (emulated by input rounding)".into())
        }
        Fp32Precision::Tf32 => (
            Rounding::None,
            "ieee (tf32 requested: no TF32 hardware here, flag has no effect)".into(),
        ),
        Fp32Precision::Bf16 if has_bf16_hardware => {
            (Rounding::Bf16, "bf16 inputs, f32 accumulate".into())
        }
        Fp32Precision::Bf16 if emulate => (
            Rounding::Bf16,
            "bf16 inputs (emulated by input rounding)".into(),
        ),
        Fp32Precision::Bf16 => (
            Rounding::None,
            "ieee (bf16 requested: no bf16 hardware here, flag has no effect)".into(),
        ),
        _ => (Rounding::None, "ieee".into()),
    }
}

/// How the CPU GEMM treats inputs of `dtype` (f32, f16, bf16): their rounding and the
/// trace's precision note, as `matmul` applies them (a convolution's GEMMs follow them).
pub(crate) fn cpu_rounding(dtype: DType) -> (Rounding, String) {
    match dtype {
        DType::F32 => fp32_rounding(crate::runtime::cpu::has_avx512_bf16()),
        _ => (Rounding::None, half_note(dtype)),
    }
}

fn half_note(dtype: DType) -> String {
    let reduced = match dtype {
        DType::F16 => crate::core::precision::matmul::allow_fp16_reduced_precision_reduction(),
        _ => crate::core::precision::matmul::allow_bf16_reduced_precision_reduction(),
    };
    let mut note = String::from("f32 accumulate, no split-K");
    if reduced {
        note.push_str(" (reduced-precision reduction allowed: no effect here)");
    }
    if dtype == DType::F16 && crate::core::precision::matmul::allow_fp16_accumulation() {
        note.push_str(" (fp16 accumulation allowed: no effect here)");
    }
    note
}

/// The matrix product of `a` and `b` with `torch.matmul`'s semantics: `[M, K] x [K, N] ->
/// [M, N]`; a 1-D operand is a row (left) or a column (right) vector whose dimension the
/// result drops (two 1-D operands give their dot product, a 0-D tensor); beyond two
/// dimensions the leading (batch) dimensions broadcast as PyTorch broadcasts them
/// (`[2, 1, M, K] x [3, K, N] -> [2, 3, M, N]`; an operand broadcast over a batch it lacks is
/// read in place up to three dimensions, and beyond them expanded into one copy, as
/// PyTorch's own matmul does). Operands may be strided views. Zero-sized dimensions give an
/// empty or zero result, as in PyTorch.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.shape().len(), b.shape().len());
    if ra == 0 || rb == 0 {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            detail: format!(
                "both operands need at least one dimension; got {:?} and {:?}",
                a.shape(),
                b.shape()
            ),
        });
    }
    // A vector is a one-row (left) or one-column (right) matrix, that dimension dropped after.
    let a2 = if ra == 1 { a.unsqueeze(0)? } else { a.clone() };
    let b2 = if rb == 1 { b.unsqueeze(1)? } else { b.clone() };
    let out = if a2.shape().len() <= 3 && b2.shape().len() <= 3 {
        product(&a2, &b2, None)?
    } else {
        broadcast_product(&a2, &b2)?
    };
    let mut shape = out.shape().to_vec();
    if rb == 1 {
        shape.pop();
    }
    if ra == 1 {
        shape.remove(shape.len() - if rb == 1 { 1 } else { 2 });
    }
    out.view(&shape)
}

/// [`matmul`] written into `out`, as `torch.matmul(a, b, out=out)`: `out` is a CPU tensor
/// of the result's shape and dtype (PyTorch's resizing of a wrong-sized `out` is an error
/// here), such as a [`crate::BorrowScope::borrow_mut`] over caller memory.
pub fn matmul_out(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    crate::ops::copy::write_out("matmul_out", &matmul(a, b)?, out)
}

/// `a x b` with more than three dimensions on either side: the batch dimensions broadcast,
/// then one batched product over them flattened.
fn broadcast_product(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let ((batch_a, [m, k]), (batch_b, [k2, n])) =
        (sa.split_at(sa.len() - 2), sb.split_at(sb.len() - 2))
    else {
        unreachable!("both operands have two dimensions at least")
    };
    let (m, k, k2, n) = (*m, *k, *k2, *n);
    if k != k2 {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            detail: format!("inner dimensions differ: {sa:?} x {sb:?} ({k} != {k2})"),
        });
    }
    let rank = batch_a.len().max(batch_b.len());
    let size =
        |dims: &[usize], i: usize| (i + dims.len()).checked_sub(rank).map_or(1, |at| dims[at]);
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (size(batch_a, i), size(batch_b, i));
        if x != y && x != 1 && y != 1 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                detail: format!(
                    "batch dimensions of {sa:?} and {sb:?} do not broadcast ({x} vs {y})"
                ),
            });
        }
        batch.push(if x == 1 { y } else { x });
    }
    let count = crate::core::tensor::checked_numel("matmul", &batch, a.dtype())?;
    let a3 = a
        .expand(&[&batch[..], &[m, k]].concat())?
        .reshape(&[count, m, k])?;
    let b3 = b
        .expand(&[&batch[..], &[k, n]].concat())?
        .reshape(&[count, k, n])?;
    product(&a3, &b3, None)?.view(&[&batch[..], &[m, n]].concat())
}

/// `torch.nn.functional.linear`: `input · weightᵀ + bias` for `input [*, in]`, `weight
/// [out, in]` and `bias [out]`, giving `[*, out]` in the input's dtype. On the CPU the bias
/// is added to the f32 (f64) accumulators before the single rounding to the dtype, as
/// oneDNN's fused bias does; elsewhere it is added to the product's elements (on wgpu and
/// CUDA through the host, in the dtype).
pub fn linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let [out, width] = *weight.shape() else {
        return Err(Error::ShapeMismatch {
            op: "linear",
            detail: format!("the weight must be [out, in]; got {:?}", weight.shape()),
        });
    };
    let Some((&last, outer)) = input.shape().split_last() else {
        return Err(Error::ShapeMismatch {
            op: "linear",
            detail: "the input is a scalar; give it at least one dimension".into(),
        });
    };
    if last != width {
        return Err(Error::ShapeMismatch {
            op: "linear",
            detail: format!(
                "the input's last dimension ({last}) is not the weight's in-features ({width}): \
                 {:?} x {:?}",
                input.shape(),
                weight.shape()
            ),
        });
    }
    if let Some(bias) = bias {
        if bias.shape() != [out] {
            return Err(Error::ShapeMismatch {
                op: "linear",
                detail: format!("the bias must be [{out}]; got {:?}", bias.shape()),
            });
        }
        input.check_same_kind("linear", [bias])?;
    }
    let rows = outer.iter().product();
    let y = product(&input.reshape(&[rows, width])?, &weight.t()?, bias)?;
    y.view(&[outer, &[out]].concat())
}

/// `a · b`, plus `bias` on every row where given (shapes checked by the caller).
fn product(a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op: "matmul",
            a: a.device(),
            b: b.device(),
        });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    let p = problem(a, b)?;
    let product = match a.device() {
        Device::Cpu => return cpu(a, b, &p, bias),
        Device::Wgpu(index) if a.dtype() == DType::Bf16 => {
            use crate::ops::convert::{from_f32, widened};
            let wide = wgpu(
                index,
                &widened("matmul", a)?,
                &widened("matmul", b)?,
                &p,
                None,
            )?;
            from_f32("matmul", &wide, DType::Bf16)?
        }
        Device::Wgpu(index) => wgpu(index, a, b, &p, None)?,
        Device::Cuda(ordinal) => cuda::matmul(ordinal, a, b, &p)?,
    };
    match bias {
        Some(bias) => add_bias_on_host(&product, bias),
        None => Ok(product),
    }
}

/// `product` with `bias` added to every row, through the host in the dtype (each sum in
/// f64, rounded once).
fn add_bias_on_host(product: &Tensor, bias: &Tensor) -> Result<Tensor> {
    fn add<T: Element>(product: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let mut values = product.to_vec::<T>()?;
        let bias = bias.to_vec::<T>()?;
        for row in values.chunks_mut(bias.len().max(1)) {
            for (x, b) in row.iter_mut().zip(&bias) {
                *x = T::from_f64(x.to_f64() + b.to_f64());
            }
        }
        Tensor::from_vec(values, product.shape(), product.device())
    }
    match product.dtype() {
        DType::F32 => add::<f32>(product, bias),
        DType::F64 => add::<f64>(product, bias),
        DType::F16 => add::<f16>(product, bias),
        DType::Bf16 => add::<bf16>(product, bias),
        DType::Bool | DType::I32 => unreachable!("matmul refuses non-floats"),
    }
}

fn shapes(a: &Tensor, b: &Tensor) -> String {
    format!("{:?}x{:?}", a.shape(), b.shape())
}

fn cpu(a: &Tensor, b: &Tensor, p: &Problem, bias: Option<&Tensor>) -> Result<Tensor> {
    let threads = crate::get_num_threads();
    let micro = crate::kernels::dispatch::cpu_kernels().gemm;
    match a.dtype() {
        DType::F64 => {
            let describe = || Call {
                kernel: "gemm_f64".into(),
                backend: "cpu/faer".into(),
                dtype: DType::F64,
                shapes: shapes(a, b),
                precision: "f64".into(),
            };
            trace::kernel(describe, || {
                let mut out = host_zeros::<f64>("matmul", p.outputs())?;
                each_batch(
                    p,
                    &a.host::<f64>("matmul")?,
                    &b.host::<f64>("matmul")?,
                    &mut out,
                    threads,
                    |va, vb, c, threads| gemm::gemm_f64(c, p.m, p.n, p.k, va, vb, threads),
                );
                if let Some(bias) = bias {
                    add_rows(&mut out, &bias.to_vec::<f64>()?, threads);
                }
                Tensor::from_vec(out, &p.out_shape, Device::Cpu)
            })
        }
        DType::F32 => {
            let (rounding, note) = fp32_rounding(crate::runtime::cpu::has_avx512_bf16());
            let micro = if rounding == Rounding::Bf16 {
                crate::kernels::dispatch::cpu_kernels().gemm_bf16
            } else {
                micro
            };
            run_cpu::<f32>(a, b, p, bias, (rounding, note, micro.name))
        }
        DType::F16 => run_cpu::<f16>(
            a,
            b,
            p,
            bias,
            (Rounding::None, half_note(DType::F16), micro.name),
        ),
        DType::Bf16 => run_cpu::<bf16>(
            a,
            b,
            p,
            bias,
            (
                Rounding::None,
                half_note(DType::Bf16),
                crate::kernels::dispatch::cpu_kernels().gemm_bf16.name,
            ),
        ),
        DType::Bool | DType::I32 => Err(Error::DTypeMismatch {
            op: "matmul",
            expected: DType::F32,
            got: a.dtype(),
        }),
    }
}

/// The product in `T` on the CPU, with the input rounding, the precision note of the trace
/// and the micro-kernel's name (`how`); `bias` is added to the f32 accumulators.
fn run_cpu<T: Element>(
    a: &Tensor,
    b: &Tensor,
    p: &Problem,
    bias: Option<&Tensor>,
    (rounding, note, micro): (Rounding, String, &'static str),
) -> Result<Tensor> {
    let threads = crate::get_num_threads();
    let special = gemm::special_kernel::<T>((p.m, p.n), (p.b[1], p.b[2]), rounding);
    let micro = special.unwrap_or(micro);
    let describe = || Call {
        kernel: format!("gemm_{}_{micro}", T::DTYPE),
        backend: format!("cpu/{micro}"),
        dtype: T::DTYPE,
        shapes: shapes(a, b),
        precision: note,
    };
    trace::kernel(describe, || {
        let (a, b) = (a.host::<T>("matmul")?, b.host::<T>("matmul")?);
        let bias: Option<Vec<f32>> = match bias {
            Some(bias) => Some(bias.to_vec::<T>()?.into_iter().map(T::to_f32).collect()),
            None => None,
        };
        if T::DTYPE != DType::F32 && special.is_none() {
            // The packed path rounds each block of sums into the output: no f32 copy of it.
            let mut out = host_zeros::<T>("matmul", p.outputs())?;
            each_batch(p, &a, &b, &mut out, threads, |va, vb, c, threads| {
                let dims = (p.m, p.n, p.k);
                gemm::gemm_narrowed(c, dims, va, vb, bias.as_deref(), rounding, threads)
            });
            return Tensor::from_vec(out, &p.out_shape, Device::Cpu);
        }
        let mut out = host_zeros::<f32>("matmul", p.outputs())?;
        each_batch(p, &a, &b, &mut out, threads, |va, vb, c, threads| {
            gemm::gemm(c, p.m, p.n, p.k, va, vb, rounding, threads)
        });
        if let Some(bias) = &bias {
            add_rows(&mut out, bias, threads);
        }
        Tensor::from_vec(
            narrow::<T>("matmul", out, threads)?,
            &p.out_shape,
            Device::Cpu,
        )
    })
}

/// Adds `bias` to every row of `out` (rows of `bias.len()`), on `threads` threads.
fn add_rows<F: Copy + Send + Sync + std::ops::AddAssign>(
    out: &mut [F],
    bias: &[F],
    threads: usize,
) {
    if bias.is_empty() {
        return;
    }
    let rows = out.len() / bias.len();
    let per = rows.div_ceil(threads.max(1)).max(1) * bias.len();
    let chunks: Vec<&mut [F]> = out.chunks_mut(per).collect();
    crate::runtime::threads::for_each(chunks, &|chunk: &mut [F]| {
        for row in chunk.chunks_mut(bias.len()) {
            for (x, &b) in row.iter_mut().zip(bias) {
                *x += b;
            }
        }
    });
}

/// Multiply-adds below which one product of a batch is not split among threads when the
/// batch can be instead (each thread then runs whole products: no meeting per product).
const BATCH_SPLIT_WORK: usize = 1 << 26;

/// Runs `product` on every batch's views with a thread count, writing each batch's
/// `m x n` result into its part of `out`: small products of a batch that divides among the
/// threads run whole on one thread each, the others one after another on every thread.
fn each_batch<T: Element, O: Send>(
    p: &Problem,
    a: &[T],
    b: &[T],
    out: &mut [O],
    threads: usize,
    product: impl Fn(MatView<T>, MatView<T>, &mut [O], usize) + Sync,
) {
    let run = |i: usize, c: &mut [O], threads: usize| {
        let va = MatView {
            data: a,
            offset: p.offsets[0] + i * p.a[0],
            rs: p.a[1],
            cs: p.a[2],
        };
        let vb = MatView {
            data: b,
            offset: p.offsets[1] + i * p.b[0],
            rs: p.b[1],
            cs: p.b[2],
        };
        product(va, vb, c, threads);
    };
    let per = p.m * p.n;
    if per == 0 {
        return;
    }
    let divides = p.batch.is_multiple_of(threads) || p.batch >= 4 * threads;
    let small = per.saturating_mul(p.k) < BATCH_SPLIT_WORK;
    if threads > 1 && p.batch > 1 && divides && small {
        let share = p.batch.div_ceil(threads);
        let groups: Vec<(usize, &mut [O])> = out[..p.batch * per]
            .chunks_mut(share * per)
            .enumerate()
            .map(|(g, chunk)| (g * share, chunk))
            .collect();
        crate::runtime::threads::for_each(groups, &|(first, chunk): (usize, &mut [O])| {
            for (i, c) in chunk.chunks_mut(per).enumerate() {
                run(first + i, c, 1);
            }
        });
        return;
    }
    for (i, c) in out.chunks_mut(per).take(p.batch).enumerate() {
        run(i, c, threads);
    }
}

/// The generated GEMM on wgpu: `a · b`, or with `conv` (the kernel's `CONV` arguments, see
/// [`ConvGemm::kernel_args`]) the weight `a` times the unfolding of the f32 input `b`.
fn wgpu(
    index: usize,
    a: &Tensor,
    b: &Tensor,
    p: &Problem,
    conv: Option<[usize; 12]>,
) -> Result<Tensor> {
    let op = match conv {
        Some(_) => "conv2d on wgpu",
        None => "matmul on wgpu",
    };
    let gpu = crate::runtime::wgpu::gpu(index)?;
    let (elem, math, note) = match a.dtype() {
        DType::F32 => {
            let (rounding, note) = fp32_rounding(false);
            let math = match rounding {
                Rounding::None => GemmMath::Ieee,
                Rounding::Tf32 => GemmMath::Tf32,
                Rounding::Bf16 => GemmMath::Bf16,
            };
            (Elem::F32, math, note)
        }
        DType::F16 if conv.is_none() => (Elem::F16, GemmMath::F16, half_note(DType::F16)),
        other => {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: other,
            });
        }
    };
    let entry = crate::kernels::lookup(&KernelKey::Gemm(GemmKey {
        elem,
        math,
        acc_f16: false,
        partials: Elem::F32,
        conv: conv.is_some(),
    }))
    .expect("the wgpu GEMM and f32 convolution variants are declared");
    let kernel = entry
        .wgsl
        .as_ref()
        .expect("the wgpu GEMM variants have WGSL");
    let out_bytes = p.outputs() * a.dtype().size();
    let out = if p.k == 0 {
        crate::runtime::wgpu::WgpuBuffer::zeroed(gpu, out_bytes)?
    } else {
        crate::runtime::wgpu::WgpuBuffer::output(gpu, out_bytes)?
    };
    if p.outputs() > 0 && p.k > 0 {
        let fits = |v: usize| u32_arg(op, v);
        // One dispatch per run of batches the adapter takes, from batch `first` on.
        let params = |first: usize| {
            [p.m, p.n, p.k, p.batch]
                .into_iter()
                .chain(p.kernel_strides())
                .chain(p.offsets)
                .chain([first, 0])
                .chain(conv.unwrap_or_default())
                .chain([0; 4])
                .map(fits)
                .collect::<Result<Vec<u32>>>()
        };
        let per_dispatch = gpu.max_workgroups() as usize;
        let (a_buf, b_buf) = (
            a.wgpu_buffer().expect("a wgpu tensor has a buffer"),
            b.wgpu_buffer().expect("a wgpu tensor has a buffer"),
        );
        let tiles = [fits(p.n.div_ceil(64))?, fits(p.m.div_ceil(64))?];
        let describe = || Call {
            kernel: entry.name.into(),
            backend: format!("wgpu:{index}"),
            dtype: a.dtype(),
            shapes: shapes(a, b),
            precision: note,
        };
        trace::kernel(describe, || {
            for first in (0..p.batch).step_by(per_dispatch) {
                let batches = fits(per_dispatch.min(p.batch - first))?;
                gpu.run(
                    entry.name,
                    kernel,
                    &[a_buf.raw(), b_buf.raw(), out.raw()],
                    &params(first)?,
                    [tiles[0], tiles[1], batches],
                )?;
            }
            Ok(())
        })?;
    }
    Ok(Tensor::from_storage(
        Storage::Device(Box::new(out)),
        a.dtype(),
        Device::Wgpu(index),
        &p.out_shape,
    ))
}
