//! `einsum(equation, operands)` with `torch.einsum` semantics, contracted pairwise along
//! the path of [`crate::ops::einsum::path`] through the library's batched GEMM.
//!
//! Equations: letters `a-z` and `A-Z` label dimensions, `...` stands for broadcast
//! dimensions (aligned from the right), `->` names the output (without it the output is
//! every label used once, in ASCII order, after the `...` dimensions). A label repeated in
//! one operand takes its diagonal; a label absent from the output is summed. Sizes of a
//! label must agree, except that 1 broadcasts.
//!
//! Everything stays in the operands' dtype on their device. Diagonals, broadcasts and
//! permutations are views; each pairwise step views its operands as `[batch, free,
//! contracted]` matrices (one contiguous copy of an operand only where its strides cannot
//! be grouped that way) and runs one batched [`matmul`](crate::ops::matmul); a label only
//! one operand holds is summed by a product with a row of ones; the result is made
//! contiguous once, in the output's order.

pub mod path;

use crate::core::tensor::checked_numel;
use crate::core::view::view_strides;
use crate::{DType, Error, Result, Tensor};
use path::{ContractionPath, Indices, Problem};

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
/// the current [`crate::opt_einsum`] settings, and its cost.
pub fn einsum_path(equation: &str, shapes: &[&[usize]]) -> Result<ContractionPath> {
    let eq = parse(equation, shapes)?;
    let sets: Vec<Indices> = eq.inputs.iter().map(|l| set_of(l)).collect();
    Ok(eq.problem(&sets))
}

/// An operand during the contraction: a view of a tensor (no copy) whose dimensions carry
/// distinct labels, each at its label's full size (diagonals taken, size-1 dimensions
/// broadcast with stride 0).
struct Operand {
    tensor: Tensor,
    labels: Vec<u8>,
}

impl Operand {
    /// From an input with raw labels (maybe repeated, maybe size-1 broadcast dimensions).
    fn new(t: &Tensor, raw: &[u8], sizes: &[usize; 64]) -> Operand {
        let mut labels: Vec<u8> = Vec::new();
        for &l in raw {
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        // A repeated label walks the diagonal: the sum of its dimensions' strides (which
        // stays inside the tensor, every such dimension having the label's size); a size-1
        // dimension adds nothing, so alone it broadcasts.
        let strides = labels
            .iter()
            .map(|&l| {
                raw.iter()
                    .zip(t.shape().iter().zip(t.strides()))
                    .filter(|(x, (size, _))| **x == l && **size > 1)
                    .map(|(_, (_, stride))| stride)
                    .sum()
            })
            .collect();
        let shape = labels.iter().map(|&l| sizes[l as usize]).collect();
        Operand {
            tensor: t.with_layout(shape, strides, t.offset()),
            labels,
        }
    }

    fn set(&self) -> Indices {
        set_of(&self.labels)
    }

    /// The view with its dimensions in the order of `labels` (a permutation of its own).
    fn permuted(&self, labels: &[u8]) -> Result<Tensor> {
        let dims: Vec<usize> = labels
            .iter()
            .map(|l| {
                self.labels
                    .iter()
                    .position(|x| x == l)
                    .expect("a permutation of the operand's labels")
            })
            .collect();
        self.tensor.permute(&dims)
    }

    /// Its labels that are in `set`, in its own order.
    fn labels_in(&self, set: Indices) -> Vec<u8> {
        self.labels
            .iter()
            .copied()
            .filter(|&l| set >> l & 1 == 1)
            .collect()
    }

    /// Sums away every label not in `keep`: one product with a row of ones,
    /// `[1, summed] x [summed, kept]`.
    fn reduce(self, keep: Indices, sizes: &[usize; 64]) -> Result<Operand> {
        let summed = self.labels_in(!keep);
        if summed.is_empty() {
            return Ok(self);
        }
        let kept = self.labels_in(keep);
        let (rows, columns) = (count(&summed, sizes)?, count(&kept, sizes)?);
        let values = self
            .permuted(&[summed, kept.clone()].concat())?
            .reshape(&[rows, columns])?;
        let (dtype, device) = (self.tensor.dtype(), self.tensor.device());
        let ones = Tensor::from_f64(&[1.0], &[1, 1], dtype, device)?.expand(&[1, rows])?;
        let sum = crate::matmul(&ones, &values)?;
        Ok(Operand {
            tensor: sum.view(&shape_of(&kept, sizes))?,
            labels: kept,
        })
    }
}

/// The sizes of `labels`.
fn shape_of(labels: &[u8], sizes: &[usize; 64]) -> Vec<usize> {
    labels.iter().map(|&l| sizes[l as usize]).collect()
}

/// The element count of `labels`' dimensions, or a typed error where it overflows.
fn count(labels: &[u8], sizes: &[usize; 64]) -> Result<usize> {
    checked_numel(OP, &shape_of(labels, sizes), DType::F64)
}

/// Contracts `a` and `b` with one batched GEMM, keeping the labels in `keep`: each side is
/// viewed as `[batch, free, contracted]` (a copy only where its strides cannot be grouped
/// so), and the product `[batch, free a, free b]` is the new operand.
fn contract(a: Operand, b: Operand, keep: Indices, sizes: &[usize; 64]) -> Result<Operand> {
    // A label only one side holds and nothing later needs is summed first.
    let (sa, sb) = (a.set(), b.set());
    let a = a.reduce(keep | sb, sizes)?;
    let b = b.reduce(keep | sa, sizes)?;
    let (sa, sb) = (a.set(), b.set());
    // Labels both sides share take the larger operand's memory order, so that it is the
    // one more likely to be seen as a matrix without a copy.
    let larger = if a.tensor.numel() >= b.tensor.numel() {
        &a
    } else {
        &b
    };
    let batch = larger.labels_in(sa & sb & keep);
    let inner = larger.labels_in(sa & sb & !keep);
    let (free_a, free_b) = (a.labels_in(sa & !sb), b.labels_in(sb & !sa));
    // Without shared kept labels, a side whose free labels cannot be grouped with its
    // contracted ones lends its outer free labels as the product's batch, over which the
    // other side is broadcast: a batch of GEMMs instead of a copy of that side.
    if batch.is_empty() {
        if let Some((outer, rest)) = lendable_batch(&b, &free_b, &inner, false, sizes) {
            let left = matrix(&a, [&[], &free_a, &inner], sizes)?;
            let right = matrix(&b, [&outer, &inner, &rest], sizes)?;
            return product(&left, &right, [outer, free_a, rest].concat(), sizes);
        }
        if let Some((outer, rest)) = lendable_batch(&a, &free_a, &inner, true, sizes) {
            let left = matrix(&a, [&outer, &rest, &inner], sizes)?;
            let right = matrix(&b, [&[], &inner, &free_b], sizes)?;
            return product(&left, &right, [outer, rest, free_b].concat(), sizes);
        }
    }
    let left = matrix(&a, [&batch, &free_a, &inner], sizes)?;
    let right = matrix(&b, [&batch, &inner, &free_b], sizes)?;
    product(&left, &right, [batch, free_a, free_b].concat(), sizes)
}

/// `operand` as a `[batch, rows, columns]` matrix of the three label groups: a view where
/// its strides allow, else a contiguous copy.
fn matrix(operand: &Operand, groups: [&[u8]; 3], sizes: &[usize; 64]) -> Result<Tensor> {
    let [batch, rows, columns] = groups.map(|g| count(g, sizes));
    operand
        .permuted(&groups.concat())?
        .reshape(&[batch?, rows?, columns?])
}

/// The batched product of two matrices, viewed with `labels` (batch, then rows, then
/// columns).
fn product(left: &Tensor, right: &Tensor, labels: Vec<u8>, sizes: &[usize; 64]) -> Result<Operand> {
    let tensor = crate::matmul(left, right)?.view(&shape_of(&labels, sizes))?;
    Ok(Operand { tensor, labels })
}

/// For a side that would need a copy to become a matrix of its free and contracted labels
/// (`free_first`: rows are the free labels, as the left side), its free labels that lie
/// outside every contracted one in memory (`outer`) and the rest, where `[outer, matrix of
/// the rest]` is a view.
fn lendable_batch(
    operand: &Operand,
    free: &[u8],
    inner: &[u8],
    free_first: bool,
    sizes: &[usize; 64],
) -> Option<(Vec<u8>, Vec<u8>)> {
    let grouped = |outer: &[u8], rest: &[u8]| {
        let (rows, columns): (&[u8], &[u8]) = if free_first {
            (rest, inner)
        } else {
            (inner, rest)
        };
        let order = [outer, rows, columns].concat();
        let view = operand.permuted(&order).ok()?;
        let shape = [outer, rows, columns].map(|g| g.iter().map(|&l| sizes[l as usize]).product());
        view_strides(view.shape(), view.strides(), &shape)
    };
    if grouped(&[], free).is_some() {
        return None;
    }
    let stride = |l: u8| {
        let dim = operand.labels.iter().position(|&x| x == l)?;
        Some(operand.tensor.strides()[dim])
    };
    let widest_inner = inner.iter().filter_map(|&l| stride(l)).max()?;
    let (outer, rest): (Vec<u8>, Vec<u8>) = free
        .iter()
        .partition(|&&l| stride(l).is_some_and(|s| s > widest_inner));
    (!outer.is_empty() && grouped(&outer, &rest).is_some()).then_some((outer, rest))
}

/// [`einsum`] written into `out`, a CPU tensor of the result's shape and dtype (such as a
/// [`crate::BorrowScope::borrow_mut`] over caller memory).
pub fn einsum_out(equation: &str, operands: &[&Tensor], out: &Tensor) -> Result<()> {
    crate::ops::copy::write_out("einsum_out", &einsum(equation, operands)?, out)
}

/// `torch.einsum(equation, *operands)`: see the module docs for the equation syntax. The
/// operands share one dtype (a float type) and one device; the result has them too.
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = operands.first() else {
        return Err(malformed(equation, "einsum needs at least one operand"));
    };
    first.check_same_kind("einsum", operands.iter().copied())?;
    let dtype = first.dtype();
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
        .map(|(t, raw)| Operand::new(t, raw, &eq.sizes))
        .collect();
    let sets: Vec<Indices> = ops.iter().map(Operand::set).collect();
    let plan = eq.problem(&sets);
    let output = set_of(&eq.output);
    for step in plan.path.iter().filter(|s| s.len() == 2) {
        let (i, j) = (step[0], step[1]);
        let b = ops.remove(j);
        let a = ops.remove(i);
        let others = ops.iter().fold(0, |acc, o| acc | o.set());
        ops.push(contract(a, b, output | others, &eq.sizes)?);
    }
    let last = ops
        .pop()
        .expect("the path leaves one operand")
        .reduce(output, &eq.sizes)?;
    last.permuted(&eq.output)?.contiguous()
}
