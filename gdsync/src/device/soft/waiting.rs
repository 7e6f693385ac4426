//! How a soft engine's thread waits when no thread of its process drives it: the steps
//! (spin, short sleeps, longer naps), the sleep itself, and counts of what it did.
//!
//! A program that is not gdasync (a verbs program under the emulated driver, whose
//! soft HCA this process serves) never lends its threads to the engine, and its doorbells
//! and the packets of other processes wake nobody: the engine must look for them itself.
//! Yielding between looks does not work on a busy machine: the program's busy-polling thread
//! takes the whole slice the scheduler gives it (milliseconds) before the engine looks again.
//! Sleeping does: a thread that wakes from a short sleep runs at once, ahead of threads that
//! kept their core (the kernel's wake-up preemption favours the thread that slept), looks
//! (a few microseconds), and sleeps again. So the engine spins a little after work (the answer
//! to what it just sent often comes within microseconds), then sleeps in short steps with the
//! thread's timer slack cut (a sleep otherwise lasts up to 50 µs longer than asked), and
//! lengthens the steps only after milliseconds without work. An engine the ranks drive
//! (gdasync's own processes in shared progress) takes the longer naps at once, as before.

use std::time::{Duration, Instant};

/// After work, the engine looks again without sleeping for this long.
pub(super) const SPIN: Duration = Duration::from_micros(5);
/// The first sleep step of an engine nobody drives.
pub(super) const SHORT_STEP: Duration = Duration::from_micros(10);
/// Idle this long, an undriven engine's steps double (up to [`LONGEST_STEP`]).
const DOUBLE_EVERY: Duration = Duration::from_millis(2);
/// The longest sleep step of any engine (a doorbell nobody announces waits at most this).
const LONGEST_STEP: Duration = Duration::from_micros(1024);
/// The timer slack an engine sleeping in short steps asks for, in nanoseconds (the kernel's
/// default, 50 µs, would make a 10 µs step last up to 60 µs).
const SHORT_SLACK_NS: libc::c_ulong = 1_000;

/// What the engine thread does next when a look found no work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Look again at once.
    Spin,
    /// Yield the core, then look again: while yields come back at once (the threads beside
    /// the engine back off, as gdasync's ranks do, or the core is free).
    Yield,
    /// Sleep this long (a poster's wake cuts it short), with the timer slack cut.
    Short(Duration),
    /// Sleep this long with the thread's ordinary timer slack: the ranks drive the engine.
    Nap(Duration),
}

/// The step after a look that found nothing, `idle` after the engine's last work; `driven`:
/// threads of the process ran the engine recently; `contended`: a yield lately kept the
/// engine off its core for a scheduler slice (a thread beside it polls without backing off).
pub(super) fn step(idle: Duration, driven: bool, contended: bool) -> Step {
    if driven {
        // (The ranks' posts and polls run the rounds; the thread only runs the timers.)
        let k = (idle.as_micros() / 200).min(5) as u32;
        return Step::Nap(Duration::from_micros(32 << k).min(LONGEST_STEP));
    }
    if idle < SPIN {
        return Step::Spin;
    }
    if idle < DOUBLE_EVERY && !contended {
        return Step::Yield;
    }
    let k = (idle.as_micros() / DOUBLE_EVERY.as_micros()).min(16) as u32;
    Step::Short((SHORT_STEP * (1 << k)).min(LONGEST_STEP))
}

/// A helper ran the engine within this long: the process's threads drive it.
const DRIVEN_WITHIN: Duration = Duration::from_millis(2);
/// A yield that kept the engine away this long ran a thread that does not back off ...
const SLOW_YIELD: Duration = Duration::from_micros(50);
/// ... and the engine then sleeps in steps instead of yielding for this long.
const CONTENDED_FOR: Duration = Duration::from_millis(100);

/// The engine thread's waiting state in shared progress: since when it found no work, when
/// the process's threads last drove it, its timer slack, and counts of what it did.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    idle_since: Option<Instant>,
    driven_at: Option<Instant>,
    /// When a yield last kept the engine off its core for a slice.
    contended_at: Option<Instant>,
    slack: Slack,
    /// Looks taken again at once, yields, short sleeps, naps (read by tests).
    pub(crate) spins: u64,
    pub(crate) yields: u64,
    pub(crate) short_sleeps: u64,
    pub(crate) naps: u64,
}

impl Waiting {
    /// Whether a helper ever ran the engine while this state looked (read by tests).
    #[cfg(test)]
    pub(super) fn was_driven(&self) -> bool {
        self.driven_at.is_some()
    }

    /// Forgets the idle time (the engine left shared progress).
    pub(super) fn reset(&mut self) {
        self.idle_since = None;
    }

    /// A lent thread's round did work before the look at `now`: the engine is not idle (its
    /// steps stay short), but it did nothing itself, so it does not spin after it.
    pub(super) fn lent_work(&mut self, now: Instant) {
        self.idle_since = Some(now.checked_sub(SPIN).unwrap_or(now));
    }

    /// The step after a look at `now`: `driven`, a helper ran the engine since the last
    /// look; `work`, the look itself found work.
    pub(super) fn next(&mut self, now: Instant, driven: bool, work: bool) -> Step {
        if driven {
            self.driven_at = Some(now);
        }
        if work {
            self.idle_since = Some(now);
        }
        let idle = now.duration_since(*self.idle_since.get_or_insert(now));
        let recently = self
            .driven_at
            .is_some_and(|t| now.duration_since(t) < DRIVEN_WITHIN);
        let contended = self
            .contended_at
            .is_some_and(|t| now.duration_since(t) < CONTENDED_FOR);
        let s = step(idle, recently, contended);
        match s {
            Step::Spin => self.spins += 1,
            Step::Yield => self.yields += 1,
            Step::Short(_) => self.short_sleeps += 1,
            Step::Nap(_) => self.naps += 1,
        }
        s
    }

    /// Yields, or sleeps for `step` (a sleep step or a nap) or until the thread is unparked.
    pub(super) fn sleep(&mut self, step: Step) {
        let d = match step {
            Step::Spin => return,
            Step::Yield => {
                let t = Instant::now();
                std::thread::yield_now();
                let back = Instant::now();
                if back.duration_since(t) > SLOW_YIELD {
                    self.contended_at = Some(back);
                }
                return;
            }
            Step::Short(d) | Step::Nap(d) => d,
        };
        self.slack.for_step(step);
        std::thread::park_timeout(d);
    }
}

/// The engine thread's timer slack: cut while it sleeps in short steps, the thread's
/// default otherwise (so gdasync's own processes, whose ranks drive the engines, see their
/// engine threads wake no more often than before).
#[derive(Debug, Default)]
struct Slack {
    cut: bool,
}

impl Slack {
    /// Sets the slack for `step`'s sleep (a system call only when it changes).
    fn for_step(&mut self, step: Step) {
        let cut = matches!(step, Step::Short(_));
        if cut != self.cut {
            self.cut = cut;
            // 0 restores the thread's default slack.
            let ns = if cut { SHORT_SLACK_NS } else { 0 };
            // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only the
            // calling thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{step, Step, LONGEST_STEP, SHORT_STEP, SPIN};
    use std::time::Duration;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn an_engine_nobody_drives_spins_after_work_then_sleeps_in_short_steps_when_contended() {
        for contended in [false, true] {
            assert_eq!(step(Duration::ZERO, false, contended), Step::Spin);
            assert_eq!(step(SPIN - us(1), false, contended), Step::Spin);
        }
        assert_eq!(step(SPIN, false, true), Step::Short(SHORT_STEP));
        assert_eq!(step(us(1_999), false, true), Step::Short(SHORT_STEP));
        assert_eq!(step(us(2_000), false, true), Step::Short(SHORT_STEP * 2));
    }

    #[test]
    fn an_engine_nobody_drives_yields_until_a_yield_cost_it_a_slice() {
        assert_eq!(step(SPIN, false, false), Step::Yield);
        assert_eq!(step(us(1_999), false, false), Step::Yield);
        assert_eq!(step(us(2_000), false, false), Step::Short(SHORT_STEP * 2));
    }

    #[test]
    fn long_idleness_lengthens_the_steps_up_to_the_longest() {
        let mut last = Duration::ZERO;
        for ms in 0..100 {
            let Step::Short(d) = step(Duration::from_millis(ms) + SPIN, false, true) else {
                panic!("a contended undriven engine sleeps in steps, it never naps or yields");
            };
            assert!(d >= last && d <= LONGEST_STEP);
            last = d;
        }
        assert_eq!(last, LONGEST_STEP);
        assert_eq!(
            step(Duration::from_secs(3600), false, true),
            Step::Short(LONGEST_STEP)
        );
    }

    #[test]
    fn an_engine_the_ranks_drive_naps_as_before_and_never_spins() {
        assert_eq!(step(Duration::ZERO, true, false), Step::Nap(us(32)));
        assert_eq!(step(us(450), true, true), Step::Nap(us(128)));
        assert_eq!(
            step(Duration::from_secs(1), true, false),
            Step::Nap(us(1024))
        );
    }
}
