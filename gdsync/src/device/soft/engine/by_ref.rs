//! Single-copy delivery between devices of one process: a large payload gathered from one
//! registered region does not travel through the link's ring. Its packets carry a reference
//! to the sender's memory instead ([`SourceRef`]), and the receiving engine copies straight
//! from there into the target, as a NIC's DMA moves the bytes once. Through the ring the
//! bytes would be copied twice, and on a machine whose cores hand lines over slowly the
//! second copy costs several times the first (every line crosses to the other core).
//!
//! The receiver checks the reference against the sender's region table and copies while it
//! holds the table's read lock, so a deregistration (which takes the write lock) cannot
//! return while the copy runs. A region deregistered before the packet is delivered fails
//! the message with a local protection error, as a NIC that found its lkey gone would. As
//! with any NIC, the sender's buffer must not change until its WQE completes: the bytes are
//! read at delivery, not at posting.

use super::super::mr_table::Slots;
use super::super::wire::{flag, PktHeader, MTU};
use super::memory::Seg;
use super::packets::nak;
use super::Engine;
use crate::format::Syndrome;

/// Smallest payload sent by reference: below this, copying through the ring costs about as
/// much as the checks and the lock.
pub(super) const BY_REF_MIN: u32 = 256;

/// Bytes of a [`SourceRef`] on the wire.
pub(super) const SOURCE_REF_LEN: usize = 16;

/// Where a packet's payload lies in the sender's memory: the address of its first byte,
/// the region's key and the protection domain of the sending QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SourceRef {
    pub addr: u64,
    pub lkey: u32,
    pub pd: u32,
}

impl SourceRef {
    /// Writes the reference into a record's payload (`SOURCE_REF_LEN` bytes).
    pub(super) fn write_to(&self, buf: &mut [u8]) {
        buf[..8].copy_from_slice(&self.addr.to_ne_bytes());
        buf[8..12].copy_from_slice(&self.lkey.to_ne_bytes());
        buf[12..16].copy_from_slice(&self.pd.to_ne_bytes());
    }

    /// Whether `len` bytes from the reference lie in a registered host region of its PD in
    /// `slots` (checked by the sender as the packet leaves, and by the receiver before it
    /// reads them).
    fn names_host_memory(&self, slots: &Slots, len: u64) -> bool {
        slots
            .get(self.lkey)
            .is_some_and(|e| e.gpu.is_none() && e.pd == self.pd && e.covers(self.addr, len))
    }

    /// Reads a reference from a record's payload; `None` if it is not one.
    pub(super) fn read_from(buf: &[u8]) -> Option<SourceRef> {
        let b: &[u8; SOURCE_REF_LEN] = buf.get(..SOURCE_REF_LEN)?.try_into().ok()?;
        let [a, k, p] = [&b[..8], &b[8..12], &b[12..]];
        Some(SourceRef {
            addr: u64::from_ne_bytes(a.try_into().ok()?),
            lkey: u32::from_ne_bytes(k.try_into().ok()?),
            pd: u32::from_ne_bytes(p.try_into().ok()?),
        })
    }
}

/// Whether a message gathered from `sges` goes by reference on a link whose peer can read
/// this device's regions: one segment of host memory, large enough.
pub(super) fn by_ref(sges: &[Seg], slots: &Slots, peer_reads: bool) -> Option<Seg> {
    match sges {
        [s] if peer_reads && s.len >= BY_REF_MIN => slots
            .get(s.lkey)
            .is_some_and(|e| e.gpu.is_none())
            .then_some(*s),
        _ => None,
    }
}

/// Writes the reference to bytes `off..off+len` of segment `s` into a record's payload;
/// whether the region is still there (as a gather checks it when the packet leaves).
#[inline(never)]
pub(super) fn write_source_ref(
    slots: &Slots,
    pd: u32,
    s: Seg,
    off: u64,
    len: u32,
    buf: &mut [u8],
) -> bool {
    let src = SourceRef {
        addr: s.addr + off,
        lkey: s.lkey,
        pd,
    };
    src.write_to(buf);
    src.names_host_memory(slots, len as u64)
}

/// Bytes of message data a by-reference packet stands for: packets are cut at the MTU,
/// so each carries the rest of the message up to it.
pub(super) fn data_len(h: &PktHeader) -> usize {
    (h.msg_len.saturating_sub(h.offset) as usize).min(MTU)
}

impl Engine {
    /// A request packet whose payload is a [`SourceRef`]: the header and bytes to hand the
    /// responder as if they had come through the ring, read from the sender's region in
    /// `slots` (its table, held by the caller while the responder uses them). `None` if the
    /// reference cannot be followed: the packet was answered and is dropped. Only a link
    /// within this process names the peer's table; elsewhere the flag is a malformed packet.
    #[inline(never)]
    pub(super) fn resolve_by_ref<'a>(
        &mut self,
        li: usize,
        h: &PktHeader,
        rec: &[u8],
        slots: Option<&'a Slots>,
    ) -> Option<(PktHeader, &'a [u8])> {
        let (Some(slots), Some(src)) = (slots, SourceRef::read_from(rec)) else {
            self.refuse_by_ref(li, h, Syndrome::RemoteInvalReq);
            return None;
        };
        let len = data_len(h);
        if !src.names_host_memory(slots, len as u64) {
            self.refuse_by_ref(li, h, Syndrome::LocalProt);
            return None;
        }
        // SAFETY: `[addr, addr+len)` lies in a registered host region of the peer device
        // (checked above), whose owner lent it to that device while it is registered; it
        // stays registered while `slots` is borrowed (deregistration takes the write lock).
        let data = unsafe { std::slice::from_raw_parts(src.addr as *const u8, len) };
        let mut direct = *h;
        direct.seg_len = len as u32;
        direct.flags &= !flag::BY_REF;
        Some((direct, data))
    }

    /// A by-reference packet whose source cannot be read: the message fails at the sender
    /// with `s` (once: its later packets find no message in progress and are dropped).
    fn refuse_by_ref(&mut self, li: usize, h: &PktHeader, s: Syndrome) {
        // (A packet for no QP of this link, or out of sequence, is answered as any other.)
        if self.admit(li, h).is_none() {
            return;
        }
        let Some(q) = self.qps.get_mut(h.dst_qpn) else {
            return;
        };
        let started = q.rq.inmsg.take().is_some();
        if h.offset == 0 || started {
            self.respond(li, nak(h, s as u8));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::mr_table::MrTable;
    use super::*;
    use crate::provider::{Access, MrMemory, MrSpec};

    fn region(t: &MrTable, memory: MrMemory) -> u32 {
        t.register(&MrSpec {
            pd: 1,
            addr: 0x10_0000,
            len: 1 << 20,
            access: Access::ALL,
            memory,
        })
    }

    #[test]
    fn a_source_reference_reads_back_as_written_and_a_short_one_is_refused() {
        let r = SourceRef {
            addr: 0x1234_5678_9abc_def0,
            lkey: 0x0102_0304,
            pd: 7,
        };
        let mut buf = [0u8; SOURCE_REF_LEN];
        r.write_to(&mut buf);
        assert_eq!(SourceRef::read_from(&buf), Some(r));
        assert_eq!(SourceRef::read_from(&buf[..SOURCE_REF_LEN - 1]), None);
        assert_eq!(SourceRef::read_from(&[]), None);
    }

    #[test]
    fn only_one_large_segment_of_host_memory_goes_by_reference_and_only_to_a_peer_that_reads_it() {
        let t = MrTable::default();
        let host = region(&t, MrMemory::Host);
        let gpu = region(&t, MrMemory::Gpu(crate::cuda::GpuCtx::unbacked(0)));
        let slots = t.read();
        let seg = |lkey, len| Seg {
            addr: 0x10_0000,
            len,
            lkey,
        };
        let big = seg(host, BY_REF_MIN);
        assert_eq!(by_ref(&[big], &slots, true), Some(big));
        assert_eq!(by_ref(&[big], &slots, false), None, "peer cannot read");
        assert_eq!(by_ref(&[seg(host, BY_REF_MIN - 1)], &slots, true), None);
        assert_eq!(by_ref(&[big, big], &slots, true), None, "two segments");
        assert_eq!(
            by_ref(&[seg(gpu, 1 << 16)], &slots, true),
            None,
            "GPU memory"
        );
        assert_eq!(by_ref(&[seg(host ^ 0x80, 1 << 16)], &slots, true), None);
    }

    #[test]
    fn a_packet_stands_for_the_rest_of_its_message_up_to_the_mtu() {
        let h = |msg_len, offset| PktHeader {
            msg_len,
            offset,
            ..Default::default()
        };
        assert_eq!(data_len(&h(4096, 0)), 4096);
        assert_eq!(data_len(&h(3 * MTU as u32, MTU as u32)), MTU);
        assert_eq!(data_len(&h(MTU as u32 + 5, MTU as u32)), 5);
        assert_eq!(data_len(&h(10, 20)), 0, "an offset past the end");
    }
}
