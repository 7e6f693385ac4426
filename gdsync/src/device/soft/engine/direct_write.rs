//! Direct writes: between two devices of one process, the requester copies an RDMA write
//! straight into the responder's memory and completes it, and no packet crosses the link. A
//! plain write asks nothing of the responder's host, and of its NIC only the checks of its
//! QP context and translation table, which the requester makes here on what the responder's
//! engine publishes: the data lands without waiting for that engine, as a NIC's DMA lands it
//! without waiting for the host. The counterpart of by-reference delivery
//! ([`super::by_ref`], where the responder copies from the requester's memory).
//!
//! The requester writes directly only where the responder would take it and nothing could
//! come between:
//! - the responder QP admits it by the rule packets are admitted by
//!   ([`admission`](super::admission::admission)): connected over this very link (its
//!   process-wide [`pair_id`](super::super::link::Link::pair_id)) to this very QP, not in
//!   error, expecting the PSN the requester sends next; and the region its rkey names is
//!   host memory of that QP's PD, open to remote writes, covering the bytes
//!   ([`remote_region`], the packet path's check);
//! - nothing of the QP is outstanding, so the write lands and completes in the order it was
//!   posted (a send still waiting for its receive holds the writes behind it back, as a
//!   responder would). A direct write takes its PSN as a packet would, from the published
//!   context (the responder's engine reads it back before it admits the next packet).
//!
//! Anything else goes as a packet, and the responder checks and answers it as before.

use super::super::mr_table::Slots;
use super::super::targets::WriteTargets;
use super::super::wire::PktHeader;
use super::admission::{admission, Admission, Origin, QpView};
use super::memory::Seg;
use super::responder::{remote_region, WRITES_TAKEN_IN};
use super::{EngineLink, QpContext};
use crate::provider::Access;
use std::sync::atomic::Ordering;

/// What admission asks of a peer's published QP contexts.
impl WriteTargets {
    /// The PD of QP `qpn` if it admits a write from `from` by the rule a packet is admitted
    /// by, with the state word to [`take_psn`](Self::take_psn) from.
    #[inline]
    fn admits(&self, qpn: u32, from: Origin<u64>) -> Option<(u32, u64)> {
        let p = self.published(qpn)?;
        let view = QpView {
            peer: Some(p.link),
            rqpn: p.rqpn,
            err: false,
            exp_psn: p.state as u32,
        };
        (admission(Some(&view), &from) == Admission::Admit).then_some((p.pd, p.state))
    }
}

/// Writes the RDMA write `hdr` of `data` directly into the responder's memory, if the link leads to
/// a device of this process whose QP accepts it (see the module's conditions). Returns
/// whether it did (the caller completes the WQE); `false` changes nothing.
pub(super) fn direct_write(q: &QpContext, link: &EngineLink, hdr: &PktHeader, data: &[u8]) -> bool {
    let (Some(targets), Some(regions)) = (link.link.peer_targets(), link.link.peer_regions())
    else {
        return false;
    };
    if !q.sq.out.is_empty() {
        return false;
    }
    let from = Origin {
        peer: link.link.pair_id,
        qpn: q.hw.qpn,
        psn: q.sq.next_psn,
    };
    let Some((pd, st)) = targets.admits(q.rqpn, from) else {
        return false;
    };
    let len = data.len() as u64;
    // Held through the copy: the region stays registered.
    let slots = regions.read();
    // The PSN is taken once the region is known good: the copy then cannot fail.
    let landed = target(&slots, hdr, pd, len)
        .is_some_and(|e| targets.take_psn(q.rqpn, st) && e.write(hdr.raddr, data));
    if landed {
        // The responder's device is of this process: it took the request in.
        WRITES_TAKEN_IN.fetch_add(1, Ordering::Relaxed);
    }
    landed
}

/// The bytes of segment `seg` of this device's memory, if it lies in one registered region
/// of host memory (the requester's checks passed on it already).
#[inline]
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

/// The region a direct write of `len` bytes at `hdr.raddr` lands in: the one the responder
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
    use super::super::super::targets::{seq, state};
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
            "a direct write takes its PSN"
        );
        assert!(!t.take_psn(7, st), "a PSN is taken once");
        t.open(7, 5, 9, 3, 2);
        assert!(
            !t.take_psn(7, state(seq(st), 2)),
            "nor from an older publication"
        );
        assert_eq!(t.admits_pd(7, from(5, 9, 2)), Some(3));
        t.set_enabled(false);
        assert_eq!(t.admits_pd(7, from(5, 9, 2)), None, "direct writes off");
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
