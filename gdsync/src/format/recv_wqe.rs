//! A receive WQE, typed: the one writer (the host posting a receive) and the one reader (the
//! soft device's responder taking it) of a receive-ring slot.
//!
//! A slot of the ring (its stride, a power of two of 16-byte units) holds data segments; a
//! terminator (`lkey` [`INVALID_LKEY`](super::INVALID_LKEY), length 0) ends the list unless
//! the segments fill the slot.

use super::{DataSeg, DataSegs, WqeError, SEG_SIZE};

/// A receive WQE: its scatter list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWqe<'a> {
    /// The data segments, terminator excluded.
    pub segs: DataSegs<'a>,
}

impl<'a> RecvWqe<'a> {
    /// Writes the scatter list, and the terminator if the slot has room, at the start of
    /// `slot` (one stride); returns the bytes written. The rest of the slot is not touched.
    pub fn write_to(&self, slot: &mut [u8]) -> Result<usize, WqeError> {
        check_stride(slot.len())?;
        let n = self.segs.len() * SEG_SIZE;
        if n > slot.len() {
            return Err(WqeError::Truncated {
                need: n,
                have: slot.len(),
            });
        }
        if let Some(i) = self.segs.iter().position(|d| d.is_terminator()) {
            return Err(WqeError::AmbiguousSeg(i));
        }
        self.segs.write_to(slot);
        if n == slot.len() {
            return Ok(n);
        }
        slot[n..n + SEG_SIZE].copy_from_slice(&DataSeg::terminator().to_bytes());
        Ok(n + SEG_SIZE)
    }

    /// Reads the receive WQE in `slot` (one stride): the segments up to the terminator or
    /// the end of the slot. Arbitrary bytes give an error, never a panic.
    pub fn parse(slot: &'a [u8]) -> Result<Self, WqeError> {
        check_stride(slot.len())?;
        let n = DataSegs::from_bytes(slot)
            .iter()
            .position(|d| d.is_terminator())
            .unwrap_or(slot.len() / SEG_SIZE);
        Ok(Self {
            segs: DataSegs::from_bytes(&slot[..n * SEG_SIZE]),
        })
    }
}

fn check_stride(len: usize) -> Result<(), WqeError> {
    if len == 0 || len % SEG_SIZE != 0 {
        return Err(WqeError::RecvStride(len));
    }
    Ok(())
}
