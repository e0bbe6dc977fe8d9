//! cuDNN's backend graph API, shared by the ops that run through it (attention in
//! `ops/sdpa/cudnn.rs`, convolution in `ops/conv/cudnn.rs`): descriptors destroyed on drop,
//! an operation-graph builder, and [`run`], which keeps one handle and a cache of finalized
//! execution plans per device. A graph's plan is built on its first call: the heuristics'
//! engine configurations in their order, less those whose numerical notes the caller
//! excludes (TF32 tensor cores, non-determinism); with `cudnn::benchmark` on, the first
//! `cudnn::benchmark_limit` of them (0: all) are timed on the call's own tensors and the
//! fastest is kept. A repeated call only binds pointers.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use cudarc::cudnn::sys as dnn;
use cudarc::driver::DevicePtr;

use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{Error, Result};

pub(crate) use dnn::cudnnBackendAttributeName_t as A;
use dnn::cudnnBackendAttributeType_t as T;
pub(crate) use dnn::cudnnBackendDescriptorType_t as D;
pub(crate) use dnn::cudnnBackendNumericalNote_t as Note;
pub(crate) use dnn::cudnnDataType_t as Data;
pub(crate) use dnn::cudnnPointwiseMode_t as Pointwise;
pub(crate) use dnn::cudnnReduceTensorOp_t as Reduction;

/// Whether cuDNN's shared library loads (probed once: cudarc panics on a missing one).
pub(crate) fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| super::library_present!(dnn::is_culib_present))
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
pub(crate) struct Desc(dnn::cudnnBackendDescriptor_t);

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
    pub(crate) fn new(kind: D) -> Result<Desc> {
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
    pub(crate) unsafe fn set_raw<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
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

    pub(crate) fn ints(&self, name: A, values: &[i64]) -> Result<&Self> {
        // SAFETY: i64 is CUDNN_TYPE_INT64.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_INT64, values) }?;
        Ok(self)
    }

    pub(crate) fn flag(&self, name: A, value: bool) -> Result<&Self> {
        // SAFETY: Rust's bool is C's bool, CUDNN_TYPE_BOOLEAN.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_BOOLEAN, &[value]) }?;
        Ok(self)
    }

    pub(crate) fn data_type(&self, name: A, value: Data) -> Result<&Self> {
        // SAFETY: cudnnDataType_t is CUDNN_TYPE_DATA_TYPE.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_DATA_TYPE, &[value]) }?;
        Ok(self)
    }

    pub(crate) fn descs(&self, name: A, values: &[&Desc]) -> Result<&Self> {
        let raw: Vec<_> = values.iter().map(|d| d.0).collect();
        // SAFETY: descriptor handles are CUDNN_TYPE_BACKEND_DESCRIPTOR.
        unsafe { self.set_raw(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }?;
        Ok(self)
    }

    pub(crate) fn finalize(self) -> Result<Desc> {
        // SAFETY: a live descriptor with its required attributes set.
        let status = unsafe { dnn::cudnnBackendFinalize(self.0) };
        check(status, "cudnnBackendFinalize", &"descriptor")?;
        Ok(self)
    }
}

/// Whether a tensor of `kind` is bound by device pointer, by host value, or never bound.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Device(i64),
    ByValue(i64),
    Virtual,
}

/// An operation graph under construction: its tensors and operations, in order.
pub(crate) struct Graph {
    tensors: Vec<Desc>,
    ops: Vec<Desc>,
    next_uid: i64,
}

/// A tensor of a [`Graph`] (an index into its tensors).
#[derive(Clone, Copy)]
pub(crate) struct Node(usize);

pub(crate) fn contiguous(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

impl Graph {
    /// An empty graph; virtual tensors get ids from `first_virtual_uid` up.
    pub(crate) fn new(first_virtual_uid: i64) -> Graph {
        Graph {
            tensors: Vec::new(),
            ops: Vec::new(),
            next_uid: first_virtual_uid,
        }
    }

    /// The graph's operations, in order.
    #[cfg(test)]
    pub(crate) fn ops(&self) -> &[Desc] {
        &self.ops
    }

    pub(crate) fn tensor(
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
    pub(crate) fn virt(&mut self, dtype: Data, dims: [i64; 4]) -> Result<Node> {
        self.tensor(dtype, dims, contiguous(dims), Kind::Virtual, 16)
    }

    /// A scalar passed by host value under id `uid`.
    pub(crate) fn scalar(&mut self, uid: i64) -> Result<Node> {
        self.tensor(
            Data::CUDNN_DATA_FLOAT,
            [1; 4],
            [1; 4],
            Kind::ByValue(uid),
            16,
        )
    }

    /// `out = mode(inputs…)` computed in `compute`; `axis` for `GEN_INDEX`.
    pub(crate) fn pointwise(
        &mut self,
        mode: Pointwise,
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
    pub(crate) fn apply(
        &mut self,
        mode: Pointwise,
        inputs: &[Node],
        dims: [i64; 4],
    ) -> Result<Node> {
        let out = self.virt(Data::CUDNN_DATA_FLOAT, dims)?;
        self.pointwise(mode, inputs, out, Data::CUDNN_DATA_FLOAT, None)?;
        Ok(out)
    }

    /// `c = a · b` (batched over the first two dimensions), accumulated in f32.
    pub(crate) fn matmul(&mut self, a: Node, b: Node, c: Node) -> Result<()> {
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
    pub(crate) fn reduce(&mut self, reduction: Reduction, x: Node, y: Node) -> Result<()> {
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
    pub(crate) fn bernoulli(&mut self, keep: f64, y: Node, seed: Node, offset: Node) -> Result<()> {
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

    /// `y = conv(x, w)`: a 2-D cross-correlation (PyTorch's convolution) of `x` `[N, C, H, W]`
    /// with `w` `[O, C / groups, kH, kW]` (cuDNN reads the group count off the channel
    /// dimensions), accumulated in f32.
    pub(crate) fn convolution(
        &mut self,
        x: Node,
        w: Node,
        y: Node,
        dims: &ConvolutionDims,
    ) -> Result<()> {
        let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        conv.data_type(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        let mode = dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
        // SAFETY: cudnnConvolutionMode_t is CUDNN_TYPE_CONVOLUTION_MODE.
        unsafe {
            conv.set_raw(
                A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                T::CUDNN_TYPE_CONVOLUTION_MODE,
                &[mode],
            )
        }?;
        conv.ints(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?
            .ints(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &dims.dilation)?
            .ints(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &dims.stride)?
            .ints(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &dims.pad_before)?
            .ints(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &dims.pad_after)?;
        let conv = conv.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
        op.descs(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            &[&conv],
        )?
        .descs(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            &[&self.tensors[x.0]],
        )?
        .descs(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            &[&self.tensors[w.0]],
        )?
        .descs(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            &[&self.tensors[y.0]],
        )?;
        // SAFETY: f32 is CUDNN_TYPE_FLOAT, the type of alpha and beta for f32 accumulation.
        unsafe {
            op.set_raw(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                T::CUDNN_TYPE_FLOAT,
                &[1.0f32],
            )?;
            op.set_raw(
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                T::CUDNN_TYPE_FLOAT,
                &[0.0f32],
            )?;
        }
        self.ops.push(op.finalize()?);
        self.tensors.push(conv);
        Ok(())
    }
}

/// A 2-D convolution's stride, dilation and zeros before and after each spatial dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConvolutionDims {
    pub stride: [i64; 2],
    pub dilation: [i64; 2],
    pub pad_before: [i64; 2],
    pub pad_after: [i64; 2],
}

/// The largest power of two up to 16 that divides `address`: a tensor's byte alignment.
pub(crate) fn alignment(address: u64) -> i64 {
    1i64 << address.trailing_zeros().min(4)
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
    plans: HashMap<String, Plan>,
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

/// The numerical notes of the engine an engine configuration runs.
fn numerical_notes(config: &Desc) -> Result<Vec<Note>> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut n = 0i64;
    let mut raw = engine.0;
    // SAFETY: cuDNN fills the one created engine descriptor `raw` names.
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            config.0,
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            (&raw mut raw).cast(),
        )
    };
    check(
        status,
        "cudnnBackendGetAttribute",
        &A::CUDNN_ATTR_ENGINECFG_ENGINE,
    )?;
    let mut notes = [Note::CUDNN_NUMERICAL_NOTE_TYPE_COUNT; 16];
    let mut count = 0i64;
    // SAFETY: cuDNN writes at most `notes.len()` notes (a C enum, u32) into `notes`.
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            engine.0,
            A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            T::CUDNN_TYPE_NUMERICAL_NOTE,
            notes.len() as i64,
            &mut count,
            notes.as_mut_ptr().cast(),
        )
    };
    check(
        status,
        "cudnnBackendGetAttribute",
        &A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
    )?;
    Ok(notes[..count.clamp(0, notes.len() as i64) as usize].to_vec())
}

/// One call of a graph through [`run`]: its cache key and how to build and describe it.
pub(crate) struct GraphCall<'a> {
    /// Everything the plan depends on (shapes, strides, alignments, types, options).
    pub key: String,
    /// Builds the graph when no plan is cached for `key`.
    pub build: &'a dyn Fn() -> Result<Graph>,
    /// Engines with any of these numerical notes are passed over.
    pub excluded: &'a [Note],
    /// What runs, for errors: "cuDNN attention", "cuDNN convolution".
    pub what: &'static str,
    /// How a user turns this use of cuDNN off, for errors.
    pub off_switch: &'static str,
}

/// Plans for `call` on `handle`, in the order of cuDNN's heuristics: the first `wanted`
/// engine configurations without an excluded note that build (at least one, or an error
/// naming why none did).
fn build_plans(handle: dnn::cudnnHandle_t, call: &GraphCall, wanted: usize) -> Result<Vec<Plan>> {
    let graph = (call.build)()?;
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
    let mut passed_over = 0;
    for config in configs.iter().take(written.max(0) as usize) {
        if built.len() == wanted {
            break;
        }
        if numerical_notes(config)?
            .iter()
            .any(|note| call.excluded.contains(note))
        {
            passed_over += 1;
            continue;
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
            what: call.what,
            why: format!(
                "cuDNN {} offers no engine that builds for {} ({} tried: {}; {passed_over}                  passed over for {:?}); {}",
                crate::runtime::cuda::cudnn_version().unwrap_or(0),
                call.key,
                failures.len(),
                failures.last().map_or("none offered", String::as_str),
                call.excluded,
                call.off_switch
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

/// Runs `call`'s graph on device `ordinal`'s stream with tensor `ids` bound to `pointers`:
/// the cached plan for `call.key`, built (and, under `cudnn::benchmark`, chosen by timing)
/// on first use.
///
/// # Safety
/// Each pointer addresses a live tensor of the shape, type and alignment the graph declares
/// for its id (device memory on `ordinal`, or a host f32 for a by-value scalar) until the
/// call returns, and the key names everything the graph depends on.
pub(crate) unsafe fn run(
    ordinal: usize,
    call: &GraphCall,
    ids: &[i64],
    pointers: &[*mut c_void],
) -> Result<()> {
    if !present() {
        return Err(Error::Unavailable {
            what: call.what,
            why: format!(
                "libcudnn.so.9 is not loadable; put cuDNN 9 on LD_LIBRARY_PATH, or {}",
                call.off_switch
            ),
        });
    }
    let device = CudaDevice::get(ordinal)?;
    let stream = device.stream()?;
    let execute = |handle, plan: &Plan, workspace: &CudaBuffer| -> Result<()> {
        let view = workspace.driver_view(0)?;
        let (w_ptr, _w_sync) = view.device_ptr(&stream);
        // SAFETY: the pointers are valid until `run` returns (the caller's promise), the
        // workspace holds the plan's size, and the plan was built on `handle` for `key`.
        unsafe { launch(handle, plan, ids, pointers, w_ptr as *mut c_void) }
    };
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
    if !state.plans.contains_key(&call.key) {
        let wanted = match (
            crate::core::cudnn::benchmark(),
            crate::core::cudnn::benchmark_limit(),
        ) {
            (false, _) => 1,
            (true, 0) => usize::MAX,
            (true, limit) => limit as usize,
        };
        let mut candidates = build_plans(handle, call, wanted)?;
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
                execute(handle, plan, &workspace)?;
                sync()?;
                let start = std::time::Instant::now();
                for _ in 0..BENCHMARK_RUNS {
                    execute(handle, plan, &workspace)?;
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
        state.plans.insert(call.key.clone(), plan);
    }
    let plan = &state.plans[&call.key];
    let workspace = CudaBuffer::zeroed(ordinal, plan.workspace.max(1))?;
    execute(handle, plan, &workspace)
}

/// Runs `plan` once with tensor `ids` bound to `pointers` and `workspace`.
///
/// # Safety
/// As [`run`]'s, and `workspace` holds at least the plan's workspace size; `handle` is the
/// handle the plan was built on.
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
    check(status, "cudnnBackendExecute", &"the execution plan")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_16() {
        assert_eq!(alignment(0x1000), 16);
        assert_eq!(alignment(0x1008), 8);
        assert_eq!(alignment(0x1002), 2);
        assert_eq!(alignment(0x1001), 1);
    }
}
