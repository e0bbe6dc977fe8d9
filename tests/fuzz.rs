//! Fuzzing every public entry point with a seeded generator: random valid and invalid
//! shapes, dtypes, strides (transposed views), masks, flags. Every call must return a typed
//! error or a result that matches a naive float64 reference; a panic fails the case, with
//! its seed, and the whole run happens in a child process, so that an abort fails the test
//! instead of ending the run. Seeds of failures once found are kept in `REGRESSIONS`.
//!
//! `BACKENDS_FUZZ_SEED=n` reruns from another seed; `BACKENDS_FUZZ_CALLS=n` sets the calls
//! per entry point (10,000 by default: a few seconds in CI).

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use backends::attention::{SdpBackend, sdpa_kernel_scoped};
use backends::mha::{self, MhaOptions, MhaWeights};
use backends::{
    CausalVariant, DType, Device, PagedKv, SdpaOptions, Tensor, Varlen, Window, einsum,
    einsum_path, fft, matmul, sdpa, sdpa_paged, sdpa_varlen,
};
use common::{attention_reference, in_child, rel_err, window_hides};

/// Seeds whose cases once failed; they run first, every time, in every case. The
/// library's defects the fuzzing found earlier are reproduced by name in
/// `tests/robustness.rs`; the others here were the test's own (a check too strict, or a
/// test allocating gigabytes), or a change caught before it landed.
const REGRESSIONS: &[u64] = &[
    125_010_206, // matmul [2^32, 0] x [0]: a 16 GiB output of zeros, which the test skips
    132_009_851, // sdpa at head dim 1: an output that cancels, measured against |v|
    196_004_129, // matmul: a reference over a shape whose product wraps
    5_002_156,   // full(1, [2^53, 3, 0, 5]): empty, its strides fit, so it is allocated
    20_261_263_792_447, // sdpa decoding at a value dim of 0: a panic in the split-KV change
    20_261_263_784_122, // fft_with with a dimension of 0: panics padding it and in the reference
    20_261_263_783_628, // sdpa_paged at Lq 4: a test reference reading q head-major wrongly
    20_261_263_785_265, // mha with bias_k and S = 0: masks widened from empty rows (a panic)
];

/// A small seeded generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
            .collect()
    }
    /// A dimension: mostly small, sometimes 0, rarely enormous.
    fn dim(&mut self, max: usize) -> usize {
        match self.below(40) {
            0 => 0,
            1 => usize::MAX / (1 + self.below(4)),
            2 => 1 << (31 + self.below(30)),
            _ => 1 + self.below(max),
        }
    }
}

/// The element count of `shape` (0 when any dimension is, however large the others).
fn numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// A tensor of `shape` with values from `rng` where the shape is small enough to fill.
fn tensor(rng: &mut Rng, shape: &[usize], dtype: DType) -> Option<(Tensor, Vec<f64>)> {
    let n = numel(shape).filter(|&n| n <= 4096)?;
    let values = rng.values(n);
    let t = Tensor::from_f64(&values, shape, dtype, Device::Cpu).ok()?;
    // Read back: the reference sees the values as rounded to the dtype.
    let rounded = t.to_f64().unwrap();
    Some((t, rounded))
}

fn dtype(rng: &mut Rng) -> DType {
    [DType::F32, DType::F64, DType::F16, DType::Bf16, DType::Bool][rng.below(5)]
}

/// The bound of ‖out − ref‖ / ‖ref‖ for results in `dtype`.
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

/// Whether `got` matches `want` within the dtype's bound, relative to `magnitude`: the same
/// sums over the terms' magnitudes, which a result that cancels to near 0 keeps the scale
/// of its rounding error from.
fn close(got: &[f64], want: &[f64], magnitude: &[f64], dtype: DType) -> bool {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    got.len() == want.len()
        && norm(&mut got.iter().zip(want).map(|(g, w)| g - w))
            <= bound(dtype).max(1e-5) * norm(&mut magnitude.iter().copied())
}

/// One entry point's case: `Err` says what came out wrong.
type Case = fn(&mut Rng) -> Result<(), String>;

/// Results compared with a reference in the current `fuzz` run.
static COMPARED: AtomicUsize = AtomicUsize::new(0);

/// Counts one result checked against its reference.
fn compared() {
    COMPARED.fetch_add(1, Ordering::Relaxed);
}

/// Runs `case` for each seed, failing with the seed on a panic or a wrong result; returns
/// how many results were compared with a reference.
fn fuzz(what: &str, case: impl Fn(&mut Rng) -> Result<(), String>) -> usize {
    COMPARED.store(0, Ordering::Relaxed);
    let base: u64 = std::env::var("BACKENDS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_203);
    let calls: u64 = std::env::var("BACKENDS_FUZZ_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let seeds = REGRESSIONS
        .iter()
        .copied()
        .chain((0..calls).map(|i| base.wrapping_mul(1_000_003).wrapping_add(i)));
    let mut slowest = (std::time::Duration::ZERO, 0);
    for seed in seeds {
        let start = std::time::Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| case(&mut Rng(seed))));
        slowest = slowest.max((start.elapsed(), seed));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(wrong)) => panic!("{what}, seed {seed}: {wrong}"),
            Err(_) => panic!("{what}, seed {seed}: panicked"),
        }
    }
    let checked = COMPARED.load(Ordering::Relaxed);
    eprintln!(
        "{what}: {calls} calls, {checked} results compared with the reference; slowest: seed \
         {} ({:?})",
        slowest.1, slowest.0
    );
    checked
}

/// A typed error is a fine answer to any input; a result must then be checked.
fn typed<T>(result: backends::Result<T>) -> Option<T> {
    result.ok()
}

fn construction_and_views(rng: &mut Rng) -> Result<(), String> {
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
fn laid_out(rng: &mut Rng, t: Tensor, values: &[f64]) -> Result<Tensor, String> {
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
struct Dense {
    shape: Vec<usize>,
    values: Vec<f64>,
}

impl Dense {
    /// The tensor of `shape` whose element at each index is this one's at that index as
    /// `source` rewrites it (the reference of a view).
    fn gathered(&self, shape: Vec<usize>, source: impl Fn(&mut Vec<usize>)) -> Dense {
        Dense::from_fn(shape, |i| {
            let mut at = i.to_vec();
            source(&mut at);
            self.at(&at)
        })
    }

    /// The tensor of `shape` whose element at each index is `at(index)`.
    fn from_fn(shape: Vec<usize>, at: impl Fn(&[usize]) -> f64) -> Dense {
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
    fn at(&self, index: &[usize]) -> f64 {
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
fn views_case(rng: &mut Rng) -> Result<(), String> {
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

fn matmul_case(rng: &mut Rng) -> Result<(), String> {
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

fn linear_case(rng: &mut Rng) -> Result<(), String> {
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

fn sdpa_case(rng: &mut Rng) -> Result<(), String> {
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
fn serving_case(rng: &mut Rng) -> Result<(), String> {
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

fn einsum_case(rng: &mut Rng) -> Result<(), String> {
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

fn fft_case(rng: &mut Rng) -> Result<(), String> {
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

fn mha_case(rng: &mut Rng) -> Result<(), String> {
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

fn conv_case(rng: &mut Rng) -> Result<(), String> {
    use backends::conv::{Conv2dOptions, Padding};
    use common::conv::{Case as ConvCase, reference};
    let groups = [1, 1, 2, 3, 0][rng.below(5)];
    let per_group = [rng.dim(3), rng.dim(3)];
    let (c, o) = (
        per_group[0].saturating_mul(groups.max(1)),
        per_group[1].saturating_mul(groups.max(1)),
    );
    let (n, hw, k) = (
        rng.dim(2),
        [rng.dim(7), rng.dim(7)],
        [rng.dim(4), rng.dim(4)],
    );
    let small = |rng: &mut Rng| [0, 1, 1, 2, 3, 1 << 40][rng.below(6)];
    let stride = [small(rng), small(rng)];
    let dilation = [small(rng), small(rng)];
    let padding = match rng.below(4) {
        0 => Padding::Same,
        1 => Padding::Valid,
        _ => Padding::Explicit([small(rng).min(3), [0, 1, 2, usize::MAX / 2][rng.below(4)]]),
    };
    let dt = [DType::F32, DType::F64, DType::F32, DType::Bf16, DType::Bool][rng.below(5)];
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
    let bias = rng.chance(50);
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
        return Err(format!("{dt} {case:?}: wrong values"));
    }
    Ok(())
}

/// Row-major product of `a` (`m × k`) and `b` (`k × n`), entries as given.
fn product(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

fn linalg_case(rng: &mut Rng) -> Result<(), String> {
    use backends::linalg;
    let batch: Vec<usize> = (0..rng.below(3)).map(|_| rng.dim(3)).collect();
    let (m, n) = (rng.dim(6), if rng.chance(60) { 0 } else { rng.dim(6) });
    let n = if n == 0 && rng.chance(90) { m } else { n };
    let dt = [DType::F32, DType::F64, DType::F64, DType::F16, DType::I32][rng.below(5)];
    let shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
    // An empty input with a huge batch asks for huge outputs (lu's P, the identity of each
    // of them): valid, but not made here.
    let side = m.max(n).max(1);
    if numel(&batch)
        .and_then(|count| count.checked_mul(side.checked_mul(side)?))
        .is_none_or(|c| c > 1 << 20)
    {
        return Ok(());
    }
    let Some((a, ah)) = tensor(rng, &shape, if dt == DType::I32 { DType::F64 } else { dt }) else {
        return Ok(());
    };
    let a = if dt == DType::I32 {
        Tensor::full(1i32, &shape, Device::Cpu).map_err(|e| e.to_string())?
    } else {
        a
    };
    let upper = rng.chance(50);
    let values = |t: &Tensor| t.to_f64().unwrap();
    match rng.below(8) {
        0 => {
            typed(linalg::inv(&a));
        }
        1 => {
            typed(linalg::cholesky(&a, upper));
        }
        2 => {
            let columns = rng.dim(3);
            let rhs = tensor(rng, &[m, columns], dt).map(|t| t.0);
            if let (Some(factors), Some(rhs)) = (typed(linalg::lu_factor(&a)), rhs) {
                typed(linalg::lu_solve(&factors, &rhs, true, false));
            }
        }
        3 => {
            typed(linalg::qr(
                &a,
                [
                    linalg::QrMode::Reduced,
                    linalg::QrMode::Complete,
                    linalg::QrMode::R,
                ][rng.below(3)],
            ));
        }
        4 => {
            if let (Some(e), Some(w)) = (
                typed(linalg::eigh(&a, upper)),
                typed(linalg::eigvalsh(&a, upper)),
            ) {
                compared();
                let (ev, wv) = (values(&e.eigenvalues), values(&w));
                let finite = ev.iter().all(|x| x.is_finite());
                if finite
                    && !close(
                        &ev,
                        &wv,
                        &ev.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
                        dt,
                    )
                {
                    return Err(format!("eigh and eigvalsh differ: {ev:?} vs {wv:?}"));
                }
            }
        }
        5 => {
            if let (Some(s), Some(v)) = (
                typed(linalg::svd(&a, rng.chance(50))),
                typed(linalg::svdvals(&a)),
            ) {
                compared();
                let (sv, vv) = (values(&s.s), values(&v));
                if !close(
                    &sv,
                    &vv,
                    &sv.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
                    dt,
                ) {
                    return Err(format!("svd and svdvals differ: {sv:?} vs {vv:?}"));
                }
            }
        }
        6 => {
            typed(linalg::cholesky_inverse(&a, upper));
            let columns = rng.dim(3);
            let rhs = tensor(rng, &[m, columns], dt).map(|t| t.0);
            if let Some(rhs) = rhs {
                typed(linalg::cholesky_solve(&rhs, &a, upper));
            }
        }
        _ => {
            // P L U reproduces A (partial pivoting is backward stable: within the dtype's
            // bound of |P| |L| |U|).
            if let Some(lu) = typed(linalg::lu(&a)) {
                compared();
                let k = m.min(n);
                let count = batch.iter().product::<usize>();
                let (p, l, u) = (values(&lu.p), values(&lu.l), values(&lu.u));
                for i in 0..count {
                    let (pi, li, ui) = (
                        &p[i * m * m..][..m * m],
                        &l[i * m * k..][..m * k],
                        &u[i * k * n..][..k * n],
                    );
                    let got = product(pi, &product(li, ui, m, k, n), m, m, n);
                    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
                    let magnitude =
                        product(&abs(pi), &product(&abs(li), &abs(ui), m, k, n), m, m, n);
                    if !close(&got, &ah[i * m * n..][..m * n], &magnitude, dt) {
                        return Err(format!("P L U is not A for {shape:?} {dt}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether a view of `shape`, `strides`, `offset` reaches only elements `0..len` (and its
/// shape's row-major extent of f32s fits the address space, as every tensor's must).
fn fits(shape: &[usize], strides: &[usize], offset: usize, len: usize) -> bool {
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
fn borrow_case(rng: &mut Rng) -> Result<(), String> {
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

fn guards_case(rng: &mut Rng) -> Result<(), String> {
    use backends::{cuda, cudnn, opt_einsum};
    let before = (
        cuda::flash_sdp_enabled(),
        cuda::matmul::allow_tf32(),
        opt_einsum::enabled(),
    );
    {
        let _a = rng
            .chance(50)
            .then(|| sdpa_kernel_scoped(&[SdpBackend::Math], rng.chance(50)));
        let _b = rng.chance(50).then(|| {
            cudnn::flags_scoped(cudnn::Flags {
                enabled: Some(rng.chance(50)),
                deterministic: Some(rng.chance(50)),
                ..Default::default()
            })
        });
        let _c = rng
            .chance(50)
            .then(|| opt_einsum::flags_scoped(Some(rng.chance(50)), None));
        let _ = backends::set_num_threads(rng.below(3000));
        let spelling = ["highest", "HIGH", "medium", "low", ""][rng.below(5)];
        if let Ok(precision) = spelling.parse::<backends::Float32MatmulPrecision>() {
            let _p = backends::float32_matmul_precision_scoped(precision);
        }
    }
    backends::set_num_threads(2).map_err(|e| e.to_string())?;
    let after = (
        cuda::flash_sdp_enabled(),
        cuda::matmul::allow_tf32(),
        opt_einsum::enabled(),
    );
    compared();
    if before != after {
        return Err(format!("scoped guards left {after:?} (was {before:?})"));
    }
    Ok(())
}

/// The whole fuzz run, in a child process (an abort there fails this test).
#[test]
fn every_entry_point_gives_a_typed_error_or_the_reference() {
    if !in_child(
        "every_entry_point_gives_a_typed_error_or_the_reference",
        &[],
    ) {
        return;
    }
    // Each entry point must also have been checked on results, not only on errors.
    let cases: [(&str, Case); 13] = [
        ("tensor construction and views", construction_and_views),
        ("views and copies", views_case),
        ("matmul", matmul_case),
        ("linear", linear_case),
        ("scaled_dot_product_attention", sdpa_case),
        ("sdpa_varlen and sdpa_paged", serving_case),
        ("einsum", einsum_case),
        ("fft", fft_case),
        ("multi_head_attention_forward", mha_case),
        ("conv2d", conv_case),
        ("linalg", linalg_case),
        ("borrow_scope, copy_ and matmul_out", borrow_case),
        ("flag guards", guards_case),
    ];
    for (what, case) in cases {
        let checked = fuzz(what, case);
        assert!(
            checked > 0,
            "{what}: no result was compared with a reference"
        );
    }
}
