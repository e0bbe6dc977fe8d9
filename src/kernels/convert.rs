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
        narrow_into(to, from, None)
    });
    Ok(narrow)
}

/// `from` (plus `add`, element by element, where given) rounded into `to` (equally long).
pub(crate) fn narrow_into<T: Element>(to: &mut [T], from: &[f32], add: Option<&[f32]>) {
    assert!(to.len() == from.len() && add.is_none_or(|add| add.len() == from.len()));
    match (T::DTYPE, add) {
        // Branch-free bit arithmetic, which the compiler turns into vector code.
        (DType::Bf16, None) => {
            for (t, &f) in bytemuck::cast_slice_mut::<T, u16>(to).iter_mut().zip(from) {
                *t = rounded_bf16_bits(f);
            }
        }
        (DType::Bf16, Some(add)) => {
            let to = bytemuck::cast_slice_mut::<T, u16>(to);
            for ((t, &f), &b) in to.iter_mut().zip(from).zip(add) {
                *t = rounded_bf16_bits(f + b);
            }
        }
        (_, None) => {
            for (t, &f) in to.iter_mut().zip(from) {
                *t = T::from_f32(f);
            }
        }
        (_, Some(add)) => {
            for ((t, &f), &b) in to.iter_mut().zip(from).zip(add) {
                *t = T::from_f32(f + b);
            }
        }
    }
}

/// `x` rounded to bf16 (to nearest, ties to even; NaN stays NaN, made quiet), as bits: what
/// `half::bf16::from_f32` gives, without branches.
#[inline(always)]
fn rounded_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    let is_nan = bits & 0x7FFF_FFFF > 0x7F80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free rounding gives `half`'s bits for every f32 whose upper half is any
    /// value and whose lower half is each rounding case (below, at and above the tie).
    #[test]
    fn bf16_rounding_matches_half_bit_for_bit() {
        for upper in 0..=u16::MAX {
            for lower in [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = f32::from_bits(u32::from(upper) << 16 | lower);
                assert_eq!(
                    rounded_bf16_bits(x),
                    half::bf16::from_f32(x).to_bits(),
                    "{:#x}",
                    x.to_bits()
                );
            }
        }
    }
}
