//! Convolution cases shared by the CPU, wgpu and CUDA tests: a direct float64 convolution
//! and the cases that cover every padding mode, stride, dilation and group layout.

use backends::conv::{Conv2dOptions, Padding};
use backends::{DType, Device, Tensor, conv2d};

use super::{random, rel_err};

/// One convolution's sizes and options.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub n: usize,
    pub c: usize,
    pub hw: [usize; 2],
    pub o: usize,
    pub k: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding<2>,
    pub dilation: [usize; 2],
    pub groups: usize,
    pub bias: bool,
}

pub const BASE: Case = Case {
    n: 2,
    c: 3,
    hw: [9, 7],
    o: 4,
    k: [3, 3],
    stride: [1, 1],
    padding: Padding::Explicit([0, 0]),
    dilation: [1, 1],
    groups: 1,
    bias: true,
};

/// Padding before and after each dimension, as PyTorch resolves `same` / `valid`.
pub fn pads(case: &Case) -> ([usize; 2], [usize; 2]) {
    match case.padding {
        Padding::Explicit(p) => (p, p),
        Padding::Valid => ([0, 0], [0, 0]),
        Padding::Same => {
            let total = [0, 1].map(|d| case.dilation[d] * (case.k[d] - 1));
            let before = [total[0] / 2, total[1] / 2];
            (before, [total[0] - before[0], total[1] - before[1]])
        }
    }
}

/// The direct float64 convolution and its output shape.
pub fn reference(case: &Case, x: &[f64], w: &[f64], b: &[f64]) -> (Vec<f64>, [usize; 4]) {
    let (before, after) = pads(case);
    let out: [usize; 2] = [0, 1].map(|d| {
        (case.hw[d] + before[d] + after[d] - case.dilation[d] * (case.k[d] - 1) - 1)
            / case.stride[d]
            + 1
    });
    let (cg, og) = (case.c / case.groups, case.o / case.groups);
    let [h, wd] = case.hw;
    let mut y = Vec::new();
    for n in 0..case.n {
        for o in 0..case.o {
            let group = o / og;
            for oy in 0..out[0] {
                for ox in 0..out[1] {
                    let mut sum = if case.bias { b[o] } else { 0.0 };
                    for c in 0..cg {
                        for ki in 0..case.k[0] {
                            for kj in 0..case.k[1] {
                                let iy = (oy * case.stride[0] + ki * case.dilation[0]) as isize
                                    - before[0] as isize;
                                let ix = (ox * case.stride[1] + kj * case.dilation[1]) as isize
                                    - before[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let ci = group * cg + c;
                                let xv =
                                    x[((n * case.c + ci) * h + iy as usize) * wd + ix as usize];
                                let wv = w[((o * cg + c) * case.k[0] + ki) * case.k[1] + kj];
                                sum += xv * wv;
                            }
                        }
                    }
                    y.push(sum);
                }
            }
        }
    }
    (y, [case.n, case.o, out[0], out[1]])
}

pub fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64(values, shape, dtype, Device::Cpu).unwrap()
}

pub fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-13,
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// Runs `case` in `dtype` and returns (relative error against the reference, shape).
pub fn check(case: &Case, dtype: DType) -> f64 {
    check_on(case, dtype, Device::Cpu)
}

/// [`check`] with the operands on `device`.
pub fn check_on(case: &Case, dtype: DType, device: Device) -> f64 {
    let tensor = |values: &[f64], shape: &[usize], dtype| {
        Tensor::from_f64(values, shape, dtype, device).unwrap()
    };
    let x = random(case.n * case.c * case.hw[0] * case.hw[1]);
    let w = random(case.o * (case.c / case.groups) * case.k[0] * case.k[1]);
    let b = random(case.o);
    let (want, shape) = reference(case, &x, &w, &b);
    let bias = tensor(&b, &[case.o], dtype);
    let options = Conv2dOptions {
        bias: case.bias.then_some(&bias),
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    };
    let out = conv2d(
        &tensor(&x, &[case.n, case.c, case.hw[0], case.hw[1]], dtype),
        &tensor(
            &w,
            &[case.o, case.c / case.groups, case.k[0], case.k[1]],
            dtype,
        ),
        &options,
    )
    .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    assert_eq!(out.shape(), shape, "{case:?}");
    assert_eq!((out.dtype(), out.device()), (dtype, device));
    if want.is_empty() {
        return 0.0;
    }
    rel_err(&out.to_f64().unwrap(), &want)
}

pub fn cases() -> Vec<Case> {
    vec![
        BASE,
        Case {
            padding: Padding::Explicit([1, 2]),
            ..BASE
        },
        Case {
            padding: Padding::Same,
            ..BASE
        },
        Case {
            padding: Padding::Same,
            k: [4, 2],
            dilation: [2, 3],
            hw: [11, 13],
            ..BASE
        },
        Case {
            padding: Padding::Valid,
            k: [2, 5],
            ..BASE
        },
        Case {
            stride: [2, 3],
            padding: Padding::Explicit([1, 1]),
            hw: [10, 11],
            ..BASE
        },
        Case {
            dilation: [2, 2],
            hw: [12, 9],
            ..BASE
        },
        Case {
            groups: 3,
            c: 6,
            o: 9,
            padding: Padding::Explicit([1, 0]),
            ..BASE
        },
        // Depthwise: one filter per channel (times a multiplier of 2).
        Case {
            groups: 5,
            c: 5,
            o: 10,
            padding: Padding::Same,
            bias: false,
            ..BASE
        },
        Case {
            groups: 4,
            c: 4,
            o: 4,
            stride: [2, 3],
            dilation: [2, 1],
            padding: Padding::Explicit([2, 1]),
            hw: [12, 11],
            ..BASE
        },
        // Pointwise: 1x1, read as it stands; and 1x1 strided (unfolded).
        Case {
            k: [1, 1],
            c: 17,
            o: 5,
            ..BASE
        },
        Case {
            k: [1, 1],
            stride: [2, 2],
            ..BASE
        },
        // Taps that read nothing but padding (dilated past a narrow input), dense and
        // depthwise.
        Case {
            hw: [2, 1],
            k: [3, 3],
            dilation: [3, 3],
            padding: Padding::Explicit([4, 4]),
            ..BASE
        },
        Case {
            hw: [1, 2],
            k: [3, 3],
            dilation: [3, 3],
            stride: [2, 1],
            padding: Padding::Explicit([4, 4]),
            groups: 3,
            o: 3,
            ..BASE
        },
        // A kernel as large as the input; a 1-pixel input with padding.
        Case {
            k: [9, 7],
            bias: false,
            ..BASE
        },
        Case {
            hw: [1, 1],
            padding: Padding::Explicit([1, 1]),
            ..BASE
        },
        // A larger case: tiles and threads.
        Case {
            n: 3,
            c: 16,
            hw: [23, 19],
            o: 24,
            stride: [2, 1],
            padding: Padding::Explicit([1, 1]),
            ..BASE
        },
    ]
}
