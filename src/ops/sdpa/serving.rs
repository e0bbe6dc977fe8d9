//! Attention for serving: batches of sequences of different lengths packed along one
//! dimension (flash-attn's `varlen` API, `cu_seqlens`), and keys and values in a paged
//! cache (vLLM's block tables, as flash-attn's `flash_attn_with_kvcache` takes them). Each
//! sequence has its own lengths, causal mask (in either alignment) and sliding window;
//! grouped-query attention as in [`super::sdpa`]. The kernels read the sequences where
//! they lie, on every device: no padding to a common length, no gathering of a cache into
//! a dense tensor. On the CPU the decoding kernel reads a paged cache's blocks through the
//! table and the block kernel gathers each head's rows; on wgpu and CUDA the
//! memory-efficient kernels read a sequence table (offsets, lengths, block table) per
//! workgroup ([`serving_verdict`] says which backend serves and why not).

use super::params::SDPAParams;
use super::select::DeviceCaps;
use super::{Job, OP, SdpaOptions, SdpaOutput, Sequences, params};
use crate::core::sdp::{Reason, SdpBackend, Verdict};
use crate::core::tensor::Tensor;
use crate::core::trace::{self, Call};
use crate::kernels::attention::Shape;
use crate::{DType, Device, Error, Result};

/// The sequences of a packed batch (flash-attn's `cu_seqlens_q` / `cu_seqlens_k`):
/// sequence b's queries are rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of q, its keys and
/// values rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of k and v. Both hold B + 1
/// non-decreasing offsets from 0 to the packed length.
#[derive(Clone, Copy, Debug)]
pub struct Varlen<'a> {
    /// Cumulative query lengths, `[B + 1]`.
    pub cu_seqlens_q: &'a [usize],
    /// Cumulative key lengths, `[B + 1]`.
    pub cu_seqlens_k: &'a [usize],
}

impl<'a> Varlen<'a> {
    /// The same offsets for queries and keys (self-attention over each sequence, a prefill).
    pub fn same(cu_seqlens: &'a [usize]) -> Self {
        Varlen {
            cu_seqlens_q: cu_seqlens,
            cu_seqlens_k: cu_seqlens,
        }
    }
}

/// A paged KV cache: keys and values in blocks of `block_size` token rows,
/// `[num_blocks, block_size, Hk, D]` (flash-attn's `k_cache` / `v_cache` with a
/// `block_table`), and per sequence the blocks that hold its tokens and how many tokens it
/// has. Blocks may be anywhere in the cache, in any order, and shared between sequences.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// `[num_blocks, block_size, Hk, D]`.
    pub key_cache: &'a Tensor,
    /// `[num_blocks, block_size, Hk, Dv]`.
    pub value_cache: &'a Tensor,
    /// `[B, blocks_per_seq]`, row-major: token j of sequence b is slot `j % block_size` of
    /// block `block_table[b * blocks_per_seq + j / block_size]`. Entries past a sequence's
    /// last token are not read.
    pub block_table: &'a [usize],
    /// Each sequence's token count (its context length, `[B]`).
    pub seq_lens: &'a [usize],
}

/// Attention over a packed batch: q `[total_q, H, D]`, k `[total_k, Hk, D]`, v
/// `[total_k, Hk, Dv]` (flash-attn's `flash_attn_varlen_func`), each sequence attending to
/// its own keys only. The output is `[total_q, H, Dv]`, the log-sum-exp `[H, total_q]` (f32,
/// as flash-attn gives it). The options' mask and dropout are not taken (typed errors); the
/// causal mask and the window apply to each sequence with its own lengths.
pub fn sdpa_varlen(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    batch: &Varlen,
    options: &SdpaOptions,
) -> Result<SdpaOutput> {
    let (q, k, v) = (query.shape(), key.shape(), value.shape());
    if q.len() != 3 || k.len() != 3 || v.len() != 3 {
        return Err(mismatch(format!(
            "packed attention takes q [total_q, H, D], k and v [total_k, Hk, D]; got {q:?}, \
             {k:?}, {v:?}"
        )));
    }
    let b = batch.cu_seqlens_q.len().saturating_sub(1);
    offsets("cu_seqlens_q", batch.cu_seqlens_q, q[0])?;
    offsets("cu_seqlens_k", batch.cu_seqlens_k, k[0])?;
    if batch.cu_seqlens_k.len() != b + 1 {
        return Err(mismatch(format!(
            "cu_seqlens_q describes {b} sequences and cu_seqlens_k {}; give both B + 1 offsets",
            batch.cu_seqlens_k.len().saturating_sub(1)
        )));
    }
    let longest = |cu: &[usize]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let (lq, lk) = (longest(batch.cu_seqlens_q), longest(batch.cu_seqlens_k));
    let shape = Shape {
        b,
        h: q[1],
        hk: k[1],
        lq,
        lk,
        d: q[2],
        dv: v[2],
    };
    let seqs = Sequences::Packed {
        cu_q: batch.cu_seqlens_q,
        cu_k: batch.cu_seqlens_k,
    };
    let dense = [
        &[b, q[1], lq, q[2]][..],
        &[b, k[1], lk, k[2]],
        &[b, v[1], lk, v[2]],
    ];
    run(
        "sdpa_varlen",
        [query, key, value],
        dense,
        shape,
        seqs,
        options,
    )
}

/// Attention of q `[B, H, Lq, D]` over a paged KV cache (flash-attn's
/// `flash_attn_with_kvcache` with a block table; vLLM's paged attention): sequence b's
/// queries attend to its first `seq_lens[b]` tokens, read from their blocks. On the CPU,
/// decoding (Lq of 1 to a few rows per key/value head group) runs the decoding kernel,
/// split over the keys where the groups leave threads idle; longer query chunks run the
/// block kernel.
/// A causal mask is usually wanted bottom-right (`causal_lower_right`: the queries are the
/// sequence's last Lq tokens). The output is `[B, H, Lq, Dv]`, the log-sum-exp `[B, H, Lq]`.
pub fn sdpa_paged(query: &Tensor, cache: &PagedKv, options: &SdpaOptions) -> Result<SdpaOutput> {
    let (q, kc, vc) = (
        query.shape(),
        cache.key_cache.shape(),
        cache.value_cache.shape(),
    );
    if q.len() != 4 || kc.len() != 4 || vc.len() != 4 || kc[..3] != vc[..3] {
        return Err(mismatch(format!(
            "paged attention takes q [B, H, Lq, D], key and value caches [blocks, block_size, \
             Hk, D] with the same blocks; got {q:?}, {kc:?}, {vc:?}"
        )));
    }
    let (b, blocks, block) = (q[0], kc[0], kc[1]);
    if cache.seq_lens.len() != b {
        return Err(invalid(
            "seq_lens",
            format!(
                "{} lengths for a batch of {b}: give one per sequence",
                cache.seq_lens.len()
            ),
        ));
    }
    if block == 0 && cache.seq_lens.iter().any(|&n| n > 0) {
        return Err(invalid(
            "key_cache",
            "blocks of 0 tokens hold no keys: give blocks of at least 1".into(),
        ));
    }
    let per_seq = cache.block_table.len().checked_div(b).unwrap_or(0);
    if per_seq * b != cache.block_table.len() {
        return Err(invalid(
            "block_table",
            format!(
                "{} entries do not split into {b} rows: give [B, blocks_per_seq] row-major",
                cache.block_table.len()
            ),
        ));
    }
    for (seq, &len) in cache.seq_lens.iter().enumerate() {
        let needed = len.div_ceil(block.max(1));
        if needed > per_seq {
            return Err(invalid(
                "seq_lens",
                format!(
                    "sequence {seq} has {len} tokens, {needed} blocks of {block}, but its \
                     block table row has {per_seq}"
                ),
            ));
        }
        let row = &cache.block_table[seq * per_seq..][..needed];
        if let Some((i, &bad)) = row.iter().enumerate().find(|&(_, &x)| x >= blocks) {
            return Err(invalid(
                "block_table",
                format!(
                    "entry {i} of sequence {seq} is block {bad}, but the cache has {blocks} \
                     blocks"
                ),
            ));
        }
    }
    let lk = cache.seq_lens.iter().copied().max().unwrap_or(0);
    let shape = Shape {
        b,
        h: q[1],
        hk: kc[2],
        lq: q[2],
        lk,
        d: q[3],
        dv: vc[3],
    };
    let seqs = Sequences::Paged {
        table: cache.block_table,
        per_seq,
        block,
        lens: cache.seq_lens,
    };
    let dense = [q, &[b, kc[2], lk, kc[3]], &[b, vc[2], lk, vc[3]]];
    let tensors = [query, cache.key_cache, cache.value_cache];
    run("sdpa_paged", tensors, dense, shape, seqs, options)
}

/// Checks a serving call as the dense call of its longest sequences would be checked by the
/// backend that serves it (flash on the CPU, memory-efficient on a GPU, whose flash
/// kernels take dense batches only: dtypes, devices, head counts and dims, the enable
/// flags), then runs it; inputs are made contiguous first where they are not.
fn run(
    kernel: &'static str,
    [query, key, value]: [&Tensor; 3],
    dense: [&[usize]; 3],
    shape: Shape,
    seqs: Sequences,
    options: &SdpaOptions,
) -> Result<SdpaOutput> {
    if [query, key, value]
        .into_iter()
        .all(crate::ops::convert::is_wgpu_bf16)
    {
        let attend = |inputs: [&Tensor; 3], options: &SdpaOptions| {
            run(kernel, inputs, dense, shape, seqs, options)
        };
        return super::bf16_on_wgpu(kernel, [query, key, value], options, attend);
    }
    if options.attn_mask.is_some() {
        return Err(invalid(
            "attn_mask",
            "serving attention takes no mask: use is_causal, causal_variant and window, or \
             call sdpa per sequence"
                .into(),
        ));
    }
    if options.dropout_p != 0.0 {
        return Err(invalid(
            "dropout_p",
            format!(
                "serving attention is for inference and applies no dropout; got {}",
                options.dropout_p
            ),
        ));
    }
    // The dense call of the same heads, dims and longest lengths: its checks are ours.
    let as_dense = |t: &Tensor, shape: &[usize]| super::params::TensorMeta {
        shape: shape.to_vec(),
        strides: crate::core::tensor::contiguous_strides(shape),
        dtype: t.dtype(),
        device: t.device(),
    };
    let mut p = params(query, key, value, options);
    p.query = as_dense(query, dense[0]);
    p.key = as_dense(key, dense[1]);
    p.value = as_dense(value, dense[2]);
    super::select::validate(&p)?;
    let device = query.device();
    let verdict = serving_verdict(&p, &DeviceCaps::of(device));
    let backend = verdict.0;
    if !verdict.1.is_empty() {
        super::select::warn_all(std::slice::from_ref(&verdict));
        return Err(Error::NoAvailableKernel {
            reasons: vec![verdict],
        });
    }
    let contiguous = |t: &Tensor| -> Result<Option<Tensor>> {
        (!t.is_contiguous()).then(|| t.contiguous()).transpose()
    };
    let (q, k, v) = (contiguous(query)?, contiguous(key)?, contiguous(value)?);
    let (query, key, value) = (
        q.as_ref().unwrap_or(query),
        k.as_ref().unwrap_or(key),
        v.as_ref().unwrap_or(value),
    );
    let job = Job::new([query, key, value], options, shape, Some(seqs))?;
    let chunks = match device {
        Device::Cpu => 1,
        _ => super::split::chunks(&job, device, backend),
    };
    let split_note = if chunks > 1 {
        format!(", keys split into {chunks} chunks combined by their log-sum-exps (split-KV)")
    } else {
        String::new()
    };
    let note = match device {
        Device::Cpu => format!(
            "{}, {}",
            super::cpu::sequences_kernel(&job),
            crate::runtime::cpu::get_cpu_capability()
        ),
        Device::Wgpu(_) => "wgsl memory-efficient kernel reading the sequence table".into(),
        Device::Cuda(_) => format!(
            "{} reading the sequence table",
            super::cuda::note(backend, query.dtype())
        ),
    };
    let describe = || Call {
        kernel: kernel.to_string(),
        backend: device.to_string(),
        dtype: query.dtype(),
        shapes: format!("{:?}x{:?}x{:?}", query.shape(), key.shape(), value.shape()),
        precision: format!("{note}, {} sequences{split_note}", shape.b),
    };
    trace::kernel(describe, || match device {
        Device::Cpu => {
            let (output, lse) = super::cpu::cpu_serving(&job)?;
            Ok(SdpaOutput {
                output,
                lse: Some(lse),
                backend,
            })
        }
        _ if chunks > 1 => super::split::run(device, backend, &job, chunks),
        Device::Wgpu(index) => super::wgpu::wgpu_fused(index, backend, None, &job),
        Device::Cuda(ordinal) => super::cuda::fused(ordinal, backend, None, &job),
    })
}

/// The backend a serving call runs on `caps`'s device, flash on the CPU and
/// memory-efficient on a GPU (whose flash kernels take dense batches only), with its
/// reasons not to serve `p`, the dense call of the serving call's longest sequences: those
/// of the dense selection (enable flags, dtypes, head dims, ...) but grouped heads, which
/// PyTorch's memory-efficient kernel refuses and ours read, as serving needs.
pub fn serving_verdict(p: &SDPAParams, caps: &DeviceCaps) -> Verdict {
    let backend = match caps.device {
        Device::Cpu => SdpBackend::Flash,
        _ => SdpBackend::MemEfficient,
    };
    let (backend, mut reasons) = super::select::verdict(backend, p, caps);
    reasons.retain(|reason| *reason != Reason::Gqa);
    // The kernels compute f32, bf16 and f16 (no f64 row-by-row path here).
    let accepted = [DType::F32, DType::Bf16, DType::F16];
    if !accepted.contains(&p.query.dtype)
        && !reasons.iter().any(|r| matches!(r, Reason::Dtype { .. }))
    {
        reasons.push(Reason::Dtype {
            got: p.query.dtype,
            accepted: accepted.to_vec(),
        });
    }
    (backend, reasons)
}

/// Checks cumulative offsets: `[0, .., total]`, non-decreasing.
fn offsets(what: &'static str, cu: &[usize], total: usize) -> Result<()> {
    if cu.first() != Some(&0) || cu.last() != Some(&total) || cu.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid(
            what,
            format!(
                "{cu:?} are not cumulative sequence offsets of {total} packed rows: give B + 1 \
                 non-decreasing offsets from 0 to {total}"
            ),
        ));
    }
    Ok(())
}

fn mismatch(detail: String) -> Error {
    Error::ShapeMismatch { op: OP, detail }
}

fn invalid(what: &'static str, why: String) -> Error {
    Error::InvalidArgument { what, why }
}
