//! cuDNN's fused attention (`SdpBackend::Cudnn` on CUDA tensors) through cuDNN's backend
//! graph API (`runtime/cuda/cudnn.rs`). The call is described as one operation graph — S =
//! Q·Kᵀ, S·scale, the causal mask (top-left aligned, as PyTorch's), softmax with its
//! log-sum-exp, dropout from cuDNN's Philox generator, P·V — for which cuDNN's heuristics
//! pick a fused (flash) engine. The finalized plan is kept per device and shape, so a
//! repeated call only binds pointers; `cudnn::benchmark` times candidate plans as for every
//! cuDNN graph.
//!
//! cuDNN draws dropout from its own Philox generator at the seed and offset of the call's
//! generator draw (`SdpaOptions::generator`): the same draw drops the same weights run to
//! run, but not the ones the other backends drop.

use std::ffi::c_void;

use cudarc::driver::DevicePtr;

use super::{Job, SdpaOutput};
use crate::core::sdp::SdpBackend;
use crate::core::tensor::Tensor;
use crate::runtime::cuda::cudnn::{
    self, Data, Graph, GraphCall, Kind, Pointwise as P, Reduction, alignment, contiguous,
};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{DType, Error, Result};

const OP: &str = "scaled_dot_product_attention through cuDNN";

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
pub(super) struct AttentionSpec {
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
fn attention_graph(spec: &AttentionSpec) -> Result<Graph> {
    let io = io_type(spec.dtype)?;
    let [b, h, lq, lk, d, dv] = spec.sizes;
    let [qs, ks, vs] = spec.strides;
    let [qa, ka, va] = spec.align;
    let mut g = Graph::new(uid::VIRTUAL);
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
    g.reduce(Reduction::CUDNN_REDUCE_TENSOR_MAX, s, max)?;
    let shifted = g.apply(P::CUDNN_POINTWISE_SUB, &[s, max], scores)?;
    let e = g.apply(P::CUDNN_POINTWISE_EXP, &[shifted], scores)?;
    let sum = g.virt(Data::CUDNN_DATA_FLOAT, rows)?;
    g.reduce(Reduction::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
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

/// Runs cuDNN's fused attention on device `ordinal`.
pub(super) fn attention(ordinal: usize, job: &Job) -> Result<SdpaOutput> {
    let Job {
        query: q,
        shape: ref s,
        ref out_shape,
        ..
    } = *job;
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
/// plan for their shape and runs it on the device's stream.
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
    let spec = AttentionSpec {
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
    let call = GraphCall {
        key: format!("{spec:?}"),
        build: &|| attention_graph(&spec),
        excluded: &[],
        what: "cuDNN attention for this call",
        off_switch: "turn cuDNN attention off with enable_cudnn_sdp(false) so that another \
                     backend serves",
    };
    // SAFETY: every pointer stays valid until the call returns (device buffers held by this
    // frame and the job, host scalars on this frame); the key holds the shapes, strides,
    // alignments and options the graph is built from.
    unsafe { cudnn::run(ordinal, &call, &ids, &addresses) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dtype: DType, causal: bool, dropout: Option<f64>) -> AttentionSpec {
        let (b, h, lq, lk, d) = (2, 3, 17, 33, 64);
        AttentionSpec {
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
        if !cudnn::present() {
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
                    assert_eq!(
                        g.ops().len(),
                        expected,
                        "{dtype} causal={causal} {dropout:?}"
                    );
                }
            }
        }
        assert!(matches!(
            attention_graph(&spec(DType::F32, false, None)),
            Err(Error::DTypeMismatch { .. })
        ));
    }
}
