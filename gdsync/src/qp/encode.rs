//! The encoder: a work request checked, then written as the send WQE the HCA reads through
//! [`SendWqe::write_checked`](crate::format::SendWqe::write_checked) (the checks are made on
//! the work request here), inline payload copied from registered memory. The most common
//! send (one SGE inline from host memory) takes a straight path of its own ([`InlineOne`]),
//! its payload copied from memory into the ring directly.

use super::{QpShared, MAX_MESSAGE, MAX_SGE};
use crate::context::{DeviceContext, HostRegion, RegionCache, RegionsRead};
use crate::format::*;
use crate::wr::{SendFlags, SendWr, Sge, WrOp};
use crate::{Error, Result};

/// A WQE as written: its size and the first 8 bytes, which ring the doorbell.
pub(super) struct Encoded {
    pub ds: usize,
    pub head: [u8; 8],
}

/// Whether every SGE lies in a registered region of host memory (else it is left to the
/// encoder's own checks).
fn in_host_memory(mrs: &RegionsRead, cache: &mut RegionCache, sges: &[Sge]) -> bool {
    sges.iter()
        .all(|g| mrs.get(cache, g.lkey).is_some_and(|e| e.gpu.is_none()))
}

/// Encodes `wr` as a WQE for producer index `sq_pi`. Inline payload is gathered into `inline`
/// first, through `cache` (the QP's last region). Once every check passed, `place(ds)` says
/// where the `ds` units go (it may still refuse: a full ring); the WQE is written there.
///
/// Every check a WQE needs is made here, on the work request, so that the WQE is written
/// with [`SendWqe::write_checked`] (the checked [`SendWqe::write_to`] would make them again).
pub(super) fn encode<'o>(
    s: &QpShared,
    ctx: &DeviceContext,
    cache: &mut RegionCache,
    sq_pi: u64,
    wr: &SendWr,
    inline: &mut [u8],
    place: impl FnOnce(usize) -> Result<&'o mut [u8]>,
) -> Result<Encoded> {
    if let Some(one) = InlineOne::check(s, ctx, cache, wr) {
        return one.write(s, sq_pi, wr.flags, place);
    }
    let len = checked_len(wr)?;
    let (opcode, remote, imm) = wr.op.wqe_fields();
    let inlinable = opcode.carries_payload();
    // The region table, read once: for the inline decision and the inline copy.
    let mrs = wr
        .flags
        .intersects(SendFlags::INLINE | SendFlags::INLINE_HOST)
        .then(|| ctx.regions.read());
    let inline_it = wr.flags.contains(SendFlags::INLINE)
        || (wr.flags.contains(SendFlags::INLINE_HOST)
            && inlinable
            && len > 0
            && len <= s.cfg.max_inline as u64
            && mrs
                .as_ref()
                .is_some_and(|m| in_host_memory(m, cache, &wr.sges)));
    if inline_it && !inlinable {
        return Err(not_inlinable(opcode));
    }
    let atomic = atomic_seg(wr)?;
    if atomic.is_some() {
        no_atomics(&ctx.provider.query_device(), &ctx.provider.name())?;
    }
    let mut segs: [DataSeg; MAX_SGE];
    let data = if inline_it {
        let mrs = mrs
            .as_ref()
            .expect("the region table is read for inline sends");
        WqeData::Inline(gather_inline(s, mrs, cache, wr, len, inline)?)
    } else {
        segs = [DataSeg::default(); MAX_SGE];
        WqeData::Gather(DataSegs::from_segs(gather_list(wr, opcode, &mut segs)))
    };
    let wqe = SendWqe {
        wqe_index: idx16(sq_pi),
        opcode,
        qpn: s.qpn,
        flags: fm_ce_se(wr.flags),
        imm: imm.to_be_bytes(),
        raddr: remote.map(|r| RaddrSeg::new(r.addr, r.rkey)),
        atomic,
        data,
    };
    // What `SendWqe::check` would still refuse: the opcodes, segments and inline choice are
    // right by construction, and the length check keeps every SGE's byte count clear of the
    // inline flag. Only the size is left.
    let ds = wqe.ds();
    if ds > MAX_WQE_DS || wqebbs_for_ds(ds) > MAX_WQE_WQEBBS {
        return Err(too_large(ds));
    }
    let out = place(ds)?;
    wqe.write_checked(ds, out);
    let head = out[..8].try_into().expect("a WQE is at least 16 bytes");
    Ok(Encoded { ds, head })
}

/// The common send, checked: `INLINE`, a send or RDMA write, one SGE of at most `max_inline`
/// bytes in registered host memory of the QP's PD. Its WQE is written in a straight line,
/// the payload copied from that memory into the ring directly.
struct InlineOne<'c> {
    /// Held until the copy: the region stays registered.
    _mrs: RegionsRead<'c>,
    region: HostRegion,
    sge: Sge,
    opcode: Opcode,
    raddr: Option<RaddrSeg>,
    imm: u32,
}

impl<'c> InlineOne<'c> {
    /// `wr` as the common send, if it is one and passes every check [`encode`] makes; `None`
    /// otherwise, and the general path makes them (the same errors for the same requests).
    #[inline]
    fn check(
        s: &QpShared,
        ctx: &'c DeviceContext,
        cache: &mut RegionCache,
        wr: &SendWr,
    ) -> Option<Self> {
        let [sge] = wr.sges.as_slice() else {
            return None;
        };
        let (opcode, remote, imm) = wr.op.wqe_fields();
        if !wr.flags.contains(SendFlags::INLINE)
            || !opcode.carries_payload()
            || sge.len == 0
            || sge.len > s.cfg.max_inline
        {
            return None;
        }
        let mrs = ctx.regions.read();
        let region = mrs
            .get(cache, sge.lkey)
            .filter(|r| r.pd == s.pd && r.gpu.is_none() && r.contains(sge.addr, sge.len as u64))?;
        Some(InlineOne {
            _mrs: mrs,
            region,
            sge: *sge,
            opcode,
            raddr: remote.map(|r| RaddrSeg::new(r.addr, r.rkey)),
            imm,
        })
    }

    /// Writes the WQE where `place` says (as [`encode`] does).
    #[inline]
    fn write<'o>(
        self,
        s: &QpShared,
        sq_pi: u64,
        flags: SendFlags,
        place: impl FnOnce(usize) -> Result<&'o mut [u8]>,
    ) -> Result<Encoded> {
        let len = self.sge.len as usize;
        let ds = 1 + self.raddr.is_some() as usize + InlineHeader::ds_for(len);
        let out = place(ds)?;
        let ctrl = CtrlSeg::new(
            idx16(sq_pi),
            self.opcode.into(),
            s.qpn,
            ds as u8,
            fm_ce_se(flags),
            self.imm.to_be_bytes(),
        );
        let data = write_fixed(ctrl, self.raddr, None, &mut out[..ds * SEG_SIZE]);
        let copied = self.region.read(self.sge.addr, write_inline_seg(len, data));
        debug_assert!(
            copied,
            "a copy from host memory inside the region cannot fail"
        );
        Ok(Encoded {
            ds,
            head: ctrl.head(),
        })
    }
}

/// The payload length of `wr`, after checking its SGE count and the message size.
fn checked_len(wr: &SendWr) -> Result<u64> {
    if wr.sges.len() > MAX_SGE {
        return Err(Error::invalid(format!(
            "{} SGEs; at most {MAX_SGE}",
            wr.sges.len()
        )));
    }
    let len = wr.len();
    if len > MAX_MESSAGE {
        return Err(Error::invalid(format!(
            "message of {len} bytes exceeds the RC limit of {MAX_MESSAGE}"
        )));
    }
    Ok(len)
}

// The errors below are built out of line: the posting path stays short.

#[cold]
#[inline(never)]
fn not_inlinable(opcode: Opcode) -> Error {
    Error::invalid(format!("{opcode:?} cannot be inline"))
}

#[cold]
#[inline(never)]
fn too_large(ds: usize) -> Error {
    Error::invalid(format!(
        "work request needs {ds} DS; a WQE holds at most {MAX_WQE_DS}"
    ))
}

#[cold]
#[inline(never)]
fn inline_too_long(len: u64, max_inline: u32) -> Error {
    Error::invalid(format!(
        "{len} bytes inline; this QP takes at most {max_inline} (max_inline)"
    ))
}

#[cold]
#[inline(never)]
fn inline_outside(g: &Sge) -> Error {
    Error::invalid(format!(
        "inline SGE {:#x}+{} is not inside a region of this PD with lkey {:#x}",
        g.addr, g.len, g.lkey
    ))
}

/// The data segments of `wr` in `segs` (empty SGEs left out); returns those used. An atomic's
/// SGE receives the 8-byte old value, whatever length it names.
fn gather_list<'a>(wr: &SendWr, opcode: Opcode, segs: &'a mut [DataSeg; MAX_SGE]) -> &'a [DataSeg] {
    let atomic = opcode.is_atomic();
    let mut n = 0;
    for g in wr.sges.iter().filter(|g| g.len > 0 || atomic) {
        segs[n] = DataSeg::new(g.addr, if atomic { 8 } else { g.len }, g.lkey);
        n += 1;
    }
    &segs[..n]
}

/// The ctrl segment's fence, completion and solicited bits for the work request's flags.
fn fm_ce_se(f: SendFlags) -> FmCeSe {
    let mut flags = FmCeSe::empty();
    flags.set(FmCeSe::CQ_UPDATE, f.contains(SendFlags::SIGNALED));
    flags.set(FmCeSe::SOLICITED, f.contains(SendFlags::SOLICITED));
    flags.set(FmCeSe::FENCE, f.contains(SendFlags::FENCE));
    flags
}

/// Copies an inline send's payload from registered memory of the QP's PD into `buf`.
fn gather_inline<'b>(
    s: &QpShared,
    mrs: &RegionsRead,
    cache: &mut RegionCache,
    wr: &SendWr,
    len: u64,
    buf: &'b mut [u8],
) -> Result<&'b [u8]> {
    if len > s.cfg.max_inline as u64 {
        return Err(inline_too_long(len, s.cfg.max_inline));
    }
    let mut p = 0;
    for g in &wr.sges {
        let n = g.len as usize;
        let ok = mrs
            .get(cache, g.lkey)
            .is_some_and(|e| e.pd == s.pd && e.read(g.addr, &mut buf[p..p + n]));
        if !ok {
            return Err(inline_outside(g));
        }
        p += n;
    }
    Ok(&buf[..p])
}

/// Refuses an atomic on device `name` whose attributes `attr` say it has none (a HCA
/// reporting `IBV_ATOMIC_NONE` fails them, or returns byte-swapped values).
fn no_atomics(attr: &crate::provider::DeviceAttr, name: &str) -> Result<()> {
    if attr.atomics {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{name} does not execute atomics (atomic_cap is IBV_ATOMIC_NONE): use another device \
         for compare-and-swap and fetch-and-add, or RDMA reads and writes"
    )))
}

/// An atomic's operands, after checking its SGE (one, 8 bytes, for the old value) and its
/// remote address (8-byte aligned); `None` for other operations.
fn atomic_seg(wr: &SendWr) -> Result<Option<AtomicSeg>> {
    let (remote, seg) = match wr.op {
        WrOp::FetchAdd { remote, add } => (remote, AtomicSeg::new(add, 0)),
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (remote, AtomicSeg::new(swap, compare)),
        _ => return Ok(None),
    };
    if wr.sges.len() != 1 || wr.sges[0].len != 8 {
        return Err(Error::invalid(
            "an atomic takes exactly one 8-byte SGE for the old value",
        ));
    }
    if remote.addr % 8 != 0 {
        return Err(Error::invalid(
            "an atomic's remote address must be 8-byte aligned",
        ));
    }
    Ok(Some(seg))
}
