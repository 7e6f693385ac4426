//! What a communicator keeps per peer: the two QPs to it and their CQs, the CPU's queue of
//! work not yet posted, what executors hold, and why the connection failed; and the table
//! that finds a peer by rank, with an error naming the rank when it is no peer.

use super::requests::{Request, Side};
use crate::fault::{self, Cause, Work};
use gdsync::{Cq, Endpoint, Error, Qp, QpState, Result, SendTicket, SendWr, WcStatus};
use std::collections::VecDeque;

/// Work the CPU posts to a peer, queued while it cannot go out yet: a send waiting for the
/// receiver's credit, or anything behind work an executor has not rung yet (a CPU post would
/// move the doorbell record past it). Leaves the queue in order.
pub(super) struct Pending {
    /// None for internal writes (barrier).
    pub(super) req: Option<Request>,
    pub(super) wrs: Vec<SendWr>,
    /// Work requests already posted (a put with signal is two).
    pub(super) posted: usize,
    /// Sends: the credit (receives the peer has posted) this one needs.
    pub(super) credit: Option<u64>,
    pub(super) last: Option<SendTicket>,
}

/// Index into [`Peer::exec_waits`].
pub(super) fn side_index(s: Side) -> usize {
    match s {
        Side::Send => 0,
        Side::Recv => 1,
    }
}

pub(super) struct Peer {
    /// Carries the user's traffic (sends, puts, gets) and barrier writes, posted by the CPU
    /// or by executors, in one order.
    pub(super) qp: Qp,
    pub(super) scq: Cq,
    pub(super) rcq: Cq,
    /// Carries credits only, always posted by the CPU: a credit must never queue behind a
    /// send that an executor holds back until the peer's credit arrives (that would
    /// deadlock two ranks sending to each other on streams).
    pub(super) ctl: Qp,
    pub(super) ctl_cq: Cq,
    /// Sends to this peer, posted or pending (the credit each needs is its index + 1).
    pub(super) sends: u64,
    /// Receives posted for this peer.
    pub(super) recvs: u64,
    /// Credits given on the credit QP.
    pub(super) ctl_posted: u64,
    pub(super) pending: VecDeque<Pending>,
    /// End of the last work an executor committed on `qp`, until its doorbell was seen.
    pub(super) exec_end: Option<u64>,
    /// Requests an executor waits for (send side, receive side) not yet known to be done: the
    /// CPU does not poll a CQ an executor is consuming.
    pub(super) exec_waits: [usize; 2],
    /// Why the connection failed, once known (the log says so once).
    pub(super) fault: Option<Cause>,
}

impl Peer {
    /// A peer reached through `qp` (with its send and receive CQs) and the credit QP `ctl`,
    /// before any work.
    pub(super) fn new(qp: Qp, scq: Cq, rcq: Cq, ctl: Qp, ctl_cq: Cq) -> Peer {
        Peer {
            qp,
            scq,
            rcq,
            ctl,
            ctl_cq,
            sends: 0,
            recvs: 0,
            ctl_posted: 0,
            pending: VecDeque::new(),
            exec_end: None,
            exec_waits: [0; 2],
            fault: None,
        }
    }

    /// Records `cause` of this connection's failure (see [`fault::record`]); the log says
    /// so the first time.
    pub(super) fn note(&mut self, me: usize, peer: usize, cause: Cause) {
        let first = self.fault.is_none();
        if fault::record(&mut self.fault, cause) && first {
            tracing::warn!(
                "rank {me}: the connection to rank {peer} failed: {} (traffic QP {:#x} {:?}, credit QP {:#x} {:?}); work with rank {peer} fails from now on",
                cause.describe(peer),
                self.qp.qpn(),
                self.qp.state(),
                self.ctl.qpn(),
                self.ctl.state()
            );
        }
    }

    /// Whether one of the QPs to this peer is in the error state.
    pub(super) fn in_error(&self) -> bool {
        self.qp.state() == QpState::Error || self.ctl.state() == QpState::Error
    }

    /// Consumes the credit QP's completions (signalled credit writes; an error is the
    /// connection's fault, which every later wait for this peer, rank `peer`, reports).
    pub(super) fn drain_credit_cq(&mut self, me: usize, peer: usize) {
        while let Ok(Some(c)) = self.ctl_cq.poll_one() {
            if let WcStatus::Error(syndrome) = c.status {
                let cause = Cause::Completion {
                    syndrome,
                    work: Work::Internal,
                    qpn: c.qpn,
                };
                self.note(me, peer, cause);
            }
        }
    }
}

/// The peers of rank `me`, by rank (every other rank of the communicator).
pub(super) struct Peers {
    me: usize,
    by_rank: Vec<Option<Peer>>,
}

impl Peers {
    /// The table of rank `me`: `by_rank` holds a peer for every rank but `me`.
    pub(super) fn new(me: usize, by_rank: Vec<Option<Peer>>) -> Peers {
        debug_assert!(by_rank
            .iter()
            .enumerate()
            .all(|(r, p)| p.is_some() == (r != me)));
        Peers { me, by_rank }
    }

    /// Rank `rank`, or an error naming it when it is no peer of this rank.
    pub(super) fn get(&self, rank: usize) -> Result<&Peer> {
        match self.by_rank.get(rank) {
            Some(Some(p)) => Ok(p),
            _ => Err(not_a_peer(rank, self.me, self.by_rank.len())),
        }
    }

    /// [`get`](Self::get), to change.
    pub(super) fn get_mut(&mut self, rank: usize) -> Result<&mut Peer> {
        let (me, size) = (self.me, self.by_rank.len());
        match self.by_rank.get_mut(rank) {
            Some(Some(p)) => Ok(p),
            _ => Err(not_a_peer(rank, me, size)),
        }
    }

    /// Rank `rank` if it is a peer (for loops over ranks that may include this one).
    pub(super) fn find(&self, rank: usize) -> Option<&Peer> {
        self.by_rank.get(rank).and_then(Option::as_ref)
    }

    /// [`find`](Self::find), to change.
    pub(super) fn find_mut(&mut self, rank: usize) -> Option<&mut Peer> {
        self.by_rank.get_mut(rank).and_then(Option::as_mut)
    }

    /// Per rank, the endpoints of the traffic and credit QPs to it (`None` for this rank):
    /// what the connection record carries.
    pub(super) fn endpoints(&self) -> Vec<Option<Vec<Endpoint>>> {
        let eps = |p: &Peer| vec![p.qp.endpoint(), p.ctl.endpoint()];
        self.by_rank.iter().map(|p| p.as_ref().map(eps)).collect()
    }
}

/// The error for `rank`, which is no peer of rank `me` of `size`: it names the rank and the
/// peers there are.
#[cold]
fn not_a_peer(rank: usize, me: usize, size: usize) -> Error {
    let peers = if size <= 9 {
        let list: Vec<String> = (0..size)
            .filter(|&r| r != me)
            .map(|r| r.to_string())
            .collect();
        format!("ranks {}", list.join(", "))
    } else {
        format!("ranks 0 to {} but {me}", size - 1)
    };
    let what = if rank == me {
        "is this rank"
    } else {
        "is out of range"
    };
    Error::invalid(format!(
        "rank {rank} is not a peer of this communicator ({what}; rank {me} of {size}, whose peers are {peers}): name another rank"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of rank `me` of `size` (its peers need no device: the lookups that fail
    /// never reach them).
    fn table(me: usize, size: usize) -> Peers {
        Peers {
            me,
            by_rank: (0..size).map(|_| None).collect(),
        }
    }

    #[test]
    fn a_rank_that_is_no_peer_is_named_with_the_peers() {
        let t = table(0, 3);
        let msg = t.get(5).err().unwrap().to_string();
        assert!(msg.contains("rank 5 is not a peer"), "{msg}");
        assert!(msg.contains("out of range"), "{msg}");
        assert!(msg.contains("peers are ranks 1, 2"), "{msg}");
        let msg = table(1, 3).get(1).err().unwrap().to_string();
        assert!(msg.contains("rank 1 is not a peer"), "{msg}");
        assert!(msg.contains("is this rank"), "{msg}");
        assert!(msg.contains("peers are ranks 0, 2"), "{msg}");
        let msg = table(4, 64).get(64).err().unwrap().to_string();
        assert!(msg.contains("peers are ranks 0 to 63 but 4"), "{msg}");
        assert!(table(0, 2).find(0).is_none() && table(0, 2).find(7).is_none());
    }
}
