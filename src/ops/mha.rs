//! `torch.backends.mha`: the fused multi-head-attention fast-path switch, and
//! [`multi_head_attention_forward`] (inference), which honours it.
//!
//! The fast path, as in PyTorch's `nn.MultiheadAttention`, runs one GEMM for the packed
//! q, k, v projections and then [`crate::ops::sdpa`] (a fused backend where one serves). It runs
//! only when [`get_fastpath_enabled`] and its conditions hold: self-attention (query, key
//! and value are the same tensor), no attention weights asked for, and no fully padded
//! batch entry. Otherwise the composed path runs: three projections, explicit scores,
//! masking, softmax and weighted sum (returning the head-averaged weights when asked).
//! Both give the same result within rounding; the trace line (`mha_fast_path` or
//! `mha_composed`) says which ran.
//!
//! A query that sees no key (a fully padded batch entry) attends to nothing: its attended
//! values are 0 and its output the output projection's bias, as PyTorch gives without
//! weights. With `need_weights`, PyTorch's explicit softmax makes such rows NaN, weights and
//! output alike, and so does this.

use crate::core::flag::Flag;
use crate::core::tensor::host_zeros;
use crate::core::trace::{self, Call};
use crate::ops::matmul::matmul;
use crate::{DType, Error, Result, SdpaOptions, Tensor};

const OP: &str = "multi_head_attention_forward";

/// The fused MHA path (one QKV projection + SDPA) may run when its conditions hold.
pub static FASTPATH: Flag<bool> = Flag::new("mha.fastpath_enabled", true, None);

/// Whether the fused MHA fast path may run.
pub fn get_fastpath_enabled() -> bool {
    FASTPATH.get()
}

/// Allows or forbids the fused MHA fast path.
pub fn set_fastpath_enabled(enabled: bool) {
    FASTPATH.set(enabled);
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({ "fastpath_enabled": FASTPATH.report() })
}

/// The projection weights of a multi-head attention layer (embedding size `E`).
#[derive(Clone, Copy, Debug)]
pub struct MhaWeights<'a> {
    /// The packed q, k, v projections, `[3E, E]`.
    pub in_proj_weight: &'a Tensor,
    /// Their bias, `[3E]`.
    pub in_proj_bias: Option<&'a Tensor>,
    /// The output projection, `[E, E]`.
    pub out_proj_weight: &'a Tensor,
    /// Its bias, `[E]`.
    pub out_proj_bias: Option<&'a Tensor>,
}

/// The options of one call.
#[derive(Clone, Copy, Debug, Default)]
pub struct MhaOptions<'a> {
    /// `[N, S]` booleans, true where a key is padding and must be ignored (PyTorch's
    /// convention for this mask, the opposite of SDPA's boolean mask).
    pub key_padding_mask: Option<&'a Tensor>,
    /// Return the attention weights averaged over heads (rules out the fast path).
    pub need_weights: bool,
    /// Causal masking (query i sees keys `0..=i`).
    pub is_causal: bool,
}

/// Which path served a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MhaPath {
    /// One packed QKV GEMM and SDPA.
    Fast,
    /// Separate projections and explicit attention.
    Composed,
}

/// What [`multi_head_attention_forward`] returns.
#[derive(Clone, Debug)]
pub struct MhaOutput {
    /// `[N, L, E]`.
    pub output: Tensor,
    /// `[N, L, S]` attention weights averaged over heads, when `need_weights`.
    pub weights: Option<Tensor>,
    /// The path that ran.
    pub path: MhaPath,
}

/// Sizes of one call: batch, query and key lengths, embedding, heads, head dim.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    l: usize,
    s: usize,
    e: usize,
    h: usize,
    d: usize,
}

fn shape_error(detail: String) -> Error {
    Error::ShapeMismatch { op: OP, detail }
}

fn dims(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    heads: usize,
    w: &MhaWeights,
) -> Result<Dims> {
    let [n, l, e] = *query.shape() else {
        return Err(shape_error(format!(
            "query must be [N, L, E] (batch first); got {:?}",
            query.shape()
        )));
    };
    let [nk, s, ek] = *key.shape() else {
        return Err(shape_error(format!(
            "key must be [N, S, E]; got {:?}",
            key.shape()
        )));
    };
    if value.shape() != key.shape() || nk != n || ek != e {
        return Err(shape_error(format!(
            "query {:?}, key {:?} and value {:?} must share N and E, and key and value S",
            query.shape(),
            key.shape(),
            value.shape()
        )));
    }
    if e == 0 {
        return Err(Error::InvalidArgument {
            what: "embedding size",
            why: "the inputs' last dimension is 0: give each token at least one feature".into(),
        });
    }
    if heads == 0 || e % heads != 0 {
        return Err(Error::InvalidArgument {
            what: "num_heads",
            why: format!("{heads} does not divide the embedding size {e}"),
        });
    }
    let expect = |t: &Tensor, shape: &[usize], what: &str| {
        if t.shape() == shape {
            Ok(())
        } else {
            Err(shape_error(format!(
                "{what} must be {shape:?}; got {:?}",
                t.shape()
            )))
        }
    };
    // Every size below fits the address space, or the call is an error: the packed input
    // projection [3E, E] and the attention scores [N, H, L, S] (which bound every
    // per-head buffer and the averaged weights).
    let three_e = e.checked_mul(3).ok_or_else(|| {
        shape_error(format!(
            "an embedding size of {e} overflows the packed projection's 3E"
        ))
    })?;
    crate::core::tensor::checked_numel(OP, &[n, heads, l, s], DType::F64)?;
    expect(w.in_proj_weight, &[three_e, e], "in_proj_weight")?;
    expect(w.out_proj_weight, &[e, e], "out_proj_weight")?;
    if let Some(b) = w.in_proj_bias {
        expect(b, &[three_e], "in_proj_bias")?;
    }
    if let Some(b) = w.out_proj_bias {
        expect(b, &[e], "out_proj_bias")?;
    }
    for t in [key, value, w.in_proj_weight, w.out_proj_weight]
        .into_iter()
        .chain(w.in_proj_bias)
        .chain(w.out_proj_bias)
    {
        if t.dtype() != query.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: query.dtype(),
                got: t.dtype(),
            });
        }
        if t.device() != query.device() {
            return Err(Error::DeviceMismatch {
                op: OP,
                a: query.device(),
                b: t.device(),
            });
        }
    }
    Ok(Dims {
        n,
        l,
        s,
        e,
        h: heads,
        d: e / heads,
    })
}

/// `x [rows, E] · Wᵀ + bias` for rows `rows` of the weight `w` (`[*, E]`), as `[rows, out]`
/// values on the host.
fn project(
    x: &Tensor,
    w: &Tensor,
    rows: std::ops::Range<usize>,
    bias: Option<&[f64]>,
) -> Result<Vec<f64>> {
    let (e, out) = (w.shape()[1], rows.len());
    let all = w.to_f64()?;
    let part = Tensor::from_f64(
        &all[rows.start * e..rows.end * e],
        &[out, e],
        w.dtype(),
        w.device(),
    )?;
    let x2 = as_rows(x, e)?;
    let mut y = matmul(&x2, &part.t()?)?.to_f64()?;
    if let Some(bias) = bias {
        for row in y.chunks_mut(out) {
            for (v, b) in row.iter_mut().zip(&bias[rows.clone()]) {
                *v += b;
            }
        }
    }
    Ok(y)
}

/// A `[rows, width]` contiguous copy of `x`, whose last dimension is `width`.
fn as_rows(x: &Tensor, width: usize) -> Result<Tensor> {
    let rows = x.numel() / width.max(1);
    Tensor::from_f64(&x.to_f64()?, &[rows, width], x.dtype(), x.device())
}

/// `[N, len, E]` rows (head h's columns `h·D..(h+1)·D`) to `[N, H, len, D]`.
fn split_heads(x: &[f64], dm: &Dims, len: usize, width: usize, offset: usize) -> Result<Vec<f64>> {
    let mut out = host_zeros(OP, dm.n * dm.h * len * dm.d)?;
    let mut to = out.chunks_exact_mut(dm.d);
    for b in 0..dm.n {
        for h in 0..dm.h {
            for i in 0..len {
                let row = (b * len + i) * width + offset + h * dm.d;
                to.next()
                    .expect("N·H·len rows of D")
                    .copy_from_slice(&x[row..row + dm.d]);
            }
        }
    }
    Ok(out)
}

/// `[N, H, L, D]` to `[N·L, E]`.
fn merge_heads(x: &[f64], dm: &Dims) -> Result<Vec<f64>> {
    let mut out = host_zeros(OP, dm.n * dm.l * dm.e)?;
    for b in 0..dm.n {
        for h in 0..dm.h {
            for i in 0..dm.l {
                let from = ((b * dm.h + h) * dm.l + i) * dm.d;
                let to = (b * dm.l + i) * dm.e + h * dm.d;
                out[to..to + dm.d].copy_from_slice(&x[from..from + dm.d]);
            }
        }
    }
    Ok(out)
}

/// `nn.MultiheadAttention`'s forward for inference with batch-first `[N, L, E]` query and
/// `[N, S, E]` key and value, `num_heads` heads, the layer's weights and the options.
pub fn multi_head_attention_forward(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    num_heads: usize,
    weights: &MhaWeights,
    options: &MhaOptions,
) -> Result<MhaOutput> {
    let dm = dims(query, key, value, num_heads, weights)?;
    let padding = match options.key_padding_mask {
        Some(m) if m.shape() != [dm.n, dm.s] || m.dtype() != DType::Bool => {
            return Err(shape_error(format!(
                "key_padding_mask must be [N, S] = [{}, {}] booleans; got {:?} {}",
                dm.n,
                dm.s,
                m.shape(),
                m.dtype()
            )));
        }
        Some(m) => Some(m.to_bools()?),
        None => None,
    };
    let fully_padded = padding
        .as_ref()
        .is_some_and(|p| p.chunks(dm.s.max(1)).any(|row| row.iter().all(|&x| x)));
    let fast = get_fastpath_enabled()
        && query.is_same(key)
        && key.is_same(value)
        && !options.need_weights
        && !fully_padded
        && dm.s > 0;
    let describe = |path: &str| {
        let path = path.to_string();
        move || Call {
            kernel: path,
            backend: query.device().to_string(),
            dtype: query.dtype(),
            shapes: format!("{:?}x{:?} heads {}", query.shape(), key.shape(), dm.h),
            precision: String::new(),
        }
    };
    let bias_in = weights.in_proj_bias.map(Tensor::to_f64).transpose()?;
    let (attended, attention) = if fast {
        trace::kernel(describe("mha_fast_path"), || {
            fast_path(
                query,
                &dm,
                weights,
                bias_in.as_deref(),
                padding.as_deref(),
                options,
            )
        })?
    } else {
        trace::kernel(describe("mha_composed"), || {
            composed(
                query,
                key,
                value,
                &dm,
                weights,
                bias_in.as_deref(),
                padding.as_deref(),
                options,
            )
        })?
    };
    let merged = Tensor::from_f64(
        &merge_heads(&attended, &dm)?,
        &[dm.n * dm.l, dm.e],
        query.dtype(),
        query.device(),
    )?;
    let bias_out = weights.out_proj_bias.map(Tensor::to_f64).transpose()?;
    let out = project(
        &merged,
        weights.out_proj_weight,
        0..dm.e,
        bias_out.as_deref(),
    )?;
    let device = query.device();
    let output = Tensor::from_f64(&out, &[dm.n, dm.l, dm.e], query.dtype(), device)?;
    let weights = attention
        .map(|w| Tensor::from_f64(&w, &[dm.n, dm.l, dm.s], query.dtype(), device))
        .transpose()?;
    Ok(MhaOutput {
        output,
        weights,
        path: if fast {
            MhaPath::Fast
        } else {
            MhaPath::Composed
        },
    })
}

/// Attended values `[N, H, L, D]` and, for the composed path with `need_weights`, the
/// head-averaged weights `[N, L, S]`.
type Attended = (Vec<f64>, Option<Vec<f64>>);

fn fast_path(
    x: &Tensor,
    dm: &Dims,
    w: &MhaWeights,
    bias: Option<&[f64]>,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<Attended> {
    let qkv = project(x, w.in_proj_weight, 0..3 * dm.e, bias)?;
    let heads = |offset| {
        Tensor::from_f64(
            &split_heads(&qkv, dm, dm.l, 3 * dm.e, offset)?,
            &[dm.n, dm.h, dm.l, dm.d],
            x.dtype(),
            x.device(),
        )
    };
    let (q, k, v) = (heads(0)?, heads(dm.e)?, heads(2 * dm.e)?);
    // A padding mask takes the causal one in (as PyTorch's merge of the two): SDPA refuses
    // an explicit mask together with is_causal.
    let keep: Option<Tensor> = padding
        .map(|p| {
            if !options.is_causal {
                let keep: Vec<bool> = p.iter().map(|&pad| !pad).collect();
                return Tensor::from_bools(&keep, &[dm.n, 1, 1, dm.s], x.device());
            }
            let keep: Vec<bool> = (0..dm.n * dm.l * dm.s)
                .map(|e| {
                    let (b, i, j) = (e / (dm.l * dm.s), e / dm.s % dm.l, e % dm.s);
                    !p[b * dm.s + j] && j <= i
                })
                .collect();
            Tensor::from_bools(&keep, &[dm.n, 1, dm.l, dm.s], x.device())
        })
        .transpose()?;
    let sdpa_options = SdpaOptions {
        attn_mask: keep.as_ref(),
        is_causal: options.is_causal && keep.is_none(),
        ..SdpaOptions::default()
    };
    let out = crate::sdpa(&q, &k, &v, &sdpa_options)?;
    Ok((out.output.to_f64()?, None))
}

#[allow(clippy::too_many_arguments)]
fn composed(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    dm: &Dims,
    w: &MhaWeights,
    bias: Option<&[f64]>,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<Attended> {
    let (dtype, device) = (query.dtype(), query.device());
    let e = dm.e;
    let q = project(query, w.in_proj_weight, 0..e, bias)?;
    let k = project(key, w.in_proj_weight, e..2 * e, bias)?;
    let v = project(value, w.in_proj_weight, 2 * e..3 * e, bias)?;
    let batch = dm.n * dm.h;
    let tensor = |x: Vec<f64>, shape: &[usize]| Tensor::from_f64(&x, shape, dtype, device);
    let qh = tensor(split_heads(&q, dm, dm.l, e, 0)?, &[batch, dm.l, dm.d])?;
    let kh = tensor(split_heads(&k, dm, dm.s, e, 0)?, &[batch, dm.s, dm.d])?;
    let vh = tensor(split_heads(&v, dm, dm.s, e, 0)?, &[batch, dm.s, dm.d])?;
    let mut scores = matmul(&qh, &kh.t()?)?.to_f64()?;
    let scale = 1.0 / (dm.d as f64).sqrt();
    for (row_index, row) in scores.chunks_mut(dm.s.max(1)).enumerate() {
        let (bh, i) = (row_index / dm.l.max(1), row_index % dm.l.max(1));
        let b = bh / dm.h;
        for (j, x) in row.iter_mut().enumerate() {
            let padded = padding.is_some_and(|p| p[b * dm.s + j]);
            *x = if padded || (options.is_causal && j > i) {
                f64::NEG_INFINITY
            } else {
                *x * scale
            };
        }
        let max = crate::ops::sdpa::math::row_max(row);
        if max == f64::NEG_INFINITY && !options.need_weights {
            // No visible key: 0, as SDPA's safe softmax gives (PyTorch's path without
            // weights); with weights PyTorch's plain softmax gives NaN, and so does this.
            row.fill(0.0);
            continue;
        }
        let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
        for x in row.iter_mut() {
            *x = (*x - max).exp() / sum;
        }
    }
    let averaged = options.need_weights.then(|| -> Result<Vec<f64>> {
        let mut avg = host_zeros(OP, dm.n * dm.l * dm.s)?;
        for (index, &p) in scores.iter().enumerate() {
            let b = index / (dm.h * dm.l * dm.s);
            let rest = index % (dm.l * dm.s);
            avg[b * dm.l * dm.s + rest] += p / dm.h as f64;
        }
        Ok(avg)
    });
    let probabilities = tensor(scores, &[batch, dm.l, dm.s])?;
    let attended = matmul(&probabilities, &vh)?.to_f64()?;
    Ok((attended, averaged.transpose()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_split_and_merge_back() {
        let dm = Dims {
            n: 2,
            l: 3,
            s: 3,
            e: 4,
            h: 2,
            d: 2,
        };
        let x: Vec<f64> = (0..2 * 3 * 4).map(f64::from).collect();
        assert_eq!(
            merge_heads(&split_heads(&x, &dm, 3, 4, 0).unwrap(), &dm).unwrap(),
            x
        );
    }

    #[test]
    fn is_same_means_the_same_view() {
        let t = Tensor::full(1f32, &[1, 1, 2], crate::Device::Cpu).unwrap();
        assert!(t.is_same(&t.clone()));
        assert!(!t.is_same(&Tensor::full(1f32, &[1, 1, 2], crate::Device::Cpu).unwrap()));
    }
}
