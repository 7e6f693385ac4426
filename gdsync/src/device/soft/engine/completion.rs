//! Completion, requester step 6 of `docs/soft-device.md`: the peer's answers (acknowledgement,
//! read data, an atomic's old value, NAKs and their retries) mark outstanding WQEs done;
//! work completes in order and signalled WQEs write CQEs into the CQ ring.

use super::super::wire::PktHeader;
use super::memory::scatter;
use super::CqHw;
use super::{psn_le, resp, Engine, QpContext, NAK_NOT_READY, NAK_RNR, NOT_READY_DELAY};
use crate::format::*;
use crate::mem::slot_off;
use crate::provider::AsyncEvent;
use std::sync::atomic::Ordering;

impl Engine {
    /// A response from the peer's responder, for an outstanding WQE of one of this link's
    /// QPs.
    pub(super) fn on_response(&mut self, li: usize, h: &PktHeader, payload: &[u8]) {
        let qpn = h.dst_qpn;
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        if q.err || q.link != Some(li) || q.rqpn != h.src_qpn {
            return;
        }
        if !(h.op == resp::NAK && h.syndrome == NAK_NOT_READY) {
            q.sq.progressed = true;
            q.sq.not_ready = false;
        }
        match h.op {
            resp::ACK => acknowledge(q, h.psn),
            resp::READ | resp::ATOMIC => self.on_data(qpn, h, payload),
            resp::NAK => self.on_nak(qpn, h),
            _ => {}
        }
    }

    /// Read data or an atomic's old value: scattered into the WQE's local segments; the
    /// WQE is done when all of it has arrived.
    fn on_data(&mut self, qpn: u32, h: &PktHeader, payload: &[u8]) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let pd = q.hw.pd;
        let Some(o) = q.sq.out.iter_mut().find(|o| o.psn == h.psn && !o.done) else {
            return;
        };
        self.mrc.sync(&self.mrs);
        let slots = &*self.mrc.slots;
        let ok = if h.op == resp::READ {
            h.offset == o.got && scatter(slots, pd, &o.scatter, h.offset as u64, payload)
        } else {
            payload.len() == 8 && scatter(slots, pd, &o.scatter, 0, payload)
        };
        if !ok {
            let psn = o.psn;
            self.enter_error(qpn, Some((psn, Syndrome::LocalProt)));
            return;
        }
        o.got += payload.len() as u32;
        if h.op == resp::ATOMIC || o.got >= o.len {
            o.done = true;
        }
        q.sq.rnr_left = q.hw.timers.rnr_retry;
        complete_front(q);
    }

    /// A NAK: receiver not ready or peer not ready (rewind and retry later), or an error
    /// (the WQE fails with the syndrome, the QP goes to error).
    fn on_nak(&mut self, qpn: u32, h: &PktHeader) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let Some(k) = q.sq.out.iter().position(|o| o.psn == h.psn) else {
            return;
        };
        match h.syndrome {
            NAK_RNR if q.sq.rnr_left > 0 => {
                if q.sq.rnr_left != u8::MAX {
                    q.sq.rnr_left -= 1;
                }
                let t = q.hw.timers.min_rnr_timer;
                self.rewind(qpn, k, t);
            }
            NAK_RNR => self.enter_error(qpn, Some((h.psn, Syndrome::RnrRetryExc))),
            NAK_NOT_READY => {
                // Not progress: the QP's timeout keeps running.
                q.sq.not_ready = true;
                self.rewind(qpn, k, NOT_READY_DELAY);
            }
            s => {
                let s = Syndrome::from_u8(s).unwrap_or(Syndrome::RemoteOp);
                self.enter_error(qpn, Some((h.psn, s)));
            }
        }
    }
}

/// An acknowledgement up to `psn`: sends and writes up to it are done (reads and atomics are
/// done when their data arrives).
fn acknowledge(q: &mut QpContext, psn: u32) {
    for o in q.sq.out.iter_mut() {
        if !psn_le(o.psn, psn) {
            break;
        }
        if !o.opcode.returns_data() {
            o.done = true;
        }
    }
    q.sq.rnr_left = q.hw.timers.rnr_retry;
    complete_front(q);
}

/// Pops completed WQEs off the front, writing CQEs for the signalled ones.
pub(super) fn complete_front(q: &mut QpContext) {
    while q.sq.out.front().is_some_and(|o| o.done) {
        let o = q.sq.out.pop_front().unwrap();
        if o.signalled {
            let mut cqe = Cqe64([0; 64]);
            if o.opcode == Opcode::RdmaRead {
                cqe.set_byte_cnt(o.len);
            }
            cqe.set_sop_drop_qpn(((o.opcode as u32) << 24) | q.hw.qpn);
            cqe.set_wqe_counter(o.idx);
            cqe.set_op_own(CqeOpcode::Req, false, 0);
            q.complete(Side::Send, &mut cqe);
        }
        q.sq.progressed = true;
    }
}

/// An error CQE: the syndrome, the WQE opcode and QPN, the WQE counter.
pub(super) fn err_cqe(op: CqeOpcode, s: Syndrome, wqe_opcode: u8, qpn: u32, counter: u16) -> Cqe64 {
    let mut c = Cqe64([0; 64]);
    c.set_syndrome(s, 0);
    c.set_sop_drop_qpn(((wqe_opcode as u32) << 24) | (qpn & 0xFF_FFFF));
    c.set_wqe_counter(counter);
    c.set_op_own(op, false, 0);
    c
}

/// Which of a QP's CQs a completion goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The send CQ (requester completions).
    Send,
    /// The receive CQ (responder completions).
    Recv,
}

impl QpContext {
    /// Writes a CQE to the QP's send or receive CQ. If the CQ overran, the CQE is dropped
    /// and the QP goes to the error state at its next look ([`Engine::poll_qp`]), as a
    /// ConnectX moves the QPs of an overrun CQ to error.
    pub(super) fn complete(&mut self, side: Side, cqe: &mut Cqe64) {
        let cq = match side {
            Side::Send => &self.hw.send_cq,
            Side::Recv => &self.hw.recv_cq,
        };
        cqe.set_srqn_uidx(self.hw.user_index);
        if !push_cqe(cq, cqe) {
            self.cq_overrun = true;
            self.sq.pending = true;
        }
    }
}

/// Writes a CQE at the CQ's producer index: bytes 0..63 first, then `op_own` with the
/// owner bit of this pass, with release order. Only while the CQ is not in error and the
/// consumer index in its doorbell record, read for every CQE, is one a ConnectX could act on
/// ([`ci_fault`]): else the CQ goes to error (a CQ error, reported as
/// [`AsyncEvent::CqError`]) and takes no more CQEs. Returns whether the CQE was written.
#[must_use]
fn push_cqe(cq: &CqHw, cqe: &mut Cqe64) -> bool {
    if cq.overrun.load(Ordering::Relaxed) {
        return false;
    }
    let pi = cq.pi.load(Ordering::Relaxed);
    // The consumer index is read when the ring looks full by the one read last, as a
    // ConnectX reads it when it needs it, and on every timer tick ([`check_cq`]): reading
    // it for every CQE would fetch a line the consumer writes, once per completion.
    if cq_full24(pi, cq.ci_seen.load(Ordering::Relaxed), cq.cnt) && !read_ci(cq, true) {
        return false;
    }
    let owner = CqeOwner::expected(pi, cq.cnt);
    let op_own = (cqe.op_own() & !1) | owner;
    let off = slot_off(0, pi, cq.cnt, CQE_SIZE);
    cq.ring.write(off, &cqe.0[..63]);
    cq.ring.u8(off + 63).store(op_own, Ordering::Release);
    cq.pi.store(pi + 1, Ordering::Relaxed);
    true
}

/// Reads the CQ's consumer index from its doorbell record and refuses one a ConnectX leaves
/// undefined ([`ci_fault`]; `writing`: a CQE waits to be written): the CQ goes to error.
/// Returns whether the CQ may take a CQE.
fn read_ci(cq: &CqHw, writing: bool) -> bool {
    let pi = cq.pi.load(Ordering::Relaxed);
    let ci = crate::mem::load_be32(&cq.dbrec, cq.dbrec_off) & 0xFF_FFFF;
    // (One writer: the engine that owns the CQ.)
    let seen = cq.ci_seen.load(Ordering::Relaxed);
    cq.ci_seen.store(ci, Ordering::Relaxed);
    match ci_fault(pi, seen, ci, cq.cnt, writing) {
        Some(fault) => {
            cq_error(cq, &fault);
            false
        }
        None => true,
    }
}

/// The strict check of a CQ's consumer index on a timer tick (a moved-back or
/// ahead-of-the-device index shows within a tick, whatever the ring's fill). A ring that is
/// full is no fault here: only a CQE that finds it full is an overrun.
pub(super) fn check_cq(cq: &CqHw) {
    if !cq.overrun.load(Ordering::Relaxed) {
        read_ci(cq, false);
    }
}

/// What is wrong with consumer index `ci` (24 bits, as the doorbell record holds it) when the
/// device has written `pi` CQEs (free-running) and last read `seen`: a ConnectX leaves a
/// consumer index that moves backwards or names CQEs it has not written undefined, and a CQE
/// to write (`writing`) while all entries hold CQEs not consumed is an overrun. The soft
/// device refuses all three (see `docs/soft-device.md`, "Strict checks"). A ring that is
/// merely full, with no CQE waiting, is no fault: the consumer may be about to poll it.
pub(super) fn ci_fault(pi: u64, seen: u32, ci: u32, cnt: u32, writing: bool) -> Option<String> {
    let behind = seen.wrapping_sub(ci) & 0xFF_FFFF;
    if behind != 0 && behind < 0x80_0000 {
        return Some(format!(
            "its consumer index moved backwards, from {seen} to {ci} (two consumers store it?)"
        ));
    }
    let pi24 = pi as u32 & 0xFF_FFFF;
    let ahead = ci.wrapping_sub(pi24) & 0xFF_FFFF;
    if ahead != 0 && ahead < 0x80_0000 {
        return Some(format!(
            "its consumer index {ci} is ahead of the {pi24} CQEs the device has written (a consumer stored an index it never polled)"
        ));
    }
    (writing && cq_full24(pi, ci, cnt)).then(|| {
        format!("overrun: all {cnt} entries hold CQEs not consumed (consumer index {ci}); a completion was dropped")
    })
}

/// Puts the CQ in error, as a ConnectX does: one log line saying why, the asynchronous event
/// naming the CQ, and no more CQEs (the QP whose CQE is dropped goes to error).
#[cold]
fn cq_error(cq: &CqHw, why: &str) {
    cq.overrun.store(true, Ordering::Relaxed);
    tracing::error!(cqn = cq.cqn, "CQ {:#x} error: {why}", cq.cqn);
    cq.ctl.event(AsyncEvent::CqError { cqn: cq.cqn });
}

#[cfg(test)]
#[path = "completion_tests.rs"]
mod tests;
