//! The per-kernel trace of `mkl::verbose` / `mkldnn::verbose` (and `MKL_VERBOSE` /
//! `DNNL_VERBOSE`): one line per kernel call with its name, backend, dtype, shapes,
//! precision mode and time, on stderr (and to a capture, for tests).

use std::cell::RefCell;
use std::time::Instant;

use crate::Result;

/// What one kernel call reports.
pub(crate) struct Call {
    /// Kernel name.
    pub kernel: String,
    /// Backend and code path, e.g. `cpu/avx512`, `wgpu:0`, `cuda:0/cublas`.
    pub backend: String,
    /// Element type.
    pub dtype: crate::DType,
    /// Operand shapes.
    pub shapes: String,
    /// Precision mode, and what the flags did on this backend.
    pub precision: String,
}

thread_local! {
    static CAPTURE: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Runs `run`, and when the trace is on, reports it as one line with its time.
pub(crate) fn kernel<T>(
    describe: impl FnOnce() -> Call,
    run: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if crate::core::verbose::level() == 0 {
        return run();
    }
    let start = Instant::now();
    let out = run();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let c = describe();
    let line = format!(
        "backends_verbose,exec,{},{},{},{},{},{}{ms:.3}ms",
        c.backend,
        c.kernel,
        c.dtype,
        c.shapes,
        c.precision,
        if out.is_ok() { "" } else { "failed," }
    );
    let captured = CAPTURE.with(|c| {
        c.borrow_mut()
            .as_mut()
            .map(|lines| lines.push(line.clone()))
            .is_some()
    });
    if !captured {
        eprintln!("{line}");
    }
    out
}

/// Collects this thread's trace lines instead of printing them, until dropped.
#[must_use = "lines are collected until the capture drops"]
pub struct Capture {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Capture {
    /// Starts collecting this thread's trace lines.
    pub fn start() -> Capture {
        CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
        Capture {
            _not_send: std::marker::PhantomData,
        }
    }

    /// The lines collected so far (and clears them).
    pub fn take(&self) -> Vec<String> {
        CAPTURE.with(|c| {
            c.borrow_mut()
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        CAPTURE.with(|c| *c.borrow_mut() = None);
    }
}
