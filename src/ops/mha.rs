//! `torch.backends.mha`: the fused multi-head-attention fast-path switch, and
//! [`multi_head_attention_forward`] (inference), which honours it.
//!
//! The fast path, as in PyTorch's `nn.MultiheadAttention`, runs one GEMM for the packed
//! q, k, v projections and then [`crate::ops::sdpa`] (a fused backend where one serves). It runs
//! only when [`get_fastpath_enabled`] and its conditions hold: self-attention (query, key
//! and value are the same tensor), packed projections, no `attn_mask`, `bias_k` / `bias_v`
//! or `add_zero_attn`, no attention weights asked for, and no fully padded batch entry.
//! Otherwise the composed path runs: three projections (packed or separate, keys and
//! values of their own widths), the appended keys, explicit scores, masking, softmax and
//! weighted sum (returning the weights, averaged over heads or not, when asked). Both take
//! `F.multi_head_attention_forward`'s sequence-first tensors with `batch_first` off.
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

/// The input projections of a multi-head attention layer (embedding size `E`).
#[derive(Clone, Copy, Debug)]
pub enum InProj<'a> {
    /// The packed q, k, v projections, `[3E, E]` (`in_proj_weight`).
    Packed(&'a Tensor),
    /// Separate projections (`use_separate_proj_weight`, `q_proj_weight`, `k_proj_weight`,
    /// `v_proj_weight`): `[E, E]`, `[E, kdim]`, `[E, vdim]`, so that keys and values may
    /// have other widths than the queries.
    Separate {
        /// `[E, E]`.
        q: &'a Tensor,
        /// `[E, kdim]`.
        k: &'a Tensor,
        /// `[E, vdim]`.
        v: &'a Tensor,
    },
}

/// The weights of a multi-head attention layer (embedding size `E`), as
/// `F.multi_head_attention_forward` takes them.
#[derive(Clone, Copy, Debug)]
pub struct MhaWeights<'a> {
    /// The q, k, v projections.
    pub in_proj: InProj<'a>,
    /// Their bias, `[3E]` (q's, k's, v's).
    pub in_proj_bias: Option<&'a Tensor>,
    /// The output projection, `[E, E]`.
    pub out_proj_weight: &'a Tensor,
    /// Its bias, `[E]`.
    pub out_proj_bias: Option<&'a Tensor>,
    /// `bias_k` and `bias_v`, `[1, 1, E]`: a learned key and value appended to every
    /// sequence after the projections (the masks gain a column that hides nothing).
    pub bias_kv: Option<(&'a Tensor, &'a Tensor)>,
}

impl<'a> MhaWeights<'a> {
    /// The weights of `nn.MultiheadAttention`'s default layer: packed projections, no
    /// `bias_k` / `bias_v`.
    pub fn packed(
        in_proj_weight: &'a Tensor,
        in_proj_bias: Option<&'a Tensor>,
        out_proj_weight: &'a Tensor,
        out_proj_bias: Option<&'a Tensor>,
    ) -> Self {
        MhaWeights {
            in_proj: InProj::Packed(in_proj_weight),
            in_proj_bias,
            out_proj_weight,
            out_proj_bias,
            bias_kv: None,
        }
    }
}

/// The options of one call. The default: no masks, no weights, not causal, batch-first
/// tensors, weights averaged over heads where asked for.
#[derive(Clone, Copy, Debug)]
pub struct MhaOptions<'a> {
    /// `[N, S]` booleans, true where a key is padding and must be ignored (PyTorch's
    /// convention for this mask, the opposite of SDPA's boolean mask).
    pub key_padding_mask: Option<&'a Tensor>,
    /// `[L, S]` or `[N·H, L, S]`: booleans, true where a query may not attend to a key (the
    /// MHA convention), or floats added to the scores.
    pub attn_mask: Option<&'a Tensor>,
    /// Return the attention weights (rules out the fast path).
    pub need_weights: bool,
    /// Average the returned weights over the heads (`[N, L, S]`), else return them per
    /// head (`[N, H, L, S]`).
    pub average_attn_weights: bool,
    /// Causal masking (query i sees keys `0..=i`).
    pub is_causal: bool,
    /// Append a key and value of zeros to every sequence (`add_zero_attn`).
    pub add_zero_attn: bool,
    /// Tensors are `[N, L, E]` (as `nn.MultiheadAttention(batch_first=True)`); false takes
    /// and gives `[L, N, E]`, as `F.multi_head_attention_forward` does.
    pub batch_first: bool,
}

impl Default for MhaOptions<'_> {
    fn default() -> Self {
        MhaOptions {
            key_padding_mask: None,
            attn_mask: None,
            need_weights: false,
            average_attn_weights: true,
            is_causal: false,
            add_zero_attn: false,
            batch_first: true,
        }
    }
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
    /// `[N, L, E]` (`[L, N, E]` unless `batch_first`).
    pub output: Tensor,
    /// The attention weights when `need_weights`: `[N, L, S]` averaged over heads, else
    /// `[N, H, L, S]` (S counting the appended keys).
    pub weights: Option<Tensor>,
    /// The path that ran.
    pub path: MhaPath,
}

/// Sizes of one call: batch, query and key lengths (the key length counting the appended
/// `bias_k` / zero keys), embedding, key and value widths, heads, head dim.
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

/// `t`'s shape is `shape`, or an error naming `what`.
fn expect(t: &Tensor, shape: &[usize], what: &str) -> Result<()> {
    if t.shape() == shape {
        Ok(())
    } else {
        Err(shape_error(format!(
            "{what} must be {shape:?}; got {:?}",
            t.shape()
        )))
    }
}

/// The call's sizes, its inputs (batch-first) and weights checked.
fn dims(
    [query, key, value]: [&Tensor; 3],
    heads: usize,
    w: &MhaWeights,
    options: &MhaOptions,
) -> Result<Dims> {
    let [n, l, e] = *query.shape() else {
        return Err(shape_error(format!(
            "query must be [N, L, E] ([L, N, E] unless batch_first); got {:?}",
            query.shape()
        )));
    };
    let (kdim, vdim) = match w.in_proj {
        InProj::Packed(_) => (e, e),
        InProj::Separate { k, v, .. } => (
            k.shape().get(1).copied().unwrap_or(0),
            v.shape().get(1).copied().unwrap_or(0),
        ),
    };
    if key.shape().len() != 3
        || value.shape().len() != 3
        || key.shape()[..2] != value.shape()[..2]
        || key.shape()[0] != n
        || key.shape()[2] != kdim
        || value.shape()[2] != vdim
    {
        return Err(shape_error(format!(
            "query {:?}, key {:?} and value {:?} must share N, key and value S, with widths \
             E = {e}, kdim = {kdim}, vdim = {vdim}",
            query.shape(),
            key.shape(),
            value.shape()
        )));
    }
    let s = key.shape()[1];
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
    // The appended keys: bias_k / bias_v, a zero key.
    let s_all = s + usize::from(w.bias_kv.is_some()) + usize::from(options.add_zero_attn);
    // Every size below fits the address space, or the call is an error: the packed input
    // projection [3E, E] and the attention scores [N, H, L, S] (which bound every
    // per-head buffer and the weights).
    let three_e = e.checked_mul(3).ok_or_else(|| {
        shape_error(format!(
            "an embedding size of {e} overflows the packed projection's 3E"
        ))
    })?;
    crate::core::tensor::checked_numel(OP, &[n, heads, l, s_all], DType::F64)?;
    let mut parameters = vec![key, value, w.out_proj_weight];
    match w.in_proj {
        InProj::Packed(packed) => {
            expect(packed, &[three_e, e], "in_proj_weight")?;
            parameters.push(packed);
        }
        InProj::Separate { q, k, v } => {
            expect(q, &[e, e], "q_proj_weight")?;
            expect(k, &[e, kdim], "k_proj_weight")?;
            expect(v, &[e, vdim], "v_proj_weight")?;
            parameters.extend([q, k, v]);
        }
    }
    expect(w.out_proj_weight, &[e, e], "out_proj_weight")?;
    if let Some(b) = w.in_proj_bias {
        expect(b, &[three_e], "in_proj_bias")?;
    }
    if let Some(b) = w.out_proj_bias {
        expect(b, &[e], "out_proj_bias")?;
    }
    if let Some((bk, bv)) = w.bias_kv {
        expect(bk, &[1, 1, e], "bias_k")?;
        expect(bv, &[1, 1, e], "bias_v")?;
        parameters.extend([bk, bv]);
    }
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
        s: s_all,
        e,
        h: heads,
        d: e / heads,
    })
}

/// `x [.., width]` through `w` (or its rows `rows`, for the packed projections) and the
/// matching rows of `bias`: `[.., E]`, in x's dtype on its device (the weight and bias are
/// views, not copies).
fn project(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, rows: Range<usize>) -> Result<Tensor> {
    let weight = if w.shape()[0] == rows.len() {
        w.clone()
    } else {
        w.narrow(0, rows.start, rows.len())?
    };
    let bias = bias
        .map(|b| b.narrow(0, rows.start, rows.len()))
        .transpose()?;
    linear(x, &weight, bias.as_ref())
}

/// The projection of `x` as q (`part` 0), k (1) or v (2).
fn in_project(x: &Tensor, w: &MhaWeights, part: usize, e: usize) -> Result<Tensor> {
    let weight = match (w.in_proj, part) {
        (InProj::Packed(packed), _) => packed,
        (InProj::Separate { q, .. }, 0) => q,
        (InProj::Separate { k, .. }, 1) => k,
        (InProj::Separate { v, .. }, _) => v,
    };
    project(x, weight, w.in_proj_bias, part * e..(part + 1) * e)
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

/// Projected keys or values `[N, S, E]` with the rows `rows` (`[E]` values each) appended to
/// every sequence: `[N, S + rows, E]`, in x's dtype on its device (through the host).
fn appended(x: &Tensor, rows: &[Vec<f64>]) -> Result<Tensor> {
    if rows.is_empty() {
        return Ok(x.clone());
    }
    let [n, s, e] = *x.shape() else {
        unreachable!("projections are [N, S, E]")
    };
    let values = x.to_f64()?;
    let mut out = host_zeros::<f64>(OP, n * (s + rows.len()) * e)?;
    for (b, to) in out.chunks_exact_mut((s + rows.len()) * e).enumerate() {
        to[..s * e].copy_from_slice(&values[b * s * e..(b + 1) * s * e]);
        for (r, row) in rows.iter().enumerate() {
            to[(s + r) * e..(s + r + 1) * e].copy_from_slice(row);
        }
    }
    Tensor::from_f64(&out, &[n, s + rows.len(), e], x.dtype(), x.device())
}

/// `rows` rows of `width` values, each followed by `extra` copies of `fill` (the appended
/// keys' columns).
fn widened<T: Copy>(values: &[T], (rows, width): (usize, usize), extra: usize, fill: T) -> Vec<T> {
    let wide = width + extra;
    (0..rows * wide)
        .map(|at| {
            let (row, column) = (at / wide, at % wide);
            if column < width {
                values[row * width + column]
            } else {
                fill
            }
        })
        .collect()
}

/// The masks of one call on the host, over the key length with the appended keys: key
/// padding `[N, S]` (true hides) and the additive attention mask (`-inf` where a boolean
/// mask hides), `[L, S]` or `[N·H, L, S]`.
struct Masks {
    padding: Option<Vec<bool>>,
    attn: Option<(Vec<f64>, bool)>,
}

impl Masks {
    fn of(options: &MhaOptions, dm: &Dims, s_given: usize) -> Result<Masks> {
        let extra = dm.s - s_given;
        let padding = match options.key_padding_mask {
            Some(m) if m.shape() != [dm.n, s_given] || m.dtype() != DType::Bool => {
                return Err(shape_error(format!(
                    "key_padding_mask must be [N, S] = [{}, {s_given}] booleans; got {:?} {}",
                    dm.n,
                    m.shape(),
                    m.dtype()
                )));
            }
            Some(m) => Some(widened(&m.to_bools()?, (dm.n, s_given), extra, false)),
            None => None,
        };
        let attn = match options.attn_mask {
            None => None,
            Some(m) => {
                let per_head = match m.shape() {
                    [l, s] if (*l, *s) == (dm.l, s_given) => false,
                    [nh, l, s] if (*nh, *l, *s) == (dm.n * dm.h, dm.l, s_given) => true,
                    other => {
                        return Err(shape_error(format!(
                            "attn_mask must be [L, S] = [{}, {s_given}] or [N·H, L, S] = [{}, {}, \
                             {s_given}]; got {other:?}",
                            dm.l,
                            dm.n * dm.h,
                            dm.l
                        )));
                    }
                };
                let values: Vec<f64> = if m.dtype() == DType::Bool {
                    m.to_bools()?
                        .into_iter()
                        .map(|hide| if hide { f64::NEG_INFINITY } else { 0.0 })
                        .collect()
                } else {
                    m.to_f64()?
                };
                let rows = if per_head { dm.n * dm.h * dm.l } else { dm.l };
                Some((widened(&values, (rows, s_given), extra, 0.0), per_head))
            }
        };
        Ok(Masks { padding, attn })
    }

    /// Whether some batch entry has every given key padded.
    fn fully_padded(&self, dm: &Dims) -> bool {
        self.padding
            .as_ref()
            .is_some_and(|p| p.chunks(dm.s.max(1)).any(|row| row.iter().all(|&x| x)))
    }
}

/// `nn.MultiheadAttention`'s forward for inference (`F.multi_head_attention_forward`):
/// query `[N, L, E]`, key `[N, S, kdim]` and value `[N, S, vdim]` (sequence first,
/// `[L, N, E]` and `[S, N, ..]`, unless `batch_first`), `num_heads` heads, the layer's
/// weights and the options.
pub fn multi_head_attention_forward(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    num_heads: usize,
    weights: &MhaWeights,
    options: &MhaOptions,
) -> Result<MhaOutput> {
    // Sequence-first tensors are read as batch-first views.
    let batch_first = |t: &Tensor| -> Result<Tensor> {
        match (options.batch_first, t.shape().len()) {
            (false, 3) => t.permute(&[1, 0, 2]),
            _ => Ok(t.clone()),
        }
    };
    let (query, key, value) = (batch_first(query)?, batch_first(key)?, batch_first(value)?);
    let dm = dims([&query, &key, &value], num_heads, weights, options)?;
    let s_given = key.shape()[1];
    let masks = Masks::of(options, &dm, s_given)?;
    let fast = get_fastpath_enabled()
        && query.is_same(&key)
        && key.is_same(&value)
        && matches!(weights.in_proj, InProj::Packed(_))
        && weights.bias_kv.is_none()
        && !options.add_zero_attn
        && options.attn_mask.is_none()
        && !options.need_weights
        && !masks.fully_padded(&dm)
        && dm.s > 0;
    let describe = |path: &str| {
        let path = path.to_string();
        let (q, k) = (query.shape().to_vec(), key.shape().to_vec());
        let (device, dtype) = (query.device(), query.dtype());
        move || Call {
            kernel: path,
            backend: device.to_string(),
            dtype,
            shapes: format!("{q:?}x{k:?} heads {}", dm.h),
            precision: String::new(),
        }
    };
    let (attended, returned) = if fast {
        trace::kernel(describe("mha_fast_path"), || {
            fast_path(&query, &dm, weights, masks.padding.as_deref(), options)
        })?
    } else {
        trace::kernel(describe("mha_composed"), || {
            composed([&query, &key, &value], &dm, weights, &masks, options)
        })?
    };
    let output = project(
        &merge_heads(&attended, &dm)?,
        weights.out_proj_weight,
        weights.out_proj_bias,
        0..dm.e,
    )?;
    let output = if options.batch_first {
        output
    } else {
        output.permute(&[1, 0, 2])?.contiguous()?
    };
    Ok(MhaOutput {
        output,
        weights: returned,
        path: if fast {
            MhaPath::Fast
        } else {
            MhaPath::Composed
        },
    })
}

/// Attended values `[N, H, L, D]` and, for the composed path with `need_weights`, the
/// weights (averaged `[N, L, S]` or per head `[N, H, L, S]`).
type Attended = (Tensor, Option<Tensor>);

fn fast_path(
    x: &Tensor,
    dm: &Dims,
    w: &MhaWeights,
    padding: Option<&[bool]>,
    options: &MhaOptions,
) -> Result<Attended> {
    let InProj::Packed(packed) = w.in_proj else {
        unreachable!("the fast path takes packed projections")
    };
    let qkv = project(x, packed, w.in_proj_bias, 0..3 * dm.e)?;
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
    masks: &Masks,
    options: &MhaOptions,
) -> Result<Attended> {
    let e = dm.e;
    // The appended keys and values: bias_k / bias_v, then zeros.
    let mut extra_k = Vec::new();
    let mut extra_v = Vec::new();
    if let Some((bk, bv)) = w.bias_kv {
        extra_k.push(bk.to_f64()?);
        extra_v.push(bv.to_f64()?);
    }
    if options.add_zero_attn {
        extra_k.push(vec![0.0; e]);
        extra_v.push(vec![0.0; e]);
    }
    let heads = |x: Tensor, len: usize| -> Result<Tensor> {
        split_heads(&x, dm)?.view(&[dm.n * dm.h, len, dm.d])
    };
    let q = heads(in_project(query, w, 0, e)?, dm.l)?;
    let k = heads(appended(&in_project(key, w, 1, e)?, &extra_k)?, dm.s)?;
    let v = heads(appended(&in_project(value, w, 2, e)?, &extra_v)?, dm.s)?;
    let scores = matmul(&q, &k.t()?)?;
    let (probabilities, returned) = match scores.dtype() {
        DType::F32 => softmax::<f32>(&scores, dm, masks, options)?,
        DType::F64 => softmax::<f64>(&scores, dm, masks, options)?,
        DType::F16 => softmax::<f16>(&scores, dm, masks, options)?,
        DType::Bf16 => softmax::<bf16>(&scores, dm, masks, options)?,
        DType::Bool | DType::I32 => unreachable!("the inputs are floats"),
    };
    let attended = matmul(&probabilities, &v)?.view(&[dm.n, dm.h, dm.l, dm.d])?;
    Ok((attended, returned))
}

/// The attention weights from raw scores `[N·H, L, S]`: scaled, masked (padding, causal,
/// the attention mask) and normalised per row, each row computed in f64 and stored in the
/// scores' dtype; with `need_weights` also the weights returned (averaged over heads, or
/// per head). (On wgpu and CUDA the rows pass through the host, in the dtype.)
fn softmax<T: Element>(
    scores: &Tensor,
    dm: &Dims,
    masks: &Masks,
    options: &MhaOptions,
) -> Result<(Tensor, Option<Tensor>)> {
    let mut values = scores.to_vec::<T>()?;
    let mut row = host_zeros::<f64>(OP, dm.s)?;
    let average = options.average_attn_weights;
    let mut returned = match (options.need_weights, average) {
        (false, _) => Vec::new(),
        (true, true) => host_zeros::<f64>(OP, dm.n * dm.l * dm.s)?,
        (true, false) => host_zeros::<f64>(OP, dm.n * dm.h * dm.l * dm.s)?,
    };
    let scale = 1.0 / (dm.d as f64).sqrt();
    for (row_index, stored) in values.chunks_mut(dm.s.max(1)).enumerate() {
        let (bh, i) = (row_index / dm.l.max(1), row_index % dm.l.max(1));
        let b = bh / dm.h;
        let attn_row = masks.attn.as_ref().map(|(m, per_head)| {
            let first = if *per_head { bh * dm.l + i } else { i };
            &m[first * dm.s..(first + 1) * dm.s]
        });
        for (j, (x, &score)) in row.iter_mut().zip(stored.iter()).enumerate() {
            let padded = masks.padding.as_ref().is_some_and(|p| p[b * dm.s + j]);
            *x = if padded || (options.is_causal && j > i) {
                f64::NEG_INFINITY
            } else {
                score.to_f64() * scale + attn_row.map_or(0.0, |m| m[j])
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
        let (first, share) = if average {
            ((b * dm.l + i) * dm.s, 1.0 / dm.h as f64)
        } else {
            (row_index * dm.s, 1.0)
        };
        let target = returned.get_mut(first..first + dm.s).unwrap_or_default();
        for (j, (out, x)) in stored.iter_mut().zip(&row).enumerate() {
            let p = (x - max).exp() / sum;
            *out = T::from_f64(p);
            if let Some(t) = target.get_mut(j) {
                *t += p * share;
            }
        }
    }
    let device = scores.device();
    let probabilities = Tensor::from_vec(values, scores.shape(), device)?;
    let shape: &[usize] = if average {
        &[dm.n, dm.l, dm.s]
    } else {
        &[dm.n, dm.h, dm.l, dm.s]
    };
    let returned = options
        .need_weights
        .then(|| Tensor::from_f64(&returned, shape, T::DTYPE, device))
        .transpose()?;
    Ok((probabilities, returned))
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
