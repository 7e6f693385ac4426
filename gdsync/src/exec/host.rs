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

/// Whether `next` (the op after a barrier) is a write that by itself comes after everything
/// before it: on x86-64 a release store does (loads and stores stay in order for other CPUs
/// and for a device's coherent reads; an earlier doorbell left the write-combining buffer at
/// its own store fence, a copy ends with a full fence). Elsewhere the barrier stays.
pub(super) fn write_orders_itself(next: Option<&Op>) -> bool {
    cfg!(target_arch = "x86_64") && matches!(next, Some(Op::Write32 { .. } | Op::Write64 { .. }))
}

/// Runs `ops`; a wait also gives up when `stop` becomes true (a host stream being dropped).
pub(crate) fn run_ops(ops: &Ops, timeout: Duration, stop: Option<&AtomicBool>) -> Result<()> {
    let list = ops.as_slice();
    for (k, op) in list.iter().enumerate() {
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
                Op::Doorbell { addr, value } => {
                    #[cfg(test)]
                    test_hooks::linger(addr);
                    (*(addr as *const AtomicU64)).store(value, Ordering::Release);
                    // Out of the write-combining buffer now: a lone doorbell store could
                    // otherwise linger there, and reach the device after a later doorbell
                    // of the same queue rung from another thread.
                    crate::mem::wc_fence();
                    #[cfg(test)]
                    test_hooks::note_flush(addr);
                }
                Op::Barrier if write_orders_itself(list.get(k + 1)) => {}
                Op::Barrier => {
                    // Earlier accesses before later ones as the CPUs see them (a full fence)
                    // and as a device and the write-combining doorbell page see them: mfence
                    // covers both on x86-64, AArch64 adds `dsb st`.
                    fence(Ordering::SeqCst);
                    #[cfg(not(target_arch = "x86_64"))]
                    crate::barrier::mmio_flush_writes();
                }
                Op::Copy { dst, src, len } => {
                    // Earlier stores (a flag the copy's source depends on) before the copy,
                    // and the copied bytes before any later store (a doorbell).
                    fence(Ordering::SeqCst);
                    std::ptr::copy(src as *const u8, dst as *mut u8, len as usize);
                    fence(Ordering::SeqCst);
                }
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

/// What test builds of CPU executors do around doorbells: count the write-combining flushes
/// after them, per doorbell address (so tests assert one flush per doorbell), and let one
/// doorbell address linger before its store, as a store can linger in a write-combining
/// buffer (so tests see what another ringer does meanwhile).
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    static FLUSHED: parking_lot::Mutex<Option<HashMap<u64, u64>>> = parking_lot::Mutex::new(None);
    static LINGER: AtomicU64 = AtomicU64::new(0);

    /// Doorbell stores to `addr` (0: none) wait a while before they are made.
    pub(crate) fn linger_at(addr: u64) {
        LINGER.store(addr, Ordering::Relaxed);
    }

    /// Waits a while if `addr` is the doorbell to linger on.
    pub(crate) fn linger(addr: u64) {
        if addr != 0 && LINGER.load(Ordering::Relaxed) == addr {
            let start = Instant::now();
            while start.elapsed() < Duration::from_micros(20) {
                std::thread::yield_now();
            }
        }
    }

    /// A flush after a doorbell store to `addr`.
    pub(crate) fn note_flush(addr: u64) {
        *FLUSHED
            .lock()
            .get_or_insert_with(HashMap::new)
            .entry(addr)
            .or_default() += 1;
    }

    /// Flushes after doorbell stores to `addr` so far.
    pub(crate) fn flushes_after(addr: u64) -> u64 {
        FLUSHED
            .lock()
            .as_ref()
            .and_then(|m| m.get(&addr).copied())
            .unwrap_or(0)
    }
}
