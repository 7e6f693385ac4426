//! The QPs of a device that take direct writes from a peer engine of this process
//! ([`engine`](super::engine)'s `direct_write`): what each QP's context publishes for them
//! (the link and peer QP it is connected to, its PD, the PSN it expects), written by the
//! device's own engine and read by its peers'. A leaf, lent through the links as the region
//! table ([`mr_table`](super::mr_table)) is.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// QPNs per lazily made chunk of the table.
const CHUNK: usize = 512;

/// One QP's published context, under a sequence lock: the engine (the only publisher)
/// makes the sequence odd while it rewrites the fields, so a reader that sees it odd or
/// changed across its loads has a mix of two publications and writes nothing directly.
#[derive(Default)]
struct Entry {
    /// The sequence (high half) and the PSN the QP expects next (low half): one word, so
    /// the write that takes a PSN takes it from this very publication (one compare-exchange).
    state: AtomicU64,
    /// The link's [`pair_id`](super::link::Link::pair_id); 0: accepts nothing.
    link: AtomicU64,
    /// The peer QP's number (high half) and the QP's PD (low half).
    qp: AtomicU64,
}

/// The sequence of a state word.
pub(super) fn seq(state: u64) -> u32 {
    (state >> 32) as u32
}

/// A state word of sequence `seq` and PSN `psn`.
pub(super) fn state(seq: u32, psn: u32) -> u64 {
    u64::from(seq) << 32 | u64::from(psn)
}

/// One publication of a QP's context ([`WriteTargets::published`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Published {
    /// The link's [`pair_id`](super::link::Link::pair_id) (never 0).
    pub link: u64,
    /// The peer QP's number.
    pub rqpn: u32,
    /// The QP's PD.
    pub pd: u32,
    /// The state word read: its sequence and the PSN the QP expects next.
    pub state: u64,
}

/// The QPs of a device that take direct writes from a peer engine of this process: by QPN,
/// the link and peer QP it is connected to, its PD and the PSN it expects. Written by the
/// device's engine as its QPs connect, take messages, fail and go; read by peer engines.
pub(crate) struct WriteTargets {
    chunks: Box<[OnceLock<Box<[Entry]>>]>,
    /// Cleared, the device takes no direct write: every write comes as a packet.
    enabled: AtomicBool,
}

impl WriteTargets {
    /// A table for QPNs up to `max_qpn`, none accepting.
    pub(crate) fn new(max_qpn: u32) -> Self {
        let n = (max_qpn as usize).div_ceil(CHUNK) + 1;
        Self {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
            enabled: AtomicBool::new(true),
        }
    }

    fn entry(&self, qpn: u32) -> Option<&Entry> {
        let q = qpn as usize;
        self.chunks.get(q / CHUNK)?.get()?.get(q % CHUNK)
    }

    /// Rewrites `qpn`'s entry (made if need be) under its sequence lock.
    fn publish(&self, qpn: u32, link: u64, qp: u64, psn: u32) {
        let q = qpn as usize;
        let Some(chunk) = self.chunks.get(q / CHUNK) else {
            return;
        };
        let e = &chunk.get_or_init(|| (0..CHUNK).map(|_| Entry::default()).collect())[q % CHUNK];
        let s = seq(e.state.load(Ordering::Relaxed));
        e.state
            .store(state(s.wrapping_add(1), 0), Ordering::Relaxed);
        fence(Ordering::Release);
        e.link.store(link, Ordering::Relaxed);
        e.qp.store(qp, Ordering::Relaxed);
        e.state
            .store(state(s.wrapping_add(2), psn), Ordering::Release);
    }

    /// QP `qpn` of PD `pd` is connected over link `link` to peer QP `rqpn` and expects PSN
    /// `psn`: it accepts that QP's writes.
    pub(crate) fn open(&self, qpn: u32, link: u64, rqpn: u32, pd: u32, psn: u32) {
        self.publish(qpn, link, u64::from(rqpn) << 32 | u64::from(pd), psn);
    }

    /// The PSN QP `qpn` expects next, as its peer's direct writes left it.
    #[inline]
    pub(crate) fn psn(&self, qpn: u32) -> Option<u32> {
        Some(self.entry(qpn)?.state.load(Ordering::Acquire) as u32)
    }

    /// QP `qpn` took a message by packet: it expects PSN `psn` next. (Its peer writes nothing
    /// directly meanwhile: that peer's message is outstanding until answered.)
    #[inline]
    pub(crate) fn expect(&self, qpn: u32, psn: u32) {
        if let Some(e) = self.entry(qpn) {
            let s = seq(e.state.load(Ordering::Relaxed));
            e.state.store(state(s, psn), Ordering::Release);
        }
    }

    /// QP `qpn` failed or went: it accepts no direct write.
    pub(crate) fn close(&self, qpn: u32) {
        if self.entry(qpn).is_some() {
            self.publish(qpn, 0, 0, 0);
        }
    }

    /// Every QP of the device went.
    pub(crate) fn close_all(&self) {
        for (ci, c) in self.chunks.iter().enumerate() {
            if c.get().is_some() {
                for i in 0..CHUNK {
                    self.close((ci * CHUNK + i) as u32);
                }
            }
        }
    }

    /// Whether the device takes direct writes (cleared: it takes packets only, as from a
    /// device of another process).
    #[cfg(test)]
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    /// QP `qpn`'s context as one publication shows it: `None` if it accepts nothing, or is
    /// being rewritten (the write then goes as a packet).
    #[inline]
    pub(super) fn published(&self, qpn: u32) -> Option<Published> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let e = self.entry(qpn)?;
        let st = e.state.load(Ordering::Acquire);
        let (link, qp) = (e.link.load(Ordering::Relaxed), e.qp.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if seq(st) & 1 != 0 || seq(e.state.load(Ordering::Relaxed)) != seq(st) || link == 0 {
            return None;
        }
        Some(Published {
            link,
            rqpn: (qp >> 32) as u32,
            pd: qp as u32,
            state: st,
        })
    }

    /// The write takes QP `qpn`'s expected PSN, if its entry still reads `st` (the
    /// publication it was admitted by, at that PSN).
    #[inline]
    pub(super) fn take_psn(&self, qpn: u32, st: u64) -> bool {
        self.entry(qpn).is_some_and(|e| {
            let next = state(seq(st), (st as u32).wrapping_add(1));
            e.state
                .compare_exchange(st, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }
}
