//! Why the connection to a peer failed: the first cause a rank learns (an error completion of
//! any of its work with that peer, internal barrier and credit writes included; its queue
//! pairs found in the error state; the peer leaving the job), kept per peer so that every
//! later wait reports what happened instead of guessing.

use gdsync::format::Syndrome;
use gdsync::Error;

/// A piece of work with a peer, as messages name it (lengths in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    Send(u64),
    Recv(u64),
    Put(u64),
    Get(u64),
    /// A barrier or credit write of the communicator itself.
    Internal,
}

impl Work {
    /// "the 4096-byte send to rank 1".
    pub(crate) fn describe(self, peer: usize) -> String {
        match self {
            Work::Send(n) => format!("the {n}-byte send to rank {peer}"),
            Work::Recv(n) => format!("the {n}-byte receive from rank {peer}"),
            Work::Put(n) => format!("the {n}-byte put to rank {peer}"),
            Work::Get(n) => format!("the {n}-byte get from rank {peer}"),
            Work::Internal => format!("a barrier or credit write to rank {peer}"),
        }
    }
}

/// What made the connection to a peer fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// An error completion of work with the peer, on the QP numbered `qpn`.
    Completion {
        syndrome: Syndrome,
        work: Work,
        qpn: u32,
    },
    /// A QP to the peer is in the error state, and no error completion said why here (the
    /// soft device fails the QPs of a link whose far process died or closed it).
    QpError,
    /// The bootstrap says the peer left the job.
    Departed,
}

impl Cause {
    /// Says less than an error completion learnt later would (a flush, a silent error state).
    fn vague(self) -> bool {
        matches!(
            self,
            Cause::QpError
                | Cause::Completion {
                    syndrome: Syndrome::WrFlush,
                    ..
                }
        )
    }

    /// The peer is gone (died, left, or stopped answering), as opposed to a fault of the work
    /// itself (a message too long for its receive, an access outside a window).
    pub(crate) fn peer_gone(self) -> bool {
        match self {
            Cause::QpError | Cause::Departed => true,
            Cause::Completion { syndrome, .. } => matches!(
                syndrome,
                Syndrome::TransportRetryExc | Syndrome::WrFlush | Syndrome::RemoteAborted
            ),
        }
    }

    /// One clause: what happened with rank `peer`, and what to do.
    pub(crate) fn describe(self, peer: usize) -> String {
        let lost = format!("the connection to rank {peer} is lost");
        let Cause::Completion {
            syndrome,
            work,
            qpn,
        } = self
        else {
            return match self {
                Cause::Departed => format!(
                    "rank {peer} left the job (it dropped its communicator, or its process ended): {lost}"
                ),
                _ => format!(
                    "{lost} (its queue pairs went to the error state with no error completion here: rank {peer}'s process died, or it dropped its communicator)"
                ),
            };
        };
        let what = work.describe(peer);
        // The request that failed is named by the caller; internal work is named here.
        let on = match work {
            Work::Internal => format!(" on {what}"),
            _ => String::new(),
        };
        match (syndrome, work) {
            (Syndrome::TransportRetryExc, _) => format!(
                "rank {peer} stopped answering (transport retries exceeded{on}, IBV_WC_RETRY_EXC_ERR): {lost} (its process died, it dropped its communicator, or it stopped answering for the QP timeout)"
            ),
            (Syndrome::WrFlush, _) => format!(
                "work was flushed{on} (IBV_WC_WR_FLUSH_ERR): {lost} (its queue pair was already in the error state; the completion that said why was consumed by an executor)"
            ),
            (Syndrome::LocalLength, Work::Recv(n)) => format!(
                "a message from rank {peer} was longer than the {n}-byte receive posted for it (a local length error, IBV_WC_LOC_LEN_ERR): post receives as large as the largest message; the connection to rank {peer} is in the error state from now on"
            ),
            (Syndrome::RemoteInvalReq, Work::Send(n)) => format!(
                "rank {peer} refused the {n}-byte message (a remote invalid request, IBV_WC_REM_INV_REQ_ERR): its receive was most likely smaller than the message; post receives as large as the largest message; the connection to rank {peer} is in the error state from now on"
            ),
            _ => format!(
                "{what} failed: {}; the connection to rank {peer} is in the error state from now on",
                Error::Completion {
                    wr_id: u64::MAX,
                    qpn,
                    syndrome
                }
            ),
        }
    }
}

/// Keeps the first cause in `slot`, or `new` where it says more: an error completion after
/// a vague first cause, or the peer's leaving after any sign of a peer that is gone.
/// Returns whether `slot` changed.
pub(crate) fn record(slot: &mut Option<Cause>, new: Cause) -> bool {
    let says_more = match *slot {
        None => true,
        Some(old) if old == new => false,
        Some(old) => (old.vague() && !new.vague()) || (new == Cause::Departed && old.peer_gone()),
    };
    if says_more {
        *slot = Some(new);
    }
    says_more
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(syndrome: Syndrome, work: Work) -> Cause {
        Cause::Completion {
            syndrome,
            work,
            qpn: 7,
        }
    }

    #[test]
    fn the_first_cause_stays_unless_it_was_vague() {
        let length = completion(Syndrome::LocalLength, Work::Recv(16));
        let flush = completion(Syndrome::WrFlush, Work::Recv(8));
        let mut slot = None;
        assert!(record(&mut slot, Cause::QpError));
        assert!(record(&mut slot, length));
        assert!(!record(&mut slot, flush));
        assert!(!record(&mut slot, Cause::Departed));
        assert_eq!(slot, Some(length));
        let mut slot = Some(flush);
        assert!(!record(&mut slot, Cause::QpError));
        assert!(record(&mut slot, Cause::Departed));
        let mut slot = Some(completion(Syndrome::TransportRetryExc, Work::Internal));
        assert!(record(&mut slot, Cause::Departed));
        assert!(!record(&mut slot, length));
    }

    #[test]
    fn each_cause_names_the_rank_and_says_what_happened() {
        let says = |c: Cause, parts: &[&str]| {
            let m = c.describe(3);
            assert!(m.contains("rank 3"), "{m}");
            for p in parts {
                assert!(m.contains(p), "{p:?} missing from {m}");
            }
        };
        says(
            completion(Syndrome::LocalLength, Work::Recv(16)),
            &["16-byte receive", "LOC_LEN_ERR", "post receives"],
        );
        says(
            completion(Syndrome::RemoteInvalReq, Work::Send(4096)),
            &["4096-byte message", "REM_INV_REQ"],
        );
        says(
            completion(Syndrome::TransportRetryExc, Work::Internal),
            &["barrier or credit write", "is lost", "died"],
        );
        says(
            completion(Syndrome::TransportRetryExc, Work::Send(64)),
            &["stopped answering", "is lost", "died"],
        );
        says(
            completion(Syndrome::RemoteAccess, Work::Put(8)),
            &["8-byte put", "RemoteAccess"],
        );
        says(Cause::QpError, &["is lost", "died"]);
        says(Cause::Departed, &["left the job", "is lost"]);
        assert!(!completion(Syndrome::LocalLength, Work::Recv(1)).peer_gone());
        assert!(Cause::QpError.peer_gone());
    }
}
