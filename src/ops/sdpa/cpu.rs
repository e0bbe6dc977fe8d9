//! The fused path on the CPU: threads over batch x heads x query blocks, each running the
//! kernels of [`crate::kernels::attention`] on its block; f64 inputs row by row in f64.

use half::{bf16, f16};

use super::math::Bias;
use super::{Job, OP_CPU, Sequences, host_f64};
use crate::core::tensor::{HostValues, Tensor, host_zeros};
use crate::kernels::attention::f64::{RowKeys, attend_row_f64};
use crate::kernels::attention::{
    BLOCK_M, BLOCK_N, BfPairs, BlockArgs, Floats, Line, MaskView, Shape, key_span, pair_values,
    transpose_keys,
};
use crate::kernels::convert::narrow;
use crate::{DType, Device, Error, Result};

/// The values of a float tensor as f32, row-major: borrowed from a contiguous f32 tensor,
/// else converted.
pub(crate) fn host_f32(t: &Tensor) -> Result<HostValues<'_, f32>> {
    if let Some(values) = t.contiguous_host::<f32>() {
        return Ok(HostValues::Lent(values));
    }
    Ok(HostValues::Copied(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?,
        DType::Bf16 => t.to_vec::<bf16>()?.into_iter().map(f32::from).collect(),
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f32::from).collect(),
        _ => host_f64(t)?.into_iter().map(|x| x as f32).collect(),
    }))
}

/// An attention mask as the fused kernels read it: additive f32 values (borrowed from a
/// contiguous f32 mask, else one row-major copy; a boolean mask as 0 and -inf) and its
/// broadcast strides over `[B, H, Lq, Lk]`.
pub(crate) struct Mask<'a> {
    values: HostValues<'a, f32>,
    strides: [usize; 4],
}

impl<'a> Mask<'a> {
    fn of(mask: &'a Tensor) -> Result<Mask<'a>> {
        let values = if mask.dtype() == DType::Bool {
            let hidden = |keep: bool| if keep { 0.0 } else { f32::NEG_INFINITY };
            HostValues::Copied(mask.to_bools()?.into_iter().map(hidden).collect())
        } else {
            host_f32(mask)?
        };
        let strides = super::broadcast_strides(
            mask.shape(),
            &crate::core::tensor::contiguous_strides(mask.shape()),
        );
        Ok(Mask { values, strides })
    }

    /// The `[Lq, Lk]` mask of batch `b`, head `h`.
    fn of_head(&self, b: usize, h: usize) -> MaskView<'_> {
        MaskView {
            values: &self.values,
            base: b * self.strides[0] + h * self.strides[1],
            si: self.strides[2],
            sj: self.strides[3],
        }
    }
}

/// q, k or v as the CPU fused path reads it: f32 values (borrowed when the tensor is
/// contiguous f32), or a 16-bit tensor's own elements (borrowed when contiguous, else one
/// row-major copy in its dtype), which each thread widens piece by piece as it needs them
/// (no serial whole-tensor conversion).
pub(crate) enum Input<'a> {
    F32(HostValues<'a, f32>),
    Bf16(HostValues<'a, bf16>),
    F16(HostValues<'a, f16>),
}

impl<'a> Input<'a> {
    fn of(t: &'a Tensor) -> Result<Input<'a>> {
        match t.dtype() {
            DType::Bf16 => t.elements().map(Input::Bf16),
            DType::F16 => t.elements().map(Input::F16),
            _ => host_f32(t).map(Input::F32),
        }
    }

    /// Elements `range` as f32 into `out` (of that length).
    fn copy_into(&self, range: std::ops::Range<usize>, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        match self {
            Input::F32(values) => out.copy_from_slice(&values[range]),
            Input::Bf16(values) => values[range].convert_to_f32_slice(out),
            Input::F16(values) => values[range].convert_to_f32_slice(out),
        }
    }

    /// Elements `range` as f32: borrowed for f32 inputs, else widened into `wide`.
    fn f32s<'s>(&'s self, range: std::ops::Range<usize>, wide: &'s mut Vec<f32>) -> &'s [f32] {
        if let Input::F32(values) = self {
            return &values[range];
        }
        wide.resize(range.len(), 0.0);
        self.copy_into(range, wide);
        wide
    }
}

/// One head's keys or values as f32 in line-aligned memory, kept while a thread works on
/// that head.
#[derive(Default)]
struct HeadCache {
    head: Option<usize>,
    lines: Vec<Line>,
    len: usize,
}

impl HeadCache {
    /// The values of head `head`: `len` floats that `fill` writes (into zeros) the first
    /// time this head is asked for.
    fn get_or_fill(&mut self, head: usize, len: usize, fill: impl FnOnce(&mut [f32])) -> &[f32] {
        if self.head != Some(head) {
            self.lines.clear();
            self.lines.resize(len.div_ceil(16), Line::ZERO);
            fill(&mut bytemuck::cast_slice_mut(&mut self.lines)[..len]);
            self.head = Some(head);
            self.len = len;
        }
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    /// Elements `range` of `input`, the head `head`'s, as f32: borrowed where the input is
    /// f32, else widened once per head.
    fn f32s<'s>(
        &'s mut self,
        input: &'s Input,
        head: usize,
        range: std::ops::Range<usize>,
    ) -> &'s [f32] {
        if let Input::F32(all) = input {
            return &all[range];
        }
        self.get_or_fill(head, range.len(), |out| input.copy_into(range, out))
    }
}

/// The CPU fused path: tiled online softmax over key blocks, threads over
/// batch x heads x query blocks. Memory beyond the inputs and outputs is, per thread, one
/// block of queries and scores, and one head's keys and values where they are widened from
/// 16 bits or transposed (never an Lq x Lk buffer).
pub(super) fn cpu_fused(job: &Job) -> Result<(Tensor, Tensor)> {
    let Job {
        query: q,
        key: k,
        value: v,
        options: o,
        shape: ref s,
        scale,
        ref out_shape,
        ..
    } = *job;
    let (qv, kv, vv) = (Input::of(q)?, Input::of(k)?, Input::of(v)?);
    let scale = scale as f32;
    let mask = o.attn_mask.map(Mask::of).transpose()?;
    #[cfg(target_arch = "x86_64")]
    if decodes(job) {
        let masks = mask.as_ref();
        let (out, lse) = match (&kv, &vv) {
            (Input::F32(k), Input::F32(v)) => decode(job, &qv, (k, v), masks)?,
            (Input::Bf16(k), Input::Bf16(v)) => decode(job, &qv, (k, v), masks)?,
            _ => unreachable!("`decodes` checked the inputs"),
        };
        return finish(q.dtype(), out, lse, &[s.b, s.h, s.lq], out_shape);
    }
    // Zeroed lazily by the allocator: each page is first touched by the thread that writes it.
    let mut out = host_zeros::<f32>(OP_CPU, s.b * s.h * s.lq * s.dv)?;
    let mut lse = host_zeros::<f32>(OP_CPU, s.b * s.h * s.lq)?;
    let blocks = s.lq.div_ceil(BLOCK_M);
    // Work items: one (batch, head, query block) each, in output order.
    let mut items: Vec<(usize, &mut [f32], &mut [f32])> = Vec::with_capacity(s.b * s.h * blocks);
    {
        let mut out_rest = out.as_mut_slice();
        let mut lse_rest = lse.as_mut_slice();
        for bh in 0..s.b * s.h {
            for blk in 0..blocks {
                let rows = BLOCK_M.min(s.lq - blk * BLOCK_M);
                let (o_here, o_next) = out_rest.split_at_mut(rows * s.dv);
                let (l_here, l_next) = lse_rest.split_at_mut(rows);
                items.push((bh * blocks + blk, o_here, l_here));
                out_rest = o_next;
                lse_rest = l_next;
            }
        }
    }
    let threads = crate::get_num_threads().min(items.len()).max(1);
    let per = items.len().div_ceil(threads);
    let kernels = crate::kernels::dispatch::cpu_kernels();
    let key_rows = kernels.attention_reads_key_rows;
    let (qv, kv, vv, mask) = (&qv, &kv, &vv, &mask);
    type Chunk<'o> = (Vec<(usize, &'o mut [f32], &'o mut [f32])>, Vec<f32>);
    let band = job.band(0);
    let pairs = match (bf16_block(job), qv, kv, vv) {
        (Some(block), Input::Bf16(q), Input::Bf16(k), Input::Bf16(v)) => Some((block, q, k, v)),
        _ => None,
    };
    let work = |(chunk, mut q_block): Chunk| {
        // The keys and values of the head in hand as f32 where the input is 16-bit, the keys
        // transposed where the kernel reads them so (threads take runs of items of one head).
        let mut k_head = HeadCache::default();
        let mut v_head = HeadCache::default();
        let mut wide = Vec::new();
        for (item, o_here, l_here) in chunk {
            let (bh, blk) = (item / blocks, item % blocks);
            let (b, h) = (bh / s.h, bh % s.h);
            let hk = s.kv_head(h);
            let rows = blk * BLOCK_M..(blk * BLOCK_M + BLOCK_M).min(s.lq);
            let kvh = b * s.hk + hk;
            let key_range = kvh * s.lk * s.d..(kvh + 1) * s.lk * s.d;
            let value_range = kvh * s.lk * s.dv..(kvh + 1) * s.lk * s.dv;
            let mask = mask.as_ref().map(|m| m.of_head(b, h));
            if let Some((block, q_all, k_all, v_all)) = pairs {
                // The head's values paired by keys, once per head.
                let words = s.lk.div_ceil(2) * s.dv;
                let v_pairs = v_head.get_or_fill(kvh, words, |out| {
                    pair_values(
                        &v_all[value_range],
                        s.lk,
                        s.dv,
                        bytemuck::cast_slice_mut(out),
                    )
                });
                let q_range = (bh * s.lq + rows.start) * s.d..(bh * s.lq + rows.end) * s.d;
                block(BlockArgs {
                    inputs: BfPairs {
                        q: &q_all[q_range],
                        k: &k_all[key_range],
                        v_pairs: bytemuck::cast_slice(v_pairs),
                        scale,
                    },
                    rows,
                    s,
                    band,
                    bias: mask,
                    out: o_here,
                    lse: l_here,
                });
                continue;
            }
            // The block's queries, scaled once here (the same f32 product the scores would
            // form each time).
            let q_rows = qv.f32s(
                (bh * s.lq + rows.start) * s.d..(bh * s.lq + rows.end) * s.d,
                &mut wide,
            );
            let q = &mut q_block[..q_rows.len()];
            for (x, &y) in q.iter_mut().zip(q_rows) {
                *x = y * scale;
            }
            let (k, kt) = if key_rows {
                (k_head.f32s(kv, kvh, key_range), &[][..])
            } else {
                let len = s.lk.div_ceil(BLOCK_N) * s.d * BLOCK_N;
                let kt = k_head.get_or_fill(kvh, len, |kt| {
                    transpose_keys(kv.f32s(key_range, &mut wide), s.lk, s.d, kt)
                });
                (&[][..], kt)
            };
            let v = v_head.f32s(vv, kvh, value_range);
            (kernels.attention_block)(BlockArgs {
                inputs: Floats { q, k, v, kt },
                rows,
                s,
                band,
                bias: mask,
                out: o_here,
                lse: l_here,
            });
        }
    };
    // Runs of `per` items, one per thread (the first on the calling thread), each with its
    // scaled query block, allocated here where a failure is an error (none without rows).
    let mut chunks = Vec::with_capacity(threads);
    let mut rest = items;
    while rest.len() > per {
        let tail = rest.split_off(per);
        chunks.push(std::mem::replace(&mut rest, tail));
    }
    if !rest.is_empty() {
        chunks.push(rest);
    }
    let block_len = query_block_len(s.d)?;
    let chunks: Vec<Chunk> = chunks
        .into_iter()
        .map(|chunk| Ok((chunk, host_zeros(OP_CPU, block_len)?)))
        .collect::<Result<_>>()?;
    crate::runtime::threads::for_each(chunks, &work);
    finish(q.dtype(), out, lse, &[s.b, s.h, s.lq], out_shape)
}

/// The fused block on bf16 dot products, where the call's q, k and v are bf16 with an even
/// head dim and this CPU's dot products pay ([`crate::runtime::cpu::bf16_dots_pay`]).
pub(super) fn bf16_block(job: &Job) -> Option<fn(BlockArgs<BfPairs>)> {
    let bf16 = [job.query, job.key, job.value]
        .iter()
        .all(|t| t.dtype() == DType::Bf16);
    let d = job.shape.d;
    let block = crate::kernels::dispatch::cpu_kernels().attention_block_bf16;
    block.filter(|_| bf16 && d > 0 && d.is_multiple_of(2))
}

/// The floats of one thread's block of scaled queries (`BLOCK_M` rows of `d`).
fn query_block_len(d: usize) -> Result<usize> {
    BLOCK_M.checked_mul(d).ok_or_else(|| Error::ShapeMismatch {
        op: OP_CPU,
        detail: format!("head dim {d} is too large for a query block"),
    })
}

/// The fused path for the serving calls (packed sequences, paged caches): threads over
/// (sequence, head, query block) items, balanced by the keys each reads; each thread
/// gathers the key and value rows of the sequence and head in hand (through the block
/// table where paged) into its own f32 buffers, once per head, and runs the block kernel
/// of the CPU level in force on them. `(out, lse)` as f32, in [`Job::out_row`] order.
pub(super) fn cpu_sequences(job: &Job) -> Result<(Vec<f32>, Vec<f32>)> {
    let s = &job.shape;
    let (qv, kv, vv) = (
        Input::of(job.query)?,
        Input::of(job.key)?,
        Input::of(job.value)?,
    );
    let scale = job.scale as f32;
    // The outputs first (fallibly: with a head dim of 0, H may be as large as usize), then
    // no more items than rows.
    let total_rows = (0..s.b)
        .try_fold(0usize, |n, b| {
            n.checked_add(s.h.checked_mul(job.lengths(b).0)?)
        })
        .ok_or_else(|| Error::ShapeMismatch {
            op: OP_CPU,
            detail: format!("{} query heads of {} sequences overflow", s.h, s.b),
        })?;
    let mut out = host_zeros::<f32>(OP_CPU, total_rows.saturating_mul(s.dv))?;
    let mut lse = host_zeros::<f32>(OP_CPU, total_rows)?;
    // Items in output order, with the keys each reads as its cost.
    let mut items = Vec::new();
    for b in 0..s.b {
        let (lq, lk) = job.lengths(b);
        if lq == 0 {
            continue;
        }
        for h in 0..s.h {
            for first in (0..lq).step_by(BLOCK_M) {
                let rows = first..(first + BLOCK_M).min(lq);
                let (start, end) = key_span(job.band(b), rows.clone(), lk);
                let cost = rows.len() * (end - start).max(1);
                items.push((job.out_row(b, h) + first, b, h, rows, cost));
            }
        }
    }
    items.sort_by_key(|item| item.0);
    // Contiguous runs of items of about equal cost, one per thread.
    let threads = crate::get_num_threads().min(items.len()).max(1);
    let total: usize = items.iter().map(|item| item.4).sum();
    let block_len = query_block_len(s.d)?;
    type Item<'o> = (
        usize,
        usize,
        std::ops::Range<usize>,
        &'o mut [f32],
        &'o mut [f32],
    );
    let mut chunks: Vec<(Vec<Item>, Vec<f32>)> = Vec::with_capacity(threads);
    let (mut out_rest, mut lse_rest) = (out.as_mut_slice(), lse.as_mut_slice());
    let mut taken = 0;
    let mut spent = 0;
    for (row, b, h, rows, cost) in items {
        if chunks.is_empty() || spent * threads > total * chunks.len() {
            chunks.push((Vec::new(), host_zeros(OP_CPU, block_len)?));
        }
        spent += cost;
        // Skip to this item's rows (items are in output order), then take them.
        let (_, o) = out_rest.split_at_mut((row - taken) * s.dv);
        let (_, l) = lse_rest.split_at_mut(row - taken);
        let (o, o_next) = o.split_at_mut(rows.len() * s.dv);
        let (l, l_next) = l.split_at_mut(rows.len());
        (out_rest, lse_rest) = (o_next, l_next);
        taken = row + rows.len();
        chunks
            .last_mut()
            .expect("pushed above")
            .0
            .push((b, h, rows, o, l));
    }
    let kernels = crate::kernels::dispatch::cpu_kernels();
    let key_rows = kernels.attention_reads_key_rows;
    let pairs = match (bf16_block(job), &qv, &kv, &vv) {
        (Some(block), Input::Bf16(q), Input::Bf16(k), Input::Bf16(v)) => Some((block, q, k, v)),
        _ => None,
    };
    let work = |(chunk, mut q_block): (Vec<Item>, Vec<f32>)| {
        let (mut k_head, mut v_head) = (HeadCache::default(), HeadCache::default());
        let mut wide = Vec::new();
        let (mut q16, mut v16) = (Vec::new(), Vec::new());
        for (b, h, rows, o, l) in chunk {
            let hk = s.kv_head(h);
            let (lq, lk) = job.lengths(b);
            let shape = Shape { lq, lk, ..*s };
            let q_rows = job.q_rows(b, h);
            let head = b * s.hk + hk;
            if let Some((block, q_all, k_all, v_all)) = pairs {
                // The block's queries and the head's keys gathered as they are, the values
                // gathered and paired by keys.
                q16.resize(rows.len() * s.d, bf16::ZERO);
                let block_rows = q_rows.skipping(rows.start);
                gather_rows(block_rows, rows.len(), s.d, &mut q16, |at, query| {
                    query.copy_from_slice(&q_all[at])
                });
                let gather = |all: &[bf16], width: usize, out: &mut [bf16]| {
                    let rows = job.kv_rows(b, hk, width);
                    gather_rows(rows, lk, width, out, |at, row| {
                        row.copy_from_slice(&all[at])
                    });
                };
                let k = k_head.get_or_fill(head, lk * s.d / 2, |out| {
                    gather(k_all, s.d, bytemuck::cast_slice_mut(out))
                });
                let v_pairs = v_head.get_or_fill(head, lk.div_ceil(2) * s.dv, |out| {
                    v16.resize(lk * s.dv, bf16::ZERO);
                    gather(v_all, s.dv, &mut v16);
                    pair_values(&v16, lk, s.dv, bytemuck::cast_slice_mut(out));
                });
                block(BlockArgs {
                    inputs: BfPairs {
                        q: &q16,
                        k: bytemuck::cast_slice(k),
                        v_pairs: bytemuck::cast_slice(v_pairs),
                        scale,
                    },
                    rows,
                    s: &shape,
                    band: job.band(b),
                    bias: None,
                    out: o,
                    lse: l,
                });
                continue;
            }
            let q = &mut q_block[..rows.len() * s.d];
            gather_rows(
                q_rows.skipping(rows.start),
                rows.len(),
                s.d,
                q,
                |at, query| {
                    qv.copy_into(at, query);
                    query.iter_mut().for_each(|x| *x *= scale);
                },
            );
            let gather = |input: &Input, width: usize, out: &mut [f32]| {
                let rows = job.kv_rows(b, hk, width);
                gather_rows(rows, lk, width, out, |at, row| input.copy_into(at, row));
            };
            let (k, kt) = if key_rows {
                (
                    k_head.get_or_fill(head, lk * s.d, |out| gather(&kv, s.d, out)),
                    &[][..],
                )
            } else {
                let len = lk.div_ceil(BLOCK_N) * s.d * BLOCK_N;
                let kt = k_head.get_or_fill(head, len, |kt| {
                    wide.resize(lk * s.d, 0.0);
                    gather(&kv, s.d, &mut wide);
                    transpose_keys(&wide, lk, s.d, kt);
                });
                (&[][..], kt)
            };
            let v = v_head.get_or_fill(head, lk * s.dv, |out| gather(&vv, s.dv, out));
            (kernels.attention_block)(BlockArgs {
                inputs: Floats { q, k, v, kt },
                rows,
                s: &shape,
                band: job.band(b),
                bias: None,
                out: o,
                lse: l,
            });
        }
    };
    crate::runtime::threads::for_each(chunks, &work);
    Ok((out, lse))
}

/// Rows `0..count` of one head (`width` elements each, where `rows` places them) into `out`,
/// one after another, each by `copy(its elements, its place in out)`.
fn gather_rows<T>(
    rows: crate::kernels::attention::Rows,
    count: usize,
    width: usize,
    out: &mut [T],
    mut copy: impl FnMut(std::ops::Range<usize>, &mut [T]),
) {
    for (j, row) in out.chunks_exact_mut(width.max(1)).take(count).enumerate() {
        let at = rows.at(j);
        copy(at..at + width, row);
    }
}

/// The serving calls' CPU path ([`super::serving`]): the decoding kernel for paged caches
/// with a few query rows per head group (reading each block through the table), else the
/// block kernel over gathered heads ([`cpu_sequences`]). `(output, lse)` in the call's
/// layouts: packed calls `[total_q, H, Dv]` and `[H, total_q]`, paged ones `[B, H, Lq, Dv]`
/// and `[B, H, Lq]`.
pub(super) fn cpu_serving(job: &Job) -> Result<(Tensor, Tensor)> {
    let s = &job.shape;
    #[cfg(target_arch = "x86_64")]
    if decodes(job) {
        let qv = Input::of(job.query)?;
        let (out, lse) = match (Input::of(job.key)?, Input::of(job.value)?) {
            (Input::F32(k), Input::F32(v)) => decode(job, &qv, (&k, &v), None)?,
            (Input::Bf16(k), Input::Bf16(v)) => decode(job, &qv, (&k, &v), None)?,
            _ => unreachable!("`decodes` checked the inputs"),
        };
        return finish(
            job.query.dtype(),
            out,
            lse,
            &[s.b, s.h, s.lq],
            &job.out_shape,
        );
    }
    let (out, lse) = cpu_sequences(job)?;
    match job.seqs {
        Some(Sequences::Packed { cu_q, .. }) => {
            let total = cu_q[cu_q.len() - 1];
            let head_major = [s.h, total, s.dv];
            let (output, lse) = finish(job.query.dtype(), out, lse, &[s.h, total], &head_major)?;
            Ok((output.permute(&[1, 0, 2])?.contiguous()?, lse))
        }
        _ => finish(
            job.query.dtype(),
            out,
            lse,
            &[s.b, s.h, s.lq],
            &job.out_shape,
        ),
    }
}

/// What the trace names as the kernel of a serving call.
pub(super) fn sequences_kernel(job: &Job) -> String {
    #[cfg(target_arch = "x86_64")]
    if decodes(job) {
        let heads = match heads_per_unit(job) {
            1 => "",
            _ => ", a block's heads read together",
        };
        return match kv_splits(job) {
            1 => format!("decoding kernel, blocks read through the table{heads}"),
            runs => format!(
                "decoding kernel, blocks read through the table{heads}, keys split into {runs} \
                 runs combined by their log-sum-exps"
            ),
        };
    }
    let products = if bf16_block(job).is_some() {
        ", bf16 dot products (f32 sums)"
    } else {
        ""
    };
    format!("fused online softmax over each sequence's gathered heads{products}")
}

/// The f32 outputs as a tensor of `dtype`, and the log-sum-exp.
fn finish(
    dtype: DType,
    out: Vec<f32>,
    lse: Vec<f32>,
    lse_shape: &[usize],
    out_shape: &[usize],
) -> Result<(Tensor, Tensor)> {
    let threads = crate::get_num_threads();
    let output = match dtype {
        DType::F32 => Tensor::from_vec(out, out_shape, Device::Cpu)?,
        DType::Bf16 => Tensor::from_vec(
            narrow::<bf16>(OP_CPU, out, threads)?,
            out_shape,
            Device::Cpu,
        )?,
        DType::F16 => {
            Tensor::from_vec(narrow::<f16>(OP_CPU, out, threads)?, out_shape, Device::Cpu)?
        }
        dtype => {
            let out: Vec<f64> = out.into_iter().map(f64::from).collect();
            Tensor::from_f64(&out, out_shape, dtype, Device::Cpu)?
        }
    };
    let lse = Tensor::from_vec(lse, lse_shape, Device::Cpu)?;
    Ok((output, lse))
}

/// Whether the decoding kernel serves `job`: a few query rows per key/value head group
/// (Lq ≤ 4), keys and values both f32 or both bf16, and a vector level it runs on. With
/// fewer groups than threads it still beats the block kernel, whose 48-row tiles would
/// compute rows the call does not have (2.6-3.5x at Lk = 1024-2048 on 1 group), and long
/// keys are split over the idle threads ([`kv_splits`]).
#[cfg(target_arch = "x86_64")]
pub(super) fn decodes(job: &Job) -> bool {
    use crate::kernels::attention::decode::{MAX_GROUP_ROWS, MAX_QUERY_ROWS, available};
    let s = &job.shape;
    let group = s.h / s.hk.max(1);
    let same = |dtype| job.key.dtype() == dtype && job.value.dtype() == dtype;
    // Empty outputs (no rows, or a value dim of 0) are the block kernel's edge cases.
    // Packed sequences' query rows are not grouped by head: the block kernel serves them.
    !matches!(job.seqs, Some(Sequences::Packed { .. }))
        && (1..=MAX_GROUP_ROWS).contains(&(group * s.lq))
        && s.lq <= MAX_QUERY_ROWS
        && s.dv > 0
        && s.h.is_multiple_of(s.hk.max(1))
        && (same(DType::F32) || same(DType::Bf16))
        && job.key.is_contiguous()
        && job.value.is_contiguous()
        && available()
}

/// The decoding kernel over every (batch, key/value head) group, the groups spread over
/// the threads; where there are fewer groups than threads, each group's keys are split
/// into [`kv_splits`] runs computed in parallel, whose partial results are combined by
/// their log-sum-exps. `(out, lse)` as f32.
#[cfg(target_arch = "x86_64")]
fn decode<E: crate::kernels::simd::Load>(
    job: &Job,
    qv: &Input,
    (kv, vv): (&[E], &[E]),
    masks: Option<&Mask>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    use crate::kernels::attention::decode::{Group, run};
    let s = &job.shape;
    let scale = job.scale as f32;
    let group = s.h / s.hk.max(1);
    // Each unit's key/value heads, and its query rows: those of each head in turn.
    let heads = heads_per_unit(job);
    let rows = group * s.lq * heads;
    let groups = s.b * s.hk / heads;
    let splits = kv_splits(job);
    // Each sequence's keys split into `splits` runs (the longest run sets the scratch).
    let runs_of = |b: usize| {
        let span = decoded_keys(job, b);
        (span.clone(), span.len().div_ceil(splits))
    };
    let stride = longest_span(job).div_ceil(splits).next_multiple_of(16);
    let mut out = host_zeros::<f32>(OP_CPU, s.b * s.h * s.lq * s.dv)?;
    let mut lse = host_zeros::<f32>(OP_CPU, s.b * s.h * s.lq)?;
    // With splits, each (group, run of keys) unit writes its partial result here first.
    let (mut partial_out, mut partial_lse) = if splits > 1 {
        (
            host_zeros::<f32>(OP_CPU, groups * splits * rows * s.dv)?,
            host_zeros::<f32>(OP_CPU, groups * splits * rows)?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let units = groups * splits;
    let threads = crate::get_num_threads().min(units);
    // Each thread's scores and queries (none without units), allocated here, where a
    // failure is an error.
    let scratch = rows
        .checked_mul(stride)
        .ok_or_else(|| Error::ShapeMismatch {
            op: OP_CPU,
            detail: format!("{rows} query rows x {} keys overflow", s.lk),
        })?;
    let buffers = (0..threads)
        .map(|_| {
            Ok((
                host_zeros::<f32>(OP_CPU, scratch)?,
                host_zeros(OP_CPU, rows * s.d)?,
            ))
        })
        .collect::<Result<Vec<(Vec<f32>, Vec<f32>)>>>()?;
    // Each unit's outputs, taken by whichever thread claims the unit next: a thread that
    // starts late or runs slower takes fewer units.
    let (mut out_rest, mut lse_rest) = if splits > 1 {
        (partial_out.as_mut_slice(), partial_lse.as_mut_slice())
    } else {
        (out.as_mut_slice(), lse.as_mut_slice())
    };
    let mut slots = Vec::with_capacity(units);
    for _ in 0..units {
        let (o, o_next) = out_rest.split_at_mut(rows * s.dv);
        let (l, l_next) = lse_rest.split_at_mut(rows);
        (out_rest, lse_rest) = (o_next, l_next);
        slots.push(std::sync::Mutex::new(Some((o, l))));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    crate::runtime::threads::for_each(buffers, &|(mut scores, mut q): (Vec<f32>, Vec<f32>)| {
        let mut wide = Vec::new();
        let mut row_info = Vec::with_capacity(rows);
        loop {
            let unit = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(slot) = slots.get(unit) else { break };
            let taken = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            let (o, l) = taken.expect("each unit is claimed once");
            let (kvh, split) = (unit / splits, unit % splits);
            let (b, hk) = (kvh / (s.hk / heads), kvh % (s.hk / heads) * heads);
            let (span, run_keys) = runs_of(b);
            let first_key = span.start + split * run_keys;
            let keys = first_key..span.end.min(first_key + run_keys);
            let (band, lk) = (job.band(b), job.lengths(b).1);
            // The unit's query rows are contiguous: heads hk·group.., each with Lq rows.
            let first_row = (b * s.h + hk * group) * s.lq;
            let q_rows = qv.f32s(first_row * s.d..(first_row + rows) * s.d, &mut wide);
            for (x, &y) in q.iter_mut().zip(q_rows) {
                *x = y * scale;
            }
            row_info.clear();
            for r in 0..rows {
                let (h, i) = (hk * group + r / s.lq, r % s.lq);
                let seen = band.map_or(0..lk, |band| band.keys(i, lk));
                // The run's keys this row sees (counted from the run's first), and its mask
                // from the run's first key on.
                let at = |j: usize| j.clamp(keys.start, keys.end) - keys.start;
                let visible = at(seen.start)..at(seen.end);
                let mask = masks.map(|m| {
                    let view = m.of_head(b, h);
                    MaskView {
                        base: view.base + keys.start * view.sj,
                        ..view
                    }
                });
                row_info.push((visible, mask, i));
            }
            run(Group {
                q: &q,
                k: kv,
                v: vv,
                k_rows: job.kv_rows(b, hk, s.d).skipping(keys.start),
                v_rows: job.kv_rows(b, hk, s.dv).skipping(keys.start),
                heads,
                // (Heads are read together only from a paged cache: a key's heads side by side.)
                head_offsets: (s.d, s.dv),
                lk: keys.len(),
                d: s.d,
                dv: s.dv,
                rows: &row_info,
                out: o,
                lse: l,
                scores: &mut scores,
            });
        }
    });
    if splits > 1 {
        let shape = (splits, rows, s.dv);
        combine_runs((&partial_out, &partial_lse), shape, &mut out, &mut lse);
    }
    Ok((out, lse))
}

/// Keys per run at least where a decoding group's keys are split: below this, handing a
/// run to another thread costs more than the keys it spares (runs of 512 and 1024 keys
/// ran at 0.62x and 0.93x of the unsplit call on a 2-core Xeon).
#[cfg(target_arch = "x86_64")]
const MIN_RUN_KEYS: usize = 2048;

/// Runs of keys per thread where a decoding group's keys are split, claimed by whichever
/// thread is free: with two, a worker woken late or running slower takes fewer (B=1, H=1,
/// Lk=8192, D=128 on 2 threads of an AMD EPYC Zen 5 VM: 1.36-1.40x the unsplit call in
/// f32 and 1.47-1.48x in bf16, against 1.12-1.21x and 1.01-1.26x with one run each).
#[cfg(target_arch = "x86_64")]
const RUNS_PER_THREAD: usize = 2;

/// The keys a decoding group of sequence `b` reads: those some query row of it sees (all
/// of them without a band; a sliding window's span otherwise, whatever the cache's length).
#[cfg(target_arch = "x86_64")]
fn decoded_keys(job: &Job, b: usize) -> std::ops::Range<usize> {
    let (lq, lk) = job.lengths(b);
    match job.band(b) {
        Some(band) if lq > 0 => {
            let first = band.keys(0, lk).start;
            first..band.keys(lq - 1, lk).end.max(first)
        }
        _ => 0..lk,
    }
}

/// The most keys a decoding group of `job` reads: of any sequence of a serving call, of
/// the first where all are alike (a dense call, whose batch may be huge and empty).
#[cfg(target_arch = "x86_64")]
fn longest_span(job: &Job) -> usize {
    let sequences = match job.seqs {
        None => job.shape.b.min(1),
        Some(_) => job.shape.b,
    };
    (0..sequences)
        .map(|b| decoded_keys(job, b).len())
        .max()
        .unwrap_or(0)
}

/// Key/value heads a decoding unit reads together: all of a sequence's where a paged cache
/// keeps a key's heads side by side and their query rows fit the kernel (the blocks are
/// then read in order, each once, where a unit per head read every block once per head,
/// in rows a block's other heads apart); else one.
#[cfg(target_arch = "x86_64")]
fn heads_per_unit(job: &Job) -> usize {
    use crate::kernels::attention::decode::MAX_GROUP_ROWS;
    let s = &job.shape;
    let paged = matches!(job.seqs, Some(Sequences::Paged { .. }));
    if paged && s.hk > 1 && s.h * s.lq <= MAX_GROUP_ROWS {
        s.hk
    } else {
        1
    }
}

/// How many runs each decoding group's keys are split into: one where the groups alone
/// give every thread work, else [`RUNS_PER_THREAD`] runs per thread (of at least
/// [`MIN_RUN_KEYS`] keys).
#[cfg(target_arch = "x86_64")]
pub(super) fn kv_splits(job: &Job) -> usize {
    let groups = (job.shape.b * job.shape.hk / heads_per_unit(job)).max(1);
    let threads = crate::get_num_threads();
    if groups >= threads {
        return 1;
    }
    (RUNS_PER_THREAD * threads)
        .div_ceil(groups)
        .min(longest_span(job) / MIN_RUN_KEYS)
        .max(1)
}

/// The rows' results from their runs' partial ones (`[group][run][row]`, the runs of a
/// group in key order; the outputs `[group][row]`): each run's output weighted by its share
/// of the row's softmax denominator, `exp(lse_run - lse_row)`. A row no run saw stays 0
/// with log-sum-exp -inf; a NaN in any run makes the row NaN.
#[cfg(target_arch = "x86_64")]
fn combine_runs(
    (partial_out, partial_lse): (&[f32], &[f32]),
    (splits, rows, dv): (usize, usize, usize),
    out: &mut [f32],
    lse: &mut [f32],
) {
    let groups = out
        .chunks_exact_mut(rows * dv)
        .zip(lse.chunks_exact_mut(rows));
    for (g, (out, lse)) in groups.enumerate() {
        let run_lse = |run: usize, r: usize| partial_lse[(g * splits + run) * rows + r];
        for (r, (row, row_lse)) in out.chunks_exact_mut(dv).zip(lse.iter_mut()).enumerate() {
            // The largest run lse, or NaN where any is (f32::max would drop it).
            let top = (0..splits)
                .map(|run| run_lse(run, r))
                .fold(f32::NEG_INFINITY, |m, x| {
                    if m.is_nan() || x.is_nan() {
                        f32::NAN
                    } else {
                        m.max(x)
                    }
                });
            if top.is_nan() || top == f32::NEG_INFINITY {
                row.fill(if top.is_nan() { f32::NAN } else { 0.0 });
                *row_lse = top;
                continue;
            }
            row.fill(0.0);
            let mut total = 0.0;
            for run in 0..splits {
                let weight = (run_lse(run, r) - top).exp();
                total += weight;
                let part = &partial_out[((g * splits + run) * rows + r) * dv..][..dv];
                for (y, &x) in row.iter_mut().zip(part) {
                    *y += weight * x;
                }
            }
            for y in row.iter_mut() {
                *y /= total;
            }
            *row_lse = top + total.ln();
        }
    }
}

/// The fused path for f64 inputs, computed in f64 as PyTorch's CPU flash kernel does for
/// them: each query row streams its keys through an online softmax (no score buffer),
/// threads over runs of rows. The log-sum-exp is f64 too.
pub(super) fn cpu_fused_f64(job: &Job) -> Result<(Tensor, Tensor)> {
    let Job {
        query: q,
        key: k,
        value: v,
        options: o,
        shape: ref s,
        scale,
        ref out_shape,
        ..
    } = *job;
    let (qv, kv, vv) = (host_f64(q)?, host_f64(k)?, host_f64(v)?);
    let bias = Bias::of(o.attn_mask)?;
    let band = job.band(0);
    let mut out = host_zeros::<f64>(OP_CPU, s.b * s.h * s.lq * s.dv)?;
    let mut lse = host_zeros::<f64>(OP_CPU, s.b * s.h * s.lq)?;
    let rows = s.b * s.h * s.lq;
    let threads = crate::get_num_threads().min(rows).max(1);
    let per = rows.div_ceil(threads).max(1);
    let mut chunks = Vec::with_capacity(threads);
    let (mut out_rest, mut lse_rest) = (out.as_mut_slice(), lse.as_mut_slice());
    while !lse_rest.is_empty() {
        let n = per.min(lse_rest.len());
        let (o_here, o_next) = out_rest.split_at_mut(n * s.dv);
        let (l_here, l_next) = lse_rest.split_at_mut(n);
        chunks.push((chunks.len(), (o_here, l_here)));
        (out_rest, lse_rest) = (o_next, l_next);
    }
    let (qv, kv, vv, bias) = (&qv, &kv, &vv, &bias);
    crate::runtime::threads::for_each(chunks, &|(chunk, (out, lse)): (
        usize,
        (&mut [f64], &mut [f64]),
    )| {
        for (r, l) in lse.iter_mut().enumerate() {
            let row = chunk * per + r;
            let (bh, i) = (row / s.lq, row % s.lq);
            let (b, h) = (bh / s.h, bh % s.h);
            let kvh = b * s.hk + s.kv_head(h);
            let keys = band.map_or(0..s.lk, |band| band.keys(i, s.lk));
            let first = keys.start;
            *l = attend_row_f64(
                &qv[row * s.d..][..s.d],
                RowKeys {
                    count: keys.len(),
                    keys: &kv[(kvh * s.lk + first) * s.d..][..keys.len() * s.d],
                    values: &vv[(kvh * s.lk + first) * s.dv..][..keys.len() * s.dv],
                    bias: &|j| {
                        bias.as_ref()
                            .map_or(0.0, |bias| bias.at(b, h, i, first + j))
                    },
                },
                scale,
                &mut out[r * s.dv..][..s.dv],
            );
        }
    });
    Ok((
        Tensor::from_vec(out, out_shape, Device::Cpu)?,
        Tensor::from_vec(lse, &[s.b, s.h, s.lq], Device::Cpu)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::{HeadCache, Input};
    use crate::{Device, Tensor};

    #[test]
    fn head_values_are_borrowed_for_f32_and_widened_once_into_aligned_lines_for_16_bits() {
        let all: Vec<f32> = (0..4096).map(|i| (i as f32).sin()).collect();
        let tensor = Tensor::from_vec(all.clone(), &[4096], Device::Cpu).unwrap();
        let input = Input::of(&tensor).unwrap();
        let mut cache = HeadCache::default();
        let start = tensor.data_ptr().unwrap() + 5 * 4;
        assert_eq!(cache.f32s(&input, 0, 5..77).as_ptr() as usize, start);
        let halves: Vec<half::bf16> = all.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let tensor = Tensor::from_vec(halves.clone(), &[4096], Device::Cpu).unwrap();
        let input = Input::of(&tensor).unwrap();
        let got = cache.f32s(&input, 3, 5..53).to_vec();
        assert_eq!(
            got,
            halves[5..53].iter().map(|x| x.to_f32()).collect::<Vec<_>>()
        );
        // The same head again: the cached values, on a cache line.
        let again = cache.f32s(&input, 3, 5..53);
        assert!((again.as_ptr() as usize).is_multiple_of(64));
        assert_eq!(again, &got[..]);
    }
}
