//! Lending a waiting thread: a device served by the host's own threads (the soft device in
//! shared progress) registers a "lend this thread" function here, and threads that wait on
//! memory without a device at hand (executors, CUDA streams making room, the CPU proxy) call
//! [`lend`]. A leaf: waiters name no device, devices name no waiter.
//!
//! Waiters that hold a device's handle (a CQ poll) lend themselves through
//! `Provider::idle` instead; this is the one road for those that hold none.

use std::sync::OnceLock;

/// Most lenders: one per kind of device served by host threads.
const MAX_LENDERS: usize = 4;

/// The registered lenders, filled from the front.
static LENDERS: [OnceLock<fn()>; MAX_LENDERS] = [const { OnceLock::new() }; MAX_LENDERS];

/// Registers `lend_thread` to run whenever a waiter lends its thread ([`lend`]); a lender
/// registered before is not added twice. Registration is for the life of the process (the
/// function checks for itself whether it has work, in one load when it has none).
pub(crate) fn register(lend_thread: fn()) {
    for slot in &LENDERS {
        match slot.get() {
            Some(f) if std::ptr::fn_addr_eq(*f, lend_thread) => return,
            Some(_) => {}
            None => {
                // A racing registration may take the slot: then look at the next one.
                let got = slot.get_or_init(|| lend_thread);
                if std::ptr::fn_addr_eq(*got, lend_thread) {
                    return;
                }
            }
        }
    }
    panic!("more than {MAX_LENDERS} kinds of devices lend waiting threads");
}

/// Lends the calling thread to every registered lender: one load where none registered.
#[inline]
pub(crate) fn lend() {
    for slot in &LENDERS {
        match slot.get() {
            Some(f) => f(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    static CALLS: AtomicU32 = AtomicU32::new(0);

    fn count() {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn a_registered_lender_runs_once_per_lend_even_when_registered_twice() {
        super::register(count);
        super::register(count);
        let before = CALLS.load(Ordering::Relaxed);
        super::lend();
        super::lend();
        assert_eq!(CALLS.load(Ordering::Relaxed) - before, 2);
    }
}
