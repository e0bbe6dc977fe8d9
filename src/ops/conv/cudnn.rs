//! cuDNN's convolution (CUDA tensors while `cudnn.enabled` is on) through cuDNN's backend
//! graph API (`runtime/cuda/cudnn.rs`): one forward-convolution operation over the
//! contiguous input and weight, accumulated in f32, whose engine cuDNN's heuristics pick
//! (or, under `cudnn.benchmark`, the fastest of the first `benchmark_limit` it offers, timed
//! on the call's tensors). The engines passed over follow PyTorch's rules: for f32 inputs,
//! those that convert the inputs to a narrower type, and those on tensor cores (TF32) while
//! `cudnn.allow_tf32` is off; under `cudnn.deterministic` (or
//! `use_deterministic_algorithms`), the non-deterministic ones. The bias is added by the
//! generated bias kernel after the convolution.

use std::ffi::c_void;

use cudarc::driver::DevicePtr;

use super::Geometry;
use crate::core::tensor::{Storage, Tensor};
use crate::runtime::cuda::cudnn::{
    self, ConvolutionDims, Data, Graph, GraphCall, Kind, Note, alignment, contiguous,
};
use crate::runtime::cuda::device::CudaDevice;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::{DType, Error, Result};

/// The unique ids the call binds pointers to; virtual tensors count up from `VIRTUAL`.
mod uid {
    pub const X: i64 = 1;
    pub const W: i64 = 2;
    pub const Y: i64 = 3;
    pub const VIRTUAL: i64 = 100;
}

/// Everything a convolution plan is built for: the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ConvolutionSpec {
    dtype: DType,
    /// `[N, C, H, W]`, `[O, C / groups, kH, kW]` and `[N, O, H', W']`, all contiguous.
    input: [i64; 4],
    weight: [i64; 4],
    output: [i64; 4],
    dims: ConvolutionDims,
    /// Input, weight and output pointer alignments in bytes (at most 16).
    align: [i64; 3],
    /// The numerical notes whose engines are passed over.
    excluded: Vec<Note>,
}

fn io_type(dtype: DType) -> Result<Data> {
    match dtype {
        DType::F32 => Ok(Data::CUDNN_DATA_FLOAT),
        DType::F16 => Ok(Data::CUDNN_DATA_HALF),
        DType::Bf16 => Ok(Data::CUDNN_DATA_BFLOAT16),
        got => Err(Error::DTypeMismatch {
            op: "conv2d through cuDNN (f32, f16, bf16)",
            expected: DType::F32,
            got,
        }),
    }
}

/// The convolution of `spec` as one cuDNN operation, every descriptor finalized.
fn convolution_graph(spec: &ConvolutionSpec) -> Result<Graph> {
    let io = io_type(spec.dtype)?;
    let mut g = Graph::new(uid::VIRTUAL);
    let [xa, wa, ya] = spec.align;
    let x = g.tensor(
        io,
        spec.input,
        contiguous(spec.input),
        Kind::Device(uid::X),
        xa,
    )?;
    let w = g.tensor(
        io,
        spec.weight,
        contiguous(spec.weight),
        Kind::Device(uid::W),
        wa,
    )?;
    let y = g.tensor(
        io,
        spec.output,
        contiguous(spec.output),
        Kind::Device(uid::Y),
        ya,
    )?;
    g.convolution(x, w, y, &spec.dims)?;
    Ok(g)
}

/// The engines' numerical notes a convolution of `dtype` passes over under the current flags.
pub(super) fn excluded_notes(dtype: DType) -> Vec<Note> {
    let mut notes = Vec::new();
    if dtype == DType::F32 {
        notes.push(Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
        if !crate::core::cudnn::allow_tf32() {
            notes.push(Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
        }
    }
    if crate::core::determinism::deterministic_required() {
        notes.push(Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
    }
    notes
}

/// The stride, dilation and paddings of `g` as cuDNN takes them.
fn dims(g: &Geometry) -> ConvolutionDims {
    let long = |v: [usize; 2]| v.map(|x| x as i64);
    ConvolutionDims {
        stride: long(g.stride),
        dilation: long(g.dilation),
        pad_before: long(g.pad_before),
        pad_after: long(g.pad_after()),
    }
}

/// `conv2d` of the CUDA tensors `input` and `weight` through cuDNN, with the bias added by
/// the generated kernel.
pub(super) fn conv2d(
    ordinal: usize,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
) -> Result<Tensor> {
    let dtype = input.dtype();
    let (x, w) = (input.contiguous()?, weight.contiguous()?);
    let out_shape = [g.batch, g.out_channels, g.output[0], g.output[1]];
    let count: usize = out_shape.iter().product();
    let out = CudaBuffer::zeroed(ordinal, count * dtype.size())?;
    if count > 0 && g.channels > 0 {
        execute(ordinal, &x, &w, &out, g)?;
    }
    let result = Tensor::from_storage(
        Storage::Device(Box::new(out)),
        dtype,
        input.device(),
        &out_shape,
    );
    if let Some(bias) = bias {
        super::device::add_bias(&result, &bias.contiguous()?, g.out_channels, g.pixels())?;
    }
    Ok(result)
}

/// Binds the contiguous `x` and `w` and `out` to the plan for their shapes and runs it on the
/// device's stream.
fn execute(ordinal: usize, x: &Tensor, w: &Tensor, out: &CudaBuffer, g: &Geometry) -> Result<()> {
    let size = x.dtype().size();
    let stream = CudaDevice::get(ordinal)?.stream()?;
    let [x_view, w_view] = [x, w].map(|t| {
        t.cuda_buffer()
            .expect("a CUDA tensor has a buffer")
            .driver_view(t.offset() * size)
    });
    let (x_view, w_view, y_view) = (x_view?, w_view?, out.driver_view(0)?);
    let (x_ptr, _x_sync) = x_view.device_ptr(&stream);
    let (w_ptr, _w_sync) = w_view.device_ptr(&stream);
    let (y_ptr, _y_sync) = y_view.device_ptr(&stream);
    let long = |v: [usize; 4]| v.map(|d| d as i64);
    let spec = ConvolutionSpec {
        dtype: x.dtype(),
        input: long([g.batch, g.channels, g.input[0], g.input[1]]),
        weight: long([g.out_channels, g.group_channels(), g.kernel[0], g.kernel[1]]),
        output: long([g.batch, g.out_channels, g.output[0], g.output[1]]),
        dims: dims(g),
        align: [x_ptr, w_ptr, y_ptr].map(alignment),
        excluded: excluded_notes(x.dtype()),
    };
    let call = GraphCall {
        key: format!("{spec:?}"),
        build: &|| convolution_graph(&spec),
        excluded: &spec.excluded,
        what: "cuDNN convolution for this call",
        off_switch: "turn cuDNN off with cudnn::flags(enabled = false) so that the generated \
                     kernels convolve",
    };
    let pointer = |p: u64| p as *mut c_void;
    let (ids, pointers) = (
        [uid::X, uid::W, uid::Y],
        [pointer(x_ptr), pointer(w_ptr), pointer(y_ptr)],
    );
    // SAFETY: the three device buffers are held by the caller until the call returns; the
    // key holds the shapes, alignments, type and excluded notes the graph is built from.
    unsafe { cudnn::run(ordinal, &call, &ids, &pointers) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::{Conv2dOptions, Padding};

    fn geometry(options: &Conv2dOptions, input: [usize; 4], weight: [usize; 4]) -> Geometry {
        let x = Tensor::from_f64(
            &vec![0.5; input.iter().product()],
            &input,
            DType::F32,
            crate::Device::Cpu,
        )
        .unwrap();
        let w = Tensor::from_f64(
            &vec![0.5; weight.iter().product()],
            &weight,
            DType::F32,
            crate::Device::Cpu,
        )
        .unwrap();
        super::super::geometry(&x, &w, options).unwrap()
    }

    /// cuDNN's output size from the paddings matches the geometry's, for `"same"` with an
    /// odd and an even kernel, explicit padding with a stride that drops a remainder, and
    /// dilation.
    #[test]
    fn paddings_give_the_geometry_output() {
        let cases = [
            (Padding::Same, [1, 1], [1, 1], [3, 4]),
            (Padding::Explicit([2, 1]), [3, 2], [1, 1], [3, 3]),
            (Padding::Valid, [1, 2], [2, 3], [2, 2]),
        ];
        for (padding, stride, dilation, kernel) in cases {
            let options = Conv2dOptions {
                padding,
                stride,
                dilation,
                ..Default::default()
            };
            let g = geometry(&options, [1, 2, 11, 12], [3, 2, kernel[0], kernel[1]]);
            let d = dims(&g);
            for (axis, k) in kernel.into_iter().enumerate() {
                let padded = g.input[axis] as i64 + d.pad_before[axis] + d.pad_after[axis];
                let extent = (k as i64 - 1) * d.dilation[axis] + 1;
                let out = (padded - extent) / d.stride[axis] + 1;
                assert_eq!(out as usize, g.output[axis], "{padding:?} axis {axis}");
            }
        }
    }

    /// Every descriptor of the convolution graph finalizes (cuDNN checks the output shape
    /// against the input, weight and paddings; no GPU is needed before a handle), for each
    /// type, grouped and strided; an f64 input is refused.
    #[test]
    fn every_descriptor_of_the_convolution_graph_finalizes() {
        if !cudnn::present() {
            eprintln!("skipped: libcudnn.so.9 is not loadable here");
            return;
        }
        let options = Conv2dOptions {
            padding: Padding::Explicit([1, 0]),
            stride: [2, 1],
            groups: 2,
            ..Default::default()
        };
        let g = geometry(&options, [2, 4, 9, 7], [6, 2, 3, 3]);
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let spec = ConvolutionSpec {
                dtype,
                input: [2, 4, 9, 7],
                weight: [6, 2, 3, 3],
                output: [2, 6, g.output[0] as i64, g.output[1] as i64],
                dims: dims(&g),
                align: [16, 16, 8],
                excluded: excluded_notes(dtype),
            };
            let graph = convolution_graph(&spec).unwrap_or_else(|e| panic!("{dtype}: {e}"));
            assert_eq!(graph.ops().len(), 1);
            // An output size the paddings do not give is refused by cuDNN itself.
            let wrong = ConvolutionSpec {
                output: [2, 6, g.output[0] as i64 + 1, g.output[1] as i64],
                ..spec
            };
            assert!(convolution_graph(&wrong).is_err(), "{dtype}");
        }
        let spec = ConvolutionSpec {
            dtype: DType::F64,
            input: [1, 1, 3, 3],
            weight: [1, 1, 3, 3],
            output: [1, 1, 1, 1],
            dims: ConvolutionDims {
                stride: [1, 1],
                dilation: [1, 1],
                pad_before: [0, 0],
                pad_after: [0, 0],
            },
            align: [16; 3],
            excluded: Vec::new(),
        };
        assert!(matches!(
            convolution_graph(&spec),
            Err(Error::DTypeMismatch { .. })
        ));
    }

    #[test]
    fn engines_passed_over_follow_the_flags() {
        let _flags = crate::core::cudnn::flags_scoped(crate::core::cudnn::Flags {
            allow_tf32: Some(false),
            deterministic: Some(true),
            ..Default::default()
        });
        let f32_notes = excluded_notes(DType::F32);
        for note in [
            Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
            Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
            Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
        ] {
            assert!(f32_notes.contains(&note), "{note:?}");
        }
        // Half types run on tensor cores whatever allow_tf32 says.
        assert_eq!(
            excluded_notes(DType::Bf16),
            [Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC]
        );
        let _tf32 = crate::core::cudnn::flags_scoped(crate::core::cudnn::Flags {
            allow_tf32: Some(true),
            deterministic: Some(false),
            ..Default::default()
        });
        if !crate::core::determinism::deterministic_required() {
            assert_eq!(
                excluded_notes(DType::F32),
                [Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS]
            );
        }
    }
}
