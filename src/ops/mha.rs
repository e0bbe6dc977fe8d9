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
//! `mha_composed`) says which ran. Everything stays in the inputs' dtype on their device:
//! the projections are [`linear`] calls on views of the packed weights (bias fused on the
//! CPU), heads are views made contiguous once; only the composed path's softmax rows and
//! the masks are built on the host.
//!
//! A query that sees no key (a fully padded batch entry) attends to nothing: its attended
//! values are 0 and its output the output projection's bias, as PyTorch gives without
//! weights. With `need_weights`, PyTorch's explicit softmax makes such rows NaN, weights and
//! output alike, and so does this.

use crate::core::flag::Flag;
use std::ops::Range;

use half::{bf16, f16};

use crate::core::tensor::{Element, host_zeros};
use crate::core::trace::{self, Call};
use crate::ops::matmul::{linear, matmul};
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
    let parameters = [key, value, w.in_proj_weight, w.out_proj_weight];
    query.check_same_kind(
        OP,
        parameters
            .into_iter()
            .chain(w.in_proj_bias)
            .chain(w.out_proj_bias),
    )?;
    Ok(Dims {
        n,
        l,
        s,
        e,
        h: heads,
        d: e / heads,
    })
}

/// `x [.., E]` through rows `rows` of a packed projection `w` (and its bias): `[..,
/// rows.len()]`, in x's dtype on its device (the weight and bias are views, not copies).
fn project(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, rows: Range<usize>) -> Result<Tensor> {
    let weight = w.narrow(0, rows.start, rows.len())?;
    let bias = bias
        .map(|b| b.narrow(0, rows.start, rows.len()))
        .transpose()?;
    linear(x, &weight, bias.as_ref())
}

/// `[N, len, E]` as heads `[N, H, len, D]`, contiguous (head h holds columns `h·D..`).
fn split_heads(x: &Tensor, dm: &Dims) -> Result<Tensor> {
    let [n, len, _] = *x.shape() else {
        unreachable!("projections are [N, len, E]")
    };
    x.view(&[n, len, dm.h, dm.d])?
        .permute(&[0, 2, 1, 3])?
        .contiguous()
}

/// Heads `[N, H, L, D]` back to `[N, L, E]`.
fn merge_heads(x: &Tensor, dm: &Dims) -> Result<Tensor> {
    x.permute(&[0, 2, 1, 3])?.reshape(&[dm.n, dm.l, dm.e])
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
    let (attended, averaged) = if fast {
        trace::kernel(describe("mha_fast_path"), || {
            fast_path(query, &dm, weights, padding.as_deref(), options)
        })?
    } else {
        trace::kernel(describe("mha_composed"), || {
            composed(
                [query, key, value],
                &dm,
                weights,
                padding.as_deref(),
                options,
            )
        })?
    };
    let output = project(
        &merge_heads(&attended, &dm)?,
        weights.out_proj_weight,
        weights.out_proj_bias,
        0..dm.e,
    )?;
    Ok(MhaOutput {
        output,
        weights: averaged,
        path: if fast {
            MhaPath::Fast
        } else {
            MhaPath::Composed
        },
    })
}

/// Attended values `[N, H, L, D]` and, for the composed path with `need_weights`, the
/// head-averaged weights `[N, L, S]`.
type Attended = (Tensor, Option<Tensor>);

fn fast_path(
    x: &Tensor,
    dm: &Dims,
    w: &MhaWeights,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<Attended> {
    let qkv = project(x, w.in_proj_weight, w.in_proj_bias, 0..3 * dm.e)?;
    let heads = |part: usize| split_heads(&qkv.narrow(2, part * dm.e, dm.e)?, dm);
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
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
        // PyTorch's MHA passes is_causal on: top-left, whatever a scope's default says.
        causal_variant: crate::core::sdp::CausalVariant::UpperLeft,
        ..SdpaOptions::default()
    };
    Ok((crate::sdpa(&q, &k, &v, &sdpa_options)?.output, None))
}

fn composed(
    [query, key, value]: [&Tensor; 3],
    dm: &Dims,
    w: &MhaWeights,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<Attended> {
    let e = dm.e;
    let heads = |x: &Tensor, part: usize, len: usize| -> Result<Tensor> {
        let projected = project(
            x,
            w.in_proj_weight,
            w.in_proj_bias,
            part * e..(part + 1) * e,
        )?;
        split_heads(&projected, dm)?.view(&[dm.n * dm.h, len, dm.d])
    };
    let (q, k, v) = (
        heads(query, 0, dm.l)?,
        heads(key, 1, dm.s)?,
        heads(value, 2, dm.s)?,
    );
    let scores = matmul(&q, &k.t()?)?;
    let (probabilities, averaged) = match scores.dtype() {
        DType::F32 => softmax::<f32>(&scores, dm, padding, options)?,
        DType::F64 => softmax::<f64>(&scores, dm, padding, options)?,
        DType::F16 => softmax::<f16>(&scores, dm, padding, options)?,
        DType::Bf16 => softmax::<bf16>(&scores, dm, padding, options)?,
        DType::Bool => unreachable!("the inputs are floats"),
    };
    let attended = matmul(&probabilities, &v)?.view(&[dm.n, dm.h, dm.l, dm.d])?;
    Ok((attended, averaged))
}

/// The attention weights from raw scores `[N·H, L, S]`: scaled, masked (padding, causal)
/// and normalised per row, each row computed in f64 and stored in the scores' dtype; with
/// `need_weights` also their average over heads, `[N, L, S]`. (On wgpu and CUDA the rows
/// pass through the host, in the dtype.)
fn softmax<T: Element>(
    scores: &Tensor,
    dm: &Dims,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<(Tensor, Option<Tensor>)> {
    let mut values = scores.to_vec::<T>()?;
    let mut row = host_zeros::<f64>(OP, dm.s)?;
    let mut averaged = if options.need_weights {
        host_zeros::<f64>(OP, dm.n * dm.l * dm.s)?
    } else {
        Vec::new()
    };
    let scale = 1.0 / (dm.d as f64).sqrt();
    for (row_index, stored) in values.chunks_mut(dm.s.max(1)).enumerate() {
        let (bh, i) = (row_index / dm.l.max(1), row_index % dm.l.max(1));
        let b = bh / dm.h;
        for (j, (x, &score)) in row.iter_mut().zip(stored.iter()).enumerate() {
            let padded = padding.is_some_and(|p| p[b * dm.s + j]);
            *x = if padded || (options.is_causal && j > i) {
                f64::NEG_INFINITY
            } else {
                score.to_f64() * scale
            };
        }
        let max = crate::ops::sdpa::math::row_max(&row);
        if max == f64::NEG_INFINITY && !options.need_weights {
            // No visible key: 0, as SDPA's safe softmax gives (PyTorch's path without
            // weights); with weights PyTorch's plain softmax gives NaN, and so does this.
            stored.fill(T::from_f64(0.0));
            continue;
        }
        let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
        let average = averaged
            .get_mut((b * dm.l + i) * dm.s..(b * dm.l + i + 1) * dm.s)
            .unwrap_or_default();
        for (j, (out, x)) in stored.iter_mut().zip(&row).enumerate() {
            let p = (x - max).exp() / sum;
            *out = T::from_f64(p);
            if let Some(avg) = average.get_mut(j) {
                *avg += p / dm.h as f64;
            }
        }
    }
    let device = scores.device();
    let probabilities = Tensor::from_vec(values, scores.shape(), device)?;
    let averaged = options
        .need_weights
        .then(|| Tensor::from_f64(&averaged, &[dm.n, dm.l, dm.s], T::DTYPE, device))
        .transpose()?;
    Ok((probabilities, averaged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_same_means_the_same_view() {
        let t = Tensor::full(1f32, &[1, 1, 2], crate::Device::Cpu).unwrap();
        assert!(t.is_same(&t.clone()));
        assert!(!t.is_same(&Tensor::full(1f32, &[1, 1, 2], crate::Device::Cpu).unwrap()));
    }
}
