//! cuDNN's fused attention (`SdpBackend::Cudnn` on CUDA tensors) through cuDNN's backend
//! graph API. The call is described as one operation graph — S = Q·Kᵀ, S·scale, the causal
//! mask (top-left aligned, as PyTorch's), softmax with its log-sum-exp, dropout from cuDNN's
//! Philox generator, P·V — for which cuDNN's heuristics pick a fused (flash) engine. The
//! finalized plan is kept per device and shape, so a repeated call only binds pointers.
//! With `cudnn::benchmark` on, the first call of a shape times the heuristics' first
//! `cudnn::benchmark_limit` plans (0: every one) on its own tensors and keeps the fastest.
//!
//! cuDNN draws dropout from its own Philox generator at the seed and offset of the call's
//! generator draw (`SdpaOptions::generator`): the same draw drops the same weights run to
//! run, but not the ones the other backends drop.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::DevicePtr;

use super::{Job, SdpaOutput};
use crate::core::sdp::SdpBackend;
use crate::core::tensor::Tensor;
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{DType, Error, Result};

use dnn::cudnnBackendAttributeName_t as A;
use dnn::cudnnBackendAttributeType_t as T;
use dnn::cudnnBackendDescriptorType_t as D;
use dnn::cudnnDataType_t as Data;

const OP: &str = "scaled_dot_product_attention through cuDNN";

/// Whether cuDNN's shared library loads (probed once: cudarc panics on a missing one).
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen libcudnn by its standard names.
    *PRESENT.get_or_init(|| unsafe { dnn::is_culib_present() })
}

/// cuDNN's message for the last failed call on this thread.
fn last_error() -> String {
    let mut text = [0 as c_char; 1024];
    // SAFETY: cuDNN writes at most `text.len()` bytes, NUL-terminated, into `text`.
    unsafe { dnn::cudnnGetLastErrorString(text.as_mut_ptr(), text.len()) };
    // SAFETY: the buffer is NUL-terminated (zeroed, and cuDNN terminates what it writes).
    unsafe { CStr::from_ptr(text.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `status` as a result: an error names the call, what it was about and cuDNN's message.
fn check(status: dnn::cudnnStatus_t, call: &'static str, what: &dyn std::fmt::Debug) -> Result<()> {
    if status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    Err(Error::Driver {
        call,
        detail: format!("{what:?}: {status:?} ({})", last_error()),
    })
}

/// One backend descriptor, destroyed on drop.
struct Desc(dnn::cudnnBackendDescriptor_t);

// SAFETY: a descriptor is a host-side object; once finalized it is only read, and plans are
// executed under the device's lock.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: the descriptor was created by cudnnBackendCreateDescriptor and is dropped once.
        unsafe { dnn::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: D) -> Result<Desc> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: cuDNN writes one descriptor handle into `raw`.
        let status = unsafe { dnn::cudnnBackendCreateDescriptor(kind, &mut raw) };
        check(status, "cudnnBackendCreateDescriptor", &kind)?;
        Ok(Desc(raw))
    }

    /// Sets attribute `name` to `values`, which must be of the C type `ty` names.
    ///
    /// # Safety
    /// `V` must be the representation of `ty` (e.g. `i64` for `CUDNN_TYPE_INT64`).
    unsafe fn set_raw<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `values` holds `values.len()` elements of the type `ty` (the caller's
        // promise); cuDNN copies them.
        let status = unsafe {
            dnn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        };
        check(status, "cudnnBackendSetAttribute", &name)
    }

    fn ints(&self, name: A, values: &[i64]) -> Result<&Self> {
        // SAFETY: i64 is CUDNN_TYPE_INT64.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_INT64, values) }?;
        Ok(self)
    }

    fn flag(&self, name: A, value: bool) -> Result<&Self> {
        // SAFETY: Rust's bool is C's bool, CUDNN_TYPE_BOOLEAN.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_BOOLEAN, &[value]) }?;
        Ok(self)
    }

    fn data_type(&self, name: A, value: Data) -> Result<&Self> {
        // SAFETY: cudnnDataType_t is CUDNN_TYPE_DATA_TYPE.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_DATA_TYPE, &[value]) }?;
        Ok(self)
    }

    fn descs(&self, name: A, values: &[&Desc]) -> Result<&Self> {
        let raw: Vec<_> = values.iter().map(|d| d.0).collect();
        // SAFETY: descriptor handles are CUDNN_TYPE_BACKEND_DESCRIPTOR.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }?;
        Ok(self)
    }

    fn finalize(self) -> Result<Desc> {
        // SAFETY: a live descriptor with its required attributes set.
        let status = unsafe { dnn::cudnnBackendFinalize(self.0) };
        check(status, "cudnnBackendFinalize", &"descriptor")?;
        Ok(self)
    }
}

/// The unique ids the caller binds pointers to; virtual tensors count up from `VIRTUAL`.
mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const SCALE: i64 = 6;
    pub const MASKED: i64 = 7;
    pub const SEED: i64 = 8;
    pub const OFFSET: i64 = 9;
    pub const DROP_SCALE: i64 = 10;
    pub const VIRTUAL: i64 = 100;
}

/// Everything a plan is built for: the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Spec {
    dtype: DType,
    /// `[B, H, Lq, Lk, D, Dv]`.
    sizes: [i64; 6],
    /// q, k and v strides as `[B, H, L, D]`.
    strides: [[i64; 4]; 3],
    /// q, k and v pointer alignments in bytes (at most 16).
    align: [i64; 3],
    causal: bool,
    /// The dropout probability's bits, when dropout is on.
    dropout: Option<u64>,
}

/// Whether a tensor of `kind` is bound by device pointer, by host value, or never bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Device(i64),
    ByValue(i64),
    Virtual,
}

/// An operation graph under construction: its tensors and operations, in order.
struct Graph {
    tensors: Vec<Desc>,
    ops: Vec<Desc>,
    next_uid: i64,
}

/// A tensor of a [`Graph`] (an index into its tensors).
#[derive(Clone, Copy)]
struct Node(usize);

fn contiguous(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

impl Graph {
    fn tensor(
        &mut self,
        dtype: Data,
        dims: [i64; 4],
        strides: [i64; 4],
        kind: Kind,
        align: i64,
    ) -> Result<Node> {
        let uid = match kind {
            Kind::Device(uid) | Kind::ByValue(uid) => uid,
            Kind::Virtual => {
                self.next_uid += 1;
                self.next_uid
            }
        };
        let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        t.data_type(A::CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?
            .ints(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims)?
            .ints(A::CUDNN_ATTR_TENSOR_STRIDES, &strides)?
            .ints(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?
            .ints(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[align])?
            .flag(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, kind == Kind::Virtual)?
            .flag(
                A::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                matches!(kind, Kind::ByValue(_)),
            )?;
        self.tensors.push(t.finalize()?);
        Ok(Node(self.tensors.len() - 1))
    }

    /// An intermediate tensor, laid out contiguously.
    fn virt(&mut self, dtype: Data, dims: [i64; 4]) -> Result<Node> {
        self.tensor(dtype, dims, contiguous(dims), Kind::Virtual, 16)
    }

    /// A scalar passed by host value under id `uid`.
    fn scalar(&mut self, uid: i64) -> Result<Node> {
        self.tensor(
            Data::CUDNN_DATA_FLOAT,
            [1; 4],
            [1; 4],
            Kind::ByValue(uid),
            16,
        )
    }

    /// `out = mode(inputs…)` computed in `compute`; `axis` for `GEN_INDEX`.
    fn pointwise(
        &mut self,
        mode: dnn::cudnnPointwiseMode_t,
        inputs: &[Node],
        out: Node,
        compute: Data,
        axis: Option<i64>,
    ) -> Result<()> {
        let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        // SAFETY: cudnnPointwiseMode_t is CUDNN_TYPE_POINTWISE_MODE.
        unsafe {
            pw.set_raw(
                A::CUDNN_ATTR_POINTWISE_MODE,
                T::CUDNN_TYPE_POINTWISE_MODE,
                &[mode],
            )
        }?;
        pw.data_type(A::CUDNN_ATTR_POINTWISE_MATH_PREC, compute)?;
        if let Some(axis) = axis {
            pw.ints(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        let slots = [
            A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        for (slot, input) in slots.into_iter().zip(inputs) {
            op.descs(slot, &[&self.tensors[input.0]])?;
        }
        op.descs(
            A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
            &[&self.tensors[out.0]],
        )?;
        self.ops.push(op.finalize()?);
        self.tensors.push(pw);
        Ok(())
    }

    /// A virtual FLOAT `mode(inputs…)` of the shape `dims`.
    fn apply(
        &mut self,
        mode: dnn::cudnnPointwiseMode_t,
        inputs: &[Node],
        dims: [i64; 4],
    ) -> Result<Node> {
        let out = self.virt(Data::CUDNN_DATA_FLOAT, dims)?;
        self.pointwise(mode, inputs, out, Data::CUDNN_DATA_FLOAT, None)?;
        Ok(out)
    }

    /// `c = a · b` (batched over the first two dimensions), accumulated in f32.
    fn matmul(&mut self, a: Node, b: Node, c: Node) -> Result<()> {
        let mm = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.data_type(A::CUDNN_ATTR_MATMUL_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        let mm = mm.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[&self.tensors[a.0]])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[&self.tensors[b.0]])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[&self.tensors[c.0]])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        self.ops.push(op.finalize()?);
        self.tensors.push(mm);
        Ok(())
    }

    /// `y = reduce(x)` over the dimensions where `y` has size 1, in f32.
    fn reduce(&mut self, reduction: dnn::cudnnReduceTensorOp_t, x: Node, y: Node) -> Result<()> {
        let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        // SAFETY: cudnnReduceTensorOp_t is CUDNN_TYPE_REDUCTION_OPERATOR_TYPE.
        unsafe {
            r.set_raw(
                A::CUDNN_ATTR_REDUCTION_OPERATOR,
                T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                &[reduction],
            )
        }?;
        r.data_type(A::CUDNN_ATTR_REDUCTION_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        let r = r.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.descs(
            A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
            &[&self.tensors[x.0]],
        )?
        .descs(
            A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
            &[&self.tensors[y.0]],
        )?
        .descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&r])?;
        self.ops.push(op.finalize()?);
        self.tensors.push(r);
        Ok(())
    }

    /// `y` = Bernoulli draws (1 with probability `keep`) from Philox at `seed`, `offset`.
    fn bernoulli(&mut self, keep: f64, y: Node, seed: Node, offset: Node) -> Result<()> {
        let rng = Desc::new(D::CUDNN_BACKEND_RNG_DESCRIPTOR)?;
        let bernoulli = dnn::cudnnRngDistribution_t::CUDNN_RNG_DISTRIBUTION_BERNOULLI;
        // SAFETY: cudnnRngDistribution_t is CUDNN_TYPE_RNG_DISTRIBUTION, f64 is CUDNN_TYPE_DOUBLE.
        unsafe {
            rng.set_raw(
                A::CUDNN_ATTR_RNG_DISTRIBUTION,
                T::CUDNN_TYPE_RNG_DISTRIBUTION,
                &[bernoulli],
            )?;
            rng.set_raw(
                A::CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY,
                T::CUDNN_TYPE_DOUBLE,
                &[keep],
            )?;
        }
        let rng = rng.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_RNG_YDESC, &[&self.tensors[y.0]])?
            .descs(A::CUDNN_ATTR_OPERATION_RNG_SEED, &[&self.tensors[seed.0]])?
            .descs(
                A::CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC,
                &[&self.tensors[offset.0]],
            )?
            .descs(A::CUDNN_ATTR_OPERATION_RNG_DESC, &[&rng])?;
        self.ops.push(op.finalize()?);
        self.tensors.push(rng);
        Ok(())
    }
}

fn io_type(dtype: DType) -> Result<Data> {
    match dtype {
        DType::F16 => Ok(Data::CUDNN_DATA_HALF),
        DType::Bf16 => Ok(Data::CUDNN_DATA_BFLOAT16),
        got => Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::F16,
            got,
        }),
    }
}

/// The attention of `spec` as cuDNN operations, every descriptor finalized.
fn attention_graph(spec: &Spec) -> Result<Graph> {
    use dnn::cudnnPointwiseMode_t as P;
    let io = io_type(spec.dtype)?;
    let [b, h, lq, lk, d, dv] = spec.sizes;
    let [qs, ks, vs] = spec.strides;
    let [qa, ka, va] = spec.align;
    let mut g = Graph {
        tensors: Vec::new(),
        ops: Vec::new(),
        next_uid: uid::VIRTUAL,
    };
    let q = g.tensor(io, [b, h, lq, d], qs, Kind::Device(uid::Q), qa)?;
    // Kᵀ: the key tensor read with its last two dimensions swapped.
    let kt = g.tensor(
        io,
        [b, h, d, lk],
        [ks[0], ks[1], ks[3], ks[2]],
        Kind::Device(uid::K),
        ka,
    )?;
    let v = g.tensor(io, [b, h, lk, dv], vs, Kind::Device(uid::V), va)?;
    let scores = [b, h, lq, lk];
    let rows = [b, h, lq, 1];

    let s = g.virt(Data::CUDNN_DATA_FLOAT, scores)?;
    g.matmul(q, kt, s)?;
    let scale = g.scalar(uid::SCALE)?;
    let mut s = g.apply(P::CUDNN_POINTWISE_MUL, &[s, scale], scores)?;
    if spec.causal {
        let row = g.virt(Data::CUDNN_DATA_INT32, scores)?;
        g.pointwise(
            P::CUDNN_POINTWISE_GEN_INDEX,
            &[s],
            row,
            Data::CUDNN_DATA_FLOAT,
            Some(2),
        )?;
        let col = g.virt(Data::CUDNN_DATA_INT32, scores)?;
        g.pointwise(
            P::CUDNN_POINTWISE_GEN_INDEX,
            &[s],
            col,
            Data::CUDNN_DATA_FLOAT,
            Some(3),
        )?;
        let keep = g.virt(Data::CUDNN_DATA_BOOLEAN, scores)?;
        g.pointwise(
            P::CUDNN_POINTWISE_CMP_GE,
            &[row, col],
            keep,
            Data::CUDNN_DATA_BOOLEAN,
            None,
        )?;
        let masked = g.scalar(uid::MASKED)?;
        s = g.apply(P::CUDNN_POINTWISE_BINARY_SELECT, &[s, masked, keep], scores)?;
    }

    // Softmax, with the log-sum-exp (max + log(sum)) as the stats output.
    let max = g.virt(Data::CUDNN_DATA_FLOAT, rows)?;
    g.reduce(dnn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX, s, max)?;
    let shifted = g.apply(P::CUDNN_POINTWISE_SUB, &[s, max], scores)?;
    let e = g.apply(P::CUDNN_POINTWISE_EXP, &[shifted], scores)?;
    let sum = g.virt(Data::CUDNN_DATA_FLOAT, rows)?;
    g.reduce(dnn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
    let log_sum = g.apply(P::CUDNN_POINTWISE_LOG, &[sum], rows)?;
    let stats = g.tensor(
        Data::CUDNN_DATA_FLOAT,
        rows,
        contiguous(rows),
        Kind::Device(uid::STATS),
        16,
    )?;
    g.pointwise(
        P::CUDNN_POINTWISE_ADD,
        &[max, log_sum],
        stats,
        Data::CUDNN_DATA_FLOAT,
        None,
    )?;

    // The weights P feed the second product in the input type, as cuDNN's engines require.
    let p = match spec.dropout {
        None => {
            let p = g.virt(io, scores)?;
            g.pointwise(
                P::CUDNN_POINTWISE_DIV,
                &[e, sum],
                p,
                Data::CUDNN_DATA_FLOAT,
                None,
            )?;
            p
        }
        Some(bits) => {
            let weights = g.apply(P::CUDNN_POINTWISE_DIV, &[e, sum], scores)?;
            let one = [1; 4];
            let seed = g.tensor(Data::CUDNN_DATA_INT64, one, one, Kind::Device(uid::SEED), 8)?;
            let offset = g.tensor(
                Data::CUDNN_DATA_INT64,
                one,
                one,
                Kind::Device(uid::OFFSET),
                8,
            )?;
            let kept = g.virt(Data::CUDNN_DATA_FLOAT, scores)?;
            g.bernoulli(1.0 - f64::from_bits(bits), kept, seed, offset)?;
            let dropped = g.apply(P::CUDNN_POINTWISE_MUL, &[weights, kept], scores)?;
            let rescale = g.scalar(uid::DROP_SCALE)?;
            let p = g.virt(io, scores)?;
            g.pointwise(
                P::CUDNN_POINTWISE_MUL,
                &[dropped, rescale],
                p,
                Data::CUDNN_DATA_FLOAT,
                None,
            )?;
            p
        }
    };
    let o_dims = [b, h, lq, dv];
    let o = g.tensor(io, o_dims, contiguous(o_dims), Kind::Device(uid::O), 16)?;
    g.matmul(p, v, o)?;
    Ok(g)
}

/// The descriptors a plan was built from, kept alive with it.
struct Sources {
    _graph: Graph,
    _op_graph: Desc,
    _heuristics: Desc,
    _configs: Vec<Desc>,
}

/// A finalized execution plan and the workspace it needs.
struct Plan {
    plan: Desc,
    workspace: usize,
    _sources: Rc<Sources>,
}

/// One device's cuDNN handle and plans, used under the lock of its [`CudnnDevice`].
struct DeviceState {
    handle: dnn::cudnnHandle_t,
    plans: HashMap<Spec, Plan>,
}

// SAFETY: the handle and plans are used from one thread at a time, under the device's
// lock; the `Rc`s a plan holds are shared only with plans built in the same call, which are
// kept in the same state or dropped before the lock is released.
unsafe impl Send for DeviceState {}

/// cuDNN's state on one device (created on first use), kept with the device
/// ([`CudaDevice::state`]).
#[derive(Default)]
struct CudnnDevice(Mutex<Option<DeviceState>>);

/// Plans kept per device before the cache starts over.
const PLANS_PER_DEVICE: usize = 64;

/// Timed runs per candidate plan when `cudnn::benchmark` is on (after one warm-up run).
const BENCHMARK_RUNS: usize = 3;

fn get_int(desc: &Desc, name: A) -> Result<i64> {
    let (mut value, mut n) = (0i64, 0i64);
    // SAFETY: reads one int64 attribute into `value`.
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            desc.0,
            name,
            T::CUDNN_TYPE_INT64,
            1,
            &mut n,
            (&raw mut value).cast(),
        )
    };
    check(status, "cudnnBackendGetAttribute", &name)?;
    Ok(value)
}

/// Plans for `spec` on `handle`, in the order of cuDNN's heuristics: the first `wanted`
/// engine configurations that build (at least one, or an error naming why none did).
fn build_plans(handle: dnn::cudnnHandle_t, spec: &Spec, wanted: usize) -> Result<Vec<Plan>> {
    let graph = attention_graph(spec)?;
    let og = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let ops: Vec<&Desc> = graph.ops.iter().collect();
    og.descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    // SAFETY: a cudnnHandle_t is CUDNN_TYPE_HANDLE.
    unsafe {
        og.set_raw(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )
    }?;
    let og = og.finalize()?;

    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&og])?;
    let mode = dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A;
    // SAFETY: cudnnBackendHeurMode_t is CUDNN_TYPE_HEUR_MODE.
    unsafe {
        heur.set_raw(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[mode],
        )
    }?;
    let heur = heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: asks only for the number of results (no elements are written).
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    };
    check(
        status,
        "cudnnBackendGetAttribute",
        &A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
    )?;
    let configs = (0..count)
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<_> = configs.iter().map(|c| c.0).collect();
    let mut written = 0i64;
    // SAFETY: `raw` holds `count` created engine-config descriptors for cuDNN to fill.
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            &mut written,
            raw.as_mut_ptr().cast(),
        )
    };
    check(
        status,
        "cudnnBackendGetAttribute",
        &A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
    )?;

    let mut built = Vec::new();
    let mut failures = Vec::new();
    for config in configs.iter().take(written.max(0) as usize) {
        if built.len() == wanted {
            break;
        }
        let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        // SAFETY: a cudnnHandle_t is CUDNN_TYPE_HANDLE.
        unsafe {
            plan.set_raw(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[handle],
            )
        }?;
        plan.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
        match plan.finalize() {
            Ok(plan) => {
                let workspace = get_int(&plan, A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
                built.push((plan, workspace.max(0) as usize));
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    if built.is_empty() {
        return Err(Error::Unavailable {
            what: "cuDNN attention for this call",
            why: format!(
                "cuDNN {} offers no engine that builds for {spec:?} ({} tried: {}); turn cuDNN \
                 attention off with enable_cudnn_sdp(false) so that another backend serves",
                crate::runtime::cuda::cudnn_version().unwrap_or(0),
                failures.len(),
                failures.last().map_or("none offered", String::as_str)
            ),
        });
    }
    let sources = Rc::new(Sources {
        _graph: graph,
        _op_graph: og,
        _heuristics: heur,
        _configs: configs,
    });
    Ok(built
        .into_iter()
        .map(|(plan, workspace)| Plan {
            plan,
            workspace,
            _sources: Rc::clone(&sources),
        })
        .collect())
}

/// Strides of `t` as `[B, H, L, D]` (a 3-D tensor is one batch).
fn strides4(t: &Tensor) -> [i64; 4] {
    let (st, sh) = (t.strides(), t.shape());
    let s = |i: usize| st[i] as i64;
    if st.len() == 4 {
        [s(0), s(1), s(2), s(3)]
    } else {
        [s(0) * sh[0].max(1) as i64, s(0), s(1), s(2)]
    }
}

/// The largest power of two up to 16 that divides `address`.
fn alignment(address: u64) -> i64 {
    1i64 << address.trailing_zeros().min(4)
}

/// Runs cuDNN's fused attention on device `ordinal`.
pub(super) fn attention(ordinal: usize, job: &Job) -> Result<SdpaOutput> {
    let Job {
        query: q,
        shape: ref s,
        ref out_shape,
        ..
    } = *job;
    if !present() {
        return Err(Error::Unavailable {
            what: "cuDNN attention",
            why: "libcudnn.so.9 is not loadable; put cuDNN 9 on LD_LIBRARY_PATH or turn cuDNN \
                  attention off with enable_cudnn_sdp(false)"
                .into(),
        });
    }
    let out = CudaBuffer::zeroed(ordinal, s.b * s.h * s.lq * s.dv * q.dtype().size())?;
    let lse = CudaBuffer::zeroed(ordinal, s.b * s.h * s.lq * 4)?;
    // An empty batch has nothing to compute (empty sequences never select cuDNN).
    if s.b * s.h * s.lq > 0 {
        execute(ordinal, job, &out, &lse)?;
    }
    Ok(super::cuda::output(
        ordinal,
        SdpBackend::Cudnn,
        q.dtype(),
        out_shape,
        &[s.b, s.h, s.lq],
        out,
        lse,
    ))
}

/// Binds `job`'s tensors, `out` (`[B, H, Lq, Dv]`) and `lse` (`[B, H, Lq]`, f32) to the
/// cached plan for their shape (built on first use) and runs it on the device's stream.
fn execute(ordinal: usize, job: &Job, out: &CudaBuffer, lse: &CudaBuffer) -> Result<()> {
    let Job {
        query: q,
        key: k,
        value: v,
        options: o,
        shape: ref s,
        scale,
        ..
    } = *job;
    let size = q.dtype().size();
    let stream = CudaDevice::get(ordinal)?.stream()?;
    let [qv, kv, vv] = [q, k, v].map(|t| {
        t.cuda_buffer()
            .expect("a CUDA tensor has a buffer")
            .driver_view(t.offset() * size)
    });
    let views = [qv?, kv?, vv?];
    let (out_view, lse_view) = (out.driver_view(0)?, lse.driver_view(0)?);
    let dropout = (o.dropout_p > 0.0).then_some(o.dropout_p);
    // cuDNN's Philox takes the generator's seed and offset as they are.
    let seeds = match job.dropout {
        Some(draw) => Some([
            CudaBuffer::upload(ordinal, &(draw.seed as i64).to_ne_bytes())?,
            CudaBuffer::upload(ordinal, &(draw.offset as i64).to_ne_bytes())?,
        ]),
        None => None,
    };
    let seed_views = seeds
        .as_ref()
        .map(|[a, b]| Ok::<_, Error>([a.driver_view(0)?, b.driver_view(0)?]))
        .transpose()?;
    let pointers = views.each_ref().map(|view| view.device_ptr(&stream));
    let (o_ptr, _o_sync) = out_view.device_ptr(&stream);
    let (lse_ptr, _lse_sync) = lse_view.device_ptr(&stream);
    let seed_ptrs = seed_views
        .as_ref()
        .map(|[a, b]| [a.device_ptr(&stream), b.device_ptr(&stream)]);
    let spec = Spec {
        dtype: q.dtype(),
        sizes: [s.b, s.h, s.lq, s.lk, s.d, s.dv].map(|x| x as i64),
        strides: [strides4(q), strides4(k), strides4(v)],
        align: pointers.each_ref().map(|(ptr, _)| alignment(*ptr)),
        causal: o.is_causal,
        dropout: dropout.map(f64::to_bits),
    };
    let scale = scale as f32;
    let masked = f32::NEG_INFINITY;
    let rescale = dropout.map_or(1.0, |p| (1.0 / (1.0 - p)) as f32);

    let device = |p: u64| p as *mut c_void;
    let host = |x: &f32| (x as *const f32).cast_mut().cast::<c_void>();
    let mut bound: Vec<(i64, *mut c_void)> = vec![
        (uid::Q, device(pointers[0].0)),
        (uid::K, device(pointers[1].0)),
        (uid::V, device(pointers[2].0)),
        (uid::O, device(o_ptr)),
        (uid::STATS, device(lse_ptr)),
        (uid::SCALE, host(&scale)),
    ];
    if spec.causal {
        bound.push((uid::MASKED, host(&masked)));
    }
    if let Some([(seed, _), (offset, _)]) = &seed_ptrs {
        bound.extend([
            (uid::SEED, device(*seed)),
            (uid::OFFSET, device(*offset)),
            (uid::DROP_SCALE, host(&rescale)),
        ]);
    }
    let (ids, addresses): (Vec<i64>, Vec<*mut c_void>) = bound.into_iter().unzip();
    let run = |handle, plan: &Plan, workspace: &CudaBuffer| -> Result<()> {
        let view = workspace.driver_view(0)?;
        let (w_ptr, _w_sync) = view.device_ptr(&stream);
        // SAFETY: every pointer stays valid until the call returns (device buffers held by
        // the caller, host scalars on its frame); the plan was built on `handle` for these
        // shapes, strides and alignments.
        unsafe { launch(handle, plan, &ids, &addresses, device(w_ptr)) }
    };

    let device = CudaDevice::get(ordinal)?;
    device.bind()?;
    let mut slot = device
        .state::<CudnnDevice>()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let state = match &mut *slot {
        Some(state) => state,
        empty => {
            let mut handle = std::ptr::null_mut();
            check(
                // SAFETY: creates a handle on the context bound above.
                unsafe { dnn::cudnnCreate(&mut handle) },
                "cudnnCreate",
                &ordinal,
            )?;
            // SAFETY: a fresh handle and the device's live default stream.
            let status = unsafe { dnn::cudnnSetStream(handle, stream.cu_stream() as _) };
            check(status, "cudnnSetStream", &ordinal)?;
            empty.insert(DeviceState {
                handle,
                plans: HashMap::new(),
            })
        }
    };
    let handle = state.handle;
    if !state.plans.contains_key(&spec) {
        // `cudnn::benchmark`: time the heuristics' first `benchmark_limit` plans (0: all)
        // on this call's tensors and keep the fastest; otherwise take the first.
        let wanted = match (
            crate::core::cudnn::benchmark(),
            crate::core::cudnn::benchmark_limit(),
        ) {
            (false, _) => 1,
            (true, 0) => usize::MAX,
            (true, limit) => limit as usize,
        };
        let mut candidates = build_plans(handle, &spec, wanted)?;
        if candidates.len() > 1 {
            let most = candidates.iter().map(|p| p.workspace).max().unwrap_or(0);
            let workspace = CudaBuffer::zeroed(ordinal, most.max(1))?;
            let sync = || {
                stream.synchronize().map_err(|e| Error::Driver {
                    call: "cuStreamSynchronize",
                    detail: format!("{e:?}"),
                })
            };
            let time = |plan: &Plan| -> Result<f64> {
                run(handle, plan, &workspace)?;
                sync()?;
                let start = std::time::Instant::now();
                for _ in 0..BENCHMARK_RUNS {
                    run(handle, plan, &workspace)?;
                }
                sync()?;
                Ok(start.elapsed().as_secs_f64())
            };
            // A plan that fails to run is passed over.
            let fastest = candidates
                .iter()
                .enumerate()
                .filter_map(|(i, plan)| time(plan).ok().map(|t| (t, i)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map_or(0, |(_, i)| i);
            candidates.swap(0, fastest);
        }
        if state.plans.len() >= PLANS_PER_DEVICE {
            state.plans.clear();
        }
        let plan = candidates.swap_remove(0);
        state.plans.insert(spec.clone(), plan);
    }
    let plan = &state.plans[&spec];
    let workspace = CudaBuffer::zeroed(ordinal, plan.workspace.max(1))?;
    run(handle, plan, &workspace)
}

/// Runs `plan` once with tensor `ids` bound to `pointers` and `workspace`.
///
/// # Safety
/// Each pointer addresses a live tensor of the shape, type and alignment the plan was built
/// for (device memory, or a host f32 for a by-value scalar), `workspace` at least the plan's
/// workspace size, until the call returns; `handle` is the handle the plan was built on.
unsafe fn launch(
    handle: dnn::cudnnHandle_t,
    plan: &Plan,
    ids: &[i64],
    pointers: &[*mut c_void],
    workspace: *mut c_void,
) -> Result<()> {
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.ints(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, ids)?;
    // SAFETY: raw addresses are CUDNN_TYPE_VOID_PTR (valid per the caller).
    unsafe {
        pack.set_raw(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            pointers,
        )?;
        pack.set_raw(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
    }
    let pack = pack.finalize()?;
    // SAFETY: a finalized plan and pack on the plan's handle (caller).
    let status = unsafe { dnn::cudnnBackendExecute(handle, plan.plan.0, pack.0) };
    check(status, "cudnnBackendExecute", &"the attention plan")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dtype: DType, causal: bool, dropout: Option<f64>) -> Spec {
        let (b, h, lq, lk, d) = (2, 3, 17, 33, 64);
        Spec {
            dtype,
            sizes: [b, h, lq, lk, d, d],
            strides: [
                [h * lq * d, lq * d, d, 1],
                [h * lk * d, lk * d, d, 1],
                [h * lk * d, d, h * d, 1],
            ],
            align: [16, 16, 8],
            causal,
            dropout: dropout.map(f64::to_bits),
        }
    }

    /// Every tensor and operation of the graph finalizes (cuDNN checks each descriptor's
    /// attributes, types and shapes; no GPU is needed until the graph is bound to a handle).
    #[test]
    fn every_descriptor_of_the_attention_graph_finalizes() {
        if !present() {
            eprintln!("skipped: libcudnn.so.9 is not loadable here");
            return;
        }
        for dtype in [DType::F16, DType::Bf16] {
            for causal in [false, true] {
                for dropout in [None, Some(0.25)] {
                    let g = attention_graph(&spec(dtype, causal, dropout))
                        .unwrap_or_else(|e| panic!("{dtype} causal={causal} {dropout:?}: {e}"));
                    let expected =
                        10 + 4 * usize::from(causal) + 3 * usize::from(dropout.is_some());
                    assert_eq!(g.ops.len(), expected, "{dtype} causal={causal} {dropout:?}");
                }
            }
        }
        assert!(matches!(
            attention_graph(&spec(DType::F32, false, None)),
            Err(Error::DTypeMismatch { .. })
        ));
    }

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_16() {
        assert_eq!(alignment(0x1000), 16);
        assert_eq!(alignment(0x1008), 8);
        assert_eq!(alignment(0x1002), 2);
        assert_eq!(alignment(0x1001), 1);
    }
}
