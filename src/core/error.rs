//! The crate's error type: every fallible call returns [`Result`].

/// Everything that can go wrong in this library. Each message says what to do about it.
#[derive(Debug, thiserror::Error, PartialEq)]
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
    /// Something this call needs is not present on this machine or in this build.
    #[error("{what} is not available: {why}")]
    Unavailable {
        /// What is missing.
        what: &'static str,
        /// Why, and how to get it.
        why: String,
    },
    /// NVRTC rejected a kernel (a bug in a template: please report it with this log).
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// The CUDA driver cannot load PTX this new.
    #[error(
        "the CUDA driver (CUDA {driver_major}.{driver_minor}) accepts PTX up to ISA {max_ptx}, but the kernels \
         need ISA {needed}: update the NVIDIA driver, or rebuild with an older NVRTC"
    )]
    DriverTooOld {
        /// The driver's CUDA major version.
        driver_major: u32,
        /// The driver's CUDA minor version.
        driver_minor: u32,
        /// The newest PTX ISA the driver accepts, e.g. `8.8`.
        max_ptx: String,
        /// The PTX ISA the kernels were generated as.
        needed: String,
    },
    /// Operands live on different devices.
    #[error("{op}: operands are on {a} and {b}; move them to one device with Tensor::to_device")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's device.
        a: crate::Device,
        /// The other operand's device.
        b: crate::Device,
    },
    /// An operand has another element type than the operation needs.
    #[error("{op}: expected {expected}, got {got}; convert the operand first")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The element type needed.
        expected: crate::DType,
        /// The element type given.
        got: crate::DType,
    },
    /// Operand shapes do not fit together.
    #[error("{op}: {detail}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// What does not fit, with the shapes.
        detail: String,
    },
    /// Caller memory borrowed by a tensor cannot be used as asked: written through a
    /// read-only borrow, or read after its borrow ended.
    #[error("{op}: {detail}")]
    Borrow {
        /// The operation.
        op: &'static str,
        /// What went wrong and what to do.
        detail: String,
    },
    /// A device could not allocate memory.
    #[error(
        "out of memory on {device}: {bytes} bytes ({why}); use smaller inputs or another device"
    )]
    OutOfMemory {
        /// The device.
        device: crate::Device,
        /// The allocation's size.
        bytes: u64,
        /// The device's answer.
        why: String,
    },
    /// No enabled SDPA backend can serve the call; every enabled backend's reasons are listed.
    #[error("{}", crate::core::sdp::no_kernel_message(reasons))]
    NoAvailableKernel {
        /// Each enabled backend with its reasons.
        reasons: Vec<crate::core::sdp::Verdict>,
    },
    /// A matrix of the batch has no factorization or inverse (`torch.linalg.LinAlgError`):
    /// `batch` is its index in the flattened batch (`None` for an unbatched input).
    #[error("{op}: {}{failure}", batch_prefix(*batch))]
    LinAlg {
        /// The operation, as PyTorch names it (`linalg.inv`).
        op: &'static str,
        /// The failing matrix's index in the flattened batch dimensions.
        batch: Option<usize>,
        /// What failed.
        failure: LinAlgFailure,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {call}: {detail}")]
    Driver {
        /// The call that failed.
        call: &'static str,
        /// The driver's error.
        detail: String,
    },
}

/// Why a linear-algebra call failed on one matrix (the messages are PyTorch's, with what to
/// do appended). Indices count from 1, as LAPACK's and PyTorch's messages do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinAlgFailure {
    /// An inversion met a zero on U's diagonal.
    Singular {
        /// The diagonal element that is zero (from 1).
        diagonal: usize,
    },
    /// `lu_factor` produced a zero pivot, which `lu_solve` would divide by.
    ZeroPivot {
        /// The zero pivot's row and column (from 1).
        index: usize,
    },
    /// Cholesky met a leading minor that is not positive-definite.
    NotPositiveDefinite {
        /// The order of the first such minor (from 1).
        minor: usize,
    },
    /// An iterative decomposition (eigh, svd) did not converge.
    NoConvergence,
}

impl std::fmt::Display for LinAlgFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinAlgFailure::Singular { diagonal } => write!(
                f,
                "The diagonal element {diagonal} is zero, the inversion could not be completed \
                 because the input matrix is singular; check the matrix's rank"
            ),
            LinAlgFailure::ZeroPivot { index } => write!(
                f,
                "U[{index},{index}] is zero and using it on lu_solve would result in a division \
                 by zero; call linalg::lu, which factors singular matrices too"
            ),
            LinAlgFailure::NotPositiveDefinite { minor } => write!(
                f,
                "The factorization could not be completed because the input is not \
                 positive-definite (the leading minor of order {minor} is not positive-definite)"
            ),
            LinAlgFailure::NoConvergence => write!(
                f,
                "The algorithm failed to converge; check the input for values of extreme \
                 magnitude"
            ),
        }
    }
}

fn batch_prefix(batch: Option<usize>) -> String {
    batch.map_or_else(String::new, |b| format!("(Batch element {b}): "))
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
