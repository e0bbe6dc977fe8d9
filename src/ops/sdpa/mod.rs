//! `scaled_dot_product_attention`: PyTorch's semantics, the backend chosen by
//! [`crate::ops::sdpa::select::selected_backend`], and the kernels behind it.
//!
//! - CPU: the math reference (any mask, dropout, GQA; fp32 compute, or f64 for f64
//!   inputs) and the fused path (tiled online softmax, never materialising the Lq x Lk
//!   scores, SIMD-dispatched on the CPU capability, threads over batch x heads x query
//!   blocks; f64 inputs computed in f64, row by row, as PyTorch's CPU flash kernel does).
//! - wgpu: flash and memory-efficient attention through the generated WGSL kernels.
//! - CUDA: flash (f16/bf16 tensor cores) and memory-efficient attention (masks, f32) through
//!   the generated CUDA kernels, with dropout (`sdpa/cuda.rs`); cuDNN's fused attention
//!   through its backend graph API, with plans cached per shape (`sdpa/cudnn.rs`).
//! - Math on wgpu and CUDA runs on the device for f32 inputs (scores GEMM, the generated
//!   masked-softmax kernel, GEMM: `device_math.rs`); other dtypes, and dropout on wgpu, run
//!   the reference on the host, and the trace says so and why.
//!
//! A query row that sees no key (fully masked, or causal with no key before it) gives 0 on
//! every backend and device, as PyTorch 2.15 does (its math path uses a safe softmax), with
//! a log-sum-exp of -inf where the backend returns one. A NaN in the inputs makes its rows
//! NaN, log-sum-exp NaN too, on every path and CPU level.

pub mod backend;
mod cpu;
mod cuda;
#[cfg(feature = "cuda")]
mod cudnn;
mod device_math;
pub mod flags;
mod job;
pub(crate) mod math;
pub mod params;
pub mod pin;
pub mod select;
pub mod serving;
mod split;
mod wgpu;

use crate::core::generator::{Generator, default_generator};
use crate::core::sdp::SdpBackend;
pub use crate::core::sdp::{CausalVariant, Window};
use crate::core::tensor::Tensor;
use crate::core::trace::{self, Call};
use crate::kernels::attention::Shape;
use crate::ops::sdpa::params::{SDPAParams, TensorMeta};
use crate::{DType, Device, Error, Result};
use job::{GpuRows, Job, Sequences, band_args};

/// What attention reports in its errors.
const OP: &str = "scaled_dot_product_attention";

/// What the CPU attention paths report in their errors.
const OP_CPU: &str = "scaled_dot_product_attention on the CPU";

/// The options of one attention call beyond q, k and v. The default has no mask, no
/// dropout, the default scale, no GQA, the device's default generator, and `is_causal`
/// false (true inside a `#[sdpa_kernel(causal)]` function, with the alignment the attribute
/// names: see [`pin::causal_default`]).
#[derive(Clone, Copy, Debug)]
pub struct SdpaOptions<'a> {
    /// Boolean (true takes part) or additive mask, broadcastable to `[B, H, Lq, Lk]`; not
    /// together with `is_causal` (an error, as in PyTorch: fold the causal mask into it).
    pub attn_mask: Option<&'a Tensor>,
    /// Dropout probability on the attention weights.
    pub dropout_p: f64,
    /// Causal masking, aligned as `causal_variant` says (top-left by default: query i sees
    /// keys `0..=i`, as PyTorch's `is_causal`).
    pub is_causal: bool,
    /// Which diagonal the causal mask and the sliding window follow.
    pub causal_variant: CausalVariant,
    /// A sliding window of keys around that diagonal (unbounded by default).
    pub window: Window,
    /// Score scale; `None` is `1 / sqrt(D)`.
    pub scale: Option<f64>,
    /// Grouped-query attention: key/value heads shared by groups of query heads.
    pub enable_gqa: bool,
    /// Where dropout draws from: `None` is the query device's default generator
    /// ([`crate::core::generator::default_generator`], seeded by [`crate::manual_seed`]), whose
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
            is_causal: pin::causal_default().is_some(),
            causal_variant: pin::causal_default().unwrap_or_default(),
            window: Window::UNBOUNDED,
            scale: None,
            enable_gqa: false,
            generator: None,
        }
    }
}

impl<'a> SdpaOptions<'a> {
    /// These options with PyTorch's `attn_mask=causal_lower_right(Lq, Lk)`: causal,
    /// bottom-right aligned.
    pub fn causal_lower_right(self) -> Self {
        SdpaOptions {
            is_causal: true,
            causal_variant: CausalVariant::LowerRight,
            ..self
        }
    }

    /// These options with a sliding window of `left` keys before and `right` after the
    /// diagonal (`None`: unbounded), as flash-attn's `window_size`.
    pub fn sliding_window(self, left: Option<usize>, right: Option<usize>) -> Self {
        SdpaOptions {
            window: Window::new(left, right),
            ..self
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
        causal_variant: CausalVariant::UpperLeft,
        window: Window::UNBOUNDED,
        scale,
        enable_gqa,
        generator: None,
    };
    sdpa(query, key, value, &options).map(|out| out.output)
}

/// [`sdpa`] with its output written into `out` (a CPU tensor of the output's shape and
/// dtype, such as a [`crate::BorrowScope::borrow_mut`] over caller memory): the returned
/// [`SdpaOutput::output`] is `out`.
pub fn sdpa_out(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    options: &SdpaOptions,
    out: &Tensor,
) -> Result<SdpaOutput> {
    let result = sdpa(query, key, value, options)?;
    crate::ops::copy::write_out("sdpa_out", &result.output, out)?;
    Ok(SdpaOutput {
        output: out.clone(),
        ..result
    })
}

/// Attention of bf16 wgpu tensors: `attend` on f32 copies widened on the device (an additive
/// bf16 mask too), its output rounded back to bf16 (the log-sum-exp stays f32).
pub(crate) fn bf16_on_wgpu(
    op: &'static str,
    inputs: [&Tensor; 3],
    options: &SdpaOptions,
    attend: impl FnOnce([&Tensor; 3], &SdpaOptions) -> Result<SdpaOutput>,
) -> Result<SdpaOutput> {
    use crate::ops::convert::{from_f32, is_wgpu_bf16, widened};
    let [q, k, v] = inputs.map(|t| widened(op, t));
    let mask = match options.attn_mask {
        Some(m) if is_wgpu_bf16(m) => Some(widened(op, m)?),
        _ => None,
    };
    let options = SdpaOptions {
        attn_mask: mask.as_ref().or(options.attn_mask),
        ..*options
    };
    let out = attend([&q?, &k?, &v?], &options)?;
    Ok(SdpaOutput {
        output: from_f32(op, &out.output, DType::Bf16)?,
        ..out
    })
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
        causal_variant: options.causal_variant,
        window: options.window,
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
    if [query, key, value]
        .into_iter()
        .all(crate::ops::convert::is_wgpu_bf16)
    {
        return bf16_on_wgpu(
            "sdpa",
            [query, key, value],
            options,
            |[q, k, v], options| sdpa(q, k, v, options),
        );
    }
    let p = params(query, key, value, options);
    let (backend, pin) = select::select(&p)?;
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
    let mut job = Job::new([query, key, value], options, shape, None)?;
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
    if backend == SdpBackend::Math && job.out_shape.contains(&0) {
        // Nothing to write (no query row, or a value dim of 0): the empty result, without
        // walking rows that hold nothing.
        return Ok(SdpaOutput {
            output: Tensor::from_f64(&[], &job.out_shape, query.dtype(), query.device())?,
            lse: None,
            backend,
        });
    }
    // Dropout draws one value per weight, B x H x Lq x Lk of them.
    job.dropout = (options.dropout_p > 0.0).then(|| {
        let count = [shape.b, shape.h, shape.lq, shape.lk]
            .iter()
            .fold(1u64, |n, &x| n.saturating_mul(x as u64));
        options
            .generator
            .unwrap_or_else(|| default_generator(query.device()))
            .draw(count)
    });
    // Split-KV on a GPU (a pinned kernel runs as pinned).
    let chunks = match query.device() {
        Device::Cpu => 1,
        device if pin.and_then(|p| p.entry()).is_none() => split::chunks(&job, device, backend),
        _ => 1,
    };
    match (query.device(), backend) {
        (Device::Cpu, SdpBackend::Math) => trace::kernel(describe("math, f32 compute"), || {
            Ok(SdpaOutput {
                output: math::cpu_math(&job)?,
                lse: None,
                backend,
            })
        }),
        (Device::Cpu, SdpBackend::Flash) if query.dtype() == DType::F64 => {
            trace::kernel(describe("fused online softmax, f64 compute"), || {
                let (output, lse) = cpu::cpu_fused_f64(&job)?;
                Ok(SdpaOutput {
                    output,
                    lse: Some(lse),
                    backend,
                })
            })
        }
        (Device::Cpu, SdpBackend::Flash) => {
            let level = crate::runtime::cpu::get_cpu_capability().to_string();
            #[cfg(target_arch = "x86_64")]
            let kernel = match (cpu::decodes(&job), cpu::kv_splits(&job)) {
                (true, 1) => "decoding kernel, K/V read once per head group".to_string(),
                (true, runs) => format!(
                    "decoding kernel, K/V read once per head group, keys split into {runs} \
                     runs combined by their log-sum-exps"
                ),
                (false, _) if cpu::bf16_block(&job).is_some() => {
                    "fused online softmax, bf16 dot products (f32 sums)".to_string()
                }
                (false, _) => "fused online softmax".to_string(),
            };
            #[cfg(not(target_arch = "x86_64"))]
            let kernel = "fused online softmax".to_string();
            trace::kernel(describe(&format!("{kernel}, {level}")), || {
                let (output, lse) = cpu::cpu_fused(&job)?;
                Ok(SdpaOutput {
                    output,
                    lse: Some(lse),
                    backend,
                })
            })
        }
        (Device::Wgpu(_) | Device::Cuda(_), _) if chunks > 1 => {
            let note = format!(
                "{}, keys split into {chunks} chunks combined by their log-sum-exps (split-KV)",
                match query.device() {
                    Device::Wgpu(_) => "wgsl, f32 compute".to_string(),
                    _ => cuda::note(backend, query.dtype()),
                }
            );
            trace::kernel(describe(&note), || {
                split::run(query.device(), backend, &job, chunks)
            })
        }
        (Device::Wgpu(index), SdpBackend::Flash | SdpBackend::MemEfficient) => {
            let note = match wgpu::copies(&job) {
                0 => "wgsl, f32 compute".to_string(),
                n => format!("wgsl, f32 compute, {n} input views copied to contiguous first"),
            };
            trace::kernel(describe(&note), || {
                wgpu::wgpu_fused(index, backend, pin.and_then(|p| p.entry()), &job)
            })
        }
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
        (Device::Wgpu(_) | Device::Cuda(_), SdpBackend::Math) => match device_math::serves(&job) {
            None => trace::kernel(
                describe(if query.dtype() == DType::F32 {
                    "math on the device: GEMM, masked softmax, GEMM, f32"
                } else {
                    "math on the device: converted to f32, GEMM, masked softmax, GEMM, rounded back"
                }),
                || {
                    Ok(SdpaOutput {
                        output: device_math::attention(&job)?,
                        lse: None,
                        backend,
                    })
                },
            ),
            Some(why) => trace::kernel(describe(&format!("math on the host: {why}")), || {
                let host = |t: &Tensor| t.to_device(Device::Cpu);
                let mask = options.attn_mask.map(host).transpose()?;
                let host_options = SdpaOptions {
                    attn_mask: mask.as_ref(),
                    ..*options
                };
                let (q, k, v) = (host(query)?, host(key)?, host(value)?);
                let host_job = Job {
                    query: &q,
                    key: &k,
                    value: &v,
                    options: &host_options,
                    ..job.clone()
                };
                Ok(SdpaOutput {
                    output: math::cpu_math(&host_job)?.to_device(query.device())?,
                    lse: None,
                    backend,
                })
            }),
        },
        (device, backend) => Err(Error::Unavailable {
            what: "this SDPA backend here",
            why: format!(
                "{backend} has no kernel for {device} tensors in this build; enable another \
                 backend (flash, memory-efficient or math) for this call"
            ),
        }),
    }
}

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
/// `1 - p`; `key` is the call's [`crate::core::generator::Draw::key`].
fn keep(key: u64, index: u64, p: f64) -> bool {
    let mut z = key ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) >= p
}
