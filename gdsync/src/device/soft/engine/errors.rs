//! Failures and the error state: malformed WQEs, work that fails before or after it is sent,
//! and the flushes of everything else posted (`docs/soft-device.md`, "Errors and the error
//! state").

use super::super::wire::kind;
use super::completion::{complete_front, err_cqe, Side};
use super::{Engine, EngineCtl, QpContext, WqeStep};
use crate::format::*;
use crate::provider::{AsyncEvent, HwQpState, QpLastError};

/// Writes an error CQE of `q`; the QP's first error that is not a flush is also kept in its
/// context, where [`Provider::query_qp`](crate::provider::Provider::query_qp)
/// reads it (the CQE may be overwritten before the host looks at it).
pub(super) fn complete_error(ctl: &EngineCtl, q: &mut QpContext, side: Side, mut cqe: Cqe64) {
    if let Some(syndrome) = cqe.syndrome().filter(|s| *s != Syndrome::WrFlush) {
        ctl.note_error(
            q.hw.qpn,
            QpLastError {
                syndrome,
                wqe_opcode: cqe.wqe_opcode(),
                wqe_counter: cqe.wqe_counter(),
                responder: side == Side::Recv,
            },
        );
    }
    q.complete(side, &mut cqe);
}

impl Engine {
    /// A WQE the device cannot parse (or a doorbell record past the ring): error CQE with
    /// LOCAL_QP_OP, QP to error. After a bad WQE the rest of the ring up to the doorbell
    /// record is dropped (its WQEs cannot be trusted); after a bad doorbell record (`ctrl` is
    /// `None`) the consumer index stays, and later doorbells flush what follows it.
    pub(super) fn malformed(&mut self, qpn: u32, ctrl: Option<&CtrlSeg>, sq_ci: u64, pi: u16) {
        self.enter_error(qpn, None);
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let opcode = ctrl.map_or(0, |c| c.opcode_byte());
        let cqe = err_cqe(
            CqeOpcode::ReqErr,
            Syndrome::LocalQpOp,
            opcode,
            q.hw.qpn,
            sq_ci as u16,
        );
        complete_error(&self.ctl, q, Side::Send, cqe);
        if ctrl.is_some() {
            q.sq.ci += pi.wrapping_sub(sq_ci as u16) as u64;
        }
    }

    /// A WQE that fails before anything is sent: its error CQE, then QP to error.
    pub(super) fn fail_new(
        &mut self,
        qpn: u32,
        ctrl: &CtrlSeg,
        opcode: Opcode,
        nbb: u32,
        s: Syndrome,
    ) -> WqeStep {
        self.enter_error(qpn, None);
        let Some(q) = self.qps.get_mut(qpn) else {
            return WqeStep::Stop;
        };
        let cqe = err_cqe(
            CqeOpcode::ReqErr,
            s,
            opcode as u8,
            q.hw.qpn,
            ctrl.wqe_index(),
        );
        complete_error(&self.ctl, q, Side::Send, cqe);
        q.sq.ci += nbb as u64;
        WqeStep::Advanced
    }

    /// Moves a QP to the error state because its first unfinished WQE failed with `s`: the
    /// oldest outstanding one, or, when none is outstanding (an RNR wait rewound them), the
    /// next one in the send ring.
    pub(super) fn fail_first(&mut self, qpn: u32, s: Syndrome) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        complete_front(q);
        match q.sq.out.front().map(|o| o.psn) {
            Some(psn) => self.enter_error(qpn, Some((psn, s))),
            None => {
                if !q.err {
                    q.sq.fail_next = Some(s);
                }
                self.enter_error(qpn, None);
            }
        }
    }

    /// Moves a QP to the error state. Completed work at the front completes normally; the
    /// outstanding WQE with `failed` = (psn, syndrome) gets that error, the others WR_FLUSH.
    pub(super) fn enter_error(&mut self, qpn: u32, failed: Option<(u32, Syndrome)>) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        if q.err {
            return;
        }
        complete_front(q);
        q.err = true;
        self.targets.close(qpn);
        self.ctl.set_state(qpn, HwQpState::Error);
        self.ctl.event(AsyncEvent::QpFatal { qpn });
        q.rq.inmsg = None;
        q.sq.retry_at = None;
        q.sq.pending = true;
        while let Some(o) = q.sq.out.pop_front() {
            let s = match failed {
                Some((psn, s)) if psn == o.psn => s,
                _ => Syndrome::WrFlush,
            };
            let cqe = err_cqe(CqeOpcode::ReqErr, s, o.opcode as u8, q.hw.qpn, o.idx);
            complete_error(&self.ctl, q, Side::Send, cqe);
        }
        if let Some(li) = q.link {
            self.links[li]
                .queue
                .retain(|j| !(j.hdr.kind == kind::REQ && j.hdr.src_qpn == qpn));
        }
        // (The host logs the error completion with its syndrome; this marks the transition.)
        tracing::debug!("soft device: QP {qpn:#x} to the error state");
    }
}

/// Flushes the receive ring of a QP in error: every posted receive completes with WR_FLUSH.
/// Returns whether there was any.
pub(super) fn flush_recv_ring(q: &mut QpContext) -> bool {
    let rq_pi = q.hw.rq_producer();
    let mut work = false;
    while rq_pi.wrapping_sub(q.rq.ci as u16) != 0 {
        let mut cqe = err_cqe(
            CqeOpcode::RespErr,
            Syndrome::WrFlush,
            0,
            q.hw.qpn,
            q.rq.ci as u16,
        );
        q.complete(Side::Recv, &mut cqe);
        q.rq.ci += 1;
        work = true;
    }
    work
}

/// Flushes the WQE at the consumer index of a QP in error: it completes with WR_FLUSH (or
/// the syndrome the error left for it), signalled or not.
pub(super) fn flush_wqe(
    ctl: &EngineCtl,
    q: &mut QpContext,
    ctrl: &CtrlSeg,
    opcode: Opcode,
    nbb: u32,
) {
    let cqe = err_cqe(
        CqeOpcode::ReqErr,
        q.sq.fail_next.take().unwrap_or(Syndrome::WrFlush),
        opcode as u8,
        q.hw.qpn,
        ctrl.wqe_index(),
    );
    complete_error(ctl, q, Side::Send, cqe);
    q.sq.ci += nbb as u64;
}
