//! Releases run while the GPUs are quiet. The driver's `cuMemFree` and `cuMemHostUnregister`
//! wait until the device has run the work queued before them, and while one waits, other
//! threads' allocations, host registrations, stream creations and copies wait behind it (seen
//! on an H200: each was held until a stream's memory wait passed; a memory operation queued on
//! another stream was not). A stream standing at a wait for a word that such a thread is about
//! to write then never moves, and neither does the thread: the process hangs.
//!
//! So the release thread (`release`) gives memory back through [`when_quiet`]: once the
//! registered test says every stream is idle (the CUDA glue registers one that queries the
//! streams it made or wrapped), it closes the gate that every enqueue of work on those streams
//! passes ([`enqueuing`]), tests again, and runs the release; else it tries again a little
//! later. A stream that stands at a wait for ever delays the releases (the memory stays
//! allocated, and a warning says so after 10 s), not the threads that enqueue. Work the test
//! cannot see (a stream gdsync never wrapped) can still make a release wait inside the driver,
//! and enqueues wait for the gate meanwhile. A leaf: it names no stream, the CUDA glue names no
//! release.

use parking_lot::{RwLock, RwLockReadGuard};
use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Passed (shared) by every enqueue on a stream of ours; closed by a release while it runs.
static GATE: RwLock<()> = RwLock::new(());
/// Whether every stream is idle (none registered: no streams, always quiet).
static QUIET: OnceLock<fn() -> bool> = OnceLock::new();

thread_local! {
    /// Whether this thread holds the gate closed (a release that drops a stream's memory may
    /// drop something that enqueues: it must not wait for itself).
    static CLOSED_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Registers the test of quiet, once for the process (a second registration is ignored).
pub(crate) fn register(every_stream_idle: fn() -> bool) {
    let _ = QUIET.set(every_stream_idle);
}

/// Held while work is put on a stream of ours, so that no release runs meanwhile (`None` on
/// the thread of a release, which holds the gate already).
pub(crate) fn enqueuing() -> Option<RwLockReadGuard<'static, ()>> {
    if CLOSED_HERE.with(Cell::get) {
        return None;
    }
    // Recursive: a list kernel's launch passes the gate inside its list's enqueue.
    Some(GATE.read_recursive())
}

/// Runs `release` once the registered test says every stream is idle, with the gate closed so
/// that none gets new work until it returns; tests again after 50 µs, backing off to every
/// 2 ms, until then.
pub(crate) fn when_quiet<R>(release: impl FnOnce() -> R) -> R {
    when(|| QUIET.get().is_none_or(|idle| idle()), release)
}

/// How long a release waits for quiet before a warning says why memory is not given back.
const WARN_AFTER: Duration = Duration::from_secs(10);

/// [`when_quiet`] with the test of quiet given.
fn when<R>(quiet: impl Fn() -> bool, release: impl FnOnce() -> R) -> R {
    let (start, mut warned) = (Instant::now(), false);
    let mut pause = Duration::from_micros(50);
    loop {
        // Tested first with the gate open, so that a busy stream does not hold enqueues back.
        if quiet() {
            let _closed = GATE.write();
            if quiet() {
                let _here = ClosedHere::new();
                return release();
            }
        }
        if !warned && start.elapsed() > WARN_AFTER {
            warned = true;
            tracing::warn!("a release of GPU-visible memory has waited {}s for this process's CUDA streams to go idle: a stream whose work never finishes holds every release back, and the memory stays allocated", WARN_AFTER.as_secs());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

/// Marks this thread as the one holding the gate closed, until dropped (a release that panics
/// too).
struct ClosedHere;

impl ClosedHere {
    fn new() -> Self {
        CLOSED_HERE.with(|c| c.set(true));
        ClosedHere
    }
}

impl Drop for ClosedHere {
    fn drop(&mut self) {
        CLOSED_HERE.with(|c| c.set(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_release_waits_for_quiet_and_runs_once() {
        let checks = AtomicU32::new(0);
        let ran = when(|| checks.fetch_add(1, Ordering::SeqCst) >= 3, || 7);
        assert_eq!(ran, 7);
        // The fourth test passed with the gate open, the fifth with it closed.
        assert_eq!(
            checks.load(Ordering::SeqCst),
            5,
            "ran at the first quiet check"
        );
    }

    #[test]
    fn no_enqueue_passes_the_gate_while_a_release_runs() {
        let passed = when(
            || true,
            || {
                std::thread::spawn(|| GATE.try_read_recursive().is_some())
                    .join()
                    .unwrap()
            },
        );
        assert!(
            !passed,
            "another thread passed the gate while a release ran"
        );
    }

    #[test]
    fn a_release_that_panics_leaves_the_gate_open() {
        let r = std::panic::catch_unwind(|| when(|| true, || panic!("a release failed")));
        assert!(r.is_err());
        assert!(
            enqueuing().is_some(),
            "the thread is no longer marked as closing the gate"
        );
    }

    #[test]
    fn a_release_may_enqueue_without_waiting_for_itself() {
        let passed = when(|| true, || enqueuing().is_none());
        assert!(passed, "the releasing thread must not take the gate again");
        assert!(enqueuing().is_some(), "other enqueues take it as before");
    }
}
