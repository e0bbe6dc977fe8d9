//! Rounding f32 results to the element type a caller asked for, on the thread pool.

use crate::core::tensor::{Element, host_zeros};
use crate::{DType, Result};

/// f32 results of `op` as `T`: moved as they are for f32, else rounded on `threads` threads
/// into a fallibly allocated vector.
pub(crate) fn narrow<T: Element>(
    op: &'static str,
    out: Vec<f32>,
    threads: usize,
) -> Result<Vec<T>> {
    // An f32 result is already what the caller wants: hand the buffer over as it is.
    let out = if T::DTYPE == DType::F32 {
        match bytemuck::allocation::try_cast_vec::<f32, T>(out) {
            Ok(same) => return Ok(same),
            Err((_, out)) => out,
        }
    } else {
        out
    };
    let mut narrow = host_zeros::<T>(op, out.len())?;
    // Chunks of at least 64 Ki elements; the first runs on the calling thread.
    let per = out.len().div_ceil(threads.max(1)).max(1 << 16);
    let chunks = narrow.chunks_mut(per).zip(out.chunks(per)).collect();
    crate::runtime::threads::for_each(chunks, &|(to, from): (&mut [T], &[f32])| {
        for (t, &f) in to.iter_mut().zip(from) {
            *t = T::from_f32(f);
        }
    });
    Ok(narrow)
}
