//! The packets the engine makes from others: a message's packet headers, the header of a
//! response, and NAKs. Used by the requester, the responder, single-copy delivery and the
//! links alike.

use super::super::wire::{flag, kind, resp, PktHeader};
use super::{Body, QueuedMessage};

/// The header of the packet of message `hdr` (`total` payload bytes) that carries `seg`
/// bytes from byte `sent` on.
#[inline]
pub(super) fn packet_header(hdr: &PktHeader, sent: u32, seg: u32, total: u32) -> PktHeader {
    let mut h = *hdr;
    h.offset = sent;
    h.seg_len = seg;
    if sent == 0 {
        h.flags |= flag::FIRST;
    }
    if sent + seg == total {
        h.flags |= flag::LAST;
    }
    h
}

/// The header of a response to request `h`.
pub(super) fn reply(h: &PktHeader, op: u8) -> PktHeader {
    PktHeader {
        kind: kind::RESP,
        op,
        dst_qpn: h.src_qpn,
        src_qpn: h.dst_qpn,
        psn: h.psn,
        ..Default::default()
    }
}

/// A NAK of request (or read response) `h` with `code`.
pub(super) fn nak(h: &PktHeader, code: u8) -> QueuedMessage {
    let mut r = reply(h, resp::NAK);
    if h.kind == kind::RESP {
        // Turning a read response into a NAK: it keeps the requester's addressing.
        r = PktHeader {
            kind: kind::RESP,
            op: resp::NAK,
            dst_qpn: h.dst_qpn,
            src_qpn: h.src_qpn,
            psn: h.psn,
            ..Default::default()
        };
    }
    r.syndrome = code;
    QueuedMessage {
        hdr: r,
        body: Body::Empty,
        pd: 0,
        sent: 0,
    }
}
