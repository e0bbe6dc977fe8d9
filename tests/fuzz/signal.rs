//! The fuzz cases of fft and conv2d.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;

/// How many results of each CPU lowering ([`backends::conv::ConvChoice::lowering`]) the
/// conv2d case compared with the reference.
pub(super) static CONV_LOWERINGS: Mutex<BTreeMap<&'static str, usize>> =
    Mutex::new(BTreeMap::new());

pub(super) fn fft_case(rng: &mut Rng) -> Result<(), String> {
    let rank = 1 + rng.below(3);
    let mut shape: Vec<usize> = (0..rank).map(|_| rng.dim(9)).collect();
    let complex = rng.chance(70);
    if complex {
        shape.push(if rng.chance(90) { 2 } else { 3 });
    }
    let dt = [DType::F32, DType::F64, DType::Bool][rng.below(3)];
    let Some((x, xv)) = tensor(rng, &shape, dt) else {
        return Ok(());
    };
    let x = laid_out(rng, x, &xv)?;
    let which = rng.below(8);
    let irfft_n = rng.chance(50).then(|| rng.below(10));
    // The arguments of fft_with / ifft_with (6, 7): a dimension of the complex tensor
    // (sometimes out of range), a size (trimming or padding), a normalisation.
    let logical = shape.len().saturating_sub(1) as isize;
    let dim = rng.below(2 * logical as usize + 2) as isize - logical - 1;
    let args = fft::FftArgs::along(
        rng.chance(50).then(|| rng.below(9)),
        dim,
        [fft::Norm::Backward, fft::Norm::Ortho, fft::Norm::Forward][rng.below(3)],
    );
    let result = match which {
        0 => fft::fft(&x),
        1 => fft::ifft(&x),
        2 => fft::fft2(&x),
        3 => fft::ifft2(&x),
        4 => fft::rfft(&x),
        5 => fft::irfft(&x, irfft_n),
        6 => fft::fft_with(&x, &args),
        _ => fft::ifft_with(&x, &args),
    };
    let Some(out) = typed(result) else {
        return Ok(());
    };
    if dt == DType::Bool {
        return Err(format!("transform {which} of a bool tensor gave a result"));
    }
    // The reference: direct DFT sums in f64 over the same dimensions.
    let pairs = |v: &[f64]| -> Vec<(f64, f64)> { v.chunks(2).map(|p| (p[0], p[1])).collect() };
    let flat = |v: &[(f64, f64)]| -> Vec<f64> { v.iter().flat_map(|&(r, i)| [r, i]).collect() };
    let (want, out_shape) = match which {
        0..=3 => {
            let dims = shape[..shape.len() - 1].to_vec();
            let mut v = pairs(&xv);
            let inverse = which % 2 == 1;
            for axis in (dims.len() - 1 - (which / 2)..dims.len()).rev() {
                v = direct_dft(&v, &dims, axis, inverse);
            }
            (flat(&v), shape.clone())
        }
        6 | 7 => {
            let mut dims = shape[..shape.len() - 1].to_vec();
            let axis = (dim + if dim < 0 { logical } else { 0 }) as usize;
            let n = args.s.as_ref().map_or(dims[axis], |s| s[0]);
            // Each line along the axis trimmed or zero-padded to n, transformed directly.
            let (outer, inner) = (
                dims[..axis].iter().product::<usize>(),
                dims[axis + 1..].iter().product::<usize>(),
            );
            let v = pairs(&xv);
            let resized: Vec<(f64, f64)> = (0..outer * n * inner)
                .map(|e| {
                    let (o, j, i) = (e / (n * inner), e / inner % n, e % inner);
                    if j < dims[axis] {
                        v[(o * dims[axis] + j) * inner + i]
                    } else {
                        (0.0, 0.0)
                    }
                })
                .collect();
            dims[axis] = n;
            let inverse = which == 7;
            // direct_dft divides inverses by n ("backward"); the others rescale.
            let factor = match (args.norm, inverse) {
                (fft::Norm::Backward, _) => 1.0,
                (fft::Norm::Ortho, false) => 1.0 / (n as f64).sqrt(),
                (fft::Norm::Ortho, true) => (n as f64).sqrt(),
                (fft::Norm::Forward, false) => 1.0 / n as f64,
                (fft::Norm::Forward, true) => n as f64,
            };
            // (No signal at all where another dimension is 0.)
            let v = if resized.is_empty() {
                resized
            } else {
                direct_dft(&resized, &dims, axis, inverse)
            };
            let scaled: Vec<(f64, f64)> =
                v.iter().map(|&(r, i)| (r * factor, i * factor)).collect();
            dims.push(2);
            (flat(&scaled), dims)
        }
        4 => {
            let n = shape[shape.len() - 1];
            let v: Vec<(f64, f64)> = xv.iter().map(|&r| (r, 0.0)).collect();
            let v = direct_dft(&v, &shape, shape.len() - 1, false);
            let kept: Vec<(f64, f64)> = v
                .chunks(n)
                .flat_map(|line| line[..n / 2 + 1].to_vec())
                .collect();
            let mut out_shape = shape.clone();
            *out_shape.last_mut().unwrap() = n / 2 + 1;
            out_shape.push(2);
            (flat(&kept), out_shape)
        }
        _ => {
            let m = shape[shape.len() - 2];
            let n = irfft_n.unwrap_or(2 * (m - 1));
            // The Hermitian spectrum of length n from the first m coefficients (0 past them),
            // the imaginary parts of X[0] and X[n/2] dropped.
            let mut full = Vec::new();
            for half in pairs(&xv).chunks(m) {
                for k in 0..n {
                    let (j, mirrored) = if k <= n / 2 {
                        (k, false)
                    } else {
                        (n - k, true)
                    };
                    let (re, im) = half.get(j).copied().unwrap_or_default();
                    let im = if j == 0 || 2 * j == n { 0.0 } else { im };
                    full.push((re, if mirrored { -im } else { im }));
                }
            }
            let mut out_shape = shape[..shape.len() - 1].to_vec();
            *out_shape.last_mut().unwrap() = n;
            let v = direct_dft(&full, &out_shape, out_shape.len() - 1, true);
            (v.iter().map(|c| c.0).collect(), out_shape)
        }
    };
    if out.shape() != out_shape.as_slice() {
        return Err(format!(
            "transform {which} of {shape:?}: shape {:?}, want {out_shape:?}",
            out.shape()
        ));
    }
    let got = out.to_f64().map_err(|e| e.to_string())?;
    compared();
    if rel_err(&got, &want) > bound(dt).max(1e-5) {
        return Err(format!(
            "transform {which} of {shape:?} (n {irfft_n:?}, {args:?}): {}",
            rel_err(&got, &want)
        ));
    }
    Ok(())
}

/// The DFT (inverse: divided by the length) of complex `v` of `shape` along `axis`, by
/// direct sums.
fn direct_dft(v: &[(f64, f64)], shape: &[usize], axis: usize, inverse: bool) -> Vec<(f64, f64)> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut out = vec![(0.0, 0.0); v.len()];
    for (block, out) in v.chunks(n * inner).zip(out.chunks_mut(n * inner)) {
        for i in 0..inner {
            for f in 0..n {
                let (mut re, mut im) = (0.0, 0.0);
                for t in 0..n {
                    let angle = sign * 2.0 * std::f64::consts::PI * ((f * t) % n) as f64 / n as f64;
                    let (a, b) = block[t * inner + i];
                    re += a * angle.cos() - b * angle.sin();
                    im += a * angle.sin() + b * angle.cos();
                }
                let scale = if inverse { n as f64 } else { 1.0 };
                out[f * inner + i] = (re / scale, im / scale);
            }
        }
    }
    out
}

pub(super) fn conv_case(rng: &mut Rng) -> Result<(), String> {
    use backends::conv::{Conv2dOptions, Padding};
    use common::conv::{Case as ConvCase, reference};
    // Wide, low images (8 to 64 columns) with valid options reach the CPU's implicit GEMM
    // (the columns it computes past each output row at most a fifth of the row's) and its
    // in-place pointwise GEMM (196 output pixels or more); the others are small in every
    // dimension, with any option.
    let wide = rng.chance(40);
    let groups = if wide {
        [1, 1, 1, 2][rng.below(4)]
    } else {
        [1, 1, 2, 3, 0][rng.below(5)]
    };
    let per_group = if wide {
        [1 + rng.below(3), 1 + rng.below(3)]
    } else {
        [rng.dim(3), rng.dim(3)]
    };
    let (c, o) = (
        per_group[0].saturating_mul(groups.max(1)),
        per_group[1].saturating_mul(groups.max(1)),
    );
    let (n, hw, k) = if wide {
        let k = [1, 1, 2, 3, 5][rng.below(5)];
        (
            1 + rng.below(2),
            [1 + rng.below(6), 8 + rng.below(57)],
            [1 + rng.below(3), k],
        )
    } else {
        (
            rng.dim(2),
            [rng.dim(7), rng.dim(7)],
            [rng.dim(4), rng.dim(4)],
        )
    };
    let small = |rng: &mut Rng| match wide {
        true => [1, 1, 1, 2, 3][rng.below(5)],
        false => [0, 1, 1, 2, 3, 1 << 40][rng.below(6)],
    };
    let stride = [small(rng), small(rng)];
    let dilation = [small(rng), small(rng)];
    let padding = match rng.below(4) {
        0 => Padding::Same,
        1 => Padding::Valid,
        _ if wide => Padding::Explicit([rng.below(3), rng.below(3)]),
        _ => Padding::Explicit([small(rng).min(3), [0, 1, 2, usize::MAX / 2][rng.below(4)]]),
    };
    let dt = [
        DType::F32,
        DType::F64,
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::Bool,
    ][rng.below(6)];
    let weight_channels = if rng.chance(90) {
        per_group[0]
    } else {
        per_group[0].saturating_add(1)
    };
    let (Some((x, xh)), Some((w, wh)), Some((b, bh))) = (
        tensor(rng, &[n, c, hw[0], hw[1]], dt),
        tensor(rng, &[o, weight_channels, k[0], k[1]], dt),
        tensor(rng, &[o], dt),
    ) else {
        return Ok(());
    };
    let (x, w) = (laid_out(rng, x, &xh)?, laid_out(rng, w, &wh)?);
    let bias = rng.chance(50);
    // mkldnn.enabled off: every CPU convolution unfolded (NNPACK takes batches of 16 or more).
    let _mkldnn = rng
        .chance(25)
        .then(|| backends::mkldnn::flags_scoped(false));
    let options = Conv2dOptions {
        bias: bias.then_some(&b),
        stride,
        padding,
        dilation,
        groups,
    };
    // A valid call whose output would fill gigabytes (huge paddings) is not made: its
    // sizes are the same checked arithmetic as the small ones.
    let side = |d: usize| -> Option<usize> {
        let pad = match padding {
            Padding::Explicit(p) => p[d].checked_mul(2)?,
            _ => k[d].checked_sub(1)?.checked_mul(dilation[d])?,
        };
        hw[d]
            .checked_add(pad)?
            .checked_div(stride[d].max(1))?
            .checked_add(1)
    };
    if let (Some(out_h), Some(out_w)) = (side(0), side(1))
        && numel(&[n, o, out_h, out_w]).is_some_and(|count| count > 1 << 20)
    {
        return Ok(());
    }
    let Some(out) = typed(backends::conv2d(&x, &w, &options)) else {
        return Ok(());
    };
    let lowering = backends::conv::explain(&x, &w, &options)
        .map_err(|e| format!("explain refused what conv2d ran: {e}"))?
        .lowering;
    let case = ConvCase {
        n,
        c,
        hw,
        o,
        k,
        stride,
        padding,
        dilation,
        groups,
        bias,
    };
    // Huge paddings or strides give valid, large outputs (of the bias alone): the direct
    // reference is run on small ones only.
    if out.numel() > 4096 {
        return Ok(());
    }
    let (want, shape) = reference(&case, &xh, &wh, &bh);
    if out.shape() != shape {
        return Err(format!(
            "output {:?}, want {shape:?} for {case:?}",
            out.shape()
        ));
    }
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let (magnitude, _) = reference(&case, &abs(&xh), &abs(&wh), &abs(&bh));
    compared();
    if !close(&out.to_f64().unwrap(), &want, &magnitude, dt) {
        return Err(format!("{dt} {case:?} ({lowering}): wrong values"));
    }
    CONV_LOWERINGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(lowering)
        .and_modify(|count| *count += 1)
        .or_insert(1);
    Ok(())
}
