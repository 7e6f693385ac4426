//! Polling on the host, lazily: [`Cq::poll_iter`] yields completions one by one as it
//! decodes their CQEs, and publishes the consumer index once, when it is dropped (as
//! rdma-core's end of a poll and io-uring's completion queue do).

use super::errors::cq_error;
use super::{Completion, CompletionOp, Cq, CqShared, CqUser, PollState, WcStatus};
use crate::format::{Cqe64, CqeOpcode, CqeOwner, Opcode, Syndrome, CQE_SIZE};
use crate::mem::slot_off;
use crate::{Error, Result};
use parking_lot::{MutexGuard, RwLock};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// A poll of a CQ in progress ([`Cq::poll_iter`]): an iterator over the completions written
/// so far. It holds the CQ's poll lock; its drop stores the new consumer index to the
/// doorbell record, once, and where it found nothing lends the thread to the device (a
/// device served by the host's own threads runs its work then).
///
/// It yields `Err` once, before anything else, where the CQ overran.
pub struct CqPoll<'a> {
    s: &'a CqShared,
    st: Option<MutexGuard<'a, PollState>>,
    /// The consumer index when the poll began.
    from: u64,
    /// A look found the CQ empty (and not overrun) before any completion.
    idle: bool,
    /// The first empty look is done (with its overrun check).
    looked: bool,
}

impl Cq {
    /// Polls lazily: an iterator over the completions written so far, which publishes the
    /// consumer index once, when dropped. Refused while a GPU kernel consumes the CQ, and
    /// while the next completion is covered by an executor wait that has not run yet
    /// ([`Error::CqBusy`], see [`Cq::wait_ops`]).
    pub fn poll_iter(&self) -> Result<CqPoll<'_>> {
        let s = &*self.shared;
        if s.kernel_owned.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "CQ {:#x} is consumed by a GPU kernel (DeviceQp): the host cannot poll it",
                s.cqn
            )));
        }
        let mut st = s.poll.lock();
        // Completions an executor or kernel consumed are consumed.
        s.catch_up(&mut st);
        // (A wait cannot be reserved while this poll holds the lock.)
        s.check_not_reserved(st.ci)?;
        Ok(CqPoll {
            s,
            from: st.ci,
            st: Some(st),
            idle: false,
            looked: false,
        })
    }
}

impl Iterator for CqPoll<'_> {
    type Item = Result<Completion>;

    fn next(&mut self) -> Option<Result<Completion>> {
        let s = self.s;
        let st = &mut **self.st.as_mut()?;
        let off = slot_off(0, st.ci, s.cnt, CQE_SIZE);
        let op_own = s.ring.u8(off + 63).load(Ordering::Acquire);
        if !CqeOwner::is_new(op_own, st.ci, s.cnt) {
            return self.nothing_yet();
        }
        let mut cqe = Cqe64([0; 64]);
        s.ring.read(off, &mut cqe.0);
        let c = decode(&cqe, st.ci, &mut st.last, &s.users_by_qpn);
        if !c.is_ok() {
            s.ctx.qp_failed(c.qpn); // (an error completion: its QP is in error)
            let in_error = st.last.as_ref().is_some_and(|(_, q)| q.in_error());
            log_polled_error(s, &c, in_error);
            if st.ci >= st.scanned {
                st.keep_error(cq_error(&cqe), true);
            }
        }
        st.ci += 1;
        st.scanned = st.scanned.max(st.ci);
        Some(Ok(c))
    }
}

impl CqPoll<'_> {
    /// The CQ holds nothing more: on the first such look before any completion, the overrun
    /// error, or a note to lend the thread at the drop.
    fn nothing_yet(&mut self) -> Option<Result<Completion>> {
        let s = self.s;
        let none = self.st.as_ref().is_some_and(|st| st.ci == self.from);
        if none && !self.looked {
            self.looked = true;
            if s.ctx.cq_overran(s.cqn) {
                return Some(Err(Error::CqOverrun { cqn: s.cqn }));
            }
            self.idle = true;
        }
        None
    }
}

impl Drop for CqPoll<'_> {
    fn drop(&mut self) {
        if let Some(st) = self.st.take() {
            if st.ci != self.from {
                self.s.store_ci(st.ci);
            }
        }
        if self.idle {
            // Nothing yet: where the device is served by the host's threads, this is one.
            self.s.ctx.provider.idle();
        }
    }
}

/// Logs an error completion a CPU poll decoded: at error level with its syndrome and what it
/// means, or at debug level for flushed work (the first error says why).
#[cold]
fn log_polled_error(s: &CqShared, c: &Completion, in_error: bool) {
    let WcStatus::Error(syndrome) = c.status else {
        return;
    };
    let e = Error::Completion {
        wr_id: c.wr_id,
        qpn: c.qpn,
        syndrome,
    };
    let (cqn, wqe, vendor) = (s.cqn, c.wqe_counter, c.vendor_err);
    let state = if in_error {
        "; the QP is in the error state"
    } else {
        ""
    };
    if syndrome == Syndrome::WrFlush {
        tracing::debug!("CQ {cqn:#x}: {e} (WQE {wqe}){state}");
    } else {
        tracing::error!("CQ {cqn:#x}: {e} (WQE {wqe}, vendor syndrome {vendor:#x}){state}");
    }
}

fn decode(
    cqe: &Cqe64,
    index: u64,
    last: &mut Option<(u32, Arc<dyn CqUser>)>,
    users: &RwLock<HashMap<u32, Weak<dyn CqUser>>>,
) -> Completion {
    let qpn = cqe.qpn();
    if last.as_ref().is_none_or(|(n, _)| *n != qpn) {
        *last = users
            .read()
            .get(&qpn)
            .and_then(Weak::upgrade)
            .map(|q| (qpn, q));
    }
    let qp = last.as_ref().map(|(_, q)| q);
    let op = cqe.opcode().unwrap_or(CqeOpcode::Invalid);
    let status = if op.is_error() {
        WcStatus::Error(cqe.syndrome().unwrap_or(Syndrome::LocalQpOp))
    } else {
        WcStatus::Success
    };
    let is_req = matches!(op, CqeOpcode::Req | CqeOpcode::ReqErr);
    let wqe_counter = cqe.wqe_counter();
    let wr_id = match (&qp, is_req) {
        (Some(q), true) => q.retire_send(wqe_counter),
        (Some(q), false) => q.retire_recv(wqe_counter),
        (None, _) => 0,
    };
    let opcode = if is_req {
        Opcode::from_u8(cqe.wqe_opcode()).map_or(CompletionOp::Nop, Opcode::completion_op)
    } else if op == CqeOpcode::RespWrImm {
        CompletionOp::RecvWriteImm
    } else {
        CompletionOp::Recv
    };
    let imm = matches!(op, CqeOpcode::RespWrImm | CqeOpcode::RespSendImm)
        .then(|| u32::from_be_bytes(cqe.imm()));
    let byte_len = match op {
        CqeOpcode::Req if matches!(opcode, CompletionOp::CompareSwap | CompletionOp::FetchAdd) => 8,
        _ if op.is_error() => 0,
        _ => cqe.byte_cnt(),
    };
    Completion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm,
        qpn,
        src_qpn: cqe.flags_rqpn() & 0xFF_FFFF,
        wqe_counter,
        vendor_err: if op.is_error() {
            cqe.vendor_syndrome()
        } else {
            0
        },
        cqe_index: index,
    }
}
