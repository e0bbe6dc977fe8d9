//! # backends-ptx
//!
//! A PTX interpreter, written for the kernels `backends` ships: it reads the PTX that NVRTC
//! emits ([`parse`]) and runs a grid of it on the CPU ([`exec`]: per-thread registers, warp
//! collectives, CTA barriers, global and shared memory), so that the CUDA kernels and
//! launchers are tested on machines without a GPU; [`mma`] holds the tensor-core fragment
//! layouts, and a launch's counters ([`Stats`]: instructions, coalescing, bank conflicts)
//! are counted in `counters.rs`. Not yet run: vector loads and stores, atomics, calls.
//!
//! Unknown syntax is a typed error naming what was not understood, never skipped.

mod counters;
mod decode;
pub mod exec;
mod memory;
pub mod mma;
pub mod parse;
mod semantics;

pub use counters::Stats;
pub use exec::{ExecError, Launch, run};
pub use memory::Memory;
pub use parse::{Address, Guard, Instruction, Kernel, Module, Operand, Param, ParseError, Shared};
