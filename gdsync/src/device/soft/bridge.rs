//! What an engine's end of a bridged link (a link whose far half transport threads serve,
//! the TCP link) and those threads tell each other: a leaf both the ring (which wakes the
//! outbound thread) and the link (which closes the transport) use.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

/// What an engine's end of a bridged link and the transport threads serving the far end
/// tell each other.
#[derive(Default)]
pub(crate) struct BridgeSignal {
    /// The transport failed or the peer closed it: the link is dead.
    down: AtomicBool,
    /// The engine dropped its end (its device is gone): the transport should close.
    engine_gone: AtomicBool,
    /// Set while the outbound thread sleeps; the engine's next record then unparks it.
    outbound_sleeping: AtomicBool,
    outbound: OnceLock<Thread>,
    /// Closes the transport (shuts the socket down), so threads blocked on it return.
    closer: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// What lives as long as the link: see [`hold`](Self::hold).
    held: OnceLock<Box<dyn Send + Sync>>,
}

impl BridgeSignal {
    /// Marks the link dead and closes the transport; either thread calls it when it stops.
    pub(crate) fn set_down(&self) {
        self.down.store(true, Ordering::Release);
        self.close_transport();
    }
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }
    pub(crate) fn engine_gone(&self) -> bool {
        self.engine_gone.load(Ordering::Acquire)
    }
    /// Keeps `guard` until the link is released: its engine end and both transport threads
    /// gone (each holds this signal). A listener's place for the link in its budget is
    /// given back then, with the link's memory and threads.
    pub(crate) fn hold(&self, guard: impl Send + Sync + 'static) {
        let _ = self.held.set(Box::new(guard));
    }
    /// Installs what closes the transport.
    pub(crate) fn set_closer(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.closer.set(Box::new(f));
    }
    /// The engine dropped its end (the device is gone): closes the connection (the peer
    /// sees the link die) and lets the threads go.
    pub(super) fn engine_dropped(&self) {
        self.engine_gone.store(true, Ordering::Release);
        self.close_transport();
        self.unpark_outbound();
    }
    fn close_transport(&self) {
        if let Some(f) = self.closer.get() {
            f();
        }
    }
    /// Registers the calling thread as the outbound thread (the one `wake_outbound` wakes).
    pub(crate) fn register_outbound(&self) {
        let _ = self.outbound.set(std::thread::current());
    }
    /// Announces that the outbound thread is about to park; it must look at the ring once
    /// more afterwards, then park (with a timeout) only if it is still empty.
    pub(crate) fn outbound_sleeps(&self, sleeping: bool) {
        self.outbound_sleeping.store(sleeping, Ordering::SeqCst);
        if sleeping {
            // Pairs with the fence in wake_outbound (store sleeping, then load the stamp).
            fence(Ordering::SeqCst);
        }
    }
    pub(super) fn wake_outbound(&self) {
        fence(Ordering::SeqCst);
        if self.outbound_sleeping.load(Ordering::Relaxed) {
            self.unpark_outbound();
        }
    }
    fn unpark_outbound(&self) {
        if let Some(t) = self.outbound.get() {
            t.unpark();
        }
    }
}

/// The bridged links made in this process, by peer (for tests: a link's signal lives as long
/// as its engine end and its transport threads).
#[cfg(test)]
pub(crate) mod bridges {
    use super::BridgeSignal;
    use parking_lot::Mutex;
    use std::sync::{Arc, Weak};

    static ALL: Mutex<Vec<(u64, Weak<BridgeSignal>)>> = Mutex::new(Vec::new());

    pub(in crate::device::soft) fn note(peer: u64, signal: &Arc<BridgeSignal>) {
        let mut all = ALL.lock();
        all.retain(|(_, s)| s.strong_count() > 0);
        all.push((peer, Arc::downgrade(signal)));
    }

    /// Holders (the link's engine end, its two threads) of the bridged links to `peer` that
    /// are still alive.
    pub(crate) fn holders(peer: u64) -> usize {
        let all = ALL.lock();
        (all.iter())
            .filter(|(p, _)| *p == peer)
            .map(|(_, s)| s.strong_count())
            .sum()
    }
}
