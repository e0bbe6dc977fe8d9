//! The core layer: what every other layer builds on. Element types, devices, errors, the
//! flag machinery, the tensor, tracing and verbosity, the precision and determinism
//! settings, and the random generators. Nothing here imports a layer above it.

pub mod borrow;
pub mod cudnn;
pub mod determinism;
pub mod device;
pub mod dtype;
pub mod error;
pub mod flag;
pub mod generator;
pub mod host_cache;
pub mod precision;
pub mod sdp;
pub mod tensor;
pub mod trace;
pub mod verbose;
pub mod view;
