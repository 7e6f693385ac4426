//! Releases run while the GPUs are quiet. The driver's `cuMemFree` and `cuMemHostUnregister`
//! wait until the device has run the work queued before them, and while one waits, other
//! threads' allocations, host registrations, stream creations and copies wait behind it (seen
//! on an H200: each was held until a stream's memory wait passed; a memory operation queued on
//! another stream was not). A stream standing at a wait for a word that such a thread is about
//! to write then never moves, and neither does the thread: the process hangs.
//!
//! So the release thread (`release`) gives memory back through [`when_quiet`]: it closes the
//! gate that every enqueue of work on a stream of ours passes ([`enqueuing`]), and runs the
//! release only if the registered test says every stream is idle (the CUDA glue registers one
//! that queries its streams); else it opens the gate and tries again a little later. A stream
//! that stands at a wait for ever delays the releases, never the program. A leaf: it names no
//! stream, the CUDA glue names no release.

use parking_lot::{RwLock, RwLockReadGuard};
use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

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
/// that none gets new work until it returns; tests again every few hundred microseconds until
/// then.
pub(crate) fn when_quiet<R>(release: impl FnOnce() -> R) -> R {
    when(|| QUIET.get().is_none_or(|idle| idle()), release)
}

/// [`when_quiet`] with the test of quiet given.
fn when<R>(quiet: impl Fn() -> bool, release: impl FnOnce() -> R) -> R {
    let mut pause = Duration::from_micros(50);
    loop {
        {
            let _closed = GATE.write();
            if quiet() {
                CLOSED_HERE.with(|c| c.set(true));
                let r = release();
                CLOSED_HERE.with(|c| c.set(false));
                return r;
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_release_waits_for_quiet_and_runs_once() {
        let checks = AtomicU32::new(0);
        let ran = when(|| checks.fetch_add(1, Ordering::SeqCst) >= 3, || 7);
        assert_eq!(ran, 7);
        assert_eq!(
            checks.load(Ordering::SeqCst),
            4,
            "ran at the first quiet check"
        );
    }

    #[test]
    fn no_enqueue_passes_the_gate_while_a_release_runs() {
        let inside = Arc::new(AtomicBool::new(false));
        let seen_inside = Arc::new(AtomicBool::new(false));
        let (i, s) = (inside.clone(), seen_inside.clone());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let releaser = std::thread::spawn(move || {
            when(
                || true,
                || {
                    i.store(true, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(50));
                    i.store(false, Ordering::SeqCst);
                },
            )
        });
        started_rx.recv().unwrap();
        let guard = enqueuing();
        s.store(inside.load(Ordering::SeqCst), Ordering::SeqCst);
        drop(guard);
        releaser.join().unwrap();
        assert!(
            !seen_inside.load(Ordering::SeqCst),
            "an enqueue passed the gate while a release ran"
        );
    }

    #[test]
    fn a_release_may_enqueue_without_waiting_for_itself() {
        let passed = when(|| true, || enqueuing().is_none());
        assert!(passed, "the releasing thread must not take the gate again");
        assert!(enqueuing().is_some(), "other enqueues take it as before");
    }
}
