//! Leaving together, and what every wait asks when its queues cannot tell it: which peer
//! failed, why, and the one-line report of a connection.

use super::Comm;
use crate::fault::Cause;
use gdsync::{Error, Result};

impl Comm {
    /// Leaves together: a bootstrap barrier, so no rank tears its connections down while a
    /// peer may still write to them (credits, barrier words). Dropping without it is allowed;
    /// peers then see their work to this rank fail with an [`Error::Unreachable`] that names
    /// the rank (their QPs' completions say TRANSPORT_RETRY_EXC). A peer already known to
    /// have died or left ends it at once with such an error.
    pub fn finalize(mut self) -> Result<()> {
        self.progress()?;
        if let Some(gone) = self.failed_peer(0..self.size) {
            let cause = self.peers.find(gone).and_then(|p| p.fault);
            if cause.is_some_and(Cause::peer_gone) {
                return Err(self.connection_error(gone, "finalize"));
            }
        }
        self.boot.barrier()
    }

    /// The one check every wait makes for what its queues cannot tell it: the first of
    /// `peers` whose connection failed (an error completion of any work with it, internal
    /// writes included; a QP to it in the error state; the bootstrap saying it left). The
    /// cause is kept for [`connection_error`](Self::connection_error).
    pub(crate) fn failed_peer(&mut self, peers: impl IntoIterator<Item = usize>) -> Option<usize> {
        let departed = self.boot.departed();
        let me = self.rank;
        for peer in peers {
            let Some(p) = self.peers.find_mut(peer) else {
                continue;
            };
            if departed.contains(&peer) {
                p.note(me, peer, Cause::Departed);
            }
            if p.fault.is_none() && p.in_error() {
                // The error completion that says why may be waiting in a CQ.
                p.drain_credit_cq(me, peer);
                let _ = self.poll_peer(peer);
                if let Some(p) = self.peers.find_mut(peer) {
                    if p.fault.is_none() {
                        p.note(me, peer, Cause::QpError);
                    }
                }
            }
            if self.peers.find(peer).is_some_and(|p| p.fault.is_some()) {
                return Some(peer);
            }
        }
        None
    }

    /// The error of `what` (one clause: "the 64-byte receive from rank 1", "finalize") failing
    /// because the connection to rank `peer` failed, with the cause kept for it.
    pub(crate) fn connection_error(&self, peer: usize, what: &str) -> Error {
        let cause = self.peers.find(peer).and_then(|p| p.fault).map_or_else(
            || format!("the connection to rank {peer} failed"),
            |c| c.describe(peer),
        );
        Error::Unreachable(format!("rank {}: {what} failed: {cause}", self.rank))
    }

    /// One line on the connection to rank `peer`, for error reports: credits, posts, and
    /// the state of its queues (a request that never completes is usually explained here,
    /// or by the peer's line about this rank).
    pub fn describe_peer(&self, peer: usize) -> String {
        let Some(p) = self.peers.find(peer) else {
            return format!("rank {peer}: no connection");
        };
        format!(
            "rank {peer}: credits from it {} (word at {:#x}), sends to it {}, receives posted for it {}, credits given by the CPU {}, CPU posts queued {}, executor waits (send, receive) {:?}; traffic {}; send {}; receive {}",
            self.credit(peer),
            self.ctrl.addr() + self.layout.ready(peer) as u64,
            p.sends,
            p.recvs,
            p.ctl_posted,
            p.pending.len(),
            p.exec_waits,
            p.qp.describe(),
            p.scq.describe(),
            p.rcq.describe(),
        )
    }
}
