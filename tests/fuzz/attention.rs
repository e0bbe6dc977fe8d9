//! The fuzz cases of scaled_dot_product_attention, the serving calls and multi-head attention.

use super::*;

pub(super) fn sdpa_case(rng: &mut Rng) -> Result<(), String> {
    let (b, hk, lq, lk) = (rng.dim(2), rng.dim(2), rng.dim(5), rng.dim(5));
    let groups = if rng.chance(30) { 1 + rng.below(3) } else { 1 };
    let h = hk.saturating_mul(groups);
    let (d, dv) = (rng.dim(8), if rng.chance(20) { rng.dim(8) } else { 0 });
    let dv = if dv == 0 { d } else { dv };
    let dt = [DType::F32, DType::F64, DType::F16, DType::Bf16][rng.below(4)];
    let four = rng.chance(80);
    let lead = |x: usize| if four { vec![b, x] } else { vec![x] };
    let shapes = [
        [lead(h), vec![lq, d]].concat(),
        [lead(hk), vec![lk, d]].concat(),
        [lead(hk), vec![lk, dv]].concat(),
    ];
    let mut made = Vec::new();
    for s in &shapes {
        match tensor(rng, s, dt) {
            Some((t, values)) => made.push((laid_out(rng, t, &values)?, values)),
            None => return Ok(()),
        }
    }
    let small_mask = lq.checked_mul(lk).is_some_and(|n| n <= 4096);
    let (mask, bias): (Option<Tensor>, Option<Vec<f64>>) = match rng.below(4) {
        _ if !small_mask => (None, None),
        0 => {
            // Boolean, every row keeping its first key (no row fully masked here).
            let keep: Vec<bool> = (0..lq * lk)
                .map(|e| e % lk == 0 || rng.chance(60))
                .collect();
            let bias = keep
                .iter()
                .map(|&k| if k { 0.0 } else { f64::NEG_INFINITY })
                .collect();
            (
                Tensor::from_bools(&keep, &[lq, lk], Device::Cpu).ok(),
                Some(bias),
            )
        }
        1 => {
            let values = rng.values(lq * lk);
            let mdt = [DType::F32, DType::F64, dt][rng.below(3)];
            let t = Tensor::from_f64(&values, &[lq, lk], mdt, Device::Cpu).ok();
            let rounded = t.as_ref().map(|t| t.to_f64().unwrap());
            match (t, rounded) {
                (Some(t), Some(rounded)) => (Some(laid_out(rng, t, &rounded)?), Some(rounded)),
                _ => (None, None),
            }
        }
        _ => (None, None),
    };
    let causal = mask.is_none() && rng.chance(30);
    let window = if rng.chance(20) {
        let mut side = || rng.chance(70).then(|| rng.below(lk.max(2)));
        Window::new(side(), side())
    } else {
        Window::UNBOUNDED
    };
    let lower_right = (causal || window.is_bounded()) && rng.chance(50);
    let dropout = if rng.chance(10) {
        [0.3, 1.0, 1.5, -0.1][rng.below(4)]
    } else {
        0.0
    };
    let options = SdpaOptions {
        attn_mask: mask.as_ref(),
        dropout_p: dropout,
        is_causal: causal,
        causal_variant: if lower_right {
            CausalVariant::LowerRight
        } else {
            CausalVariant::UpperLeft
        },
        window,
        enable_gqa: groups > 1 || rng.chance(10),
        ..SdpaOptions::default()
    };
    let _only = rng.chance(20).then(|| {
        let all = [
            SdpBackend::Math,
            SdpBackend::Flash,
            SdpBackend::MemEfficient,
        ];
        sdpa_kernel_scoped(&all[..1 + rng.below(3)], rng.chance(50))
    });
    // As for matmul: no output larger than memory (q can be empty at head dim 0).
    if numel(&[b, h, lq, dv]).is_none_or(|n| n > 1 << 20) {
        return Ok(());
    }
    let Some(out) = typed(sdpa(&made[0].0, &made[1].0, &made[2].0, &options)) else {
        return Ok(());
    };
    if !(0.0..=1.0).contains(&dropout) {
        return Err(format!("dropout_p {dropout} was accepted"));
    }
    if dropout > 0.0 || d == 0 || lk == 0 {
        return Ok(()); // random, NaN by definition, or empty: the shape is all there is
    }
    let got = out.output.to_f64().map_err(|e| e.to_string())?;
    if got.is_empty() {
        return match numel(&[if four { b } else { 1 }, h, lq, dv]) {
            Some(0) => Ok(()),
            _ => Err(format!("{shapes:?} gave no elements")),
        };
    }
    // The output averages rows of v, which can cancel: the error is measured against the
    // same average of |v|.
    let reference = |v: &[f64]| {
        attention_reference(
            &made[0].1,
            &made[1].1,
            v,
            [if four { b } else { 1 }, h, hk, lq, lk, d, dv],
            1.0 / (d as f64).sqrt(),
            options.is_causal.then_some(options.causal_variant),
            &|_, _, i, j| {
                if window_hides(window, options.causal_variant, (lq, lk), i, j) {
                    return f64::NEG_INFINITY;
                }
                bias.as_ref().map_or(0.0, |m| m[i * lk + j])
            },
        )
    };
    let want = reference(&made[2].1);
    let magnitude = reference(&made[2].1.iter().map(|x| x.abs()).collect::<Vec<_>>());
    compared();
    if !close(&got, &want, &magnitude, dt) {
        return Err(format!(
            "{shapes:?} {dt} mask {:?} causal {causal} lower-right {lower_right} window {window}: \
             error {} on {}",
            mask.as_ref().map(|m| m.dtype()),
            rel_err(&got, &want),
            out.backend
        ));
    }
    Ok(())
}

/// Element (head, row, x) of one sequence's rows, as the serving reference reads them.
type Rows<'a> = Box<dyn Fn(usize, usize, usize) -> f64 + 'a>;

/// Rows packed along dimension 0 (`[rows, heads, d]`) from row `first`.
fn packed_rows(values: &[f64], first: usize, heads: usize, d: usize) -> Rows<'_> {
    Box::new(move |a, r, x| values[((first + r) * heads + a) * d + x])
}

/// Rows of a paged cache `[blocks, block, hk, d]` through one sequence's `pages`.
fn paged_rows<'a>(
    values: &'a [f64],
    pages: &'a [usize],
    block: usize,
    hk: usize,
    d: usize,
) -> Rows<'a> {
    Box::new(move |a, j, x| values[((pages[j / block] * block + j % block) * hk + a) * d + x])
}

/// Packed sequences and paged caches: random lengths, offsets and block tables (sometimes
/// corrupt), heads, dtypes and masking; a valid call must match each sequence alone, an
/// invalid one must be a typed error.
pub(super) fn serving_case(rng: &mut Rng) -> Result<(), String> {
    let dt = dtype(rng);
    let (hk, d) = (rng.dim(3), rng.dim(16));
    let h = hk.saturating_mul(1 + rng.below(3));
    let b = rng.below(4);
    let causal = rng.chance(40);
    let window = if rng.chance(30) {
        let mut side = || rng.chance(60).then(|| rng.below(12));
        Window::new(side(), side())
    } else {
        Window::UNBOUNDED
    };
    let options = SdpaOptions {
        is_causal: causal,
        causal_variant: if rng.chance(50) {
            CausalVariant::LowerRight
        } else {
            CausalVariant::UpperLeft
        },
        window,
        enable_gqa: h != hk || rng.chance(10),
        ..SdpaOptions::default()
    };
    let reference = |lq: usize, lk: usize, q: Rows, k: Rows, v: Rows| -> (Vec<f64>, Vec<f64>) {
        let gather = |heads: usize, len: usize, f: &Rows, abs: bool| -> Vec<f64> {
            (0..heads * len * d)
                .map(|e| f(e / (len * d), e / d % len, e % d))
                .map(|x| if abs { x.abs() } else { x })
                .collect()
        };
        let run = |abs: bool| {
            attention_reference(
                &gather(h, lq, &q, false),
                &gather(hk, lk, &k, false),
                &gather(hk, lk, &v, abs),
                [1, h, hk, lq, lk, d, d],
                1.0 / (d as f64).sqrt(),
                options.is_causal.then_some(options.causal_variant),
                &|_, _, i, j| {
                    if window_hides(window, options.causal_variant, (lq, lk), i, j) {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    }
                },
            )
        };
        (run(false), run(true))
    };
    let what;
    let (got, want, magnitude) = if rng.chance(50) {
        // Packed: offsets, sometimes corrupt.
        let lens: Vec<(usize, usize)> = (0..b).map(|_| (rng.below(12), rng.below(12))).collect();
        let cumulative = |pick: &dyn Fn(&(usize, usize)) -> usize| {
            std::iter::once(0)
                .chain(lens.iter().scan(0, |t, l| {
                    *t += pick(l);
                    Some(*t)
                }))
                .collect::<Vec<usize>>()
        };
        let (mut cu_q, cu_k) = (cumulative(&|l| l.0), cumulative(&|l| l.1));
        let (total_q, total_k) = (cu_q[b], cu_k[b]);
        if rng.chance(10) {
            let at = rng.below(cu_q.len());
            cu_q[at] = rng.below(total_q + 3);
        }
        let valid = cu_q[0] == 0 && cu_q[b] == total_q && cu_q.windows(2).all(|w| w[0] <= w[1]);
        let (Some((q, qv)), Some((k, kv)), Some((v, vv))) = (
            tensor(rng, &[total_q, h, d], dt),
            tensor(rng, &[total_k, hk, d], dt),
            tensor(rng, &[total_k, hk, d], dt),
        ) else {
            return Ok(());
        };
        let batch = Varlen {
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
        };
        let Some(out) = typed(sdpa_varlen(&q, &k, &v, &batch, &options)) else {
            return Ok(());
        };
        if !valid {
            return Err(format!("offsets {cu_q:?} of {total_q} rows were accepted"));
        }
        what = format!("packed {cu_q:?} {cu_k:?}");
        let (mut want, mut magnitude) = (vec![0.0; total_q * h * d], vec![0.0; total_q * h * d]);
        for s in 0..b {
            let (lq, lk) = (cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]);
            let packed = |values, first, heads| packed_rows(values, first, heads, d);
            let (seq, seq_abs) = reference(
                lq,
                lk,
                packed(&qv, cu_q[s], h),
                packed(&kv, cu_k[s], hk),
                packed(&vv, cu_k[s], hk),
            );
            for e in 0..seq.len() {
                let (a, r, x) = (e / (lq * d), e / d % lq, e % d);
                let at = ((cu_q[s] + r) * h + a) * d + x;
                (want[at], magnitude[at]) = (seq[e], seq_abs[e]);
            }
        }
        (
            out.output.to_f64().map_err(|e| e.to_string())?,
            want,
            magnitude,
        )
    } else {
        // Paged: a block size, lengths and a table, sometimes past the cache or the row.
        let (block, per_seq, blocks) = (rng.below(6), rng.below(4), 1 + rng.below(6));
        let lq = rng.below(5);
        let lens: Vec<usize> = (0..b).map(|_| rng.below(per_seq * block + 2)).collect();
        let table: Vec<usize> = (0..b * per_seq)
            .map(|_| {
                let past = usize::from(rng.chance(5));
                rng.below(blocks + past)
            })
            .collect();
        let valid = lens.iter().enumerate().all(|(s, &len)| {
            len == 0
                || (block > 0
                    && len.div_ceil(block) <= per_seq
                    && table[s * per_seq..][..len.div_ceil(block)]
                        .iter()
                        .all(|&x| x < blocks))
        });
        let cache = [blocks, block, hk, d];
        let (Some((q, qv)), Some((kc, kv)), Some((vc, vv))) = (
            tensor(rng, &[b, h, lq, d], dt),
            tensor(rng, &cache, dt),
            tensor(rng, &cache, dt),
        ) else {
            return Ok(());
        };
        let paged = PagedKv {
            key_cache: &kc,
            value_cache: &vc,
            block_table: &table,
            seq_lens: &lens,
        };
        let Some(out) = typed(sdpa_paged(&q, &paged, &options)) else {
            return Ok(());
        };
        if !valid {
            return Err(format!(
                "lengths {lens:?} over table {table:?} of {blocks} blocks of {block} were accepted"
            ));
        }
        what = format!("paged Lq {lq}, {lens:?} over {table:?} of {blocks} blocks of {block}");
        let (mut want, mut magnitude) = (Vec::new(), Vec::new());
        for (s, &lk) in lens.iter().enumerate() {
            let pages = &table[s * per_seq..][..per_seq];
            let cached = |values| paged_rows(values, pages, block, hk, d);
            let qs: Rows = Box::new(|a, i, x| qv[((s * h + a) * lq + i) * d + x]);
            let (seq, seq_abs) = reference(lq, lk, qs, cached(&kv), cached(&vv));
            want.extend(seq);
            magnitude.extend(seq_abs);
        }
        (
            out.output.to_f64().map_err(|e| e.to_string())?,
            want,
            magnitude,
        )
    };
    if d == 0 {
        return Ok(()); // NaN by definition at the default scale
    }
    compared();
    if !close(&got, &want, &magnitude, dt) {
        return Err(format!(
            "{what}, {dt} h {h} hk {hk} d {d} causal {causal} {window}: error {}",
            rel_err(&got, &want)
        ));
    }
    Ok(())
}

pub(super) fn mha_case(rng: &mut Rng) -> Result<(), String> {
    let (n, l, s, e) = (rng.dim(2), rng.dim(4), rng.dim(4), rng.dim(8));
    let heads = rng.dim(4);
    let dt = [DType::F32, DType::F64][rng.below(2)];
    let (Some((x, _)), Some((kv, _)), Some((w_in, _)), Some((w_out, _))) = (
        tensor(rng, &[n, l, e], dt),
        tensor(rng, &[n, s, e], dt),
        tensor(rng, &[e.saturating_mul(3), e], dt),
        tensor(rng, &[e, e], dt),
    ) else {
        return Ok(());
    };
    let padding: Vec<bool> = (0..n.saturating_mul(s).min(4096))
        .map(|_| rng.chance(20))
        .collect();
    let mask = Tensor::from_bools(&padding, &[n, s], Device::Cpu).ok();
    // An attention mask of a right or wrong shape, boolean or float.
    let mask_shape = [
        vec![l, s],
        vec![n.saturating_mul(heads), l, s],
        vec![l, s + 1],
    ][rng.below(3)]
    .clone();
    let attn_mask = if rng.chance(50) {
        tensor(rng, &mask_shape, dt).map(|t| t.0)
    } else {
        numel(&mask_shape)
            .filter(|&c| c <= 4096)
            .and_then(|c| Tensor::from_bools(&vec![false; c], &mask_shape, Device::Cpu).ok())
    };
    let options = MhaOptions {
        key_padding_mask: mask.as_ref().filter(|_| rng.chance(50)),
        attn_mask: attn_mask.as_ref().filter(|_| rng.chance(30)),
        need_weights: rng.chance(30),
        average_attn_weights: rng.chance(70),
        is_causal: rng.chance(20),
        add_zero_attn: rng.chance(20),
        batch_first: rng.chance(80),
    };
    let bias = tensor(rng, &[1, 1, e], dt);
    let weights = MhaWeights {
        bias_kv: bias
            .as_ref()
            .filter(|_| rng.chance(20))
            .map(|b| (&b.0, &b.0)),
        ..MhaWeights::packed(&w_in, None, &w_out, None)
    };
    let key = if rng.chance(50) { &x } else { &kv };
    if let Some(out) = typed(mha::multi_head_attention_forward(
        &x, key, key, heads, &weights, &options,
    )) {
        compared();
        // (Sequence-first calls read [n, l, e] as [L = n, N = l, E].)
        if out.output.shape() != [n, l, e] {
            return Err(format!(
                "output {:?} for [{n}, {l}, {e}]",
                out.output.shape()
            ));
        }
    }
    Ok(())
}
