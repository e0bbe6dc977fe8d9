//! The fuzz cases of matmul, linear and einsum.

use super::*;

/// `torch.matmul` of two reference tensors, or `None` where PyTorch refuses the shapes.
fn naive_matmul(a: &Dense, b: &Dense) -> Option<Dense> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra == 0 || rb == 0 {
        return None;
    }
    let sa = if ra == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let sb = if rb == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return None;
    }
    let (batch_a, batch_b) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let rank = batch_a.len().max(batch_b.len());
    let size =
        |dims: &[usize], i: usize| (i + dims.len()).checked_sub(rank).map_or(1, |at| dims[at]);
    let mut batch = Vec::new();
    for i in 0..rank {
        let (x, y) = (size(batch_a, i), size(batch_b, i));
        if x != y && x != 1 && y != 1 {
            return None;
        }
        batch.push(if x == 1 { y } else { x });
    }
    // The index of a batch dimension in an operand that has `dims` of them.
    let pick = |dims: &[usize], index: &[usize]| -> Vec<usize> {
        index[rank - dims.len()..]
            .iter()
            .zip(dims)
            .map(|(&i, &s)| if s == 1 { 0 } else { i })
            .collect()
    };
    let full = Dense::from_fn([batch.clone(), vec![m, n]].concat(), |i| {
        let (index, (row, col)) = (&i[..rank], (i[rank], i[rank + 1]));
        (0..k)
            .map(|p| {
                let mut at_a = pick(batch_a, index);
                at_a.extend(if ra == 1 { vec![p] } else { vec![row, p] });
                let mut at_b = pick(batch_b, index);
                at_b.extend(if rb == 1 { vec![p] } else { vec![p, col] });
                a.at(&at_a) * b.at(&at_b)
            })
            .sum()
    });
    let mut shape = batch;
    if ra > 1 {
        shape.push(m);
    }
    if rb > 1 {
        shape.push(n);
    }
    Some(Dense {
        shape,
        values: full.values,
    })
}

/// A random operand shape for matmul: 1 to 4 dimensions ending in `[rows, cols]` (one of
/// them for a vector), batch dimensions of size 1 (broadcast) or `batch`.
fn operand_shape(
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    vector: usize,
    batch: &[usize],
) -> Vec<usize> {
    match rng.below(5) {
        0 => vec![vector],
        1 => vec![rows, cols],
        _ => {
            let lead = rng.below(batch.len() + 1);
            let mut shape: Vec<usize> = batch[batch.len() - lead..]
                .iter()
                .map(|&s| if rng.chance(30) { 1 } else { s })
                .collect();
            shape.extend([rows, cols]);
            shape
        }
    }
}

pub(super) fn matmul_case(rng: &mut Rng) -> Result<(), String> {
    let (m, n, k) = (rng.dim(5), rng.dim(5), rng.dim(5));
    let k2 = if rng.chance(10) { rng.dim(5) } else { k };
    let batch: Vec<usize> = (0..rng.below(3)).map(|_| rng.dim(3)).collect();
    let shape_a = operand_shape(rng, m, k, k, &batch);
    let shape_b = operand_shape(rng, k2, n, k2, &batch);
    let dt = [DType::F32, DType::F64, DType::Bf16][rng.below(3)];
    let (Some((a, av)), Some((b, bv))) = (tensor(rng, &shape_a, dt), tensor(rng, &shape_b, dt))
    else {
        return Ok(());
    };
    let (a, b) = (laid_out(rng, a, &av)?, laid_out(rng, b, &bv)?);
    let (da, db) = (
        Dense {
            shape: shape_a.clone(),
            values: av,
        },
        Dense {
            shape: shape_b.clone(),
            values: bv,
        },
    );
    // Empty operands can still ask for a large output, [2^32, 0] x [0] for one: an honest
    // allocation of gigabytes, which a test has no business making. This bounds its length:
    // batch dimensions broadcast ([1] and [0] give 0, [1] and [1] give 1), and a vector
    // operand brings no row or column.
    let rows = if shape_a.len() > 1 { m } else { 1 };
    let cols = if shape_b.len() > 1 { n } else { 1 };
    let out_len = batch
        .iter()
        .map(|&d| d.max(1))
        .chain([rows, cols])
        .try_fold(1usize, |len, d| len.checked_mul(d));
    if out_len.is_none_or(|len| len > 1 << 20) {
        return Ok(());
    }
    let result = matmul(&a, &b);
    let want = naive_matmul(&da, &db);
    let absolute = |d: &Dense| Dense {
        shape: d.shape.clone(),
        values: d.values.iter().map(|x| x.abs()).collect(),
    };
    let (out, want) = match (result, want) {
        (Ok(out), Some(want)) => (out, want),
        (Ok(out), None) => {
            return Err(format!(
                "{shape_a:?} x {shape_b:?} was accepted: {:?}",
                out.shape()
            ));
        }
        _ => return Ok(()),
    };
    compared();
    let got = out.to_f64().map_err(|e| e.to_string())?;
    let magnitude = naive_matmul(&absolute(&da), &absolute(&db)).expect("the same shapes");
    if out.shape() != want.shape.as_slice() || !close(&got, &want.values, &magnitude.values, dt) {
        return Err(format!(
            "{shape_a:?} x {shape_b:?} ({dt}): {:?}",
            out.shape()
        ));
    }
    Ok(())
}

pub(super) fn linear_case(rng: &mut Rng) -> Result<(), String> {
    let (width, out_features) = (rng.dim(6), rng.dim(6));
    let lead: Vec<usize> = (0..rng.below(3)).map(|_| rng.dim(4)).collect();
    let given = if rng.chance(10) { rng.dim(6) } else { width };
    let dt = [DType::F32, DType::F64, DType::Bf16][rng.below(3)];
    let shape_x = [lead.clone(), vec![given]].concat();
    let (Some((x, xv)), Some((w, wv))) = (
        tensor(rng, &shape_x, dt),
        tensor(rng, &[out_features, width], dt),
    ) else {
        return Ok(());
    };
    let bias_len = if rng.chance(10) {
        rng.dim(6)
    } else {
        out_features
    };
    let bias = match rng.chance(50) {
        true => match tensor(rng, &[bias_len], dt) {
            Some(made) => Some(made),
            None => return Ok(()),
        },
        false => None,
    };
    let (x, w) = (laid_out(rng, x, &xv)?, laid_out(rng, w, &wv)?);
    if lead
        .iter()
        .chain([&out_features])
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_none_or(|n| n > 1 << 20)
    {
        return Ok(());
    }
    let Some(out) = typed(backends::linear(&x, &w, bias.as_ref().map(|(b, _)| b))) else {
        return Ok(());
    };
    if given != width || bias.is_some() && bias_len != out_features {
        return Err(format!(
            "{shape_x:?} x [{out_features}, {width}] bias {bias_len} was accepted"
        ));
    }
    let dx = Dense {
        shape: shape_x.clone(),
        values: xv,
    };
    let dw = Dense {
        shape: vec![out_features, width],
        values: wv,
    };
    // The product, and the same sums over magnitudes (the scale of the rounding error).
    let sums = |size: fn(f64) -> f64| {
        Dense::from_fn([lead.clone(), vec![out_features]].concat(), |i| {
            let (row, o) = (&i[..lead.len()], i[lead.len()]);
            let dot: f64 = (0..width)
                .map(|p| size(dx.at(&[row, &[p]].concat())) * size(dw.at(&[o, p])))
                .sum();
            dot + bias.as_ref().map_or(0.0, |(_, values)| size(values[o]))
        })
    };
    let (want, magnitude) = (sums(|x| x), sums(f64::abs));
    let got = out.to_f64().map_err(|e| e.to_string())?;
    compared();
    if out.shape() != want.shape.as_slice() || !close(&got, &want.values, &magnitude.values, dt) {
        return Err(format!(
            "linear {shape_x:?} x [{out_features}, {width}] ({dt}): {:?}",
            out.shape()
        ));
    }
    Ok(())
}

/// The naive einsum of `terms -> output` over labels a-e.
fn naive_einsum(
    terms: &[Vec<u8>],
    output: &[u8],
    values: &[Vec<f64>],
    sizes: &[usize; 5],
) -> Vec<f64> {
    let labels: Vec<u8> = (0..5)
        .filter(|&l| terms.iter().any(|t| t.contains(&l)))
        .collect();
    let out_len: usize = output.iter().map(|&l| sizes[l as usize]).product();
    let mut out = vec![0.0; out_len];
    let total: usize = labels.iter().map(|&l| sizes[l as usize]).product();
    let mut at = [0usize; 5];
    for mut flat in 0..total {
        for &l in labels.iter().rev() {
            at[l as usize] = flat % sizes[l as usize];
            flat /= sizes[l as usize];
        }
        let index = |ls: &[u8]| {
            ls.iter()
                .fold(0, |i, &l| i * sizes[l as usize] + at[l as usize])
        };
        let product: f64 = terms.iter().zip(values).map(|(t, v)| v[index(t)]).product();
        out[index(output)] += product;
    }
    out
}

pub(super) fn einsum_case(rng: &mut Rng) -> Result<(), String> {
    let sizes: [usize; 5] = std::array::from_fn(|_| rng.below(4));
    let operands = 1 + rng.below(4);
    let terms: Vec<Vec<u8>> = (0..operands)
        .map(|_| (0..rng.below(4)).map(|_| rng.below(5) as u8).collect())
        .collect();
    let output: Vec<u8> = (0..5u8)
        .filter(|l| terms.iter().any(|t| t.contains(l)) && rng.chance(40))
        .collect();
    let text = |t: &[u8]| t.iter().map(|&l| (b'a' + l) as char).collect::<String>();
    let mut equation = format!(
        "{}->{}",
        terms.iter().map(|t| text(t)).collect::<Vec<_>>().join(","),
        text(&output)
    );
    // Noise: whitespace (also outside ASCII), a stray character, an extra label. Whitespace
    // keeps the meaning; anything else may change it, so that no reference applies.
    let noise = rng
        .chance(10)
        .then(|| [" ", "\u{3000}", "é", "1", "->", ".", "a"][rng.below(7)]);
    if let Some(noise) = noise {
        let at = equation
            .char_indices()
            .map(|(i, _)| i)
            .nth(rng.below(equation.chars().count() + 1))
            .unwrap_or(equation.len());
        equation.insert_str(at, noise);
    }
    let shapes: Vec<Vec<usize>> = terms
        .iter()
        .map(|t| t.iter().map(|&l| sizes[l as usize]).collect())
        .collect();
    let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
    let _ = einsum_path(&equation, &shape_refs);
    let mut made = Vec::new();
    for s in &shapes {
        match tensor(rng, s, DType::F64) {
            Some((t, values)) => made.push((laid_out(rng, t, &values)?, values)),
            None => return Ok(()),
        }
    }
    let refs: Vec<&Tensor> = made.iter().map(|(t, _)| t).collect();
    let Some(out) = typed(einsum(&equation, &refs)) else {
        return Ok(());
    };
    if noise.is_some_and(|n| n.trim() != "") {
        return Ok(()); // an equation changed by the noise that still parsed: no reference
    }
    let values: Vec<Vec<f64>> = made.iter().map(|(_, v)| v.clone()).collect();
    let want = naive_einsum(&terms, &output, &values, &sizes);
    let got = out.to_f64().map_err(|e| e.to_string())?;
    let scale: f64 = want.iter().map(|x| x * x).sum::<f64>().sqrt();
    let diff: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    compared();
    if got.len() != want.len() || diff > 1e-10 * scale.max(1.0) {
        return Err(format!("{equation} on {shapes:?}: {diff}"));
    }
    Ok(())
}
