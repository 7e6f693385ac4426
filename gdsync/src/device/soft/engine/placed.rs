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
//! - the responder QP accepts it ([`WriteTargets`]: connected to this very QP and not in
//!   error), and the region its rkey names is host memory of that QP's PD, open to remote
//!   writes, covering the bytes;
//! - nothing of the QP is outstanding, so the write lands and completes in the order it was
//!   posted (a send still waiting for its receive holds the writes behind it back, as a
//!   responder would). A placed write takes no PSN: the responder expects the next message
//!   the requester sends.
//!
//! Anything else goes as a packet, and the responder checks and answers it as before.

use super::super::link::PktHeader;
use super::super::mr_table::Slots;
use super::memory::Seg;
use super::responder::remote_region;
use super::{ELink, EQp};
use crate::device::provider::Access;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// QPNs per lazily made chunk of the table.
const CHUNK: usize = 512;
/// An entry's "accepting" bit.
const ACCEPTS: u64 = 1 << 63;

/// The QPs of a device that take writes placed by a peer engine of this process: by QPN,
/// the peer QP it is connected to and its PD. Written by the device's engine as its QPs
/// connect, fail and go; read by peer engines, one load per write.
pub(crate) struct WriteTargets {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl WriteTargets {
    /// A table for QPNs up to `max_qpn`, none accepting.
    pub(crate) fn new(max_qpn: u32) -> Self {
        let n = (max_qpn as usize).div_ceil(CHUNK) + 1;
        Self {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    fn entry(&self, qpn: u32) -> Option<&AtomicU64> {
        let q = qpn as usize;
        self.chunks.get(q / CHUNK)?.get()?.get(q % CHUNK)
    }

    /// QP `qpn` of PD `pd` is connected to peer QP `rqpn`: it accepts that QP's writes.
    pub(crate) fn open(&self, qpn: u32, rqpn: u32, pd: u32) {
        let q = qpn as usize;
        let Some(chunk) = self.chunks.get(q / CHUNK) else {
            return;
        };
        let chunk = chunk.get_or_init(|| (0..CHUNK).map(|_| AtomicU64::new(0)).collect());
        let v = ACCEPTS | u64::from(rqpn & 0x00FF_FFFF) << 32 | u64::from(pd);
        chunk[q % CHUNK].store(v, Ordering::Release);
    }

    /// QP `qpn` failed or went: it accepts no placed write.
    pub(crate) fn close(&self, qpn: u32) {
        if let Some(e) = self.entry(qpn) {
            e.store(0, Ordering::Release);
        }
    }

    /// Every QP of the device went.
    pub(crate) fn close_all(&self) {
        for e in self
            .chunks
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|c| c.iter())
        {
            e.store(0, Ordering::Release);
        }
    }

    /// The PD of QP `qpn` if it accepts writes placed by peer QP `from`.
    #[inline]
    pub(crate) fn accepts(&self, qpn: u32, from: u32) -> Option<u32> {
        let v = self.entry(qpn)?.load(Ordering::Acquire);
        (v & ACCEPTS != 0 && (v >> 32) as u32 & 0x00FF_FFFF == from & 0x00FF_FFFF)
            .then_some(v as u32)
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
    let Some(pd) = targets.accepts(q.rqpn, q.hw.qpn) else {
        return false;
    };
    let len = data.len() as u64;
    // Held through the copy: the region stays registered.
    let slots = regions.read();
    target(&slots, hdr, pd, len).is_some_and(|e| e.write(hdr.raddr, data))
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

    #[test]
    fn a_qp_accepts_only_the_peer_it_is_connected_to_until_it_closes() {
        let t = WriteTargets::new(4096);
        assert_eq!(t.accepts(7, 9), None, "nothing open yet");
        t.open(7, 9, 3);
        assert_eq!(t.accepts(7, 9), Some(3));
        assert_eq!(t.accepts(7, 10), None, "another peer QP");
        assert_eq!(t.accepts(8, 9), None, "another QP");
        t.open(4000, 1, 0);
        assert_eq!(t.accepts(4000, 1), Some(0), "PD 0 is a PD");
        t.close(7);
        assert_eq!(t.accepts(7, 9), None);
        t.close_all();
        assert_eq!(t.accepts(4000, 1), None);
        // Out of range: nothing to open, nothing accepted.
        t.open(1 << 24, 1, 1);
        assert_eq!(t.accepts(1 << 24, 1), None);
    }
}
