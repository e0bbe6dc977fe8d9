//! Split-KV attention on wgpu and CUDA. A fused call whose query side gives the
//! device few workgroups (decoding: B·H·⌈Lq / rows per workgroup⌉ small) against many keys
//! runs as S chunks of keys computed side by side — one packed varlen call of the same
//! backend's kernel in which each chunk is a sequence with its own copy of the query rows and its own
//! run of keys (read in place through a view); CUDA's flash kernel instead takes the chunks
//! on its grid's third axis, for any batch — after which the generated combine kernel
//! merges the chunks' partial outputs by their log-sum-exps. The trace says so.
//!
//! A paged decoding call (`sdpa_paged`) splits the same way: each sequence's keys become
//! chunks of whole blocks, each chunk a sequence of the paged call reading its slice of the
//! block table.
//!
//! It serves dense calls (of batch 1, but for CUDA's flash) and paged calls whose every
//! query sees every key: no mask, no dropout, no window, not causal (or causal lower-right
//! with one query row, which hides nothing).

use super::{Job, SdpaOptions, SdpaOutput, Sequences};
use crate::core::sdp::{CausalVariant, SdpBackend, Window};
use crate::core::tensor::Storage;
use crate::kernels::attention::Shape;
use crate::kernels::{AttentionCombineKey, KernelKey};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg};
use crate::runtime::wgpu::{WgpuBuffer, u32_arg};
use crate::{Device, Error, Result, Tensor};

const OP: &str = "split-KV scaled_dot_product_attention";

/// Workgroups that keep a GPU busy (an H200 has 132 SMs).
const BUSY: usize = 128;

/// Blocks of CUDA's flash kernel one multiprocessor runs at once (their registers, about
/// 240 per thread of 128, fill a 64K-register SM twice).
const FLASH_BLOCKS_PER_SM: usize = 2;

/// Query rows one workgroup of the memory-efficient kernels covers, at most.
const ROWS_PER_GROUP: usize = 32;

/// The fewest keys a chunk gets.
const MIN_CHUNK: usize = 256;

/// How many chunks `job`'s keys are split into on `device` by `backend` (1: not split). The
/// chunks are sequences of a packed or paged call, which the memory-efficient kernels read
/// on both GPUs and the flash kernel reads on wgpu; CUDA's flash kernel splits dense calls
/// itself (it takes no packed or paged ones).
pub(super) fn chunks(job: &Job, device: Device, backend: SdpBackend) -> usize {
    let s = &job.shape;
    let o = job.options;
    let every_key_seen = o.attn_mask.is_none()
        && o.dropout_p == 0.0
        && o.window == Window::UNBOUNDED
        && (!o.is_causal || (o.causal_variant == CausalVariant::LowerRight && s.lq == 1));
    let cuda_flash = matches!((device, backend), (Device::Cuda(_), SdpBackend::Flash));
    let reads_chunks = matches!(device, Device::Wgpu(_) | Device::Cuda(_))
        && matches!(backend, SdpBackend::Flash | SdpBackend::MemEfficient);
    // Chunks are a whole number of cache blocks when the keys are paged.
    let unit = match job.seqs {
        None if s.b == 1 || cuda_flash => 1,
        Some(Sequences::Paged { block, .. }) if !cuda_flash => block.max(1),
        _ => return 1,
    };
    if !reads_chunks || !every_key_seen {
        return 1;
    }
    let busy = match device {
        Device::Cuda(ordinal) if cuda_flash => crate::runtime::cuda::get_device_properties(ordinal)
            .map_or(BUSY, |p| {
                (p.multi_processor_count as usize * FLASH_BLOCKS_PER_SM).max(BUSY)
            }),
        _ => BUSY,
    };
    let groups = s.b * s.h * s.lq.div_ceil(ROWS_PER_GROUP);
    if groups == 0 || groups >= busy {
        return 1;
    }
    // Whole waves of chunks: a split that adds a partial wave gains nothing.
    let wanted = (busy / groups).min(s.lk / MIN_CHUNK);
    if wanted < 2 {
        return 1;
    }
    s.lk.div_ceil(chunk_len(s.lk, wanted, unit))
}

/// The keys per chunk for `count` chunks of `lk` keys, rounded up to a multiple of `unit`.
fn chunk_len(lk: usize, count: usize, unit: usize) -> usize {
    lk.div_ceil(count).div_ceil(unit) * unit
}

/// Where a partial pass left chunk `c`'s results: element strides of the partial output
/// and log-sum-exp over (batch, chunk, head, query row).
struct Partial {
    result: SdpaOutput,
    out_strides: [usize; 4],
    lse_strides: [usize; 4],
}

/// Runs `job` on `device` by `backend` as `count` chunks of keys, then combines them.
pub(super) fn run(
    device: Device,
    backend: SdpBackend,
    job: &Job,
    count: usize,
) -> Result<SdpaOutput> {
    let unit = match job.seqs {
        Some(Sequences::Paged { block, .. }) => block.max(1),
        _ => 1,
    };
    let chunk = chunk_len(job.shape.lk, count, unit);
    let options = SdpaOptions {
        attn_mask: None,
        is_causal: false,
        scale: Some(job.scale),
        generator: None,
        ..*job.options
    };
    let fused = |partial_job: &Job| match device {
        Device::Wgpu(index) => super::wgpu::wgpu_fused(index, backend, None, partial_job),
        Device::Cuda(ordinal) => super::cuda::fused(ordinal, backend, None, partial_job),
        Device::Cpu => unreachable!("the CPU splits keys in its own kernels"),
    };
    let partial = match (device, job.seqs) {
        (Device::Cuda(ordinal), None) if backend == SdpBackend::Flash => {
            // Outputs [count, B, H, Lq, Dv], log-sum-exps [count, B, H, Lq].
            let s = job.shape;
            let flash_job = Job::new([job.query, job.key, job.value], &options, s, None)?;
            Partial {
                result: super::cuda::flash_chunks(ordinal, &flash_job, count, chunk)?,
                out_strides: [
                    s.h * s.lq * s.dv,
                    s.b * s.h * s.lq * s.dv,
                    s.lq * s.dv,
                    s.dv,
                ],
                lse_strides: [s.h * s.lq, s.b * s.h * s.lq, s.lq, 1],
            }
        }
        (_, None) => dense_chunks(job, &options, count, chunk, fused)?,
        (
            _,
            Some(Sequences::Paged {
                table,
                per_seq,
                block,
                lens,
            }),
        ) => paged_chunks(
            job,
            &options,
            (count, chunk),
            (table, per_seq, block, lens),
            fused,
        )?,
        (_, Some(Sequences::Packed { .. })) => unreachable!("packed calls are not split"),
    };
    let (output, lse) = combine(device, job, count, &partial)?;
    Ok(SdpaOutput {
        output,
        lse: Some(lse),
        backend,
    })
}

/// A dense call of batch 1 as a packed call: chunk c is sequence c, with its own copy of
/// the query rows and keys `c · chunk ..` read in place.
fn dense_chunks(
    job: &Job,
    options: &SdpaOptions,
    count: usize,
    chunk: usize,
    fused: impl Fn(&Job) -> Result<SdpaOutput>,
) -> Result<Partial> {
    let s = job.shape;
    // q [1, H, Lq, D] (or [H, Lq, D]) as packed rows [count · Lq, H, D].
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
    let shape = Shape {
        b: count,
        lk: chunk,
        ..s
    };
    let partial_job = Job::new(
        [&queries, &keys, &values],
        options,
        shape,
        Some(Sequences::Packed {
            cu_q: &cu_q,
            cu_k: &cu_k,
        }),
    )?;
    // Outputs [count · Lq, H, Dv], log-sum-exps [H, count · Lq].
    Ok(Partial {
        result: fused(&partial_job)?,
        out_strides: [0, s.lq * s.h * s.dv, s.dv, s.h * s.dv],
        lse_strides: [0, s.lq, count * s.lq, 1],
    })
}

/// A paged call with each sequence's keys in `count` chunks of whole blocks: chunk c of
/// sequence b is sequence `b · count + c`, with its own copy of the query rows, its slice of
/// the block table and its share of the length.
fn paged_chunks(
    job: &Job,
    options: &SdpaOptions,
    (count, chunk): (usize, usize),
    (table, per_seq, block, lens): (&[usize], usize, usize, &[usize]),
    fused: impl Fn(&Job) -> Result<SdpaOutput>,
) -> Result<Partial> {
    let s = job.shape;
    let blocks = chunk / block.max(1);
    let queries = job
        .query
        .unsqueeze(1)?
        .expand(&[s.b, count, s.h, s.lq, s.d])?
        .reshape(&[s.b * count, s.h, s.lq, s.d])?;
    let mut chunk_table = Vec::with_capacity(s.b * count * blocks);
    let mut chunk_lens = Vec::with_capacity(s.b * count);
    for (b, &len) in lens.iter().enumerate() {
        for c in 0..count {
            // (Entries past a sequence's own table are never read: its length stops first.)
            chunk_table.extend((0..blocks).map(|t| {
                let entry = c * blocks + t;
                if entry < per_seq {
                    table[b * per_seq + entry]
                } else {
                    0
                }
            }));
            chunk_lens.push(len.saturating_sub(c * chunk).min(chunk));
        }
    }
    let shape = Shape {
        b: s.b * count,
        lk: chunk,
        ..s
    };
    let partial_job = Job::new(
        [&queries, job.key, job.value],
        options,
        shape,
        Some(Sequences::Paged {
            table: &chunk_table,
            per_seq: blocks,
            block,
            lens: &chunk_lens,
        }),
    )?;
    // Outputs [B · count, H, Lq, Dv], log-sum-exps [B · count, H, Lq].
    Ok(Partial {
        result: fused(&partial_job)?,
        out_strides: [
            count * s.h * s.lq * s.dv,
            s.h * s.lq * s.dv,
            s.lq * s.dv,
            s.dv,
        ],
        lse_strides: [count * s.h * s.lq, s.h * s.lq, s.lq, 1],
    })
}

/// The combine kernel over `count` chunks' partial results: the call's output
/// (`job.out_shape`) and log-sum-exp (`job.lse_shape()`).
fn combine(device: Device, job: &Job, count: usize, partial: &Partial) -> Result<(Tensor, Tensor)> {
    let s = &job.shape;
    let dtype = job.query.dtype();
    let elem = dtype.elem().ok_or(Error::DTypeMismatch {
        op: OP,
        expected: crate::DType::F32,
        got: dtype,
    })?;
    let key = KernelKey::AttentionCombine(AttentionCombineKey { elem });
    let rows = s.b * s.h * s.lq;
    let n = rows * s.dv;
    let out_part = &partial.result.output;
    let lse_part = partial
        .result
        .lse
        .as_ref()
        .expect("the fused kernels return the lse");
    let strides = partial.out_strides.into_iter().chain(partial.lse_strides);
    let (out, lse) = match device {
        Device::Cuda(ordinal) => {
            let kernel = Kernel::get(ordinal, &key)?;
            let out = CudaBuffer::zeroed(ordinal, n * dtype.size())?;
            let lse = CudaBuffer::zeroed(ordinal, rows * 4)?;
            fn view(t: &Tensor) -> crate::runtime::cuda::memory::View<'_> {
                t.cuda_buffer()
                    .expect("a CUDA tensor has a buffer")
                    .view(t.offset() * t.dtype().size())
            }
            let (p, pl) = (view(out_part), view(lse_part));
            let (o, l) = (out.view(0), lse.view(0));
            let ints = [s.b, s.h, s.lq, s.dv, count]
                .map(|x| int_arg(OP, x))
                .into_iter()
                .collect::<Result<Vec<i32>>>()?;
            let longs: Vec<i64> = strides.map(crate::runtime::cuda::long_arg).collect();
            let mut args = kernel.args();
            args.ptr(&p).ptr(&pl).ptr(&o).ptr(&l);
            for x in &ints {
                args.int(x);
            }
            for x in &longs {
                args.long(x);
            }
            if n > 0 {
                // SAFETY: the arguments follow attention_combine.cu's parameter list; the
                // strides address the partial pass's fresh outputs (count chunks of every
                // batch, head and row), and out / lse hold B · H · Lq · Dv and B · H · Lq.
                unsafe { kernel.launch(args, (grid_dim(OP, n.div_ceil(256))?, 1, 1)) }?;
            }
            (
                Storage::Device(Box::new(out)),
                Storage::Device(Box::new(lse)),
            )
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
            let dispatch = crate::runtime::wgpu::folded_groups(OP, n.div_ceil(256))?;
            let words = [s.b, s.h, s.lq, s.dv, count, dispatch[0] as usize, 0, 0]
                .into_iter()
                .chain(strides)
                .map(|x| u32_arg(OP, x))
                .collect::<Result<Vec<u32>>>()?;
            // (The partial pass's outputs are fresh buffers: offset 0.)
            let (p, pl) = [out_part, lse_part]
                .map(|t| t.wgpu_buffer().expect("a wgpu tensor has a buffer"))
                .into();
            if n > 0 {
                gpu.run(
                    entry.name,
                    kernel,
                    &[p.raw(), pl.raw(), out.raw(), lse.raw()],
                    &words,
                    dispatch,
                )?;
            }
            (
                Storage::Device(Box::new(out)),
                Storage::Device(Box::new(lse)),
            )
        }
        Device::Cpu => unreachable!("the CPU combines in its own kernels"),
    };
    Ok((
        Tensor::from_storage(out, dtype, device, &job.out_shape),
        Tensor::from_storage(lse, crate::DType::F32, device, &job.lse_shape()),
    ))
}
