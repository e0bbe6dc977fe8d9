//! The math reference on the CPU: scores, mask, softmax, dropout and the weighted sum,
//! row by row in f64 or f32 (any mask, dropout, GQA).

use super::{Job, OP_CPU, broadcast_strides, host_f64, keep};
use crate::core::generator::Draw;
use crate::core::tensor::host_zeros;
use crate::{DType, Device, Result, Tensor};
use half::{bf16, f16};

/// The mask as additive values with broadcast strides over `[B, H, Lq, Lk]`.
pub(crate) struct Bias {
    pub(crate) values: Vec<f64>,
    pub(crate) strides: [usize; 4],
}

impl Bias {
    pub(crate) fn of(mask: Option<&Tensor>) -> Result<Option<Bias>> {
        let Some(mask) = mask else { return Ok(None) };
        let values = host_f64(mask)?;
        let strides = broadcast_strides(
            mask.shape(),
            &crate::core::tensor::contiguous_strides(mask.shape()),
        );
        Ok(Some(Bias { values, strides }))
    }

    pub(crate) fn at(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        let s = self.strides;
        self.values[b * s[0] + h * s[1] + i * s[2] + j * s[3]]
    }
}

/// The math reference: scores, mask, softmax, dropout, weighted sum; in f64 for f64
/// inputs, else in f32 (intermediates rounded to the 16-bit input type when
/// `allow_fp16_bf16_reduction_math_sdp` is on).
pub(super) fn cpu_math(job: &Job) -> Result<Tensor> {
    let Job {
        query: q,
        key: k,
        value: v,
        options: o,
        shape: ref s,
        scale,
        ref out_shape,
        ..
    } = *job;
    let (qv, kv, vv) = (host_f64(q)?, host_f64(k)?, host_f64(v)?);
    let bias = Bias::of(o.attn_mask)?;
    let band = job.band(0);
    let dtype = q.dtype();
    let reduce16 = matches!(dtype, DType::F16 | DType::Bf16)
        && crate::ops::sdpa::flags::fp16_bf16_reduction_math_sdp_allowed();
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
                    if band.is_some_and(|band| !band.keys(i, s.lk).contains(&j)) {
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
