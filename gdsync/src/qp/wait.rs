//! The waits for a posted send's or receive's completion, as op lists any executor runs
//! (so the CPU never has to poll), and their submission.

use super::{Qp, RecvTicket, SendTicket, QP_RQ_RETIRED, QP_SQ_RETIRED};
use crate::cq::wait_ops;
use crate::ops::{Op, Ops};
use crate::{Error, Result};

impl Qp {
    /// Submits to `exec` the wait for a signalled send's completion (see
    /// [`send_wait_ops`](Self::send_wait_ops)).
    pub fn wait_send(&self, t: &SendTicket, exec: &impl crate::exec::Executor) -> Result<()> {
        exec.submit(self.send_wait_ops(t)?)
    }

    /// Submits to `exec` the wait for a receive's completion (see
    /// [`recv_wait_ops`](Self::recv_wait_ops)).
    pub fn wait_recv(&self, t: &RecvTicket, exec: &impl crate::exec::Executor) -> Result<()> {
        exec.submit(self.recv_wait_ops(t)?)
    }

    /// The op list that waits for a signalled send's completion and retires it (stores the
    /// CQ consumer index, the CQ's retired counter and this QP's send-ring retired counter),
    /// so the CPU never has to poll.
    pub fn send_wait_ops(&self, t: &SendTicket) -> Result<Ops> {
        let n = t.cqe.ok_or(Error::NotWaitable(
            "the send is unsignalled, or its CQ also serves other queues (use a dedicated send CQ)",
        ))?;
        let mut ops = wait_ops(&self.shared.send_cq, n, Ops::new())?;
        let keep = self.shared.keep();
        // The consumer index before the ring's slots are handed back: a CPU that posts into
        // them adds completions, which the CQ must have room for (a stream elides the barrier).
        ops.push_retire(Op::Barrier, &keep);
        ops.push_retire(
            Op::Write64 {
                addr: self.shared.ctrl.addr(QP_SQ_RETIRED),
                value: t.end,
            },
            &keep,
        );
        Ok(ops)
    }

    /// The op list that waits for a receive's completion and retires it.
    pub fn recv_wait_ops(&self, t: &RecvTicket) -> Result<Ops> {
        self.recv_wait_ops_then(t, Ops::new())
    }

    /// [`recv_wait_ops`](Self::recv_wait_ops) with `then` (a staged payload's copy out of
    /// its bounce, say) run after the wait and before the retirement: a CPU that learns of
    /// the receive from its retirement (polling while an executor consumes the CQ) knows
    /// `then` has run, with no store of its own to say so.
    pub fn recv_wait_ops_then(&self, t: &RecvTicket, then: Ops) -> Result<Ops> {
        let n = t.cqe.ok_or(Error::NotWaitable(
            "the receive CQ also serves other queues (use a dedicated receive CQ)",
        ))?;
        let mut ops = wait_ops(&self.shared.recv_cq, n, then)?;
        // The CQ's consumption, which the wait stores, retires the receive, unless the
        // numbering does not tell (then the receive ring's retired counter is stored too).
        if self.shared.rq_base() != Some(n.wrapping_sub(t.index)) {
            let keep = self.shared.keep();
            // The consumer index first, as for a send's ring.
            ops.push_retire(Op::Barrier, &keep);
            ops.push_retire(
                Op::Write64 {
                    addr: self.shared.ctrl.addr(QP_RQ_RETIRED),
                    value: t.index + 1,
                },
                &keep,
            );
        }
        Ok(ops)
    }
}
