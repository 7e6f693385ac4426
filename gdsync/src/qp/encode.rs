//! The encoder: a work request as the send WQE the HCA reads, written through
//! [`SendWqe::write_to`](crate::format::SendWqe::write_to), inline payload copied from
//! registered memory.

use super::{QpShared, MAX_MESSAGE, MAX_SGE};
use crate::context::{DeviceContext, HostRegion, KeyMap};
use crate::format::*;
use crate::wr::{RemoteAddr, SendFlags, SendWr, Sge, WrOp};
use crate::{Error, Result};

/// The host's record of registered regions, by lkey.
type Regions = KeyMap<HostRegion>;

/// Whether every SGE lies in a registered region of host memory (else it is left to the
/// encoder's own checks).
fn in_host_memory(mrs: &Regions, sges: &[Sge]) -> bool {
    sges.iter()
        .all(|g| mrs.get(&g.lkey).is_some_and(|e| e.gpu.is_none()))
}

/// Encodes `wr` as a WQE for producer index `sq_pi` into `out`; returns its ds count.
/// Inline payload is gathered into `inline` first.
pub(super) fn encode(
    s: &QpShared,
    ctx: &DeviceContext,
    sq_pi: u64,
    wr: &SendWr,
    out: &mut [u8],
    inline: &mut [u8],
) -> Result<usize> {
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
    let (opcode, remote, imm) = wr_opcode(&wr.op);
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
            && mrs.as_ref().is_some_and(|m| in_host_memory(m, &wr.sges)));
    if inline_it && !inlinable {
        return Err(Error::invalid(format!("{opcode:?} cannot be inline")));
    }
    let atomic = atomic_seg(wr)?;
    let segs: smallvec::SmallVec<[DataSeg; MAX_SGE]>;
    let data = if inline_it {
        let mrs = mrs
            .as_ref()
            .expect("the region table is read for inline sends");
        WqeData::Inline(gather_inline(s, mrs, wr, len, inline)?)
    } else {
        // An atomic's SGE receives the 8-byte old value, whatever length it names.
        segs = wr
            .sges
            .iter()
            .filter(|g| g.len > 0 || opcode.is_atomic())
            .map(|g| DataSeg::new(g.addr, if opcode.is_atomic() { 8 } else { g.len }, g.lkey))
            .collect();
        WqeData::Gather(DataSegs::from_segs(&segs))
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
    wqe.write_to(out).map_err(|e| match e {
        WqeError::TooLarge { ds } => Error::invalid(format!(
            "work request needs {ds} DS; a WQE holds at most {MAX_WQE_DS}"
        )),
        e => Error::invalid(e.to_string()),
    })
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
    mrs: &Regions,
    wr: &SendWr,
    len: u64,
    buf: &'b mut [u8],
) -> Result<&'b [u8]> {
    if len > s.cfg.max_inline as u64 {
        return Err(Error::invalid(format!(
            "{len} bytes inline; this QP takes at most {} (max_inline)",
            s.cfg.max_inline
        )));
    }
    let mut p = 0;
    for g in &wr.sges {
        let n = g.len as usize;
        let ok = mrs
            .get(&g.lkey)
            .is_some_and(|e| e.pd == s.pd && e.read(g.addr, &mut buf[p..p + n]));
        if !ok {
            return Err(Error::invalid(format!(
                "inline SGE {:#x}+{} is not inside a region of this PD with lkey {:#x}",
                g.addr, g.len, g.lkey
            )));
        }
        p += n;
    }
    Ok(&buf[..p])
}

/// The WQE opcode, remote address and immediate data of a work request.
fn wr_opcode(op: &WrOp) -> (Opcode, Option<RemoteAddr>, u32) {
    match *op {
        WrOp::Send => (Opcode::Send, None, 0),
        WrOp::SendImm(i) => (Opcode::SendImm, None, i),
        WrOp::Write(r) => (Opcode::RdmaWrite, Some(r), 0),
        WrOp::WriteImm(r, i) => (Opcode::RdmaWriteImm, Some(r), i),
        WrOp::Read(r) => (Opcode::RdmaRead, Some(r), 0),
        WrOp::FetchAdd { remote, .. } => (Opcode::AtomicFa, Some(remote), 0),
        WrOp::CompareSwap { remote, .. } => (Opcode::AtomicCs, Some(remote), 0),
        WrOp::Nop => (Opcode::Nop, None, 0),
    }
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
