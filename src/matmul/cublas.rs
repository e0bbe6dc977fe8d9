//! cuBLAS for `matmul` on CUDA (`preferred_blas_library`): one `cublasGemmStridedBatchedEx`
//! per product, with the compute type and math mode the precision flags ask for. The
//! library is loaded at run time; without it the generated kernels serve.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, OnceLock};

use cudarc::cublas::sys::{
    self, cublasComputeType_t as Compute, cublasMath_t, cublasOperation_t as Op,
    cudaDataType as Data,
};
use cudarc::driver::DevicePtr;
use half::f16;

use super::Problem;
use crate::cuda::matmul as flags;
use crate::cuda::memory::{Buffer, stream};
use crate::tensor::Tensor;
use crate::{DType, Error, Fp32Precision, Result};

/// Whether libcublas loads (probed once: cudarc panics on a missing library).
fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen libcublas by its standard names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A cuBLAS handle bound to one device's default stream.
struct Handle(sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one call at a time; every use goes
// through the mutex in `HANDLES`.
unsafe impl Send for Handle {}

static HANDLES: LazyLock<Mutex<HashMap<usize, Handle>>> = LazyLock::new(Default::default);

/// Why cuBLAS cannot serve products on device `ordinal`, or `None` when it can.
pub(super) fn why_unusable(ordinal: usize) -> Option<String> {
    if !library_present() {
        return Some("cuBLAS (libcublas.so) is not loadable here".into());
    }
    crate::cuda::memory::stream(ordinal)
        .err()
        .map(|e| e.to_string())
}

/// The operand as cuBLAS reads it (column-major): its pointer offset in elements, the
/// operation that turns the stored matrix into the operand, and its leading dimension. A
/// row-major view (column stride 1) is read as its transpose.
fn layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(Op, usize)> {
    if cs == 1 && rs >= cols.max(1) {
        Some((Op::CUBLAS_OP_N, rs))
    } else if rs == 1 && cs >= rows.max(1) {
        Some((Op::CUBLAS_OP_T, cs))
    } else {
        None
    }
}

/// The compute type and math mode for `dtype` under the flags, and what they mean.
fn compute(dtype: DType) -> (Data, Compute, cublasMath_t, &'static str) {
    let reduction = |allowed: bool| {
        if allowed {
            cublasMath_t::CUBLAS_DEFAULT_MATH
        } else {
            cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
        }
    };
    match dtype {
        DType::F16 if flags::allow_fp16_accumulation() => (
            Data::CUDA_R_16F,
            Compute::CUBLAS_COMPUTE_16F,
            reduction(flags::allow_fp16_reduced_precision_reduction()),
            "fp16 compute",
        ),
        DType::F16 => (
            Data::CUDA_R_16F,
            Compute::CUBLAS_COMPUTE_32F,
            reduction(flags::allow_fp16_reduced_precision_reduction()),
            "f32 compute",
        ),
        DType::Bf16 => (
            Data::CUDA_R_16BF,
            Compute::CUBLAS_COMPUTE_32F,
            reduction(flags::allow_bf16_reduced_precision_reduction()),
            "f32 compute",
        ),
        _ => match flags::fp32_precision_effective() {
            Fp32Precision::Tf32 => (
                Data::CUDA_R_32F,
                Compute::CUBLAS_COMPUTE_32F_FAST_TF32,
                cublasMath_t::CUBLAS_DEFAULT_MATH,
                "tf32 compute",
            ),
            Fp32Precision::Bf16 => (
                Data::CUDA_R_32F,
                Compute::CUBLAS_COMPUTE_32F_FAST_16BF,
                cublasMath_t::CUBLAS_DEFAULT_MATH,
                "bf16 compute",
            ),
            _ => (
                Data::CUDA_R_32F,
                Compute::CUBLAS_COMPUTE_32F,
                cublasMath_t::CUBLAS_DEFAULT_MATH,
                "ieee fp32 compute",
            ),
        },
    }
}

/// What the vendor call does for `dtype`, for the trace.
pub(super) fn note(dtype: DType) -> String {
    let (_, _, math, what) = compute(dtype);
    match math {
        cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION => {
            format!("{what}, reduced-precision reduction disallowed")
        }
        _ => what.into(),
    }
}

/// Whether cuBLAS takes these operand views (one stride 1 each, leading dimensions in range).
pub(super) fn takes(p: &Problem) -> bool {
    layout(p.m, p.k, p.a[1], p.a[2]).is_some() && layout(p.k, p.n, p.b[1], p.b[2]).is_some()
}

fn blas_error(call: &'static str) -> impl Fn(cudarc::cublas::result::CublasError) -> Error {
    move |e| Error::Driver {
        call,
        detail: format!("{e:?}"),
    }
}

/// `out = a · b` through cuBLAS on device `ordinal` (`out` holds batch x M x N elements).
/// The caller checked [`why_unusable`] and [`takes`].
pub(super) fn gemm(
    ordinal: usize,
    a: &Tensor,
    b: &Tensor,
    p: &Problem,
    out: &Buffer,
) -> Result<()> {
    let op = "matmul through cuBLAS";
    let int = |v: usize| crate::cuda::memory::int_arg(op, v);
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B is cuBLAS's first operand.
    let (b_op, ldb) = layout(p.k, p.n, p.b[1], p.b[2]).ok_or_else(|| unsupported(op))?;
    let (a_op, lda) = layout(p.m, p.k, p.a[1], p.a[2]).ok_or_else(|| unsupported(op))?;
    let dtype = a.dtype();
    let (data, compute, math, _) = compute(dtype);
    let stream = stream(ordinal)?;
    let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    let handle = match handles.get(&ordinal) {
        Some(handle) => handle.0,
        None => {
            crate::cuda::loader::context(ordinal)?
                .bind_to_thread()
                .map_err(|e| Error::Driver {
                    call: "cuCtxSetCurrent",
                    detail: format!("{e:?}"),
                })?;
            let handle =
                cudarc::cublas::result::create_handle().map_err(blas_error("cublasCreate"))?;
            // SAFETY: a fresh handle and the device's live default stream.
            unsafe { cudarc::cublas::result::set_stream(handle, stream.cu_stream() as _) }
                .map_err(blas_error("cublasSetStream"))?;
            handles.insert(ordinal, Handle(handle));
            handle
        }
    };
    // SAFETY: a live handle, used under the lock.
    unsafe { sys::cublasSetMathMode(handle, math) }
        .result()
        .map_err(blas_error("cublasSetMathMode"))?;
    let size = dtype.size();
    let (a_buf, b_buf) = (
        a.cuda_buffer().expect("a CUDA tensor has a buffer"),
        b.cuda_buffer().expect("a CUDA tensor has a buffer"),
    );
    let (a_view, b_view, c_view) = (
        a_buf.view(a.offset() * size),
        b_buf.view(b.offset() * size),
        out.view(0),
    );
    let (a_ptr, _a_sync) = a_view.device_ptr(&stream);
    let (b_ptr, _b_sync) = b_view.device_ptr(&stream);
    let (c_ptr, _c_sync) = c_view.device_ptr(&stream);
    // alpha = 1, beta = 0, in the compute type's scalar type.
    let (one16, zero16) = (f16::ONE, f16::ZERO);
    let (one32, zero32) = (1f32, 0f32);
    let (alpha, beta): (*const c_void, *const c_void) = if compute == Compute::CUBLAS_COMPUTE_16F {
        ((&raw const one16).cast(), (&raw const zero16).cast())
    } else {
        ((&raw const one32).cast(), (&raw const zero32).cast())
    };
    let stride = |s: usize| i64::try_from(s).expect("a buffer stride fits in 63 bits");
    // SAFETY: the pointers are the operands' and the output's device memory, which hold every
    // element the sizes, leading dimensions and batch strides reach (the tensors' own views,
    // checked by `layout`); alpha and beta live until the call returns; the handle is used
    // under the lock.
    unsafe {
        cudarc::cublas::result::gemm_strided_batched_ex(
            handle,
            b_op,
            a_op,
            int(p.n)?,
            int(p.m)?,
            int(p.k)?,
            alpha,
            b_ptr as *const c_void,
            data,
            int(ldb)?,
            stride(p.b[0]),
            a_ptr as *const c_void,
            data,
            int(lda)?,
            stride(p.a[0]),
            beta,
            c_ptr as *mut c_void,
            data,
            int(p.n)?,
            stride(p.m * p.n),
            int(p.batch)?,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(blas_error("cublasGemmStridedBatchedEx"))
}

fn unsupported(op: &'static str) -> Error {
    Error::ShapeMismatch {
        op,
        detail: "cuBLAS needs each operand with a unit row or column stride".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_and_transposed_views_map_to_cublas_operations() {
        // A 3 x 5 row-major matrix: read column-major as its transpose, ld 5.
        assert_eq!(layout(3, 5, 5, 1), Some((Op::CUBLAS_OP_N, 5)));
        // Its transposed view (5 x 3, strides 1 and 5).
        assert_eq!(layout(5, 3, 1, 5), Some((Op::CUBLAS_OP_T, 5)));
        // Neither stride is 1: cuBLAS cannot read it.
        assert_eq!(layout(3, 5, 10, 2), None);
    }

    #[test]
    fn the_flags_choose_compute_type_and_math_mode() {
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
        assert_eq!(compute(DType::F32).1, Compute::CUBLAS_COMPUTE_32F_FAST_TF32);
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        assert_eq!(compute(DType::F32).1, Compute::CUBLAS_COMPUTE_32F);
        let _r = flags::ALLOW_BF16_REDUCED_PRECISION_REDUCTION.guard_scoped(false);
        assert_eq!(
            compute(DType::Bf16).2,
            cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
        );
        let _a = flags::ALLOW_FP16_ACCUMULATION.guard_scoped(true);
        assert_eq!(compute(DType::F16).1, Compute::CUBLAS_COMPUTE_16F);
    }
}
