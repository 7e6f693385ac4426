//! The requester: after a doorbell, reads the send ring as the HCA does and turns each WQE
//! into a message on the QP's link (requester steps 1 to 5 of `docs/soft-device.md`; step 6,
//! completion, is in [`completion`](super::completion)).

use super::super::link::{flag, kind, PktHeader};
use super::memory::sges_ok;
use super::memory::Seg;
use super::{psn_le, q_sq_ci, BodyRef, EQp, Engine, OutWqe, QpHw, Step, MAX_QUEUED};
use crate::device::provider::{Access, MAX_MESSAGE};
use crate::format::*;
use crate::mem::slot_off;
use smallvec::SmallVec;
use std::time::Duration;

/// A WQE read and decoded: the message it sends and the local memory it names. The
/// payload is borrowed from the WQE as read (inline bytes) or kept here (an atomic's
/// operands): it is copied again only if the message must wait for room on the link.
struct Request<'a> {
    hdr: PktHeader,
    inline: Option<&'a [u8]>,
    /// An atomic's operands (swap/add, then compare), its payload.
    operands: Option<[u8; 16]>,
    sges: SmallVec<[Seg; 2]>,
    len: u64,
}

/// The WQE being started: its control segment, opcode, size and place in the ring.
#[derive(Clone, Copy)]
struct At {
    ctrl: CtrlSeg,
    opcode: Opcode,
    nbb: u32,
    sq_ci: u64,
    /// The doorbell record's producer index (what a malformed WQE drops up to).
    pi: u16,
}

impl Engine {
    /// Step 1, doorbell: reads new WQEs of one QP after a doorbell, or resumes a stalled
    /// ring. The common case, nothing new, costs one load of the doorbell's cache line.
    #[inline]
    pub(super) fn poll_qp(&mut self, qpn: u32) -> bool {
        let Some(q) = self.qps[qpn as usize].as_ref() else {
            return false;
        };
        // The next WQE slot is prefetched so that, when a doorbell comes, both lines travel
        // at once.
        q.hw.buf
            .prefetch(slot_off(q.hw.sq_off, q.sq_ci, q.hw.sq_cnt, WQEBB));
        let db = q.hw.doorbell();
        if db == q.last_db && !q.pending && !q.err {
            return false;
        }
        self.serve_qp(qpn, db)
    }

    /// [`poll_qp`](Self::poll_qp) after a doorbell, for a stalled ring or a QP in error
    /// (out of line: the look that finds nothing stays small).
    #[inline(never)]
    fn serve_qp(&mut self, qpn: u32, db: [u64; 2]) -> bool {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        if q.cq_overrun && !q.err {
            // A CQE of this QP found its CQ overrun: the QP goes to error (the flushes that
            // follow are dropped as well while the CQ is in error).
            self.enter_error(qpn, None);
            return true;
        }
        // Receive ring of a QP in error: flush what is posted.
        let work = q.err && super::errors::flush_recv_ring(q);
        if db == q.last_db && !q.pending {
            return work;
        }
        // A new doorbell names the last WQE posted, and so how far to go, as a ConnectX takes
        // it from the register; the doorbell record is read when the doorbell cannot say
        // (a QP picked up again, a doorbell of another shape).
        let rung = (db != q.last_db && !q.pending)
            .then(|| q.hw.doorbell_end(db, q.last_db, q.sq_ci as u16))
            .flatten();
        q.last_db = db;
        if q.link.is_none() || q.retry_at.is_some() {
            q.pending = true;
            return work;
        }
        let pi = rung.unwrap_or_else(|| q.hw.sq_producer());
        q.pending = false;
        self.drain_send_ring(qpn, pi) || work
    }

    /// Starts the WQEs up to the send doorbell record `pi` while the link has room (the
    /// engine never reads past the record). Returns whether anything happened.
    fn drain_send_ring(&mut self, qpn: u32, pi: u16) -> bool {
        let sq_cnt = self.qps[qpn as usize].as_ref().unwrap().hw.sq_cnt;
        let mut work = false;
        loop {
            let avail = pi.wrapping_sub(q_sq_ci(&self.qps, qpn) as u16) as u32;
            if avail == 0 {
                break;
            }
            if avail > sq_cnt {
                // The doorbell record claims more WQEs than the ring holds (or went backwards).
                if !self.qps[qpn as usize].as_ref().unwrap().err {
                    self.malformed(qpn, None, q_sq_ci(&self.qps, qpn), pi);
                }
                return true;
            }
            let li = self.qps[qpn as usize].as_ref().unwrap().link.unwrap();
            if self.links[li].queue.len() >= MAX_QUEUED {
                self.qps[qpn as usize].as_mut().unwrap().pending = true;
                break;
            }
            match self.next_wqe(qpn, avail) {
                Step::Advanced => work = true,
                Step::Stalled => {
                    self.qps[qpn as usize].as_mut().unwrap().pending = true;
                    break;
                }
                Step::Stop => return true,
            }
        }
        work
    }

    /// Steps 2 to 5 for the WQE at the QP's send consumer index (`avail` WQEBBs exposed).
    fn next_wqe(&mut self, qpn: u32, avail: u32) -> Step {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let sq_ci = q.sq_ci;
        let pi = (sq_ci as u16).wrapping_add(avail as u16);
        let ctrl = read_ctrl(&q.hw, sq_ci);
        let Some(opcode) = check_ctrl(&q.hw, &ctrl, sq_ci, avail) else {
            self.malformed(qpn, Some(&ctrl), sq_ci, pi);
            return Step::Stop;
        };
        let at = At {
            ctrl,
            opcode,
            nbb: wqebbs_for_ds(ctrl.ds() as usize) as u32,
            sq_ci,
            pi,
        };
        if q.err {
            super::errors::flush_wqe(&self.ctl, q, &at.ctrl, opcode, at.nbb);
            return Step::Advanced;
        }
        if fenced(q, &ctrl) {
            return Step::Stalled;
        }
        // Most WQEs are one or two blocks: those stay on the stack.
        let (mut small, mut big) = ([0u8; 2 * WQEBB], Vec::new());
        let len = at.nbb as usize * WQEBB;
        let wqe = if len <= small.len() {
            &mut small[..len]
        } else {
            big.resize(len, 0);
            &mut big[..]
        };
        read_wqe(&q.hw, sq_ci, wqe);
        let wqe = &wqe[..ctrl.ds() as usize * SEG_SIZE];
        let hdr = request_header(q, opcode, &ctrl);
        let req = match inline_request(hdr, opcode, wqe) {
            Some(r) => r,
            None => match SendWqe::parse(wqe) {
                Ok(w) => decode(hdr, &w),
                Err(_) => {
                    self.malformed(qpn, Some(&ctrl), sq_ci, pi);
                    return Step::Stop;
                }
            },
        };
        if let Some(step) = self.local_checks(qpn, &at, &req) {
            return step;
        }
        self.start_message(qpn, &at, req)
    }

    /// Step 3, local checks: the length, an atomic's result segment, the lkeys (and that
    /// the link is up). A failure completes the WQE with an error and the QP goes to error.
    fn local_checks(&mut self, qpn: u32, at: &At, req: &Request) -> Option<Step> {
        let (ctrl, opcode, nbb) = (&at.ctrl, at.opcode, at.nbb);
        if req.len > MAX_MESSAGE {
            return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::LocalLength));
        }
        if opcode.is_atomic() && (req.sges.len() != 1 || req.sges[0].len != 8) {
            self.malformed(qpn, Some(ctrl), at.sq_ci, at.pi);
            return Some(Step::Stop);
        }
        let need = if opcode.returns_data() {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        let pd = self.qps[qpn as usize].as_ref().unwrap().hw.pd;
        self.mrc.sync(&self.mrs);
        if !sges_ok(&self.mrc.slots, pd, &req.sges, need) {
            return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::LocalProt));
        }
        let li = self.qps[qpn as usize].as_ref().unwrap().link.unwrap();
        if self.links[li].link.dead {
            return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::TransportRetryExc));
        }
        None
    }

    /// Step 5, send: the WQE becomes outstanding and its message is queued on the link (a
    /// NOP completes at once, in order).
    fn start_message(&mut self, qpn: u32, at: &At, req: Request<'_>) -> Step {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let li = q.link.unwrap();
        let Request {
            mut hdr,
            inline,
            operands,
            mut sges,
            len,
        } = req;
        hdr.msg_len = len as u32;
        let mut o = OutWqe {
            psn: q.next_psn,
            idx: at.ctrl.wqe_index(),
            sq_pos: at.sq_ci,
            opcode: at.opcode,
            signalled: at.ctrl.flags().signalled(),
            done: false,
            len: len as u32,
            got: 0,
            scatter: SmallVec::new(),
        };
        // Reads and atomics scatter what comes back into their segments; other requests
        // send their inline bytes or gather their segments.
        let returns_data = at.opcode.returns_data();
        if at.opcode == Opcode::Nop {
            o.done = true;
        } else if returns_data {
            o.scatter = std::mem::take(&mut sges);
        }
        if q.out.is_empty() && !q.not_ready {
            // The transport timer starts with the first outstanding WQE.
            q.progressed = true;
        }
        q.out.push_back(o);
        q.sq_ci += at.nbb as u64;
        if at.opcode == Opcode::Nop {
            super::completion::complete_front(q);
            return Step::Advanced;
        }
        q.next_psn = q.next_psn.wrapping_add(1);
        let pd = q.hw.pd;
        let body = match (&operands, inline) {
            (Some(ops), _) => BodyRef::Inline(ops),
            (None, Some(bytes)) => BodyRef::Inline(bytes),
            (None, None) if returns_data => BodyRef::Empty,
            (None, None) => BodyRef::Gather(&sges),
        };
        self.send(li, &hdr, body, pd);
        Step::Advanced
    }

    /// Rewinds the requester to resend from outstanding WQE `k` after `delay`.
    pub(super) fn rewind(&mut self, qpn: u32, k: usize, delay: Duration) {
        let now = self.stamp();
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let o = &q.out[k];
        let (pos, psn) = (o.sq_pos, o.psn);
        q.sq_ci = pos;
        q.next_psn = psn;
        q.out.truncate(k);
        q.retry_at = Some(now + delay);
        q.pending = true;
        if let Some(li) = q.link {
            self.links[li].queue.retain(|j| {
                !(j.hdr.kind == kind::REQ
                    && j.hdr.src_qpn == qpn
                    && !psn_le(j.hdr.psn.wrapping_add(1), psn))
            });
        }
    }
}

/// Step 2, parse (first half): the control segment at the consumer index.
fn read_ctrl(hw: &QpHw, sq_ci: u64) -> CtrlSeg {
    let mut b = [0u8; SEG_SIZE];
    hw.buf
        .read(slot_off(hw.sq_off, sq_ci, hw.sq_cnt, WQEBB), &mut b);
    CtrlSeg::from_bytes(&b)
}

/// Step 2, parse: whether the control segment is the one expected there (index, QPN, a
/// size within what the doorbell record exposes and a WQE can have) with an opcode this
/// model serves; the opcode if so.
fn check_ctrl(hw: &QpHw, ctrl: &CtrlSeg, sq_ci: u64, avail: u32) -> Option<Opcode> {
    let ds = ctrl.ds() as usize;
    let nbb = wqebbs_for_ds(ds) as u32;
    if ctrl.wqe_index() != sq_ci as u16
        || ctrl.qpn() != hw.qpn
        || ds == 0
        || nbb > avail
        || nbb as usize > MAX_WQE_WQEBBS
    {
        tracing::warn!(qpn = hw.qpn, ?ctrl, "malformed WQE");
        return None;
    }
    let opcode = ctrl.opcode().filter(|o| o.is_supported());
    if opcode.is_none() {
        tracing::warn!(
            qpn = hw.qpn,
            opcode = ctrl.opcode_byte(),
            "unsupported opcode"
        );
    }
    opcode
}

/// Step 4, fence: a fenced WQE waits while an earlier read or atomic is outstanding.
fn fenced(q: &EQp, ctrl: &CtrlSeg) -> bool {
    ctrl.flags().fence_mode() != 0 && q.out.iter().any(|o| o.opcode.returns_data())
}

/// Step 2, parse (second half): the WQE's blocks (as many as `wqe` holds), contiguous
/// modulo the ring: one copy unless the WQE wraps.
fn read_wqe(hw: &QpHw, sq_ci: u64, wqe: &mut [u8]) {
    let nbb = (wqe.len() / WQEBB) as u64;
    let first = slot_off(hw.sq_off, sq_ci, hw.sq_cnt, WQEBB);
    if slot_off(0, sq_ci, hw.sq_cnt, 1) as u64 + nbb <= u64::from(hw.sq_cnt) {
        hw.buf.read(first, wqe);
        return;
    }
    for (i, block) in wqe.chunks_exact_mut(WQEBB).enumerate() {
        hw.buf.read(
            slot_off(hw.sq_off, sq_ci + i as u64, hw.sq_cnt, WQEBB),
            block,
        );
    }
}

/// The header every request of QP `q` starts from: addressing, sequence number, the
/// solicited bit and the immediate, as the control segment `ctrl` of an `opcode` WQE says.
fn request_header(q: &EQp, opcode: Opcode, ctrl: &CtrlSeg) -> PktHeader {
    let mut hdr = PktHeader {
        kind: kind::REQ,
        op: opcode as u8,
        src_qpn: q.hw.qpn,
        dst_qpn: q.rqpn,
        psn: q.next_psn,
        imm: ctrl.imm,
        ..Default::default()
    };
    if ctrl.flags().contains(FmCeSe::SOLICITED) {
        hdr.flags |= flag::SOLICITED;
    }
    hdr
}

/// The most common request, a send or RDMA write (with or without immediate) whose payload
/// is inline, read straight off its WQE (the `ds` units its control segment counts), from
/// `hdr` ([`request_header`]): what [`SendWqe::parse`] and [`decode`] make of it, in a
/// fraction of their work, as every small message takes this path. `None` for anything
/// else, or anything unusual about it, which the full parse then reads (and refuses with
/// its errors).
#[inline]
fn inline_request(mut hdr: PktHeader, opcode: Opcode, wqe: &[u8]) -> Option<Request<'_>> {
    if !matches!(
        opcode,
        Opcode::Send | Opcode::SendImm | Opcode::RdmaWrite | Opcode::RdmaWriteImm
    ) {
        return None;
    }
    let mut at = SEG_SIZE;
    if opcode.has_raddr() {
        let seg = RaddrSeg::from_bytes(wqe.get(at..at + SEG_SIZE)?.try_into().ok()?);
        hdr.raddr = seg.raddr.get();
        hdr.rkey = seg.rkey.get();
        at += SEG_SIZE;
    }
    let word = u32::from_be_bytes(wqe.get(at..at + 4)?.try_into().ok()?);
    if word & INLINE_SEG_FLAG == 0 {
        return None;
    }
    let len = InlineHeader {
        byte_count: Be32::new(word),
    }
    .len() as usize;
    let payload = wqe.get(at + 4..at + 4 + len)?;
    Some(Request {
        hdr,
        inline: Some(payload),
        operands: None,
        sges: SmallVec::new(),
        len: len as u64,
    })
}

/// The message a parsed WQE sends (from `hdr`, [`request_header`]): its header, its payload
/// (inline bytes, atomic operands, or a gather list) and the local segments it names.
fn decode<'a>(mut hdr: PktHeader, w: &SendWqe<'a>) -> Request<'a> {
    if let Some(r) = w.raddr {
        hdr.raddr = r.raddr.get();
        hdr.rkey = r.rkey.get();
    }
    // Operands travel as the request's payload: swap/add, then compare.
    let operands = w.atomic.map(|a| {
        let mut ops = [0u8; 16];
        ops[..8].copy_from_slice(&a.swap_add.get().to_ne_bytes());
        ops[8..].copy_from_slice(&a.compare.get().to_ne_bytes());
        ops
    });
    let mut sges: SmallVec<[Seg; 2]> = SmallVec::new();
    let mut len: u64 = 0;
    let mut inline = None;
    match w.data {
        WqeData::Inline(p) => {
            inline = Some(p);
            len = p.len() as u64;
        }
        WqeData::Gather(segs) => {
            for d in segs.iter().filter(|d| d.byte_count.get() != 0) {
                sges.push(Seg::of(d));
                len += d.byte_count.get() as u64;
            }
        }
    }
    Request {
        hdr,
        inline,
        operands,
        sges,
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A base header with every field the WQE does not set made distinct.
    fn base(opcode: Opcode, ctrl: &CtrlSeg) -> PktHeader {
        PktHeader {
            kind: kind::REQ,
            op: opcode as u8,
            src_qpn: 0x12,
            dst_qpn: 0x34,
            psn: 0x00AB_CDEF,
            imm: ctrl.imm,
            flags: if ctrl.flags().contains(FmCeSe::SOLICITED) {
                flag::SOLICITED
            } else {
                0
            },
            ..Default::default()
        }
    }

    /// The fields of a request that go on the wire, comparable.
    fn wire(r: &Request<'_>) -> (Vec<u32>, Vec<u8>, Option<Vec<u8>>, u64, usize) {
        let h = &r.hdr;
        let fields = vec![
            h.kind.into(),
            h.op.into(),
            h.flags.into(),
            h.dst_qpn,
            h.src_qpn,
            h.psn,
            u32::from_ne_bytes(h.imm),
            h.rkey,
            h.raddr as u32,
            (h.raddr >> 32) as u32,
        ];
        (
            fields,
            r.operands.map(|o| o.to_vec()).unwrap_or_default(),
            r.inline.map(<[u8]>::to_vec),
            r.len,
            r.sges.len(),
        )
    }

    fn wqe_bytes(w: &SendWqe<'_>) -> (Vec<u8>, CtrlSeg) {
        let mut buf = vec![0u8; 4 * WQEBB];
        let ds = w.write_to(&mut buf).expect("a valid WQE");
        buf.truncate(ds * SEG_SIZE);
        let ctrl = CtrlSeg::from_bytes(buf[..SEG_SIZE].try_into().unwrap());
        (buf, ctrl)
    }

    #[test]
    fn the_inline_path_reads_what_the_full_parse_reads() {
        let payload: Vec<u8> = (1..=60).collect();
        for opcode in [
            Opcode::Send,
            Opcode::SendImm,
            Opcode::RdmaWrite,
            Opcode::RdmaWriteImm,
        ] {
            for len in 0..=60 {
                for flags in [FmCeSe::empty(), FmCeSe::SOLICITED | FmCeSe::CQ_UPDATE] {
                    let w = SendWqe {
                        wqe_index: 7,
                        opcode,
                        qpn: 0x12,
                        flags,
                        imm: [1, 2, 3, 4],
                        raddr: opcode
                            .has_raddr()
                            .then(|| RaddrSeg::new(0x1122_3344_5566_7788, 0xAABB)),
                        atomic: None,
                        data: WqeData::Inline(&payload[..len]),
                    };
                    let (bytes, ctrl) = wqe_bytes(&w);
                    let hdr = base(opcode, &ctrl);
                    let fast = inline_request(hdr, opcode, &bytes);
                    let full = decode(hdr, &SendWqe::parse(&bytes).unwrap());
                    if len == 0 {
                        // Written with no data segment at all: the full parse's to read.
                        assert!(fast.is_none(), "{opcode:?}, empty");
                        assert_eq!(full.len, 0);
                        continue;
                    }
                    let fast = fast.unwrap_or_else(|| panic!("{opcode:?}, {len} bytes"));
                    assert_eq!(wire(&fast), wire(&full), "{opcode:?}, {len} bytes");
                }
            }
        }
    }

    #[test]
    fn the_inline_path_leaves_everything_else_to_the_full_parse() {
        let seg = [DataSeg::new(0x1000, 8, 0x55)];
        let gather = SendWqe {
            wqe_index: 0,
            opcode: Opcode::RdmaWrite,
            qpn: 1,
            flags: FmCeSe::empty(),
            imm: [0; 4],
            raddr: Some(RaddrSeg::new(0x2000, 9)),
            atomic: None,
            data: WqeData::Gather(DataSegs::from_segs(&seg)),
        };
        let (bytes, ctrl) = wqe_bytes(&gather);
        assert!(
            inline_request(base(Opcode::RdmaWrite, &ctrl), Opcode::RdmaWrite, &bytes).is_none()
        );
        let read = SendWqe {
            opcode: Opcode::RdmaRead,
            ..gather
        };
        let (bytes, ctrl) = wqe_bytes(&read);
        assert!(inline_request(base(Opcode::RdmaRead, &ctrl), Opcode::RdmaRead, &bytes).is_none());

        // Malformed: an inline payload that runs past the WQE, and a write without its
        // remote-address segment. The full parse refuses both.
        let payload = [9u8; 20];
        let inline = SendWqe {
            data: WqeData::Inline(&payload),
            ..gather
        };
        let (bytes, ctrl) = wqe_bytes(&inline);
        let cut = &bytes[..bytes.len() - SEG_SIZE];
        let hdr = base(Opcode::RdmaWrite, &ctrl);
        assert!(inline_request(hdr, Opcode::RdmaWrite, cut).is_none());
        assert!(SendWqe::parse(cut).is_err());
        let ctrl_only = &bytes[..SEG_SIZE];
        assert!(inline_request(hdr, Opcode::RdmaWrite, ctrl_only).is_none());
    }
}
