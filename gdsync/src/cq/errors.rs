//! The reconciliation of errors that executors and kernels consumed: a wait on a
//! completion passes for error completions too, so the host learns of them afterwards, from
//! the consumer index they published ([`CqShared::catch_up`]), the CQEs still in the ring
//! ([`CqShared::scan`]) and, where the device wrote over them, the QPs' first errors
//! ([`CqShared::recover_lost_errors`]); [`Cq::take_errors`] hands them out.

use super::{Cq, CqShared, CqUser, PollState, CQ_RETIRED};
use crate::format::{Cqe64, CqeOpcode, CqeOwner, Syndrome, CQE_SIZE};
use crate::mem::slot_off;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Most error completions a CQ keeps for [`Cq::take_errors`] between two calls.
pub const MAX_KEPT_ERRORS: usize = 1024;

/// An error completion, as its CQE reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqError {
    /// The QP.
    pub qpn: u32,
    /// Its WQE counter (send ring index, or receive index for responder errors).
    pub wqe_counter: u16,
    /// The syndrome.
    pub syndrome: Syndrome,
    /// A responder (receive-side) error.
    pub responder: bool,
}

impl PollState {
    /// Keeps an error completion for [`Cq::take_errors`], if there is room.
    pub(super) fn keep_error(&mut self, e: CqError, logged: bool) {
        if e.syndrome != Syndrome::WrFlush {
            self.reported.insert(e.qpn);
        }
        if self.errors.len() < MAX_KEPT_ERRORS {
            self.errors.push((e, logged));
        } else {
            self.errors_dropped += 1;
        }
    }
}

impl CqShared {
    /// Takes in what executors and kernels consumed beyond `st.ci`: the doorbell record's
    /// 24-bit consumer index, which they store as they consume (read relative to `st.ci`:
    /// they run at most 2^23 completions ahead of the host's last look), and the retired
    /// counter kernels store beside it. Their CQEs are looked at for errors only when
    /// errors are asked for ([`Cq::take_errors`]).
    pub(super) fn catch_up(&self, st: &mut PollState) {
        let rec = u64::from(crate::mem::load_be32(&self.dbrec.mem, self.dbrec.off) & 0xFF_FFFF);
        st.ci = crate::format::catch_up24(st.ci, rec as u32);
        st.ci = st.ci.max(self.ctrl.u64(CQ_RETIRED).load(Ordering::Acquire));
    }

    /// Looks at the CQEs from `st.scanned` on for errors: those consumed (up to `st.ci`) and
    /// those written and not consumed yet. A consumed CQE may have been overwritten by the
    /// device's next pass through the ring (its owner bit then says so, or the host fell
    /// more than a ring behind): returns whether any was, so the caller asks the device for
    /// the QPs' first errors instead.
    fn scan(&self, st: &mut PollState) -> bool {
        let cnt = self.cnt as u64;
        let mut lost = false;
        if st.ci > st.scanned + cnt {
            lost = true;
            st.scanned = st.ci - cnt;
        }
        while st.scanned < st.ci + cnt {
            let i = st.scanned;
            let consumed = i < st.ci;
            let off = slot_off(0, i, self.cnt, CQE_SIZE);
            let op_own = self.ring.u8(off + 63).load(Ordering::Acquire);
            if !CqeOwner::is_new(op_own, i, self.cnt) {
                if !consumed {
                    break; // not written yet
                }
                lost = true; // the next pass wrote over it
            } else if CqeOpcode::from_u8(op_own >> 4).is_some_and(CqeOpcode::is_error) {
                let mut cqe = Cqe64([0; 64]);
                self.ring.read(off, &mut cqe.0);
                // Still the same CQE after the read: the device did not start writing over it.
                if self.ring.u8(off + 63).load(Ordering::Acquire) == op_own {
                    let e = cq_error(&cqe);
                    self.ctx.qp_failed(e.qpn); // (an error completion: its QP is in error)
                    st.keep_error(e, false);
                } else {
                    lost = true;
                }
            }
            st.scanned = i + 1;
        }
        lost
    }

    /// The consumer index in the doorbell record (its 24 bits, as stored): it moves whenever
    /// a host poll, an executor or a kernel consumes a completion.
    pub(crate) fn ci_word(&self) -> u32 {
        crate::mem::load_be32(&self.dbrec.mem, self.dbrec.off) & 0xFF_FFFF
    }

    /// Looks for error completions among those executors or kernels consumed since the host
    /// last looked (and those written since), as [`Cq::take_errors`] does: their QPs' state
    /// words learn of them, and `take_errors` reports them. Skipped while a host poll holds
    /// the CQ (that poll decodes what it consumes).
    pub(crate) fn look_for_errors(&self) {
        let Some(mut st) = self.poll.try_lock() else {
            return;
        };
        self.catch_up(&mut st);
        if self.scan(&mut st) {
            self.recover_lost_errors(&mut st);
        }
    }

    /// The first errors of this CQ's QPs, from the device (`query_qp`), for QPs whose error
    /// CQE was overwritten before the host looked at it. Each QP's once.
    fn recover_lost_errors(&self, st: &mut PollState) {
        let users: Vec<Arc<dyn CqUser>> = self
            .users_by_qpn
            .read()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for u in users {
            if let Some(e) = u.first_error_on(self.cqn) {
                self.ctx.qp_failed(e.qpn);
                if !st.reported.contains(&e.qpn) {
                    st.keep_error(e, false);
                }
            }
        }
    }
}

impl Cq {
    /// The error completions written since the last call, whether a CPU poll or an executor's
    /// wait consumed them. Call it after a stream synchronises to learn whether work it
    /// waited for failed (a wait on a completion passes for errors too).
    ///
    /// Errors are learnt from the CQEs themselves: those a CPU poll decoded, those an executor
    /// or kernel consumed (still in the ring), and those written and not consumed yet. Where
    /// the device has since written over a consumed CQE (executors ran more than a ring
    /// ahead of the last call), each QP's first error comes from the device, which keeps it
    /// in the QP's context; the flushes that followed it are then not reported.
    pub fn take_errors(&self) -> Vec<CqError> {
        let s = &*self.shared;
        let mut st = s.poll.lock();
        s.catch_up(&mut st);
        if s.scan(&mut st) {
            s.recover_lost_errors(&mut st);
        }
        let errors = std::mem::take(&mut st.errors);
        let dropped = std::mem::take(&mut st.errors_dropped);
        drop(st);
        log_taken_errors(s, &errors);
        if dropped > 0 {
            tracing::warn!(
                "CQ {:#x}: {dropped} more error completions since the last take_errors than the {MAX_KEPT_ERRORS} kept: the first ones are returned",
                s.cqn
            );
        }
        errors.into_iter().map(|(e, _)| e).collect()
    }

    /// `Err` with the first error completion since the last check (see
    /// [`take_errors`](Self::take_errors)), also when the CQ overran.
    pub fn check(&self) -> Result<()> {
        if self.shared.ctx.cq_overran(self.shared.cqn) {
            return Err(Error::CqOverrun {
                cqn: self.shared.cqn,
            });
        }
        match self.take_errors().first() {
            None => Ok(()),
            Some(e) => Err(Error::Completion {
                wr_id: u64::MAX,
                qpn: e.qpn,
                syndrome: e.syndrome,
            }),
        }
    }
}

/// The error a CQE reports.
pub(super) fn cq_error(cqe: &Cqe64) -> CqError {
    CqError {
        qpn: cqe.qpn(),
        wqe_counter: cqe.wqe_counter(),
        syndrome: cqe.syndrome().unwrap_or(Syndrome::LocalQpOp),
        responder: cqe.opcode() == Some(CqeOpcode::RespErr),
    }
}

/// Logs the error completions [`Cq::take_errors`] hands out that no CPU poll logged (an
/// executor consumed them), as [`log_polled_error`] does.
#[cold]
fn log_taken_errors(s: &CqShared, errors: &[(CqError, bool)]) {
    for (e, logged) in errors {
        if *logged {
            continue;
        }
        let side = if e.responder { "receive" } else { "send" };
        let what = crate::error::describe_syndrome(e.syndrome);
        let (cqn, qpn, wqe) = (s.cqn, e.qpn, e.wqe_counter);
        if e.syndrome == Syndrome::WrFlush {
            tracing::debug!("CQ {cqn:#x}: a {side} on QP {qpn:#x} (WQE {wqe}) failed with {what}");
        } else {
            tracing::error!("CQ {cqn:#x}: a {side} on QP {qpn:#x} (WQE {wqe}) failed with {what}");
        }
    }
}
