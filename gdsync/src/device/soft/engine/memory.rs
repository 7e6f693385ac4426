//! Key checks and copies between the wire and registered memory: a scatter or gather list
//! through lkeys, checked against the QP's protection domain and access rights.

use super::super::mr_table::Slots;
use crate::format::DataSeg;
use crate::provider::Access;

/// A scatter or gather entry as the device reads it from a WQE: `len` bytes at `addr` in
/// the region with local key `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

impl Seg {
    /// The entry a WQE's data segment names.
    pub(super) fn of(d: DataSeg) -> Self {
        Seg {
            addr: d.addr.get(),
            len: d.byte_count.get(),
            lkey: d.lkey.get(),
        }
    }
}

/// Whether every SGE lies in a region of `pd` with `need` rights.
pub(super) fn sges_ok(slots: &Slots, pd: u32, sges: &[Seg], need: Access) -> bool {
    sges.iter().all(|s| {
        slots.get(s.lkey).is_some_and(|e| {
            e.pd == pd && e.access.contains(need) && e.covers(s.addr, s.len as u64)
        })
    })
}

/// Copies `src` into the scatter list at message offset `off`.
#[inline]
pub(super) fn scatter(slots: &Slots, pd: u32, sges: &[Seg], mut off: u64, mut src: &[u8]) -> bool {
    for s in sges {
        if src.is_empty() {
            break;
        }
        if off >= s.len as u64 {
            off -= s.len as u64;
            continue;
        }
        let n = ((s.len as u64 - off) as usize).min(src.len());
        let a = s.addr + off;
        if !slots.get(s.lkey).is_some_and(|e| {
            e.pd == pd && e.access.contains(Access::LOCAL_WRITE) && e.write(a, &src[..n])
        }) {
            return false;
        }
        src = &src[n..];
        off = 0;
    }
    src.is_empty()
}

/// Copies from the gather list at message offset `off` into `dst`.
#[inline]
pub(super) fn gather(
    slots: &Slots,
    pd: u32,
    sges: &[Seg],
    mut off: u64,
    mut dst: &mut [u8],
) -> bool {
    for s in sges {
        if dst.is_empty() {
            break;
        }
        if off >= s.len as u64 {
            off -= s.len as u64;
            continue;
        }
        let n = ((s.len as u64 - off) as usize).min(dst.len());
        let a = s.addr + off;
        let (now, rest) = std::mem::take(&mut dst).split_at_mut(n);
        if !slots
            .get(s.lkey)
            .is_some_and(|e| e.pd == pd && e.read(a, now))
        {
            return false;
        }
        dst = rest;
        off = 0;
    }
    dst.is_empty()
}
