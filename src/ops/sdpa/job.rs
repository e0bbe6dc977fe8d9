//! One attention call after selection, as every kernel path reads it: the inputs, sizes
//! and options ([`Job`]), the sequences of a serving call and where their rows lie, and the
//! arguments the GPU kernels take for its band and rows.

use super::SdpaOptions;
use crate::core::generator::Draw;
use crate::core::sdp::CausalVariant;
use crate::core::tensor::Tensor;
use crate::kernels::attention::{Band, Pages, Rows, Shape};
use crate::{Error, Result};

/// One attention call after selection: the inputs, options, sizes, scale and output shape.
#[derive(Clone)]
pub(super) struct Job<'a> {
    pub(super) query: &'a Tensor,
    pub(super) key: &'a Tensor,
    pub(super) value: &'a Tensor,
    pub(super) options: &'a SdpaOptions<'a>,
    pub(super) shape: Shape,
    pub(super) scale: f64,
    pub(super) out_shape: Vec<usize>,
    /// The generator's draw for dropout (`None` without dropout).
    pub(super) dropout: Option<Draw>,
    /// Where each sequence's rows lie, for the serving calls (`None`: the dense
    /// `[B, H, L, D]` of `shape`).
    pub(super) seqs: Option<Sequences<'a>>,
}

/// The sequences of a serving call ([`super::serving`]), each with its own lengths: packed along
/// dimension 0 by cumulative offsets, or with its keys and values in a paged cache.
#[derive(Clone, Copy, Debug)]
pub(super) enum Sequences<'a> {
    /// q `[total_q, H, D]`, k and v `[total_k, Hk, D]`: sequence b's rows are
    /// `cu_q[b]..cu_q[b + 1]` and `cu_k[b]..cu_k[b + 1]`.
    Packed {
        cu_q: &'a [usize],
        cu_k: &'a [usize],
    },
    /// q `[B, H, Lq, D]`; k and v `[blocks, block, Hk, D]`: sequence b's key j is slot
    /// `j % block` of cache block `table[b * per_seq + j / block]`, for `j < lens[b]`.
    Paged {
        table: &'a [usize],
        per_seq: usize,
        block: usize,
        lens: &'a [usize],
    },
}

/// The band of `job` as the GPU kernels take it: `[banded, lo, hi, lower_right]`, key j
/// visible to query i of a sequence when `i + diag + lo <= j <= i + diag + hi` where
/// `banded` is 1, `diag` 0 (`lower_right` 0) or that sequence's `Lk - Lq`; an unbounded
/// side as ±2^29 (past any length here). Zeros without a band. A typed error where a length
/// reaches 2^28 (the kernels' sums of positions and offsets then fit in an `i32`).
pub(super) fn band_args(op: &'static str, job: &Job) -> Result<[i32; 4]> {
    const UNBOUNDED: isize = 1 << 29;
    let o = job.options;
    let Some(band) = Band::around_diagonal(o.is_causal, o.window) else {
        return Ok([0; 4]);
    };
    let (lq, lk) = (job.shape.lq, job.shape.lk);
    if lq.max(lk) >= 1 << 28 {
        return Err(Error::ShapeMismatch {
            op,
            detail: format!(
                "causal or windowed attention of {lq} queries over {lk} keys exceeds the \
                 kernels' positions (below 2^28 each); split the call"
            ),
        });
    }
    let edge = |x: Option<isize>, unbounded: isize| {
        x.unwrap_or(unbounded).clamp(-UNBOUNDED, UNBOUNDED) as i32
    };
    Ok([
        1,
        edge(band.lo, -UNBOUNDED),
        edge(band.hi, UNBOUNDED),
        i32::from(o.causal_variant == CausalVariant::LowerRight),
    ])
}

/// How the GPU attention kernels find a call's rows: the (batch, head, row) element strides
/// of q, k, v and o, the log-sum-exp's (batch, head) strides, and for a serving call the
/// sequence table they read (`seqs` 1 packed, 2 paged, 0 dense; the layout the kernels'
/// headers describe). Packed q, k and v may be views with a contiguous last dimension (the
/// split-KV chunks read a dense call's keys that way); paged caches are contiguous
/// ([`super::serving`] makes them so).
pub(super) struct GpuRows {
    pub(super) q: [usize; 3],
    pub(super) k: [usize; 3],
    pub(super) v: [usize; 3],
    pub(super) o: [usize; 3],
    pub(super) lse: [usize; 2],
    /// How many log-sum-exps the call has.
    pub(super) lse_len: usize,
    pub(super) seqs: u32,
    /// The table (one 0 for a dense call: the kernels never read it).
    pub(super) seq: Vec<u32>,
    pub(super) seq_k: usize,
    pub(super) table: usize,
    pub(super) per_seq: usize,
    pub(super) block: usize,
}

impl GpuRows {
    /// The rows of `job`; `[q, k, v]` are the strides of a dense call's tensors.
    pub(super) fn of(op: &'static str, job: &Job, [q, k, v]: [[usize; 3]; 3]) -> Result<GpuRows> {
        let s = &job.shape;
        let dense_out = [s.h * s.lq * s.dv, s.lq * s.dv, s.dv];
        let dense_lse = [s.h * s.lq, s.lq];
        let words = |values: &mut dyn Iterator<Item = usize>| -> Result<Vec<u32>> {
            values
                .map(|x| {
                    u32::try_from(x).map_err(|_| Error::ShapeMismatch {
                        op,
                        detail: format!("a sequence offset or block index {x} exceeds 32 bits"),
                    })
                })
                .collect()
        };
        let packed_rows = |heads: usize, width: usize| [0, width, heads * width];
        // A packed tensor [tokens, heads, width] of any strides (the last contiguous):
        // (batch, head, row) strides as the kernels take them.
        let packed = |t: &Tensor| [0, t.strides()[1], t.strides()[0]];
        Ok(match job.seqs {
            None => GpuRows {
                q,
                k,
                v,
                o: dense_out,
                lse: dense_lse,
                lse_len: s.b * s.h * s.lq,
                seqs: 0,
                seq: vec![0],
                seq_k: 0,
                table: 0,
                per_seq: 0,
                block: 0,
            },
            Some(Sequences::Packed { cu_q, cu_k }) => {
                let total = cu_q[cu_q.len() - 1];
                GpuRows {
                    q: packed(job.query),
                    k: packed(job.key),
                    v: packed(job.value),
                    o: packed_rows(s.h, s.dv),
                    lse: [0, total],
                    lse_len: s.h * total,
                    seqs: 1,
                    seq: words(&mut cu_q.iter().chain(cu_k).copied())?,
                    seq_k: cu_q.len(),
                    table: 0,
                    per_seq: 0,
                    block: 0,
                }
            }
            Some(Sequences::Paged {
                table,
                per_seq,
                block,
                lens,
            }) => GpuRows {
                q: [s.h * s.lq * s.d, s.lq * s.d, s.d],
                k: packed_rows(s.hk, s.d),
                v: packed_rows(s.hk, s.dv),
                o: dense_out,
                lse: dense_lse,
                lse_len: s.b * s.h * s.lq,
                seqs: 2,
                seq: words(&mut lens.iter().chain(table).copied())?,
                seq_k: 0,
                table: lens.len(),
                per_seq,
                block,
            },
        })
    }

    /// The sequence words the kernels take after the strides: seqs, seq_k, table, per_seq,
    /// block (and then the log-sum-exp strides).
    pub(super) fn sequence_words(&self) -> [usize; 5] {
        [
            self.seqs as usize,
            self.seq_k,
            self.table,
            self.per_seq,
            self.block,
        ]
    }
}

impl<'a> Job<'a> {
    /// The call of q, k, v (sizes `shape`) with `options` over `seqs`: its scale (`1 / √D`
    /// by default) and output shape (q's with the value dim last), whose element count is
    /// checked to fit (every size the kernels compute from it then does); no dropout draw.
    pub(super) fn new(
        [query, key, value]: [&'a Tensor; 3],
        options: &'a SdpaOptions<'a>,
        shape: Shape,
        seqs: Option<Sequences<'a>>,
    ) -> Result<Job<'a>> {
        let mut out_shape = query.shape().to_vec();
        *out_shape.last_mut().expect("validated rank") = shape.dv;
        crate::core::tensor::checked_numel(super::OP, &out_shape, query.dtype())?;
        Ok(Job {
            query,
            key,
            value,
            options,
            shape,
            scale: options.scale.unwrap_or(1.0 / (shape.d as f64).sqrt()),
            out_shape,
            dropout: None,
            seqs,
        })
    }

    /// The query and key lengths of sequence `b`.
    pub(super) fn lengths(&self, b: usize) -> (usize, usize) {
        match self.seqs {
            None => (self.shape.lq, self.shape.lk),
            Some(Sequences::Packed { cu_q, cu_k }) => {
                (cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b])
            }
            Some(Sequences::Paged { lens, .. }) => (self.shape.lq, lens[b]),
        }
    }

    /// The keys each query row of sequence `b` sees (causal mask, sliding window) as the
    /// kernels take them, or `None` where every row sees every key.
    pub(super) fn band(&self, b: usize) -> Option<Band> {
        let o = self.options;
        let (lq, lk) = self.lengths(b);
        Band::new(o.is_causal, o.causal_variant, o.window, lq, lk)
    }

    /// Whether any key is hidden by a causal mask or a window (the kernels' band).
    pub(super) fn banded(&self) -> bool {
        Band::around_diagonal(self.options.is_causal, self.options.window).is_some()
    }

    /// Where the query rows of sequence `b`, head `h` lie in q's elements.
    pub(super) fn q_rows(&self, b: usize, h: usize) -> Rows<'a> {
        let s = &self.shape;
        match self.seqs {
            Some(Sequences::Packed { cu_q, .. }) => {
                Rows::strided((cu_q[b] * s.h + h) * s.d, s.h * s.d)
            }
            _ => Rows::strided((b * s.h + h) * s.lq * s.d, s.d),
        }
    }

    /// Where the key rows (`width` d) or value rows (`width` dv) of sequence `b`, key/value
    /// head `hk` lie in k's or v's elements.
    pub(super) fn kv_rows(&self, b: usize, hk: usize, width: usize) -> Rows<'a> {
        let s = &self.shape;
        match self.seqs {
            None => Rows::strided((b * s.hk + hk) * s.lk * width, width),
            Some(Sequences::Packed { cu_k, .. }) => {
                Rows::strided((cu_k[b] * s.hk + hk) * width, s.hk * width)
            }
            Some(Sequences::Paged {
                table,
                per_seq,
                block,
                ..
            }) => Rows {
                pages: Some(Pages {
                    table: &table[b * per_seq..(b + 1) * per_seq],
                    block,
                }),
                ..Rows::strided(hk * width, s.hk * width)
            },
        }
    }

    /// The shape of the log-sum-exp: `[H, total_q]` for packed sequences (flash-attn's),
    /// else `[B, H, Lq]`.
    pub(super) fn lse_shape(&self) -> Vec<usize> {
        let s = &self.shape;
        match self.seqs {
            Some(Sequences::Packed { cu_q, .. }) => vec![s.h, cu_q[cu_q.len() - 1]],
            _ => vec![s.b, s.h, s.lq],
        }
    }

    /// The output row (and log-sum-exp) of query 0 of sequence `b`, head `h`; its other
    /// rows follow it. Packed calls write their outputs head-major, `[H, total_q, Dv]`.
    pub(super) fn out_row(&self, b: usize, h: usize) -> usize {
        match self.seqs {
            Some(Sequences::Packed { cu_q, .. }) => h * cu_q[cu_q.len() - 1] + cu_q[b],
            _ => (b * self.shape.h + h) * self.shape.lq,
        }
    }
}
