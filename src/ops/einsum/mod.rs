//! `einsum(equation, operands)` with `torch.einsum` semantics, contracted pairwise along
//! the path of [`crate::ops::einsum::path`] through the library's batched GEMM.
//!
//! Equations: letters `a-z` and `A-Z` label dimensions, `...` stands for broadcast
//! dimensions (aligned from the right), `->` names the output (without it the output is
//! every label used once, in ASCII order, after the `...` dimensions). A label repeated in
//! one operand takes its diagonal; a label absent from the output is summed. Sizes of a
//! label must agree, except that 1 broadcasts.
//!
//! Each pairwise step puts its operands in `[batch, free, contracted]` order and runs one
//! batched [`matmul`](crate::ops::matmul) on the operands' device in their dtype; the
//! rearrangements (diagonals, sums of a label only one operand holds, permutations) run on
//! the host.

pub mod path;

use crate::core::tensor::{checked_numel, contiguous_strides, host_zeros};
use crate::{DType, Device, Error, Result, Tensor};
use path::{ContractionPath, Indices, Problem, bits};

/// What einsum's errors name.
const OP: &str = "einsum";

/// The most dimensions `...` may stand for.
const MAX_ELLIPSIS: usize = 12;
/// Label ids: `A-Z` 0..26, `a-z` 26..52 (ASCII order), `...` dimensions 52..64.
const ELLIPSIS_BASE: u8 = 52;

/// A parsed equation, with each label's size.
struct Equation {
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
    sizes: [usize; 64],
}

fn malformed(equation: &str, why: impl Into<String>) -> Error {
    Error::InvalidArgument {
        what: "einsum equation",
        why: format!("{:?}: {}", equation, why.into()),
    }
}

fn label_id(c: char) -> Option<u8> {
    match c {
        'A'..='Z' => Some(c as u8 - b'A'),
        'a'..='z' => Some(c as u8 - b'a' + 26),
        _ => None,
    }
}

fn label_char(id: u8) -> String {
    match id {
        0..26 => char::from(b'A' + id).to_string(),
        26..52 => char::from(b'a' + id - 26).to_string(),
        _ => format!("...[{}]", id - ELLIPSIS_BASE),
    }
}

/// One side's terms: labels, and where `...` stands (its index among the labels).
type Term = (Vec<u8>, Option<usize>);

fn parse_term(equation: &str, text: &str) -> Result<Term> {
    let mut labels = Vec::new();
    let mut ellipsis = None;
    let mut rest = text.trim();
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("...") {
            if ellipsis.is_some() {
                return Err(malformed(equation, format!("`...` twice in {text:?}")));
            }
            ellipsis = Some(labels.len());
            rest = after;
        } else if let Some(id) = label_id(c) {
            labels.push(id);
            rest = &rest[1..];
        } else if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else {
            return Err(malformed(
                equation,
                format!("{c:?} is not a label: use letters a-z, A-Z and `...`"),
            ));
        }
    }
    Ok((labels, ellipsis))
}

fn parse(equation: &str, shapes: &[&[usize]]) -> Result<Equation> {
    let (lhs, rhs) = match equation.split_once("->") {
        Some((_, r)) if r.contains("->") => {
            return Err(malformed(equation, "`->` appears twice"));
        }
        Some((l, r)) => (l, Some(r)),
        None => (equation, None),
    };
    let terms: Vec<Term> = lhs
        .split(',')
        .map(|t| parse_term(equation, t))
        .collect::<Result<_>>()?;
    if terms.len() != shapes.len() {
        return Err(malformed(
            equation,
            format!(
                "it has {} operand terms but {} operands were given",
                terms.len(),
                shapes.len()
            ),
        ));
    }
    // How many dimensions `...` covers in each operand, and at most.
    let mut covers = Vec::with_capacity(terms.len());
    for ((labels, ellipsis), shape) in terms.iter().zip(shapes) {
        let extra = shape.len() as isize - labels.len() as isize;
        match ellipsis {
            None if extra != 0 => {
                return Err(Error::ShapeMismatch {
                    op: "einsum",
                    detail: format!(
                        "{equation:?}: a term with {} labels was given an operand of shape {shape:?}; \
                         the rank must equal the label count (or use `...`)",
                        labels.len()
                    ),
                });
            }
            Some(_) if extra < 0 => {
                return Err(Error::ShapeMismatch {
                    op: "einsum",
                    detail: format!(
                        "{equation:?}: a term with {} labels and `...` was given an operand of shape {shape:?}",
                        labels.len()
                    ),
                });
            }
            _ => covers.push(extra.max(0) as usize),
        }
    }
    let span = covers.iter().copied().max().unwrap_or(0);
    if span > MAX_ELLIPSIS {
        return Err(malformed(
            equation,
            format!("`...` covers {span} dimensions; at most {MAX_ELLIPSIS} are supported"),
        ));
    }
    let expand = |(labels, ellipsis): &Term, covered: usize| -> Vec<u8> {
        let mut out = labels.clone();
        if let Some(at) = ellipsis {
            let dims = (span - covered..span).map(|i| ELLIPSIS_BASE + i as u8);
            out.splice(at..at, dims);
        }
        out
    };
    let inputs: Vec<Vec<u8>> = terms
        .iter()
        .zip(&covers)
        .map(|(t, &c)| expand(t, c))
        .collect();
    let mut sizes = [1usize; 64];
    let mut seen = [false; 64];
    for (labels, shape) in inputs.iter().zip(shapes) {
        for (&label, &size) in labels.iter().zip(shape.iter()) {
            let l = label as usize;
            if seen[l] && sizes[l] != size && sizes[l] != 1 && size != 1 {
                return Err(Error::ShapeMismatch {
                    op: "einsum",
                    detail: format!(
                        "{equation:?}: label {} has size {} in one place and {size} in another; sizes must match (or be 1)",
                        label_char(label),
                        sizes[l]
                    ),
                });
            }
            // 1 broadcasts to any size, 0 included.
            if !seen[l] || sizes[l] == 1 {
                sizes[l] = size;
            }
            seen[l] = true;
        }
    }
    let output = match rhs {
        Some(text) => {
            let term = parse_term(equation, text)?;
            let out = expand(&term, span);
            for (i, &label) in out.iter().enumerate() {
                if out[..i].contains(&label) {
                    return Err(malformed(
                        equation,
                        format!("output label {} appears twice", label_char(label)),
                    ));
                }
                if !seen[label as usize] && label < ELLIPSIS_BASE {
                    return Err(malformed(
                        equation,
                        format!("output label {} is in no operand", label_char(label)),
                    ));
                }
            }
            out
        }
        None => {
            let count = |l: u8| inputs.iter().flatten().filter(|&&x| x == l).count();
            let mut out: Vec<u8> = (ELLIPSIS_BASE..ELLIPSIS_BASE + span as u8).collect();
            out.extend((0..ELLIPSIS_BASE).filter(|&l| count(l) == 1));
            out
        }
    };
    Ok(Equation {
        inputs,
        output,
        sizes,
    })
}

fn set_of(labels: &[u8]) -> Indices {
    labels.iter().fold(0, |acc, &l| acc | 1 << l)
}

impl Equation {
    fn problem(&self, sets: &[Indices]) -> ContractionPath {
        let problem = Problem {
            inputs: sets,
            output: set_of(&self.output),
            sizes: &self.sizes,
        };
        problem.plan(path::enabled(), path::strategy())
    }
}

/// The contraction path `einsum` would take for `equation` on operands of `shapes`, with
/// the current [`opt_einsum`] settings, and its cost.
pub fn einsum_path(equation: &str, shapes: &[&[usize]]) -> Result<ContractionPath> {
    let eq = parse(equation, shapes)?;
    let sets: Vec<Indices> = eq.inputs.iter().map(|l| set_of(l)).collect();
    Ok(eq.problem(&sets))
}

/// An operand on the host: row-major f64 values, one distinct label per dimension.
struct Operand {
    values: Vec<f64>,
    labels: Vec<u8>,
}

impl Operand {
    fn shape(&self, sizes: &[usize; 64]) -> Vec<usize> {
        self.labels.iter().map(|&l| sizes[l as usize]).collect()
    }

    /// From raw labels (maybe repeated, maybe size-1 broadcast dims): takes diagonals and
    /// broadcasts to the full sizes.
    fn new(values: Vec<f64>, shape: &[usize], raw: &[u8], sizes: &[usize; 64]) -> Result<Operand> {
        let mut labels: Vec<u8> = Vec::new();
        for &l in raw {
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        let raw_strides = contiguous_strides(shape);
        let strides: Vec<usize> = labels
            .iter()
            .map(|&l| {
                raw.iter()
                    .zip(shape)
                    .zip(&raw_strides)
                    .filter(|((x, size), _)| **x == l && **size > 1)
                    .map(|(_, s)| s)
                    .sum()
            })
            .collect();
        let out_shape: Vec<usize> = labels.iter().map(|&l| sizes[l as usize]).collect();
        Ok(Operand {
            values: gather(&values, &strides, &out_shape)?,
            labels,
        })
    }

    /// Sums away every label not in `keep`.
    fn reduce(self, keep: Indices, sizes: &[usize; 64]) -> Result<Operand> {
        if self.labels.iter().all(|&l| keep >> l & 1 == 1) {
            return Ok(self);
        }
        let labels: Vec<u8> = self
            .labels
            .iter()
            .copied()
            .filter(|&l| keep >> l & 1 == 1)
            .collect();
        let kept_shape: Vec<usize> = labels.iter().map(|&l| sizes[l as usize]).collect();
        let kept_strides = contiguous_strides(&kept_shape);
        let to: Vec<usize> = self
            .labels
            .iter()
            .map(|l| {
                labels
                    .iter()
                    .position(|x| x == l)
                    .map_or(0, |i| kept_strides[i])
            })
            .collect();
        let mut values = host_zeros(OP, elements(&kept_shape)?)?;
        let shape = self.shape(sizes);
        for_each_index(&shape, &to, |i, at| values[at] += self.values[i]);
        Ok(Operand { values, labels })
    }

    /// Its values with the dimensions in `order` (a permutation of its labels).
    fn permuted(&self, order: &[u8], sizes: &[usize; 64]) -> Result<Vec<f64>> {
        let strides = contiguous_strides(&self.shape(sizes));
        let by_label: Vec<usize> = order
            .iter()
            .map(|l| {
                strides[self
                    .labels
                    .iter()
                    .position(|x| x == l)
                    .expect("a permutation")]
            })
            .collect();
        let shape: Vec<usize> = order.iter().map(|&l| sizes[l as usize]).collect();
        gather(&self.values, &by_label, &shape)
    }
}

/// The element count of an operand or intermediate (f64) of `shape`, or a typed error where
/// its extent overflows the address space.
fn elements(shape: &[usize]) -> Result<usize> {
    checked_numel(OP, shape, DType::F64)
}

/// Calls `f(linear index, Σ index·strides)` for every index of `shape` in row-major order.
fn for_each_index(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize, usize)) {
    let n: usize = shape.iter().product();
    let mut index = vec![0usize; shape.len()];
    let mut at = 0;
    for i in 0..n {
        f(i, at);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            at += strides[d];
            if index[d] < shape[d] {
                break;
            }
            at -= strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

/// The row-major elements of `shape` read from `values` at `Σ index·strides`.
fn gather(values: &[f64], strides: &[usize], shape: &[usize]) -> Result<Vec<f64>> {
    let mut out = host_zeros(OP, elements(shape)?)?;
    for_each_index(shape, strides, |i, at| out[i] = values[at]);
    Ok(out)
}

/// Contracts `a` and `b` with one batched GEMM on `device` in `dtype`, keeping the
/// labels in `keep`.
fn contract(
    a: Operand,
    b: Operand,
    keep: Indices,
    sizes: &[usize; 64],
    dtype: DType,
    device: Device,
) -> Result<Operand> {
    let (sa, sb) = (set_of(&a.labels), set_of(&b.labels));
    // A label only one side holds and nothing later needs is summed first.
    let a = a.reduce(keep | sb, sizes)?;
    let b = b.reduce(keep | sa, sizes)?;
    let (sa, sb) = (set_of(&a.labels), set_of(&b.labels));
    let pick = |set: Indices| -> Vec<u8> { bits(set).map(|l| l as u8).collect() };
    let batch = pick(sa & sb & keep);
    let inner = pick(sa & sb & !keep);
    let (m, n) = (pick(sa & !sb), pick(sb & !sa));
    let count = |labels: &[u8]| {
        elements(
            &labels
                .iter()
                .map(|&l| sizes[l as usize])
                .collect::<Vec<_>>(),
        )
    };
    let (bt, mm, nn, kk) = (count(&batch)?, count(&m)?, count(&n)?, count(&inner)?);
    let cat = |parts: [&[u8]; 3]| parts.concat();
    let left = Tensor::from_f64(
        &a.permuted(&cat([&batch, &m, &inner]), sizes)?,
        &[bt, mm, kk],
        dtype,
        device,
    )?;
    let right = Tensor::from_f64(
        &b.permuted(&cat([&batch, &inner, &n]), sizes)?,
        &[bt, kk, nn],
        dtype,
        device,
    )?;
    let product = crate::matmul(&left, &right)?;
    Ok(Operand {
        values: product.to_f64()?,
        labels: cat([&batch, &m, &n]),
    })
}

/// `torch.einsum(equation, *operands)`: see the module docs for the equation syntax. The
/// operands share one dtype (a float type) and one device; the result has them too.
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = operands.first() else {
        return Err(malformed(equation, "einsum needs at least one operand"));
    };
    let (dtype, device) = (first.dtype(), first.device());
    for t in operands {
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op: "einsum",
                expected: dtype,
                got: t.dtype(),
            });
        }
        if t.device() != device {
            return Err(Error::DeviceMismatch {
                op: "einsum",
                a: device,
                b: t.device(),
            });
        }
    }
    if !dtype.is_float() {
        return Err(Error::DTypeMismatch {
            op: "einsum",
            expected: DType::F32,
            got: dtype,
        });
    }
    let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape()).collect();
    let eq = parse(equation, &shapes)?;
    let mut ops: Vec<Operand> = operands
        .iter()
        .zip(&eq.inputs)
        .map(|(t, raw)| Operand::new(t.to_f64()?, t.shape(), raw, &eq.sizes))
        .collect::<Result<_>>()?;
    let sets: Vec<Indices> = ops.iter().map(|o| set_of(&o.labels)).collect();
    let plan = eq.problem(&sets);
    let output = set_of(&eq.output);
    for step in plan.path.iter().filter(|s| s.len() == 2) {
        let (i, j) = (step[0], step[1]);
        let b = ops.remove(j);
        let a = ops.remove(i);
        let others = ops.iter().fold(0, |acc, o| acc | set_of(&o.labels));
        ops.push(contract(a, b, output | others, &eq.sizes, dtype, device)?);
    }
    let last = ops
        .pop()
        .expect("the path leaves one operand")
        .reduce(output, &eq.sizes)?;
    let shape: Vec<usize> = eq.output.iter().map(|&l| eq.sizes[l as usize]).collect();
    Tensor::from_f64(
        &last.permuted(&eq.output, &eq.sizes)?,
        &shape,
        dtype,
        device,
    )
}
