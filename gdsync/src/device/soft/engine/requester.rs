//! The requester: after a doorbell, reads the send ring as the HCA does and turns each WQE
//! into a message on the QP's link (requester steps 1 to 5 of `docs/soft-device.md`; step 6,
//! completion, is in [`completion`](super::completion)).

use super::super::wire::{flag, kind, PktHeader};
use super::direct_write::{direct_write, local_bytes};
use super::memory::sges_ok;
use super::memory::Seg;
use super::packets::packet_header;
use super::strict::{ctrl_complaint, inline_ds_agrees};
use super::{psn_le, BodyRef, Engine, OutWqe, QpContext, QpHw, WqeStep, MAX_QUEUED};
use crate::format::*;
use crate::mem::slot_off;
use crate::provider::{Access, MAX_MESSAGE};
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

/// The largest inline WQE the requester's lane takes: 4 blocks, room for 220 bytes inline
/// (the default `max_inline`) after the control and remote-address segments.
const INLINE_LANE_WQEBBS: usize = 4;

/// The WQE being started: its control segment, opcode, size and place in the ring.
#[derive(Clone, Copy)]
struct StartedWqe {
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
        let Some(q) = self.qps.get(qpn) else {
            return false;
        };
        // The next WQE slot is prefetched so that, when a doorbell comes, both lines travel
        // at once.
        q.hw.buf
            .prefetch(slot_off(q.hw.sq_off, q.sq.ci, q.hw.sq_cnt, WQEBB));
        let db = q.hw.doorbell();
        if db == q.sq.last_db && !q.sq.pending && !q.err {
            return false;
        }
        self.serve_qp(qpn, db)
    }

    /// [`poll_qp`](Self::poll_qp) after a doorbell, for a stalled ring or a QP in error
    /// (out of line: the look that finds nothing stays small).
    #[inline(never)]
    fn serve_qp(&mut self, qpn: u32, db: super::Doorbell) -> bool {
        let Some(q) = self.qps.get_mut(qpn) else {
            return false;
        };
        if q.cq_overrun && !q.err {
            // A CQE of this QP found its CQ overrun: the QP goes to error (the flushes that
            // follow are dropped as well while the CQ is in error).
            self.enter_error(qpn, None);
            return true;
        }
        // Receive ring of a QP in error: flush what is posted.
        let work = q.err && super::errors::flush_recv_ring(q);
        if db == q.sq.last_db && !q.sq.pending {
            return work;
        }
        if db != q.sq.last_db && !q.err {
            match super::strict::check_doorbell(&q.hw, db, q.sq.last_db, q.sq.rung_end) {
                Ok(end) => q.sq.rung_end = end,
                Err(why) => {
                    q.sq.last_db = db;
                    let (ci, pi) = (q.sq.ci, q.hw.sq_producer());
                    self.refuse(qpn, None, ci, pi, &why);
                    return true;
                }
            }
        }
        // A new doorbell names the last WQE posted, and so how far to go, as a ConnectX takes
        // it from the register; the doorbell record is read when the doorbell cannot say
        // (a QP picked up again, a doorbell of another shape).
        let rung = (db != q.sq.last_db && !q.sq.pending)
            .then(|| q.hw.doorbell_end(db, q.sq.last_db, q.sq.ci as u16))
            .flatten();
        q.sq.last_db = db;
        // (A QP in error needs no link: it flushes; its link may have been released. One
        // whose peer is gone fails what is posted: the steps find no link.)
        if q.link.is_none() && !q.err && !q.peer_gone {
            // Its link is being set up: work posted meanwhile waits for it under the
            // transport timeout, which starts now.
            if q.awaiting.is_some() && !q.sq.not_ready && q.hw.sq_producer() != q.sq.ci as u16 {
                q.sq.not_ready = true;
                q.sq.progressed = true;
            }
            q.sq.pending = true;
            return work;
        }
        if q.sq.retry_at.is_some() {
            q.sq.pending = true;
            return work;
        }
        let pi = rung.unwrap_or_else(|| q.hw.sq_producer());
        q.sq.pending = false;
        self.drain_send_ring(qpn, pi) || work
    }

    /// Starts the WQEs up to the send doorbell record `pi` while the link has room (the
    /// engine never reads past the record). Returns whether anything happened.
    fn drain_send_ring(&mut self, qpn: u32, pi: u16) -> bool {
        let mut work = false;
        loop {
            let Some((q, link)) = self.qp_and_link(qpn) else {
                return work;
            };
            let avail = pi.wrapping_sub(q.sq.ci as u16) as u32;
            if avail == 0 {
                break;
            }
            if avail > q.hw.sq_cnt {
                // The doorbell record claims more WQEs than the ring holds (or went backwards).
                if !q.err {
                    let ci = q.sq.ci;
                    self.malformed(qpn, None, ci, pi);
                }
                return true;
            }
            if link.is_some_and(|l| l.queue.len() >= MAX_QUEUED) {
                q.sq.pending = true;
                break;
            }
            // The WQE's first block, read whole at once: most WQEs end there.
            let mut first = [0u8; WQEBB];
            q.hw.buf.read(
                slot_off(q.hw.sq_off, q.sq.ci, q.hw.sq_cnt, WQEBB),
                &mut first,
            );
            let step = match self.common_at_once(qpn, avail, &first) {
                Some(step) => step,
                None => self.next_wqe(qpn, avail, &first),
            };
            match step {
                WqeStep::Advanced => work = true,
                WqeStep::Stalled => {
                    if let Some(q) = self.qps.get_mut(qpn) {
                        q.sq.pending = true;
                    }
                    break;
                }
                WqeStep::Stop => return true,
            }
        }
        work
    }

    /// Steps 2 to 5 in one straight line for the most common WQEs: a send or RDMA write,
    /// unfenced, on a QP not in error whose link is up with nothing queued, whose payload is
    /// inline ([`inline_at_once`](Self::inline_at_once)) or one segment of local memory
    /// ([`segment_at_once`](Self::segment_at_once)). They go out as
    /// [`next_wqe`](Self::next_wqe) would send them, with the checks that concern them.
    /// `None`, having changed nothing, for any other WQE or anything unusual about this one:
    /// the steps then take it (and report what is wrong with it).
    #[inline]
    fn common_at_once(&mut self, qpn: u32, avail: u32, first: &[u8; WQEBB]) -> Option<WqeStep> {
        let (q, link) = self.qp_and_link(qpn)?;
        let link = link?;
        if q.err || link.link.dead || !link.queue.is_empty() {
            return None;
        }
        let w = SendWqe::peek_common(first)?;
        // (Quietly: a malformed WQE is the steps' to report.)
        if !ctrl_in_place(&q.hw, &w.ctrl, q.sq.ci, avail)
            || wqebbs_for_ds(w.ctrl.ds() as usize) > INLINE_LANE_WQEBBS
            || w.ctrl.flags().fence_mode() != 0
        {
            return None;
        }
        match w.data {
            // (A ds count with room to spare is the steps' to report.)
            CommonData::Inline { at, len } if !inline_ds_agrees(w.ctrl.ds(), at, len) => None,
            CommonData::Inline { at, len } => self.inline_at_once(qpn, &w, at..at + len, first),
            CommonData::Segment(d) => self.segment_at_once(qpn, &w, Seg::of(d)),
        }
    }

    /// [`common_at_once`](Self::common_at_once) for an inline payload (the bytes `payload`
    /// of a WQE of up to [`INLINE_LANE_WQEBBS`] blocks): the WQE's packet is written straight
    /// into the link's ring (it names no local memory to check). `None` for a ring without
    /// room.
    fn inline_at_once(
        &mut self,
        qpn: u32,
        w: &CommonWqe,
        payload: std::ops::Range<usize>,
        first: &[u8; WQEBB],
    ) -> Option<WqeStep> {
        let (q, link) = self.qp_and_link(qpn)?;
        let link = link?;
        let (ctrl, opcode) = (&w.ctrl, w.opcode);
        let (sq_ci, nbb) = (q.sq.ci, wqebbs_for_ds(ctrl.ds() as usize));
        let mut wqe = [0u8; INLINE_LANE_WQEBBS * WQEBB];
        wqe[..WQEBB].copy_from_slice(first);
        if nbb > 1 {
            read_wqe(&q.hw, sq_ci + 1, &mut wqe[WQEBB..nbb * WQEBB]);
        }
        let payload = wqe.get(payload)?;
        let mut hdr = addressed(request_header(q, opcode, ctrl), w.raddr);
        hdr.msg_len = payload.len() as u32;
        if opcode == Opcode::RdmaWrite && direct_write(q, link, &hdr, payload) {
            complete_direct(q, ctrl, nbb as u32, hdr.msg_len);
            return Some(WqeStep::Advanced);
        }
        let h = packet_header(&hdr, 0, hdr.msg_len, hdr.msg_len);
        link.link
            .tx
            .try_push(&h, payload.len(), |buf| buf.copy_from_slice(payload))?;
        let len = hdr.msg_len;
        make_outstanding(q, ctrl, opcode, nbb as u32, sq_ci, len, SmallVec::new());
        q.sq.next_psn = q.sq.next_psn.wrapping_add(1);
        Some(WqeStep::Advanced)
    }

    /// [`common_at_once`](Self::common_at_once) for a payload in one segment `seg` of local
    /// memory (a WQE of one block): the segment is checked (step 3) and the message sent as
    /// [`start_message`](Self::start_message) sends it. `None` for a segment the checks
    /// refuse.
    fn segment_at_once(&mut self, qpn: u32, w: &CommonWqe, seg: Seg) -> Option<WqeStep> {
        let q = self.qps.get_mut(qpn)?;
        let li = q.link?;
        let (ctrl, opcode) = (&w.ctrl, w.opcode);
        let mut hdr = addressed(request_header(q, opcode, ctrl), w.raddr);
        let pd = q.hw.pd;
        self.mrc.sync(&self.mrs);
        if u64::from(seg.len) > MAX_MESSAGE
            || !sges_ok(&self.mrc.slots, pd, &[seg], Access::empty())
        {
            return None;
        }
        hdr.msg_len = seg.len;
        if opcode == Opcode::RdmaWrite
            && local_bytes(&self.mrc.slots, &seg)
                .is_some_and(|data| direct_write(q, &self.links[li], &hdr, data))
        {
            complete_direct(q, ctrl, 1, seg.len);
            return Some(WqeStep::Advanced);
        }
        make_outstanding(q, ctrl, opcode, 1, q.sq.ci, seg.len, SmallVec::new());
        q.sq.next_psn = q.sq.next_psn.wrapping_add(1);
        self.send(li, &hdr, BodyRef::Gather(&[seg]), pd);
        Some(WqeStep::Advanced)
    }

    /// Steps 2 to 5 for the WQE at the QP's send consumer index (`avail` WQEBBs exposed),
    /// whose `first` block is read.
    fn next_wqe(&mut self, qpn: u32, avail: u32, first: &[u8; WQEBB]) -> WqeStep {
        let Some(q) = self.qps.get_mut(qpn) else {
            return WqeStep::Stop;
        };
        let sq_ci = q.sq.ci;
        let pi = (sq_ci as u16).wrapping_add(avail as u16);
        // Most WQEs are one or two blocks: those stay on the stack. The rest of the WQE is
        // read once its control segment is checked.
        let (mut small, mut big) = ([0u8; 2 * WQEBB], Vec::new());
        small[..WQEBB].copy_from_slice(first);
        let ctrl = CtrlSeg::from_bytes(small[..SEG_SIZE].try_into().unwrap());
        let opcode = match check_ctrl(&q.hw, &ctrl, sq_ci, avail) {
            Ok(opcode) => opcode,
            Err(why) => {
                self.refuse(qpn, Some(&ctrl), sq_ci, pi, &why);
                return WqeStep::Stop;
            }
        };
        let at = StartedWqe {
            ctrl,
            opcode,
            nbb: wqebbs_for_ds(ctrl.ds() as usize) as u32,
            sq_ci,
            pi,
        };
        if q.err {
            super::errors::flush_wqe(&self.ctl, q, &at.ctrl, opcode, at.nbb);
            return WqeStep::Advanced;
        }
        if fenced(q, &ctrl) {
            return WqeStep::Stalled;
        }
        let len = at.nbb as usize * WQEBB;
        let wqe = if len <= small.len() {
            &mut small[..len]
        } else {
            big.resize(len, 0);
            big[..WQEBB].copy_from_slice(&small[..WQEBB]);
            &mut big[..]
        };
        if at.nbb > 1 {
            read_wqe(&q.hw, sq_ci + 1, &mut wqe[WQEBB..]);
        }
        let wqe = &wqe[..ctrl.ds() as usize * SEG_SIZE];
        let hdr = request_header(q, opcode, &ctrl);
        let req = match common_request(hdr, first, wqe) {
            Some(r) => r,
            None => match SendWqe::parse(wqe) {
                Ok(w) => decode(hdr, &w),
                Err(e) => {
                    let why = format!("the WQE at index {} cannot be read: {e}", sq_ci as u16);
                    self.refuse(qpn, Some(&ctrl), sq_ci, pi, &why);
                    return WqeStep::Stop;
                }
            },
        };
        if let Some(why) = inline_ds_disagrees(&ctrl, opcode, &req) {
            self.refuse(qpn, Some(&ctrl), sq_ci, pi, &why);
            return WqeStep::Stop;
        }
        if let Some(step) = self.local_checks(qpn, &at, &req) {
            return step;
        }
        self.start_message(qpn, &at, req)
    }

    /// Step 3, local checks: the length, an atomic's result segment, the lkeys (and that
    /// the link is up). A failure completes the WQE with an error and the QP goes to error.
    fn local_checks(&mut self, qpn: u32, at: &StartedWqe, req: &Request) -> Option<WqeStep> {
        let (ctrl, opcode, nbb) = (&at.ctrl, at.opcode, at.nbb);
        let Some(q) = self.qps.get(qpn) else {
            return Some(WqeStep::Stop);
        };
        let (pd, li) = (q.hw.pd, q.link);
        if req.len > MAX_MESSAGE {
            return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::LocalLength));
        }
        if opcode.is_atomic() && (req.sges.len() != 1 || req.sges[0].len != 8) {
            self.malformed(qpn, Some(ctrl), at.sq_ci, at.pi);
            return Some(WqeStep::Stop);
        }
        // (An inline payload names no local memory: nothing to look up.)
        if !req.sges.is_empty() {
            let need = if opcode.returns_data() {
                Access::LOCAL_WRITE
            } else {
                Access::empty()
            };
            self.mrc.sync(&self.mrs);
            if !sges_ok(&self.mrc.slots, pd, &req.sges, need) {
                return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::LocalProt));
            }
        }
        // (A QP not in error has a link: one released was dead.)
        if li.is_none_or(|li| self.links[li].link.dead) {
            return Some(self.fail_new(qpn, ctrl, opcode, nbb, Syndrome::TransportRetryExc));
        }
        None
    }

    /// Step 5, send: the WQE becomes outstanding and its message is queued on the link (a
    /// NOP completes at once, in order).
    fn start_message(&mut self, qpn: u32, at: &StartedWqe, req: Request<'_>) -> WqeStep {
        let Some(q) = self.qps.get_mut(qpn) else {
            return WqeStep::Stop;
        };
        let Some(li) = q.link else {
            return WqeStep::Stop;
        };
        let Request {
            mut hdr,
            inline,
            operands,
            mut sges,
            len,
        } = req;
        hdr.msg_len = len as u32;
        // Reads and atomics scatter what comes back into their segments; other requests
        // send their inline bytes or gather their segments.
        let returns_data = at.opcode.returns_data();
        let scatter = if returns_data {
            std::mem::take(&mut sges)
        } else {
            SmallVec::new()
        };
        make_outstanding(
            q, &at.ctrl, at.opcode, at.nbb, at.sq_ci, len as u32, scatter,
        );
        if at.opcode == Opcode::Nop {
            super::completion::complete_front(q);
            return WqeStep::Advanced;
        }
        q.sq.next_psn = q.sq.next_psn.wrapping_add(1);
        let pd = q.hw.pd;
        let body = match (&operands, inline) {
            (Some(ops), _) => BodyRef::Inline(ops),
            (None, Some(bytes)) => BodyRef::Inline(bytes),
            (None, None) if returns_data => BodyRef::Empty,
            (None, None) => BodyRef::Gather(&sges),
        };
        self.send(li, &hdr, body, pd);
        WqeStep::Advanced
    }

    /// Rewinds the requester to resend from outstanding WQE `k` after `delay`.
    pub(super) fn rewind(&mut self, qpn: u32, k: usize, delay: Duration) {
        let now = self.stamp();
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        let o = &q.sq.out[k];
        let (pos, psn) = (o.sq_pos, o.psn);
        q.sq.ci = pos;
        q.sq.next_psn = psn;
        q.sq.out.truncate(k);
        q.sq.retry_at = Some(now + delay);
        q.sq.pending = true;
        if let Some(li) = q.link {
            self.links[li].queue.retain(|j| {
                !(j.hdr.kind == kind::REQ
                    && j.hdr.src_qpn == qpn
                    && !psn_le(j.hdr.psn.wrapping_add(1), psn))
            });
        }
    }
}

/// Step 2, parse: the control segment's opcode if it is the one expected there (index, QPN,
/// a size within what the doorbell record exposes and a WQE can have) with an opcode this
/// model serves; else what is wrong.
fn check_ctrl(hw: &QpHw, ctrl: &CtrlSeg, sq_ci: u64, avail: u32) -> Result<Opcode, String> {
    if let Some(why) = ctrl_complaint(hw, ctrl, sq_ci, avail) {
        return Err(why);
    }
    ctrl.opcode().filter(|o| o.is_supported()).ok_or_else(|| {
        format!(
            "the WQE at index {} has opcode {:#x}, which this device does not serve",
            sq_ci as u16,
            ctrl.opcode_byte()
        )
    })
}

/// What is wrong with the ds count of a WQE with an inline payload (`req` read from it), if
/// anything: its units must end with the payload (see [`inline_ds_agrees`]).
fn inline_ds_disagrees(ctrl: &CtrlSeg, opcode: Opcode, req: &Request) -> Option<String> {
    let len = req.inline?.len();
    let at = SEG_SIZE * (1 + usize::from(opcode.has_raddr())) + 4;
    (!inline_ds_agrees(ctrl.ds(), at, len)).then(|| {
        format!(
            "the WQE at index {} has {} DS, but its inline payload of {len} bytes takes {}: the ds count disagrees with the segments; a ConnectX leaves this undefined",
            ctrl.wqe_index(),
            ctrl.ds(),
            (at + len).div_ceil(SEG_SIZE)
        )
    })
}

/// Whether the control segment is the one expected at `sq_ci` (index, QPN) with a size
/// within what the doorbell record exposes (`avail` blocks) and a WQE can have.
#[inline]
fn ctrl_in_place(hw: &QpHw, ctrl: &CtrlSeg, sq_ci: u64, avail: u32) -> bool {
    let ds = ctrl.ds() as usize;
    let nbb = wqebbs_for_ds(ds);
    ctrl.wqe_index() == sq_ci as u16
        && ctrl.qpn() == hw.qpn
        && ds != 0
        && nbb <= avail as usize
        && nbb <= MAX_WQE_WQEBBS
}

/// Step 5's bookkeeping: the `nbb`-block WQE at `sq_ci` becomes outstanding (a NOP done
/// at once; a read or atomic scatters its answer into `scatter`), and the consumer index
/// moves past it.
fn make_outstanding(
    q: &mut QpContext,
    ctrl: &CtrlSeg,
    opcode: Opcode,
    nbb: u32,
    sq_ci: u64,
    len: u32,
    scatter: SmallVec<[Seg; 2]>,
) {
    if q.sq.out.is_empty() && !q.sq.not_ready {
        // The transport timer starts with the first outstanding WQE.
        q.sq.progressed = true;
    }
    q.sq.out.push_back(OutWqe {
        psn: q.sq.next_psn,
        idx: ctrl.wqe_index(),
        sq_pos: sq_ci,
        opcode,
        signalled: ctrl.flags().signalled(),
        done: opcode == Opcode::Nop,
        len,
        got: 0,
        scatter,
    });
    q.sq.ci += u64::from(nbb);
}

/// An RDMA write of `len` bytes (`nbb` blocks) at the QP's consumer index was written directly
/// ([`direct_write`](super::direct_write)): it completes now, in order (nothing else is outstanding), and takes no PSN.
fn complete_direct(q: &mut QpContext, ctrl: &CtrlSeg, nbb: u32, len: u32) {
    let sq_ci = q.sq.ci;
    make_outstanding(q, ctrl, Opcode::RdmaWrite, nbb, sq_ci, len, SmallVec::new());
    q.sq.next_psn = q.sq.next_psn.wrapping_add(1);
    if let Some(o) = q.sq.out.back_mut() {
        o.done = true;
    }
    super::completion::complete_front(q);
}

/// Step 4, fence: a fenced WQE waits while an earlier read or atomic is outstanding.
fn fenced(q: &QpContext, ctrl: &CtrlSeg) -> bool {
    ctrl.flags().fence_mode() != 0 && q.sq.out.iter().any(|o| o.opcode.returns_data())
}

/// Step 2, parse: the WQE's blocks from the one at `sq_ci` (as many as `wqe` holds),
/// contiguous modulo the ring: one copy unless the WQE wraps.
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
fn request_header(q: &QpContext, opcode: Opcode, ctrl: &CtrlSeg) -> PktHeader {
    let mut hdr = PktHeader {
        kind: kind::REQ,
        op: opcode as u8,
        src_qpn: q.hw.qpn,
        dst_qpn: q.rqpn,
        psn: q.sq.next_psn,
        imm: ctrl.imm,
        ..Default::default()
    };
    if ctrl.flags().contains(FmCeSe::SOLICITED) {
        hdr.flags |= flag::SOLICITED;
    }
    hdr
}

/// `hdr` with the remote address and key of a WQE that names them.
#[inline]
fn addressed(mut hdr: PktHeader, raddr: Option<RaddrSeg>) -> PktHeader {
    if let Some(r) = raddr {
        hdr.raddr = r.raddr.get();
        hdr.rkey = r.rkey.get();
    }
    hdr
}

/// The message of the most common WQEs, a send or RDMA write (with or without immediate)
/// whose payload is inline or one segment of local memory, from its `first` block
/// ([`SendWqe::peek_common`]) and its `wqe` bytes (the `ds` units its control segment
/// counts), from `hdr` ([`request_header`]): what [`SendWqe::parse`] and [`decode`] make of
/// it, in a fraction of their work. `None` for anything else, which the full parse then
/// reads (and refuses with its errors).
#[inline]
fn common_request<'a>(hdr: PktHeader, first: &[u8; WQEBB], wqe: &'a [u8]) -> Option<Request<'a>> {
    let w = SendWqe::peek_common(first)?;
    let hdr = addressed(hdr, w.raddr);
    Some(match w.data {
        CommonData::Inline { at, len } => Request {
            hdr,
            inline: Some(wqe.get(at..at + len)?),
            operands: None,
            sges: SmallVec::new(),
            len: len as u64,
        },
        CommonData::Segment(d) => Request {
            hdr,
            inline: None,
            operands: None,
            sges: SmallVec::from_slice(&[Seg::of(d)]),
            len: d.byte_count.get().into(),
        },
    })
}

/// The message a parsed WQE sends (from `hdr`, [`request_header`]): its header, its payload
/// (inline bytes, atomic operands, or a gather list) and the local segments it names.
fn decode<'a>(hdr: PktHeader, w: &SendWqe<'a>) -> Request<'a> {
    let hdr = addressed(hdr, w.raddr);
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

    /// The message [`common_request`] makes of a WQE is the one [`decode`] makes of its full
    /// parse (that the fast look reads what the parse reads is checked beside the parse, in
    /// `format/wqe_tests.rs`).
    #[test]
    fn the_common_reader_makes_the_message_the_full_parse_makes() {
        let payload: Vec<u8> = (1..=60).collect();
        let seg = [DataSeg::new(0x1000_2000_3000, 4096, 0x55AA)];
        for opcode in [
            Opcode::Send,
            Opcode::SendImm,
            Opcode::RdmaWrite,
            Opcode::RdmaWriteImm,
        ] {
            for data in [
                WqeData::Inline(&payload[..1]),
                WqeData::Inline(&payload),
                WqeData::Gather(DataSegs::from_segs(&seg)),
            ] {
                let w = SendWqe {
                    wqe_index: 7,
                    opcode,
                    qpn: 0x12,
                    flags: FmCeSe::SOLICITED,
                    imm: [1, 2, 3, 4],
                    raddr: opcode
                        .has_raddr()
                        .then(|| RaddrSeg::new(0x1122_3344_5566_7788, 0xAABB)),
                    atomic: None,
                    data,
                };
                let mut bytes = vec![0u8; 4 * WQEBB];
                let ds = w.write_to(&mut bytes).unwrap();
                let first: [u8; WQEBB] = bytes[..WQEBB].try_into().unwrap();
                let bytes = &bytes[..ds * SEG_SIZE];
                let hdr = PktHeader {
                    kind: kind::REQ,
                    op: opcode as u8,
                    psn: 0x00AB_CDEF,
                    ..Default::default()
                };
                let fast = common_request(hdr, &first, bytes).expect("a common WQE");
                let full = decode(hdr, &SendWqe::parse(bytes).unwrap());
                let what = format!("{opcode:?}, {data:?}");
                assert_eq!(
                    format!("{:?}", fast.hdr),
                    format!("{:?}", full.hdr),
                    "{what}"
                );
                assert_eq!(fast.inline, full.inline, "{what}");
                assert_eq!(fast.sges[..], full.sges[..], "{what}");
                assert_eq!(
                    (fast.len, fast.operands),
                    (full.len, full.operands),
                    "{what}"
                );
            }
        }
    }
}
