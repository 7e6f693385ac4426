//! The link's wire format: the 48-byte packet header every record starts with, its kinds and
//! flags, and the MTU. Both ends of a link are on one host: fields are in native byte order.

/// Bytes of payload in one packet (the soft device's MTU).
pub(crate) const MTU: usize = 64 * 1024;
/// Bytes of a packet header.
pub(crate) const HDR: usize = 48;

/// Response codes (the `op` of a response packet).
pub(crate) mod resp {
    pub const ACK: u8 = 1;
    pub const NAK: u8 = 2;
    pub const READ: u8 = 3;
    pub const ATOMIC: u8 = 4;
}

/// Packet kinds.
pub(crate) mod kind {
    pub const SKIP: u8 = 0;
    pub const REQ: u8 = 1;
    pub const RESP: u8 = 2;
}

/// Packet header: 48 bytes, native byte order (both ends are on one host); up to 16 bytes
/// of payload share its cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PktHeader {
    pub stamp: u32,
    pub kind: u8,
    /// Request: the send opcode. Response: a [`resp`] code.
    pub op: u8,
    pub flags: u8,
    pub syndrome: u8,
    pub dst_qpn: u32,
    pub src_qpn: u32,
    /// Message sequence number.
    pub psn: u32,
    pub seg_len: u32,
    pub offset: u32,
    pub msg_len: u32,
    pub imm: [u8; 4],
    pub rkey: u32,
    pub raddr: u64,
}
const _: () = assert!(std::mem::size_of::<PktHeader>() == HDR);

/// Header flags.
pub(crate) mod flag {
    pub const FIRST: u8 = 1;
    pub const LAST: u8 = 2;
    pub const SOLICITED: u8 = 4;
    /// The payload is not in the record: the record names it in the sender's registered
    /// memory (the engine's single-copy delivery, in-process links only).
    pub const BY_REF: u8 = 8;
}
