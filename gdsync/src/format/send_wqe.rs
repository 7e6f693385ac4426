//! A whole send WQE, typed: the one writer (the host's encoder uses it) and the one reader
//! (the soft device's requester uses it) of the send ring's bytes, side by side.
//!
//! Layout (`mlx5dv.h`): the control segment, then a remote-address segment for RDMA and
//! atomics, an atomic segment for atomics, then either one inline segment (header and
//! payload, padded to 16 bytes; none for an empty payload) or data segments. A NOP's segments after the control one are
//! not read: a send neutralised into a NOP keeps the segments it had.

use super::{
    wqebbs_for_ds, AtomicSeg, CtrlSeg, DataSegs, FmCeSe, InlineHeader, Opcode, RaddrSeg, WqeError,
    INLINE_SEG_FLAG, MAX_WQE_DS, MAX_WQE_WQEBBS, SEG_SIZE,
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
        out[..SEG_SIZE].copy_from_slice(&self.ctrl().to_bytes());
        let mut pos = SEG_SIZE;
        let mut put = |seg: [u8; SEG_SIZE]| {
            out[pos..pos + SEG_SIZE].copy_from_slice(&seg);
            pos += SEG_SIZE;
        };
        if let Some(r) = self.raddr {
            put(r.to_bytes());
        }
        if let Some(a) = self.atomic {
            put(a.to_bytes());
        }
        match self.data {
            WqeData::Inline([]) => {}
            WqeData::Inline(p) => {
                let end = pos + InlineHeader::ds_for(p.len()) * SEG_SIZE;
                let h = InlineHeader::new(p.len() as u32).byte_count.bytes();
                out[pos..pos + 4].copy_from_slice(&h);
                out[pos + 4..pos + 4 + p.len()].copy_from_slice(p);
                out[pos + 4 + p.len()..end].fill(0);
            }
            WqeData::Gather(s) => {
                s.write_to(&mut out[pos..]);
            }
        }
        Ok(ds)
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
