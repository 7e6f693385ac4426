//! A batch of sends rung with one doorbell: [`Qp::send_batch`] borrows the QP, each
//! [`SendBatch::push`] writes a WQE into the send ring, and [`SendBatch::ring`] (on this
//! thread) or [`SendBatch::ops`] (for an executor) exposes them all at once. A batch dropped
//! unrung takes its WQEs back: nothing was exposed, so the next send reuses their slots.

use super::doorbell::ring_ops;
use super::post::SendTicket;
use super::Qp;
use crate::ops::Ops;
use crate::wr::SendWr;
use crate::{Error, Result};
use std::sync::atomic::Ordering;

/// Sends written into a QP's send ring and not yet exposed: ring them once
/// ([`ring`](Self::ring) or [`ops`](Self::ops)), or drop the batch to take them back.
#[must_use = "a batch exposes nothing until it is rung; dropped, it takes its sends back"]
pub struct SendBatch<'a> {
    qp: &'a mut Qp,
    /// The producer counter before the first push (where a drop rolls back to).
    start: u64,
    /// The first 8 bytes of the last WQE pushed (what the doorbell register gets).
    head: Option<[u8; 8]>,
    /// Completion numbers reserved by the pushes (given back by a drop).
    reserved: u64,
}

impl Qp {
    /// A batch of sends on this QP, rung with one doorbell. It borrows the QP: nothing else
    /// posts until it is rung or dropped.
    pub fn send_batch(&mut self) -> SendBatch<'_> {
        let start = self.sq_pi;
        SendBatch {
            qp: self,
            start,
            head: None,
            reserved: 0,
        }
    }
}

impl SendBatch<'_> {
    /// Writes `wr`'s WQE into the send ring (not yet visible to the device) and returns its
    /// ticket. Refused while prepared sends wait for their commit ([`Qp::prepare_send`]):
    /// the batch's doorbell would expose them.
    pub fn push(&mut self, wr: &SendWr) -> Result<SendTicket> {
        if !self.qp.no_prepared_waiting() {
            return Err(Error::invalid(format!(
                "QP {}: prepared sends wait for their commit; a batch rung now would expose them. Commit them first",
                self.qp.shared.qpn
            )));
        }
        let w = self.qp.write_send(wr)?;
        self.reserved += u64::from(w.ticket.cqe.is_some());
        self.head = Some(w.head);
        Ok(w.ticket)
    }

    /// How many WQE blocks (WQEBBs) the pushed sends fill.
    pub fn wqebbs(&self) -> u64 {
        self.qp.sq_pi - self.start
    }

    /// Rings the doorbell once on this thread, for every send pushed (none: nothing).
    /// Refused, as [`Qp::post_send`] is, while sends committed for an executor are not rung
    /// yet; the batch's sends are then taken back.
    pub fn ring(mut self) -> Result<()> {
        let Some(head) = self.head else {
            return Ok(());
        };
        self.qp.refuse_unrung_commits()?;
        let end = self.qp.sq_pi;
        self.qp.committed = end;
        self.qp.ring_doorbell(end, head);
        self.head = None;
        Ok(())
    }

    /// The op list that rings the doorbell once for every send pushed (empty for none), for
    /// an executor: as [`Qp::commit`]'s, it must run in commit order.
    pub fn ops(mut self) -> Ops {
        let Some(head) = self.head.take() else {
            return Ops::new();
        };
        let end = self.qp.sq_pi;
        self.qp.committed = end;
        ring_ops(&self.qp.shared, end, head)
    }
}

impl Drop for SendBatch<'_> {
    fn drop(&mut self) {
        if self.head.is_some() {
            // Unrung: the device never saw these WQEs (the doorbell record stops short of
            // them), so their slots and completion numbers are free again.
            self.qp.sq_pi = self.start;
            let cq = &self.qp.shared.send_cq;
            cq.reserved.fetch_sub(self.reserved, Ordering::AcqRel);
        }
    }
}
