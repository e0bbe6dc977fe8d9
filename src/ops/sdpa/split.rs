//! Split-KV attention on wgpu and CUDA. A fused call whose query side gives the
//! device few workgroups (decoding: B·H·⌈Lq / rows per workgroup⌉ small) against many keys
//! runs as S chunks of keys computed side by side — one packed varlen call of the same
//! backend's kernel in which each chunk is a sequence with its own copy of the query rows and its own
//! run of keys (read in place through a view) — after which the generated combine kernel
//! merges the chunks' partial outputs by their log-sum-exps. The trace says so.
//!
//! It serves dense calls of batch 1 whose every query sees every key: no mask, no dropout,
//! no window, not causal (or causal lower-right with one query row, which hides nothing).

use super::{Job, SdpaOptions, SdpaOutput, Sequences};
use crate::core::sdp::{CausalVariant, SdpBackend, Window};
use crate::core::tensor::Storage;
use crate::kernels::{AttentionCombineKey, KernelKey};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg};
use crate::runtime::wgpu::{WgpuBuffer, u32_arg};
use crate::{Device, Error, Result, Tensor};

const OP: &str = "split-KV scaled_dot_product_attention";

/// Workgroups that keep a GPU busy (an H200 has 132 SMs).
const BUSY: usize = 128;

/// Query rows one workgroup of the memory-efficient kernels covers, at most.
const ROWS_PER_GROUP: usize = 32;

/// The fewest keys a chunk gets.
const MIN_CHUNK: usize = 256;

/// How many chunks `job`'s keys are split into on `device` by `backend` (1: not split). The
/// chunks are sequences of a packed call, which the memory-efficient kernels read on both
/// GPUs and the flash kernel reads on wgpu (CUDA's flash kernel takes dense calls only).
pub(super) fn chunks(job: &Job, device: Device, backend: SdpBackend) -> usize {
    let s = &job.shape;
    let o = job.options;
    let every_key_seen = o.attn_mask.is_none()
        && o.dropout_p == 0.0
        && o.window == Window::UNBOUNDED
        && (!o.is_causal || (o.causal_variant == CausalVariant::LowerRight && s.lq == 1));
    let reads_chunks = matches!(
        (device, backend),
        (
            Device::Wgpu(_),
            SdpBackend::Flash | SdpBackend::MemEfficient
        ) | (Device::Cuda(_), SdpBackend::MemEfficient)
    );
    if !reads_chunks || job.seqs.is_some() || s.b != 1 || !every_key_seen {
        return 1;
    }
    let groups = s.h * s.lq.div_ceil(ROWS_PER_GROUP);
    if groups == 0 || groups >= BUSY {
        return 1;
    }
    let wanted = BUSY.div_ceil(groups).min(s.lk / MIN_CHUNK);
    if wanted < 2 {
        return 1;
    }
    // Chunks of equal length (the last one shorter), as many as that length needs.
    s.lk.div_ceil(s.lk.div_ceil(wanted))
}

/// Runs `job` on `device` by `backend` as `count` chunks of keys, then combines them.
pub(super) fn run(
    device: Device,
    backend: SdpBackend,
    job: &Job,
    count: usize,
) -> Result<SdpaOutput> {
    let s = job.shape;
    let chunk = s.lk.div_ceil(count);
    // q [1, H, Lq, D] (or [H, Lq, D]) as packed rows [count · Lq, H, D]: one copy per chunk.
    let heads_first = |t: &Tensor| -> Result<Tensor> {
        if t.shape().len() == 4 {
            t.select(0, 0)
        } else {
            Ok(t.clone())
        }
    };
    let queries = heads_first(job.query)?
        .permute(&[1, 0, 2])?
        .unsqueeze(0)?
        .expand(&[count, s.lq, s.h, s.d])?
        .reshape(&[count * s.lq, s.h, s.d])?;
    // k and v read in place as packed rows [Lk, Hk, D].
    let keys = heads_first(job.key)?.permute(&[1, 0, 2])?;
    let values = heads_first(job.value)?.permute(&[1, 0, 2])?;
    let cu_q: Vec<usize> = (0..=count).map(|c| c * s.lq).collect();
    let cu_k: Vec<usize> = (0..=count).map(|c| (c * chunk).min(s.lk)).collect();
    let options = SdpaOptions {
        attn_mask: None,
        is_causal: false,
        scale: Some(job.scale),
        generator: None,
        ..*job.options
    };
    let shape = crate::kernels::attention::Shape {
        b: count,
        lk: chunk,
        ..s
    };
    let partial_job = Job::new(
        [&queries, &keys, &values],
        &options,
        shape,
        Some(Sequences::Packed {
            cu_q: &cu_q,
            cu_k: &cu_k,
        }),
    )?;
    let partial = match device {
        Device::Wgpu(index) => super::wgpu::wgpu_fused(index, backend, None, &partial_job)?,
        Device::Cuda(ordinal) => super::cuda::fused(ordinal, backend, None, &partial_job)?,
        Device::Cpu => unreachable!("the CPU splits keys in its own kernels"),
    };
    let partial_lse = partial.lse.expect("the fused kernels return the lse");
    let (output, lse) = combine(device, job, count, &partial.output, &partial_lse)?;
    Ok(SdpaOutput {
        output,
        lse: Some(lse),
        backend,
    })
}

/// The combine kernel over `count` chunks' `partial` outputs `[count · Lq, H, Dv]` and
/// log-sum-exps `[H, count · Lq]`: the call's output (`job.out_shape`) and lse.
fn combine(
    device: Device,
    job: &Job,
    count: usize,
    partial: &Tensor,
    partial_lse: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let s = &job.shape;
    let dtype = job.query.dtype();
    let elem = dtype.elem().ok_or(Error::DTypeMismatch {
        op: OP,
        expected: crate::DType::F32,
        got: dtype,
    })?;
    let key = KernelKey::AttentionCombine(AttentionCombineKey { elem });
    let n = s.h * s.lq * s.dv;
    let rows = s.h * s.lq;
    let lse_shape = job.lse_shape();
    match device {
        Device::Cuda(ordinal) => {
            let kernel = Kernel::get(ordinal, &key)?;
            let out = CudaBuffer::zeroed(ordinal, n * dtype.size())?;
            let lse = CudaBuffer::zeroed(ordinal, rows * 4)?;
            fn view(t: &Tensor) -> crate::runtime::cuda::memory::View<'_> {
                t.cuda_buffer()
                    .expect("a CUDA tensor has a buffer")
                    .view(t.offset() * t.dtype().size())
            }
            let (p, pl) = (view(partial), view(partial_lse));
            let (o, l) = (out.view(0), lse.view(0));
            let ints = [s.h, s.lq, s.dv, count]
                .map(|x| int_arg(OP, x))
                .into_iter()
                .collect::<Result<Vec<i32>>>()?;
            let mut args = kernel.args();
            args.ptr(&p).ptr(&pl).ptr(&o).ptr(&l);
            for x in &ints {
                args.int(x);
            }
            if n > 0 {
                // SAFETY: the arguments follow attention_combine.cu's parameter list; the
                // partial tensors are the packed call's fresh outputs ([count · Lq, H, Dv]
                // and [H, count · Lq]), and out / lse hold H · Lq · Dv and H · Lq elements.
                unsafe { kernel.launch(args, (grid_dim(OP, n.div_ceil(256))?, 1, 1)) }?;
            }
            Ok((
                Tensor::from_storage(
                    Storage::Device(Box::new(out)),
                    dtype,
                    device,
                    &job.out_shape,
                ),
                Tensor::from_storage(
                    Storage::Device(Box::new(lse)),
                    crate::DType::F32,
                    device,
                    &lse_shape,
                ),
            ))
        }
        Device::Wgpu(index) => {
            let entry = crate::kernels::lookup(&key).expect("the combine kernels are declared");
            let kernel = entry.wgsl.as_ref().ok_or(Error::DTypeMismatch {
                op: OP,
                expected: crate::DType::F32,
                got: dtype,
            })?;
            let gpu = crate::runtime::wgpu::gpu(index)?;
            let out = WgpuBuffer::output(gpu, n * dtype.size())?;
            let lse = WgpuBuffer::output(gpu, rows * 4)?;
            let groups = n.div_ceil(256);
            let groups_x = groups.min(65_535);
            let words = [s.h, s.lq, s.dv, count, groups_x, 0, 0, 0]
                .map(|x| u32_arg(OP, x))
                .into_iter()
                .collect::<Result<Vec<u32>>>()?;
            let params: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            // (The packed call's outputs are fresh buffers: offset 0.)
            let (p, pl) = [partial, partial_lse]
                .map(|t| t.wgpu_buffer().expect("a wgpu tensor has a buffer"))
                .into();
            if n > 0 {
                gpu.run(
                    entry.name,
                    kernel,
                    &[p.raw(), pl.raw(), out.raw(), lse.raw()],
                    &params,
                    [groups_x as u32, u32_arg(OP, groups.div_ceil(groups_x))?, 1],
                )?;
            }
            Ok((
                Tensor::from_storage(
                    Storage::Device(Box::new(out)),
                    dtype,
                    device,
                    &job.out_shape,
                ),
                Tensor::from_storage(
                    Storage::Device(Box::new(lse)),
                    crate::DType::F32,
                    device,
                    &lse_shape,
                ),
            ))
        }
        Device::Cpu => unreachable!("the CPU combines in its own kernels"),
    }
}
