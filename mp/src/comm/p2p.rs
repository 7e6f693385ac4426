//! Point to point on the CPU: receives that give the sender a credit at once, sends that go
//! out against the receiver's credit, and the queue of CPU work per peer that holds a send
//! until its credit arrives (or until work an executor committed before it is rung).

use super::peers::Pending;
use super::requests::{Request, Status, Ticket};
use super::{credit_allows, Comm, INTERNAL};
use crate::fault::{Cause, Work};
use gdsync::{Error, RecvWr, Result, SendWr, Sge};
use std::time::Instant;

impl Comm {
    /// Posts a receive into `dst` (`mr.sge(range)` of a registered buffer) from rank `peer`.
    /// Receives from one peer match that peer's sends in order (per-peer FIFO). Gives the
    /// sender a credit at once (an RDMA fetch-and-add on the credit QP), so the sender can go
    /// ahead while this rank does other work.
    pub fn irecv(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        self.peers.get(peer)?;
        self.chunks_posted(peer, true)?;
        self.irecv_now(dst, peer)
    }

    /// [`irecv`](Self::irecv) without waiting for chunks of an earlier staged receive (a
    /// chunk's own receive).
    pub(super) fn irecv_now(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        let req = self.post_receive(dst, peer)?;
        self.add_credit(peer, 1)?;
        Ok(req)
    }

    /// Posts one receive per entry of `dsts`, in order, from rank `peer`, and gives the
    /// sender all their credits in one fetch-and-add. A credit costs the NIC a request and a
    /// response, so code that keeps receives posted ahead (a ping-pong, a stream of
    /// messages) and tops them up in batches pays it once per batch instead of once per
    /// message. Either every receive is posted or none (a full receive ring is an `Err`).
    pub fn irecv_batch(&mut self, dsts: &[Sge], peer: usize) -> Result<Vec<Request>> {
        self.peers.get(peer)?;
        self.chunks_posted(peer, true)?;
        let p = self.peers.get(peer)?;
        let room = p.qp.recv_room();
        if dsts.len() as u64 > room {
            return Err(Error::RingFull {
                ring: "receive",
                qpn: p.qp.qpn(),
                used: p.qp.recv_ring_size() - room as u32,
                size: p.qp.recv_ring_size(),
                hint: "post fewer receives at once, or wait for some first",
            });
        }
        // A receive of one SGE fails to post only on a full ring, which the room check
        // excludes: every one is posted.
        let out = dsts
            .iter()
            .map(|&d| self.post_receive(d, peer))
            .collect::<Result<Vec<_>>>()?;
        if !out.is_empty() {
            self.add_credit(peer, out.len() as u64)?;
        }
        Ok(out)
    }

    /// Posts the receive WQE of a new request.
    pub(super) fn post_receive(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        let req = self.new_req(peer, Work::Recv(dst.len as u64));
        let p = match self.peers.get_mut(peer) {
            Ok(p) => p,
            Err(e) => {
                self.release(req);
                return Err(e);
            }
        };
        let mut wr = RecvWr::new().wr_id(req.wr_id());
        if dst.len > 0 {
            wr = wr.sge(dst);
        }
        match p.qp.post_recv(&wr) {
            Ok(t) => {
                p.recvs += 1;
                self.reqs[req.slot as usize].ticket = Some(Ticket::Recv(t));
                Ok(req)
            }
            Err(e) => {
                self.release(req);
                Err(e)
            }
        }
    }

    /// `n` credits for rank `peer`: a fetch-and-add of `n` on its credit word for this rank.
    /// Adds commute, so credits given by the CPU (credit QP) and by executors (traffic QP)
    /// may land in any order. Unsignalled: a later signalled request retires its slot.
    pub(super) fn credit_wr(&self, peer: usize, n: u64, signaled: bool) -> SendWr {
        let at = self.remote_ctrl[peer].at(self.layout.ready(self.rank) as u64);
        let wr = SendWr::fetch_add(at, n)
            .sge(self.scratch_mr.sge(0..8))
            .wr_id(INTERNAL);
        if signaled {
            wr
        } else {
            wr.unsignaled()
        }
    }

    /// Gives rank `peer` `n` credits from the CPU, on the credit QP (one in 64 signalled,
    /// so the ring's slots come back).
    fn add_credit(&mut self, peer: usize, n: u64) -> Result<()> {
        let p = self.peers.get_mut(peer)?;
        p.ctl_posted += 1;
        let signal = p.ctl_posted % 64 == 0;
        let wr = self.credit_wr(peer, n, signal);
        let start = Instant::now();
        loop {
            let p = self.peers.get_mut(peer)?;
            match p.ctl.post_send(&wr) {
                Err(Error::RingFull { .. }) if start.elapsed() < self.timeout => {
                    p.drain_credit_cq(self.rank, peer);
                    if p.fault.is_some() {
                        // A failed connection frees no slot: the credit cannot go out.
                        return Err(self.connection_error(peer, "giving a credit"));
                    }
                    std::thread::yield_now();
                }
                r => return r.map(|_| ()),
            }
        }
    }

    /// The credits rank `peer` has given this rank (the running total of its adds).
    pub(super) fn credit(&self, peer: usize) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.read_at(self.layout.ready(peer), &mut b);
        u64::from_ne_bytes(b)
    }

    pub(super) fn send_wr(req: Request, sge: Option<Sge>) -> SendWr {
        let mut wr = SendWr::send().wr_id(req.wr_id());
        if let Some(s) = sge {
            wr = wr.sge(s);
        }
        wr
    }

    /// Sends `src` (`mr.sge(range)`; keep the buffer registered until the send completes) to
    /// rank `peer`. Returns at once: the send goes out when the receiver has posted the
    /// matching receive (its credit), during this or any later call.
    pub fn isend(&mut self, src: Sge, peer: usize) -> Result<Request> {
        self.peers.get(peer)?;
        self.chunks_posted(peer, false)?;
        self.isend_now(src, peer)
    }

    /// [`isend`](Self::isend) without waiting for chunks of an earlier staged send (a
    /// chunk's own send).
    pub(super) fn isend_now(&mut self, src: Sge, peer: usize) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peers.get(peer)?;
        let req = self.new_req(peer, Work::Send(len as u64));
        // Posted by the CPU: a small host-memory payload is copied into the WQE now, which
        // spares the NIC a read (the buffer is reusable as soon as the send completes anyway).
        let wr = Self::send_wr(req, (len > 0).then_some(sge)).inline_host();
        let p = self.peers.get_mut(peer)?;
        p.sends += 1;
        let need = p.sends;
        self.post_cpu(peer, Some(req), vec![wr], Some(need))?;
        Ok(req)
    }

    /// Queues CPU work for `peer` behind anything queued before it, then posts what can go.
    pub(crate) fn post_cpu(
        &mut self,
        peer: usize,
        req: Option<Request>,
        wrs: Vec<SendWr>,
        credit: Option<u64>,
    ) -> Result<()> {
        self.peers.get_mut(peer)?.pending.push_back(Pending {
            req,
            wrs,
            posted: 0,
            credit,
            last: None,
        });
        self.pump(peer)
    }

    /// Posts queued CPU work for `peer` in order, as far as credits, executors and the ring
    /// allow. Fails it all if the connection is in error (it would wait forever).
    pub(super) fn pump(&mut self, peer: usize) -> Result<()> {
        let credit = self.credit(peer);
        let Comm {
            peers, reqs, rank, ..
        } = self;
        let p = peers.get_mut(peer)?;
        if p.pending.is_empty() {
            return Ok(());
        }
        if p.in_error() {
            // The peer is gone or the connection failed: work that never went out is
            // flushed, as the QP flushes what did, rather than waiting forever.
            if p.fault.is_none() {
                p.note(*rank, peer, Cause::QpError);
            }
            while let Some(w) = p.pending.pop_front() {
                if let Some(r) = w.req {
                    reqs[r.slot as usize].status =
                        Status::Failed(gdsync::format::Syndrome::WrFlush);
                }
            }
            return Ok(());
        }
        if let Some(end) = p.exec_end {
            if !p.qp.doorbell_reached(end) {
                return Ok(());
            }
            p.exec_end = None;
        }
        while let Some(w) = p.pending.front_mut() {
            if w.credit.is_some_and(|need| !credit_allows(credit, need)) {
                break;
            }
            while w.posted < w.wrs.len() {
                match p.qp.post_send(&w.wrs[w.posted]) {
                    Ok(t) => {
                        w.posted += 1;
                        w.last = Some(t);
                    }
                    Err(Error::RingFull { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            let w = p.pending.pop_front().unwrap();
            if let Some(r) = w.req {
                reqs[r.slot as usize].ticket = w.last.map(Ticket::Send);
            }
        }
        Ok(())
    }
}
