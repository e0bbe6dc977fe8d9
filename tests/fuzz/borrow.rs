//! The fuzz cases of borrowed tensors, copy_ and matmul_out.

use super::*;

/// Buffer positions of a (fitting, small) view's elements in row-major order.
fn positions(shape: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    let count = numel(shape).expect("a small view");
    let mut out = Vec::with_capacity(count);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..count {
        out.push(
            offset
                + index
                    .iter()
                    .zip(strides)
                    .map(|(&i, &s)| i * s)
                    .sum::<usize>(),
        );
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// A random layout over a buffer of `len` elements: mostly inside it, sometimes past its
/// end, with repeated (stride-0) and huge strides.
fn layout(rng: &mut Rng, len: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let rank = rng.below(4);
    let shape: Vec<usize> = (0..rank).map(|_| rng.dim(4)).collect();
    let strides: Vec<usize> = (0..rank)
        .map(|_| match rng.below(12) {
            0 => 0,
            1 => usize::MAX / 2,
            _ => 1 + rng.below(6),
        })
        .collect();
    let offset = if rng.chance(10) {
        rng.dim(len + 2)
    } else {
        rng.below(len + 1)
    };
    let strides = if rng.chance(5) {
        strides[..rank.saturating_sub(1)].to_vec()
    } else {
        strides
    };
    (shape, strides, offset)
}

/// Caller memory lent to tensors: reads through any layout match the slice, `copy_` and
/// `matmul_out` write exactly the view's elements, and bad layouts are typed errors.
pub(super) fn borrow_case(rng: &mut Rng) -> Result<(), String> {
    let len = rng.below(64);
    let data: Vec<f32> = rng.values(len).into_iter().map(|x| x as f32).collect();
    let (shape, strides, offset) = layout(rng, len);
    let valid = fits(&shape, &strides, offset, len);
    // Views of many elements (a stride of 0 over 2^40 of them fits) are lent, not read.
    let small = numel(&shape).is_some_and(|n| n <= 1 << 16);
    let at = (valid && small).then(|| positions(&shape, &strides, offset));
    let what = format!("{shape:?} {strides:?} +{offset} over {len}");
    let read = backends::borrow_scope(|scope| {
        let t = scope.borrow_strided(&data, &shape, &strides, offset).ok()?;
        Some(small.then(|| t.to_vec::<f32>()))
    });
    match (read, &at) {
        (None, _) if valid => return Err(format!("{what} was refused")),
        (Some(_), _) if !valid => return Err(format!("{what} was lent")),
        (Some(Some(Ok(got))), Some(at)) => {
            compared();
            if got.iter().ne(at.iter().map(|&i| &data[i])) {
                return Err(format!("{what}: read {got:?}"));
            }
        }
        (Some(Some(Err(e))), _) => return Err(format!("reading {what}: {e}")),
        _ => {}
    }
    // copy_ of fresh values into a writable view: exactly its elements change, in
    // row-major order (a repeated element keeps the last write), unless it repeats by a
    // stride of 0, which is refused.
    if let Some(at) = &at {
        let mut target = data.clone();
        let source: Vec<f32> = rng.values(at.len()).into_iter().map(|x| x as f32).collect();
        let wrote = backends::borrow_scope(|scope| {
            let t = scope
                .borrow_mut_strided(&mut target, &shape, &strides, offset)
                .map_err(|e| e.to_string())?;
            let src =
                Tensor::from_vec(source.clone(), &shape, Device::Cpu).map_err(|e| e.to_string())?;
            Ok::<bool, String>(t.copy_(&src).is_ok())
        })
        .map_err(|e| format!("lending {what} to write: {e}"))?;
        let repeats = shape.iter().zip(&strides).any(|(&n, &s)| n > 1 && s == 0);
        let mut want = data.clone();
        if wrote {
            for (&i, &x) in at.iter().zip(&source) {
                want[i] = x;
            }
        }
        if wrote == repeats {
            return Err(format!("copy_ into {what}: accepted {wrote}"));
        }
        compared();
        if target != want {
            return Err(format!("copy_ into {what}: {target:?}"));
        }
    }
    // matmul_out into a borrowed [m, n]: the product, or a typed error for the wrong shape.
    let (m, k, n) = (1 + rng.below(4), 1 + rng.below(4), 1 + rng.below(4));
    let (a, b) = (rng.values(m * k), rng.values(k * n));
    let rows = if rng.chance(20) { m + 1 } else { m };
    let mut out = vec![f64::NAN; rows * n];
    let result = backends::borrow_scope(|scope| {
        let (ta, tb) = (scope.borrow(&a, &[m, k])?, scope.borrow(&b, &[k, n])?);
        backends::matmul_out(&ta, &tb, &scope.borrow_mut(&mut out, &[rows, n])?)
    });
    match (result, rows == m) {
        (Ok(()), true) => {
            compared();
            let want = product(&a, &b, m, k, n);
            if rel_err(&out, &want) > 1e-12 {
                return Err(format!("matmul_out [{m},{k}]x[{k},{n}]: {out:?}"));
            }
        }
        (Ok(()), false) => return Err("matmul_out into the wrong shape was accepted".into()),
        (Err(_), true) => return Err(format!("matmul_out [{m},{k}]x[{k},{n}] failed")),
        (Err(_), false) => {}
    }
    Ok(())
}
