//! `torch.backends.openmp`: whether the CPU kernels run multi-threaded.
//!
//! This library uses its own thread pool rather than OpenMP: workers started on first use
//! and kept for the process, which spin briefly after a call and then sleep (as OpenMP's
//! do; `OMP_WAIT_POLICY=passive` or `active` changes the spin as it would OpenMP's). Its
//! size is [`crate::get_num_threads`] (`OMP_NUM_THREADS` sets it, as it would OpenMP's).

/// Whether the CPU kernels run on more than one thread.
pub fn is_available() -> bool {
    crate::get_num_threads() > 1
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "pool": "backends (persistent workers)",
        "workers_started": crate::runtime::threads::workers_started(),
        "spin_us": crate::runtime::threads::spin().as_micros() as u64,
        "num_threads": crate::get_num_threads(),
        "num_threads_setting": crate::runtime::threads::NUM_THREADS.report(),
    })
}
