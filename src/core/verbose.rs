//! The per-kernel trace level shared by `mkl::verbose` and `mkldnn::verbose`.
//!
//! Each module keeps its own level (a guard sets one for a scope; `MKL_VERBOSE` /
//! `DNNL_VERBOSE` set it for the process); the trace covers this library's kernels on
//! every backend at the higher of the two levels.

use crate::core::flag::{EnvInit, Flag, Guard, ScopedGuard};
use crate::{Error, Result};

/// No trace.
pub const VERBOSE_OFF: u32 = 0;
/// One trace line per kernel call.
pub const VERBOSE_ON: u32 = 1;
/// Also kernel creation and compilation events.
pub const VERBOSE_ON_CREATION: u32 = 2;

/// The trace level set through `mkl::verbose` (0 or 1). `MKL_VERBOSE` sets it for the process.
pub static MKL_VERBOSE: Flag<u32> = Flag::new(
    "mkl.verbose",
    VERBOSE_OFF,
    Some(EnvInit {
        var: "MKL_VERBOSE",
        parse: |s| crate::core::verbose::parse_level(s, VERBOSE_ON),
    }),
);

/// The trace level set through `mkldnn::verbose` (0, 1 or 2). `DNNL_VERBOSE` sets it for the process.
pub static MKLDNN_VERBOSE: Flag<u32> = Flag::new(
    "mkldnn.verbose",
    VERBOSE_OFF,
    Some(EnvInit {
        var: "DNNL_VERBOSE",
        parse: |s| crate::core::verbose::parse_level(s, VERBOSE_ON_CREATION),
    }),
);

/// Parses a `*_VERBOSE` environment value: a level number, capped at `max`.
pub(crate) fn parse_level(text: &str, max: u32) -> Option<u32> {
    text.parse::<u32>().ok().map(|level| level.min(max))
}

fn checked(flag: &'static Flag<u32>, level: u32, max: u32) -> Result<()> {
    if level <= max {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            what: "verbose level",
            why: format!("{} accepts levels 0..={max}, got {level}", flag.name()),
        })
    }
}

/// A process-wide guard setting `flag` to `level` (at most `max`).
pub(crate) fn guard(flag: &'static Flag<u32>, level: u32, max: u32) -> Result<Guard> {
    checked(flag, level, max)?;
    Ok(flag.guard(level))
}

/// A thread-scoped guard setting `flag` to `level` (at most `max`).
pub(crate) fn guard_scoped(flag: &'static Flag<u32>, level: u32, max: u32) -> Result<ScopedGuard> {
    checked(flag, level, max)?;
    Ok(flag.guard_scoped(level))
}

/// The trace level in force on this thread: the higher of `mkl` and `mkldnn`'s.
pub fn level() -> u32 {
    MKL_VERBOSE.get().max(MKLDNN_VERBOSE.get())
}

/// Prints a kernel creation or compilation event (built by `message`) at level 2.
pub(crate) fn creation_event(message: impl FnOnce() -> String) {
    if level() >= VERBOSE_ON_CREATION {
        eprintln!("backends_verbose,create,{}", message());
    }
}
