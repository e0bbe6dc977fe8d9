//! Views: tensors that share another tensor's storage with a new shape, strides or offset,
//! with PyTorch's names and semantics. None of these copies; [`Tensor::reshape`] and
//! [`Tensor::contiguous`] (which may) live with the other copies in `runtime::transfer`.
//!
//! Every view stays inside the elements its source could reach (ranges are checked, new
//! strides are 0 or derived from the source's), so kernels may trust a view's layout.

use crate::core::tensor::{Tensor, checked_numel};
use crate::{Error, Result};

fn bad_view(op: &'static str, detail: String) -> Error {
    Error::ShapeMismatch { op, detail }
}

/// `dim` checked against `rank` (one more where a dimension is inserted).
fn check_dim(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim < rank {
        Ok(())
    } else {
        Err(bad_view(
            op,
            format!("dimension {dim} is out of range for this {op} of a tensor (valid: 0..{rank})"),
        ))
    }
}

/// The strides that show elements laid out with `strides` over `shape` as `new_shape`
/// (same element count) without moving them, or `None` where no strides can. Each run of
/// dimensions that is contiguous in memory (a "chunk") may be split or merged freely;
/// a new dimension may not span two chunks.
pub(crate) fn view_strides(
    shape: &[usize],
    strides: &[usize],
    new_shape: &[usize],
) -> Option<Vec<usize>> {
    let mut new_strides = vec![0; new_shape.len()];
    if shape.iter().product::<usize>() == 0 {
        // No element to keep in place: any strides do; take row-major ones.
        return Some(crate::core::tensor::contiguous_strides(new_shape));
    }
    // A scalar is one chunk of one element.
    let (shape, strides) = if shape.is_empty() {
        (&[1][..], &[1][..])
    } else {
        (shape, strides)
    };
    // Walk both shapes from the innermost dimension, one chunk of the old layout at a
    // time; the new dimensions covering a chunk take strides from its innermost stride.
    let mut next_new = new_shape.len();
    let mut chunk_stride = strides[strides.len() - 1];
    let (mut chunk_elements, mut covered) = (1usize, 1usize);
    for d in (0..shape.len()).rev() {
        chunk_elements *= shape[d];
        let chunk_ends =
            d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunk_elements * chunk_stride);
        if !chunk_ends {
            continue;
        }
        while next_new > 0 && (covered < chunk_elements || new_shape[next_new - 1] == 1) {
            next_new -= 1;
            new_strides[next_new] = covered * chunk_stride;
            covered *= new_shape[next_new];
        }
        if covered != chunk_elements {
            return None;
        }
        if d > 0 {
            chunk_stride = strides[d - 1];
            chunk_elements = 1;
            covered = 1;
        }
    }
    (next_new == 0).then_some(new_strides)
}

impl Tensor {
    /// The same elements as `shape` (same element count) without a copy, as PyTorch's
    /// `view`: a typed error where the strides do not allow it (then use
    /// [`Tensor::reshape`], which copies).
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        let count = checked_numel("view", shape, self.dtype())?;
        if count != self.numel() {
            return Err(bad_view(
                "view",
                format!(
                    "shape {shape:?} has {count} elements; the tensor {:?} has {}",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        let strides = view_strides(self.shape(), self.strides(), shape).ok_or_else(|| {
            bad_view(
                "view",
                format!(
                    "a tensor of shape {:?} and strides {:?} cannot be seen as {shape:?} without \
                     a copy; use reshape (or contiguous() first)",
                    self.shape(),
                    self.strides()
                ),
            )
        })?;
        Ok(self.with_layout(shape.to_vec(), strides, self.offset()))
    }

    /// The dimensions reordered: dimension `i` of the view is dimension `dims[i]` of this.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let rank = self.shape().len();
        let mut seen = vec![false; rank];
        let valid = dims.len() == rank
            && dims
                .iter()
                .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
        if !valid {
            return Err(bad_view(
                "permute",
                format!("{dims:?} is not a permutation of the {rank} dimensions 0..{rank}"),
            ));
        }
        let shape = dims.iter().map(|&d| self.shape()[d]).collect();
        let strides = dims.iter().map(|&d| self.strides()[d]).collect();
        Ok(self.with_layout(shape, strides, self.offset()))
    }

    /// Elements `start..start + length` of dimension `dim`.
    pub fn narrow(&self, dim: usize, start: usize, length: usize) -> Result<Tensor> {
        check_dim("narrow", dim, self.shape().len())?;
        let size = self.shape()[dim];
        if start.checked_add(length).is_none_or(|end| end > size) {
            return Err(bad_view(
                "narrow",
                format!(
                    "elements {start}..{start}+{length} of dimension {dim} exceed its size {size}"
                ),
            ));
        }
        let mut shape = self.shape().to_vec();
        shape[dim] = length;
        // Inside the tensor's extent, which fits the address space.
        let offset = self.offset() + start * self.strides()[dim];
        Ok(self.with_layout(shape, self.strides().to_vec(), offset))
    }

    /// Index `index` of dimension `dim`, which the view drops.
    pub fn select(&self, dim: usize, index: usize) -> Result<Tensor> {
        check_dim("select", dim, self.shape().len())?;
        if index >= self.shape()[dim] {
            return Err(bad_view(
                "select",
                format!(
                    "index {index} is out of range for dimension {dim} of size {}",
                    self.shape()[dim]
                ),
            ));
        }
        let offset = self.offset() + index * self.strides()[dim];
        let (mut shape, mut strides) = (self.shape().to_vec(), self.strides().to_vec());
        shape.remove(dim);
        strides.remove(dim);
        Ok(self.with_layout(shape, strides, offset))
    }

    /// The tensor broadcast to `shape` (stride 0 along the new and the size-1 dimensions),
    /// as PyTorch's `expand`: leading dimensions may be added, a size-1 dimension takes any
    /// size, the others keep theirs.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        let rank = self.shape().len();
        let fits = shape.len() >= rank
            && self
                .shape()
                .iter()
                .zip(&shape[shape.len() - rank..])
                .all(|(&have, &want)| have == want || have == 1);
        if !fits {
            return Err(bad_view(
                "expand",
                format!(
                    "a tensor of shape {:?} cannot be expanded to {shape:?}: only size-1 \
                     dimensions (and new leading ones) take a new size",
                    self.shape()
                ),
            ));
        }
        checked_numel("expand", shape, self.dtype())?;
        let added = shape.len() - rank;
        let strides = (0..shape.len())
            .map(|d| match d.checked_sub(added) {
                Some(own) if self.shape()[own] == shape[d] => self.strides()[own],
                _ => 0,
            })
            .collect();
        Ok(self.with_layout(shape.to_vec(), strides, self.offset()))
    }

    /// A size-1 dimension inserted at `dim` (`0..=rank`).
    pub fn unsqueeze(&self, dim: usize) -> Result<Tensor> {
        check_dim("unsqueeze", dim, self.shape().len() + 1)?;
        let (mut shape, mut strides) = (self.shape().to_vec(), self.strides().to_vec());
        let stride = strides.get(dim).map_or(1, |&s| s * shape[dim].max(1));
        shape.insert(dim, 1);
        strides.insert(dim, stride);
        Ok(self.with_layout(shape, strides, self.offset()))
    }

    /// Dimension `dim` removed if its size is 1 (else the same view, as PyTorch's
    /// `squeeze(dim)`).
    pub fn squeeze(&self, dim: usize) -> Result<Tensor> {
        check_dim("squeeze", dim, self.shape().len())?;
        if self.shape()[dim] != 1 {
            return Ok(self.clone());
        }
        let (mut shape, mut strides) = (self.shape().to_vec(), self.strides().to_vec());
        shape.remove(dim);
        strides.remove(dim);
        Ok(self.with_layout(shape, strides, self.offset()))
    }
}

#[cfg(test)]
mod tests {
    use super::view_strides;

    #[test]
    fn views_split_and_merge_within_contiguous_chunks() {
        // Row-major [2, 3, 4]: any regrouping is a view.
        assert_eq!(
            view_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]),
            Some(vec![4, 1])
        );
        assert_eq!(view_strides(&[2, 3, 4], &[12, 4, 1], &[24]), Some(vec![1]));
        assert_eq!(
            view_strides(&[2, 3, 4], &[12, 4, 1], &[2, 1, 12]),
            Some(vec![12, 12, 1])
        );
        // The transpose of a [3, 4]: its two dimensions are separate chunks.
        assert_eq!(view_strides(&[4, 3], &[1, 4], &[12]), None);
        assert_eq!(
            view_strides(&[4, 3], &[1, 4], &[2, 2, 3]),
            Some(vec![2, 1, 4])
        );
        // A narrowed row-major [4, 8] (columns 0..4): rows stay apart.
        assert_eq!(view_strides(&[4, 4], &[8, 1], &[16]), None);
        assert_eq!(
            view_strides(&[4, 4], &[8, 1], &[4, 2, 2]),
            Some(vec![8, 2, 1])
        );
        // Broadcast dimensions split but do not merge with others.
        assert_eq!(
            view_strides(&[3, 4], &[0, 1], &[3, 2, 2]),
            Some(vec![0, 2, 1])
        );
        assert_eq!(view_strides(&[3, 4], &[0, 1], &[12]), None);
        // Scalars and empty tensors.
        assert_eq!(view_strides(&[], &[], &[1, 1]), Some(vec![1, 1]));
        assert_eq!(view_strides(&[0, 3], &[3, 1], &[3, 0]), Some(vec![1, 1]));
    }
}
