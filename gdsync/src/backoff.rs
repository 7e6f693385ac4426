//! How CPU-side waiters back off: spin, then yield, then sleep. A leaf: the one step that
//! does more than wait ([`Backoff::snooze`]) lends the thread through [`crate::idle`], which
//! names no device.

use std::time::Duration;

/// Spin, then yield, then sleep: how CPU-side pollers back off without burning a core.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    n: u32,
}

impl Backoff {
    pub(crate) const SPINS: u32 = 1024;
    pub(crate) const YIELDS: u32 = 1024 + 256;

    pub(crate) fn reset(&mut self) {
        self.n = 0;
    }
    /// Whether the caller is still in the busy-spinning phase.
    pub(crate) fn spinning(&self) -> bool {
        self.n < Self::SPINS
    }
    /// Whether the next step sleeps (the caller may announce it first).
    pub(crate) fn would_sleep(&self) -> bool {
        self.n + 1 >= Self::YIELDS
    }
    /// A sleeping step that an `unpark` of this thread cuts short.
    pub(crate) fn snooze_parked(&mut self) {
        self.n = self.n.saturating_add(1);
        let k = self.n.saturating_sub(Self::YIELDS).min(5);
        std::thread::park_timeout(Duration::from_micros(32 << k));
    }
    /// Like [`snooze`](Self::snooze), but the first steps skip even the `pause` hint (which
    /// costs ~140 cycles on recent x86): for the engine, whose detection delay is latency.
    pub(crate) fn snooze_busy(&mut self) {
        if self.n < 256 {
            self.n += 1;
        } else {
            self.pause();
        }
    }

    /// One step of backing off; returns whether the caller is now sleeping between polls.
    /// The step first lends the thread to the devices served by the host's own threads
    /// ([`crate::idle::lend`]).
    pub(crate) fn snooze(&mut self) -> bool {
        crate::idle::lend();
        self.pause()
    }

    /// [`snooze`](Self::snooze) without lending the thread to the engines: for callers
    /// that just did (an empty CQ poll) or are an engine.
    pub(crate) fn pause(&mut self) -> bool {
        self.n = self.n.saturating_add(1);
        if self.n < Self::SPINS {
            std::hint::spin_loop();
            false
        } else if self.n < Self::YIELDS {
            std::thread::yield_now();
            false
        } else {
            let k = (self.n - Self::YIELDS).min(6);
            std::thread::sleep(Duration::from_micros(20 << k));
            true
        }
    }
}
