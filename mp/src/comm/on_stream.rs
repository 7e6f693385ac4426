//! Work executors post and wait for (a CUDA stream, a host stream): sends an executor rings
//! once the receiver's credit is in, credits an executor gives, and waits an executor makes
//! for a request's completion. The ops keep the memory they name alive.

use super::peers::side_index;
use super::requests::{Request, Side, Ticket};
use super::{credit_allows, Comm};
use crate::fault::Work;
use gdsync::exec::Executor;
use gdsync::ops::{Ops, WaitCond};
use gdsync::{Error, Result, SendWr, Sge};
use std::time::Instant;

impl Comm {
    /// Like [`irecv`](Self::irecv), but the sender's credit is given by `exec` when it gets
    /// there, in order with that executor's other work: the peer cannot write into `dst`
    /// before, so a stream may still read `dst` (unpack the previous message) up to this
    /// point. The receive itself is posted now; wait for it on the CPU or on an executor.
    pub fn irecv_on(&mut self, dst: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        self.peers.get(peer)?;
        self.chunks_posted(peer, true)?;
        self.no_queued_cpu_work(peer, "giving credits on an executor")?;
        // The credit is prepared first: a full send ring fails before anything is posted.
        // Signalled: its completion tells the CPU the commit was rung (`Ringers::Executors`).
        let wr = self.credit_wr(peer, 1, true);
        let prepared = self.peers.get_mut(peer)?.qp.prepare_send(&wr)?;
        let req = self.post_receive(dst, peer)?;
        let p = self.peers.get_mut(peer)?;
        let (t, ops) = p.qp.commit(prepared)?;
        exec.submit(ops)?;
        p.exec_end = Some(t.end);
        Ok(req)
    }

    /// Posts `peer`'s queued CPU work, then refuses (naming `before`) if any is left:
    /// executor work would overtake it, and work to one peer stays in order. Work waiting for
    /// send-ring space or for executor work ahead of it is waited for (completions drain it,
    /// up to the communicator's timeout); work waiting for the peer's credit is not, as the
    /// peer may be waiting for this very post.
    pub(super) fn no_queued_cpu_work(&mut self, peer: usize, before: &str) -> Result<()> {
        let until = Instant::now() + self.timeout;
        loop {
            self.pump(peer)?;
            let credit = self.credit(peer);
            let p = self.peers.get(peer)?;
            let Some(front) = p.pending.front() else {
                return Ok(());
            };
            let for_credit = p.exec_end.is_none()
                && front.posted == 0
                && front
                    .credit
                    .is_some_and(|need| !credit_allows(credit, need));
            if for_credit || Instant::now() >= until {
                return Err(Error::invalid(format!(
                    "CPU work to rank {peer} is still queued ({}): wait for it before {before} (work to one peer stays in order)",
                    if for_credit {
                        "sends waiting for the peer's credits"
                    } else {
                        "the send ring stayed full"
                    }
                )));
            }
            self.poll_peer(peer)?;
            std::thread::yield_now();
        }
    }

    /// Submits `pre` (waits the executor does first) and the commit ops of `wrs` to `exec`,
    /// for request `req` of `peer`. Refused while CPU work to that peer is still queued: it
    /// would be overtaken (work to one peer stays in order).
    pub(crate) fn post_exec(
        &mut self,
        peer: usize,
        req: Request,
        wrs: &[SendWr],
        pre: Ops,
        exec: &impl Executor,
    ) -> Result<()> {
        self.no_queued_cpu_work(peer, "posting to that rank on an executor")?;
        let p = self.peers.get_mut(peer)?;
        let mut ops = pre;
        let mut last = None;
        for wr in wrs {
            let prepared = p.qp.prepare_send(wr)?;
            let (t, commit) = p.qp.commit(prepared)?;
            ops.append(commit);
            last = Some(t);
        }
        let last = last.expect("at least one work request");
        exec.submit(ops)?;
        p.exec_end = Some(last.end);
        self.reqs[req.slot as usize].ticket = Some(Ticket::Send(last));
        Ok(())
    }

    /// Like [`isend`](Self::isend), but the send is posted by `exec` (a stream): it waits on
    /// the executor for the receiver's credit (unless the credit is already here), then
    /// rings the doorbell. The CPU does not wait. The queued work keeps the memory it names
    /// alive, so the `Comm` may be dropped before the executor has run it.
    pub fn isend_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        self.isend_on_after(src, peer, exec, Ops::new())
    }

    /// [`isend_on`](Self::isend_on) with `first` (a staged payload's copy out) run by the
    /// executor before the send's credit wait and doorbell.
    pub(super) fn isend_on_after(
        &mut self,
        src: Sge,
        peer: usize,
        exec: &impl Executor,
        first: Ops,
    ) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peers.get(peer)?;
        self.chunks_posted(peer, false)?;
        let p = self.peers.get_mut(peer)?;
        p.sends += 1;
        let need = p.sends;
        let req = self.new_req(peer, Work::Send(len as u64));
        let wr = Self::send_wr(req, (len > 0).then_some(sge));
        let mut pre = first;
        // A credit already here needs no wait (a wait costs an executor a round of polling).
        // The wait keeps the control buffer alive, so the `Comm` may go first.
        if !credit_allows(self.credit(peer), need) {
            tracing::trace!(
                peer,
                need,
                "a send on an executor waits there for its credit"
            );
            let word = self.layout.ready(peer);
            pre.append(self.ctrl.wait64(word, need, WaitCond::Geq));
        }
        if let Err(e) = self.post_exec(peer, req, &[wr], pre, exec) {
            if let Ok(p) = self.peers.get_mut(peer) {
                p.sends -= 1;
            }
            self.release(req);
            return Err(e);
        }
        Ok(req)
    }

    /// [`isend_on`](Self::isend_on), then the executor waits for the send's completion.
    pub fn send_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        let r = self.isend_on(src, peer, exec)?;
        self.wait_on(r, exec)?;
        Ok(r)
    }

    /// Makes `exec` wait for request `r` (and consume its completion); the request is then
    /// complete once the executor has passed the wait and its retirement ([`Comm::wait`] still
    /// reports errors and releases it). A receive's retirement runs after what is batched after
    /// the wait in the same list (an [`OpBatch`](gdsync::exec::OpBatch)), up to the next wait
    /// ([`Ops::retire_late`]): a send that answers it rings an operation earlier. A flag
    /// batched after the wait for a CPU to see may therefore come before the retirement: the
    /// CPU's [`Comm::test`] says when the request is complete.
    pub fn wait_on(&mut self, r: Request, exec: &impl Executor) -> Result<()> {
        if let Some(i) = self.chunk_index(r) {
            return self.wait_on_chunked(i, exec);
        }
        let st = self.state(r)?;
        if st.on_executor {
            return Err(Error::invalid(
                "this request is already waited for on an executor",
            ));
        }
        let (peer, ticket) = (st.peer, st.ticket);
        let Some(n) = st.cqe() else {
            return Err(Error::invalid(
                "this request was not posted on an executor (its completion number is not known): wait for it with wait() or test()",
            ));
        };
        let p = self.peers.get_mut(peer)?;
        let (cq, side) = match ticket {
            Some(Ticket::Send(_)) => (&p.scq, Side::Send),
            _ => (&p.rcq, Side::Recv),
        };
        if cq.consumer_index() > n {
            // A CPU poll already consumed it: nothing to wait for (but a staged receive's
            // copy in, in the executor's order).
            let copy = self.stage_exec_copy_in(r, Ops::new())?;
            return if copy.is_empty() {
                Ok(())
            } else {
                exec.submit(copy)
            };
        }
        // The QP's wait ops also retire the ring slots, so the CPU need not poll. A staged
        // receive's copy in runs between the wait and the retirement: the CPU, seeing the
        // retirement, knows the bytes are in GPU memory and may free the bounce.
        let ops = match ticket {
            // A staged get lands by a send-side operation: its copy in follows the wait, with
            // the mark that frees its bounce.
            Some(Ticket::Send(t)) => {
                let wait = p.qp.send_wait_ops(&t)?;
                self.stage_exec_copy_in(r, wait)?
            }
            Some(Ticket::Recv(t)) => {
                let copy = self.stage_exec_copy(r, false)?;
                let p = self.peers.get_mut(peer)?;
                // Its retirement after what the caller batches next (a send's doorbell runs
                // an operation earlier), still before any later wait.
                let wait = p.qp.recv_wait_ops_then(&t, copy).inspect_err(|_| {
                    self.stage_exec_copy_undone(r);
                })?;
                wait.retire_late()
            }
            None => unreachable!("a request with a completion number has a ticket"),
        };
        if let Err(e) = exec.submit(ops) {
            self.stage_exec_copy_undone(r);
            return Err(e);
        }
        self.peers.get_mut(peer)?.exec_waits[side_index(side)] += 1;
        self.reqs[r.slot as usize].on_executor = true;
        Ok(())
    }

    /// [`wait_on`](Self::wait_on) for several requests.
    pub fn wait_all_on(&mut self, rs: &[Request], exec: &impl Executor) -> Result<()> {
        rs.iter().try_for_each(|&r| self.wait_on(r, exec))
    }
}
