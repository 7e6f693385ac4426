//! Acknowledgements owed. The ACK of a message received in full is not sent in the round that
//! delivered the message but at the end of the engine's next round: a thread that polls for
//! the data it is waiting on (and runs the engine to get it) sees the data before the engine
//! spends time on the answer, which the peer needs only to retire its WQE. ACKs are
//! cumulative, as RC's are: one owed per QP covers every message up to its PSN, so a burst of
//! messages read in one round is answered by one ACK. Any other response of the QP (a NAK,
//! read data, an atomic's old value) sends the owed ACK first, so the QP's responses stay
//! in PSN order.

use super::super::wire::{kind, PktHeader};
use super::{resp, BodyRef, Engine};

impl Engine {
    /// Records that QP `qpn` owes an ACK up to `psn`.
    pub(super) fn owe_ack(&mut self, qpn: u32, psn: u32) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        if q.rq.ack_owed.replace(psn).is_none() {
            self.owed.push(qpn);
        }
    }

    /// Sends the ACK QP `qpn` owes, if any (before another response of the QP).
    pub(super) fn pay_ack(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let (Some(psn), Some(li)) = (q.rq.ack_owed.take(), q.link) else {
            return;
        };
        let hdr = PktHeader {
            kind: kind::RESP,
            op: resp::ACK,
            dst_qpn: q.rqpn,
            src_qpn: qpn,
            psn,
            ..Default::default()
        };
        self.send(li, &hdr, BodyRef::Empty, 0);
    }

    /// Sends every owed ACK now, and what the links queued: for a thread lent to the engine
    /// that leaves after a round and may not come back for a long time (a verbs program's
    /// thread that goes on to spin on memory), while the peer waits for the ACK to retire
    /// its WQE.
    pub(crate) fn pay_acks_now(&mut self) {
        if self.pay_acks() {
            self.pump_all();
        }
    }

    /// Sends every owed ACK. Returns whether there were any.
    pub(super) fn pay_acks(&mut self) -> bool {
        if self.owed.is_empty() {
            return false;
        }
        let owed = std::mem::take(&mut self.owed);
        for &qpn in &owed {
            self.pay_ack(qpn);
        }
        // (The list's allocation is kept for the next round.)
        self.owed = owed;
        self.owed.clear();
        true
    }
}
