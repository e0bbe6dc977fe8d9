//! `scaled_dot_product_attention`: PyTorch's semantics, the backend chosen by
//! [`crate::attention::selected_backend`], and the kernels behind it.
//!
//! - CPU: the math reference (any mask, dropout, GQA; fp32 compute, or f64 for f64
//!   inputs) and the fused path (tiled online softmax, never materialising the Lq x Lk
//!   scores, SIMD-dispatched on the CPU capability, threads over batch x heads x query
//!   blocks; f64 inputs computed in f64, row by row, as PyTorch's CPU flash kernel does).
//! - wgpu: flash and memory-efficient attention through the generated WGSL kernels.
//! - CUDA: flash (f16/bf16 tensor cores) and memory-efficient attention (masks, f32) through
//!   the generated CUDA kernels, with dropout (`sdpa/cuda.rs`); cuDNN's fused attention
//!   through its backend graph API, with plans cached per shape (`sdpa/cudnn.rs`).
//! - Math on wgpu and CUDA runs the reference on the host (the trace says so).
//!
//! A query row that sees no key (fully masked, or causal with no key before it) gives 0 on
//! every backend and device, as PyTorch 2.15 does (its math path uses a safe softmax), with
//! a log-sum-exp of -inf where the backend returns one. A NaN in the inputs makes its rows
//! NaN, log-sum-exp NaN too, on every path and CPU level.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cudnn;

use std::borrow::Cow;

use half::{bf16, f16};

use crate::attention::{self, SdpBackend};
use crate::cpu::mul_add;
use crate::cuda::{SDPAParams, TensorMeta};
use crate::generator::{Draw, Generator, default_generator};
use crate::kernels::{Elem, KernelEntry, MaskKind, rules};
use crate::tensor::{Storage, Tensor, host_zeros, narrow};
use crate::trace::{self, Call};
use crate::{DType, Device, Error, Result};

/// What attention reports in its errors.
const OP: &str = "scaled_dot_product_attention";

/// What the CPU attention paths report in their errors.
const OP_CPU: &str = "scaled_dot_product_attention on the CPU";

/// The options of one attention call beyond q, k and v. The default has no mask, no
/// dropout, the default scale, no GQA, the device's default generator, and `is_causal`
/// false (true inside a `#[sdpa_kernel(causal)]` function: see
/// [`attention::causal_default`]).
#[derive(Clone, Copy, Debug)]
pub struct SdpaOptions<'a> {
    /// Boolean (true takes part) or additive mask, broadcastable to `[B, H, Lq, Lk]`; not
    /// together with `is_causal` (an error, as in PyTorch: fold the causal mask into it).
    pub attn_mask: Option<&'a Tensor>,
    /// Dropout probability on the attention weights.
    pub dropout_p: f64,
    /// Causal masking, top-left aligned: query i sees keys `0..=i`.
    pub is_causal: bool,
    /// Score scale; `None` is `1 / sqrt(D)`.
    pub scale: Option<f64>,
    /// Grouped-query attention: key/value heads shared by groups of query heads.
    pub enable_gqa: bool,
    /// Where dropout draws from: `None` is the query device's default generator
    /// ([`crate::generator::default_generator`], seeded by [`crate::manual_seed`]), whose
    /// offset advances with each call, as in PyTorch. A generator of the caller's own at a
    /// known seed and offset makes a call reproducible (the same draw drops the same weights
    /// on every device).
    pub generator: Option<&'a Generator>,
}

impl Default for SdpaOptions<'_> {
    fn default() -> Self {
        SdpaOptions {
            attn_mask: None,
            dropout_p: 0.0,
            is_causal: attention::causal_default(),
            scale: None,
            enable_gqa: false,
            generator: None,
        }
    }
}

/// What an attention call returns.
#[derive(Clone, Debug)]
pub struct SdpaOutput {
    /// `[B, H, Lq, Dv]` (or 3-D for 3-D inputs).
    pub output: Tensor,
    /// The natural-log log-sum-exp of each query row, `[B, H, Lq]` in f32, from the fused
    /// backends (for a backward pass).
    pub lse: Option<Tensor>,
    /// The backend that ran.
    pub backend: SdpBackend,
}

/// PyTorch's `scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
/// enable_gqa)`.
#[allow(clippy::too_many_arguments)]
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
) -> Result<Tensor> {
    let options = SdpaOptions {
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        generator: None,
    };
    sdpa(query, key, value, &options).map(|out| out.output)
}

fn meta(t: &Tensor) -> TensorMeta {
    TensorMeta {
        shape: t.shape().to_vec(),
        strides: t.strides().to_vec(),
        dtype: t.dtype(),
        device: t.device(),
    }
}

/// The metadata the backend checks read, for these tensors and options.
pub fn params(query: &Tensor, key: &Tensor, value: &Tensor, options: &SdpaOptions) -> SDPAParams {
    SDPAParams {
        query: meta(query),
        key: meta(key),
        value: meta(value),
        attn_mask: options.attn_mask.map(meta),
        dropout: options.dropout_p,
        is_causal: options.is_causal,
        enable_gqa: options.enable_gqa,
    }
}

/// Attention with every output: the result, the log-sum-exp where the backend gives it,
/// and the backend that ran.
pub fn sdpa(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    options: &SdpaOptions,
) -> Result<SdpaOutput> {
    let p = params(query, key, value, options);
    let (backend, pin) = attention::select(&p)?;
    // The fused kernels read an additive mask in q's type; PyTorch takes one of any float
    // type, so another one is converted (math reads every mask as f64 anyway).
    let converted;
    let options = &match options.attn_mask {
        Some(m)
            if m.dtype().is_float()
                && m.dtype() != query.dtype()
                && backend != SdpBackend::Math =>
        {
            converted = Tensor::from_f64(&m.to_f64()?, m.shape(), query.dtype(), m.device())?;
            SdpaOptions {
                attn_mask: Some(&converted),
                ..*options
            }
        }
        _ => *options,
    };
    let shape = Shape::of(query, key, value);
    let scale = options.scale.unwrap_or(1.0 / (shape.d as f64).sqrt());
    let describe = |note: &str| {
        let note = match pin {
            Some(_) => format!("{note}, pinned by #[sdpa_kernel]"),
            None => note.to_string(),
        };
        move || Call {
            kernel: format!("sdpa_{}", backend.as_str().to_lowercase()),
            backend: query.device().to_string(),
            dtype: query.dtype(),
            shapes: format!("{:?}x{:?}x{:?}", query.shape(), key.shape(), value.shape()),
            precision: note,
        }
    };
    let mut out_shape = query.shape().to_vec();
    *out_shape.last_mut().expect("validated rank") = shape.dv;
    // Every size the kernels compute from the output's shape then fits.
    let out_numel = crate::tensor::checked_numel(OP, &out_shape, query.dtype())?;
    if backend == SdpBackend::Math && out_numel == 0 {
        // Nothing to write (no query row, or a value dim of 0): the empty result, without
        // walking rows that hold nothing.
        return Ok(SdpaOutput {
            output: Tensor::from_f64(&[], &out_shape, query.dtype(), query.device())?,
            lse: None,
            backend,
        });
    }
    // Dropout draws one value per weight, B x H x Lq x Lk of them.
    let dropout = (options.dropout_p > 0.0).then(|| {
        let count = [shape.b, shape.h, shape.lq, shape.lk]
            .iter()
            .fold(1u64, |n, &x| n.saturating_mul(x as u64));
        options
            .generator
            .unwrap_or_else(|| default_generator(query.device()))
            .draw(count)
    });
    let job = Job {
        q: query,
        k: key,
        v: value,
        o: options,
        s: shape,
        scale,
        out_shape,
        dropout,
    };
    match (query.device(), backend) {
        (Device::Cpu, SdpBackend::Math) => trace::kernel(describe("math, f32 compute"), || {
            Ok(SdpaOutput {
                output: cpu_math(&job)?,
                lse: None,
                backend,
            })
        }),
        (Device::Cpu, SdpBackend::Flash) if query.dtype() == DType::F64 => {
            trace::kernel(describe("fused online softmax, f64 compute"), || {
                let (output, lse) = cpu_fused_f64(&job)?;
                Ok(SdpaOutput {
                    output,
                    lse: Some(lse),
                    backend,
                })
            })
        }
        (Device::Cpu, SdpBackend::Flash) => {
            let level = crate::cpu::get_cpu_capability().to_string();
            trace::kernel(describe(&format!("fused online softmax, {level}")), || {
                let (output, lse) = cpu_fused(&job)?;
                Ok(SdpaOutput {
                    output,
                    lse: Some(lse),
                    backend,
                })
            })
        }
        (Device::Wgpu(index), SdpBackend::Flash | SdpBackend::MemEfficient) => {
            trace::kernel(describe("wgsl, f32 compute"), || {
                wgpu_fused(index, backend, pin.and_then(|p| p.entry()), &job)
            })
        }
        #[cfg(feature = "cuda")]
        (Device::Cuda(ordinal), SdpBackend::Flash | SdpBackend::MemEfficient) => {
            trace::kernel(describe(&cuda::note(backend, query.dtype())), || {
                cuda::fused(ordinal, backend, pin.and_then(|p| p.entry()), &job)
            })
        }
        #[cfg(feature = "cuda")]
        (Device::Cuda(ordinal), SdpBackend::Cudnn) => {
            trace::kernel(describe("cuDNN fused graph, f32 softmax"), || {
                cudnn::attention(ordinal, &job)
            })
        }
        (Device::Wgpu(_) | Device::Cuda(_), SdpBackend::Math) => {
            trace::kernel(describe("math on the host"), || {
                let host = |t: &Tensor| t.to_device(Device::Cpu);
                let mask = options.attn_mask.map(host).transpose()?;
                let host_options = SdpaOptions {
                    attn_mask: mask.as_ref(),
                    ..*options
                };
                let (q, k, v) = (host(query)?, host(key)?, host(value)?);
                let host_job = Job {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &host_options,
                    ..job.clone()
                };
                Ok(SdpaOutput {
                    output: cpu_math(&host_job)?.to_device(query.device())?,
                    lse: None,
                    backend,
                })
            })
        }
        (device, backend) => Err(Error::Unavailable {
            what: "this SDPA backend here",
            why: format!(
                "{backend} has no kernel for {device} tensors in this build; enable another \
                 backend (flash, memory-efficient or math) for this call"
            ),
        }),
    }
}

/// One attention call after selection: the inputs, options, sizes, scale and output shape.
#[derive(Clone)]
struct Job<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    o: &'a SdpaOptions<'a>,
    s: Shape,
    scale: f64,
    out_shape: Vec<usize>,
    /// The generator's draw for dropout (`None` without dropout).
    dropout: Option<Draw>,
}

impl Job<'_> {
    /// The fields, for kernels that name them one by one.
    #[allow(clippy::type_complexity)]
    fn parts(
        &self,
    ) -> (
        &Tensor,
        &Tensor,
        &Tensor,
        &SdpaOptions<'_>,
        &Shape,
        f64,
        &[usize],
    ) {
        (
            self.q,
            self.k,
            self.v,
            self.o,
            &self.s,
            self.scale,
            &self.out_shape,
        )
    }
}

/// Sizes of one call, with 3-D inputs read as batch 1.
#[derive(Clone, Copy, Debug)]
struct Shape {
    b: usize,
    h: usize,
    hk: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
}

impl Shape {
    fn of(q: &Tensor, k: &Tensor, v: &Tensor) -> Shape {
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        let r = qs.len();
        Shape {
            b: if r == 4 { qs[0] } else { 1 },
            h: qs[r - 3],
            hk: ks[r - 3],
            lq: qs[r - 2],
            lk: ks[r - 2],
            d: qs[r - 1],
            dv: vs[r - 1],
        }
    }

    /// The key/value head of query head `h`.
    fn kv_head(&self, h: usize) -> usize {
        h / (self.h / self.hk.max(1)).max(1)
    }
}

/// Any float tensor's elements as f64, row-major.
/// The values of `t` as f64; a boolean mask as additive 0 / -inf.
fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    if t.dtype() == DType::Bool {
        return Ok(t
            .to_bools()?
            .into_iter()
            .map(|b| if b { 0.0 } else { f64::NEG_INFINITY })
            .collect());
    }
    t.to_f64()
}

/// The values of a float tensor as f32, row-major: borrowed from a contiguous f32 tensor,
/// else converted.
fn host_f32(t: &Tensor) -> Result<Cow<'_, [f32]>> {
    if let Some(values) = t.contiguous_host::<f32>() {
        return Ok(Cow::Borrowed(values));
    }
    Ok(Cow::Owned(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?,
        _ => host_f64(t)?.into_iter().map(|x| x as f32).collect(),
    }))
}

/// q, k or v as the CPU fused path reads it: f32 values (borrowed when the tensor is
/// contiguous f32), or a contiguous 16-bit tensor's own elements, which each thread widens
/// piece by piece as it needs them (no serial whole-tensor conversion).
enum Input<'a> {
    F32(Cow<'a, [f32]>),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Input<'a> {
    fn of(t: &'a Tensor) -> Result<Input<'a>> {
        if let Some(values) = t.contiguous_host::<bf16>() {
            return Ok(Input::Bf16(values));
        }
        if let Some(values) = t.contiguous_host::<f16>() {
            return Ok(Input::F16(values));
        }
        host_f32(t).map(Input::F32)
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

/// The mask as additive values with broadcast strides over `[B, H, Lq, Lk]`.
struct Bias {
    values: Vec<f64>,
    strides: [usize; 4],
}

impl Bias {
    fn of(mask: Option<&Tensor>) -> Result<Option<Bias>> {
        let Some(mask) = mask else { return Ok(None) };
        let values = host_f64(mask)?;
        let strides = broadcast_strides(
            mask.shape(),
            &crate::tensor::contiguous_strides(mask.shape()),
        );
        Ok(Some(Bias { values, strides }))
    }

    fn at(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        let s = self.strides;
        self.values[b * s[0] + h * s[1] + i * s[2] + j * s[3]]
    }
}

/// A mask's element strides over `[B, H, Lq, Lk]`: its dimensions right-aligned, 0 where it
/// broadcasts (size 1 or absent).
fn broadcast_strides(shape: &[usize], strides: &[usize]) -> [usize; 4] {
    let mut out = [0; 4];
    for (i, (&size, &stride)) in shape.iter().rev().zip(strides.iter().rev()).enumerate() {
        out[3 - i] = if size == 1 { 0 } else { stride };
    }
    out
}

/// A stateless dropout decision: keeps weight `(b, h, i, j)` (flat `index`) with probability
/// `1 - p`; `key` is the call's [`Draw::key`].
fn keep(key: u64, index: u64, p: f64) -> bool {
    let mut z = key ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) >= p
}

/// The math reference: scores, mask, softmax, dropout, weighted sum; in f64 for f64
/// inputs, else in f32 (intermediates rounded to the 16-bit input type when
/// `allow_fp16_bf16_reduction_math_sdp` is on).
fn cpu_math(job: &Job) -> Result<Tensor> {
    let (q, k, v, o, s, scale, out_shape) = job.parts();
    let (qv, kv, vv) = (host_f64(q)?, host_f64(k)?, host_f64(v)?);
    let bias = Bias::of(o.attn_mask)?;
    let dtype = q.dtype();
    let reduce16 = matches!(dtype, DType::F16 | DType::Bf16)
        && crate::cuda::fp16_bf16_reduction_math_sdp_allowed();
    let round = |x: f64| -> f64 {
        match dtype {
            DType::F64 => x,
            // Through f32, as PyTorch rounds to the half types.
            DType::F16 if reduce16 => f64::from(f16::from_f32(x as f32)),
            DType::Bf16 if reduce16 => f64::from(bf16::from_f32(x as f32)),
            _ => f64::from(x as f32),
        }
    };
    let mut out = host_zeros(OP_CPU, s.b * s.h * s.lq * s.dv)?;
    let mut weights = host_zeros(OP_CPU, s.lk)?;
    let dropout_key = job.dropout.map(Draw::key);
    for b in 0..s.b {
        for h in 0..s.h {
            let hk = s.kv_head(h);
            for i in 0..s.lq {
                let qrow = &qv[((b * s.h + h) * s.lq + i) * s.d..][..s.d];
                for (j, w) in weights.iter_mut().enumerate() {
                    let krow = &kv[((b * s.hk + hk) * s.lk + j) * s.d..][..s.d];
                    let mut x =
                        round(qrow.iter().zip(krow).map(|(a, c)| a * c).sum::<f64>() * scale);
                    if let Some(bias) = &bias {
                        x += bias.at(b, h, i, j);
                    }
                    if o.is_causal && j > i {
                        x = f64::NEG_INFINITY;
                    }
                    *w = x;
                }
                // A row that sees no key (max -inf) stays 0, as PyTorch's safe softmax gives.
                let max = row_max(&weights);
                let orow = &mut out[((b * s.h + h) * s.lq + i) * s.dv..][..s.dv];
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = weights.iter().map(|w| (w - max).exp()).sum();
                for (j, w) in weights.iter().enumerate() {
                    let mut p = round((w - max).exp() / sum);
                    if let Some(key) = dropout_key {
                        let index = (((b * s.h + h) * s.lq + i) * s.lk + j) as u64;
                        p = if keep(key, index, o.dropout_p) {
                            p / (1.0 - o.dropout_p)
                        } else {
                            0.0
                        };
                    }
                    let vrow = &vv[((b * s.hk + hk) * s.lk + j) * s.dv..][..s.dv];
                    for (acc, x) in orow.iter_mut().zip(vrow) {
                        *acc += p * x;
                    }
                }
                for x in orow.iter_mut() {
                    *x = round(*x);
                }
            }
        }
    }
    Tensor::from_f64(&out, out_shape, dtype, Device::Cpu)
}

/// The maximum of a row of scores for its softmax: NaN if any score is (so that the row
/// comes out NaN), -inf for a row that sees no key.
pub(crate) fn row_max(scores: &[f64]) -> f64 {
    scores.iter().fold(
        f64::NEG_INFINITY,
        |m, &x| {
            if x > m || x.is_nan() { x } else { m }
        },
    )
}

/// e^x for the fused path: 2^(x·log2 e) split into 2^n · 2^f, with [`EXP2_POLY`] for 2^f
/// (relative error below 1e-6 on [-10, 0], 4e-6 near ±87); exactly 0 below -87 and for -inf,
/// infinite above 88.7, NaN for NaN. Branch-free, so that loops over it vectorise.
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    // Adding 1.5·2^23 rounds to an integer (ties to even) held in the low mantissa bits:
    // n is read back as an integer without a float-to-int conversion, which would not
    // vectorise.
    const SHIFT: f32 = 12_582_912.0;
    let y = (x * std::f32::consts::LOG2_E).clamp(-126.0, 128.0);
    let shifted = y + SHIFT;
    let n = shifted - SHIFT;
    let f = y - n;
    let mut p = 0.0;
    for &c in &EXP2_POLY {
        p = p * f + c;
    }
    let p = p * f + 1.0;
    let n_bits = shifted.to_bits().wrapping_sub(SHIFT.to_bits());
    let scaled = p * f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { scaled }
}

/// 2^f on [-0.5, 0.5] as a degree-5 polynomial, highest coefficient first (near-minimax
/// relative error 1e-7, 2e-7 evaluated in f32); the constant term is 1.
#[allow(clippy::approx_constant)] // the linear term is the fit's, 3 ulp below ln 2
const EXP2_POLY: [f32; 5] = [
    0.001_326_470_6,
    0.009_671_511,
    0.055_507_34,
    0.240_222_42,
    0.693_147,
];

/// One (pre-scaled) query row's scores against a transposed key block (`kt[x][c]`), kept
/// in registers.
#[inline(always)]
fn score_row<const FUSED: bool>(q: &[f32], kt: &[f32]) -> [f32; BLOCK_N] {
    let mut acc = [0f32; BLOCK_N];
    for (&qx, col) in q.iter().zip(kt.chunks_exact(BLOCK_N)) {
        for c in 0..BLOCK_N {
            acc[c] = mul_add::<FUSED>(qx, col[c], acc[c]);
        }
    }
    acc
}

/// `acc * alpha + Σ_c p[c] · v_c[0..64]`, kept in registers; `v(c)` starts at key c's values.
#[inline(always)]
fn weighted_sum<'v, const FUSED: bool>(
    mut acc: [f32; 64],
    alpha: f32,
    p: &[f32],
    v: impl Fn(usize) -> &'v [f32],
) -> [f32; 64] {
    for a in acc.iter_mut() {
        *a *= alpha;
    }
    for (c, &w) in p.iter().enumerate() {
        let row: &[f32; 64] = v(c)[..64].try_into().expect("64 values");
        for l in 0..64 {
            acc[l] = mul_add::<FUSED>(w, row[l], acc[l]);
        }
    }
    acc
}

/// The maximum of a block row, over 16 lanes (so that it vectorises).
#[inline(always)]
fn lanes_max(x: &[f32; BLOCK_N]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    for chunk in x.chunks_exact(16) {
        for l in 0..16 {
            lanes[l] = nan_max(lanes[l], chunk[l]);
        }
    }
    halving(lanes, nan_max)
}

/// The larger of `a` and `b`, NaN if either is (so that a NaN score makes its row NaN, as
/// on every other path).
#[inline(always)]
fn nan_max(a: f32, b: f32) -> f32 {
    if b > a || b.is_nan() { b } else { a }
}

/// `lanes` folded by `op` in halves (8 pairs, 4, 2, 1), so that the steps vectorise
/// instead of forming one serial chain.
#[inline(always)]
fn halving(lanes: [f32; 16], op: impl Fn(f32, f32) -> f32) -> f32 {
    let eight: [f32; 8] = std::array::from_fn(|l| op(lanes[l], lanes[l + 8]));
    let four: [f32; 4] = std::array::from_fn(|l| op(eight[l], eight[l + 4]));
    op(op(four[0], four[2]), op(four[1], four[3]))
}

/// The sum of a block row, over 16 lanes (so that it vectorises).
#[inline(always)]
fn lanes_sum(x: &[f32; BLOCK_N]) -> f32 {
    let mut lanes = [0f32; 16];
    for chunk in x.chunks_exact(16) {
        for l in 0..16 {
            lanes[l] += chunk[l];
        }
    }
    halving(lanes, |a, b| a + b)
}

const BLOCK_M: usize = 48;
const BLOCK_N: usize = 64;

/// One row of a block's scores through the online softmax: keys from `visible` on are
/// hidden, the mask `(view, row, first key)` is added, the row's running max and sum take
/// the block in, and the scores become weights. Returns the factor that rescales the
/// row's earlier sums, or `None` (with zero weights) while the row has seen no key.
#[inline(always)]
fn online_softmax(
    srow: &mut [f32; BLOCK_N],
    visible: usize,
    bias: Option<(MaskView, usize, usize)>,
    row_max: &mut f32,
    row_sum: &mut f32,
) -> Option<f32> {
    srow[visible..].fill(f32::NEG_INFINITY);
    if let Some((mask, i, kb)) = bias {
        for (c, x) in srow[..visible].iter_mut().enumerate() {
            *x += mask.at(i, kb + c);
        }
    }
    let new_max = nan_max(*row_max, lanes_max(srow));
    if new_max == f32::NEG_INFINITY {
        srow.fill(0.0);
        return None;
    }
    let alpha = fast_exp(*row_max - new_max);
    *row_max = new_max;
    for x in srow.iter_mut() {
        *x = fast_exp(*x - new_max);
    }
    *row_sum = *row_sum * alpha + lanes_sum(srow);
    Some(alpha)
}

/// One query block against all its keys, online softmax in f32, in portable code (the
/// build's vector width): each key block is transposed once, so that scores and weighted
/// sums are plain loops the compiler vectorises.
#[inline(always)]
fn fused_block_body<const FUSED: bool>(a: BlockArgs) {
    let BlockArgs {
        q,
        v,
        rows,
        s,
        causal,
        bias,
        out,
        lse,
        kt,
        ..
    } = a;
    let n_rows = rows.len();
    let mut row_max = [f32::NEG_INFINITY; BLOCK_M];
    let mut row_sum = [0f32; BLOCK_M];
    let acc = &mut out[..n_rows * s.dv];
    acc.fill(0.0);
    let k_end = if causal { s.lk.min(rows.end) } else { s.lk };
    for kb in (0..k_end).step_by(BLOCK_N) {
        let keys = BLOCK_N.min(k_end - kb);
        let kt = key_block(kt, s.d, kb);
        for (r, i) in rows.clone().enumerate() {
            let mut srow = score_row::<FUSED>(&q[r * s.d..(r + 1) * s.d], kt);
            let visible = if causal {
                keys.min((i + 1).saturating_sub(kb))
            } else {
                keys
            };
            let bias = bias.map(|m| (m, i, kb));
            let Some(alpha) =
                online_softmax(&mut srow, visible, bias, &mut row_max[r], &mut row_sum[r])
            else {
                continue; // nothing visible yet: keep zeros
            };
            // Weighted sum of the block's values, 64 output dims at a time in registers.
            let arow = &mut acc[r * s.dv..(r + 1) * s.dv];
            for (chunk_index, chunk) in arow.chunks_mut(64).enumerate() {
                let d0 = chunk_index * 64;
                let rows_of_v = |c: usize| &v[(kb + c) * s.dv + d0..];
                if let Ok(full) = <&mut [f32; 64]>::try_from(&mut *chunk) {
                    *full = weighted_sum::<FUSED>(*full, alpha, &srow[..keys], rows_of_v);
                } else {
                    for x in chunk.iter_mut() {
                        *x *= alpha;
                    }
                    let width = chunk.len();
                    for (c, &p) in srow[..keys].iter().enumerate() {
                        for (a, &y) in chunk.iter_mut().zip(&rows_of_v(c)[..width]) {
                            *a = mul_add::<FUSED>(p, y, *a);
                        }
                    }
                }
            }
        }
    }
    finish_rows(acc, s.dv, &row_max[..n_rows], &row_sum[..n_rows], lse);
}

/// Divides each accumulated row by its softmax sum and writes its log-sum-exp (a row that
/// saw no key gives zeros and -inf; a NaN row gives NaN and NaN).
#[inline(always)]
fn finish_rows(acc: &mut [f32], dv: usize, row_max: &[f32], row_sum: &[f32], lse: &mut [f32]) {
    for (r, (&max, &sum)) in row_max.iter().zip(row_sum).enumerate() {
        let (inv, l) = if sum == 0.0 {
            (0.0, f32::NEG_INFINITY)
        } else {
            (1.0 / sum, max + sum.ln())
        };
        for x in &mut acc[r * dv..(r + 1) * dv] {
            *x *= inv;
        }
        lse[r] = l;
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{BLOCK_M, BLOCK_N, BlockArgs, EXP2_POLY, Line, MaskView};

    /// The fused block for AVX-512: [`block_lanes`] with 16 rows per vector, score tiles of
    /// 8 keys x 48 rows and weighted-sum tiles of 8 value columns x 48 rows.
    ///
    /// # Safety
    /// The CPU has AVX-512F and DQ.
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    pub(super) unsafe fn block_avx512(a: BlockArgs) {
        // SAFETY: the caller's CPU has what `__m512`'s operations need.
        unsafe { block_lanes::<__m512, 8, 3, 8, 3>(a) }
    }

    /// The fused block for AVX2: [`block_lanes`] with 8 rows per vector, score tiles of
    /// 4 keys x 24 rows and weighted-sum tiles of 6 value columns x 16 rows (12 of the 16
    /// registers; 4 columns x 24 rows left too few and spilled: 15-27% slower).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block_avx2(a: BlockArgs) {
        // SAFETY: the caller's CPU has what `__m256`'s operations need.
        unsafe { block_lanes::<__m256, 4, 3, 6, 2>(a) }
    }

    /// The vector operations of the fused block, on one register of `LANES` floats. Every
    /// method is unsafe: the CPU must have the vector's instruction set, and pointers must
    /// be valid for the lanes they touch.
    trait Vector: Copy {
        /// Floats per register.
        const LANES: usize;
        unsafe fn splat(x: f32) -> Self;
        unsafe fn load(at: *const f32) -> Self;
        unsafe fn store(self, at: *mut f32);
        /// Stores lanes `0..n` only.
        unsafe fn store_first(self, at: *mut f32, n: usize);
        /// `a·b + c`.
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
        unsafe fn mul(a: Self, b: Self) -> Self;
        unsafe fn add(a: Self, b: Self) -> Self;
        unsafe fn max(a: Self, b: Self) -> Self;
        /// `base[l·stride]` in lanes `l < n`, 0 in the others (64-bit offsets: any stride).
        unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self;
        /// -inf in the lanes whose index is below `first_shown`, `x` in the others.
        unsafe fn hide_below(x: Self, first_shown: f32) -> Self;
        /// `max·log2 e`, 0 where `max` is -inf (rows that have seen no key).
        unsafe fn shift_of(max: Self) -> Self;
        /// e^(s - max) with `shift` = max·log2 e: 2^(s·log2 e - shift) formed by one FMA,
        /// split into 2^n · 2^f with the polynomial of [`super::fast_exp`]. Exactly 0 where
        /// the power is below -125 (and for s = -inf), NaN for NaN.
        unsafe fn exp_shifted(s: Self, shift: Self) -> Self;
    }

    /// The polynomial of 2^f on [-0.5, 0.5] (Horner, [`EXP2_POLY`] then 1).
    #[inline(always)]
    unsafe fn exp2_fraction<V: Vector>(f: V) -> V {
        // SAFETY: register work, under the caller's instruction set.
        unsafe {
            let mut p = V::splat(EXP2_POLY[0]);
            for &coefficient in &EXP2_POLY[1..] {
                p = V::fmadd(f, p, V::splat(coefficient));
            }
            V::fmadd(f, p, V::splat(1.0))
        }
    }

    // SAFETY (every method): one or a few intrinsics under the trait's contract (the CPU
    // has AVX-512F and DQ, pointers are valid for the lanes touched).
    #[allow(unsafe_op_in_unsafe_fn)]
    impl Vector for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(at: *const f32) -> Self {
            _mm512_loadu_ps(at)
        }
        #[inline(always)]
        unsafe fn store(self, at: *mut f32) {
            _mm512_storeu_ps(at, self)
        }
        #[inline(always)]
        unsafe fn store_first(self, at: *mut f32, n: usize) {
            _mm512_mask_storeu_ps(at, first_lanes16(n), self)
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn max(a: Self, b: Self) -> Self {
            _mm512_max_ps(a, b)
        }
        #[inline(always)]
        unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self {
            let stride = _mm512_set1_epi64(stride as i64);
            let low_offsets = _mm512_mullo_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), stride);
            let high_offsets =
                _mm512_mullo_epi64(_mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15), stride);
            let real = first_lanes16(n);
            let low = _mm512_mask_i64gather_ps::<4>(
                _mm256_setzero_ps(),
                real as __mmask8,
                low_offsets,
                base.cast(),
            );
            let high = _mm512_mask_i64gather_ps::<4>(
                _mm256_setzero_ps(),
                (real >> 8) as __mmask8,
                high_offsets,
                base.cast(),
            );
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(low), high)
        }
        #[inline(always)]
        unsafe fn hide_below(x: Self, first_shown: f32) -> Self {
            let lane = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            let shown = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(lane, _mm512_set1_ps(first_shown));
            _mm512_mask_blend_ps(shown, _mm512_set1_ps(f32::NEG_INFINITY), x)
        }
        #[inline(always)]
        unsafe fn shift_of(max: Self) -> Self {
            let seen = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(max, _mm512_set1_ps(f32::NEG_INFINITY));
            _mm512_maskz_mul_ps(seen, max, _mm512_set1_ps(std::f32::consts::LOG2_E))
        }
        #[inline(always)]
        unsafe fn exp_shifted(s: Self, shift: Self) -> Self {
            let y = _mm512_fmsub_ps(s, _mm512_set1_ps(std::f32::consts::LOG2_E), shift);
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            let p = exp2_fraction(_mm512_sub_ps(y, n));
            // No subnormal weights; -inf gives NaN in f and is zeroed here; NaN is not
            // below.
            let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(y, _mm512_set1_ps(-125.0));
            _mm512_maskz_scalef_ps(keep, p, n)
        }
    }

    /// The mask of lanes `0..n` of 16.
    #[inline(always)]
    fn first_lanes16(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    // SAFETY (every method): one or a few intrinsics under the trait's contract (the CPU
    // has AVX2 and FMA, pointers are valid for the lanes touched).
    #[allow(unsafe_op_in_unsafe_fn)]
    impl Vector for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(at: *const f32) -> Self {
            _mm256_loadu_ps(at)
        }
        #[inline(always)]
        unsafe fn store(self, at: *mut f32) {
            _mm256_storeu_ps(at, self)
        }
        #[inline(always)]
        unsafe fn store_first(self, at: *mut f32, n: usize) {
            _mm256_maskstore_ps(at, first_lanes8(n), self)
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn max(a: Self, b: Self) -> Self {
            _mm256_max_ps(a, b)
        }
        #[inline(always)]
        unsafe fn gather(base: *const f32, stride: usize, n: usize) -> Self {
            let stride = stride as i64;
            let low_offsets = _mm256_setr_epi64x(0, stride, 2 * stride, 3 * stride);
            let high_offsets = _mm256_setr_epi64x(4 * stride, 5 * stride, 6 * stride, 7 * stride);
            let real = _mm256_castsi256_ps(first_lanes8(n));
            let low = _mm256_mask_i64gather_ps::<4>(
                _mm_setzero_ps(),
                base,
                low_offsets,
                _mm256_castps256_ps128(real),
            );
            let high = _mm256_mask_i64gather_ps::<4>(
                _mm_setzero_ps(),
                base,
                high_offsets,
                _mm256_extractf128_ps::<1>(real),
            );
            _mm256_set_m128(high, low)
        }
        #[inline(always)]
        unsafe fn hide_below(x: Self, first_shown: f32) -> Self {
            let lane = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
            let shown = _mm256_cmp_ps::<_CMP_GE_OQ>(lane, _mm256_set1_ps(first_shown));
            _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), x, shown)
        }
        #[inline(always)]
        unsafe fn shift_of(max: Self) -> Self {
            let seen = _mm256_cmp_ps::<_CMP_NEQ_UQ>(max, _mm256_set1_ps(f32::NEG_INFINITY));
            let shift = _mm256_mul_ps(max, _mm256_set1_ps(std::f32::consts::LOG2_E));
            _mm256_and_ps(shift, seen)
        }
        #[inline(always)]
        unsafe fn exp_shifted(s: Self, shift: Self) -> Self {
            let y = _mm256_fmsub_ps(s, _mm256_set1_ps(std::f32::consts::LOG2_E), shift);
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            let p = exp2_fraction(_mm256_sub_ps(y, n));
            // 2^n from its exponent bits: n is at least -125 where kept (a normal
            // float); the other lanes (-inf, far below) are zeroed, NaN stays NaN in p.
            let power = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(y, _mm256_set1_ps(-125.0));
            _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(power)), keep)
        }
    }

    /// All-ones in 32-bit lanes `0..n` of 8.
    #[inline(always)]
    fn first_lanes8(n: usize) -> __m256i {
        // SAFETY: register work; AVX is part of every caller's instruction set.
        unsafe {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), lane)
        }
    }

    /// The running max and sum of one vector of query rows, one per lane.
    #[derive(Clone, Copy)]
    struct RowState<V> {
        max: V,
        sum: V,
    }

    /// The fused block with its 48 query rows in vector lanes: scores as register tiles of
    /// `KEYS` keys x `VECS` vectors of rows (the keys read as rows, not transposed), the
    /// online softmax one vector of rows at a time (no horizontal reductions, no branches
    /// on the data), the weighted sums as register tiles of `COLS` value columns x `WVECS`
    /// vectors of rows (the values broadcast, the weights read as vectors), turned back
    /// into rows once per block.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn block_lanes<
        V: Vector,
        const KEYS: usize,
        const VECS: usize,
        const COLS: usize,
        const WVECS: usize,
    >(
        a: BlockArgs,
    ) {
        let BlockArgs {
            q,
            k,
            v,
            rows,
            s,
            causal,
            bias,
            out,
            lse,
            ..
        } = a;
        let n_rows = rows.len();
        let d = s.d;
        // Rows per tile pass (48 or 24), vectors of rows per block (3 or 6).
        let pass = VECS * V::LANES;
        let vectors = BLOCK_M / V::LANES;
        assert!(BLOCK_M.is_multiple_of(pass) && vectors <= 6 && BLOCK_N.is_multiple_of(KEYS));
        assert!(BLOCK_M.is_multiple_of(WVECS * V::LANES));
        // The block's queries transposed, `qt[x][r]`, rows past the block zero.
        // SAFETY: under `V`'s instruction set (the caller's).
        let qt_lines = unsafe { transpose_queries::<V>(q, d, n_rows) };
        let qt: &[f32] = bytemuck::cast_slice(&qt_lines);
        // Scores, then weights, of the key block: `st[c][r]`.
        let mut st_lines = [[Line::ZERO; BLOCK_M / 16]; BLOCK_N];
        let st: &mut [[f32; BLOCK_M]] = bytemuck::cast_slice_mut(&mut st_lines);
        // SAFETY: register work under `V`'s instruction set.
        let mut states = unsafe {
            [RowState {
                max: V::splat(f32::NEG_INFINITY),
                sum: V::splat(0.0),
            }; 6]
        };
        let mut alpha = [1f32; BLOCK_M];
        // The block's weighted sums with the rows in lanes, `acc_t[x][r]`.
        let mut acc_t_lines = vec![Line::ZERO; s.dv * BLOCK_M / 16];
        let acc_t: &mut [f32] = bytemuck::cast_slice_mut(&mut acc_t_lines);
        let k_end = if causal { s.lk.min(rows.end) } else { s.lk };
        for kb in (0..k_end).step_by(BLOCK_N) {
            let keys = BLOCK_N.min(k_end - kb);
            // While the scores are formed, the block's values are fetched into L2, and the
            // next block's keys while the weighted sums are (+4-11% at d = 128, L ≥ 1024).
            let block_values = &v[kb * s.dv..(kb + keys) * s.dv];
            let next_keys = &k[(kb + keys) * d..k_end.min(kb + keys + BLOCK_N) * d];
            let mut tiles = 0;
            for r0 in (0..n_rows).step_by(pass) {
                for c0 in (0..keys).step_by(KEYS) {
                    // Past the last key, repeat it (those scores are never read).
                    let key_at = std::array::from_fn(|c| (kb + c0 + c).min(s.lk - 1) * d);
                    let ahead = piece(block_values, tiles, 16 * d);
                    tiles += 1;
                    // SAFETY: under `V`'s instruction set (the caller's).
                    unsafe { scores::<V, KEYS, VECS>(qt, r0, d, k, key_at, &mut st[c0..], ahead) };
                }
            }
            for (j, state) in states[..vectors].iter_mut().enumerate() {
                let row0 = rows.start + V::LANES * j;
                if row0 >= rows.end {
                    break;
                }
                let lanes = Lanes {
                    first: V::LANES * j,
                    row0,
                    real: (rows.end - row0).min(V::LANES),
                    kb,
                    causal: causal && kb + keys > row0 + 1,
                    bias,
                };
                // SAFETY: under `V`'s instruction set (the caller's).
                unsafe { softmax(&mut st[..keys], lanes, state, &mut alpha) };
            }
            let values = &v[kb * s.dv..];
            let mut tiles = 0;
            for r0 in (0..n_rows).step_by(WVECS * V::LANES) {
                let mut x0 = 0;
                while x0 + COLS <= s.dv {
                    let ahead = piece(next_keys, tiles, 16 * BLOCK_N);
                    tiles += 1;
                    // SAFETY: under `V`'s instruction set (the caller's).
                    unsafe {
                        weighted::<V, COLS, WVECS>(
                            acc_t, r0, x0, &alpha, st, values, s.dv, keys, ahead,
                        )
                    };
                    x0 += COLS;
                }
                for x in x0..s.dv {
                    // SAFETY: as above.
                    unsafe {
                        weighted::<V, 1, WVECS>(acc_t, r0, x, &alpha, st, values, s.dv, keys, &[])
                    };
                }
            }
        }
        let mut max = [0f32; BLOCK_M];
        let mut sum = [0f32; BLOCK_M];
        for (j, state) in states[..vectors].iter().enumerate() {
            // SAFETY: LANES floats fit at LANES·j of the 48.
            unsafe {
                state.max.store(max.as_mut_ptr().add(V::LANES * j));
                state.sum.store(sum.as_mut_ptr().add(V::LANES * j));
            }
        }
        let acc = &mut out[..n_rows * s.dv];
        // SAFETY: under `V`'s instruction set (the caller's).
        unsafe { rows_from_lanes::<V>(acc_t, acc, s.dv, n_rows) };
        super::finish_rows(acc, s.dv, &max[..n_rows], &sum[..n_rows], lse);
    }

    /// The block's `n_rows` queries (`q`, rows of `d`) transposed to `qt[x][r]` with
    /// `BLOCK_M` rows, those past `n_rows` zero: a vector of rows per gather.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn transpose_queries<V: Vector>(q: &[f32], d: usize, n_rows: usize) -> Vec<Line> {
        assert!(n_rows <= BLOCK_M && q.len() >= n_rows * d);
        let mut lines = vec![Line::ZERO; d * BLOCK_M / 16];
        let qt: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
        for r0 in (0..n_rows).step_by(V::LANES) {
            let real = (n_rows - r0).min(V::LANES);
            for x in 0..d {
                // SAFETY: lane l reads q[(r0 + l)·d + x] for rows below n_rows, inside `q`;
                // the store fills qt[x][r0..r0 + LANES], inside `qt` (both checked).
                unsafe {
                    V::gather(q.as_ptr().add(r0 * d + x), d, real)
                        .store(qt.as_mut_ptr().add(x * BLOCK_M + r0));
                }
            }
        }
        lines
    }

    /// `acc[r][x] = acc_t[x][r]` for the first `n_rows` rows (`dv` columns each), a vector
    /// of columns per gather.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn rows_from_lanes<V: Vector>(acc_t: &[f32], acc: &mut [f32], dv: usize, n_rows: usize) {
        assert!(acc_t.len() >= dv * BLOCK_M && acc.len() >= n_rows * dv && n_rows <= BLOCK_M);
        for x0 in (0..dv).step_by(V::LANES) {
            let real = (dv - x0).min(V::LANES);
            for r in 0..n_rows {
                // SAFETY: lane l reads acc_t[(x0 + l)·48 + r] with x0 + l < dv, inside
                // `acc_t`; the store writes acc[r][x0..x0 + real], inside `acc` (checked).
                unsafe {
                    V::gather(acc_t.as_ptr().add(x0 * BLOCK_M + r), BLOCK_M, real)
                        .store_first(acc.as_mut_ptr().add(r * dv + x0), real);
                }
            }
        }
    }

    /// Piece `index` of `all` in pieces of `len` (shorter or empty at the end).
    fn piece(all: &[f32], index: usize, len: usize) -> &[f32] {
        let start = (index * len).min(all.len());
        &all[start..(start + len).min(all.len())]
    }

    /// Scores of `KEYS` keys (rows of `k` starting at `key_at[c]`) against `VECS` vectors of
    /// the block's queries from row `r0`, held transposed (`qt[x][r]`): `out[c][r]`, in
    /// registers. Meanwhile asks for `ahead` in L2, a cache line per step.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn scores<V: Vector, const KEYS: usize, const VECS: usize>(
        qt: &[f32],
        r0: usize,
        d: usize,
        k: &[f32],
        key_at: [usize; KEYS],
        out: &mut [[f32; BLOCK_M]],
        ahead: &[f32],
    ) {
        assert!(qt.len() >= d * BLOCK_M && out.len() >= KEYS && r0 + VECS * V::LANES <= BLOCK_M);
        assert!(key_at.iter().all(|&at| at + d <= k.len()));
        // SAFETY: every access is within the slices checked above.
        unsafe {
            let mut acc = [[V::splat(0.0); VECS]; KEYS];
            let mut keys = [k.as_ptr(); KEYS];
            for (key, &at) in keys.iter_mut().zip(&key_at) {
                *key = k.as_ptr().add(at);
            }
            for x in 0..d {
                if 16 * x < ahead.len() {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.as_ptr().add(16 * x).cast());
                }
                let column = qt.as_ptr().add(x * BLOCK_M + r0);
                let mut qv = [V::splat(0.0); VECS];
                for (j, slot) in qv.iter_mut().enumerate() {
                    *slot = V::load(column.add(V::LANES * j));
                }
                for (key, row) in keys.iter().zip(acc.iter_mut()) {
                    let kx = V::splat(*key.add(x));
                    for j in 0..VECS {
                        row[j] = V::fmadd(qv[j], kx, row[j]);
                    }
                }
            }
            for (c, row) in acc.iter().enumerate() {
                for (j, &a) in row.iter().enumerate() {
                    a.store(out[c].as_mut_ptr().add(r0 + V::LANES * j));
                }
            }
        }
    }

    /// The weighted sums with the block's rows in lanes, for value columns
    /// `x0..x0 + COLS` and `VECS` vectors of rows from `r0`:
    /// `acc_t[x][r] = acc_t[x][r]·alpha[r] + Σ_c pt[c][r]·v[c][x]` over `keys` value rows
    /// (`dv` apart), in registers: the weights load as vectors, the values broadcast.
    /// Meanwhile asks for `ahead` in L2, a cache line per key.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn weighted<V: Vector, const COLS: usize, const VECS: usize>(
        acc_t: &mut [f32],
        r0: usize,
        x0: usize,
        alpha: &[f32; BLOCK_M],
        pt: &[[f32; BLOCK_M]],
        v: &[f32],
        dv: usize,
        keys: usize,
        ahead: &[f32],
    ) {
        assert!(acc_t.len() >= (x0 + COLS) * BLOCK_M && keys <= pt.len() && x0 + COLS <= dv);
        assert!(r0 + VECS * V::LANES <= BLOCK_M);
        assert!(keys == 0 || v.len() >= (keys - 1) * dv + x0 + COLS);
        // SAFETY: every access is within the slices checked above.
        unsafe {
            let mut scale = [V::splat(0.0); VECS];
            for (j, slot) in scale.iter_mut().enumerate() {
                *slot = V::load(alpha.as_ptr().add(r0 + V::LANES * j));
            }
            let mut acc = [[V::splat(0.0); VECS]; COLS];
            for (w, row) in acc.iter_mut().enumerate() {
                let at = acc_t.as_ptr().add((x0 + w) * BLOCK_M + r0);
                for j in 0..VECS {
                    row[j] = V::mul(V::load(at.add(V::LANES * j)), scale[j]);
                }
            }
            for c in 0..keys {
                if 16 * c < ahead.len() {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.as_ptr().add(16 * c).cast());
                }
                let weights = pt.get_unchecked(c).as_ptr().add(r0);
                let mut p = [V::splat(0.0); VECS];
                for (j, slot) in p.iter_mut().enumerate() {
                    *slot = V::load(weights.add(V::LANES * j));
                }
                let values = v.as_ptr().add(c * dv + x0);
                for (w, row) in acc.iter_mut().enumerate() {
                    let b = V::splat(*values.add(w));
                    for j in 0..VECS {
                        row[j] = V::fmadd(p[j], b, row[j]);
                    }
                }
            }
            for (w, row) in acc.iter().enumerate() {
                let at = acc_t.as_mut_ptr().add((x0 + w) * BLOCK_M + r0);
                for (j, &a) in row.iter().enumerate() {
                    a.store(at.add(V::LANES * j));
                }
            }
        }
    }

    /// Which rows a softmax vector holds, and what hides keys from them.
    #[derive(Clone, Copy)]
    struct Lanes<'a> {
        /// The first row's place in the block.
        first: usize,
        /// The first row's query index.
        row0: usize,
        /// Rows that exist (the others are padding, their lanes never read).
        real: usize,
        /// The key block's first key.
        kb: usize,
        /// Whether the causal diagonal crosses this key block for these rows.
        causal: bool,
        bias: Option<MaskView<'a>>,
    }

    /// The online softmax of one key block for one vector of query rows, one row per lane:
    /// `st[c]` holds the scores of key `c` and becomes its weights. Keys after a row's
    /// diagonal (causal) get weight 0, the mask is added; the factors that rescale the
    /// rows' earlier sums (0 while a row has seen no key) go to `alpha`.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn softmax<V: Vector>(
        st: &mut [[f32; BLOCK_M]],
        lanes: Lanes,
        state: &mut RowState<V>,
        alpha: &mut [f32; BLOCK_M],
    ) {
        assert!(lanes.first + V::LANES <= BLOCK_M && lanes.real >= 1);
        // SAFETY: lanes first..first + LANES of each row of `st` and of `alpha` are in
        // bounds (checked); the mask reads are described at `mask_values`.
        unsafe {
            let mut block_max = V::splat(f32::NEG_INFINITY);
            for (c, key) in st.iter_mut().enumerate() {
                let at = key.as_mut_ptr().add(lanes.first);
                let mut x = V::load(at);
                if let Some(mask) = lanes.bias {
                    x = V::add(x, mask_values::<V>(mask, lanes, c));
                }
                if lanes.causal {
                    // Key kb + c is visible to row row0 + l when kb + c - row0 <= l (a small
                    // difference where the diagonal crosses the block: exact as a float).
                    let first_shown = ((lanes.kb + c) as i64 - lanes.row0 as i64) as f32;
                    x = V::hide_below(x, first_shown);
                }
                if lanes.bias.is_some() || lanes.causal {
                    x.store(at);
                }
                block_max = V::max(block_max, x);
            }
            let new_max = V::max(state.max, block_max);
            // Rows that have seen no key yet keep max -inf: shift them by 0, so that their
            // weights and factor are 0 instead of NaN.
            let shift = V::shift_of(new_max);
            let factor = V::exp_shifted(state.max, shift);
            state.max = new_max;
            let mut sum = V::splat(0.0);
            for key in st.iter_mut() {
                let at = key.as_mut_ptr().add(lanes.first);
                let e = V::exp_shifted(V::load(at), shift);
                e.store(at);
                sum = V::add(sum, e);
            }
            state.sum = V::fmadd(state.sum, factor, sum);
            factor.store(alpha.as_mut_ptr().add(lanes.first));
        }
    }

    /// The mask's values for key `lanes.kb + c` of the vector's rows (0 in padding lanes):
    /// one broadcast value where the mask does not vary along the rows, else a gather.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set.
    #[inline(always)]
    unsafe fn mask_values<V: Vector>(mask: MaskView, lanes: Lanes, c: usize) -> V {
        let first = mask.base + lanes.row0 * mask.si + (lanes.kb + c) * mask.sj;
        if mask.si == 0 {
            // SAFETY: register work.
            return unsafe { V::splat(mask.values[first]) };
        }
        let last = first + (lanes.real - 1) * mask.si;
        assert!(last < mask.values.len());
        // SAFETY: the gather reads the elements (row0 + l, kb + c) of the real rows, which
        // the mask has (checked for the last real row).
        unsafe { V::gather(mask.values.as_ptr().add(first), mask.si, lanes.real) }
    }
}

/// The mask of one (batch, head) as additive f32 values: `at(i, j)`.
#[derive(Clone, Copy)]
struct MaskView<'a> {
    values: &'a [f32],
    base: usize,
    si: usize,
    sj: usize,
}

impl MaskView<'_> {
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.values[self.base + i * self.si + j * self.sj]
    }
}

/// The arguments of one fused block.
struct BlockArgs<'a> {
    /// The block's queries (the rows of `rows`), already multiplied by the scale.
    q: &'a [f32],
    /// The head's keys, `[Lk, d]`, for the kernel that reads them as rows (else empty).
    k: &'a [f32],
    v: &'a [f32],
    rows: std::ops::Range<usize>,
    s: &'a Shape,
    causal: bool,
    bias: Option<MaskView<'a>>,
    out: &'a mut [f32],
    lse: &'a mut [f32],
    /// The head's keys, transposed block by block (see [`transpose_keys`]), for the kernels
    /// that read them so (else empty).
    kt: &'a [f32],
}

/// Keys `[L, d]` of one head into `kt` (zeroed, `⌈L / BLOCK_N⌉·d·BLOCK_N` long) as blocks
/// of `BLOCK_N`, each transposed to `[d][BLOCK_N]` (zero past the last key), so that a
/// block's scores are plain vector loops. Done once per head, shared by all its query
/// blocks.
fn transpose_keys(k: &[f32], lk: usize, d: usize, kt: &mut [f32]) {
    if d == 0 {
        return;
    }
    for (block, keys) in kt
        .chunks_exact_mut(d * BLOCK_N)
        .zip(k[..lk * d].chunks(d * BLOCK_N))
    {
        // Row by row of the transposed block: contiguous writes, reads d apart (the block,
        // 64 keys, stays in L1).
        for (x, row) in block.chunks_exact_mut(BLOCK_N).enumerate() {
            for (slot, key) in row.iter_mut().zip(keys.chunks_exact(d)) {
                *slot = key[x];
            }
        }
    }
}

/// The transposed block of keys starting at key `kb`.
#[inline(always)]
fn key_block(kt: &[f32], d: usize, kb: usize) -> &[f32] {
    let start = (kb / BLOCK_N) * d * BLOCK_N;
    &kt[start..start + d * BLOCK_N]
}

/// Whether the fused block in force reads the keys as rows (`BlockArgs::k`, the AVX-512
/// and AVX2 kernels) rather than transposed (`BlockArgs::kt`, the portable one).
fn reads_key_rows() -> bool {
    use crate::cpu::CpuCapability;
    cfg!(target_arch = "x86_64")
        && matches!(
            crate::cpu::get_cpu_capability(),
            CpuCapability::Avx512 | CpuCapability::Avx2
        )
}

/// A cache line of floats: buffers of these start on a 64-byte boundary, so that the
/// vector loads of a row (a multiple of 16 floats) never straddle two lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Line {
    const ZERO: Line = Line([0.0; 16]);
}

// SAFETY: sixteen f32s, 64 bytes, no padding: any bit pattern is a valid Line, zero
// included.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; Line is Copy and 'static.
unsafe impl bytemuck::Pod for Line {}

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

/// Runs one fused block with the code compiled for the CPU capability in force.
fn run_block(args: BlockArgs) {
    match crate::cpu::get_cpu_capability() {
        // SAFETY: the capability in force never exceeds what the CPU has.
        #[cfg(target_arch = "x86_64")]
        crate::cpu::CpuCapability::Avx512 => unsafe { simd::block_avx512(args) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        crate::cpu::CpuCapability::Avx2 => unsafe { simd::block_avx2(args) },
        _ => fused_block_body::<{ crate::cpu::BASELINE_FMA }>(args),
    }
}

/// The CPU fused path: tiled online softmax over key blocks, threads over
/// batch x heads x query blocks. Memory beyond the inputs and outputs is, per thread, one
/// block of queries and scores, and one head's keys and values where they are widened from
/// 16 bits or transposed (never an Lq x Lk buffer).
fn cpu_fused(job: &Job) -> Result<(Tensor, Tensor)> {
    let (q, k, v, o, s, scale, out_shape) = job.parts();
    let (qv, kv, vv) = (Input::of(q)?, Input::of(k)?, Input::of(v)?);
    let scale = scale as f32;
    let bias = Bias::of(o.attn_mask)?;
    let bias_values: Option<Vec<f32>> = bias
        .as_ref()
        .map(|m| m.values.iter().map(|&x| x as f32).collect());
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
    let key_rows = reads_key_rows();
    let (qv, kv, vv, bias, bias_values) = (&qv, &kv, &vv, &bias, &bias_values);
    type Chunk<'o> = (Vec<(usize, &'o mut [f32], &'o mut [f32])>, Vec<f32>);
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
            let kvh = b * s.hk + hk;
            let key_range = kvh * s.lk * s.d..(kvh + 1) * s.lk * s.d;
            let (k, kt) = if key_rows {
                (k_head.f32s(kv, kvh, key_range), &[][..])
            } else {
                let len = s.lk.div_ceil(BLOCK_N) * s.d * BLOCK_N;
                let kt = k_head.get_or_fill(kvh, len, |kt| {
                    transpose_keys(kv.f32s(key_range, &mut wide), s.lk, s.d, kt)
                });
                (&[][..], kt)
            };
            let v = v_head.f32s(vv, kvh, kvh * s.lk * s.dv..(kvh + 1) * s.lk * s.dv);
            let mask = bias
                .as_ref()
                .zip(bias_values.as_deref())
                .map(|(m, values)| MaskView {
                    values,
                    base: b * m.strides[0] + h * m.strides[1],
                    si: m.strides[2],
                    sj: m.strides[3],
                });
            run_block(BlockArgs {
                q,
                k,
                v,
                rows,
                s,
                causal: o.is_causal,
                bias: mask,
                out: o_here,
                lse: l_here,
                kt,
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
    let block_len = BLOCK_M
        .checked_mul(s.d)
        .ok_or_else(|| Error::ShapeMismatch {
            op: OP_CPU,
            detail: format!("head dim {} is too large for a query block", s.d),
        })?;
    let chunks: Vec<Chunk> = chunks
        .into_iter()
        .map(|chunk| Ok((chunk, host_zeros(OP_CPU, block_len)?)))
        .collect::<Result<_>>()?;
    crate::threads::for_each(chunks, &work);
    let output = match q.dtype() {
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
    let lse = Tensor::from_vec(lse, &[s.b, s.h, s.lq], Device::Cpu)?;
    Ok((output, lse))
}

/// The fused path for f64 inputs, computed in f64 as PyTorch's CPU flash kernel does for
/// them: each query row streams its keys through an online softmax (no score buffer),
/// threads over runs of rows. The log-sum-exp is f64 too.
fn cpu_fused_f64(job: &Job) -> Result<(Tensor, Tensor)> {
    let (q, k, v, o, s, scale, out_shape) = job.parts();
    let (qv, kv, vv) = (host_f64(q)?, host_f64(k)?, host_f64(v)?);
    let bias = Bias::of(o.attn_mask)?;
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
    crate::threads::for_each(chunks, &|(chunk, (out, lse)): (
        usize,
        (&mut [f64], &mut [f64]),
    )| {
        for (r, l) in lse.iter_mut().enumerate() {
            let row = chunk * per + r;
            let (bh, i) = (row / s.lq, row % s.lq);
            let (b, h) = (bh / s.h, bh % s.h);
            let kvh = b * s.hk + s.kv_head(h);
            let query = &qv[row * s.d..][..s.d];
            let acc = &mut out[r * s.dv..][..s.dv];
            let (mut max, mut sum) = (f64::NEG_INFINITY, 0.0);
            let keys = if o.is_causal { s.lk.min(i + 1) } else { s.lk };
            for j in 0..keys {
                let key = &kv[(kvh * s.lk + j) * s.d..][..s.d];
                let mut x = query.iter().zip(key).map(|(a, c)| a * c).sum::<f64>() * scale;
                if let Some(bias) = bias {
                    x += bias.at(b, h, i, j);
                }
                if x == f64::NEG_INFINITY {
                    continue;
                }
                if x > max {
                    let alpha = (max - x).exp();
                    sum *= alpha;
                    acc.iter_mut().for_each(|a| *a *= alpha);
                    max = x;
                }
                let p = (x - max).exp();
                sum += p;
                let value = &vv[(kvh * s.lk + j) * s.dv..][..s.dv];
                for (a, &y) in acc.iter_mut().zip(value) {
                    *a += p * y;
                }
            }
            // A row that saw no key gives zeros and -inf, a NaN row NaN and NaN, as the
            // other fused kernels.
            let (inv, lse) = if sum == 0.0 {
                (0.0, f64::NEG_INFINITY)
            } else {
                (1.0 / sum, max + sum.ln())
            };
            acc.iter_mut().for_each(|a| *a *= inv);
            *l = lse;
        }
    });
    Ok((
        Tensor::from_vec(out, out_shape, Device::Cpu)?,
        Tensor::from_vec(lse, &[s.b, s.h, s.lq], Device::Cpu)?,
    ))
}

/// Flash or memory-efficient attention on wgpu through the generated WGSL.
fn wgpu_fused(
    index: usize,
    backend: SdpBackend,
    pinned: Option<&'static KernelEntry>,
    job: &Job,
) -> Result<SdpaOutput> {
    let (q, k, v, o, s, scale, out_shape) = job.parts();
    let gpu = crate::gpu::gpu(index)?;
    let elem = if q.dtype() == DType::F16 {
        Elem::F16
    } else {
        Elem::F32
    };
    let width = s.d.max(s.dv);
    let mask = match o.attn_mask.map(Tensor::dtype) {
        None => MaskKind::None,
        Some(DType::Bool) => MaskKind::Bool,
        Some(_) => MaskKind::Additive,
    };
    let entry = pinned
        .filter(|e| e.wgsl.is_some())
        .or_else(|| {
            rules::kernel_key(backend.into(), elem, width, o.is_causal, mask)
                .and_then(|k| crate::kernels::lookup(&k))
        })
        .ok_or_else(|| Error::Unavailable {
            what: "an attention kernel",
            why: format!("no {backend} variant serves head dim {width}"),
        })?;
    let kernel = entry
        .wgsl
        .as_ref()
        .expect("wgpu attention variants have WGSL");
    let u32_of = |x: usize| {
        u32::try_from(x).map_err(|_| Error::ShapeMismatch {
            op: "scaled_dot_product_attention on wgpu",
            detail: format!("{x} exceeds 32 bits; split the call"),
        })
    };
    let strides = |t: &Tensor| -> [usize; 3] {
        let st = t.strides();
        let r = st.len();
        [if r == 4 { st[0] } else { 0 }, st[r - 3], st[r - 2]]
    };
    let mask_strides = o
        .attn_mask
        .map_or([0; 4], |m| broadcast_strides(m.shape(), m.strides()));
    let mut words = vec![s.h, s.hk, s.lq, s.lk, s.d, usize::from(o.is_causal)]
        .into_iter()
        .map(u32_of)
        .collect::<Result<Vec<u32>>>()?;
    words.push((scale as f32).to_bits());
    words.push(0);
    for t in [q, k, v] {
        for x in strides(t) {
            words.push(u32_of(x)?);
        }
    }
    for x in [s.h * s.lq * s.dv, s.lq * s.dv, s.dv]
        .into_iter()
        .chain(mask_strides)
    {
        words.push(u32_of(x)?);
    }
    let params: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let out = crate::gpu::Buffer::output(gpu, s.b * s.h * s.lq * s.dv * q.dtype().size())?;
    let lse = crate::gpu::Buffer::output(gpu, s.b * s.h * s.lq * 4)?;
    let dummy;
    let mask_buffer = match o.attn_mask {
        Some(m) => m.wgpu_buffer().expect("a wgpu mask has a buffer").raw(),
        None => {
            dummy = crate::gpu::Buffer::zeroed(gpu, 4)?;
            dummy.raw()
        }
    };
    let buffers = [q, k, v].map(|t| t.wgpu_buffer().expect("wgpu tensors have buffers").raw());
    let groups = [
        u32_of(s.lq.div_ceil(kernel.tile[0] as usize))?,
        u32_of(s.b * s.h)?,
        1,
    ];
    if s.lq > 0 && s.b * s.h > 0 {
        gpu.run(
            entry.name,
            kernel,
            &[
                buffers[0],
                buffers[1],
                buffers[2],
                mask_buffer,
                out.raw(),
                lse.raw(),
            ],
            &params,
            groups,
        )?;
    }
    let output = Tensor::from_storage(
        Storage::Wgpu(out),
        q.dtype(),
        Device::Wgpu(index),
        out_shape,
    );
    let lse = Tensor::from_storage(
        Storage::Wgpu(lse),
        DType::F32,
        Device::Wgpu(index),
        &[s.b, s.h, s.lq],
    );
    Ok(SdpaOutput {
        output,
        lse: Some(lse),
        backend,
    })
}

#[cfg(test)]
mod tests {
    use super::{HeadCache, Input, fast_exp};

    #[test]
    fn fast_exp_is_close_to_exp_and_handles_the_edges() {
        // The rounding of x·log2(e) grows with |x|: about 4e-6 relative near ±87, below 1e-6
        // where softmax weights live (the largest is 1, at x = 0).
        for (low, high, bound) in [(-87.0, 88.0, 5e-6), (-10.0, 0.0, 1e-6)] {
            let mut worst = 0f64;
            for i in 0..=100_000 {
                let x = (low + (high - low) * f64::from(i) / 100_000.0) as f32;
                let want = f64::from(x).exp();
                worst = worst.max(((f64::from(fast_exp(x)) - want) / want).abs());
            }
            assert!(
                worst < bound,
                "[{low}, {high}]: worst relative error {worst}"
            );
        }
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(100.0), f32::INFINITY);
        assert!(fast_exp(f32::NAN).is_nan());
    }

    #[test]
    fn head_values_are_borrowed_for_f32_and_widened_once_into_aligned_lines_for_16_bits() {
        let all: Vec<f32> = (0..4096).map(|i| (i as f32).sin()).collect();
        let input = Input::F32(std::borrow::Cow::Borrowed(&all));
        let mut cache = HeadCache::default();
        assert_eq!(cache.f32s(&input, 0, 5..77).as_ptr(), all[5..].as_ptr());
        let halves: Vec<half::bf16> = all.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let input = Input::Bf16(&halves);
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
