//! Placed writes: between two devices of one process, the requester copies an RDMA write
//! straight into the responder's memory and completes it, and no packet crosses the link. A
//! plain write asks nothing of the responder's host, and of its NIC only the checks of its
//! QP context and translation table, which the requester makes here on what the responder's
//! engine publishes: the data lands without waiting for that engine, as a NIC's DMA lands it
//! without waiting for the host. The counterpart of by-reference delivery
//! ([`super::by_ref`], where the responder copies from the requester's memory).
//!
//! The requester places a write only where the responder would take it and nothing could
//! come between:
//! - the responder QP admits it by the rule packets are admitted by
//!   ([`admission`](super::admission::admission)): connected over this very link (its
//!   process-wide [`pair_id`](super::super::link::Link::pair_id)) to this very QP, not in
//!   error, expecting the PSN the requester sends next; and the region its rkey names is
//!   host memory of that QP's PD, open to remote writes, covering the bytes
//!   ([`remote_region`], the packet path's check);
//! - nothing of the QP is outstanding, so the write lands and completes in the order it was
//!   posted (a send still waiting for its receive holds the writes behind it back, as a
//!   responder would). A placed write takes its PSN as a packet would, from the published
//!   context (the responder's engine reads it back before it admits the next packet).
//!
//! Anything else goes as a packet, and the responder checks and answers it as before.

use super::super::mr_table::Slots;
use super::super::wire::PktHeader;
use super::admission::{admission, Admission, Origin, QpView};
use super::memory::Seg;
use super::responder::remote_region;
use super::{ELink, EQp};
use crate::device::provider::Access;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// QPNs per lazily made chunk of the table.
const CHUNK: usize = 512;

/// One QP's published context, under a sequence lock: the engine (the only publisher)
/// makes the sequence odd while it rewrites the fields, so a reader that sees it odd or
/// changed across its loads has a mix of two publications and places nothing.
#[derive(Default)]
struct Entry {
    /// The sequence (high half) and the PSN the QP expects next (low half): one word, so
    /// the write that takes a PSN takes it from this very publication (one compare-exchange).
    state: AtomicU64,
    /// The link's [`pair_id`](super::super::link::Link::pair_id); 0: accepts nothing.
    link: AtomicU64,
    /// The peer QP's number (high half) and the QP's PD (low half).
    qp: AtomicU64,
}

/// The sequence of a state word.
fn seq(state: u64) -> u32 {
    (state >> 32) as u32
}

/// A state word of sequence `seq` and PSN `psn`.
fn state(seq: u32, psn: u32) -> u64 {
    u64::from(seq) << 32 | u64::from(psn)
}

/// The QPs of a device that take writes placed by a peer engine of this process: by QPN,
/// the link and peer QP it is connected to, its PD and the PSN it expects. Written by the
/// device's engine as its QPs connect, take messages, fail and go; read by peer engines.
pub(crate) struct WriteTargets {
    chunks: Box<[OnceLock<Box<[Entry]>>]>,
    /// Cleared, the device takes no placed write: every write comes as a packet.
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

    /// The PSN QP `qpn` expects next, as its peer's placed writes left it.
    #[inline]
    pub(crate) fn psn(&self, qpn: u32) -> Option<u32> {
        Some(self.entry(qpn)?.state.load(Ordering::Acquire) as u32)
    }

    /// QP `qpn` took a message by packet: it expects PSN `psn` next. (Its peer places no
    /// write meanwhile: that peer's message is outstanding until answered.)
    #[inline]
    pub(crate) fn expect(&self, qpn: u32, psn: u32) {
        if let Some(e) = self.entry(qpn) {
            let s = seq(e.state.load(Ordering::Relaxed));
            e.state.store(state(s, psn), Ordering::Release);
        }
    }

    /// QP `qpn` failed or went: it accepts no placed write.
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

    /// Whether the device takes placed writes (cleared: it takes packets only, as from a
    /// device of another process).
    #[cfg(test)]
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    /// QP `qpn`'s context as one publication shows it, with its PD and the state word read:
    /// `None` if it accepts nothing, or is being rewritten (the write then goes as a packet).
    #[inline]
    fn view(&self, qpn: u32) -> Option<(QpView<u64>, u32, u64)> {
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
        let view = QpView {
            peer: Some(link),
            rqpn: (qp >> 32) as u32,
            err: false,
            exp_psn: st as u32,
        };
        Some((view, qp as u32, st))
    }

    /// The PD of QP `qpn` if it admits a write from `from` by the rule a packet is admitted
    /// by, with the state word to [`take_psn`](Self::take_psn) from.
    #[inline]
    fn admits(&self, qpn: u32, from: Origin<u64>) -> Option<(u32, u64)> {
        let (view, pd, st) = self.view(qpn)?;
        (admission(Some(&view), &from) == Admission::Admit).then_some((pd, st))
    }

    /// The write takes QP `qpn`'s expected PSN, if its entry still reads `st` (the
    /// publication it was admitted by, at that PSN).
    #[inline]
    fn take_psn(&self, qpn: u32, st: u64) -> bool {
        self.entry(qpn).is_some_and(|e| {
            let next = state(seq(st), (st as u32).wrapping_add(1));
            e.state
                .compare_exchange(st, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }
}

/// Places the RDMA write `hdr` of `data` into the responder's memory, if the link leads to
/// a device of this process whose QP accepts it (see the module's conditions). Returns
/// whether it did (the caller completes the WQE); `false` changes nothing.
pub(super) fn place_write(q: &EQp, link: &ELink, hdr: &PktHeader, data: &[u8]) -> bool {
    let (Some(targets), Some(regions)) = (link.link.peer_targets(), link.link.peer_regions())
    else {
        return false;
    };
    if !q.out.is_empty() {
        return false;
    }
    let from = Origin {
        peer: link.link.pair_id,
        qpn: q.hw.qpn,
        psn: q.next_psn,
    };
    let Some((pd, st)) = targets.admits(q.rqpn, from) else {
        return false;
    };
    let len = data.len() as u64;
    // Held through the copy: the region stays registered.
    let slots = regions.read();
    // The PSN is taken once the region is known good: the copy then cannot fail.
    target(&slots, hdr, pd, len)
        .is_some_and(|e| targets.take_psn(q.rqpn, st) && e.write(hdr.raddr, data))
}

/// The bytes of segment `seg` of this device's memory, if it lies in one registered region
/// of host memory (the requester's checks passed on it already).
pub(super) fn local_bytes<'s>(slots: &'s Slots, seg: &Seg) -> Option<&'s [u8]> {
    let e = slots.get(seg.lkey)?;
    if e.gpu.is_some() || !e.covers(seg.addr, u64::from(seg.len)) {
        return None;
    }
    // SAFETY: `[addr, addr+len)` lies in a registered host region of this device (checked
    // above), lent to the device while registered; it stays registered while the engine's
    // copy of the table (`slots`) is borrowed (deregistration waits for the engine's next
    // copy, taken between rounds).
    Some(unsafe { std::slice::from_raw_parts(seg.addr as *const u8, seg.len as usize) })
}

/// The region a placed write of `len` bytes at `hdr.raddr` lands in: the one the responder
/// would write (the rkey's, of PD `pd`, open to remote writes, covering the bytes), in host
/// memory.
fn target<'s>(
    slots: &'s Slots,
    hdr: &PktHeader,
    pd: u32,
    len: u64,
) -> Option<&'s super::super::mr_table::MrEntry> {
    remote_region(pd, slots, hdr, Access::REMOTE_WRITE, len).filter(|e| e.gpu.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    impl WriteTargets {
        fn admits_pd(&self, qpn: u32, from: Origin<u64>) -> Option<u32> {
            self.admits(qpn, from).map(|(pd, _)| pd)
        }
    }

    #[test]
    fn a_qp_accepts_only_the_peer_it_is_connected_to_until_it_closes() {
        let t = WriteTargets::new(4096);
        let from = |peer, qpn, psn| Origin { peer, qpn, psn };
        assert_eq!(t.admits_pd(7, from(5, 9, 0)), None, "nothing open yet");
        t.open(7, 5, 9, 3, 0);
        assert_eq!(t.admits_pd(7, from(5, 9, 0)), Some(3));
        assert_eq!(t.admits_pd(7, from(5, 10, 0)), None, "another peer QP");
        assert_eq!(
            t.admits_pd(7, from(6, 9, 0)),
            None,
            "the same QPN over another link"
        );
        assert_eq!(t.admits_pd(8, from(5, 9, 0)), None, "another QP");
        assert_eq!(t.admits_pd(7, from(5, 9, 1)), None, "another PSN");
        t.expect(7, 1);
        let (_, st) = t.admits(7, from(5, 9, 1)).expect("the next PSN");
        assert!(
            t.take_psn(7, st) && t.psn(7) == Some(2),
            "a placed write takes its PSN"
        );
        assert!(!t.take_psn(7, st), "a PSN is taken once");
        t.open(7, 5, 9, 3, 2);
        assert!(
            !t.take_psn(7, state(seq(st), 2)),
            "nor from an older publication"
        );
        assert_eq!(t.admits_pd(7, from(5, 9, 2)), Some(3));
        t.set_enabled(false);
        assert_eq!(t.admits_pd(7, from(5, 9, 2)), None, "placed writes off");
        t.set_enabled(true);
        t.open(4000, 5, 1, 0, 0);
        assert_eq!(t.admits_pd(4000, from(5, 1, 0)), Some(0), "PD 0 is a PD");
        t.close(7);
        assert_eq!(t.admits_pd(7, from(5, 9, 2)), None);
        t.close_all();
        assert_eq!(t.admits_pd(4000, from(5, 1, 0)), None);
        // Out of range: nothing to open, nothing accepted.
        t.open(1 << 24, 5, 1, 1, 0);
        assert_eq!(t.admits_pd(1 << 24, from(5, 1, 0)), None);
    }
}
