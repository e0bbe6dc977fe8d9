//! The vendor libraries for `matmul` on CUDA (`preferred_blas_library`): cuBLAS
//! (`cublasGemmStridedBatchedEx`) and cuBLASLt (`cublasLtMatmul` with its heuristic's
//! algorithm), each with the compute type and reduction rules the precision flags ask for.
//! Both are loaded at run time; without them the generated kernels serve.

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::sys as blas;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::DevicePtr;
use half::f16;

use super::blas::BlasBackend;
use super::{Problem, shapes};
use crate::core::precision::matmul as flags;
use crate::core::tensor::Tensor;
use crate::core::trace::{self, Call};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{int_arg, library_present};
use crate::{DType, Error, Fp32Precision, Result};

/// Which vendor library serves a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vendor {
    /// cuBLAS.
    Cublas,
    /// cuBLASLt.
    CublasLt,
}

impl Vendor {
    /// The library's name in traces.
    fn name(self) -> &'static str {
        match self {
            Vendor::Cublas => "cublas",
            Vendor::CublasLt => "cublaslt",
        }
    }

    /// Whether its shared library loads (probed once: cudarc panics on a missing one).
    fn present(self) -> bool {
        static CUBLAS: OnceLock<bool> = OnceLock::new();
        static CUBLASLT: OnceLock<bool> = OnceLock::new();
        match self {
            Vendor::Cublas => *CUBLAS.get_or_init(|| library_present!(blas::is_culib_present)),
            Vendor::CublasLt => *CUBLASLT.get_or_init(|| library_present!(lt::is_culib_present)),
        }
    }
}

/// Who serves a product after [`preferred`].
pub(super) enum Served {
    /// The vendor library ran it.
    Vendor,
    /// The generated kernels are to run it; why the preferred vendor library did not (for
    /// the trace), `None` when none was preferred.
    Generated(Option<String>),
}

/// Runs the product on the preferred library when it is a vendor one that loads and takes
/// the operands.
pub(super) fn preferred(
    library: BlasBackend,
    ordinal: usize,
    (a, b): (&Tensor, &Tensor),
    p: &Problem,
    out: &CudaBuffer,
) -> Result<Served> {
    let vendor = match library {
        BlasBackend::Cublas => Vendor::Cublas,
        BlasBackend::Cublaslt => Vendor::CublasLt,
        BlasBackend::Default | BlasBackend::Ck => return Ok(Served::Generated(None)),
    };
    let problem = if takes(p) {
        why_unusable(vendor, ordinal)
    } else {
        Some("the vendor BLAS needs unit-stride operands".to_string())
    };
    if problem.is_some() {
        return Ok(Served::Generated(problem));
    }
    let dtype = a.dtype();
    let describe = || Call {
        kernel: format!("{}_gemm_{dtype}", vendor.name()),
        backend: format!("cuda:{ordinal}/{}", vendor.name()),
        dtype,
        shapes: shapes(a, b),
        precision: note(dtype),
    };
    trace::kernel(describe, || gemm(vendor, ordinal, a, b, p, out))?;
    Ok(Served::Vendor)
}

/// cuBLASLt's workspace per device: what its heuristic may use (PyTorch's default size).
const LT_WORKSPACE: usize = 32 << 20;

/// cuBLASLt reduction schemes that keep partial sums in the compute type (in place, or in
/// compute-type buffers), leaving out the output type's (`CUBLASLT_REDUCTION_SCHEME_*`:
/// INPLACE = 1, COMPUTE_TYPE = 2, OUTPUT_TYPE = 4).
const REDUCE_IN_COMPUTE_TYPE: u32 = 1 | 2;

/// One device's library handles (and cuBLASLt's workspace), created on first use.
#[derive(Default)]
struct Handles {
    cublas: Option<blas::cublasHandle_t>,
    cublaslt: Option<(lt::cublasLtHandle_t, CudaBuffer)>,
}

// SAFETY: the handles may be used from any thread, one call at a time; every use goes
// through the mutex of the device's `DeviceHandles`.
unsafe impl Send for Handles {}

/// The handles of one device, kept with it ([`CudaDevice::state`]).
#[derive(Default)]
struct DeviceHandles(Mutex<Handles>);

/// Why `vendor` cannot serve products on device `ordinal`, or `None` when it can.
fn why_unusable(vendor: Vendor, ordinal: usize) -> Option<String> {
    if !vendor.present() {
        return Some(format!("{} is not loadable here", vendor.name()));
    }
    CudaDevice::get(ordinal)
        .and_then(|device| device.stream())
        .err()
        .map(|e| e.to_string())
}

/// How the libraries are asked to multiply, from the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Math {
    compute: Compute,
    /// Reduced-precision (16-bit) reductions allowed.
    reduced_reduction: bool,
}

/// The compute type, in words both libraries' enums are made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compute {
    F32,
    F32FastTf32,
    F32FastBf16,
    F16,
}

fn math(dtype: DType) -> Math {
    let (compute, reduced_reduction) = match dtype {
        DType::F16 => (
            if flags::allow_fp16_accumulation() {
                Compute::F16
            } else {
                Compute::F32
            },
            flags::allow_fp16_reduced_precision_reduction(),
        ),
        DType::Bf16 => (
            Compute::F32,
            flags::allow_bf16_reduced_precision_reduction(),
        ),
        _ => (
            match flags::fp32_precision_effective() {
                Fp32Precision::Tf32 => Compute::F32FastTf32,
                Fp32Precision::Bf16 => Compute::F32FastBf16,
                _ => Compute::F32,
            },
            true,
        ),
    };
    Math {
        compute,
        reduced_reduction,
    }
}

/// What the vendor call does for `dtype`, for the trace.
fn note(dtype: DType) -> String {
    let m = math(dtype);
    let what = match m.compute {
        Compute::F32 if dtype == DType::F32 => "ieee fp32 compute",
        Compute::F32 => "f32 compute",
        Compute::F32FastTf32 => "tf32 compute",
        Compute::F32FastBf16 => "bf16 compute",
        Compute::F16 => "fp16 compute",
    };
    if m.reduced_reduction {
        what.into()
    } else {
        format!("{what}, reduced-precision reduction disallowed")
    }
}

fn blas_compute(c: Compute) -> blas::cublasComputeType_t {
    use blas::cublasComputeType_t as T;
    match c {
        Compute::F32 => T::CUBLAS_COMPUTE_32F,
        Compute::F32FastTf32 => T::CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::F32FastBf16 => T::CUBLAS_COMPUTE_32F_FAST_16BF,
        Compute::F16 => T::CUBLAS_COMPUTE_16F,
    }
}

fn lt_compute(c: Compute) -> lt::cublasComputeType_t {
    use lt::cublasComputeType_t as T;
    match c {
        Compute::F32 => T::CUBLAS_COMPUTE_32F,
        Compute::F32FastTf32 => T::CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::F32FastBf16 => T::CUBLAS_COMPUTE_32F_FAST_16BF,
        Compute::F16 => T::CUBLAS_COMPUTE_16F,
    }
}

fn blas_data(dtype: DType) -> blas::cudaDataType {
    match dtype {
        DType::F16 => blas::cudaDataType::CUDA_R_16F,
        DType::Bf16 => blas::cudaDataType::CUDA_R_16BF,
        _ => blas::cudaDataType::CUDA_R_32F,
    }
}

fn lt_data(dtype: DType) -> lt::cudaDataType {
    match dtype {
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::Bf16 => lt::cudaDataType::CUDA_R_16BF,
        _ => lt::cudaDataType::CUDA_R_32F,
    }
}

/// The operand as the libraries read it (column-major): whether it is read transposed, and
/// its leading dimension. A row-major view (column stride 1) is read as its transpose.
fn layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(bool, usize)> {
    if cs == 1 && rs >= cols.max(1) {
        Some((false, rs))
    } else if rs == 1 && cs >= rows.max(1) {
        Some((true, cs))
    } else {
        None
    }
}

/// Whether the vendor libraries take these operand views (a unit stride each, leading
/// dimensions in range).
fn takes(p: &Problem) -> bool {
    layout(p.m, p.k, p.a[1], p.a[2]).is_some() && layout(p.k, p.n, p.b[1], p.b[2]).is_some()
}

fn error(call: &'static str) -> impl Fn(cudarc::cublas::result::CublasError) -> Error {
    move |e| Error::Driver {
        call,
        detail: format!("{e:?}"),
    }
}

fn lt_error(call: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> Error {
    move |e| Error::Driver {
        call,
        detail: format!("{e:?}"),
    }
}

/// The product as the column-major libraries see it: row-major C = A·B is column-major
/// Cᵀ = Bᵀ·Aᵀ, so B is their first operand. Each operand: (transposed, leading dim).
struct Operands {
    first: (bool, usize),
    second: (bool, usize),
}

fn operands(p: &Problem) -> Result<Operands> {
    let unsupported = || Error::ShapeMismatch {
        op: "matmul through the vendor BLAS",
        detail: "each operand needs a unit row or column stride".into(),
    };
    Ok(Operands {
        first: layout(p.k, p.n, p.b[1], p.b[2]).ok_or_else(unsupported)?,
        second: layout(p.m, p.k, p.a[1], p.a[2]).ok_or_else(unsupported)?,
    })
}

/// `out = a · b` through `vendor` on device `ordinal` (`out` holds batch x M x N elements).
/// The caller checked [`why_unusable`] and [`takes`].
fn gemm(
    vendor: Vendor,
    ordinal: usize,
    a: &Tensor,
    b: &Tensor,
    p: &Problem,
    out: &CudaBuffer,
) -> Result<()> {
    let ops = operands(p)?;
    let dtype = a.dtype();
    let device = CudaDevice::get(ordinal)?;
    let stream = device.stream()?;
    device.bind()?;
    let mut handles = device
        .state::<DeviceHandles>()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let size = dtype.size();
    let (a_view, b_view, c_view) = (
        a.cuda_buffer()
            .expect("a CUDA tensor has a buffer")
            .driver_view(a.offset() * size)?,
        b.cuda_buffer()
            .expect("a CUDA tensor has a buffer")
            .driver_view(b.offset() * size)?,
        out.driver_view(0)?,
    );
    let (a_ptr, _a_sync) = a_view.device_ptr(&stream);
    let (b_ptr, _b_sync) = b_view.device_ptr(&stream);
    let (c_ptr, _c_sync) = c_view.device_ptr(&stream);
    let m = math(dtype);
    // alpha = 1, beta = 0, in the compute type's scalar type.
    let (one16, zero16, one32, zero32) = (f16::ONE, f16::ZERO, 1f32, 0f32);
    let (alpha, beta): (*const c_void, *const c_void) = if m.compute == Compute::F16 {
        ((&raw const one16).cast(), (&raw const zero16).cast())
    } else {
        ((&raw const one32).cast(), (&raw const zero32).cast())
    };
    let product = Product {
        p,
        ops,
        dtype,
        math: m,
        pointers: [b_ptr, a_ptr, c_ptr],
        scalars: (alpha, beta),
    };
    match vendor {
        Vendor::Cublas => {
            let handle = match handles.cublas {
                Some(handle) => handle,
                None => {
                    let handle =
                        cudarc::cublas::result::create_handle().map_err(error("cublasCreate"))?;
                    // SAFETY: a fresh handle and the device's live default stream.
                    unsafe { cudarc::cublas::result::set_stream(handle, stream.cu_stream() as _) }
                        .map_err(error("cublasSetStream"))?;
                    handles.cublas = Some(handle);
                    handle
                }
            };
            run_cublas(handle, &product)
        }
        Vendor::CublasLt => {
            if handles.cublaslt.is_none() {
                let handle = cudarc::cublaslt::result::create_handle()
                    .map_err(lt_error("cublasLtCreate"))?;
                handles.cublaslt = Some((handle, CudaBuffer::zeroed(ordinal, LT_WORKSPACE)?));
            }
            let (handle, workspace) = handles.cublaslt.as_ref().expect("created above");
            let workspace = workspace.driver_view(0)?;
            let (w_ptr, _w_sync) = workspace.device_ptr(&stream);
            let stream_ptr = stream.cu_stream() as lt::cudaStream_t;
            run_cublaslt(*handle, (w_ptr, stream_ptr), &product)
        }
    }
}

/// One product as both libraries take it.
struct Product<'a> {
    p: &'a Problem,
    ops: Operands,
    dtype: DType,
    math: Math,
    /// Device addresses of B, A and C (see [`Operands`]).
    pointers: [u64; 3],
    /// Host addresses of alpha and beta, in the compute type's scalar type.
    scalars: (*const c_void, *const c_void),
}

/// One `cublasGemmStridedBatchedEx`.
fn run_cublas(handle: blas::cublasHandle_t, product: &Product) -> Result<()> {
    let &Product {
        p,
        ref ops,
        dtype,
        math: m,
        pointers: [first, second, c],
        scalars: (alpha, beta),
    } = product;
    let op = "matmul through cuBLAS";
    let int = |v: usize| int_arg(op, v);
    let trans = |t: bool| {
        if t {
            blas::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let mode = if m.reduced_reduction {
        blas::cublasMath_t::CUBLAS_DEFAULT_MATH
    } else {
        blas::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
    };
    // SAFETY: a live handle, used under the lock.
    unsafe { blas::cublasSetMathMode(handle, mode) }
        .result()
        .map_err(error("cublasSetMathMode"))?;
    let data = blas_data(dtype);
    // SAFETY: the pointers are the operands' and the output's device memory, which hold every
    // element the sizes, leading dimensions and batch strides reach (the tensors' own views,
    // checked by `layout`); alpha and beta live until the call returns; the handle is used
    // under the lock.
    unsafe {
        cudarc::cublas::result::gemm_strided_batched_ex(
            handle,
            trans(ops.first.0),
            trans(ops.second.0),
            int(p.n)?,
            int(p.m)?,
            int(p.k)?,
            alpha,
            first as *const c_void,
            data,
            int(ops.first.1)?,
            long(p.b[0]),
            second as *const c_void,
            data,
            int(ops.second.1)?,
            long(p.a[0]),
            beta,
            c as *mut c_void,
            data,
            int(p.n)?,
            long(p.m * p.n),
            int(p.batch)?,
            blas_compute(m.compute),
            blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(error("cublasGemmStridedBatchedEx"))
}

fn long(v: usize) -> i64 {
    i64::try_from(v).expect("a buffer stride fits in 63 bits")
}

/// cuBLASLt descriptors, destroyed on drop.
struct LtObjects {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: Vec<lt::cublasLtMatrixLayout_t>,
    pref: Option<lt::cublasLtMatmulPreference_t>,
}

impl Drop for LtObjects {
    fn drop(&mut self) {
        // SAFETY: each object was created once by cuBLASLt and is destroyed once, here;
        // a failure leaves nothing to undo.
        unsafe {
            let _ = cudarc::cublaslt::result::destroy_matmul_desc(self.desc);
            for &layout in &self.layouts {
                let _ = cudarc::cublaslt::result::destroy_matrix_layout(layout);
            }
            if let Some(pref) = self.pref {
                let _ = cudarc::cublaslt::result::destroy_matmul_pref(pref);
            }
        }
    }
}

/// Sets one cuBLASLt attribute to `value` through `set` (a descriptor's setter, given the
/// value's address and size).
fn attribute<T>(
    call: &'static str,
    value: &T,
    set: impl FnOnce(*const c_void, usize) -> Result<(), cudarc::cublaslt::result::CublasError>,
) -> Result<()> {
    set((value as *const T).cast(), size_of::<T>()).map_err(lt_error(call))
}

/// One `cublasLtMatmul` with the heuristic's best algorithm, `workspace` holding
/// [`LT_WORKSPACE`] bytes.
fn run_cublaslt(
    handle: lt::cublasLtHandle_t,
    (workspace, stream): (u64, lt::cudaStream_t),
    product: &Product,
) -> Result<()> {
    let (p, ops, dtype, m) = (product.p, &product.ops, product.dtype, product.math);
    let ([first, second, c], (alpha, beta)) = (product.pointers, product.scalars);
    use cudarc::cublaslt::result as r;
    let scale_type = if m.compute == Compute::F16 {
        lt::cudaDataType::CUDA_R_16F
    } else {
        lt::cudaDataType::CUDA_R_32F
    };
    let desc = r::create_matmul_desc(lt_compute(m.compute), scale_type)
        .map_err(lt_error("cublasLtMatmulDescCreate"))?;
    let mut objects = LtObjects {
        desc,
        layouts: Vec::new(),
        pref: None,
    };
    let data = lt_data(dtype);
    // Stored matrices (before the operation): the first is n x k (or k x n transposed), the
    // second k x m (or m x k), C n x m; each with its batch count and stride.
    let stored = |(t, ld): (bool, usize), rows: usize, cols: usize| {
        let (r, c) = if t { (cols, rows) } else { (rows, cols) };
        (r as u64, c as u64, ld as i64)
    };
    let shapes = [
        (stored(ops.first, p.n, p.k), p.b[0]),
        (stored(ops.second, p.k, p.m), p.a[0]),
        (((p.n as u64), (p.m as u64), p.n as i64), p.m * p.n),
    ];
    let batch = int_arg("matmul through cuBLASLt", p.batch)?;
    for ((rows, cols, ld), batch_stride) in shapes {
        let layout = r::create_matrix_layout(data, rows, cols, ld)
            .map_err(lt_error("cublasLtMatrixLayoutCreate"))?;
        objects.layouts.push(layout);
        use lt::cublasLtMatrixLayoutAttribute_t as L;
        // SAFETY: a live layout; each attribute gets a value of its documented type.
        let set = |attribute, value: *const c_void, size| unsafe {
            r::set_matrix_layout_attribute(layout, attribute, value, size)
        };
        attribute("cublasLtMatrixLayoutSetAttribute", &batch, |v, n| {
            set(L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, v, n)
        })?;
        attribute(
            "cublasLtMatrixLayoutSetAttribute",
            &long(batch_stride),
            |v, n| set(L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, v, n),
        )?;
    }
    // cublasOperation_t (32 bits): 0 = N, 1 = T.
    use lt::cublasLtMatmulDescAttributes_t as D;
    for (which, transposed) in [
        (D::CUBLASLT_MATMUL_DESC_TRANSA, ops.first.0),
        (D::CUBLASLT_MATMUL_DESC_TRANSB, ops.second.0),
    ] {
        attribute(
            "cublasLtMatmulDescSetAttribute",
            &i32::from(transposed),
            |v, n| {
                // SAFETY: a live descriptor; the transpose attributes take a 32-bit operation.
                unsafe { r::set_matmul_desc_attribute(desc, which, v, n) }
            },
        )?;
    }
    let pref = r::create_matmul_pref().map_err(lt_error("cublasLtMatmulPreferenceCreate"))?;
    objects.pref = Some(pref);
    use lt::cublasLtMatmulPreferenceAttributes_t as P;
    // SAFETY: a live preference; the attributes take a u64 size and a u32 mask.
    let set = |which, value: *const c_void, size| unsafe {
        r::set_matmul_pref_attribute(pref, which, value, size)
    };
    attribute(
        "cublasLtMatmulPreferenceSetAttribute",
        &(LT_WORKSPACE as u64),
        |v, n| set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, v, n),
    )?;
    if !m.reduced_reduction {
        attribute(
            "cublasLtMatmulPreferenceSetAttribute",
            &REDUCE_IN_COMPUTE_TYPE,
            |v, n| set(P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, v, n),
        )?;
    }
    let [a_layout, b_layout, c_layout] =
        [objects.layouts[0], objects.layouts[1], objects.layouts[2]];
    // SAFETY: live handle, descriptor, layouts and preference.
    let heuristic = unsafe {
        r::get_matmul_algo_heuristic(handle, desc, a_layout, b_layout, c_layout, c_layout, pref)
    }
    .map_err(lt_error("cublasLtMatmulAlgoGetHeuristic"))?;
    // SAFETY: the pointers are the operands' and the output's device memory, which hold every
    // element the layouts reach (the tensors' own views, checked by `layout`); the workspace
    // holds LT_WORKSPACE bytes, the most the preference allowed; alpha and beta live until
    // the call returns; the handle is used under the lock.
    unsafe {
        r::matmul(
            handle,
            desc,
            alpha,
            beta,
            first as *const c_void,
            a_layout,
            second as *const c_void,
            b_layout,
            c as *const c_void,
            c_layout,
            c as *mut c_void,
            c_layout,
            &raw const heuristic.algo,
            workspace as *mut c_void,
            heuristic.workspaceSize,
            stream,
        )
    }
    .map_err(lt_error("cublasLtMatmul"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_and_transposed_views_map_to_column_major_operands() {
        // A 3 x 5 row-major matrix: read column-major as its transpose, ld 5.
        assert_eq!(layout(3, 5, 5, 1), Some((false, 5)));
        // Its transposed view (5 x 3, strides 1 and 5).
        assert_eq!(layout(5, 3, 1, 5), Some((true, 5)));
        // Neither stride is 1: the libraries cannot read it.
        assert_eq!(layout(3, 5, 10, 2), None);
    }

    #[test]
    fn the_flags_choose_compute_type_and_reduction() {
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Tf32);
        assert_eq!(math(DType::F32).compute, Compute::F32FastTf32);
        let _p = flags::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        assert_eq!(math(DType::F32).compute, Compute::F32);
        let _r = flags::ALLOW_BF16_REDUCED_PRECISION_REDUCTION.guard_scoped(false);
        assert!(!math(DType::Bf16).reduced_reduction);
        assert!(note(DType::Bf16).contains("disallowed"));
        let _a = flags::ALLOW_FP16_ACCUMULATION.guard_scoped(true);
        assert_eq!(math(DType::F16).compute, Compute::F16);
        assert_eq!(
            blas_compute(Compute::F16),
            blas::cublasComputeType_t::CUBLAS_COMPUTE_16F
        );
        assert_eq!(
            lt_compute(Compute::F32FastBf16),
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF
        );
    }
}
