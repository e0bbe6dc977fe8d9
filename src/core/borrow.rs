//! Tensors over caller memory, without a copy: [`borrow_scope`] lends `&[T]` and `&mut [T]`
//! slices to CPU tensors for the length of one closure call. The tensors (and their views
//! and clones) read the caller's elements in place; those over `&mut` slices can also be
//! written, by [`Tensor::copy_`] and the `*_out` forms (`matmul_out`, `sdpa_out`, ...).
//!
//! The compiler checks the lending: each slice stays borrowed until `borrow_scope`
//! returns. When it returns (or unwinds), the scope waits for any kernel still using the
//! memory and cuts every tensor it made off from it; a clone kept past the scope gets
//! [`Error::Borrow`](crate::Error::Borrow) on use, never the caller's memory.
//!
//! ```
//! use backends::{Device, Tensor, borrow_scope, matmul_out};
//! let a = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
//! let b = vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
//! let mut c = vec![0.0f32; 4];
//! borrow_scope(|scope| {
//!     let a = scope.borrow(&a, &[2, 3])?;
//!     let b = scope.borrow(&b, &[3, 2])?;
//!     let c = scope.borrow_mut(&mut c, &[2, 2])?;
//!     matmul_out(&a, &b, &c)
//! })?;
//! assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
//! # Ok::<(), backends::Error>(())
//! ```
//!
//! The slices stay lent for the whole scope, so the caller cannot change them under a
//! kernel:
//!
//! ```compile_fail
//! let mut cache = vec![0.0f32; 4];
//! backends::borrow_scope(|scope| {
//!     let k = scope.borrow(&cache, &[4]).unwrap();
//!     cache[0] = 1.0; // error: `cache` is borrowed until the scope ends
//!     drop(k);
//! });
//! ```
//!
//! and the scope itself cannot leave its closure:
//!
//! ```compile_fail
//! let scope = backends::borrow_scope(|scope| scope); // error: the reference cannot escape
//! ```

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::core::tensor::{HostMemory, Storage, checked_numel};
use crate::{Device, Element, Error, Result, Tensor};

/// Lends caller slices to tensors until [`borrow_scope`] returns; see the module docs.
pub struct BorrowScope<'env> {
    /// The storages lent so far, cut off when the scope ends.
    lent: parking_lot::Mutex<Vec<Tensor>>,
    /// Invariant in `'env`: the slices live at least as long as the scope's call.
    _env: PhantomData<&'env mut &'env ()>,
}

/// Runs `f` with a [`BorrowScope`] whose tensors view caller memory in place; when `f`
/// returns or unwinds, every tensor of the scope stops reading that memory (see the module
/// docs). Returns what `f` returns.
pub fn borrow_scope<'env, R>(f: impl FnOnce(&BorrowScope<'env>) -> R) -> R {
    let scope = BorrowScope {
        lent: parking_lot::Mutex::new(Vec::new()),
        _env: PhantomData,
    };
    f(&scope)
    // `scope` drops here, on return and on unwinding alike, and ends its borrows.
}

impl Drop for BorrowScope<'_> {
    fn drop(&mut self) {
        for tensor in self.lent.get_mut().drain(..) {
            if let Some(memory) = tensor.host_memory() {
                memory.end_borrow();
            }
        }
    }
}

impl<'env> BorrowScope<'env> {
    /// A row-major CPU tensor of `shape` over `data` (exactly its element count).
    pub fn borrow<T: Element>(&self, data: &'env [T], shape: &[usize]) -> Result<Tensor> {
        let strides = row_major::<T>("borrow", data.len(), shape)?;
        self.lend(NonNull::from(data), false, shape, &strides, 0)
    }

    /// A CPU tensor of `shape` with element `strides` starting `offset` elements into
    /// `data` (a `[B, L, H, D]` cache seen as `[B, H, L, D]`, a slice of a packed QKV
    /// buffer); every element it reaches must lie in `data`.
    pub fn borrow_strided<T: Element>(
        &self,
        data: &'env [T],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor> {
        self.lend(NonNull::from(data), false, shape, strides, offset)
    }

    /// A writable row-major CPU tensor of `shape` over `data`: the destination of
    /// [`Tensor::copy_`] and the `*_out` forms, readable as an input too.
    pub fn borrow_mut<T: Element>(&self, data: &'env mut [T], shape: &[usize]) -> Result<Tensor> {
        let strides = row_major::<T>("borrow_mut", data.len(), shape)?;
        self.lend(NonNull::from(data), true, shape, &strides, 0)
    }

    /// A writable strided CPU tensor over `data` (as [`BorrowScope::borrow_strided`]).
    pub fn borrow_mut_strided<T: Element>(
        &self,
        data: &'env mut [T],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor> {
        self.lend(NonNull::from(data), true, shape, strides, offset)
    }

    /// The tensor over `data` (writable where `data` came from a `&mut`, and then a
    /// pointer with the `&mut`'s write permission), remembered so that the scope's end cuts
    /// it off.
    fn lend<T: Element>(
        &self,
        data: NonNull<[T]>,
        writable: bool,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor> {
        let op = if writable { "borrow_mut" } else { "borrow" };
        check_layout(op, data.len(), shape, strides, offset, T::DTYPE)?;
        let memory = HostMemory::borrowed(T::DTYPE, data.cast::<u8>(), data.len(), writable);
        let tensor = Tensor::from_storage(Storage::Host(memory), T::DTYPE, Device::Cpu, &[])
            .with_layout(shape.to_vec(), strides.to_vec(), offset);
        self.lent.lock().push(tensor.clone());
        Ok(tensor)
    }
}

/// The row-major strides of `shape`, where a slice of `len` elements of `T` holds exactly
/// that shape.
fn row_major<T: Element>(op: &'static str, len: usize, shape: &[usize]) -> Result<Vec<usize>> {
    let numel = checked_numel(op, shape, T::DTYPE)?;
    if len == numel {
        return Ok(crate::core::tensor::contiguous_strides(shape));
    }
    Err(Error::ShapeMismatch {
        op,
        detail: format!(
            "a slice of {len} elements cannot be seen as shape {shape:?} ({numel} elements); \
             pass a slice of that length, or give strides and an offset with the strided form"
        ),
    })
}

/// Checks that a view of `shape`, `strides` and `offset` reaches only elements `0..len`.
pub(crate) fn check_layout(
    op: &'static str,
    len: usize,
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    dtype: crate::DType,
) -> Result<()> {
    let bad = |detail: String| Err(Error::ShapeMismatch { op, detail });
    if strides.len() != shape.len() {
        return bad(format!(
            "{} strides for the {} dimensions of shape {shape:?}; give one stride per dimension",
            strides.len(),
            shape.len()
        ));
    }
    let numel = checked_numel(op, shape, dtype)?;
    if numel == 0 {
        return if offset <= len {
            Ok(())
        } else {
            bad(format!(
                "offset {offset} lies past the slice's {len} elements"
            ))
        };
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(offset, |at, (&size, &stride)| {
            (size - 1)
                .checked_mul(stride)
                .and_then(|step| at.checked_add(step))
        });
    match last {
        Some(last) if last < len => Ok(()),
        _ => bad(format!(
            "shape {shape:?} with strides {strides:?} from offset {offset} reaches past the \
             slice's {len} elements; check the layout against the slice"
        )),
    }
}
