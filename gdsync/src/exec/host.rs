//! The host executor: runs an op list now, on the calling thread.

use super::DEFAULT_WAIT_TIMEOUT;
use crate::backoff::Backoff;
use crate::ops::{Op, Ops};
use crate::{Error, Result};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs op lists on the calling CPU thread. Waits spin briefly, then back off, and give up
/// with [`Error::Timeout`] after the executor's timeout, or with [`Error::CqOverrun`] as
/// soon as the device reported an error of the CQ they wait on (it writes no more).
#[derive(Clone, Debug)]
pub struct HostExecutor {
    timeout: Duration,
}

impl Default for HostExecutor {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

impl HostExecutor {
    /// An executor whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// Runs every op of `ops` in order.
    pub fn run(&self, ops: &Ops) -> Result<()> {
        run_ops(ops, self.timeout, None)
    }
}

/// Runs `ops`; a wait also gives up when `stop` becomes true (a host stream being dropped).
pub(crate) fn run_ops(ops: &Ops, timeout: Duration, stop: Option<&AtomicBool>) -> Result<()> {
    for op in ops.as_slice() {
        // SAFETY: an Ops list holds its memory alive (library-made ops keep an Arc to the ring
        // memory; push_raw's contract covers the rest), and addresses are aligned by
        // construction.
        unsafe {
            match *op {
                Op::Write32 { addr, value } => {
                    (*(addr as *const AtomicU32)).store(value, Ordering::Release)
                }
                Op::Write64 { addr, value } => {
                    (*(addr as *const AtomicU64)).store(value, Ordering::Release)
                }
                Op::Barrier => fence(Ordering::SeqCst),
                Op::Wait32 { addr, value, cond } => {
                    let w = &*(addr as *const AtomicU32);
                    wait(
                        || cond.test32(w.load(Ordering::Acquire), value),
                        addr,
                        timeout,
                        stop,
                        || {
                            format!(
                                "32-bit word {addr:#x} {cond:?} {value:#x} (now {:#x})",
                                w.load(Ordering::Relaxed)
                            )
                        },
                    )?
                }
                Op::Wait64 { addr, value, cond } => {
                    let w = &*(addr as *const AtomicU64);
                    wait(
                        || cond.test64(w.load(Ordering::Acquire), value),
                        addr,
                        timeout,
                        stop,
                        || {
                            format!(
                                "64-bit word {addr:#x} {cond:?} {value:#x} (now {:#x})",
                                w.load(Ordering::Relaxed)
                            )
                        },
                    )?
                }
            }
        }
    }
    Ok(())
}

/// Waits until `ready`, for the word at `addr`: fails after `timeout`, when `stop` is set,
/// or at once when the word lies in a ring the device will write no more (a failed CQ's).
fn wait(
    mut ready: impl FnMut() -> bool,
    addr: u64,
    timeout: Duration,
    stop: Option<&AtomicBool>,
    what: impl FnOnce() -> String,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    let start = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        for _ in 0..64 {
            if ready() {
                return Ok(());
            }
            backoff.snooze();
        }
        if let Some(e) = crate::failed_rings::wait_error(addr) {
            return Err(e);
        }
        if start.elapsed() >= timeout || stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Error::Timeout {
                what: what(),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
    }
}
