//! Releases that wait for the GPU, run off the thread that drops.
//!
//! The CUDA driver's `cuMemHostUnregister` and `cuMemFree` wait until the device has finished
//! the work queued before them. On an H200, dropping even a 16-byte pinned buffer did not
//! return while a CUDA stream stood at a memory wait for a host word; it returned the moment the
//! word was written. So a thread that drops a queue pair, a completion queue or a communicator
//! while one of its streams waits for something the same thread does next would hang forever.
//!
//! Memory the GPU can reach is therefore given back here: its owner's `drop` hands the release
//! to one thread of the library, which runs releases in the order they came, and returns at
//! once. The queue holds only releases of memory that already exists, so it is as bounded as the
//! memory itself.
//!
//! While the driver's release waits for the device, other threads' allocations, registrations,
//! new streams and copies wait behind it, so each release runs only once the process's streams
//! are idle, with new work on them held back meanwhile (`quiet`). A stream that
//! never moves delays only the releases (the memory stays allocated), not the threads.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

/// The releases not run yet, and whether one is running.
#[derive(Default)]
struct Pending {
    jobs: VecDeque<Job>,
    running: bool,
}

impl Pending {
    /// Whether a release is queued or running.
    fn busy(&self) -> bool {
        self.running || !self.jobs.is_empty()
    }
}

struct Releaser {
    pending: Mutex<Pending>,
    /// Signalled when a job is queued (for the thread) and when one ends (for `settle`).
    changed: Condvar,
}

static RELEASER: OnceLock<Option<&'static Releaser>> = OnceLock::new();

fn releaser() -> Option<&'static Releaser> {
    *RELEASER.get_or_init(|| {
        let r: &'static Releaser = Box::leak(Box::new(Releaser {
            pending: Mutex::new(Pending::default()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("gdsync-release".into())
            .spawn(move || run(r))
            .ok()
            .map(|_| r)
    })
}

fn run(r: &Releaser) {
    loop {
        let job = {
            let mut p = r.pending.lock();
            while p.jobs.is_empty() {
                r.changed.wait(&mut p);
            }
            p.running = true;
            p.jobs.pop_front().expect("not empty")
        };
        crate::quiet::when_quiet(job);
        r.pending.lock().running = false;
        r.changed.notify_all();
    }
}

/// Runs `job` (a release of GPU-visible memory) on the release thread, after every release
/// queued before it; runs it here if that thread could not be started.
pub(crate) fn later(job: impl FnOnce() + Send + 'static) {
    match releaser() {
        Some(r) => {
            r.pending.lock().jobs.push_back(Box::new(job));
            r.changed.notify_all();
        }
        None => job(),
    }
}

/// Whether releases are queued or running: a drop that must stay in order with them (pages
/// someone else owns, whose owner a queued release may still need) goes through the queue too.
pub(crate) fn pending() -> bool {
    match RELEASER.get() {
        Some(Some(r)) => r.pending.lock().busy(),
        _ => false,
    }
}

/// Waits up to `timeout` until every release queued so far has run, and says whether they
/// have. A program that must know its pinned memory is given back (before it checks the
/// process's footprint, say) calls this after dropping; it is `false` while any CUDA stream
/// gdsync made or wrapped still has work to run (releases wait for every stream to be idle).
pub fn settle(timeout: Duration) -> bool {
    let Some(r) = releaser() else { return true };
    let end = Instant::now() + timeout;
    let mut p = r.pending.lock();
    while p.busy() {
        if r.changed.wait_until(&mut p, end).timed_out() {
            return !p.busy();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};

    #[test]
    fn releases_run_in_order_off_the_dropping_thread() {
        let (tx, rx) = mpsc::channel();
        let me = std::thread::current().id();
        for i in 0..100 {
            let tx = tx.clone();
            later(move || tx.send((i, std::thread::current().id())).unwrap());
        }
        assert!(settle(Duration::from_secs(5)));
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            (0..100).collect::<Vec<_>>()
        );
        assert!(
            got.iter().all(|g| g.1 != me),
            "a release ran on the dropping thread"
        );
    }

    #[test]
    fn a_release_that_blocks_does_not_block_the_caller() {
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        let start = Instant::now();
        later(move || {
            while !g.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "later() waited for the release"
        );
        assert!(
            !settle(Duration::from_millis(50)),
            "settled while a release was blocked"
        );
        gate.store(true, Ordering::Release);
        assert!(settle(Duration::from_secs(5)));
    }
}
