//! Decoding a kernel once per launch: each instruction into an [`Op`] with typed operands
//! and registers numbered by first mention; an opcode the interpreter does not run is an
//! error naming it, before any thread starts.

use std::collections::HashMap;

use crate::exec::ExecError;
use crate::mma::Shape;
use crate::parse::{Address, Instruction, Kernel, Operand};

/// A value's type in an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    B(u32),
    U(u32),
    S(u32),
    F16,
    Bf16,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(crate) fn parse(text: &str) -> Option<Ty> {
        Some(match text {
            "pred" => Ty::Pred,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" | "tf32" => Ty::F32,
            "f64" => Ty::F64,
            _ => {
                let bits: u32 = text.get(1..)?.parse().ok()?;
                if ![8, 16, 32, 64].contains(&bits) {
                    return None;
                }
                match &text[..1] {
                    "b" => Ty::B(bits),
                    "u" => Ty::U(bits),
                    "s" => Ty::S(bits),
                    _ => return None,
                }
            }
        })
    }

    pub(crate) fn bits(self) -> u32 {
        match self {
            Ty::B(b) | Ty::U(b) | Ty::S(b) => b,
            Ty::F16 | Ty::Bf16 => 16,
            Ty::F32 => 32,
            Ty::F64 => 64,
            Ty::Pred => 1,
        }
    }

    pub(crate) fn mask(self) -> u64 {
        match self.bits() {
            64 => u64::MAX,
            b => (1u64 << b) - 1,
        }
    }

    /// `bits` (low `self.bits()` significant) sign- or zero-extended to i128.
    pub(crate) fn int(self, bits: u64) -> i128 {
        match self {
            Ty::S(b) => {
                let shift = 64 - b;
                i128::from(((bits << shift) as i64) >> shift)
            }
            _ => i128::from(bits & self.mask()),
        }
    }
}

/// Where an operand's value comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Src {
    Reg(usize),
    Imm(u64),
    Special(Special),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Special {
    Tid(usize),
    Ntid(usize),
    Ctaid(usize),
    Nctaid(usize),
    LaneId,
    WarpId,
}

/// A decoded memory address: a base and a byte offset.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Addr {
    Reg(usize, i64),
    Param(usize),
    Shared(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
    Param,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Unordered forms: true where either operand is NaN.
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    /// Either operand is NaN.
    Nan,
    /// Neither operand is NaN.
    Num,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    MulHi,
    MulWide,
    Div,
    Rem,
    Max,
    Min,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unary {
    Not,
    Neg,
    Ex2,
    Lg2,
    Rcp,
}

/// A decoded instruction.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Mov {
        ty: Ty,
        d: usize,
        a: Src,
    },
    Arith {
        op: Arith,
        ty: Ty,
        d: usize,
        a: Src,
        b: Src,
    },
    Unary {
        op: Unary,
        ty: Ty,
        d: usize,
        a: Src,
    },
    Fma {
        ty: Ty,
        d: usize,
        a: Src,
        b: Src,
        c: Src,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        d: usize,
        a: Src,
        b: Src,
    },
    Selp {
        ty: Ty,
        d: usize,
        a: Src,
        b: Src,
        p: Src,
    },
    Cvt {
        to: Ty,
        from: Ty,
        rna: bool,
        d: usize,
        a: Src,
    },
    /// `ld` of one value, or of a `.v2`/`.v4` vector into consecutive elements of `d`.
    Ld {
        space: Space,
        ty: Ty,
        d: Vec<usize>,
        addr: Addr,
    },
    /// `st` of one value, or of a `.v2`/`.v4` vector from the elements of `a`.
    St {
        space: Space,
        ty: Ty,
        addr: Addr,
        a: Vec<Src>,
    },
    Bra {
        target: usize,
    },
    Ret,
    BarSync,
    WarpSync,
    /// `mov.bN d, {a, b, ..}`: parts packed low first.
    Pack {
        d: usize,
        parts: Vec<Src>,
        bits: u32,
    },
    /// `mov.bN {d0, d1, ..}, a`: a split into parts, low first.
    Unpack {
        ds: Vec<usize>,
        a: Src,
        bits: u32,
    },
    ShflBfly {
        d: usize,
        /// The optional predicate destination (`d|p`): whether the source lane was in range.
        p: Option<usize>,
        a: Src,
        lane_mask: Src,
        clamp: Src,
    },
    Mma {
        shape: Shape,
        inputs: Ty,
        acc: Ty,
        d: Vec<usize>,
        a: Vec<Src>,
        b: Vec<Src>,
        c: Vec<Src>,
    },
}

/// A decoded instruction with its guard (predicate register, negated) and PTX line.
pub(crate) struct Step {
    pub(crate) guard: Option<(usize, bool)>,
    pub(crate) op: Op,
    pub(crate) line: usize,
}

pub(crate) struct Decoded {
    pub(crate) ops: Vec<Step>,
    pub(crate) registers: Vec<String>,
    pub(crate) shared_bytes: usize,
}

fn unsupported(i: &Instruction) -> ExecError {
    ExecError::Unsupported {
        opcode: i.opcode.clone(),
        line: i.line,
    }
}

pub(crate) fn decode(kernel: &Kernel) -> Result<Decoded, ExecError> {
    // Registers by first mention: names and their indices.
    let table: std::cell::RefCell<(Vec<String>, HashMap<String, usize>)> = Default::default();
    let reg = |name: &str| -> usize {
        let mut table = table.borrow_mut();
        if let Some(&i) = table.1.get(name) {
            return i;
        }
        let i = table.0.len();
        table.0.push(name.to_string());
        table.1.insert(name.to_string(), i);
        i
    };
    let mut shared_offsets = Vec::new();
    let mut shared_bytes = 0usize;
    for s in &kernel.shared {
        shared_bytes = shared_bytes.next_multiple_of(s.align.max(1));
        shared_offsets.push(shared_bytes);
        shared_bytes += s.bytes;
    }
    // Device function calls and module-scope memory are not run: a kernel with either
    // fails before it starts (a call's argument passing through `.param` included).
    if let Some((line, what)) = &kernel.not_run {
        return Err(ExecError::Unsupported {
            opcode: what.clone(),
            line: *line,
        });
    }
    let mut ops = Vec::with_capacity(kernel.body.len());
    for i in &kernel.body {
        let invalid = |what: &str| ExecError::Invalid {
            what: format!("{what}: `{}`", i.opcode),
            line: i.line,
        };
        let parts: Vec<&str> = i.opcode.split('.').collect();
        let types: Vec<Ty> = parts.iter().filter_map(|p| Ty::parse(p)).collect();
        let has = |m: &str| parts.contains(&m);
        let src = |o: &Operand| -> Result<Src, ExecError> {
            Ok(match o {
                Operand::Reg(name) => match special(name) {
                    Some(s) => Src::Special(s),
                    None => Src::Reg(reg(name)),
                },
                Operand::Int(v) => Src::Imm(*v as u64),
                Operand::F32(bits) => Src::Imm(u64::from(*bits)),
                Operand::F64(bits) => Src::Imm(*bits),
                // A shared variable's address: its offset in the CTA's shared window.
                Operand::Symbol(name) => match kernel.shared.iter().position(|s| &s.name == name) {
                    Some(s) => Src::Imm(shared_offsets[s] as u64),
                    None => return Err(invalid(&format!("{name} is no shared variable"))),
                },
                _ => return Err(invalid("an operand of a kind this opcode does not take")),
            })
        };
        let operands = &i.operands;
        let n = |count: usize| -> Result<(), ExecError> {
            if operands.len() == count {
                Ok(())
            } else {
                Err(invalid(&format!(
                    "{} operands, expected {count}",
                    operands.len()
                )))
            }
        };
        let dest = |o: &Operand| -> Result<usize, ExecError> {
            match o {
                Operand::Reg(name) if special(name).is_none() => Ok(reg(name)),
                _ => Err(invalid("a destination that is not a register")),
            }
        };
        let ty = |k: usize| types.get(k).copied().ok_or_else(|| unsupported(i));
        let op = match parts[0] {
            "mov" => {
                n(2)?;
                let ty = ty(0)?;
                match (&operands[0], &operands[1]) {
                    (Operand::Vector(ds), a) => {
                        let ds = ds.iter().map(&dest).collect::<Result<Vec<_>, _>>()?;
                        Op::Unpack {
                            bits: ty.bits() / ds.len().max(1) as u32,
                            ds,
                            a: src(a)?,
                        }
                    }
                    (d, Operand::Vector(parts)) => {
                        let parts = parts.iter().map(&src).collect::<Result<Vec<_>, _>>()?;
                        Op::Pack {
                            d: dest(d)?,
                            bits: ty.bits() / parts.len().max(1) as u32,
                            parts,
                        }
                    }
                    (d, a) => Op::Mov {
                        ty,
                        d: dest(d)?,
                        a: src(a)?,
                    },
                }
            }
            "add" | "sub" | "mul" | "div" | "rem" | "max" | "min" | "and" | "or" | "xor"
            | "shl" | "shr" => {
                n(3)?;
                let op = match parts[0] {
                    "add" => Arith::Add,
                    "sub" => Arith::Sub,
                    "mul" if has("hi") => Arith::MulHi,
                    "mul" if has("wide") => Arith::MulWide,
                    "mul" => Arith::Mul,
                    "div" => Arith::Div,
                    "rem" => Arith::Rem,
                    "max" => Arith::Max,
                    "min" => Arith::Min,
                    "and" => Arith::And,
                    "or" => Arith::Or,
                    "xor" => Arith::Xor,
                    "shl" => Arith::Shl,
                    _ => Arith::Shr,
                };
                if parts.iter().any(|p| matches!(*p, "sat" | "cc" | "ftz")) {
                    return Err(unsupported(i));
                }
                let d = dest(&operands[0])?;
                Op::Arith {
                    op,
                    ty: ty(0)?,
                    d,
                    a: src(&operands[1])?,
                    b: src(&operands[2])?,
                }
            }
            "not" | "neg" | "ex2" | "lg2" | "rcp" => {
                n(2)?;
                let op = match parts[0] {
                    "not" => Unary::Not,
                    "neg" => Unary::Neg,
                    "ex2" => Unary::Ex2,
                    "lg2" => Unary::Lg2,
                    _ => Unary::Rcp,
                };
                let d = dest(&operands[0])?;
                Op::Unary {
                    op,
                    ty: ty(0)?,
                    d,
                    a: src(&operands[1])?,
                }
            }
            "fma" | "mad" if !has("hi") && !has("wide") => {
                n(4)?;
                let d = dest(&operands[0])?;
                Op::Fma {
                    ty: ty(0)?,
                    d,
                    a: src(&operands[1])?,
                    b: src(&operands[2])?,
                    c: src(&operands[3])?,
                }
            }
            "setp" => {
                n(3)?;
                let cmp = match parts.get(1).copied() {
                    Some("eq") => Cmp::Eq,
                    Some("ne") => Cmp::Ne,
                    Some("lt" | "lo") => Cmp::Lt,
                    Some("le" | "ls") => Cmp::Le,
                    Some("gt" | "hi") => Cmp::Gt,
                    Some("ge" | "hs") => Cmp::Ge,
                    Some("equ") => Cmp::Equ,
                    Some("neu") => Cmp::Neu,
                    Some("ltu") => Cmp::Ltu,
                    Some("leu") => Cmp::Leu,
                    Some("gtu") => Cmp::Gtu,
                    Some("geu") => Cmp::Geu,
                    Some("nan") => Cmp::Nan,
                    Some("num") => Cmp::Num,
                    _ => return Err(unsupported(i)),
                };
                let d = dest(&operands[0])?;
                Op::Setp {
                    cmp,
                    ty: ty(0)?,
                    d,
                    a: src(&operands[1])?,
                    b: src(&operands[2])?,
                }
            }
            "selp" => {
                n(4)?;
                let d = dest(&operands[0])?;
                Op::Selp {
                    ty: ty(0)?,
                    d,
                    a: src(&operands[1])?,
                    b: src(&operands[2])?,
                    p: src(&operands[3])?,
                }
            }
            "cvt" => {
                n(2)?;
                let rounding = parts.iter().find(|p| p.starts_with('r') && p.len() <= 3);
                if parts.iter().any(|p| matches!(*p, "sat" | "ftz" | "relu")) {
                    return Err(unsupported(i));
                }
                let d = dest(&operands[0])?;
                Op::Cvt {
                    to: ty(0)?,
                    from: ty(1)?,
                    rna: rounding == Some(&"rna"),
                    d,
                    a: src(&operands[1])?,
                }
            }
            "cvta" => {
                n(2)?;
                let d = dest(&operands[0])?;
                Op::Mov {
                    ty: Ty::B(64),
                    d,
                    a: src(&operands[1])?,
                }
            }
            "ld" | "st" => {
                n(2)?;
                let space = if has("global") {
                    Space::Global
                } else if has("shared") {
                    Space::Shared
                } else if has("param") && parts[0] == "ld" {
                    Space::Param
                } else {
                    return Err(unsupported(i));
                };
                let lanes = match parts.iter().find(|p| p.starts_with('v') && p.len() == 2) {
                    None => 1,
                    Some(&"v2") => 2,
                    Some(&"v4") => 4,
                    Some(_) => return Err(unsupported(i)),
                };
                if ty(0)?.bits() > 64 {
                    return Err(unsupported(i));
                }
                let (value, address) = if parts[0] == "ld" {
                    (&operands[0], &operands[1])
                } else {
                    (&operands[1], &operands[0])
                };
                // The value's registers (or sources), one per vector element.
                let values: Vec<&Operand> = match value {
                    Operand::Vector(v) if v.len() == lanes && lanes > 1 => v.iter().collect(),
                    _ if lanes == 1 => vec![value],
                    _ => {
                        return Err(invalid(
                            "a vector access whose value is no vector of its size",
                        ));
                    }
                };
                let addr = match address {
                    Operand::Address(Address::Reg(name, offset)) => Addr::Reg(reg(name), *offset),
                    Operand::Address(Address::Symbol(name, offset)) => {
                        if let Some(p) = kernel.params.iter().position(|p| &p.name == name) {
                            if *offset != 0 {
                                return Err(invalid("a parameter read at an offset"));
                            }
                            Addr::Param(p)
                        } else if let Some(s) = kernel.shared.iter().position(|s| &s.name == name) {
                            Addr::Shared(shared_offsets[s] + *offset as usize)
                        } else {
                            return Err(invalid(&format!("an address of unknown {name}")));
                        }
                    }
                    _ => return Err(invalid("an address of a form not run")),
                };
                if parts[0] == "ld" {
                    Op::Ld {
                        space,
                        ty: ty(0)?,
                        d: values.into_iter().map(&dest).collect::<Result<_, _>>()?,
                        addr,
                    }
                } else {
                    Op::St {
                        space,
                        ty: ty(0)?,
                        addr,
                        a: values.into_iter().map(&src).collect::<Result<_, _>>()?,
                    }
                }
            }
            "bra" => {
                n(1)?;
                let Operand::Symbol(label) = &operands[0] else {
                    return Err(invalid("a branch without a label"));
                };
                let target = *kernel
                    .labels
                    .get(label)
                    .ok_or_else(|| invalid("a branch to no label"))?;
                Op::Bra { target }
            }
            "ret" | "exit" => Op::Ret,
            "bar" if has("warp") && has("sync") => Op::WarpSync,
            "bar" if has("sync") || i.opcode == "barrier.sync" => {
                if operands.len() != 1 || operands[0] != Operand::Int(0) {
                    return Err(unsupported(i));
                }
                Op::BarSync
            }
            "shfl" if has("sync") && has("bfly") && has("b32") => {
                n(5)?;
                // `d|p`: the value and, optionally, whether its lane was in range.
                let (d, p) = match &operands[0] {
                    Operand::Reg(pair) if pair.contains('|') => {
                        let (d, p) = pair.split_once('|').expect("a pair");
                        (reg(d), Some(reg(p)))
                    }
                    other => (dest(other)?, None),
                };
                Op::ShflBfly {
                    d,
                    p,
                    a: src(&operands[1])?,
                    lane_mask: src(&operands[2])?,
                    clamp: src(&operands[3])?,
                }
            }
            "mma" if has("sync") && has("aligned") && has("row") && has("col") => {
                n(4)?;
                let shape = if has("m16n8k16") && matches!(types.get(1), Some(Ty::F16 | Ty::Bf16)) {
                    Shape::M16N8K16
                } else if has("m16n8k8") && has("tf32") {
                    Shape::M16N8K8
                } else {
                    return Err(unsupported(i));
                };
                // dtype, atype, btype, ctype: tf32 reads as F32.
                let (acc, inputs) = (ty(0)?, ty(1)?);
                if ty(3)? != acc || !matches!(acc, Ty::F32 | Ty::F16) {
                    return Err(unsupported(i));
                }
                let regs = |o: &Operand| -> Result<Vec<Src>, ExecError> {
                    match o {
                        Operand::Vector(v) => v.iter().map(&src).collect(),
                        _ => Err(invalid("an mma operand that is not a vector")),
                    }
                };
                let d = match &operands[0] {
                    Operand::Vector(v) => v.iter().map(&dest).collect::<Result<_, _>>()?,
                    _ => return Err(invalid("an mma destination that is not a vector")),
                };
                Op::Mma {
                    shape,
                    inputs,
                    acc,
                    d,
                    a: regs(&operands[1])?,
                    b: regs(&operands[2])?,
                    c: regs(&operands[3])?,
                }
            }
            _ => return Err(unsupported(i)),
        };
        let guard = i.guard.as_ref().map(|g| (reg(&g.reg), g.negated));
        ops.push(Step {
            guard,
            op,
            line: i.line,
        });
    }
    Ok(Decoded {
        ops,
        registers: table.into_inner().0,
        shared_bytes,
    })
}

pub(crate) fn special(name: &str) -> Option<Special> {
    let axis = |s: &str| match s {
        "x" => Some(0),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    let (base, dim) = name.split_once('.').unwrap_or((name, ""));
    Some(match base {
        "%tid" => Special::Tid(axis(dim)?),
        "%ntid" => Special::Ntid(axis(dim)?),
        "%ctaid" => Special::Ctaid(axis(dim)?),
        "%nctaid" => Special::Nctaid(axis(dim)?),
        "%laneid" => Special::LaneId,
        "%warpid" => Special::WarpId,
        _ => return None,
    })
}
