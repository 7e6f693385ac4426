//! Packets in and out of the links: each round reads what arrived (requests to the
//! responder, responses to completion) and sends what the QPs queued, gathering payload from
//! memory as each packet goes out.

use super::super::mr_table::Slots;
use super::super::ring::Producer;
use super::super::wire::{flag, kind, PktHeader, MTU};
use super::by_ref::{by_ref, write_source_ref, SOURCE_REF_LEN};
use super::memory::gather;
use super::packets::{nak, packet_header};
use super::{BodyRef, Engine, QueuedMessage};
use crate::format::Syndrome;
use crate::provider::Access;

/// Most messages queued on a link (answers that wait for room in its send ring, mostly)
/// before the engine stops reading its receive ring: a peer that sends requests and does not
/// read the answers is then held back by the full ring (and TCP), instead of growing the queue
/// without bound. About 10 MiB of queue. Two peers stall each other only if each has more
/// requests outstanding to the other than this, far more than their send rings hold.
pub(super) const MAX_BACKLOG: usize = 1 << 16;

/// What sending a queued message came to.
enum Emit {
    /// Every packet is in the ring.
    Done,
    /// The ring is full: resume later.
    Full,
    /// A key no longer names the memory: the message cannot be sent.
    Fault,
}

impl Engine {
    /// Takes the packets of one message (up to 64), or on a bridged (TCP) link up to 64
    /// packets of any messages, off the link's receive ring; none while the link's send queue
    /// is full ([`MAX_BACKLOG`]). The look that finds nothing is one load, inline.
    #[inline]
    pub(super) fn poll_link(&mut self, li: usize) -> bool {
        let l = &self.links[li];
        l.link.rx.ready() && l.queue.len() < MAX_BACKLOG && self.take_packets(li)
    }

    #[inline(never)]
    fn take_packets(&mut self, li: usize) -> bool {
        let one_message = !self.links[li].link.is_bridged();
        let mut n = 0;
        while let Some((h, payload)) = self.links[li].link.rx.peek() {
            // The payload borrows the ring: copy small headers, hand the slice down.
            let payload: *const [u8] = payload;
            // SAFETY: the record stays valid until pop() below; nothing else touches the ring.
            let payload = unsafe { &*payload };
            if h.kind == kind::REQ && h.flags & flag::BY_REF != 0 {
                // A payload by reference is read from the sender's region, whose table is
                // held (`source`) until the responder is done with the bytes. (A refused
                // reference was answered: the packet is dropped.)
                let table = self.links[li].link.lend_peer_regions();
                let source = table.as_ref().map(|t| t.read());
                if let Some((req, data)) = self.resolve_by_ref(li, &h, payload, source.as_deref()) {
                    self.on_request(li, &req, data);
                }
                drop(source);
                self.links[li].link.return_peer_regions(table);
            } else if h.kind == kind::REQ {
                self.on_request(li, &h, payload);
            } else {
                self.on_response(li, &h, payload);
            }
            self.links[li].link.rx.pop(&h);
            n += 1;
            // One message per look: the thread running the engine may be waiting for just
            // this one, and a look at the next record waits for a line the peer's core
            // holds (the sender cleared its stamp), so it comes after the caller's look.
            // Not on a bridged (TCP) link: its records are written by this process's bridge
            // thread a batch at a time, a socket's latency hides the line, and a round that
            // takes a batch answers it with one ACK per QP instead of one per message.
            if n == 64 || (one_message && h.flags & flag::LAST != 0) {
                break;
            }
        }
        n > 0
    }

    /// Sends queued packets while the ring has room (an empty queue costs one look, inline).
    #[inline]
    pub(super) fn pump(&mut self, li: usize) -> bool {
        !self.links[li].queue.is_empty() && self.pump_queued(li)
    }

    /// [`pump`](Self::pump) on every link. Returns whether any sent something.
    pub(super) fn pump_all(&mut self) -> bool {
        let mut work = false;
        for li in 0..self.links.len() {
            work |= self.pump(li);
        }
        work
    }

    #[inline(never)]
    fn pump_queued(&mut self, li: usize) -> bool {
        let mut work = false;
        self.mrc.sync(&self.mrs);
        loop {
            // Borrowed, not cloned: a clone's reference count is a line every helper thread
            // would write.
            let slots = &*self.mrc.slots;
            let link = &mut self.links[li];
            let Some(job) = link.queue.front_mut() else {
                break;
            };
            match emit(
                &job.hdr,
                job.body.as_ref(),
                job.pd,
                &mut job.sent,
                &mut link.link.tx,
                slots,
            ) {
                Emit::Done => {
                    link.queue.pop_front();
                    work = true;
                }
                Emit::Full => break,
                Emit::Fault => {
                    let job = link.queue.pop_front().unwrap();
                    work = true;
                    if self.emit_failed(li, job) {
                        return true;
                    }
                }
            }
        }
        work
    }

    /// Sends a message on link `li`: at once while nothing waits before it and the ring has
    /// room (most messages: no queue entry to make and take), else after those queued. The
    /// payload is borrowed (a requester's WQE as read, a response's data): it is copied into a
    /// queue entry only for what cannot go out at once. The region table must be current
    /// ([`MrCache::sync`](super::super::mr_table::MrCache::sync) in this round).
    pub(super) fn send(&mut self, li: usize, hdr: &PktHeader, body: BodyRef<'_>, pd: u32) {
        let link = &mut self.links[li];
        let body = match body {
            BodyRef::Gather(sges) if hdr.kind == kind::REQ => {
                let peer_reads = link.link.peer_regions().is_some();
                by_ref(sges, &self.mrc.slots, peer_reads).map_or(body, BodyRef::ByRef)
            }
            _ => body,
        };
        let mut sent = 0;
        let r = if link.queue.is_empty() {
            emit(hdr, body, pd, &mut sent, &mut link.link.tx, &self.mrc.slots)
        } else {
            Emit::Full
        };
        if matches!(r, Emit::Done) {
            return;
        }
        let job = QueuedMessage {
            hdr: *hdr,
            body: body.to_owned(),
            pd,
            sent,
        };
        if matches!(r, Emit::Fault) {
            self.emit_failed(li, job);
        } else {
            self.links[li].queue.push_back(job);
        }
    }

    /// A message whose memory vanished while it was sent (see [`Emit::Fault`]): a request
    /// fails its WQE (returns true: the QP went to error); a read response becomes a NAK.
    fn emit_failed(&mut self, li: usize, job: QueuedMessage) -> bool {
        if job.hdr.kind == kind::REQ {
            // A requester's lkey vanished under a posted WQE.
            let (qpn, psn) = (job.hdr.src_qpn, job.hdr.psn);
            if self.qps.get(qpn).is_some() {
                self.enter_error(qpn, Some((psn, Syndrome::LocalProt)));
                return true;
            }
        } else {
            // A read response's region was deregistered: NAK instead.
            self.links[li]
                .queue
                .push_front(nak(&job.hdr, Syndrome::RemoteAccess as u8));
        }
        false
    }
}

/// Payload bytes of a message.
fn body_len(hdr: &PktHeader, body: BodyRef<'_>) -> u32 {
    match body {
        BodyRef::Empty => 0,
        BodyRef::Inline(b) => b.len() as u32,
        BodyRef::Gather(_) | BodyRef::Memory { .. } | BodyRef::ByRef(_) => hdr.msg_len,
    }
}

/// Sends the packets of one message from byte `*sent` on while the ring has room. (Inline
/// in its two callers: a message sent at once is the common path.)
#[inline(always)]
fn emit(
    hdr: &PktHeader,
    body: BodyRef<'_>,
    pd: u32,
    sent: &mut u32,
    tx: &mut Producer,
    slots: &Slots,
) -> Emit {
    let total = body_len(hdr, body);
    loop {
        let seg = (total - *sent).min(MTU as u32);
        let mut h = packet_header(hdr, *sent, seg, total);
        // A packet by reference carries where its bytes are, not the bytes.
        let mut rec_len = seg as usize;
        if let BodyRef::ByRef(_) = body {
            h.flags |= flag::BY_REF;
            h.seg_len = SOURCE_REF_LEN as u32;
            rec_len = SOURCE_REF_LEN;
        }
        let off = *sent as u64;
        let r = tx.try_push(&h, rec_len, |buf| match body {
            BodyRef::Empty => true,
            BodyRef::Inline(b) => {
                buf.copy_from_slice(&b[off as usize..off as usize + buf.len()]);
                true
            }
            BodyRef::Gather(sges) => gather(slots, pd, sges, off, buf),
            BodyRef::Memory { rkey, addr } => {
                let a = addr + off;
                slots
                    .get(rkey)
                    .is_some_and(|e| e.access.contains(Access::REMOTE_READ) && e.read(a, buf))
            }
            BodyRef::ByRef(s) => write_source_ref(slots, pd, s, off, seg, buf),
        });
        match r {
            None => return Emit::Full,
            Some(false) => return Emit::Fault,
            Some(true) => {}
        }
        *sent += seg;
        if *sent >= total {
            return Emit::Done;
        }
    }
}
