//! # backends-ptx
//!
//! A PTX interpreter, written for the kernels `backends` ships: it reads the PTX that NVRTC
//! emits ([`parse`]) and runs a grid of it on the CPU ([`exec`]: per-thread registers, warp
//! collectives, CTA barriers, global and shared memory), so that the CUDA kernels and
//! launchers are tested on machines without a GPU. Not yet run: `mma.sync` (the
//! tensor-core kernels), vector loads and stores.
//!
//! Unknown syntax is a typed error naming what was not understood, never skipped.

pub mod exec;
pub mod parse;

pub use exec::{ExecError, Launch, Memory, Stats, run};
pub use parse::{Address, Guard, Instruction, Kernel, Module, Operand, Param, ParseError, Shared};
