//! Send WQE segments (control, remote address, atomic, data, inline) and the receive WQE's
//! data segments. Each is a 16-byte unit ("DS"); a send WQE is a run of them, starting with
//! the control segment, stored in 64-byte basic blocks (WQEBBs).

use super::{Be32, Be64, Opcode};

/// Size of one WQE segment unit (DS), in bytes.
pub const SEG_SIZE: usize = 16;
/// Size of one WQE basic block, in bytes.
pub const WQEBB: usize = 64;
/// Largest WQE this crate writes or the soft device accepts, in WQEBBs (the kernel's
/// `MLX5_SEND_WQE_MAX_WQEBBS`).
pub const MAX_WQE_WQEBBS: usize = 16;
/// Largest ds count: the 6-bit field of the ctrl segment.
pub const MAX_WQE_DS: usize = 63;
/// Most bytes of inline payload one send WQE carries: a control segment, a remote-address
/// segment and the inline header (4 bytes) share its data segments with the payload.
pub const MAX_INLINE_DATA: usize = MAX_WQE_DS * SEG_SIZE - 2 * SEG_SIZE - 4;
/// Flag in an inline segment's byte count (`MLX5_INLINE_SEG`).
pub const INLINE_SEG_FLAG: u32 = 0x8000_0000;
/// The lkey of the receive-list terminator (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;

bitflags::bitflags! {
    /// The `fm_ce_se` byte of the ctrl segment: fence mode, completion mode, solicited.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FmCeSe: u8 {
        /// Solicited event.
        const SOLICITED = 0x02;
        /// Always write a CQE (`MLX5_WQE_CTRL_CQ_UPDATE`); otherwise only on error.
        const CQ_UPDATE = 0x08;
        /// Initiator small fence.
        const INITIATOR_SMALL_FENCE = 0x20;
        /// Fence: wait for earlier reads and atomics (`IBV_SEND_FENCE` -> 0x80).
        const FENCE = 0x80;
        // Values outside the named bits are kept (fence modes 2 and 3) rather than dropped.
        const _ = !0;
    }
}

impl FmCeSe {
    /// The 3-bit fence mode (bits 7:5); nonzero means "fenced".
    pub const fn fence_mode(self) -> u8 {
        self.bits() >> 5
    }
    /// Whether a CQE is requested for success (completion mode 2 or 3).
    pub const fn signalled(self) -> bool {
        (self.bits() >> 2) & 0x3 >= 2
    }
}

/// Control segment `mlx5_wqe_ctrl_seg`, always at WQE offset 0.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlSeg {
    /// opmod (31:24), wqe_index (23:8), opcode (7:0).
    pub opmod_idx_opcode: Be32,
    /// QPN (31:8), ds (7:0, 6 bits meaningful).
    pub qpn_ds: Be32,
    /// WQE signature; 0 (signatures off).
    pub signature: u8,
    /// DCI stream channel id; 0 for RC.
    pub dci_stream_channel_id: [u8; 2],
    /// Fence, completion and solicited bits.
    pub fm_ce_se: u8,
    /// Immediate data, exactly the 4 bytes of the work request (no swap).
    pub imm: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<CtrlSeg>() == 16);

impl CtrlSeg {
    /// A control segment for the WQE starting at producer counter `wqe_index`.
    pub fn new(wqe_index: u16, opcode: u8, qpn: u32, ds: u8, flags: FmCeSe, imm: [u8; 4]) -> Self {
        Self {
            opmod_idx_opcode: Be32::new(((wqe_index as u32) << 8) | opcode as u32),
            qpn_ds: Be32::new(((qpn & 0xFF_FFFF) << 8) | ds as u32),
            signature: 0,
            dci_stream_channel_id: [0; 2],
            fm_ce_se: flags.bits(),
            imm,
        }
    }
    /// Opcode byte (may be one this model does not know).
    pub const fn opcode_byte(&self) -> u8 {
        self.opmod_idx_opcode.get() as u8
    }
    /// Decoded opcode.
    pub const fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode_byte())
    }
    /// opmod byte.
    pub const fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode.get() >> 24) as u8
    }
    /// The 16-bit producer counter of this WQE's first WQEBB.
    pub const fn wqe_index(&self) -> u16 {
        (self.opmod_idx_opcode.get() >> 8) as u16
    }
    /// QP number.
    pub const fn qpn(&self) -> u32 {
        self.qpn_ds.get() >> 8
    }
    /// Size of the WQE in 16-byte units.
    pub const fn ds(&self) -> u8 {
        (self.qpn_ds.get() & 0x3F) as u8
    }
    /// Fence, completion and solicited bits.
    pub const fn flags(&self) -> FmCeSe {
        FmCeSe::from_bits_retain(self.fm_ce_se)
    }
    /// The 8 bytes a doorbell carries: the first two words as they lie in memory.
    pub fn head(&self) -> [u8; 8] {
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&self.opmod_idx_opcode.bytes());
        h[4..].copy_from_slice(&self.qpn_ds.bytes());
        h
    }
    /// The segment's bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.head());
        b[8] = self.signature;
        b[9..11].copy_from_slice(&self.dci_stream_channel_id);
        b[11] = self.fm_ce_se;
        b[12..].copy_from_slice(&self.imm);
        b
    }
    /// Parses the segment from its bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        Self {
            opmod_idx_opcode: Be32(b[0..4].try_into().unwrap()),
            qpn_ds: Be32(b[4..8].try_into().unwrap()),
            signature: b[8],
            dci_stream_channel_id: [b[9], b[10]],
            fm_ce_se: b[11],
            imm: b[12..16].try_into().unwrap(),
        }
    }
}

/// Remote address segment `mlx5_wqe_raddr_seg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaddrSeg {
    /// Remote virtual address.
    pub raddr: Be64,
    /// Remote key.
    pub rkey: Be32,
    /// Reserved, 0.
    pub reserved: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<RaddrSeg>() == 16);

impl RaddrSeg {
    /// A remote address segment.
    pub fn new(raddr: u64, rkey: u32) -> Self {
        Self {
            raddr: Be64::new(raddr),
            rkey: Be32::new(rkey),
            reserved: [0; 4],
        }
    }
    /// The segment's bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.raddr.bytes());
        b[8..12].copy_from_slice(&self.rkey.bytes());
        b
    }
    /// Parses the segment from its bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        Self {
            raddr: Be64(b[0..8].try_into().unwrap()),
            rkey: Be32(b[8..12].try_into().unwrap()),
            reserved: b[12..16].try_into().unwrap(),
        }
    }
}

/// Atomic segment `mlx5_wqe_atomic_seg`: swap (CS) or add (FA) value, then compare (CS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicSeg {
    /// Swap value for compare-and-swap, add value for fetch-and-add.
    pub swap_add: Be64,
    /// Compare value for compare-and-swap.
    pub compare: Be64,
}
const _: () = assert!(core::mem::size_of::<AtomicSeg>() == 16);

impl AtomicSeg {
    /// An atomic segment.
    pub fn new(swap_add: u64, compare: u64) -> Self {
        Self {
            swap_add: Be64::new(swap_add),
            compare: Be64::new(compare),
        }
    }
    /// The segment's bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.swap_add.bytes());
        b[8..].copy_from_slice(&self.compare.bytes());
        b
    }
    /// Parses the segment from its bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        Self {
            swap_add: Be64(b[0..8].try_into().unwrap()),
            compare: Be64(b[8..16].try_into().unwrap()),
        }
    }
}

/// Data (gather or scatter) segment `mlx5_wqe_data_seg`; also a receive WQE's entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataSeg {
    /// Length in bytes.
    pub byte_count: Be32,
    /// Local key.
    pub lkey: Be32,
    /// Virtual address.
    pub addr: Be64,
}
const _: () = assert!(core::mem::size_of::<DataSeg>() == 16);

impl DataSeg {
    /// A data segment.
    pub fn new(addr: u64, len: u32, lkey: u32) -> Self {
        Self {
            byte_count: Be32::new(len),
            lkey: Be32::new(lkey),
            addr: Be64::new(addr),
        }
    }
    /// The receive-list terminator: length 0, lkey [`INVALID_LKEY`], address 0.
    pub fn terminator() -> Self {
        Self::new(0, 0, INVALID_LKEY)
    }
    /// Whether this is the receive-list terminator.
    pub fn is_terminator(&self) -> bool {
        self.lkey.get() == INVALID_LKEY && self.byte_count.get() == 0
    }
    /// Whether this is an inline header rather than a data segment.
    pub fn is_inline(&self) -> bool {
        self.byte_count.get() & INLINE_SEG_FLAG != 0
    }
    /// The segment's bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.byte_count.bytes());
        b[4..8].copy_from_slice(&self.lkey.bytes());
        b[8..].copy_from_slice(&self.addr.bytes());
        b
    }
    /// Parses the segment from its bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        Self {
            byte_count: Be32(b[0..4].try_into().unwrap()),
            lkey: Be32(b[4..8].try_into().unwrap()),
            addr: Be64(b[8..16].try_into().unwrap()),
        }
    }
}

/// Header of an inline-data segment: `BE32(len | 0x80000000)`, payload follows at +4, the
/// whole padded to 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InlineHeader {
    /// Length with [`INLINE_SEG_FLAG`] set.
    pub byte_count: Be32,
}
const _: () = assert!(core::mem::size_of::<InlineHeader>() == 4);

impl InlineHeader {
    /// The header for `len` payload bytes.
    pub fn new(len: u32) -> Self {
        Self {
            byte_count: Be32::new(len | INLINE_SEG_FLAG),
        }
    }
    /// Payload length (the kernel masks inline lengths with 0x3FF).
    pub fn len(&self) -> u32 {
        self.byte_count.get() & 0x3FF
    }
    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Number of 16-byte units the inline segment with `len` payload bytes takes.
    pub const fn ds_for(len: usize) -> usize {
        (4 + len).div_ceil(SEG_SIZE)
    }
}

/// A run of data segments: read from WQE bytes, or given as segments to write. Iterating
/// decodes one segment at a time; nothing is copied or allocated.
#[derive(Clone, Copy, Debug)]
pub struct DataSegs<'a>(SegsRepr<'a>);

#[derive(Clone, Copy, Debug)]
enum SegsRepr<'a> {
    Bytes(&'a [u8]),
    Segs(&'a [DataSeg]),
}

impl<'a> DataSegs<'a> {
    /// No segments.
    pub const EMPTY: DataSegs<'static> = DataSegs(SegsRepr::Segs(&[]));

    /// The segments to write.
    pub const fn from_segs(segs: &'a [DataSeg]) -> Self {
        Self(SegsRepr::Segs(segs))
    }
    /// The segments laid out in `bytes`, 16 bytes each (a partial last one is not a segment).
    pub const fn from_bytes(bytes: &'a [u8]) -> Self {
        let whole = bytes.len() / SEG_SIZE * SEG_SIZE;
        Self(SegsRepr::Bytes(bytes.split_at(whole).0))
    }
    /// Number of segments.
    pub const fn len(&self) -> usize {
        match self.0 {
            SegsRepr::Bytes(b) => b.len() / SEG_SIZE,
            SegsRepr::Segs(s) => s.len(),
        }
    }
    /// Whether there are none.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The segments, in order.
    pub fn iter(&self) -> DataSegIter<'a> {
        DataSegIter(self.0)
    }
    /// Writes the segments at the start of `out`; returns the bytes written.
    pub(super) fn write_to(&self, out: &mut [u8]) -> usize {
        let n = self.len() * SEG_SIZE;
        match self.0 {
            SegsRepr::Bytes(b) => out[..n].copy_from_slice(b),
            SegsRepr::Segs(s) => {
                for (d, o) in s.iter().zip(out.chunks_exact_mut(SEG_SIZE)) {
                    o.copy_from_slice(&d.to_bytes());
                }
            }
        }
        n
    }
}

impl PartialEq for DataSegs<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}
impl Eq for DataSegs<'_> {}

/// Iterator over [`DataSegs`].
#[derive(Clone, Debug)]
pub struct DataSegIter<'a>(SegsRepr<'a>);

impl Iterator for DataSegIter<'_> {
    type Item = DataSeg;
    fn next(&mut self) -> Option<DataSeg> {
        match &mut self.0 {
            SegsRepr::Bytes(b) => {
                let (head, rest) = b.split_first_chunk::<SEG_SIZE>()?;
                *b = rest;
                Some(DataSeg::from_bytes(head))
            }
            SegsRepr::Segs(s) => {
                let (head, rest) = s.split_first()?;
                *s = rest;
                Some(*head)
            }
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = DataSegs(self.0).len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for DataSegIter<'_> {}

/// Why bytes are not a WQE this model executes, or a request cannot be written as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    /// Fewer bytes than the WQE's size.
    #[error("a WQE of {need} bytes does not fit in {have}")]
    Truncated {
        /// Bytes the WQE takes.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A ds count of 0 (a WQE has at least its control segment).
    #[error("ds is 0: a WQE has at least its control segment")]
    EmptyDs,
    /// More 16-byte units than a WQE holds.
    #[error("the WQE needs {ds} DS; a WQE holds at most {MAX_WQE_DS}")]
    TooLarge {
        /// The units needed.
        ds: usize,
    },
    /// An opcode byte no mlx5 send opcode has.
    #[error("opcode {0:#04x} is not a send opcode")]
    UnknownOpcode(u8),
    /// An opcode whose WQE layout this model does not know.
    #[error("opcode {0:?} is not modelled")]
    Unsupported(Opcode),
    /// A segment the opcode needs is missing, or one it does not take is present.
    #[error("{op:?} WQE: {what}")]
    Shape {
        /// The opcode.
        op: Opcode,
        /// What is wrong.
        what: &'static str,
    },
    /// Inline data for an operation whose data segments are a scatter list.
    #[error("{0:?} cannot carry inline data")]
    InlineNotAllowed(Opcode),
    /// An inline payload that runs past the end of the WQE.
    #[error("inline payload of {len} bytes overruns the WQE ({room} bytes left)")]
    InlineOverrun {
        /// Payload length the header claims.
        len: usize,
        /// Bytes left in the WQE after the header.
        room: usize,
    },
    /// A receive WQE that is not a whole number of segments.
    #[error("a receive WQE of {0} bytes is not a whole number of 16-byte segments")]
    RecvStride(usize),
    /// A data segment a reader would take for something else (an inline header or the
    /// receive-list terminator).
    #[error("data segment {0} would read as an inline header or a terminator")]
    AmbiguousSeg(usize),
}
