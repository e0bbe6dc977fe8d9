//! # backends-spec
//!
//! The plain data that the `backends` library, its kernel generator and the
//! `#[sdpa_kernel]` attribute share, with no dependencies:
//!
//! - [`keys`]: the typed key of every kernel variant;
//! - [`variants`]: every declared specialisation (the one place to add one) and its launch
//!   geometry;
//! - [`table`]: the types of the generated dispatch table;
//! - [`rules`]: what each SDPA backend accepts, read by the run-time selection and by the
//!   compile-time checks of `#[sdpa_kernel]` alike.

pub mod keys;
pub mod rules;
pub mod table;
pub mod variants;
