//! The crate's error type: every fallible call returns [`Result`].

/// Everything that can go wrong in this library. Each message says what to do about it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A string option got a spelling that PyTorch does not use.
    #[error("unknown {option} {got:?}: use one of {accepted}")]
    UnknownOption {
        /// Which option was being parsed.
        option: &'static str,
        /// The text that was given.
        got: String,
        /// The accepted spellings, comma-separated.
        accepted: String,
    },
    /// An argument is outside the range the call accepts.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// What is wrong with it and what would be accepted.
        why: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
