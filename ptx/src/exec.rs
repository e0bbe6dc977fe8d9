//! Running a kernel: a grid of CTAs, each a block of threads in warps of 32, with
//! per-thread registers, CTA barriers (`bar.sync`), warp collectives (`shfl.sync`,
//! `bar.warp.sync`) that run once every live lane of the warp has arrived, global memory
//! ([`Memory`]) and per-CTA shared memory.
//!
//! Instructions are decoded once per launch ([`crate::decode`]); what they compute is in
//! [`crate::semantics`]. Out-of-bounds or misaligned accesses, reads
//! of registers never written, barrier divergence and deadlocks are errors too.

use std::collections::HashMap;
use std::fmt;

use crate::counters::{Accesses, Stats};
use crate::decode::{Addr, Decoded, Op, Space, Special, Src, Step, Ty, decode};
use crate::memory::Memory;
use crate::mma::{self, Shape};
use crate::parse::Kernel;
use crate::semantics::{arith, compare, convert, le, unary};

/// Why a launch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecError {
    /// An opcode (with its modifiers) the interpreter does not run.
    Unsupported {
        /// The instruction as written.
        opcode: String,
        /// Its line in the PTX.
        line: usize,
    },
    /// A malformed instruction or launch (operand count, unknown name, bad geometry).
    Invalid {
        /// What was wrong.
        what: String,
        /// Its line in the PTX (0 for the launch).
        line: usize,
    },
    /// A memory access outside every allocation, or misaligned.
    BadAccess {
        /// What happened.
        what: String,
        /// The instruction's line.
        line: usize,
        /// The thread, as `(ctaid, tid)` in x.
        thread: (u32, u32),
    },
    /// A register read before any write.
    Uninitialised {
        /// The register.
        reg: String,
        /// The instruction's line.
        line: usize,
    },
    /// Threads wait at different barriers, or some wait while the others have left.
    Divergence {
        /// What the threads were doing.
        what: String,
    },
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Unsupported { opcode, line } => {
                write!(f, "line {line}: the interpreter does not run `{opcode}`")
            }
            ExecError::Invalid { what, line } => write!(f, "line {line}: {what}"),
            ExecError::BadAccess { what, line, thread } => write!(
                f,
                "line {line}, block {} thread {}: {what}",
                thread.0, thread.1
            ),
            ExecError::Uninitialised { reg, line } => {
                write!(f, "line {line}: {reg} is read before it is written")
            }
            ExecError::Divergence { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for ExecError {}

/// A launch's geometry and parameters (each parameter's bytes, in order).
#[derive(Clone, Debug)]
pub struct Launch {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// The parameters' bytes, one entry per parameter.
    pub params: Vec<Vec<u8>>,
    /// Whether to count memory sectors and bank conflicts (slower: every access is
    /// gathered per warp).
    pub counters: bool,
}

/// What a thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    AtBarrier(usize),
    AtWarpOp(usize),
    Done,
}

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    written: Vec<bool>,
    state: State,
    tid: [u32; 3],
    linear: u32,
    /// How often this thread has run each memory instruction (by pc).
    visits: HashMap<usize, u32>,
}

struct Cta<'a> {
    decoded: &'a Decoded,
    launch: &'a Launch,
    ctaid: [u32; 3],
    shared: Vec<u8>,
    threads: Vec<Thread>,
    stats: Stats,
    accesses: Accesses,
}

/// Runs `kernel` over the grid of `launch`, with global memory `memory`.
pub fn run(kernel: &Kernel, launch: &Launch, memory: &mut Memory) -> Result<Stats, ExecError> {
    let invalid = |what: String| ExecError::Invalid { what, line: 0 };
    if launch.params.len() != kernel.params.len() {
        return Err(invalid(format!(
            "{} takes {} parameters, the launch passes {}",
            kernel.name,
            kernel.params.len(),
            launch.params.len()
        )));
    }
    for (p, bytes) in kernel.params.iter().zip(&launch.params) {
        if p.bytes != bytes.len() {
            return Err(invalid(format!(
                "parameter {} is {} bytes, the launch passes {}",
                p.name,
                p.bytes,
                bytes.len()
            )));
        }
    }
    let threads_per_block: u32 = launch.block.iter().product();
    if threads_per_block == 0 || threads_per_block > 1024 || launch.grid.contains(&0) {
        return Err(invalid(format!(
            "a launch of {:?} blocks of {:?} threads",
            launch.grid, launch.block
        )));
    }
    let decoded = decode(kernel)?;
    let mut stats = Stats::default();
    for z in 0..launch.grid[2] {
        for y in 0..launch.grid[1] {
            for x in 0..launch.grid[0] {
                let mut cta = Cta::new(&decoded, launch, [x, y, z]);
                cta.run(memory)?;
                cta.accesses.tally(&mut cta.stats);
                stats.add(&cta.stats);
            }
        }
    }
    Ok(stats)
}

impl<'a> Cta<'a> {
    fn new(decoded: &'a Decoded, launch: &'a Launch, ctaid: [u32; 3]) -> Cta<'a> {
        let [bx, by, bz] = launch.block;
        let mut threads = Vec::with_capacity((bx * by * bz) as usize);
        for z in 0..bz {
            for y in 0..by {
                for x in 0..bx {
                    threads.push(Thread {
                        pc: 0,
                        regs: vec![0; decoded.registers.len()],
                        written: vec![false; decoded.registers.len()],
                        state: State::Running,
                        tid: [x, y, z],
                        linear: x + bx * (y + by * z),
                        visits: HashMap::new(),
                    });
                }
            }
        }
        Cta {
            decoded,
            launch,
            ctaid,
            shared: vec![0; decoded.shared_bytes],
            stats: Stats {
                warps: u64::from(threads.len().div_ceil(32) as u32),
                ..Stats::default()
            },
            threads,
            accesses: Accesses::default(),
        }
    }

    /// Runs every thread to its end: each runs until it blocks (a barrier or a warp
    /// collective); blocked threads are released when all they wait for have arrived.
    fn run(&mut self, memory: &mut Memory) -> Result<(), ExecError> {
        loop {
            for t in 0..self.threads.len() {
                while self.threads[t].state == State::Running {
                    self.step(t, memory)?;
                }
            }
            if self.threads.iter().all(|t| t.state == State::Done) {
                return Ok(());
            }
            let mut progressed = false;
            // Warp collectives: every live lane of a warp at the same one.
            for warp in 0..self.threads.len().div_ceil(32) {
                let lanes = warp * 32..((warp + 1) * 32).min(self.threads.len());
                let live: Vec<usize> = lanes
                    .clone()
                    .filter(|&l| self.threads[l].state != State::Done)
                    .collect();
                let Some(&first) = live.first() else { continue };
                let State::AtWarpOp(pc) = self.threads[first].state else {
                    continue;
                };
                if live
                    .iter()
                    .all(|&l| self.threads[l].state == State::AtWarpOp(pc))
                {
                    self.warp_op(&live, pc)?;
                    progressed = true;
                } else if live
                    .iter()
                    .all(|&l| matches!(self.threads[l].state, State::AtWarpOp(_)))
                {
                    return Err(ExecError::Divergence {
                        what: format!(
                            "the lanes of warp {warp} wait at different warp collectives"
                        ),
                    });
                }
            }
            if !progressed {
                let waiting: Vec<State> = self
                    .threads
                    .iter()
                    .map(|t| t.state)
                    .filter(|s| *s != State::Done)
                    .collect();
                match waiting.first() {
                    Some(&State::AtBarrier(pc))
                        if waiting.iter().all(|s| *s == State::AtBarrier(pc))
                            && waiting.len() == self.threads.len() =>
                    {
                        for t in &mut self.threads {
                            t.pc = pc + 1;
                            t.state = State::Running;
                        }
                        self.stats.barriers += 1;
                    }
                    _ => {
                        let lines: Vec<String> = waiting
                            .iter()
                            .map(|s| match s {
                                State::AtBarrier(pc) | State::AtWarpOp(pc) => {
                                    format!("{:?} at line {}", s, self.decoded.ops[*pc].line)
                                }
                                _ => format!("{s:?}"),
                            })
                            .collect::<std::collections::BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        return Err(ExecError::Divergence {
                            what: format!(
                                "block {:?}: no thread can go on ({} of {} threads left: {})",
                                self.ctaid,
                                waiting.len(),
                                self.threads.len(),
                                lines.join(", ")
                            ),
                        });
                    }
                }
            }
        }
    }

    fn read(&self, t: usize, src: &Src, line: usize) -> Result<u64, ExecError> {
        let thread = &self.threads[t];
        Ok(match src {
            Src::Imm(v) => *v,
            Src::Reg(r) => {
                if !thread.written[*r] {
                    return Err(ExecError::Uninitialised {
                        reg: self.decoded.registers[*r].clone(),
                        line,
                    });
                }
                thread.regs[*r]
            }
            Src::Special(s) => u64::from(match *s {
                Special::Tid(a) => thread.tid[a],
                Special::Ntid(a) => self.launch.block[a],
                Special::Ctaid(a) => self.ctaid[a],
                Special::Nctaid(a) => self.launch.grid[a],
                Special::LaneId => thread.linear % 32,
                Special::WarpId => thread.linear / 32,
            }),
        })
    }

    fn write(&mut self, t: usize, d: usize, value: u64) {
        self.threads[t].regs[d] = value;
        self.threads[t].written[d] = true;
    }

    fn bad_access(&self, t: usize, line: usize, what: String) -> ExecError {
        ExecError::BadAccess {
            what,
            line,
            thread: (self.ctaid[0], self.threads[t].linear),
        }
    }

    /// Runs one instruction of thread `t`.
    fn step(&mut self, t: usize, memory: &mut Memory) -> Result<(), ExecError> {
        let decoded = self.decoded;
        let pc = self.threads[t].pc;
        let Some(Step { guard, op, line }) = decoded.ops.get(pc) else {
            self.threads[t].state = State::Done;
            return Ok(());
        };
        let line = *line;
        self.stats.instructions += 1;
        if let Some((p, negated)) = guard {
            let value = self.read(t, &Src::Reg(*p), line)? != 0;
            if value == *negated {
                self.threads[t].pc += 1;
                return Ok(());
            }
        }
        let mut next = pc + 1;
        match op {
            Op::Mov { ty, d, a } => {
                let v = self.read(t, a, line)? & ty.mask();
                self.write(t, *d, v);
            }
            Op::Pack { d, parts, bits } => {
                let mut v = 0u64;
                for (k, part) in parts.iter().enumerate() {
                    let x = self.read(t, part, line)? & ((1u64 << bits) - 1);
                    v |= x << (k as u32 * bits);
                }
                self.write(t, *d, v);
            }
            Op::Unpack { ds, a, bits } => {
                let x = self.read(t, a, line)?;
                for (k, d) in ds.iter().enumerate() {
                    self.write(t, *d, (x >> (k as u32 * bits)) & ((1u64 << bits) - 1));
                }
            }
            Op::Arith { op, ty, d, a, b } => {
                let (x, y) = (self.read(t, a, line)?, self.read(t, b, line)?);
                let v = arith(*op, *ty, x, y).ok_or_else(|| ExecError::Invalid {
                    what: format!("{op:?} of {ty:?} by zero"),
                    line,
                })?;
                self.write(t, *d, v);
            }
            Op::Unary { op, ty, d, a } => {
                let x = self.read(t, a, line)?;
                let v = unary(*op, *ty, x).ok_or_else(|| ExecError::Invalid {
                    what: format!("{op:?} of {ty:?} is not defined"),
                    line,
                })?;
                self.write(t, *d, v);
            }
            Op::Fma { ty, d, a, b, c } => {
                let (x, y, z) = (
                    self.read(t, a, line)?,
                    self.read(t, b, line)?,
                    self.read(t, c, line)?,
                );
                let v = match ty {
                    Ty::F32 => u64::from(
                        f32::from_bits(x as u32)
                            .mul_add(f32::from_bits(y as u32), f32::from_bits(z as u32))
                            .to_bits(),
                    ),
                    Ty::F64 => f64::from_bits(x)
                        .mul_add(f64::from_bits(y), f64::from_bits(z))
                        .to_bits(),
                    _ => {
                        (ty.int(x).wrapping_mul(ty.int(y)).wrapping_add(ty.int(z))) as u64
                            & ty.mask()
                    }
                };
                self.write(t, *d, v);
            }
            Op::Setp { cmp, ty, d, a, b } => {
                let (x, y) = (self.read(t, a, line)?, self.read(t, b, line)?);
                let v = compare(*cmp, *ty, x, y);
                self.write(t, *d, u64::from(v));
            }
            Op::Selp { ty, d, a, b, p } => {
                let (x, y, q) = (
                    self.read(t, a, line)?,
                    self.read(t, b, line)?,
                    self.read(t, p, line)?,
                );
                self.write(t, *d, if q != 0 { x } else { y } & ty.mask());
            }
            Op::Cvt {
                to,
                from,
                rna,
                d,
                a,
            } => {
                let x = self.read(t, a, line)?;
                self.write(t, *d, convert(*to, *from, *rna, x));
            }
            Op::Ld { space, ty, d, addr } => {
                let bytes = (ty.bits() / 8).max(1) as usize;
                let total = bytes * d.len();
                // At most 4 elements of at most 8 bytes.
                let mut raw = [0u8; 32];
                match (space, addr) {
                    (Space::Param, Addr::Param(p)) => {
                        let param = &self.launch.params[*p];
                        let n = total.min(param.len());
                        raw[..n].copy_from_slice(&param[..n]);
                    }
                    (Space::Shared, _) => {
                        let at = self.shared_address(t, addr, total, line)?;
                        self.record(t, pc, Space::Shared, at as u64, total);
                        raw[..total].copy_from_slice(&self.shared[at..at + total]);
                    }
                    (Space::Global, Addr::Reg(r, offset)) => {
                        let (buffer, at) =
                            self.global_access(t, pc, memory, (*r, *offset), total, "read")?;
                        raw[..total].copy_from_slice(&memory.allocations[buffer].1[at..at + total]);
                    }
                    _ => {
                        return Err(ExecError::Invalid {
                            what: "a load of a form not run".into(),
                            line,
                        });
                    }
                }
                for (k, d) in d.iter().enumerate() {
                    let value = le(&raw[k * bytes..(k + 1) * bytes]);
                    let value = match ty {
                        Ty::S(_) => ty.int(value) as u64,
                        _ => value & ty.mask(),
                    };
                    self.write(t, *d, value);
                }
            }
            Op::St { space, ty, addr, a } => {
                let bytes = (ty.bits() / 8).max(1) as usize;
                let total = bytes * a.len();
                let mut value = [0u8; 32];
                for (k, a) in a.iter().enumerate() {
                    value[k * bytes..(k + 1) * bytes]
                        .copy_from_slice(&self.read(t, a, line)?.to_le_bytes()[..bytes]);
                }
                let value = &value[..total];
                match (space, addr) {
                    (Space::Shared, _) => {
                        let at = self.shared_address(t, addr, total, line)?;
                        self.record(t, pc, Space::Shared, at as u64, total);
                        self.shared[at..at + total].copy_from_slice(value);
                    }
                    (Space::Global, Addr::Reg(r, offset)) => {
                        let (buffer, at) =
                            self.global_access(t, pc, memory, (*r, *offset), total, "write")?;
                        memory.allocations[buffer].1[at..at + total].copy_from_slice(value);
                    }
                    _ => {
                        return Err(ExecError::Invalid {
                            what: "a store of a form not run".into(),
                            line,
                        });
                    }
                }
            }
            Op::Bra { target } => next = *target,
            Op::Ret => {
                self.threads[t].state = State::Done;
                return Ok(());
            }
            Op::BarSync => {
                self.threads[t].state = State::AtBarrier(pc);
                return Ok(());
            }
            Op::WarpSync | Op::ShflBfly { .. } | Op::Mma { .. } => {
                self.threads[t].state = State::AtWarpOp(pc);
                return Ok(());
            }
        }
        self.threads[t].pc = next;
        Ok(())
    }

    /// Where a `bytes`-wide global `verb` (read or write) of thread `t` at `base + offset`
    /// falls: (allocation, byte offset in it), once it is checked aligned and inside an
    /// allocation, and counted.
    fn global_access(
        &mut self,
        t: usize,
        pc: usize,
        memory: &Memory,
        (base, offset): (usize, i64),
        bytes: usize,
        verb: &str,
    ) -> Result<(usize, usize), ExecError> {
        let line = self.decoded.ops[pc].line;
        let address = self
            .read(t, &Src::Reg(base), line)?
            .wrapping_add(offset as u64);
        if !address.is_multiple_of(bytes as u64) {
            return Err(self.bad_access(
                t,
                line,
                format!("a misaligned {bytes}-byte {verb} at {address:#x}"),
            ));
        }
        self.record(t, pc, Space::Global, address, bytes);
        memory.locate(address, bytes).ok_or_else(|| {
            self.bad_access(
                t,
                line,
                format!("a {bytes}-byte {verb} at {address:#x}, outside every allocation"),
            )
        })
    }

    /// Counts one lane's access for its warp-wide access (the `k`-th run of `pc` by the
    /// lanes of its warp).
    fn record(&mut self, t: usize, pc: usize, space: Space, address: u64, bytes: usize) {
        if !self.launch.counters {
            return;
        }
        let thread = &mut self.threads[t];
        let visit = thread.visits.entry(pc).or_insert(0);
        let key = (thread.linear / 32, pc, *visit);
        *visit += 1;
        self.accesses.record(key, space, address, bytes as u64);
    }

    /// The byte offset in shared memory of a `bytes`-wide access.
    fn shared_address(
        &self,
        t: usize,
        addr: &Addr,
        bytes: usize,
        line: usize,
    ) -> Result<usize, ExecError> {
        let at = match addr {
            Addr::Shared(offset) => *offset as u64,
            Addr::Reg(r, offset) => self
                .read(t, &Src::Reg(*r), line)?
                .wrapping_add(*offset as u64),
            Addr::Param(_) => unreachable!("decoded as a parameter read"),
        };
        if at % bytes as u64 != 0 || at + bytes as u64 > self.shared.len() as u64 {
            return Err(self.bad_access(
                t,
                line,
                format!(
                    "a {bytes}-byte shared access at {at:#x} (shared memory holds {} bytes)",
                    self.shared.len()
                ),
            ));
        }
        Ok(at as usize)
    }

    /// Runs the warp collective at `pc` for the `lanes` (thread indices) of one warp.
    fn warp_op(&mut self, lanes: &[usize], pc: usize) -> Result<(), ExecError> {
        let Step { op, line, .. } = &self.decoded.ops[pc];
        if let Op::ShflBfly {
            d,
            p,
            a,
            lane_mask,
            clamp,
        } = op
        {
            let values: Vec<u64> = lanes
                .iter()
                .map(|&l| self.read(l, a, *line))
                .collect::<Result<_, _>>()?;
            let mut results = Vec::with_capacity(lanes.len());
            for (k, &l) in lanes.iter().enumerate() {
                let lane = (self.threads[l].linear % 32) as u64;
                let b = self.read(l, lane_mask, *line)? & 31;
                let c = self.read(l, clamp, *line)?;
                let segmask = (c >> 8) & 31;
                let max_lane = (lane & segmask) | (c & 31 & !segmask);
                let j = lane ^ b;
                let in_range = j <= max_lane;
                let source = if in_range { j } else { lane };
                let from = lanes
                    .iter()
                    .position(|&m| u64::from(self.threads[m].linear % 32) == source)
                    .unwrap_or(k);
                results.push((values[from], in_range));
            }
            for (&l, (v, in_range)) in lanes.iter().zip(results) {
                self.write(l, *d, v & 0xffff_ffff);
                if let Some(p) = p {
                    self.write(l, *p, u64::from(in_range));
                }
            }
        }
        if let Op::Mma {
            shape,
            inputs,
            acc,
            d,
            a,
            b,
            c,
        } = op
        {
            if lanes.len() != 32 {
                return Err(ExecError::Divergence {
                    what: format!("line {line}: mma.sync with {} of 32 lanes", lanes.len()),
                });
            }
            // Elements of a register list: two 16-bit values per register (low first), or
            // one tf32 (its low 13 mantissa bits ignored) or f32 per register.
            let unpack = |regs: &[u64], ty: Ty, tf32: bool| -> Vec<f32> {
                match ty {
                    Ty::F16 => regs
                        .iter()
                        .flat_map(|&r| [r as u16, (r >> 16) as u16])
                        .map(|h| half::f16::from_bits(h).to_f32())
                        .collect(),
                    Ty::Bf16 => regs
                        .iter()
                        .flat_map(|&r| [r as u16, (r >> 16) as u16])
                        .map(|h| half::bf16::from_bits(h).to_f32())
                        .collect(),
                    _ if tf32 => regs
                        .iter()
                        .map(|&r| f32::from_bits(r as u32 & !0x1fff))
                        .collect(),
                    _ => regs.iter().map(|&r| f32::from_bits(r as u32)).collect(),
                }
            };
            let tf32 = *shape == Shape::M16N8K8;
            let mut av: [Vec<f32>; 32] = Default::default();
            let mut bv: [Vec<f32>; 32] = Default::default();
            let mut cv = [[0f32; 4]; 32];
            for (k, &l) in lanes.iter().enumerate() {
                let read = |list: &[Src]| -> Result<Vec<u64>, ExecError> {
                    list.iter().map(|s| self.read(l, s, *line)).collect()
                };
                av[k] = unpack(&read(a)?, *inputs, tf32);
                bv[k] = unpack(&read(b)?, *inputs, tf32);
                let cs = unpack(&read(c)?, *acc, false);
                if av[k].len() != shape.a_per_lane()
                    || bv[k].len() != shape.b_per_lane()
                    || cs.len() != 4
                {
                    return Err(ExecError::Invalid {
                        what: "mma operands of the wrong length".into(),
                        line: *line,
                    });
                }
                cv[k].copy_from_slice(&cs);
            }
            let dv = mma::multiply(*shape, &av, &bv, &cv);
            self.stats.mma += 1;
            for (k, &l) in lanes.iter().enumerate() {
                match acc {
                    Ty::F16 => {
                        let h = |x: f32| u64::from(half::f16::from_f32(x).to_bits());
                        for (r, pair) in d.iter().zip(dv[k].chunks(2)) {
                            self.write(l, *r, h(pair[0]) | h(pair[1]) << 16);
                        }
                    }
                    _ => {
                        for (r, &x) in d.iter().zip(&dv[k]) {
                            self.write(l, *r, u64::from(x.to_bits()));
                        }
                    }
                }
            }
        }
        for &l in lanes {
            self.threads[l].pc = pc + 1;
            self.threads[l].state = State::Running;
            self.stats.instructions += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn kernel(body: &str) -> Kernel {
        let text = format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(\n.param .u64 out\n)\n{{\n{body}\n}}\n"
        );
        parse(&text).unwrap().kernels.remove(0)
    }

    fn launch(threads: u32, out: u64) -> Launch {
        Launch {
            grid: [1, 1, 1],
            block: [threads, 1, 1],
            params: vec![out.to_le_bytes().to_vec()],
            counters: true,
        }
    }

    /// Each thread writes its index to shared memory; after the barrier it reads the
    /// mirrored slot and swaps it with its butterfly partner: out[t] = 63 - (t ^ 1).
    const MIRROR: &str = "
        .shared .align 4 .b8 buf[256];
        ld.param.u64 %rd1, [out];
        mov.u32 %r1, %tid.x;
        shl.b32 %r2, %r1, 2;
        cvt.u64.u32 %rd2, %r2;
        mov.u64 %rd3, buf;
        add.s64 %rd4, %rd3, %rd2;
        st.shared.u32 [%rd4], %r1;
        BARRIER
        mov.u32 %r3, 63;
        sub.s32 %r4, %r3, %r1;
        shl.b32 %r5, %r4, 2;
        cvt.u64.u32 %rd5, %r5;
        add.s64 %rd6, %rd3, %rd5;
        ld.shared.u32 %r6, [%rd6];
        shfl.sync.bfly.b32 %r7, %r6, 1, 31, -1;
        add.s64 %rd7, %rd1, %rd2;
        st.global.u32 [%rd7], %r7;
        ret;";

    fn mirror(barrier: &str) -> Vec<u32> {
        let mut memory = Memory::default();
        let out = memory.upload(&[0xff; 256]);
        let k = kernel(&MIRROR.replace("BARRIER", barrier));
        run(&k, &launch(64, out), &mut memory).unwrap();
        memory
            .download(out, 256)
            .unwrap()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn barriers_order_shared_memory_and_shuffles_exchange_lanes() {
        let want: Vec<u32> = (0..64).map(|t| 63 - (t ^ 1)).collect();
        assert_eq!(mirror("bar.sync 0;"), want);
        // Without the barrier, early threads read slots not yet written.
        assert_ne!(mirror(""), want);
    }

    /// Lane t reads word t·STRIDE of global and shared memory: stride 1 is coalesced and
    /// conflict-free, stride 32 touches a sector per lane and puts every lane on one bank.
    #[test]
    fn counters_see_coalescing_and_bank_conflicts() {
        let body = |stride: u32| {
            format!(
                "
                .shared .align 4 .b8 buf[4096];
                ld.param.u64 %rd1, [out];
                mov.u32 %r1, %tid.x;
                mul.lo.s32 %r2, %r1, {};
                cvt.u64.u32 %rd2, %r2;
                add.s64 %rd3, %rd1, %rd2;
                ld.global.f32 %f1, [%rd3];
                mov.u64 %rd4, buf;
                add.s64 %rd5, %rd4, %rd2;
                st.shared.f32 [%rd5], %f1;
                ret;",
                4 * stride
            )
        };
        let stats = |stride: u32| {
            let mut memory = Memory::default();
            let out = memory.upload(&[0; 4096]);
            run(&kernel(&body(stride)), &launch(32, out), &mut memory).unwrap()
        };
        let (dense, strided) = (stats(1), stats(32));
        assert_eq!((dense.global_sectors, dense.global_min_sectors), (4, 4));
        assert_eq!(
            (strided.global_sectors, strided.global_min_sectors),
            (32, 4)
        );
        assert_eq!((dense.shared_conflicts, strided.shared_conflicts), (0, 31));
        assert_eq!(dense.warps, 1);
        assert!(dense.to_string().contains("1.00x"), "{dense}");
    }

    #[test]
    fn faults_are_typed_errors() {
        let mut memory = Memory::default();
        let out = memory.upload(&[0; 16]);
        let run_body =
            |body: &str, memory: &mut Memory| run(&kernel(body), &launch(32, out), memory);
        let err = run_body("add.s32 %r1, %r2, 1;\nret;", &mut memory).unwrap_err();
        assert!(
            matches!(err, ExecError::Uninitialised { ref reg, .. } if reg == "%r2"),
            "{err}"
        );
        let err = run_body("popc.b32 %r1, %r1;\nret;", &mut memory).unwrap_err();
        assert!(
            matches!(err, ExecError::Unsupported { ref opcode, .. } if opcode == "popc.b32"),
            "{err}"
        );
        let err = run_body(
            "ld.param.u64 %rd1, [out];\nst.global.u32 [%rd1+16], %rd1;\nret;",
            &mut memory,
        )
        .unwrap_err();
        assert!(matches!(err, ExecError::BadAccess { .. }), "{err}");
        let err = run_body(
            "ld.param.u64 %rd1, [out];\nst.global.u32 [%rd1+2], %rd1;\nret;",
            &mut memory,
        )
        .unwrap_err();
        assert!(err.to_string().contains("misaligned"), "{err}");
        // Half the threads skip the barrier: no thread can go on.
        let err = run_body(
            "mov.u32 %r1, %tid.x;\nsetp.lt.u32 %p1, %r1, 16;\n@%p1 bra $L_end;\nbar.sync 0;\n$L_end:\nret;",
            &mut memory,
        )
        .unwrap_err();
        assert!(matches!(err, ExecError::Divergence { .. }), "{err}");
    }

    #[test]
    fn vector_loads_and_stores_move_consecutive_elements() {
        // Each thread copies its 16 bytes through shared memory with .v4 and .v2 accesses,
        // swapping the halves of each 8-byte pair on the way back.
        let body = "
            .shared .align 16 .b8 buf[64];
            ld.param.u64 %rd1, [out];
            mov.u32 %r1, %tid.x;
            mul.wide.u32 %rd2, %r1, 16;
            add.s64 %rd3, %rd1, %rd2;
            ld.global.nc.v4.u32 {%r2, %r3, %r4, %r5}, [%rd3];
            mov.u64 %rd4, buf;
            add.s64 %rd5, %rd4, %rd2;
            st.shared.v4.u32 [%rd5], {%r2, %r3, %r4, %r5};
            ld.shared.v2.u64 {%rd6, %rd7}, [%rd5];
            st.global.v2.u64 [%rd3], {%rd7, %rd6};
            ret;";
        let mut memory = Memory::default();
        let data: Vec<u8> = (0..64).collect();
        let out = memory.upload(&data);
        let k = kernel(body);
        run(&k, &launch(4, out), &mut memory).unwrap();
        let got = memory.download(out, 64).unwrap();
        let want: Vec<u8> = data
            .chunks(16)
            .flat_map(|c| [&c[8..], &c[..8]].concat())
            .collect();
        assert_eq!(got, want);
        // A 16-byte access must be 16-byte aligned.
        let misaligned =
            "ld.param.u64 %rd1, [out];\nld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1+8];\nret;";
        let err = run(&kernel(misaligned), &launch(1, out), &mut memory).unwrap_err();
        assert!(err.to_string().contains("misaligned 16-byte"), "{err}");
    }

    /// One thread runs `body` (which leaves its result in `%rd9`) and stores it: each
    /// instruction kind the decoder takes, end to end through decode and execution.
    fn single(body: &str) -> u64 {
        let mut memory = Memory::default();
        let out = memory.upload(&[0; 8]);
        let text = format!("ld.param.u64 %rd1, [out];\n{body}\nst.global.u64 [%rd1], %rd9;\nret;");
        run(&kernel(&text), &launch(1, out), &mut memory).unwrap();
        u64::from_le_bytes(memory.download(out, 8).unwrap().try_into().unwrap())
    }

    #[test]
    fn every_instruction_kind_runs_end_to_end() {
        let f = |x: f32| u64::from(x.to_bits());
        let cases: &[(&str, u64)] = &[
            ("mov.u64 %rd9, 7;", 7),
            (
                "mov.u32 %r1, 9;\nmul.wide.s32 %rd9, %r1, -2;",
                (-18i64) as u64,
            ),
            ("mov.u64 %rd2, 7;\ndiv.u64 %rd9, %rd2, 2;", 3),
            ("mov.u64 %rd2, -7;\nrem.s64 %rd9, %rd2, 3;", (-1i64) as u64),
            (
                "mov.u32 %r1, 5;\nshl.b32 %r2, %r1, 3;\ncvt.u64.u32 %rd9, %r2;",
                40,
            ),
            (
                "mov.f32 %f1, 0f40000000;\nmov.f32 %f2, 0f40400000;\nfma.rn.f32 %f3, %f1, %f2, %f1;\nmov.b32 %r1, %f3;\ncvt.u64.u32 %rd9, %r1;",
                f(8.0),
            ),
            (
                "mov.f32 %f1, 0f40000000;\nneg.f32 %f2, %f1;\nmov.b32 %r1, %f2;\ncvt.u64.u32 %rd9, %r1;",
                f(-2.0),
            ),
            (
                "mov.f32 %f1, 0f40400000;\nex2.approx.f32 %f2, %f1;\nmov.b32 %r1, %f2;\ncvt.u64.u32 %rd9, %r1;",
                f(8.0),
            ),
            (
                "mov.f32 %f1, 0f41000000;\nlg2.approx.f32 %f2, %f1;\nmov.b32 %r1, %f2;\ncvt.u64.u32 %rd9, %r1;",
                f(3.0),
            ),
            (
                "mov.f32 %f1, 0f40800000;\nrcp.rn.f32 %f2, %f1;\nmov.b32 %r1, %f2;\ncvt.u64.u32 %rd9, %r1;",
                f(0.25),
            ),
            (
                "mov.u32 %r1, -3;\ncvt.rn.f32.s32 %f1, %r1;\nmov.b32 %r2, %f1;\ncvt.u64.u32 %rd9, %r2;",
                f(-3.0),
            ),
            (
                "mov.f64 %fd1, 0d7FF8000000000000;\nsetp.leu.f64 %p1, %fd1, %fd1;\nselp.b64 %rd9, 11, 22, %p1;",
                11,
            ),
            (
                "mov.u32 %r1, 3;\nsetp.lt.s32 %p1, %r1, 2;\nnot.pred %p2, %p1;\nselp.b64 %rd9, 11, 22, %p2;",
                11,
            ),
            (
                "mov.u16 %rs1, 0x1234;\nmov.u16 %rs2, 0x5678;\nmov.b32 %r1, {%rs1, %rs2};\ncvt.u64.u32 %rd9, %r1;",
                0x5678_1234,
            ),
            (
                "mov.u32 %r1, 0x56781234;\nmov.b32 {%rs1, %rs2}, %r1;\ncvt.u64.u16 %rd9, %rs2;",
                0x5678,
            ),
            (
                "mov.f32 %f1, 0f3F808000;\ncvt.rn.bf16.f32 %rs1, %f1;\ncvt.u64.u16 %rd9, %rs1;",
                0x3F80,
            ),
            (
                "mov.u64 %rd9, 1;\nbra $L_skip;\nmov.u64 %rd9, 2;\n$L_skip:",
                1,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(single(body), *want, "{body}");
        }
    }
}
