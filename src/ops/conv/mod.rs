//! Convolution (`torch.nn.functional.conv2d` / `conv1d`): `[N, C, H, W]` inputs (or
//! unbatched `[C, H, W]`), weights `[O, C / groups, kH, kW]`, an optional bias `[O]`,
//! stride, padding (explicit, `"same"` or `"valid"`), dilation and groups (depthwise
//! included), in PyTorch's semantics and with its error messages.
//!
//! The CPU lowers each group of each image to one GEMM (`conv/cpu.rs`): convolutions of one
//! group read B's rows in place from padded phase planes of the input (an implicit GEMM;
//! pointwise ones from the input itself), depthwise ones run directly, and the rest unfold
//! the input's patches (im2col, in the input's dtype; skipped for 1×1 kernels with unit
//! stride and no padding, whose input already is the GEMM's right side) and multiply them
//! by the weight through [`matmul`](crate::matmul). The flags that steer matmul steer the
//! convolution too (`fp32_precision`, bf16/f16 reduced-precision rules, AVX512-BF16 / AMX
//! kernels) and its trace lines follow the convolution's own (`mkldnn::verbose`). The bias
//! is added to the result in its dtype.
//!
//! `mkldnn.enabled` (on by default) gives CPU convolutions to these kernels, as PyTorch gives
//! them to oneDNN. Off, a CPU convolution takes PyTorch's path without oneDNN: NNPACK
//! (`conv/nnpack.rs`, loaded at run time) where `nnpack.enabled` is on and PyTorch's rule for
//! it holds, otherwise the unfolded input times the weight (PyTorch's `slow_conv2d`).
//!
//! CUDA tensors (f32, f16, bf16) convolve through cuDNN's backend graph API while
//! `cudnn.enabled` is on and cuDNN 9 loads (`conv/cudnn.rs`): `cudnn.allow_tf32`,
//! `cudnn.deterministic`, `cudnn.benchmark` and `cudnn.benchmark_limit` choose its engine
//! as in PyTorch. Otherwise, and on wgpu (f32, bf16), the generated kernels convolve on the
//! device (`conv/device.rs`): the generated implicit GEMM reads each group's unfolded input
//! from the input as it loads its tiles (never storing it), all images and groups in one
//! batched call; the bias kernel adds the bias. On CUDA the fp32 GEMMs follow
//! `cudnn.allow_tf32` (TF32 by default, as PyTorch's convolutions do) instead of matmul's
//! flag; on wgpu matmul's.

mod cpu;
#[cfg(feature = "cuda")]
mod cudnn;
mod device;
pub mod nnpack;

use crate::core::flag::Flag;
use crate::core::trace::{self, Call};
use crate::{DType, Device, Error, Result, Tensor};

const OP: &str = "conv2d";

/// `torch.backends.mkldnn.enabled`: on, CPU convolutions run on the library's own
/// convolution kernels (implicit GEMM, direct depthwise), as PyTorch's run on oneDNN; off,
/// on NNPACK where [`nnpack::refusal`] allows, else unfolded into GEMMs.
pub static MKLDNN_ENABLED: Flag<bool> = Flag::new("mkldnn.enabled", true, None);

/// How a convolution pads its input (PyTorch's `padding`), for `D` spatial dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding<const D: usize> {
    /// Zeros on both sides of each spatial dimension (`[height, width]` in 2-D).
    Explicit([usize; D]),
    /// `"same"`: the output has the input's size (stride 1 only); an odd total padding puts
    /// the extra zero after the input, as PyTorch does.
    Same,
    /// `"valid"`: no padding.
    Valid,
}

impl<const D: usize> Default for Padding<D> {
    fn default() -> Self {
        Padding::Explicit([0; D])
    }
}

/// `conv2d`'s arguments besides the input and weight (PyTorch's defaults).
#[derive(Clone, Copy, Debug)]
pub struct Conv2dOptions<'a> {
    /// Added to each output channel: `[O]`.
    pub bias: Option<&'a Tensor>,
    /// Steps between patches: `[height, width]`.
    pub stride: [usize; 2],
    /// See [`Padding`].
    pub padding: Padding<2>,
    /// Spacing between kernel taps: `[height, width]`.
    pub dilation: [usize; 2],
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv2dOptions<'_> {
    fn default() -> Self {
        Conv2dOptions {
            bias: None,
            stride: [1, 1],
            padding: Padding::default(),
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// `conv1d`'s arguments: [`Conv2dOptions`] with one spatial dimension.
#[derive(Clone, Copy, Debug)]
pub struct Conv1dOptions<'a> {
    /// Added to each output channel: `[O]`.
    pub bias: Option<&'a Tensor>,
    /// Step between patches.
    pub stride: usize,
    /// See [`Padding`].
    pub padding: Padding<1>,
    /// Spacing between kernel taps.
    pub dilation: usize,
    /// Channel groups.
    pub groups: usize,
}

impl Default for Conv1dOptions<'_> {
    fn default() -> Self {
        Conv1dOptions {
            bias: None,
            stride: 1,
            padding: Padding::default(),
            dilation: 1,
            groups: 1,
        }
    }
}

/// The sizes of one convolution, checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub batch: usize,
    pub channels: usize,
    pub input: [usize; 2],
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Zeros before each spatial dimension.
    pub pad_before: [usize; 2],
    pub groups: usize,
    pub output: [usize; 2],
}

impl Geometry {
    /// Input channels per group.
    pub fn group_channels(&self) -> usize {
        self.channels / self.groups
    }

    /// Output channels per group.
    pub fn group_out_channels(&self) -> usize {
        self.out_channels / self.groups
    }

    /// Rows of one group's unfolded input: `C/groups · kH · kW`.
    pub fn patch_len(&self) -> usize {
        self.group_channels() * self.kernel[0] * self.kernel[1]
    }

    /// Output pixels per image.
    pub fn pixels(&self) -> usize {
        self.output[0] * self.output[1]
    }

    /// The zeros after each spatial dimension, for a library that takes them (cuDNN, NNPACK):
    /// the fewest that give the output's size (PyTorch's `"same"` puts an odd total's extra
    /// zero there; explicit padding whose last zeros no patch reaches loses them).
    pub fn pad_after(&self) -> [usize; 2] {
        [0, 1].map(|d| {
            let extent = (self.kernel[d] - 1) * self.dilation[d] + 1;
            ((self.output[d] - 1) * self.stride[d] + extent)
                .saturating_sub(self.input[d] + self.pad_before[d])
        })
    }

    /// Whether the unfolded input is the input itself (1×1, unit stride, no padding).
    pub fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1] && self.stride == [1, 1] && self.pad_before == [0, 0]
    }

    /// Whether the CPU reads the input in place as shifted rows of padded phase planes of
    /// it (an implicit GEMM) instead of unfolding it: one group, not f64 (whose GEMM is the
    /// reference one), the columns computed past each output row
    /// ([`Geometry::extra_columns`]) no more than a fifth of the row's (3x3 kernels from 10
    /// columns on: on an AMD EPYC, 14x14 ran 3% faster than unfolded, 7x7 3% slower), and
    /// the planes no more than twice the unfolded input. A pointwise convolution's rows are
    /// the input's channel planes themselves, read so where B is at least as tall as A (no
    /// more output channels than input ones) and its rows at least 196 pixels long: there
    /// packing B cost the batched GEMM most (on an AMD EPYC Zen 4, `[1,256,56,56]` -> 64
    /// 0.85 -> 0.55 ms; with more output channels, or 7x7 planes, the packed GEMM was as
    /// fast or faster).
    pub fn reads_shifted_rows(&self, dtype: DType) -> bool {
        if self.groups != 1 || dtype == DType::F64 {
            return false;
        }
        if self.is_pointwise() {
            return self.out_channels <= self.channels && self.pixels() >= 196;
        }
        let unfolded = self.patch_len().saturating_mul(self.pixels());
        self.extra_columns() * 5 <= self.output[1]
            && self
                .phase_planes_len()
                .is_some_and(|len| len <= unfolded.saturating_mul(2))
    }

    /// The columns an implicit GEMM computes past each output row: the kernel's extent
    /// beyond one column, in steps of the stride.
    pub fn extra_columns(&self) -> usize {
        (self.kernel[1] - 1) * self.dilation[1] / self.stride[1]
    }

    /// The stride phases the taps of dimension `d` fall on (`tap · dilation mod stride`),
    /// each once, ascending: the phase planes an implicit GEMM makes along `d`.
    pub fn phases(&self, d: usize) -> Vec<usize> {
        let mut phases: Vec<usize> = (0..self.kernel[d])
            .map(|tap| tap * self.dilation[d] % self.stride[d])
            .collect();
        phases.sort_unstable();
        phases.dedup();
        phases
    }

    /// The phase planes' size, `[H_q, W_q]`: the output's, plus the kernel's extent beyond
    /// one row or column in steps of the stride; `None` where it overflows.
    pub fn phase_plane(&self) -> Option<[usize; 2]> {
        let rows = (self.kernel[0] - 1) * self.dilation[0] / self.stride[0];
        Some([
            self.output[0].checked_add(rows)?,
            self.output[1].checked_add(self.extra_columns())?,
        ])
    }

    /// Elements of one image's phase planes and the slack after them (the last plane's rows
    /// are read up to [`Geometry::extra_columns`] past its end); `None` where they overflow.
    pub fn phase_planes_len(&self) -> Option<usize> {
        let [hq, wq] = self.phase_plane()?;
        self.channels
            .checked_mul(self.phases(0).len() * self.phases(1).len())?
            .checked_mul(hq)?
            .checked_mul(wq)?
            .checked_add(self.extra_columns())
    }
}

fn shape_error(detail: String) -> Error {
    Error::ShapeMismatch { op: OP, detail }
}

fn geometry(input: &Tensor, weight: &Tensor, options: &Conv2dOptions) -> Result<Geometry> {
    let [batch, channels, height, width] = *input.shape() else {
        return Err(shape_error(format!(
            "expected a 3-D (unbatched) or 4-D (batched) input, but got input of size {:?}",
            input.shape()
        )));
    };
    let [out_channels, group_channels, kh, kw] = *weight.shape() else {
        return Err(shape_error(format!(
            "the weight must be 4-D [out_channels, in_channels / groups, kH, kW], got {:?}",
            weight.shape()
        )));
    };
    let Conv2dOptions {
        stride,
        dilation,
        groups,
        padding,
        ..
    } = *options;
    if groups == 0 || stride.contains(&0) || dilation.contains(&0) {
        return Err(Error::InvalidArgument {
            what: "conv2d options",
            why: format!(
                "groups ({groups}), stride ({stride:?}) and dilation ({dilation:?}) must be positive"
            ),
        });
    }
    if kh == 0 || kw == 0 {
        return Err(Error::InvalidArgument {
            what: "weight",
            why: format!(
                "kernel size should be greater than zero, but got kernel_height: {kh} \
                 kernel_width: {kw}"
            ),
        });
    }
    if out_channels == 0 {
        return Err(shape_error(format!(
            "Given groups={groups}, expected weight to be at least 1 at dimension 0, but got \
             weight of size {:?} instead",
            weight.shape()
        )));
    }
    if out_channels % groups != 0 || group_channels.checked_mul(groups) != Some(channels) {
        return Err(shape_error(format!(
            "Given groups={groups}, weight of size {:?}, expected input{:?} to have {} channels, \
             but got {channels} channels instead (and out_channels must divide by groups)",
            weight.shape(),
            input.shape(),
            group_channels.saturating_mul(groups)
        )));
    }
    let too_big = || shape_error("the kernel's extent overflows".into());
    let extent = |d: usize| -> Result<usize> {
        let k = [kh, kw][d];
        k.saturating_sub(1)
            .checked_mul(dilation[d])
            .and_then(|e| e.checked_add(1))
            .ok_or_else(too_big)
    };
    let extents = [extent(0)?, extent(1)?];
    let (pad_before, pad_after) = match padding {
        Padding::Explicit(p) => (p, p),
        Padding::Valid => ([0, 0], [0, 0]),
        Padding::Same => {
            if stride != [1, 1] {
                return Err(Error::InvalidArgument {
                    what: "padding",
                    why: "padding='same' is not supported for strided convolutions; give the \
                          padding explicitly"
                        .into(),
                });
            }
            let total = [extents[0] - 1, extents[1] - 1];
            let before = [total[0] / 2, total[1] / 2];
            (before, [total[0] - before[0], total[1] - before[1]])
        }
    };
    let input_size = [height, width];
    let mut padded = [0; 2];
    let mut output = [0; 2];
    for d in 0..2 {
        padded[d] = input_size[d]
            .checked_add(pad_before[d])
            .and_then(|s| s.checked_add(pad_after[d]))
            .ok_or_else(too_big)?;
        if padded[d] < extents[d] {
            return Err(shape_error(format!(
                "Calculated padded input size per channel: ({} x {}). Kernel size: ({} x {}). \
                 Kernel size can't be greater than actual input size",
                padded[0], padded[1], extents[0], extents[1]
            )));
        }
        output[d] = (padded[d] - extents[d]) / stride[d] + 1;
    }
    let geometry = Geometry {
        batch,
        channels,
        input: input_size,
        out_channels,
        kernel: [kh, kw],
        stride,
        dilation,
        pad_before,
        groups,
        output,
    };
    // Every size the lowering allocates fits the address space.
    let dtype = input.dtype();
    crate::core::tensor::checked_numel(OP, &[batch, out_channels, output[0], output[1]], dtype)?;
    crate::core::tensor::checked_numel(
        OP,
        &[geometry.patch_len(), geometry.pixels(), groups],
        dtype,
    )?;
    Ok(geometry)
}

fn check_operands(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    input.check_same_kind(OP, std::iter::once(weight).chain(bias))?;
    if !input.dtype().is_float() {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::F32,
            got: input.dtype(),
        });
    }
    device::check_dtype(input.device(), input.dtype())
}

/// How a convolution runs: what [`explain`] answers and the trace line shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvChoice {
    /// Where, and by what: `cpu`, or the device and `cudnn` or its `generated` kernels.
    pub backend: String,
    /// `direct depthwise` (CPU, one input channel per group), `gemm` (1×1 kernels, unit
    /// stride, no padding: the input is B as it stands; on the CPU with one group, its rows
    /// read in place where [`Geometry::reads_shifted_rows`] says so), `implicit gemm` (CPU,
    /// one group: B's rows read in place from padded phase planes of the input, see
    /// [`Geometry::reads_shifted_rows`]; CUDA's and wgpu's generated kernels: B's tiles read
    /// from the input as they are loaded), `im2col+gemm` (CPU), `nnpack` (CPU, NNPACK's
    /// convolution), or `cudnn graph` (cuDNN's engine).
    pub lowering: &'static str,
    /// How the GEMMs treat fp32 inputs, and which flag says so.
    pub precision: String,
    /// How cuDNN chooses its engine (on CUDA), or why the vendor libraries (NNPACK on the
    /// CPU, cuDNN on CUDA) did not run; on the CPU, whether NNPACK was asked at all.
    pub libraries: String,
}

/// The choice [`conv2d`] makes for these operands (checked as `conv2d` checks them),
/// without running it.
pub fn explain(input: &Tensor, weight: &Tensor, options: &Conv2dOptions) -> Result<ConvChoice> {
    Ok(plan(input, weight, options)?.choice)
}

/// A checked batched call and how it runs.
struct Plan {
    geometry: Geometry,
    choice: ConvChoice,
    lowering: Lowering,
}

/// How a convolution is computed: [`plan`] decides it once, and the backend that runs it
/// follows it ([`ConvChoice::lowering`] is its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lowering {
    /// The CPU's direct kernel for one input channel per group.
    DirectDepthwise,
    /// 1×1 kernels, unit stride, no padding: the input is B as it stands. `rows_in_place`:
    /// the CPU's implicit GEMM reads B's rows from the input ([`Geometry::reads_shifted_rows`])
    /// instead of `matmul` packing them.
    Gemm { rows_in_place: bool },
    /// B read from the input as the GEMM goes: the CPU's shifted rows of phase planes, or
    /// the generated kernels (CUDA, wgpu) loading B's tiles.
    ImplicitGemm,
    /// The input unfolded into B, then `matmul` (CPU).
    Im2colGemm,
    /// NNPACK's convolution (CPU).
    Nnpack,
    /// cuDNN's engine (CUDA).
    Cudnn,
}

impl Lowering {
    fn name(self) -> &'static str {
        match self {
            Lowering::DirectDepthwise => "direct depthwise",
            Lowering::Gemm { .. } => "gemm",
            Lowering::ImplicitGemm => "implicit gemm",
            Lowering::Im2colGemm => "im2col+gemm",
            Lowering::Nnpack => "nnpack",
            Lowering::Cudnn => "cudnn graph",
        }
    }
}

/// The checked geometry of a batched call and its choice.
fn plan(input: &Tensor, weight: &Tensor, options: &Conv2dOptions) -> Result<Plan> {
    check_operands(input, weight, options.bias)?;
    if input.shape().len() == 3 {
        return plan(&input.unsqueeze(0)?, weight, options);
    }
    let g = geometry(input, weight, options)?;
    if let Some(bias) = options.bias
        && bias.shape() != [g.out_channels]
    {
        return Err(shape_error(format!(
            "the bias must be [{}] (one per output channel), got {:?}",
            g.out_channels,
            bias.shape()
        )));
    }
    let (device, dtype) = (input.device(), input.dtype());
    let library_kernels = MKLDNN_ENABLED.get();
    let cpu = device == Device::Cpu;
    // On the CPU with mkldnn off: why NNPACK does not run, or None where it does.
    let nnpack = (cpu && !library_kernels).then(|| nnpack::refusal(&g, dtype));
    let own = cpu && library_kernels;
    let in_place = own && g.reads_shifted_rows(dtype);
    let lowering = if cudnn_serves(device) {
        Lowering::Cudnn
    } else if nnpack == Some(None) {
        Lowering::Nnpack
    } else if own && g.group_channels() == 1 && g.groups > 1 {
        Lowering::DirectDepthwise
    } else if g.is_pointwise() && (!cpu || g.groups == 1) {
        Lowering::Gemm {
            rows_in_place: in_place,
        }
    } else if in_place || !cpu {
        Lowering::ImplicitGemm
    } else {
        Lowering::Im2colGemm
    };
    let choice = ConvChoice {
        backend: match device {
            Device::Cpu => "cpu".into(),
            device if lowering == Lowering::Cudnn => format!("{device}/cudnn"),
            device => format!("{device}/generated"),
        },
        lowering: lowering.name(),
        precision: match (device, dtype) {
            _ if lowering == Lowering::Nnpack => "f32 in NNPACK's Fourier or Winograd tiles".into(),
            (Device::Cpu | Device::Wgpu(_), DType::F32) => {
                let mode = crate::core::precision::matmul::fp32_precision_effective();
                format!("{mode} (matmul's fp32_precision)")
            }
            (Device::Cuda(_), DType::F32) => device::precision_note(device, input.dtype()),
            (_, dtype) => format!("{dtype} inputs, f32 accumulation"),
        },
        libraries: match (device, nnpack) {
            (Device::Cpu, None) => "nnpack not tried: mkldnn.enabled gives CPU convolutions to \
                                    the library's kernels"
                .into(),
            (Device::Cpu, Some(None)) => "nnpack, its algorithm chosen by the sizes".into(),
            (Device::Cpu, Some(Some(refusal))) => refusal.into(),
            (device, _) => cudnn_note(device),
        },
    };
    Ok(Plan {
        geometry: g,
        choice,
        lowering,
    })
}

/// `torch.nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)`:
/// `[N, C, H, W]` (or `[C, H, W]`) by `[O, C / groups, kH, kW]` gives `[N, O, H', W']` (or
/// `[O, H', W']`) in the input's dtype. [`explain`] tells how it runs.
pub fn conv2d(input: &Tensor, weight: &Tensor, options: &Conv2dOptions) -> Result<Tensor> {
    if input.shape().len() == 3 {
        check_operands(input, weight, options.bias)?;
        let batched = conv2d(&input.unsqueeze(0)?, weight, options)?;
        return batched.squeeze(0);
    }
    let Plan {
        geometry: g,
        choice,
        lowering,
    } = plan(input, weight, options)?;
    let device = input.device();
    let describe = || Call {
        kernel: "conv2d".into(),
        backend: match device {
            Device::Cpu => format!("cpu/{}", choice.lowering),
            _ => format!("{} {}", choice.backend, choice.lowering),
        },
        dtype: input.dtype(),
        shapes: format!(
            "{:?}x{:?},stride{:?},pad{:?},dilation{:?},groups{}",
            input.shape(),
            weight.shape(),
            g.stride,
            g.pad_before,
            g.dilation,
            g.groups
        ),
        precision: format!("{}, {}", choice.precision, choice.libraries),
    };
    trace::kernel(describe, || match (device, lowering) {
        (Device::Cpu, Lowering::Nnpack) => nnpack::conv2d(input, weight, options.bias, &g),
        (Device::Cpu, _) => cpu::conv2d(input, weight, options.bias, &g, lowering),
        #[cfg(feature = "cuda")]
        (Device::Cuda(ordinal), Lowering::Cudnn) => {
            cudnn::conv2d(ordinal, input, weight, options.bias, &g)
        }
        _ => device::conv2d(input, weight, options.bias, &g, lowering),
    })
}

/// Whether cuDNN convolves on `device`: a CUDA device of the driver (not the interpreter),
/// `cudnn.enabled` on and cuDNN 9 loadable, in a build with the `cuda` feature.
fn cudnn_serves(device: Device) -> bool {
    cfg!(feature = "cuda")
        && matches!(device, Device::Cuda(_))
        && !crate::runtime::cuda::is_interpreted()
        && crate::core::cudnn::enabled()
        && crate::runtime::cuda::cudnn_version().is_some_and(|v| v >= 90000)
}

/// How cuDNN's engine is chosen, or why cuDNN did not run, for the trace.
fn cudnn_note(device: Device) -> String {
    use crate::core::cudnn;
    match device {
        _ if cudnn_serves(device) => {
            let mut note = match (cudnn::benchmark(), cudnn::benchmark_limit()) {
                (false, _) => "cudnn engine: heuristics' first".to_string(),
                (true, 0) => "cudnn engine: fastest of all offered (benchmark)".into(),
                (true, n) => format!("cudnn engine: fastest of the first {n} (benchmark)"),
            };
            if crate::core::determinism::deterministic_required() {
                note.push_str(", deterministic only");
            }
            note
        }
        Device::Cuda(_) if !cudnn::enabled() => "cudnn off (cudnn.enabled)".into(),
        Device::Cuda(_) if crate::runtime::cuda::is_interpreted() => {
            "no cudnn on the PTX interpreter: generated kernels".into()
        }
        Device::Cuda(_) => "cudnn 9 not loadable: generated kernels".into(),
        _ => "no cudnn on wgpu".into(),
    }
}

/// `torch.nn.functional.conv1d`: `[N, C, L]` (or `[C, L]`) by `[O, C / groups, k]`, as
/// [`conv2d`] with a height of 1.
pub fn conv1d(input: &Tensor, weight: &Tensor, options: &Conv1dOptions) -> Result<Tensor> {
    let rank = input.shape().len();
    if !(rank == 2 || rank == 3) || weight.shape().len() != 3 {
        return Err(Error::ShapeMismatch {
            op: "conv1d",
            detail: format!(
                "expected a 2-D (unbatched) or 3-D (batched) input and a 3-D weight, got {:?} \
                 and {:?}",
                input.shape(),
                weight.shape()
            ),
        });
    }
    let padding = match options.padding {
        Padding::Explicit([p]) => Padding::Explicit([0, p]),
        Padding::Same => Padding::Same,
        Padding::Valid => Padding::Valid,
    };
    let options2 = Conv2dOptions {
        bias: options.bias,
        stride: [1, options.stride],
        padding,
        dilation: [1, options.dilation],
        groups: options.groups,
    };
    let out = conv2d(
        &input.unsqueeze(rank - 1)?,
        &weight.unsqueeze(2)?,
        &options2,
    )?;
    out.squeeze(rank - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-group convolution of `[1, c, hw, hw]` by `o` kernels of `k x k`, stride 1,
    /// padding `k / 2`.
    fn square(c: usize, hw: usize, o: usize, k: usize) -> Geometry {
        Geometry {
            batch: 1,
            channels: c,
            input: [hw, hw],
            out_channels: o,
            kernel: [k, k],
            stride: [1, 1],
            dilation: [1, 1],
            pad_before: [k / 2, k / 2],
            groups: 1,
            output: [hw, hw],
        }
    }

    #[test]
    fn pointwise_rows_are_read_in_place_where_b_is_tall_and_long() {
        let read = |g: Geometry, dtype| g.reads_shifted_rows(dtype);
        assert!(read(square(256, 56, 64, 1), DType::F32));
        assert!(read(square(1024, 14, 256, 1), DType::Bf16));
        assert!(read(square(64, 14, 64, 1), DType::F16));
        // More output channels than input ones, short rows, f64, groups: packed instead.
        assert!(!read(square(64, 56, 256, 1), DType::F32));
        assert!(!read(square(2048, 7, 512, 1), DType::F32));
        assert!(!read(square(256, 56, 64, 1), DType::F64));
        let grouped = Geometry {
            groups: 2,
            ..square(256, 56, 64, 1)
        };
        assert!(!read(grouped, DType::F32));
        // (3x3 kernels take the planes from 10 columns on.)
        assert!(read(square(64, 56, 64, 3), DType::F32));
        assert!(!read(square(64, 7, 64, 3), DType::F32));
    }
}
