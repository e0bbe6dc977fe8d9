//! The fuzz cases of tensor construction, views and copies.

use super::*;

pub(super) fn construction_and_views(rng: &mut Rng) -> Result<(), String> {
    let rank = rng.below(5);
    let shape: Vec<usize> = (0..rank).map(|_| rng.dim(6)).collect();
    let dt = dtype(rng);
    let n = numel(&shape).unwrap_or(usize::MAX);
    // A wrong element count, sometimes.
    let given = if rng.chance(20) {
        rng.below(20)
    } else {
        n.min(4096)
    };
    let made = match dt {
        DType::Bool => Tensor::from_bools(&vec![true; given], &shape, Device::Cpu),
        _ => Tensor::from_f64(&vec![0.25; given], &shape, dt, Device::Cpu),
    };
    if let Some(t) = typed(made) {
        if t.numel() != given || t.shape() != shape.as_slice() {
            return Err(format!("{shape:?} made {:?} of {}", t.shape(), t.numel()));
        }
        let (d0, d1) = (rng.below(rank + 1), rng.below(rank + 1));
        if let Some(view) = typed(t.transpose(d0, d1)) {
            let back = view.transpose(d0, d1).map_err(|e| e.to_string())?;
            if back.to_f64().ok() != t.to_f64().ok() {
                return Err("transposing twice changed the values".into());
            }
            compared();
        }
    }
    // `full` fills a small tensor (an empty one too, while its strides fit in bytes) and
    // refuses one no machine can hold; the sizes in between are honest allocations of
    // gigabytes, which a test has no business making.
    if rng.chance(10) {
        let bytes = shape
            .iter()
            .try_fold(4usize, |n, &d| n.checked_mul(d.max(1)))
            .filter(|&b| b <= isize::MAX as usize);
        let made = match (bytes, numel(&shape)) {
            (Some(_), Some(n)) if n <= 1 << 16 => Some(true),
            (Some(_), Some(n)) if n < 1 << 46 => None,
            _ => Some(false),
        };
        match made {
            Some(true) => {
                let t = Tensor::full(1f32, &shape, Device::Cpu).map_err(|e| e.to_string())?;
                if t.to_f64()
                    .map_err(|e| e.to_string())?
                    .iter()
                    .any(|&v| v != 1.0)
                {
                    return Err(format!("full(1, {shape:?}) holds a value other than 1"));
                }
                compared();
            }
            Some(false) if Tensor::full(1f32, &shape, Device::Cpu).is_ok() => {
                return Err(format!("full(1, {shape:?}) was allocated"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `t` (row-major `values`) as a view of a larger tensor, sometimes: its dimensions stored
/// in a random order, each padded on both sides with NaN, so that a kernel sees a
/// permutation, strides and an offset, and a read outside the view shows in its result.
pub(super) fn laid_out(rng: &mut Rng, t: Tensor, values: &[f64]) -> Result<Tensor, String> {
    let shape = t.shape().to_vec();
    let rank = shape.len();
    if rank == 0 || t.dtype() == DType::Bool || shape.iter().any(|&d| d > 4096) || !rng.chance(50) {
        return Ok(t);
    }
    let mut order: Vec<usize> = (0..rank).collect();
    for i in (1..rank).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut pad = || if rng.chance(50) { rng.below(3) } else { 0 };
    let pads: Vec<(usize, usize)> = (0..rank).map(|_| (pad(), pad())).collect();
    // Storage dimension s holds dimension order[s] of the view.
    let stored: Vec<usize> = (0..rank)
        .map(|s| shape[order[s]] + pads[s].0 + pads[s].1)
        .collect();
    let Some(len) = numel(&stored).filter(|&n| n <= 1 << 16) else {
        return Ok(t);
    };
    let mut storage = vec![f64::NAN; len];
    let mut index = vec![0; rank];
    for &v in values {
        let at = (0..rank).fold(0, |at, s| at * stored[s] + index[order[s]] + pads[s].0);
        storage[at] = v;
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    let mut view =
        Tensor::from_f64(&storage, &stored, t.dtype(), Device::Cpu).map_err(|e| e.to_string())?;
    for (s, &(before, _)) in pads.iter().enumerate() {
        view = view
            .narrow(s, before, shape[order[s]])
            .map_err(|e| e.to_string())?;
    }
    let mut position = vec![0; rank];
    for (s, &d) in order.iter().enumerate() {
        position[d] = s;
    }
    let view = view.permute(&position).map_err(|e| e.to_string())?;
    if view.shape() != shape.as_slice() || view.to_f64().ok().as_deref() != Some(values) {
        return Err(format!(
            "a view of {stored:?} read back other values than {shape:?}"
        ));
    }
    Ok(view)
}

/// A reference tensor: the row-major values of a shape.
#[derive(Clone, Debug)]
pub(super) struct Dense {
    pub(super) shape: Vec<usize>,
    pub(super) values: Vec<f64>,
}

impl Dense {
    /// The tensor of `shape` whose element at each index is this one's at that index as
    /// `source` rewrites it (the reference of a view).
    pub(super) fn gathered(&self, shape: Vec<usize>, source: impl Fn(&mut Vec<usize>)) -> Dense {
        Dense::from_fn(shape, |i| {
            let mut at = i.to_vec();
            source(&mut at);
            self.at(&at)
        })
    }

    /// The tensor of `shape` whose element at each index is `at(index)`.
    pub(super) fn from_fn(shape: Vec<usize>, at: impl Fn(&[usize]) -> f64) -> Dense {
        let len = shape.iter().product();
        let mut index = vec![0; shape.len()];
        let mut values = Vec::with_capacity(len);
        for _ in 0..len {
            values.push(at(&index));
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Dense { shape, values }
    }
    pub(super) fn at(&self, index: &[usize]) -> f64 {
        let flat = index
            .iter()
            .zip(&self.shape)
            .fold(0, |flat, (&i, &size)| flat * size + i);
        self.values[flat]
    }
}

/// A shape of `count` elements other than `shape`: all in one dimension, a dimension split
/// in two, two neighbours merged, a size-1 dimension added or dropped.
fn regrouped(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let mut new = shape.to_vec();
    let rank = shape.len();
    match rng.below(4) {
        0 => return vec![shape.iter().product()],
        1 if rank > 0 => {
            let d = rng.below(rank);
            let parts = (1..=new[d])
                .filter(|&p| new[d].is_multiple_of(p))
                .collect::<Vec<_>>();
            let p = if parts.is_empty() {
                0
            } else {
                parts[rng.below(parts.len())]
            };
            let rest = new[d].checked_div(p).unwrap_or(0);
            new.splice(d..=d, [p, rest]);
        }
        2 if rank > 1 => {
            let d = rng.below(rank - 1);
            let merged = new[d] * new[d + 1];
            new.splice(d..d + 2, [merged]);
        }
        _ => {
            let d = rng.below(rank + 1);
            if d < rank && new[d] == 1 {
                new.remove(d);
            } else {
                new.insert(d, 1);
            }
        }
    }
    new
}

/// One random view (or copy) of `t`, applied to the reference too; `Ok(None)` where the
/// library rightly refused (invalid arguments) or the result is too large to follow.
fn one_view(rng: &mut Rng, t: &Tensor, dense: &Dense) -> Result<Option<(Tensor, Dense)>, String> {
    let shape = &dense.shape;
    let rank = shape.len();
    let dim = rng.below(rank + 1); // rank itself is out of range
    let size = shape.get(dim).copied().unwrap_or(0);
    let (what, result, want): (String, _, Option<Dense>) = match rng.below(9) {
        0 => {
            let mut dims: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                dims.swap(i, rng.below(i + 1));
            }
            if rng.chance(15) {
                match rng.below(3) {
                    0 => dims.push(rng.below(rank + 1)),
                    1 if rank > 1 => dims[0] = dims[1],
                    _ => {
                        dims.pop();
                    }
                }
            }
            let valid = dims.len() == rank && {
                let mut sorted = dims.clone();
                sorted.sort_unstable();
                sorted == (0..rank).collect::<Vec<_>>()
            };
            let want = valid.then(|| {
                Dense::from_fn(dims.iter().map(|&d| shape[d]).collect(), |i| {
                    let mut at = vec![0; rank];
                    for (k, &d) in dims.iter().enumerate() {
                        at[d] = i[k];
                    }
                    dense.at(&at)
                })
            });
            (format!("permute({dims:?})"), t.permute(&dims), want)
        }
        1 => {
            let other = rng.below(rank + 1);
            let want = (dim < rank && other < rank).then(|| {
                let mut new = shape.clone();
                new.swap(dim, other);
                dense.gathered(new, |at| at.swap(dim, other))
            });
            (
                format!("transpose({dim}, {other})"),
                t.transpose(dim, other),
                want,
            )
        }
        2 => {
            let start = if rng.chance(5) {
                usize::MAX
            } else {
                rng.below(size + 2)
            };
            let length = rng.below(size + 2);
            let want =
                (dim < rank && start.checked_add(length).is_some_and(|e| e <= size)).then(|| {
                    let mut new = shape.clone();
                    new[dim] = length;
                    dense.gathered(new, |at| at[dim] += start)
                });
            (
                format!("narrow({dim}, {start}, {length})"),
                t.narrow(dim, start, length),
                want,
            )
        }
        3 => {
            let index = rng.below(size + 1);
            let want = (dim < rank && index < size).then(|| {
                let mut new = shape.clone();
                new.remove(dim);
                dense.gathered(new, |at| at.insert(dim, index))
            });
            (
                format!("select({dim}, {index})"),
                t.select(dim, index),
                want,
            )
        }
        4 => {
            let mut new: Vec<usize> = shape
                .iter()
                .map(|&s| if s == 1 { rng.below(4) } else { s })
                .collect();
            let added = rng.below(2);
            for _ in 0..added {
                new.insert(0, rng.dim(3));
            }
            let wrong = rank > 0 && rng.chance(10);
            if wrong {
                let d = rng.below(rank) + added;
                new[d] = new[d].wrapping_add(1 + rng.below(2));
            }
            let fits = new[added..]
                .iter()
                .zip(shape)
                .all(|(&want, &have)| want == have || have == 1);
            // (An empty shape with huge dimensions may be refused: its strides span more than the
            // address space.)
            let small = numel(&new).is_some_and(|n| n <= 4096) && new.iter().all(|&d| d <= 4096);
            let want = (fits && small).then(|| {
                Dense::from_fn(new.clone(), |i| {
                    let at: Vec<usize> = i[added..]
                        .iter()
                        .zip(shape)
                        .map(|(&i, &s)| if s == 1 { 0 } else { i })
                        .collect();
                    dense.at(&at)
                })
            });
            let result = t.expand(&new);
            if fits && !small {
                // A broadcast too large to follow: a view or a typed error; making it
                // contiguous must not take the process down either (an extent past the
                // address space is refused before any allocation).
                if let Ok(view) = &result
                    && numel(&new).is_none_or(|n| n > 1 << 50)
                    && view.contiguous().is_ok()
                {
                    return Err(format!("contiguous() of expand({new:?}) succeeded"));
                }
                return Ok(None);
            }
            (format!("expand({new:?})"), result, want)
        }
        5 => {
            let at = rng.below(rank + 2);
            let want = (at <= rank).then(|| {
                let mut new = shape.clone();
                new.insert(at, 1);
                dense.gathered(new, |index| {
                    index.remove(at);
                })
            });
            (format!("unsqueeze({at})"), t.unsqueeze(at), want)
        }
        6 => {
            let want = (dim < rank).then(|| {
                if size != 1 {
                    return dense.clone();
                }
                let mut new = shape.clone();
                new.remove(dim);
                Dense {
                    shape: new,
                    values: dense.values.clone(),
                }
            });
            (format!("squeeze({dim})"), t.squeeze(dim), want)
        }
        7 => {
            let new = if rng.chance(10) {
                vec![rng.dim(5)]
            } else {
                regrouped(rng, shape)
            };
            let want = (numel(&new) == Some(dense.values.len())).then(|| Dense {
                shape: new.clone(),
                values: dense.values.clone(),
            });
            // view may refuse strides that cannot show the new shape; reshape never does.
            if rng.chance(50) {
                match t.view(&new) {
                    Err(_) if want.is_some() => {
                        ("reshape after view refused".into(), t.reshape(&new), want)
                    }
                    result => (format!("view({new:?})"), result, want),
                }
            } else {
                (format!("reshape({new:?})"), t.reshape(&new), want)
            }
        }
        _ => {
            let result = t.contiguous();
            if let Ok(c) = &result
                && !c.is_contiguous()
            {
                return Err(format!("contiguous() of {:?} is not", t.strides()));
            }
            ("contiguous()".into(), result, Some(dense.clone()))
        }
    };
    match (result, want) {
        (Ok(view), Some(want)) => {
            compared();
            if view.shape() != want.shape.as_slice() {
                return Err(format!(
                    "{what}: shape {:?}, want {:?}",
                    view.shape(),
                    want.shape
                ));
            }
            Ok(Some((view, want)))
        }
        (Ok(view), None) => Err(format!(
            "{what} of {shape:?} was accepted: {:?}",
            view.shape()
        )),
        (Err(e), Some(_)) => Err(format!("{what} of {shape:?} refused: {e}")),
        (Err(_), None) => Ok(None),
    }
}

/// A chain of views and copies, each checked against the same steps on a reference.
pub(super) fn views_case(rng: &mut Rng) -> Result<(), String> {
    let rank = rng.below(5);
    let shape: Vec<usize> = (0..rank).map(|_| rng.below(5)).collect();
    let dt = [DType::F32, DType::F64, DType::F16, DType::Bf16][rng.below(4)];
    let Some((t, values)) = tensor(rng, &shape, dt) else {
        return Ok(());
    };
    let mut t = laid_out(rng, t, &values)?;
    let mut dense = Dense { shape, values };
    let mut steps = Vec::new();
    for _ in 0..1 + rng.below(5) {
        match one_view(rng, &t, &dense) {
            Ok(Some((next, want))) => {
                (t, dense) = (next, want);
                steps.push(format!("{:?}/{:?}+{}", t.shape(), t.strides(), t.offset()));
            }
            Ok(None) => break,
            Err(wrong) => return Err(format!("after {steps:?}: {wrong}")),
        }
    }
    let got = t.to_f64().map_err(|e| e.to_string())?;
    compared();
    if got != dense.values {
        return Err(format!("after {steps:?}: values differ"));
    }
    Ok(())
}

/// Whether a view of `shape`, `strides`, `offset` reaches only elements `0..len` (and its
/// shape's row-major extent of f32s fits the address space, as every tensor's must).
pub(super) fn fits(shape: &[usize], strides: &[usize], offset: usize, len: usize) -> bool {
    let extent = shape
        .iter()
        .try_fold(4u128, |bytes, &d| bytes.checked_mul(d.max(1) as u128));
    if strides.len() != shape.len() || extent.is_none_or(|b| b > isize::MAX as u128) {
        return false;
    }
    if shape.contains(&0) {
        return offset <= len;
    }
    let last = shape
        .iter()
        .zip(strides)
        .fold(offset as u128, |at, (&n, &s)| {
            at + (n as u128 - 1) * s as u128
        });
    last < len as u128
}
