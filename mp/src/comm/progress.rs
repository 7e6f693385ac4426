//! The CPU's progress: posting queued work whose credits arrived and polling each peer's
//! completion queues into the request slots (or, where an executor consumes a queue, reading
//! how far it got).

use super::peers::{side_index, Peer};
use super::requests::{ReqState, Side, Status};
use super::{Comm, INTERNAL};
use crate::fault::{Cause, Work};
use gdsync::{Result, WcStatus};

impl Comm {
    /// Moves CPU work forward: posts queued work whose credits arrived, polls completions.
    pub fn progress(&mut self) -> Result<()> {
        for peer in 0..self.size {
            if peer != self.rank {
                // The credit QP's CQ holds one success in 64 credits and the errors that
                // say why a connection failed: a full pass drains it (a wait makes one every
                // 64 spins), not every spin, and a credit finding its ring full drains it.
                let me = self.rank;
                self.peers.get_mut(peer)?.drain_credit_cq(me, peer);
                self.progress_peer(peer)?;
            }
        }
        self.advance_all_chunked();
        Ok(())
    }

    pub(super) fn progress_peer(&mut self, peer: usize) -> Result<()> {
        self.pump(peer)?;
        self.poll_peer(peer)
    }

    pub(super) fn poll_peer(&mut self, peer: usize) -> Result<()> {
        self.poll_peer_sides(peer, &[Side::Send, Side::Recv])
    }

    /// [`poll_peer`](Self::poll_peer) for the completion queues of `sides` only.
    pub(super) fn poll_peer_sides(&mut self, peer: usize, sides: &[Side]) -> Result<()> {
        let Comm {
            peers,
            reqs,
            polled,
            rank,
            ..
        } = self;
        let me = *rank;
        let p = peers.get_mut(peer)?;
        for &side in sides {
            if p.exec_waits[side_index(side)] > 0 {
                // The CPU does not poll a CQ an executor is consuming.
                if resolve_consumed(reqs, p, me, peer, side) > 0 {
                    continue;
                }
            }
            let cq = if side == Side::Send { &p.scq } else { &p.rcq };
            polled.clear();
            cq.poll(polled, 64)?;
            for c in polled.iter() {
                let (slot, generation) = ((c.wr_id & 0xFFFF_FFFF) as usize, (c.wr_id >> 32) as u32);
                let st = (c.wr_id != INTERNAL)
                    .then(|| reqs.get_mut(slot))
                    .flatten()
                    .filter(|s| s.live && s.generation == generation);
                if let WcStatus::Error(syndrome) = c.status {
                    let work = st.as_ref().map_or(Work::Internal, |s| s.work);
                    let cause = Cause::Completion {
                        syndrome,
                        work,
                        qpn: c.qpn,
                    };
                    p.note(me, peer, cause);
                }
                if let Some(st) = st {
                    st.status = match c.status {
                        WcStatus::Success => Status::Done(c.byte_len),
                        WcStatus::Error(s) => Status::Failed(s),
                    };
                }
            }
        }
        Ok(())
    }
}

/// Where an executor consumes the `side` CQ of `p` (rank `peer`'s connection, seen from rank
/// `me`): `peer`'s requests of that side are done once the consumer index passed their
/// completions (also CPU-waited ones it stepped over), and without the CQEs an error
/// completion fails every request resolved with it. Returns the executor-waited requests left.
fn resolve_consumed(
    reqs: &mut [ReqState],
    p: &mut Peer,
    me: usize,
    peer: usize,
    side: Side,
) -> usize {
    let cq = if side == Side::Send { &p.scq } else { &p.rcq };
    let ci = cq.consumer_index();
    let errs = cq.take_errors();
    let mut left = 0;
    let mut failed = None;
    for st in reqs
        .iter_mut()
        .filter(|s| s.live && s.peer == peer && s.side == side && s.status == Status::Pending)
    {
        if st.cqe().is_some_and(|n| n < ci) {
            // (No byte count without the CQE: a staged receive, copied in by the CPU later,
            // counts its whole posted length, as an executor's copy does.)
            let whole = st.stage.as_ref().filter(|r| r.inbound).map_or(0, |r| r.len);
            st.status = match errs.first() {
                Some(e) => {
                    failed.get_or_insert(st.work);
                    Status::Failed(e.syndrome)
                }
                None => Status::Done(whole as u32),
            };
        } else if st.on_executor {
            left += 1;
        }
    }
    p.exec_waits[side_index(side)] = left;
    if let Some(e) = errs.first() {
        let cause = Cause::Completion {
            syndrome: e.syndrome,
            work: failed.unwrap_or(Work::Internal),
            qpn: e.qpn,
        };
        p.note(me, peer, cause);
    }
    left
}
