//! The 64-byte CQE (`mlx5_cqe64`), its error view (`mlx5_err_cqe`) and the owner-bit rule.

use super::{Be16, Be32, Be64, CqeOpcode, Syndrome};

/// Size of a CQE in bytes (64-byte CQEs; 128-byte ones are not used).
pub const CQE_SIZE: usize = 64;
/// The `op_own` value every CQE is initialised to: opcode INVALID, owner 1. The INVALID
/// opcode rejects stale entries for a CPU poll; owner 1 makes an owner-bit-only wait (all a
/// stream wait can do) block until the first pass writes owner 0.
pub const CQE_INIT_OP_OWN: u8 = 0xF1;
/// Offset of the 32-bit word `wqe_counter | signature | op_own` that waits watch.
pub const CQE_OWNER_WORD_OFFSET: usize = 60;
/// Offset of the immediate data (4 bytes, as sent).
pub const CQE_IMM_OFFSET: usize = 36;
/// Offset of `byte_cnt` (BE32).
pub const CQE_BYTE_CNT_OFFSET: usize = 44;
/// Offset of the vendor syndrome byte of an error CQE.
pub const CQE_VENDOR_SYNDROME_OFFSET: usize = 54;
/// Offset of the syndrome byte of an error CQE.
pub const CQE_SYNDROME_OFFSET: usize = 55;
/// Offset of `sop_drop_qpn` (BE32: WQE opcode in 31:24, QPN in 23:0).
pub const CQE_SOP_DROP_QPN_OFFSET: usize = 56;
/// Offset of `wqe_counter` (BE16).
pub const CQE_WQE_COUNTER_OFFSET: usize = 60;
/// Offset of `op_own`: opcode (7:4), format (3:2), SE (1), owner (0).
pub const CQE_OP_OWN_OFFSET: usize = 63;
/// The owner bit of `op_own`.
pub const CQE_OWNER_MASK: u8 = 0x01;

/// The owner-bit rule: which owner value marks CQE number `n` (free-running) as new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqeOwner;

impl CqeOwner {
    /// The owner bit the HCA writes for CQE number `n` in a ring of `cqe_cnt` entries: the
    /// parity of the pass, `(n / cqe_cnt) & 1`.
    pub const fn expected(n: u64, cqe_cnt: u32) -> u8 {
        ((n & cqe_cnt as u64) != 0) as u8
    }
    /// Whether the entry with `op_own` holds a new CQE for consumer index `n`.
    pub const fn is_new(op_own: u8, n: u64, cqe_cnt: u32) -> bool {
        (op_own >> 4) != 0xF && (op_own & 1) == Self::expected(n, cqe_cnt)
    }
    /// The (condition, value) of a 32-bit wait on the word at offset 60, read little-endian,
    /// that passes once CQE `n` is written: AND 0x01000000 when the owner bit must be 1, NOR
    /// 0xFEFFFFFF (bit 24 clear) when it must be 0. Looks at the owner bit only, so an error
    /// CQE releases the wait as well.
    pub const fn wait_word(n: u64, cqe_cnt: u32) -> (crate::ops::WaitCond, u32) {
        if Self::expected(n, cqe_cnt) == 1 {
            (crate::ops::WaitCond::And, 0x0100_0000)
        } else {
            (crate::ops::WaitCond::Nor, 0xFEFF_FFFF)
        }
    }
}

/// A 64-byte CQE as it lies in the ring, with typed accessors for both the normal and the
/// error layout.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cqe64(pub [u8; 64]);
const _: () = assert!(core::mem::size_of::<Cqe64>() == CQE_SIZE);

impl Default for Cqe64 {
    fn default() -> Self {
        let mut b = [0u8; 64];
        b[63] = CQE_INIT_OP_OWN;
        Self(b)
    }
}

impl core::fmt::Debug for Cqe64 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut d = f.debug_struct("Cqe64");
        d.field("opcode", &self.opcode())
            .field("owner", &self.owner());
        if self.is_error() {
            d.field("syndrome", &self.syndrome())
                .field("vendor", &self.vendor_syndrome());
        }
        d.field("qpn", &self.qpn())
            .field("wqe_counter", &self.wqe_counter())
            .field("byte_cnt", &self.byte_cnt())
            .finish()
    }
}

macro_rules! be_field {
    ($get:ident, $set:ident, $t:ident, $int:ty, $off:expr, $doc:expr) => {
        #[doc = $doc]
        pub fn $get(&self) -> $int {
            $t(self.0[$off..$off + core::mem::size_of::<$int>()]
                .try_into()
                .unwrap())
            .get()
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: $int) {
            self.0[$off..$off + core::mem::size_of::<$int>()].copy_from_slice(&$t::new(v).bytes());
        }
    };
}

impl Cqe64 {
    be_field!(
        flags_rqpn,
        set_flags_rqpn,
        Be32,
        u32,
        24,
        "flags_rqpn (24): remote QPN in bits 23:0."
    );
    be_field!(
        srqn_uidx,
        set_srqn_uidx,
        Be32,
        u32,
        32,
        "srqn_uidx (32): user index or SRQ number."
    );
    be_field!(
        byte_cnt,
        set_byte_cnt,
        Be32,
        u32,
        CQE_BYTE_CNT_OFFSET,
        "byte_cnt (44): bytes received (responder) or read (requester)."
    );
    be_field!(timestamp, set_timestamp, Be64, u64, 48, "timestamp (48).");
    be_field!(
        sop_drop_qpn,
        set_sop_drop_qpn,
        Be32,
        u32,
        CQE_SOP_DROP_QPN_OFFSET,
        "sop_drop_qpn (56): QPN in 23:0; requester: WQE opcode in 31:24."
    );
    be_field!(
        wqe_counter,
        set_wqe_counter,
        Be16,
        u16,
        CQE_WQE_COUNTER_OFFSET,
        "wqe_counter (60): SQ wqe_index (requester) or RQ index (responder)."
    );

    /// Immediate data (offset 36) exactly as sent.
    pub fn imm(&self) -> [u8; 4] {
        self.0[CQE_IMM_OFFSET..CQE_IMM_OFFSET + 4]
            .try_into()
            .unwrap()
    }
    /// Sets the immediate data.
    pub fn set_imm(&mut self, imm: [u8; 4]) {
        self.0[CQE_IMM_OFFSET..CQE_IMM_OFFSET + 4].copy_from_slice(&imm);
    }
    /// `op_own`: opcode (7:4), format (3:2), SE (1), owner (0).
    pub const fn op_own(&self) -> u8 {
        self.0[CQE_OP_OWN_OFFSET]
    }
    /// Sets `op_own`.
    pub fn set_op_own(&mut self, opcode: CqeOpcode, solicited: bool, owner: u8) {
        self.0[CQE_OP_OWN_OFFSET] =
            ((opcode as u8) << 4) | ((solicited as u8) << 1) | (owner & CQE_OWNER_MASK);
    }
    /// The CQE opcode, `None` for values this model does not know.
    pub const fn opcode(&self) -> Option<CqeOpcode> {
        CqeOpcode::from_u8(self.op_own() >> 4)
    }
    /// The owner bit.
    pub const fn owner(&self) -> u8 {
        self.op_own() & CQE_OWNER_MASK
    }
    /// The solicited-event bit.
    pub const fn solicited(&self) -> bool {
        self.op_own() & 2 != 0
    }
    /// Whether this is an error CQE.
    pub const fn is_error(&self) -> bool {
        matches!(self.opcode(), Some(CqeOpcode::ReqErr | CqeOpcode::RespErr))
    }
    /// QP number (bits 23:0 of `sop_drop_qpn`; same place in the error layout).
    pub fn qpn(&self) -> u32 {
        self.sop_drop_qpn() & 0xFF_FFFF
    }
    /// Requester CQEs: the send opcode of the completed WQE (bits 31:24 of `sop_drop_qpn`).
    pub fn wqe_opcode(&self) -> u8 {
        (self.sop_drop_qpn() >> 24) as u8
    }
    /// Error CQE: the syndrome byte (55).
    pub const fn syndrome_byte(&self) -> u8 {
        self.0[CQE_SYNDROME_OFFSET]
    }
    /// Error CQE: the decoded syndrome.
    pub const fn syndrome(&self) -> Option<Syndrome> {
        Syndrome::from_u8(self.0[CQE_SYNDROME_OFFSET])
    }
    /// Error CQE: the vendor syndrome (54).
    pub const fn vendor_syndrome(&self) -> u8 {
        self.0[CQE_VENDOR_SYNDROME_OFFSET]
    }
    /// Error CQE: sets syndrome and vendor syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome, vendor: u8) {
        self.0[CQE_VENDOR_SYNDROME_OFFSET] = vendor;
        self.0[CQE_SYNDROME_OFFSET] = s as u8;
    }
    /// The 32-bit word at offset 60 as a little-endian load sees it (what a wait compares).
    pub fn owner_word(&self) -> u32 {
        u32::from_le_bytes(self.0[60..64].try_into().unwrap())
    }
}
