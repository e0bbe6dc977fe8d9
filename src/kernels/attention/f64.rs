//! Attention in f64, one query row at a time with an online softmax, as PyTorch's CPU
//! flash kernel computes f64 inputs.

/// The keys one query row attends to: `count` keys of the key and value rows (`keys` and
/// `values` hold `count` rows each, row-major), and the mask's additive term for key `j`.
pub(crate) struct RowKeys<'a> {
    pub(crate) count: usize,
    pub(crate) keys: &'a [f64],
    pub(crate) values: &'a [f64],
    pub(crate) bias: &'a dyn Fn(usize) -> f64,
}

/// `softmax(query · keysᵀ · scale + bias) · values` into `out` (zeroed, the value width);
/// returns the row's log-sum-exp. A row that sees no key gives zeros and -inf, a NaN row
/// NaN and NaN, as the other fused kernels.
pub(crate) fn attend_row_f64(query: &[f64], row: RowKeys, scale: f64, out: &mut [f64]) -> f64 {
    let (d, dv) = (query.len(), out.len());
    let (mut max, mut sum) = (f64::NEG_INFINITY, 0.0);
    for j in 0..row.count {
        let key = &row.keys[j * d..][..d];
        let x = query.iter().zip(key).map(|(a, c)| a * c).sum::<f64>() * scale + (row.bias)(j);
        if x == f64::NEG_INFINITY {
            continue;
        }
        if x > max {
            let alpha = (max - x).exp();
            sum *= alpha;
            out.iter_mut().for_each(|a| *a *= alpha);
            max = x;
        }
        let p = (x - max).exp();
        sum += p;
        for (a, &y) in out.iter_mut().zip(&row.values[j * dv..][..dv]) {
            *a += p * y;
        }
    }
    let (inv, lse) = if sum == 0.0 {
        (0.0, f64::NEG_INFINITY)
    } else {
        (1.0 / sum, max + sum.ln())
    };
    out.iter_mut().for_each(|a| *a *= inv);
    lse
}
