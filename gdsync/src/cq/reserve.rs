//! The completions a prepared executor wait covers. A wait for completion `n` consumes every
//! completion up to `n` when it runs (it stores `n + 1` as the consumer index), so from the
//! moment its op list is built until it has run, or every copy of the list is dropped unrun,
//! a CPU poll of those completions is refused ([`Error::CqBusy`]), as libgdsync's peek
//! entries made the CPU poll answer EBUSY; and a wait whose store would move the consumer
//! index backwards is refused when it is built. Together: one consumer at a time for each
//! completion, and the consumer index only moves forward.

use super::CqShared;
use crate::ops::KeepAlive;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The waits on a CQ whose op lists still exist: how many for each completion number.
#[derive(Default)]
pub(crate) struct Waits {
    live: Mutex<BTreeMap<u64, u32>>,
    /// Lists in `live` (the counts summed): polls read it without the lock.
    count: AtomicUsize,
}

impl Waits {
    /// The highest completion a live wait is for.
    fn highest(&self) -> Option<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.live.lock().keys().next_back().copied()
    }

    fn release(&self, n: u64) {
        let mut live = self.live.lock();
        if let Some(c) = live.get_mut(&n) {
            *c -= 1;
            if *c == 0 {
                live.remove(&n);
            }
            self.count.fetch_sub(1, Ordering::Release);
        }
    }
}

/// Kept alive by a wait's op list: its drop (the list ran, failed or was never submitted,
/// and every copy of it is gone) gives the completions back to CPU polls.
struct WaitHold {
    waits: Arc<Waits>,
    n: u64,
    /// The memory the list's store of the consumer index writes.
    _dbrec: KeepAlive,
}

impl Drop for WaitHold {
    fn drop(&mut self) {
        self.waits.release(self.n);
    }
}

impl CqShared {
    /// Reserves the completions up to `n` for a wait being built, and returns what its op
    /// list keeps alive (the doorbell record's memory, and the reservation). Refused on a CQ
    /// a GPU kernel consumes, and where the wait's store of `n + 1` would move the consumer
    /// index backwards: completions past `n` are consumed, or a wait for a later one exists.
    pub(super) fn reserve_wait(&self, n: u64) -> Result<KeepAlive> {
        let cqn = self.cqn;
        if self.kernel_owned.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "CQ {cqn:#x} is consumed by a GPU kernel (DeviceQp): a stream wait would store its consumer index too; wait in the kernel, or take the CQ back first"
            )));
        }
        let mut st = self.poll.lock();
        self.catch_up(&mut st);
        let mut live = self.waits.live.lock();
        if st.ci > n + 1 {
            return Err(Error::invalid(format!(
                "CQ {cqn:#x}: completion {n} is consumed already (the consumer index is {}): a wait for it would move the index backwards; wait only for completions not polled yet",
                st.ci
            )));
        }
        if let Some(&later) = live.keys().next_back().filter(|&&m| m > n) {
            return Err(Error::invalid(format!(
                "CQ {cqn:#x}: a wait for completion {later} is prepared and consumes completion {n} too; a wait for {n} after it would move the consumer index backwards: prepare waits on one CQ in completion order (or wait for the later one only)"
            )));
        }
        *live.entry(n).or_default() += 1;
        self.waits.count.fetch_add(1, Ordering::Release);
        Ok(Arc::new(WaitHold {
            waits: self.waits.clone(),
            n,
            _dbrec: self.dbrec.mem.clone(),
        }))
    }

    /// Refuses to consume completion `ci` on the host while a prepared wait covers it.
    pub(super) fn check_not_reserved(&self, ci: u64) -> Result<()> {
        match self.waits.highest() {
            Some(wait) if wait >= ci => Err(Error::CqBusy {
                cqn: self.cqn,
                index: ci,
                wait,
            }),
            _ => Ok(()),
        }
    }
}
