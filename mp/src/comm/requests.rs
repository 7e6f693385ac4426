//! Request slots: the handle users hold, what each outstanding request is and where its work
//! sits, and the table that hands slots out and takes them back (a generation makes a stale
//! handle fail instead of naming a newer request).

use super::Comm;
use crate::fault::Work;
use gdsync::{Error, RecvTicket, Result, SendTicket};

/// A handle to an outstanding operation (send, receive, put, get).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub(super) slot: u32,
    pub(super) generation: u32,
}

impl Request {
    pub(crate) fn wr_id(self) -> u64 {
        ((self.generation as u64) << 32) | self.slot as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Pending,
    Done(u32),
    Failed(gdsync::format::Syndrome),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    Send,
    Recv,
}

/// A posted request's place in its ring.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ticket {
    Send(SendTicket),
    Recv(RecvTicket),
}

pub(super) struct ReqState {
    pub(super) generation: u32,
    pub(super) live: bool,
    pub(super) peer: usize,
    pub(super) side: Side,
    /// What it is, for error messages.
    pub(super) work: Work,
    /// Where the work sits in its ring and which completion it gives, once posted.
    pub(super) ticket: Option<Ticket>,
    /// An executor waits for (and consumes) its completion.
    pub(super) on_executor: bool,
    pub(super) status: Status,
    /// A staged GPU payload's bounce and bytes.
    pub(super) stage: Option<crate::staged::StageRec>,
}

impl ReqState {
    /// Completion number on the peer's CQ of this side, when known.
    pub(super) fn cqe(&self) -> Option<u64> {
        match self.ticket? {
            Ticket::Send(t) => t.cqe,
            Ticket::Recv(t) => t.cqe,
        }
    }
}

impl Comm {
    /// A new request of `work` with rank `peer`, in a free slot (or a new one).
    pub(super) fn new_req(&mut self, peer: usize, work: Work) -> Request {
        let side = match work {
            Work::Recv(_) => Side::Recv,
            _ => Side::Send,
        };
        let fresh = |generation| ReqState {
            generation,
            live: true,
            peer,
            side,
            work,
            ticket: None,
            on_executor: false,
            status: Status::Pending,
            stage: None,
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                // Generation 0: the first request in the slot is generation 1, as in any
                // slot taken again.
                self.reqs.push(fresh(0));
                (self.reqs.len() - 1) as u32
            }
        };
        let r = &mut self.reqs[slot as usize];
        *r = fresh(r.generation.wrapping_add(1));
        Request {
            slot,
            generation: r.generation,
        }
    }

    /// The state of `r`; an error if it is unknown or already released.
    pub(super) fn state(&mut self, r: Request) -> Result<&mut ReqState> {
        match self.reqs.get_mut(r.slot as usize) {
            Some(s) if s.live && s.generation == r.generation => Ok(s),
            _ => Err(Error::invalid(
                "unknown request, or one already completed (wait and test release a request once they return its result)",
            )),
        }
    }

    /// Frees `r`'s slot (nothing if it is no longer live).
    pub(super) fn release(&mut self, r: Request) {
        if let Ok(st) = self.state(r) {
            st.live = false;
            self.free.push(r.slot);
        }
    }
}
