//! `torch.get_num_threads` / `set_num_threads`: the size of the CPU kernels' pool, and the
//! pool itself.
//!
//! The CPU kernels run their parallel parts on a pool of worker threads that lives for the
//! process (as OpenMP's does): starting threads per call cost small products a third of
//! their time. A worker that finishes spins for a short while before it sleeps, so that
//! the next call in a loop finds it awake.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use crate::core::flag::{EnvInit, Flag};
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
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .map(|n| n.min(MAX_THREADS as u32))
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

/// The most threads the CPU kernels run on: a larger request is capped here, with a
/// warning, as OpenMP caps a request to its thread limit.
pub const MAX_THREADS: usize = 1024;

/// Sets the number of threads the CPU kernels run on: at least 1 (0 is an error), at most
/// [`MAX_THREADS`] (more is capped, with a warning).
pub fn set_num_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Err(Error::InvalidArgument {
            what: "thread count",
            why: format!("got 0; pass a count between 1 and {MAX_THREADS}"),
        });
    }
    if threads > MAX_THREADS {
        log::warn!("set_num_threads({threads}): capped to {MAX_THREADS} threads");
    }
    NUM_THREADS.set(threads.min(MAX_THREADS) as u32);
    Ok(())
}

/// How long an idle worker, or a caller waiting for its workers, spins before it sleeps:
/// 100 us, or as `OMP_WAIT_POLICY` asks (as OpenMP reads it): `passive` never spins,
/// `active` spins for 10 ms.
pub(crate) fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| spin_for(std::env::var("OMP_WAIT_POLICY").ok().as_deref()))
}

fn spin_for(policy: Option<&str>) -> Duration {
    match policy.map(|p| p.trim().to_ascii_lowercase()).as_deref() {
        Some("passive") => Duration::ZERO,
        Some("active") => Duration::from_millis(10),
        _ => Duration::from_micros(100),
    }
}

/// Runs `task(0, team)`, `task(1, team)`, ..., `task(team - 1, team)` at the same time,
/// for a team of at most `count` threads: index 0 on the calling thread, the others on the
/// pool's workers (started on first use). Returns when every index has finished; a panic
/// in any is resumed here. The indices may wait on each other (barriers sized by `team`):
/// each has a thread of its own. Where the pool is busy (a call from another thread, or
/// from inside a task), the call runs on threads started for it. Where threads cannot be
/// started (the process is at its thread limit), the team is the threads there are, down
/// to the caller alone: no index ever waits on a thread that does not exist.
pub(crate) fn parallel(count: usize, task: &(dyn Fn(usize, usize) + Sync)) {
    team_call(count, task, false);
}

/// [`parallel`], and with `withdraw`, for a task whose indices claim their work from what
/// is left (so that an index that never runs leaves nothing undone): once the caller's own
/// index returns, a worker that has not taken its index yet is not waited for, its index
/// withdrawn. On a VM whose idle CPUs wake slowly a sleeping worker can take longer to
/// start than a short call's work (`OMP_WAIT_POLICY=PASSIVE` on 2 cores of an AMD EPYC VM:
/// a split decoding step of 0.1 ms waited for it as long again).
fn team_call(count: usize, task: &(dyn Fn(usize, usize) + Sync), withdraw: bool) {
    if count <= 1 {
        if count == 1 {
            task(0, 1);
        }
        return;
    }
    let pool = Pool::get();
    // (A panic resumed through an earlier call poisoned the lock; the pool is still whole.)
    let _busy = match pool.busy.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return scoped(count, task),
    };
    let workers = pool.workers(count - 1);
    let team = workers.len() + 1;
    let latch = Arc::new(Latch::new(team - 1));
    // SAFETY: only the lifetime is erased. The workers call the task before they count the
    // latch down, and this function returns only once the latch reached zero, so no worker
    // uses the task after its borrow ends.
    let erased: *const (dyn Fn(usize, usize) + Sync + 'static) =
        unsafe { std::mem::transmute(task) };
    for (index, worker) in (1..team).zip(&workers) {
        worker.give(Job {
            task: erased,
            index,
            team,
            latch: Arc::clone(&latch),
        });
    }
    let own = catch_unwind(AssertUnwindSafe(|| task(0, team)));
    if withdraw {
        for worker in &workers {
            if worker.withdraw() {
                latch.count_down();
            }
        }
    }
    latch.wait();
    if let Err(panic) = own {
        resume_unwind(panic);
    }
    if let Some(panic) = lock(&latch.panic).take() {
        resume_unwind(panic);
    }
}

/// How many pool workers the process has started so far.
pub(crate) fn workers_started() -> usize {
    lock(&Pool::get().workers).started.len()
}

/// [`parallel`] on threads started for the call: the team is the caller and every thread
/// that could be started; the started ones wait until the team is known.
fn scoped(count: usize, task: &(dyn Fn(usize, usize) + Sync)) {
    let panic = Mutex::new(None);
    let run = |index, team| {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(index, team))) {
            lock(&panic).get_or_insert(payload);
        }
    };
    let team_size: (Mutex<Option<usize>>, Condvar) = (Mutex::new(None), Condvar::new());
    let team_of = || {
        let mut known = lock(&team_size.0);
        loop {
            if let Some(team) = *known {
                return team;
            }
            known = team_size
                .1
                .wait(known)
                .unwrap_or_else(PoisonError::into_inner);
        }
    };
    let (run, team_of) = (&run, &team_of);
    std::thread::scope(|s| {
        let mut team = 1;
        for index in 1..count {
            let started = !spawn_refused()
                && std::thread::Builder::new()
                    .spawn_scoped(s, move || run(index, team_of()))
                    .is_ok();
            if !started {
                break;
            }
            team += 1;
        }
        *lock(&team_size.0) = Some(team);
        team_size.1.notify_all();
        run(0, team);
    });
    if let Some(payload) = lock(&panic).take() {
        resume_unwind(payload);
    }
}

/// Runs `work` on every item, on a team of at most one thread per item and at most
/// [`get_num_threads`] (the calling thread and the pool's workers, see [`parallel`]), each
/// thread taking the next item left until none is: a worker that starts late takes fewer,
/// and one that has not started when the caller finds none left is not waited for.
pub(crate) fn for_each<I: Send>(items: Vec<I>, work: &(impl Fn(I) + Sync)) {
    let team = items.len().min(get_num_threads());
    for_each_on(team, items, work);
}

/// [`for_each`] for work that can fail: every item runs, and the error of one that failed
/// (if any did) is returned.
pub(crate) fn try_for_each<I: Send>(
    items: Vec<I>,
    work: &(impl Fn(I) -> Result<()> + Sync),
) -> Result<()> {
    let failure = Mutex::new(Ok(()));
    for_each(items, &|item| {
        if let Err(error) = work(item) {
            *lock(&failure) = Err(error);
        }
    });
    failure.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// [`for_each`] on a team of at most `team` threads, which take the items in order: more
/// items than threads balance uneven ones.
pub(crate) fn for_each_on<I: Send>(team: usize, items: Vec<I>, work: &(impl Fn(I) + Sync)) {
    let slots: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let next = AtomicUsize::new(0);
    let claim = |_: usize, _: usize| {
        while let Some(slot) = slots.get(next.fetch_add(1, Ordering::Relaxed)) {
            if let Some(item) = lock(slot).take() {
                work(item);
            }
        }
    };
    team_call(team.min(slots.len()), &claim, true);
}

#[cfg(test)]
thread_local! {
    /// Set by a unit test: starting a thread from this thread fails, as at the process's
    /// thread limit.
    pub(crate) static REFUSE_SPAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Holds the pool busy until the guard drops (unit tests: calls then start threads of
/// their own).
#[cfg(test)]
pub(crate) fn hold_pool() -> MutexGuard<'static, ()> {
    lock(&Pool::get().busy)
}

/// Whether starting a thread is refused on this thread (unit tests simulate a process at
/// its thread limit with it; never otherwise).
fn spawn_refused() -> bool {
    #[cfg(test)]
    return REFUSE_SPAWN.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// Locks a mutex whether or not a panicking thread poisoned it (the pool resumes panics
/// itself; the data behind its locks stays consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process's workers.
struct Pool {
    /// Held while a call uses the workers.
    busy: Mutex<()>,
    /// The workers started so far.
    workers: Mutex<Workers>,
}

/// The started workers, and the process they were started in: a child made by `fork` has
/// none of its parent's threads, and starts its own.
struct Workers {
    pid: u32,
    started: Vec<Arc<Worker>>,
}

impl Pool {
    fn get() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| Pool {
            busy: Mutex::new(()),
            workers: Mutex::new(Workers {
                pid: std::process::id(),
                started: Vec::new(),
            }),
        })
    }

    /// The first `count` workers, starting those missing.
    fn workers(&self, count: usize) -> Vec<Arc<Worker>> {
        let mut guard = lock(&self.workers);
        if guard.pid != std::process::id() {
            guard.pid = std::process::id();
            // The parent's workers do not run in this process.
            guard.started.clear();
        }
        let workers = &mut guard.started;
        while workers.len() < count {
            let worker = Arc::new(Worker::default());
            let theirs = Arc::clone(&worker);
            let name = format!("backends-worker-{}", workers.len() + 1);
            // A worker that cannot start leaves the pool smaller: calls run with the
            // workers there are.
            if spawn_refused()
                || std::thread::Builder::new()
                    .name(name)
                    .spawn(move || theirs.serve())
                    .is_err()
            {
                break;
            }
            workers.push(worker);
        }
        workers.iter().take(count).cloned().collect()
    }
}

/// One index of a call, handed to a worker.
struct Job {
    task: *const (dyn Fn(usize, usize) + Sync),
    index: usize,
    team: usize,
    latch: Arc<Latch>,
}

// SAFETY: the task is `Sync` and outlives the job (see `parallel`); the rest is `Send`.
unsafe impl Send for Job {}

/// A worker thread's mailbox.
#[derive(Default)]
struct Worker {
    /// Set when a job waits in `slot` (read while spinning, without the lock).
    posted: AtomicBool,
    slot: Mutex<Slot>,
    wake: Condvar,
}

#[derive(Default)]
struct Slot {
    job: Option<Job>,
    sleeping: bool,
}

impl Worker {
    fn give(&self, job: Job) {
        let mut slot = lock(&self.slot);
        slot.job = Some(job);
        self.posted.store(true, Ordering::Release);
        if slot.sleeping {
            self.wake.notify_one();
        }
    }

    /// Takes back the job given to this worker where it has not taken it yet (it then never
    /// runs): whether it was taken back.
    fn withdraw(&self) -> bool {
        let mut slot = lock(&self.slot);
        let withdrawn = slot.job.take().is_some();
        if withdrawn {
            self.posted.store(false, Ordering::Relaxed);
        }
        withdrawn
    }

    /// The worker thread's loop: take a job, run it, count the latch down.
    fn serve(&self) {
        loop {
            let job = self.next_job();
            // SAFETY: the task outlives the job until the latch is counted down below.
            let task = unsafe { &*job.task };
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| task(job.index, job.team))) {
                *lock(&job.latch.panic) = Some(panic);
            }
            job.latch.count_down();
        }
    }

    /// Spins for a new job for [`spin`]'s time, then sleeps until one comes.
    fn next_job(&self) -> Job {
        let start = Instant::now();
        let spin = spin();
        while !self.posted.load(Ordering::Acquire) && start.elapsed() < spin {
            std::hint::spin_loop();
        }
        let mut slot = lock(&self.slot);
        loop {
            if let Some(job) = slot.job.take() {
                self.posted.store(false, Ordering::Relaxed);
                slot.sleeping = false;
                return job;
            }
            slot.sleeping = true;
            slot = self.wake.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Counts a call's running workers down to zero.
struct Latch {
    remaining: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    lock: Mutex<()>,
    done: Condvar,
}

impl Latch {
    fn new(count: usize) -> Self {
        Latch {
            remaining: AtomicUsize::new(count),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            done: Condvar::new(),
        }
    }

    fn count_down(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Taken so that a waiter between its check and its sleep cannot miss the call.
            let _guard = lock(&self.lock);
            self.done.notify_all();
        }
    }

    /// Spins for [`spin`]'s time, then sleeps until every worker has counted down.
    fn wait(&self) {
        let start = Instant::now();
        while self.remaining.load(Ordering::Acquire) != 0 {
            if start.elapsed() >= spin() {
                let mut guard = lock(&self.lock);
                while self.remaining.load(Ordering::Acquire) != 0 {
                    guard = self
                        .done
                        .wait(guard)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                return;
            }
            std::hint::spin_loop();
        }
    }
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

    /// Runs `parallel(count)` with every index meeting at a barrier of the team's size;
    /// returns the team and how often each index ran.
    fn meet(count: usize) -> (usize, Vec<usize>) {
        let barrier = OnceLock::new();
        let team_seen = AtomicUsize::new(0);
        let seen: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
        parallel(count, &|index, team| {
            // Every index waits for all the others: they must run at the same time.
            barrier.get_or_init(|| std::sync::Barrier::new(team)).wait();
            team_seen.store(team, Ordering::Relaxed);
            seen[index].fetch_add(1, Ordering::Relaxed);
        });
        let seen = seen.iter().map(|n| n.load(Ordering::Relaxed)).collect();
        (team_seen.load(Ordering::Relaxed), seen)
    }

    #[test]
    fn a_job_not_yet_taken_is_withdrawn_and_never_runs() {
        let ran = AtomicUsize::new(0);
        let task = |_: usize, _: usize| {
            ran.fetch_add(1, Ordering::Relaxed);
        };
        let erased: *const (dyn Fn(usize, usize) + Sync + 'static) =
            // SAFETY: the job is withdrawn below, before `task`'s borrow ends, and never run
            // (this worker has no thread serving it).
            unsafe { std::mem::transmute(&task as &(dyn Fn(usize, usize) + Sync)) };
        let worker = Worker::default();
        let latch = Arc::new(Latch::new(1));
        worker.give(Job {
            task: erased,
            index: 1,
            team: 2,
            latch: Arc::clone(&latch),
        });
        assert!(worker.posted.load(Ordering::Relaxed));
        assert!(worker.withdraw(), "a job waiting in the slot is taken back");
        assert!(!worker.posted.load(Ordering::Relaxed) && lock(&worker.slot).job.is_none());
        assert!(!worker.withdraw(), "nothing is left to take back");
        assert_eq!(ran.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn for_each_runs_every_item_once_however_late_the_workers_start() {
        // Items as short as a call's smallest work, and as long: the caller often finds
        // none left before a worker wakes (its index is then withdrawn), sometimes not.
        for round in 0..2000 {
            let count = 2 + round % 5;
            let seen: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            for_each((0..count).collect(), &|i: usize| {
                if round % 100 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                seen[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                seen.iter().all(|n| n.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
        // And the pool still runs every index of a call that needs them all at once.
        assert_eq!(meet(3), (3, vec![1; 3]));
    }

    #[test]
    fn for_each_runs_on_no_more_threads_than_get_num_threads() {
        // Many slow items: without the cap each would get a thread of its own (an FFT's
        // batch of 64 matrices started 63 workers under `set_num_threads(1)`).
        let threads = Mutex::new(Vec::new());
        let done = AtomicUsize::new(0);
        for_each((0..64).collect(), &|_: usize| {
            std::thread::sleep(Duration::from_micros(300));
            let id = std::thread::current().id();
            let mut seen = lock(&threads);
            if !seen.contains(&id) {
                seen.push(id);
            }
            done.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(done.load(Ordering::Relaxed), 64);
        let used = threads.into_inner().unwrap().len();
        assert!(
            (1..=get_num_threads()).contains(&used),
            "{used} threads for get_num_threads() = {}",
            get_num_threads()
        );
    }

    #[test]
    fn try_for_each_runs_every_item_and_returns_a_failure() {
        let done = AtomicUsize::new(0);
        let run = |failing: usize| {
            try_for_each((0..16).collect(), &|i: usize| {
                done.fetch_add(1, Ordering::Relaxed);
                match i == failing {
                    true => Err(Error::InvalidArgument {
                        what: "item",
                        why: format!("item {i}"),
                    }),
                    false => Ok(()),
                }
            })
        };
        assert!(run(16).is_ok());
        let failed = run(5).unwrap_err();
        assert!(failed.to_string().contains("item 5"), "{failed}");
        assert_eq!(done.load(Ordering::Relaxed), 32);
    }

    #[test]
    fn parallel_runs_every_index_at_once_and_again() {
        for count in [1, 2, 5, 3] {
            assert_eq!(meet(count), (count, vec![1; count]));
        }
    }

    #[test]
    fn without_new_threads_calls_run_with_the_threads_there_are() {
        REFUSE_SPAWN.with(|r| r.set(true));
        // More than the pool can have started: the team is the workers there are (maybe
        // none) and the caller; each team index runs once, the rest never.
        let count = 3 * MAX_THREADS;
        let (team, seen) = meet(count);
        assert!((1..count).contains(&team), "team {team}");
        assert!(seen[..team].iter().all(|&n| n == 1));
        assert!(seen[team..].iter().all(|&n| n == 0));
        // Every item still gets its call, on the team there is.
        let done = AtomicUsize::new(0);
        for_each((0..count).collect(), &|_| {
            done.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(done.load(Ordering::Relaxed), count);
        // With the pool busy, a call starts threads of its own: none here, so the caller
        // runs alone.
        let held = hold_pool();
        assert_eq!(meet(4), (1, vec![1, 0, 0, 0]));
        drop(held);
        REFUSE_SPAWN.with(|r| r.set(false));
    }

    #[test]
    fn a_call_from_inside_a_task_or_another_thread_still_runs() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    parallel(2, &|_, _| {
                        parallel(3, &|_, _| {
                            total.fetch_add(1, Ordering::Relaxed);
                        })
                    })
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 2 * 3);
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller_and_the_pool_goes_on() {
        let caught = catch_unwind(|| {
            parallel(3, &|index, _| {
                if index == 2 {
                    panic!("worker two fails");
                }
            })
        });
        let message = caught.expect_err("the panic is resumed on the caller");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"worker two fails"));
        let ran = AtomicUsize::new(0);
        parallel(3, &|_, _| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        // The resumed panic poisoned the pool's lock; later calls still get its workers
        // (other tests may hold the pool for a moment: try a few times).
        let on_workers = (0..200).any(|_| {
            let named = AtomicUsize::new(0);
            parallel(2, &|index, _| {
                let name = std::thread::current().name().map(str::to_owned);
                if index == 1 && name.is_some_and(|n| n.starts_with("backends-worker")) {
                    named.fetch_add(1, Ordering::Relaxed);
                }
            });
            std::thread::sleep(Duration::from_millis(1));
            named.load(Ordering::Relaxed) == 1
        });
        assert!(
            on_workers,
            "calls after a panic never reached the pool's workers"
        );
    }

    #[test]
    fn for_each_hands_every_item_to_one_call() {
        let mut data = [0u32; 10];
        for_each(data.chunks_mut(3).collect(), &|chunk: &mut [u32]| {
            chunk.iter_mut().for_each(|x| *x += 1)
        });
        assert!(data.iter().all(|&x| x == 1));
    }

    #[test]
    fn omp_wait_policy_sets_the_spin() {
        assert_eq!(spin_for(Some("PASSIVE")), Duration::ZERO);
        assert_eq!(spin_for(Some("active")), Duration::from_millis(10));
        assert_eq!(spin_for(None), Duration::from_micros(100));
        assert_eq!(spin_for(Some("sometimes")), Duration::from_micros(100));
    }

    #[test]
    fn zero_threads_is_an_error() {
        let err = set_num_threads(0).unwrap_err();
        assert!(err.to_string().contains("thread count"), "{err}");
    }
}
