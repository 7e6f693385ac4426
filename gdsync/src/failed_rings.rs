//! Ring memory a device will write no more: the CQE ring of a CQ that reported an error (an
//! overrun, on a ConnectX). A host wait on a word in it fails with that error at once, rather
//! than waiting out its timeout for a completion that cannot come.

use crate::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// A failed CQ's ring: `[start, end)`.
struct Failed {
    start: u64,
    end: u64,
    cqn: u32,
}

/// Whether any ring failed (so that a wait's check is one load while none did).
static ANY: AtomicBool = AtomicBool::new(false);
static FAILED: RwLock<Vec<Failed>> = RwLock::new(Vec::new());

/// CQ `cqn`, whose ring is the `len` bytes at `start`, reported an error.
pub(crate) fn cq_failed(start: u64, len: u64, cqn: u32) {
    let mut f = FAILED.write().unwrap_or_else(|e| e.into_inner());
    f.retain(|r| r.start != start);
    f.push(Failed {
        start,
        end: start.saturating_add(len),
        cqn,
    });
    ANY.store(true, Ordering::Release);
}

/// The ring at `start` is freed (its CQ destroyed): its addresses may serve another.
pub(crate) fn forget(start: u64) {
    if ANY.load(Ordering::Acquire) {
        let mut f = FAILED.write().unwrap_or_else(|e| e.into_inner());
        f.retain(|r| r.start != start);
        ANY.store(!f.is_empty(), Ordering::Release);
    }
}

/// The error for a wait on the word at `addr`, if it lies in a failed ring.
#[inline]
pub(crate) fn wait_error(addr: u64) -> Option<Error> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let f = FAILED.read().unwrap_or_else(|e| e.into_inner());
    f.iter()
        .find(|r| (r.start..r.end).contains(&addr))
        .map(|r| Error::CqOverrun { cqn: r.cqn })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_in_a_failed_ring_fail_until_it_is_freed() {
        // (Addresses no test allocates: the registry is shared by the process's tests.)
        let start = 0xdead_0000_0000;
        assert!(wait_error(start + 60).is_none());
        cq_failed(start, 4096, 0x4a1);
        assert!(matches!(
            wait_error(start + 60),
            Some(Error::CqOverrun { cqn: 0x4a1 })
        ));
        assert!(wait_error(start + 4096).is_none(), "past the ring");
        assert!(wait_error(start - 4).is_none(), "before the ring");
        forget(start);
        assert!(wait_error(start + 60).is_none());
    }
}
