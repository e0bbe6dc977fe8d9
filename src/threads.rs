//! `torch.get_num_threads` / `set_num_threads`: the size of the CPU kernels' pool.

use std::sync::OnceLock;

use crate::flag::{EnvInit, Flag};
use crate::{Error, Result};

/// Threads the CPU kernels use; 0 means one per logical CPU. `OMP_NUM_THREADS` sets it.
pub static NUM_THREADS: Flag<u32> = Flag::new(
    "num_threads",
    0,
    Some(EnvInit {
        var: "OMP_NUM_THREADS",
        parse: parse_thread_count,
    }),
);

fn parse_thread_count(text: &str) -> Option<u32> {
    // OMP_NUM_THREADS may list one count per nesting level ("4,2"); the first applies.
    text.split(',')
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|&n| n > 0)
}

/// The number of threads the CPU kernels run on.
pub fn get_num_threads() -> usize {
    // Asking the OS reads cgroup files (tens of microseconds): once per process.
    static LOGICAL_CPUS: OnceLock<usize> = OnceLock::new();
    match NUM_THREADS.get() {
        0 => *LOGICAL_CPUS
            .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n as usize,
    }
}

/// Sets the number of threads the CPU kernels run on (at least 1).
pub fn set_num_threads(threads: usize) -> Result<()> {
    let count = u32::try_from(threads)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::InvalidArgument {
            what: "thread count",
            why: format!("got {threads}; pass a count between 1 and {}", u32::MAX),
        })?;
    NUM_THREADS.set(count);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omp_num_threads_spellings() {
        assert_eq!(parse_thread_count("4"), Some(4));
        assert_eq!(parse_thread_count("4,2"), Some(4));
        assert_eq!(parse_thread_count("0"), None);
        assert_eq!(parse_thread_count("many"), None);
    }

    #[test]
    fn zero_threads_is_an_error() {
        let err = set_num_threads(0).unwrap_err();
        assert!(err.to_string().contains("thread count"), "{err}");
    }
}
