//! A whole send WQE, typed: the one writer (the host's encoder uses it, checked or, for WQEs
//! it checked itself, unchecked and in pieces) and the one reader (the soft device's requester
//! uses it) of the send ring's bytes, side by side.
//!
//! Layout (`mlx5dv.h`): the control segment, then a remote-address segment for RDMA and
//! atomics, an atomic segment for atomics, then either one inline segment (header and
//! payload, padded to 16 bytes; none for an empty payload) or data segments. A NOP's segments after the control one are
//! not read: a send neutralised into a NOP keeps the segments it had.

use super::{
    wqebbs_for_ds, AtomicSeg, CtrlSeg, DataSeg, DataSegs, FmCeSe, InlineHeader, Opcode, RaddrSeg,
    WqeError, INLINE_SEG_FLAG, MAX_WQE_DS, MAX_WQE_WQEBBS, SEG_SIZE, WQEBB,
};

/// What follows the fixed segments of a send WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeData<'a> {
    /// An inline segment: the payload itself.
    Inline(&'a [u8]),
    /// Data segments: the gather list (sends, writes) or scatter list (reads, atomics).
    Gather(DataSegs<'a>),
}

/// A send WQE as the HCA reads it: the control segment's fields and the segments after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWqe<'a> {
    /// Producer counter (16 bits) of the WQE's first WQEBB.
    pub wqe_index: u16,
    /// The operation.
    pub opcode: Opcode,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Fence, completion and solicited bits.
    pub flags: FmCeSe,
    /// Immediate data, the 4 bytes as they lie in the WQE.
    pub imm: [u8; 4],
    /// Remote address and key: present exactly for RDMA and atomics.
    pub raddr: Option<RaddrSeg>,
    /// Atomic operands: present exactly for atomics.
    pub atomic: Option<AtomicSeg>,
    /// Inline payload or data segments.
    pub data: WqeData<'a>,
}

impl<'a> SendWqe<'a> {
    /// Size in 16-byte units.
    pub fn ds(&self) -> usize {
        1 + self.raddr.is_some() as usize
            + self.atomic.is_some() as usize
            + match self.data {
                // An empty inline payload takes no segment, as libmlx5 and the kernel's
                // mlx5 driver write it: the WQE is a zero-length send.
                WqeData::Inline([]) => 0,
                WqeData::Inline(p) => InlineHeader::ds_for(p.len()),
                WqeData::Gather(s) => s.len(),
            }
    }

    /// The control segment (with this WQE's ds; call after [`check`](Self::check)).
    pub fn ctrl(&self) -> CtrlSeg {
        CtrlSeg::new(
            self.wqe_index,
            self.opcode.into(),
            self.qpn,
            self.ds() as u8,
            self.flags,
            self.imm,
        )
    }

    /// Whether the reader would read back exactly this WQE: a modelled opcode, the segments
    /// it takes, a size a WQE can have. Returns the ds count.
    pub fn check(&self) -> Result<usize, WqeError> {
        let op = self.opcode;
        if !op.is_supported() {
            return Err(WqeError::Unsupported(op));
        }
        let nop = op == Opcode::Nop;
        if self.raddr.is_some() != (op.has_raddr() && !nop) {
            return Err(WqeError::Shape {
                op,
                what: "a remote-address segment goes with RDMA and atomics only",
            });
        }
        if self.atomic.is_some() != op.is_atomic() {
            return Err(WqeError::Shape {
                op,
                what: "an atomic segment goes with atomics only",
            });
        }
        match self.data {
            WqeData::Inline(_) if !op.carries_payload() => {
                return Err(WqeError::InlineNotAllowed(op))
            }
            WqeData::Gather(s) => {
                if let Some(i) = s.iter().position(|d| d.is_inline()) {
                    return Err(WqeError::AmbiguousSeg(i));
                }
            }
            WqeData::Inline(_) => {}
        }
        let ds = self.ds();
        if ds > MAX_WQE_DS || wqebbs_for_ds(ds) > MAX_WQE_WQEBBS {
            return Err(WqeError::TooLarge { ds });
        }
        Ok(ds)
    }

    /// Writes the WQE at the start of `out` (`mlx5dv_set_ctrl_seg` and the segment setters,
    /// in order); returns its ds count. Inline padding is zeroed.
    pub fn write_to(&self, out: &mut [u8]) -> Result<usize, WqeError> {
        let ds = self.check()?;
        if out.len() < ds * SEG_SIZE {
            return Err(WqeError::Truncated {
                need: ds * SEG_SIZE,
                have: out.len(),
            });
        }
        self.write_checked(ds, out);
        Ok(ds)
    }

    /// [`write_to`](Self::write_to) without its checks, for a writer that built the WQE valid
    /// (the host's encoder checks the work request itself): `ds` must be what
    /// [`check`](Self::check) returns, and `out` must hold `ds` units (else this panics).
    #[inline]
    pub(crate) fn write_checked(&self, ds: usize, out: &mut [u8]) {
        debug_assert_eq!(self.check(), Ok(ds), "write_checked on a WQE check refuses");
        let ctrl = CtrlSeg::new(
            self.wqe_index,
            self.opcode.into(),
            self.qpn,
            ds as u8,
            self.flags,
            self.imm,
        );
        let rest = write_fixed(ctrl, self.raddr, self.atomic, &mut out[..ds * SEG_SIZE]);
        match self.data {
            // (`rest` is exactly the inline segment: `ds` counted it.)
            WqeData::Inline([]) => {}
            WqeData::Inline(p) => write_inline_seg(p.len(), rest).copy_from_slice(p),
            WqeData::Gather(s) => {
                s.write_to(rest);
            }
        }
    }

    /// Reads the WQE at the start of `bytes` (which must hold all `ds` units the control
    /// segment announces), as the HCA does. Arbitrary bytes give an error, never a panic.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WqeError> {
        let (ctrl, _) = bytes
            .split_first_chunk::<SEG_SIZE>()
            .ok_or(WqeError::Truncated {
                need: SEG_SIZE,
                have: bytes.len(),
            })?;
        let ctrl = CtrlSeg::from_bytes(ctrl);
        let ds = ctrl.ds() as usize;
        if ds == 0 {
            return Err(WqeError::EmptyDs);
        }
        let body = bytes
            .get(SEG_SIZE..ds * SEG_SIZE)
            .ok_or(WqeError::Truncated {
                need: ds * SEG_SIZE,
                have: bytes.len(),
            })?;
        let op = ctrl
            .opcode()
            .ok_or(WqeError::UnknownOpcode(ctrl.opcode_byte()))?;
        if !op.is_supported() {
            return Err(WqeError::Unsupported(op));
        }
        let mut wqe = SendWqe {
            wqe_index: ctrl.wqe_index(),
            opcode: op,
            qpn: ctrl.qpn(),
            flags: ctrl.flags(),
            imm: ctrl.imm,
            raddr: None,
            atomic: None,
            data: WqeData::Gather(DataSegs::EMPTY),
        };
        if op == Opcode::Nop {
            return Ok(wqe);
        }
        let mut rest = body;
        let mut take = |what: &'static str| match rest.split_first_chunk::<SEG_SIZE>() {
            Some((seg, tail)) => {
                rest = tail;
                Ok(seg)
            }
            None => Err(WqeError::Shape { op, what }),
        };
        if op.has_raddr() {
            wqe.raddr = Some(RaddrSeg::from_bytes(take("no remote-address segment")?));
        }
        if op.is_atomic() {
            wqe.atomic = Some(AtomicSeg::from_bytes(take("no atomic segment")?));
        }
        wqe.data = parse_data(op, rest)?;
        Ok(wqe)
    }
}

/// The most common send WQE, as [`SendWqe::peek_common`] reads it off its first block: a
/// send or RDMA write (with or without immediate) whose payload is inline or one segment of
/// memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonWqe {
    /// The control segment (its `ds` counts the whole WQE, which may run past the block).
    pub ctrl: CtrlSeg,
    /// A send or RDMA write, with or without immediate.
    pub opcode: Opcode,
    /// Remote address and key: present exactly for RDMA writes.
    pub raddr: Option<RaddrSeg>,
    /// Where the payload is.
    pub data: CommonData,
}

/// The payload of a [`CommonWqe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommonData {
    /// `len` inline bytes from byte `at` of the WQE, inside its `ds` units (they may
    /// run past the first block).
    Inline {
        /// Offset of the payload in the WQE.
        at: usize,
        /// Payload bytes.
        len: usize,
    },
    /// One data segment, not empty, ending the WQE in its first block.
    Segment(DataSeg),
}

impl SendWqe<'_> {
    /// A fast first look at a WQE's first block, for the most common WQEs ([`CommonWqe`]):
    /// what [`parse`](Self::parse) reads of them, in a fraction of its work. `None` for any
    /// other WQE (another opcode, no data segment, several, an empty one) or anything
    /// unusual about this one (an inline payload that runs past the `ds` units), which the
    /// full parse then reads (and refuses with its errors). The `ds` count is not checked
    /// against a limit: the caller bounds what it reads past the block.
    #[inline]
    pub fn peek_common(block: &[u8; WQEBB]) -> Option<CommonWqe> {
        let (ctrl, rest) = block.split_first_chunk::<SEG_SIZE>()?;
        let ctrl = CtrlSeg::from_bytes(ctrl);
        let opcode = ctrl.opcode()?;
        if !(opcode.carries_payload() && opcode.is_supported()) {
            return None;
        }
        let (raddr, at) = if opcode.has_raddr() {
            let (r, _) = rest.split_first_chunk::<SEG_SIZE>()?;
            (Some(RaddrSeg::from_bytes(r)), 2 * SEG_SIZE)
        } else {
            (None, SEG_SIZE)
        };
        let end = ctrl.ds() as usize * SEG_SIZE;
        let word = u32::from_be_bytes(*block[at..].first_chunk::<4>()?);
        let data = if word & INLINE_SEG_FLAG != 0 {
            let len = InlineHeader {
                byte_count: super::Be32::new(word),
            }
            .len() as usize;
            if at + 4 + len > end {
                return None;
            }
            CommonData::Inline { at: at + 4, len }
        } else {
            if end != at + SEG_SIZE {
                return None;
            }
            let d = DataSeg::from_bytes(block[at..].first_chunk::<SEG_SIZE>()?);
            if d.byte_count.get() == 0 {
                return None;
            }
            CommonData::Segment(d)
        };
        Some(CommonWqe {
            ctrl,
            opcode,
            raddr,
            data,
        })
    }
}

/// Writes the segments before a send WQE's data (`ctrl`, then the remote-address and atomic
/// segments where given) at the start of `out`; returns the rest of `out`. The pieces of
/// [`SendWqe::write_checked`], for a writer that copies an inline payload in itself.
#[inline(always)] // (in the posting path: its `Option`s are known there)
pub(crate) fn write_fixed(
    ctrl: CtrlSeg,
    raddr: Option<RaddrSeg>,
    atomic: Option<AtomicSeg>,
    out: &mut [u8],
) -> &mut [u8] {
    let mut rest = put_seg(out, ctrl.to_bytes());
    if let Some(r) = raddr {
        rest = put_seg(rest, r.to_bytes());
    }
    if let Some(a) = atomic {
        rest = put_seg(rest, a.to_bytes());
    }
    rest
}

/// Writes the header and zero padding of an inline segment for `len` payload bytes (`len` >
/// 0) into `seg`, which is exactly that segment ([`InlineHeader::ds_for`] units); returns
/// where the payload goes.
#[inline]
pub(crate) fn write_inline_seg(len: usize, seg: &mut [u8]) -> &mut [u8] {
    // The padding lies in the last unit: zero it whole (one store), then the header and
    // payload go over it.
    let last = seg.len() - SEG_SIZE;
    seg[last..].fill(0);
    seg[..4].copy_from_slice(&InlineHeader::new(len as u32).byte_count.bytes());
    &mut seg[4..4 + len]
}

/// Writes one segment at the start of `out`; returns the rest.
#[inline]
fn put_seg(out: &mut [u8], seg: [u8; SEG_SIZE]) -> &mut [u8] {
    let (head, rest) = out.split_at_mut(SEG_SIZE);
    head.copy_from_slice(&seg);
    rest
}

/// The inline segment or data segments that end a send WQE.
fn parse_data(op: Opcode, rest: &[u8]) -> Result<WqeData<'_>, WqeError> {
    let Some(&word) = rest.first_chunk::<4>() else {
        return Ok(WqeData::Gather(DataSegs::EMPTY));
    };
    if u32::from_be_bytes(word) & INLINE_SEG_FLAG == 0 {
        return Ok(WqeData::Gather(DataSegs::from_bytes(rest)));
    }
    if !op.carries_payload() {
        return Err(WqeError::InlineNotAllowed(op));
    }
    let len = InlineHeader {
        byte_count: super::Be32::new(u32::from_be_bytes(word)),
    }
    .len() as usize;
    let payload = &rest[4..];
    payload
        .get(..len)
        .map(WqeData::Inline)
        .ok_or(WqeError::InlineOverrun {
            len,
            room: payload.len(),
        })
}
