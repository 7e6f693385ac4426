//! Send opcodes (ctrl segment, low byte of word 0), CQE opcodes (`op_own >> 4`) and error
//! syndromes (error CQE byte 55), and what a completion reports it completed.

macro_rules! byte_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr,)* }) => {
        $(#[$m])*
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v = $n,)* }
        impl $name {
            /// Decodes the byte, `None` for values this model does not know.
            pub const fn from_u8(b: u8) -> Option<Self> {
                match b { $($n => Some(Self::$v),)* _ => None }
            }
        }
        impl From<$name> for u8 {
            fn from(v: $name) -> u8 { v as u8 }
        }
    };
}

byte_enum! {
    /// Send WQE opcode.
    Opcode {
        /// No operation; completes locally.
        Nop = 0x00,
        /// SEND with invalidate (not served by the soft device).
        SendInval = 0x01,
        /// RDMA write.
        RdmaWrite = 0x08,
        /// RDMA write with immediate (consumes a receive at the responder).
        RdmaWriteImm = 0x09,
        /// Send.
        Send = 0x0A,
        /// Send with immediate.
        SendImm = 0x0B,
        /// RDMA read.
        RdmaRead = 0x10,
        /// 8-byte compare and swap.
        AtomicCs = 0x11,
        /// 8-byte fetch and add.
        AtomicFa = 0x12,
        /// Masked compare and swap (not served by the soft device).
        AtomicMaskedCs = 0x14,
        /// Masked fetch and add (not served by the soft device).
        AtomicMaskedFa = 0x15,
        /// Local invalidate (not served by the soft device).
        LocalInval = 0x1B,
        /// User-mode memory registration (not served by the soft device).
        Umr = 0x25,
    }
}

byte_enum! {
    /// CQE opcode, the high nibble of `op_own`.
    CqeOpcode {
        /// Requester completion.
        Req = 0x0,
        /// Responder: RDMA write with immediate.
        RespWrImm = 0x1,
        /// Responder: send.
        RespSend = 0x2,
        /// Responder: send with immediate.
        RespSendImm = 0x3,
        /// Responder: send with invalidate.
        RespSendInv = 0x4,
        /// CQ resize.
        ResizeCq = 0x5,
        /// No packet (tag matching, striding RQ).
        NoPacket = 0x6,
        /// Signature error.
        SigErr = 0xC,
        /// Requester error.
        ReqErr = 0xD,
        /// Responder error.
        RespErr = 0xE,
        /// Never written by the HCA; used to initialise the ring.
        Invalid = 0xF,
    }
}

byte_enum! {
    /// Error-CQE syndrome (byte 55), with the `ibv_wc_status` rdma-core maps it to.
    Syndrome {
        /// LOC_LEN_ERR: message longer than the receive buffer, or a malformed length.
        LocalLength = 0x01,
        /// LOC_QP_OP_ERR: malformed WQE (bad opcode, ds 0, ring overrun...).
        LocalQpOp = 0x02,
        /// LOC_PROT_ERR: a local key, bound or access right is wrong.
        LocalProt = 0x04,
        /// WR_FLUSH_ERR: the QP was in error; the work was not executed.
        WrFlush = 0x05,
        /// MW_BIND_ERR.
        MwBind = 0x06,
        /// BAD_RESP_ERR.
        BadResp = 0x10,
        /// LOC_ACCESS_ERR.
        LocalAccess = 0x11,
        /// REM_INV_REQ_ERR: the responder rejected the request (e.g. too long for its receive).
        RemoteInvalReq = 0x12,
        /// REM_ACCESS_ERR: bad rkey, out of bounds, or missing remote access right.
        RemoteAccess = 0x13,
        /// REM_OP_ERR: the responder could not complete the operation.
        RemoteOp = 0x14,
        /// RETRY_EXC_ERR: the peer stopped answering (dead process, closed link).
        TransportRetryExc = 0x15,
        /// RNR_RETRY_EXC_ERR: the responder had no receive posted, retries exhausted.
        RnrRetryExc = 0x16,
        /// REM_ABORT_ERR.
        RemoteAborted = 0x22,
    }
}

impl Opcode {
    /// Whether the soft device executes this opcode.
    pub const fn is_supported(self) -> bool {
        matches!(
            self,
            Self::Nop
                | Self::RdmaWrite
                | Self::RdmaWriteImm
                | Self::Send
                | Self::SendImm
                | Self::RdmaRead
                | Self::AtomicCs
                | Self::AtomicFa
        )
    }
    /// Whether the WQE carries a remote-address segment.
    pub const fn has_raddr(self) -> bool {
        matches!(
            self,
            Self::RdmaWrite | Self::RdmaWriteImm | Self::RdmaRead | Self::AtomicCs | Self::AtomicFa
        )
    }
    /// Whether the WQE carries an atomic segment.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicCs | Self::AtomicFa)
    }
    /// Whether the operation consumes a receive WQE at the responder.
    pub const fn consumes_recv(self) -> bool {
        matches!(self, Self::Send | Self::SendImm | Self::RdmaWriteImm)
    }
    /// Whether the operation carries immediate data in the ctrl segment.
    pub const fn has_imm(self) -> bool {
        matches!(self, Self::SendImm | Self::RdmaWriteImm)
    }
    /// Whether the responder reads its memory through the rkey (RDMA read).
    pub const fn reads_remote(self) -> bool {
        matches!(self, Self::RdmaRead)
    }
    /// Whether the payload lands in the responder's memory through the rkey (RDMA write).
    pub const fn writes_remote(self) -> bool {
        matches!(self, Self::RdmaWrite | Self::RdmaWriteImm)
    }
    /// Whether the answer carries data into the requester's memory (read data, an atomic's
    /// old value): the data segments are a scatter list, the WQE cannot be inline, it
    /// completes when that data has arrived, and a fence waits for it.
    pub const fn returns_data(self) -> bool {
        matches!(self, Self::RdmaRead | Self::AtomicCs | Self::AtomicFa)
    }
    /// Whether the requester sends a payload of its own (sends and writes): its data
    /// segments are a gather list, or the payload is inline.
    pub const fn carries_payload(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendImm | Self::SendInval | Self::RdmaWrite | Self::RdmaWriteImm
        )
    }
    /// What a requester completion of this opcode reports (opcodes a host does not post
    /// complete as [`CompletionOp::Nop`]).
    pub const fn completion_op(self) -> CompletionOp {
        match self {
            Self::Send | Self::SendImm => CompletionOp::Send,
            Self::RdmaWrite | Self::RdmaWriteImm => CompletionOp::Write,
            Self::RdmaRead => CompletionOp::Read,
            Self::AtomicCs => CompletionOp::CompareSwap,
            Self::AtomicFa => CompletionOp::FetchAdd,
            _ => CompletionOp::Nop,
        }
    }
    /// The CQE opcode of the responder's completion, for operations that consume a receive.
    pub const fn responder_cqe(self) -> Option<CqeOpcode> {
        match self {
            Self::Send => Some(CqeOpcode::RespSend),
            Self::SendImm => Some(CqeOpcode::RespSendImm),
            Self::RdmaWriteImm => Some(CqeOpcode::RespWrImm),
            _ => None,
        }
    }
}

impl CqeOpcode {
    /// Whether this is an error CQE (requester or responder).
    pub const fn is_error(self) -> bool {
        matches!(self, Self::ReqErr | Self::RespErr)
    }
}

/// What a completion completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionOp {
    /// Send or send with immediate (requester).
    Send,
    /// RDMA write (requester).
    Write,
    /// RDMA read (requester).
    Read,
    /// Compare and swap (requester).
    CompareSwap,
    /// Fetch and add (requester).
    FetchAdd,
    /// No-op (requester).
    Nop,
    /// A send arrived (responder).
    Recv,
    /// An RDMA write with immediate arrived (responder).
    RecvWriteImm,
}
