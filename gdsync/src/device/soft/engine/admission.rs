//! Whether a responder QP takes a request: the one rule for packets that arrive on a link
//! ([`Engine::admit`](super::Engine::admit)) and for writes a peer engine of this process
//! writes straight into memory ([`super::direct_write`]). A QP takes a request only from the very
//! peer it is connected to (the link it arrives on, then the peer QP's number), while it is
//! not in error, at the PSN it expects next. The region checks (PD, rights, bounds) that
//! follow are [`remote_region`](super::responder::remote_region)'s, shared the same way.

use super::NAK_NOT_READY;
use crate::format::Syndrome;

/// What admission looks at in a responder QP's context. `P` names the peer a QP is
/// connected to: the link's index for the engine itself, a link's process-wide id
/// ([`Link::pair_id`](super::super::link::Link::pair_id)) for a peer engine writing directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpView<P> {
    /// The link to the peer, `None` before the QP is connected.
    pub peer: Option<P>,
    pub rqpn: u32,
    pub err: bool,
    pub exp_psn: u32,
}

/// Where a request comes from: the link it arrives on, the sending QP, its PSN.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin<P> {
    pub peer: P,
    pub qpn: u32,
    pub psn: u32,
}

/// The responder's decision on a request, before its opcode and memory are looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// In sequence, from the connected peer: checked further.
    Admit,
    /// Answered with a NAK of this code.
    Nak(u8),
    /// Out of sequence (a duplicate, or after a NAK until the requester resends): dropped.
    Drop,
}

/// The responder's decision on a request from `from` to the QP `qp` (`None`: no such QP).
#[inline]
pub(crate) fn admission<P: PartialEq>(qp: Option<&QpView<P>>, from: &Origin<P>) -> Admission {
    match qp {
        // A QP in error takes nothing, whether or not it still has a link (a released link's
        // QPs keep none).
        None => Admission::Nak(Syndrome::TransportRetryExc as u8),
        Some(q) if q.err => Admission::Nak(Syndrome::TransportRetryExc as u8),
        Some(q) if q.peer.is_none() => Admission::Nak(NAK_NOT_READY),
        Some(q) if q.peer.as_ref() != Some(&from.peer) || q.rqpn != from.qpn => {
            Admission::Nak(Syndrome::TransportRetryExc as u8)
        }
        Some(q) if q.exp_psn != from.psn => Admission::Drop,
        Some(_) => Admission::Admit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_connected_peer_in_sequence_is_admitted() {
        let q = QpView {
            peer: Some(2u64),
            rqpn: 1,
            err: false,
            exp_psn: 5,
        };
        let from = |peer, qpn, psn| Origin { peer, qpn, psn };
        let retry = Admission::Nak(Syndrome::TransportRetryExc as u8);
        assert_eq!(admission(Some(&q), &from(2, 1, 5)), Admission::Admit);
        assert_eq!(admission(Some(&q), &from(3, 1, 5)), retry, "another link");
        assert_eq!(admission(Some(&q), &from(2, 7, 5)), retry, "another QP");
        assert_eq!(admission(Some(&q), &from(2, 1, 4)), Admission::Drop);
        assert_eq!(admission(None, &from(2, 1, 5)), retry, "no QP");
        let failed = QpView { err: true, ..q };
        assert_eq!(admission(Some(&failed), &from(2, 1, 5)), retry);
        let unconnected = QpView { peer: None, ..q };
        assert_eq!(
            admission(Some(&unconnected), &from(2, 1, 5)),
            Admission::Nak(NAK_NOT_READY)
        );
        let failed_unlinked = QpView {
            err: true,
            ..unconnected
        };
        assert_eq!(
            admission(Some(&failed_unlinked), &from(2, 1, 5)),
            retry,
            "a QP in error whose link was released"
        );
    }
}
