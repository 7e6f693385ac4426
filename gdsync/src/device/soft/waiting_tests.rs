//! How a real engine waits when no thread drives it (shared progress's step, run from the
//! test thread on a soft device's engine): what it did, counted, not how long it took.

use super::super::progress::shared_step;
use super::super::waiting::{Step, Waiting};
use super::SoftDevice;
use std::time::{Duration, Instant};

/// An engine with no work that no thread of the process drives (a verbs program under the
/// emulated driver never lends its threads) spins a little, then yields or (where a yield
/// cost it a slice) sleeps in short steps: it never naps as an engine the ranks drive does
/// (the old policy napped from the first look, so a doorbell nobody announced waited up to
/// a millisecond).
#[test]
fn an_engine_nobody_drives_spins_then_yields_or_sleeps_in_short_steps_never_naps() {
    let dev = SoftDevice::spawn().unwrap();
    let core = dev.engine.core.clone();
    // Other tests of this process poll while this one runs, and a polling thread with no
    // engine of its own helps every engine, this one too: a look that a helper drove is
    // not the case under test, so such a run is taken again.
    for _ in 0..50 {
        let mut w = Waiting::default();
        let mut steps = 0u64;
        while w.short_sleeps + w.yields < 20 && !w.was_driven() {
            shared_step(&core, &mut w);
            steps += 1;
            assert!(
                steps < 50_000_000,
                "no yield or short sleep after {steps} looks: {w:?}"
            );
        }
        if w.was_driven() {
            continue;
        }
        assert!(w.spins > 0, "the first looks after work are spins: {w:?}");
        assert_eq!(
            w.naps, 0,
            "an undriven engine never takes the ranks' naps: {w:?}"
        );
        return;
    }
    panic!("other threads drove the engine in each of 50 runs");
}

/// The steps of [`Waiting`], fed instants: work found starts the spin again, a helper that
/// ran the engine turns the steps into naps, and they stay naps while the ranks drove it
/// within the last two milliseconds.
#[test]
fn waiting_naps_while_the_ranks_drive_and_spins_again_after_work() {
    let t0 = Instant::now();
    let at = |us: u64| t0 + Duration::from_micros(us);
    let mut w = Waiting::default();
    assert_eq!(w.next(at(0), false, true), Step::Spin);
    assert_eq!(w.next(at(100), false, false), Step::Yield);
    assert_eq!(
        w.next(at(101), false, true),
        Step::Spin,
        "work restarts the spin"
    );
    assert!(matches!(w.next(at(200), true, false), Step::Nap(_)));
    assert!(matches!(w.next(at(1_000), false, false), Step::Nap(_)));
    assert!(
        matches!(w.next(at(3_000), false, false), Step::Short(_)),
        "undriven for 2 ms: the engine looks for itself again"
    );
    assert_eq!((w.spins, w.yields, w.short_sleeps, w.naps), (2, 1, 1, 2));
}

/// An engine another thread holds (a verbs program's thread lent to it, polling its CQ for an
/// answer): the engine thread's look leaves it to the holder and sleeps its step. It used to
/// hand the holder a request for a round at every look, and, seeing its own request
/// unanswered, never slept: it spun on a core the busy-polling program needed.
#[test]
fn an_engine_thread_leaves_an_engine_another_thread_holds_and_asks_nothing() {
    let dev = SoftDevice::spawn().unwrap();
    let core = dev.engine.core.clone();
    let held = core.hold();
    let looker = {
        let core = core.clone();
        std::thread::spawn(move || {
            let mut w = Waiting::default();
            for _ in 0..200 {
                shared_step(&core, &mut w);
            }
            w
        })
    };
    // (Other tests' threads, which help every engine of the process, may ask too.)
    let id = looker.thread().id();
    let w = looker.join().unwrap();
    drop(held);
    assert!(
        !core.asked_by(id),
        "the engine thread's looks asked the holder for rounds: {w:?}"
    );
    assert!(
        w.yields + w.short_sleeps > 0,
        "after its spin the engine thread yields or sleeps: {w:?}"
    );
}

/// Work a lent thread did keeps an undriven engine's steps short (it is not idle), without
/// the spin that follows the engine's own work, and never turns them into the ranks' naps.
#[test]
fn a_lent_threads_work_keeps_the_steps_short_without_a_spin() {
    let t0 = Instant::now();
    let at = |us: u64| t0 + Duration::from_micros(us);
    let mut w = Waiting::default();
    assert_eq!(w.next(at(0), false, true), Step::Spin);
    // 10 ms later the steps would have grown (idle 10 ms: four times the first).
    assert!(
        matches!(w.next(at(10_000), false, false), Step::Short(d) if d > Duration::from_micros(10))
    );
    w.lent_work(at(10_001));
    let s = w.next(at(10_001), false, false);
    assert!(
        s == Step::Yield || s == Step::Short(Duration::from_micros(10)),
        "after a lent thread's work: {s:?}"
    );
    assert_eq!(w.naps, 0);
}
