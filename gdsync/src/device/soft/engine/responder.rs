//! The responder: requests arrive in sequence; the first packet of a message is checked
//! (rkey, bounds, access rights, or the receive it consumes) before any memory is touched,
//! and answered with an acknowledgement, read data, an atomic's old value, or a NAK
//! (`docs/soft-device.md`, "Responder").

use super::super::mr_table::{MrEntry, Slots};
use super::super::wire::{flag, PktHeader};
use super::admission::{admission, Admission, Origin};
use super::completion::{err_cqe, Side};
use super::errors::complete_error;
use super::memory::Seg;
use super::memory::{scatter, sges_ok};
use super::packets::{nak, reply};
use super::{
    psn_le, resp, Body, Dest, Engine, IncomingMessage, QpContext, QpHw, QueuedMessage, NAK_RNR,
};
use crate::format::*;
use crate::mem::slot_off;
use crate::provider::{Access, MAX_SGE};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};

/// RDMA writes without immediate this process's engines took in as responders: the requests
/// that land without a completion the program could poll for. Counted at their last packet,
/// and when another device of this process puts one straight into their memory (a direct
/// write). What `soft_writes_taken_in` reads.
pub(crate) static WRITES_TAKEN_IN: AtomicU64 = AtomicU64::new(0);

/// A request's first packet, accepted.
enum Accepted {
    /// The payload goes to memory or a receive as it arrives.
    Incoming(Dest),
    /// Answered at once (read data, an atomic's old value).
    Answered(QueuedMessage),
}

/// A request's first packet, refused.
enum Refusal {
    /// NAK with this code; the responder QP is unaffected.
    Nak(u8),
    /// The receive at the head of the ring fails with the syndrome (the QP goes to error);
    /// NAK with the code.
    Fail(Syndrome, u8),
}

impl Engine {
    /// One request packet from link `li`.
    pub(super) fn on_request(&mut self, li: usize, h: &PktHeader, payload: &[u8]) {
        let Some(op) = self.admit(li, h) else {
            return;
        };
        if op == Opcode::RdmaWrite && h.flags & flag::LAST != 0 {
            // (Counted at its last packet, once admitted: its data lands in this round. A write
            // its checks then refuse counts too, which only ends a lingering poll early.)
            WRITES_TAKEN_IN.fetch_add(1, Ordering::Relaxed);
        }

        self.mrc.sync(&self.mrs);
        if op == Opcode::RdmaWrite && self.whole_write(h, payload) {
            return;
        }
        if h.offset == 0 && !self.first_packet(li, h, op, payload) {
            return;
        }
        self.receive_payload(li, h, payload);
    }

    /// The most common request, an RDMA write whose one packet is the whole message, written
    /// with a single look at its region: what [`first_packet`](Self::first_packet) and
    /// [`receive_payload`](Self::receive_payload) make of it, with no message state kept in
    /// between. `false`, having written nothing, for any other packet, or a write the checks
    /// refuse: the steps then check it again and answer.
    #[inline]
    fn whole_write(&mut self, h: &PktHeader, payload: &[u8]) -> bool {
        if h.offset != 0 || payload.len() as u64 != u64::from(h.msg_len) {
            return false;
        }
        let qpn = h.dst_qpn;
        let Some(q) = self.qps.get_mut(qpn) else {
            return false;
        };
        let len = payload.len() as u64;
        let written = q.hw.access.contains(Access::REMOTE_WRITE)
            && remote_region(q.hw.pd, &self.mrc.slots, h, Access::REMOTE_WRITE, len)
                .is_some_and(|e| e.write(h.raddr, payload));
        if written {
            q.rq.inmsg = None;
            q.expect_next(&self.targets);
            self.owe_ack(qpn, h.psn);
        }
        written
    }

    /// Whether the request is for a connected QP of this link, in sequence, with an opcode
    /// this model knows: its opcode if so; otherwise it is NAKed or (out of sequence, after a
    /// NAK) dropped.
    pub(super) fn admit(&mut self, li: usize, h: &PktHeader) -> Option<Opcode> {
        let qpn = h.dst_qpn;
        if self.qps.get(qpn).is_none() && self.ctl.has_cmds.load(Ordering::Acquire) {
            self.commands();
        }
        self.sync_direct_psn(qpn);
        let q = self.qps.get(qpn);
        let from = Origin {
            peer: li,
            qpn: h.src_qpn,
            psn: h.psn,
        };
        let code = match admission(q.map(QpContext::view).as_ref(), &from) {
            Admission::Nak(code) => code,
            // After a NAK: dropped until the requester resends this psn.
            Admission::Drop => {
                out_of_sequence(qpn, h.psn, q.map_or(0, |q| q.rq.exp_psn));
                return None;
            }
            Admission::Admit => match Opcode::from_u8(h.op) {
                Some(op) => return Some(op),
                None => Syndrome::RemoteInvalReq as u8,
            },
        };
        self.respond(li, nak(h, code));
        None
    }

    /// The PSN a published QP expects, as its peer's direct writes moved it.
    #[inline]
    fn sync_direct_psn(&mut self, qpn: u32) {
        if let Some(q) = self.qps.get_mut(qpn) {
            if q.rq.published && !q.err {
                q.rq.exp_psn = self.targets.psn(qpn).unwrap_or(q.rq.exp_psn);
            }
        }
    }

    /// The checks on a message's first packet, by request (the responder table of the
    /// spec). Returns whether payload follows into memory or a receive.
    fn first_packet(&mut self, li: usize, h: &PktHeader, op: Opcode, payload: &[u8]) -> bool {
        let qpn = h.dst_qpn;
        let Some(q) = self.qps.get_mut(qpn) else {
            return false;
        };
        q.rq.inmsg = None;
        let slots = &*self.mrc.slots;
        let r = match op {
            _ if !qp_grants(q, op) => Err(Refusal::Nak(Syndrome::RemoteAccess as u8)),
            Opcode::RdmaWrite | Opcode::RdmaWriteImm => accept_write(q, slots, h, op),
            Opcode::Send | Opcode::SendImm => accept_send(q, slots, h),
            Opcode::RdmaRead => serve_read(q, slots, h),
            Opcode::AtomicCs | Opcode::AtomicFa => serve_atomic(q, slots, h, op, payload),
            _ => Err(Refusal::Nak(Syndrome::RemoteInvalReq as u8)),
        };
        match r {
            Ok(Accepted::Incoming(dest)) => {
                q.rq.inmsg = Some(IncomingMessage {
                    op,
                    len: h.msg_len,
                    got: 0,
                    solicited: h.flags & flag::SOLICITED != 0,
                    imm: h.imm,
                    dest,
                });
                true
            }
            Ok(Accepted::Answered(job)) => {
                q.expect_next(&self.targets);
                self.respond(li, job);
                false
            }
            Err(Refusal::Nak(code)) => {
                self.respond(li, nak(h, code));
                false
            }
            Err(Refusal::Fail(s, code)) => {
                self.responder_error(qpn, s);
                self.respond(li, nak(h, code));
                false
            }
        }
    }

    /// A packet of the message being received: its payload into memory or the receive's
    /// scatter list, at its offset; the last one completes the message.
    fn receive_payload(&mut self, li: usize, h: &PktHeader, payload: &[u8]) {
        let qpn = h.dst_qpn;
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let slots = &*self.mrc.slots;
        let Some(m) = q.rq.inmsg.as_mut() else { return };
        if h.offset != m.got || payload.len() as u64 > (m.len - m.got) as u64 {
            return;
        }
        let ok = match &m.dest {
            Dest::Memory { rkey, addr } => {
                let a = addr + m.got as u64;
                slots
                    .get(*rkey)
                    .is_some_and(|e| e.access.contains(Access::REMOTE_WRITE) && e.write(a, payload))
            }
            Dest::Recv { sges } => scatter(slots, q.hw.pd, sges, m.got as u64, payload),
        };
        if !ok {
            let recv = matches!(m.dest, Dest::Recv { .. });
            q.rq.inmsg = None;
            if recv {
                self.responder_error(qpn, Syndrome::LocalProt);
                self.respond(li, nak(h, Syndrome::RemoteOp as u8));
            } else {
                self.respond(li, nak(h, Syndrome::RemoteAccess as u8));
            }
            return;
        }
        m.got += payload.len() as u32;
        if m.got < m.len {
            return;
        }
        let m = q.rq.inmsg.take().unwrap();
        complete_message(q, h, &m);
        q.expect_next(&self.targets);
        self.owe_ack(qpn, h.psn);
    }

    /// Sends a response other than an ACK (a NAK, read data, an atomic's old value), after
    /// the ACK its QP owes: the QP's responses stay in PSN order.
    pub(super) fn respond(&mut self, li: usize, job: QueuedMessage) {
        self.pay_ack(job.hdr.src_qpn);
        self.send(li, &job.hdr, job.body.as_ref(), job.pd);
    }

    /// A responder-side error on the receive at the head of the receive ring: its error
    /// CQE, then the QP to error.
    pub(super) fn responder_error(&mut self, qpn: u32, s: Syndrome) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let cqe = err_cqe(CqeOpcode::RespErr, s, 0, q.hw.qpn, q.rq.ci as u16);
        complete_error(&self.ctl, q, Side::Recv, cqe);
        q.rq.ci += 1;
        self.enter_error(qpn, None);
    }
}

/// Whether the QP grants its peer the remote access `op` needs (the QP's access flags, checked
/// before the region's, as the IB spec's responder does): sends need none.
fn qp_grants(q: &QpContext, op: Opcode) -> bool {
    let need = match op {
        Opcode::RdmaWrite | Opcode::RdmaWriteImm => Access::REMOTE_WRITE,
        Opcode::RdmaRead => Access::REMOTE_READ,
        Opcode::AtomicCs | Opcode::AtomicFa => Access::REMOTE_ATOMIC,
        _ => Access::empty(),
    };
    q.hw.access.contains(need)
}

/// An RDMA write (with immediate): a receive posted if it consumes one, and the rkey names
/// a region of the QP's PD with `REMOTE_WRITE` covering the range.
fn accept_write(
    q: &QpContext,
    slots: &Slots,
    h: &PktHeader,
    op: Opcode,
) -> Result<Accepted, Refusal> {
    if op.consumes_recv() && !rq_ready(q) {
        return Err(Refusal::Nak(NAK_RNR));
    }
    if !remote_ok(q.hw.pd, slots, h, Access::REMOTE_WRITE, h.msg_len as u64) {
        return Err(Refusal::Nak(Syndrome::RemoteAccess as u8));
    }
    Ok(Accepted::Incoming(Dest::Memory {
        rkey: h.rkey,
        addr: h.raddr,
    }))
}

/// A send: a receive posted, its scatter list valid, and the message fits in it.
fn accept_send(q: &QpContext, slots: &Slots, h: &PktHeader) -> Result<Accepted, Refusal> {
    if !rq_ready(q) {
        return Err(Refusal::Nak(NAK_RNR));
    }
    let hw = &q.hw;
    let sges = read_recv_wqe(hw, q.rq.ci);
    let cap: u64 = sges.iter().map(|s| s.len as u64).sum();
    if !sges_ok(slots, hw.pd, &sges, Access::LOCAL_WRITE) {
        return Err(Refusal::Fail(Syndrome::LocalProt, Syndrome::RemoteOp as u8));
    }
    if h.msg_len as u64 > cap {
        return Err(Refusal::Fail(
            Syndrome::LocalLength,
            Syndrome::RemoteInvalReq as u8,
        ));
    }
    Ok(Accepted::Incoming(Dest::Recv { sges }))
}

/// An RDMA read: `REMOTE_READ` covering the range; answered with the data, read from
/// memory as the response's packets go out.
fn serve_read(q: &QpContext, slots: &Slots, h: &PktHeader) -> Result<Accepted, Refusal> {
    if !remote_ok(q.hw.pd, slots, h, Access::REMOTE_READ, h.msg_len as u64) {
        return Err(Refusal::Nak(Syndrome::RemoteAccess as u8));
    }
    let mut r = reply(h, resp::READ);
    r.msg_len = h.msg_len;
    Ok(Accepted::Answered(QueuedMessage {
        hdr: r,
        body: Body::Memory {
            rkey: h.rkey,
            addr: h.raddr,
        },
        pd: q.hw.pd,
        sent: 0,
    }))
}

/// An atomic: `REMOTE_ATOMIC`, 8-byte aligned, covering 8 bytes; executed on the native
/// 8-byte word, answered with its old value.
fn serve_atomic(
    q: &QpContext,
    slots: &Slots,
    h: &PktHeader,
    op: Opcode,
    payload: &[u8],
) -> Result<Accepted, Refusal> {
    if payload.len() < 16 {
        return Err(Refusal::Nak(Syndrome::RemoteInvalReq as u8));
    }
    let operand = |i: usize| u64::from_ne_bytes(payload[i..i + 8].try_into().unwrap());
    let (swap_add, compare) = (operand(0), operand(8));
    let e = remote_region(q.hw.pd, slots, h, Access::REMOTE_ATOMIC, 8).filter(|_| h.raddr % 8 == 0);
    let Some(e) = e else {
        return Err(Refusal::Nak(Syndrome::RemoteAccess as u8));
    };
    let Some(old) = e.atomic(h.raddr, |old| {
        if op == Opcode::AtomicFa {
            old.wrapping_add(swap_add)
        } else if old == compare {
            swap_add
        } else {
            old
        }
    }) else {
        return Err(Refusal::Nak(Syndrome::RemoteOp as u8));
    };
    Ok(Accepted::Answered(QueuedMessage {
        hdr: reply(h, resp::ATOMIC),
        body: Body::Inline(SmallVec::from_slice(&old.to_ne_bytes())),
        pd: q.hw.pd,
        sent: 0,
    }))
}

/// A message received in full: if it consumed a receive, the responder CQE (byte count,
/// immediate, remote QPN, receive index, solicited bit) and the receive is retired.
fn complete_message(q: &mut QpContext, h: &PktHeader, m: &IncomingMessage) {
    let Some(op) = m.op.responder_cqe() else {
        return;
    };
    let mut cqe = Cqe64([0; 64]);
    cqe.set_byte_cnt(m.len);
    if m.op.has_imm() {
        cqe.set_imm(m.imm);
    }
    cqe.set_flags_rqpn(h.src_qpn & 0xFF_FFFF);
    cqe.set_sop_drop_qpn(q.hw.qpn);
    cqe.set_wqe_counter(q.rq.ci as u16);
    cqe.set_op_own(op, m.solicited, 0);
    q.complete(Side::Recv, &mut cqe);
    q.rq.ci += 1;
}

/// Whether a receive is posted (`rq_ci` behind the receive doorbell record).
fn rq_ready(q: &QpContext) -> bool {
    q.hw.rq_producer().wrapping_sub(q.rq.ci as u16) != 0
}

/// Whether the rkey names a region of PD `pd` (the responder QP's) with `need` rights
/// covering `len` bytes at the request's remote address.
fn remote_ok(pd: u32, slots: &Slots, h: &PktHeader, need: Access, len: u64) -> bool {
    remote_region(pd, slots, h, need, len).is_some()
}

/// The region [`remote_ok`] finds, to act on with the same lookup (also the requester's
/// check of a direct write's target, [`super::direct_write`]).
pub(super) fn remote_region<'s>(
    pd: u32,
    slots: &'s Slots,
    h: &PktHeader,
    need: Access,
    len: u64,
) -> Option<&'s MrEntry> {
    slots
        .get(h.rkey)
        .filter(|e| e.pd == pd && e.access.contains(need) && e.covers(h.raddr, len))
}

/// Largest receive WQE stride (16 scatter entries).
const MAX_RQ_STRIDE: usize = MAX_SGE * SEG_SIZE;

/// The scatter list of the receive WQE at `rq_ci`: data segments up to the terminator or
/// the end of the stride (zero-length ones skipped).
fn read_recv_wqe(hw: &QpHw, rq_ci: u64) -> SmallVec<[Seg; 4]> {
    let stride = (hw.rq_stride as usize).min(MAX_RQ_STRIDE);
    let mut slot = [0u8; MAX_RQ_STRIDE];
    hw.buf.read(
        slot_off(hw.rq_off, rq_ci, hw.rq_cnt, hw.rq_stride as usize),
        &mut slot[..stride],
    );
    let segs = RecvWqe::parse(&slot[..stride]).map_or(DataSegs::EMPTY, |w| w.segs);
    segs.iter()
        .filter(|d| d.byte_count.get() > 0)
        .map(Seg::of)
        .collect()
}

/// A request dropped for its PSN. Ahead of the expected PSN is normal after a NAK (the
/// requester resends from the NAKed one); behind it, a duplicate, never happens on the soft
/// device's reliable links: logged so that the requester's later "no answer" has a cause.
#[cold]
#[inline(never)]
fn out_of_sequence(qpn: u32, psn: u32, expected: u32) {
    if psn_le(psn.wrapping_add(1), expected) {
        tracing::debug!(
            "soft device: QP {qpn:#x}: request with PSN {psn} dropped as a duplicate (expected {expected})"
        );
    } else {
        tracing::trace!("soft device: QP {qpn:#x}: request with PSN {psn} dropped until PSN {expected} is resent");
    }
}
