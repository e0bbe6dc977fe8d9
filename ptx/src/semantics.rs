//! What the scalar instructions compute on register bits: integer and float arithmetic,
//! compares (ordered and unordered), conversions between widths and float formats.

use crate::decode::{Arith, Cmp, Ty, Unary};

pub(crate) fn le(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(buf)
}

pub(crate) fn f32_of(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

/// The float arithmetic of `op` on `a` and `b` (f32 or f64), or `return None` from the
/// caller for an op floats do not have. PTX's max/min give the other operand where one is
/// NaN, as Rust's `max`/`min` do.
macro_rules! float_arith {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            Arith::Add => a + b,
            Arith::Sub => a - b,
            Arith::Mul => a * b,
            Arith::Div => a / b,
            Arith::Max => a.max(b),
            Arith::Min => a.min(b),
            _ => return None,
        }
    }};
}

pub(crate) fn arith(op: Arith, ty: Ty, x: u64, y: u64) -> Option<u64> {
    let mask = ty.mask();
    Some(match ty {
        Ty::F32 => u64::from(float_arith!(op, f32_of(x), f32_of(y)).to_bits()),
        Ty::F64 => float_arith!(op, f64::from_bits(x), f64::from_bits(y)).to_bits(),
        Ty::Pred => match op {
            Arith::And => x & y & 1,
            Arith::Or => (x | y) & 1,
            Arith::Xor => (x ^ y) & 1,
            _ => return None,
        },
        _ => {
            let bits = ty.bits();
            let (a, b) = (ty.int(x), ty.int(y));
            match op {
                Arith::Add => (a.wrapping_add(b)) as u64 & mask,
                Arith::Sub => (a.wrapping_sub(b)) as u64 & mask,
                Arith::Mul => (a.wrapping_mul(b)) as u64 & mask,
                Arith::MulHi => ((a * b) >> bits) as u64 & mask,
                Arith::MulWide => {
                    (a * b) as u64
                        & if bits == 32 {
                            u64::MAX
                        } else {
                            (1 << (2 * bits)) - 1
                        }
                }
                Arith::Div => {
                    if b == 0 {
                        return None;
                    }
                    (a / b) as u64 & mask
                }
                Arith::Rem => {
                    if b == 0 {
                        return None;
                    }
                    (a % b) as u64 & mask
                }
                Arith::Max => a.max(b) as u64 & mask,
                Arith::Min => a.min(b) as u64 & mask,
                Arith::And => x & y & mask,
                Arith::Or => (x | y) & mask,
                Arith::Xor => (x ^ y) & mask,
                Arith::Shl => {
                    let s = y as u32;
                    if s >= bits { 0 } else { (x << s) & mask }
                }
                Arith::Shr => {
                    let s = (y as u32).min(bits);
                    match ty {
                        Ty::S(_) => {
                            let v = if s >= bits {
                                if a < 0 { -1 } else { 0 }
                            } else {
                                a >> s
                            };
                            v as u64 & mask
                        }
                        _ => {
                            if s >= bits {
                                0
                            } else {
                                (x & mask) >> s
                            }
                        }
                    }
                }
            }
        }
    })
}

pub(crate) fn unary(op: Unary, ty: Ty, x: u64) -> Option<u64> {
    Some(match (op, ty) {
        (Unary::Not, Ty::Pred) => (x ^ 1) & 1,
        (Unary::Not, _) => !x & ty.mask(),
        (Unary::Neg, Ty::F32) => u64::from((-f32_of(x)).to_bits()),
        (Unary::Neg, Ty::F64) => (-f64::from_bits(x)).to_bits(),
        (Unary::Neg, _) => (ty.int(x).wrapping_neg()) as u64 & ty.mask(),
        (Unary::Ex2, Ty::F32) => u64::from(f32_of(x).exp2().to_bits()),
        (Unary::Lg2, Ty::F32) => u64::from(f32_of(x).log2().to_bits()),
        (Unary::Rcp, Ty::F32) => u64::from((1.0 / f32_of(x)).to_bits()),
        (Unary::Rcp, Ty::F64) => (1.0 / f64::from_bits(x)).to_bits(),
        _ => return None,
    })
}

pub(crate) fn compare(cmp: Cmp, ty: Ty, x: u64, y: u64) -> bool {
    let ordering = match ty {
        Ty::F32 => f32_of(x).partial_cmp(&f32_of(y)),
        Ty::F64 => f64::from_bits(x).partial_cmp(&f64::from_bits(y)),
        Ty::F16 | Ty::Bf16 => {
            let f = |b: u64| convert(Ty::F32, ty, false, b);
            f32_of(f(x)).partial_cmp(&f32_of(f(y)))
        }
        _ => Some(ty.int(x).cmp(&ty.int(y))),
    };
    use std::cmp::Ordering::*;
    match (cmp, ordering) {
        (Cmp::Equ | Cmp::Neu | Cmp::Ltu | Cmp::Leu | Cmp::Gtu | Cmp::Geu | Cmp::Nan, None) => true,
        (_, None) => false,
        (Cmp::Nan, Some(_)) => false,
        (Cmp::Num, Some(_)) => true,
        (Cmp::Eq | Cmp::Equ, Some(o)) => o == Equal,
        (Cmp::Ne | Cmp::Neu, Some(o)) => o != Equal,
        (Cmp::Lt | Cmp::Ltu, Some(o)) => o == Less,
        (Cmp::Le | Cmp::Leu, Some(o)) => o != Greater,
        (Cmp::Gt | Cmp::Gtu, Some(o)) => o == Greater,
        (Cmp::Ge | Cmp::Geu, Some(o)) => o != Less,
    }
}

/// `cvt.to.from`: integer widths with sign or zero extension, floats rounded to nearest
/// even (`rna`: ties away from zero, TF32's conversion), floats to integers truncated
/// toward zero only where asked (the kernels use `rn`/`rz` forms from floats to ints: none
/// today), integers to floats rounded to nearest.
pub(crate) fn convert(to: Ty, from: Ty, rna: bool, x: u64) -> u64 {
    let as_f64 = |bits: u64| -> Option<f64> {
        Some(match from {
            Ty::F32 => f64::from(f32_of(bits)),
            Ty::F64 => f64::from_bits(bits),
            Ty::F16 => f64::from(half::f16::from_bits(bits as u16)),
            Ty::Bf16 => f64::from(half::bf16::from_bits(bits as u16)),
            _ => return None,
        })
    };
    match to {
        Ty::F32 if rna && from == Ty::F32 => {
            // TF32: 10 mantissa bits, to nearest with ties away from zero.
            let bits = x as u32;
            if f32::from_bits(bits).is_finite() {
                u64::from((bits + (1 << 12)) & !((1 << 13) - 1))
            } else {
                u64::from(bits)
            }
        }
        Ty::F32 => match from {
            Ty::F64 => u64::from((f64::from_bits(x) as f32).to_bits()),
            Ty::S(_) | Ty::U(_) | Ty::B(_) => u64::from((from.int(x) as f32).to_bits()),
            _ => u64::from((as_f64(x).unwrap_or(0.0) as f32).to_bits()),
        },
        Ty::F64 => match from {
            Ty::S(_) | Ty::U(_) | Ty::B(_) => (from.int(x) as f64).to_bits(),
            _ => as_f64(x).unwrap_or(0.0).to_bits(),
        },
        Ty::F16 => {
            u64::from(half::f16::from_f32(f32_of(convert(Ty::F32, from, false, x))).to_bits())
        }
        Ty::Bf16 => {
            u64::from(half::bf16::from_f32(f32_of(convert(Ty::F32, from, false, x))).to_bits())
        }
        Ty::Pred => x & 1,
        _ => match from {
            Ty::F32 | Ty::F64 | Ty::F16 | Ty::Bf16 => {
                (as_f64(x).unwrap_or(0.0).trunc() as i128) as u64 & to.mask()
            }
            _ => (from.int(x) as u64) & to.mask(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_conversions_and_compares_follow_ptx() {
        assert_eq!(arith(Arith::Add, Ty::S(32), 0xffff_ffff, 1), Some(0));
        assert_eq!(
            arith(Arith::MulHi, Ty::S(32), (-2i32) as u32 as u64, 0x4000_0000),
            Some(0xffff_ffff)
        );
        assert_eq!(
            arith(Arith::MulWide, Ty::U(32), 0xffff_ffff, 2),
            Some(0x1_ffff_fffe)
        );
        assert_eq!(
            arith(Arith::Shr, Ty::S(32), 0x8000_0000, 31),
            Some(0xffff_ffff)
        );
        assert_eq!(arith(Arith::Shr, Ty::U(32), 0x8000_0000, 40), Some(0));
        assert_eq!(arith(Arith::Div, Ty::S(64), 7, 0), None);
        let nan = u64::from(f32::NAN.to_bits());
        let one = u64::from(1f32.to_bits());
        assert!(compare(Cmp::Ltu, Ty::F32, nan, one) && !compare(Cmp::Lt, Ty::F32, nan, one));
        assert!(compare(Cmp::Nan, Ty::F32, one, nan) && !compare(Cmp::Nan, Ty::F32, one, one));
        assert!(compare(Cmp::Num, Ty::F32, one, one) && !compare(Cmp::Num, Ty::F32, nan, one));
        assert_eq!(arith(Arith::Max, Ty::F32, nan, one), Some(one));
        // cvt.s64.s32 sign-extends; cvt.u32.u64 truncates; tf32 rounds ties away from zero.
        assert_eq!(
            convert(Ty::S(64), Ty::S(32), false, 0xffff_fffe),
            (-2i64) as u64
        );
        assert_eq!(convert(Ty::U(32), Ty::U(64), false, 0x1_0000_0005), 5);
        let tie = u64::from((1.0f32 + 2f32.powi(-11)).to_bits());
        assert_eq!(
            convert(Ty::F32, Ty::F32, true, tie),
            u64::from((1.0f32 + 2f32.powi(-10)).to_bits())
        );
        let bf = convert(
            Ty::Bf16,
            Ty::F32,
            false,
            u64::from((1.0f32 + 2f32.powi(-8)).to_bits()),
        );
        assert_eq!(bf, u64::from(half::bf16::from_f32(1.0).to_bits()));
    }
}
