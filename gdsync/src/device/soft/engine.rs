//! The engine: one thread per soft device, polling doorbells and links.
//!
//! Requester (per QP): a doorbell starts processing; the send doorbell record bounds it. Each
//! WQE is parsed from the send ring exactly as the HCA would read it, checked (index, QPN, ds,
//! opcode, local keys), and turned into a message on the QP's link. Work completes in order
//! when the responder has answered; signalled WQEs (and every error) write a CQE.
//!
//! Responder (per QP): messages arrive in sequence; the responder checks the rkey, bounds and
//! access rights (or takes the next receive WQE) before it touches memory, and answers with
//! an acknowledgement, read data, an atomic's old value, or a NAK.
//!
//! Errors put the QP in the error state: the failing WQE gets an error CQE, everything else
//! posted (send and receive) completes with WR_FLUSH.

use super::link::{flag, kind, Link, PktHeader, MTU};
use super::{Cmd, EngineCtl};
use crate::cq::CqShared;
use crate::format::*;
use crate::mem::slot_off;
use crate::mr::{Access, MrCache, MrTable, Slots};
use crate::qp::{QpShared, QpState, QP_DBREC, QP_DOORBELL};
use crate::wr::Sge;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Response codes (the `op` of a response packet).
pub(crate) mod resp {
    pub const ACK: u8 = 1;
    pub const NAK: u8 = 2;
    pub const READ: u8 = 3;
    pub const ATOMIC: u8 = 4;
}

/// NAK codes beyond the error syndromes: retry later.
const NAK_RNR: u8 = 0xF0;
/// The responder QP exists but is not connected yet (a real responder drops such packets
/// and the requester's transport retries; here the retry is explicit).
const NAK_NOT_READY: u8 = 0xF1;

/// Most messages queued on a link before a QP stops reading its send ring.
const MAX_QUEUED: usize = 256;
/// Retry delay after a NOT_READY NAK.
const NOT_READY_DELAY: Duration = Duration::from_millis(1);

/// A WQE the requester has started and not completed.
struct OutWqe {
    psn: u32,
    idx: u16,
    sq_pos: u64,
    opcode: Opcode,
    signalled: bool,
    done: bool,
    /// Read or atomic: total length and where results land.
    len: u32,
    got: u32,
    scatter: SmallVec<[Sge; 2]>,
}

/// A message being received (after its first packet was accepted).
struct InMsg {
    op: Opcode,
    len: u32,
    got: u32,
    solicited: bool,
    imm: [u8; 4],
    dest: Dest,
}

enum Dest {
    Memory { rkey: u32, addr: u64 },
    Recv { sges: SmallVec<[Sge; 4]> },
}

/// What a queued message sends as payload.
enum Body {
    Empty,
    Inline(SmallVec<[u8; 64]>),
    /// From local memory through the requester's lkeys.
    Gather(SmallVec<[Sge; 2]>),
    /// From local memory through an rkey (read responses).
    Memory {
        rkey: u32,
        addr: u64,
    },
}

struct TxJob {
    hdr: PktHeader,
    body: Body,
    pd: u32,
    sent: u32,
}

struct EQp {
    hw: Arc<QpShared>,
    link: Option<usize>,
    rqpn: u32,
    err: bool,
    // requester
    sq_ci: u64,
    last_db: u64,
    pending: bool,
    next_psn: u32,
    out: VecDeque<OutWqe>,
    rnr_left: u8,
    retry_at: Option<Instant>,
    progress_at: Instant,
    // responder
    exp_psn: u32,
    rq_ci: u64,
    inmsg: Option<InMsg>,
    /// After entering the error state with nothing outstanding (e.g. during an RNR wait):
    /// the syndrome the next WQE of the ring completes with, instead of WR_FLUSH.
    fail_next: Option<Syndrome>,
    /// The peer answered "not ready" and nothing else since: retries are not progress, so
    /// the QP's timeout keeps running across them.
    not_ready: bool,
}

struct ELink {
    link: Link,
    queue: VecDeque<TxJob>,
}

pub(crate) struct Engine {
    ctl: Arc<EngineCtl>,
    mrs: Arc<MrTable>,
    mrc: MrCache,
    qps: Vec<Option<EQp>>,
    active: Vec<u32>,
    links: Vec<ELink>,
    /// Coarse clock, refreshed every few dozen polling rounds (timeouts are milliseconds).
    now: Instant,
}

enum Emit {
    Done,
    Full,
    Fault,
}

fn psn_le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

impl Engine {
    pub(crate) fn new(ctl: Arc<EngineCtl>, mrs: Arc<MrTable>) -> Self {
        Self {
            ctl,
            mrs,
            mrc: MrCache::default(),
            qps: Vec::new(),
            active: Vec::new(),
            links: Vec::new(),
            now: Instant::now(),
        }
    }

    /// One polling round, as the NIC's processing loop: control commands, the region table,
    /// every QP's doorbell, every link (send, receive, send again), and on a `tick` the
    /// clock and the timers. Returns whether anything happened.
    pub(crate) fn round(&mut self, tick: bool) -> bool {
        if self.ctl.has_cmds.load(Ordering::Acquire) {
            self.commands();
        }
        // Between rounds: no region from an older table copy is in use.
        self.mrc.sync(&self.mrs);
        if tick {
            self.now = Instant::now();
        }
        let mut work = false;
        for i in 0..self.active.len() {
            work |= self.poll_qp(self.active[i]);
        }
        for li in 0..self.links.len() {
            // Send what the send rings produced before looking at the wire: a peek at
            // the receive ring may wait for a cache line the peer just wrote.
            work |= self.pump(li);
            work |= self.poll_link(li);
            work |= self.pump(li);
        }
        if tick {
            work |= self.timers(Instant::now());
        }
        work
    }

    /// The look before a nap (after `sleeping` was announced): whether a doorbell or a
    /// command arrived meanwhile.
    pub(crate) fn last_look(&mut self) -> bool {
        let mut again = false;
        for i in 0..self.active.len() {
            again |= self.poll_qp(self.active[i]);
        }
        again || self.ctl.has_cmds.load(Ordering::Acquire)
    }

    /// The calling thread is the engine's own: deregistrations wake it to see the new table.
    pub(crate) fn attach_thread(&self) {
        self.mrs.set_engine(Some(std::thread::current()));
    }

    /// The engine's thread ends: deregistrations have nobody to wait for.
    pub(crate) fn detach_thread(&self) {
        self.mrs.set_engine(None);
    }

    /// Drops every QP, link and queued packet (the device is gone).
    pub(crate) fn clear(&mut self) {
        self.qps.clear();
        self.active.clear();
        self.links.clear();
    }

    /// Refreshes the coarse clock (after a nap).
    pub(crate) fn touch_clock(&mut self) {
        self.now = Instant::now();
    }

    /// Whether a link leads to another process (whose engine nobody here can drive).
    pub(crate) fn has_remote_links(&self) -> bool {
        self.links.iter().any(|l| l.link.is_remote())
    }

    /// Whether the device holds regions in GPU memory (copies to them bind a CUDA context,
    /// so only the engine's own thread may run rounds).
    pub(crate) fn has_gpu_regions(&self) -> bool {
        self.mrs.has_gpu_regions()
    }

    fn commands(&mut self) {
        let cmds = std::mem::take(&mut *self.ctl.cmds.lock());
        self.ctl.has_cmds.store(false, Ordering::Release);
        for c in cmds {
            match c {
                Cmd::AddQp(hw) => {
                    let n = hw.qpn as usize;
                    if self.qps.len() <= n {
                        self.qps.resize_with(n + 1, || None);
                    }
                    let rnr = hw.cfg.rnr_retry;
                    self.qps[n] = Some(EQp {
                        hw,
                        link: None,
                        rqpn: 0,
                        err: false,
                        sq_ci: 0,
                        last_db: 0,
                        pending: false,
                        next_psn: 0,
                        out: VecDeque::new(),
                        rnr_left: rnr,
                        retry_at: None,
                        progress_at: self.now,
                        exp_psn: 0,
                        rq_ci: 0,
                        inmsg: None,
                        fail_next: None,
                        not_ready: false,
                    });
                    self.active.push(n as u32);
                }
                Cmd::RemoveQp(qpn) => {
                    if let Some(q) = self.qps.get_mut(qpn as usize).and_then(Option::take) {
                        if let Some(li) = q.link {
                            self.links[li].queue.retain(|j| j.hdr.src_qpn != qpn);
                        }
                    }
                    self.active.retain(|&n| n != qpn);
                }
                Cmd::Connect { qpn, peer, rqpn } => {
                    let li = self.links.iter().position(|l| l.link.peer == peer);
                    if let Some(q) = self.qps.get_mut(qpn as usize).and_then(Option::as_mut) {
                        q.link = li;
                        q.rqpn = rqpn;
                        q.pending = true;
                        if li.is_none() {
                            tracing::error!("soft device: connect of QP {qpn:#x}: no link to peer device {peer:016x}");
                        }
                    }
                }
                Cmd::AddLink(l) => self.links.push(ELink {
                    link: *l,
                    queue: VecDeque::new(),
                }),
            }
        }
    }

    // ------------------------------------------------------------------ requester

    /// Reads new WQEs of one QP (after a doorbell, or to resume a stalled ring).
    fn poll_qp(&mut self, qpn: u32) -> bool {
        let Some(q) = self.qps[qpn as usize].as_mut() else {
            return false;
        };
        // The common case, nothing new: one load of the doorbell's cache line. The next WQE
        // slot is prefetched so that, when a doorbell comes, both lines travel at once.
        q.hw.buf
            .prefetch(slot_off(q.hw.sq_off, q.sq_ci, q.hw.sq_cnt, WQEBB));
        let db = q.hw.ctrl.u64(QP_DOORBELL).load(Ordering::Acquire);
        if db == q.last_db && !q.pending && !q.err {
            return false;
        }
        let hw = &*q.hw;
        let mut work = false;
        // Receive ring of a QP in error: flush what is posted.
        if q.err {
            let rq_pi = rq_producer(hw);
            while rq_pi.wrapping_sub(q.rq_ci as u16) != 0 {
                let mut cqe = err_cqe(
                    CqeOpcode::RespErr,
                    Syndrome::WrFlush,
                    0,
                    hw.qpn,
                    q.rq_ci as u16,
                );
                push_cqe(&hw.recv_cq, &mut cqe);
                q.rq_ci += 1;
                work = true;
            }
        }
        if db == q.last_db && !q.pending {
            return work;
        }
        q.last_db = db;
        if q.link.is_none() || q.retry_at.is_some() {
            q.pending = true;
            return work;
        }
        let pi = u16::try_from(load_be32(hw, QP_DBREC + 4 * DBREC_SQ) & 0xFFFF).unwrap();
        let sq_cnt = hw.sq_cnt;
        q.pending = false;
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

    /// Parses and starts the WQE at the QP's send consumer index.
    fn next_wqe(&mut self, qpn: u32, avail: u32) -> Step {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let hw = &*q.hw;
        let sq_ci = q.sq_ci;
        let mut ctrl_b = [0u8; 16];
        hw.buf
            .read(slot_off(hw.sq_off, sq_ci, hw.sq_cnt, WQEBB), &mut ctrl_b);
        let ctrl = CtrlSeg::from_bytes(&ctrl_b);
        let ds = ctrl.ds() as usize;
        let nbb = wqebbs_for_ds(ds) as u32;
        let pi = (sq_ci as u16).wrapping_add(avail as u16);
        if ctrl.wqe_index() != sq_ci as u16
            || ctrl.qpn() != hw.qpn
            || ds == 0
            || nbb > avail
            || nbb as usize > MAX_WQE_WQEBBS
        {
            tracing::warn!(qpn, ?ctrl, "malformed WQE");
            self.malformed(qpn, Some(&ctrl), sq_ci, pi);
            return Step::Stop;
        }
        let signalled = ctrl.flags().signalled();
        let Some(opcode) = ctrl.opcode().filter(|o| o.is_supported()) else {
            tracing::warn!(qpn, opcode = ctrl.opcode_byte(), "unsupported opcode");
            self.malformed(qpn, Some(&ctrl), sq_ci, pi);
            return Step::Stop;
        };
        if q.err {
            // Flush: every WQE completes with WR_FLUSH, signalled or not.
            let mut cqe = err_cqe(
                CqeOpcode::ReqErr,
                q.fail_next.take().unwrap_or(Syndrome::WrFlush),
                opcode as u8,
                hw.qpn,
                ctrl.wqe_index(),
            );
            push_cqe(&hw.send_cq, &mut cqe);
            q.sq_ci += nbb as u64;
            return Step::Advanced;
        }
        // Fence: wait until earlier reads and atomics have completed.
        if ctrl.flags().fence_mode() != 0 && q.out.iter().any(|o| o.opcode.returns_data()) {
            return Step::Stalled;
        }
        // Most WQEs are one or two blocks: keep them on the stack, zero only what is read.
        let mut wqe: SmallVec<[u8; 2 * WQEBB]> = SmallVec::new();
        wqe.resize(nbb as usize * WQEBB, 0);
        for i in 0..nbb as u64 {
            let o = i as usize * WQEBB;
            hw.buf.read(
                slot_off(hw.sq_off, sq_ci + i, hw.sq_cnt, WQEBB),
                &mut wqe[o..o + WQEBB],
            );
        }
        let wqe = &wqe[..ds * SEG_SIZE];
        let bad = |e: &mut Self| {
            e.malformed(qpn, Some(&ctrl), sq_ci, pi);
            Step::Stop
        };
        let Ok(w) = SendWqe::parse(wqe) else {
            return bad(self);
        };
        let mut hdr = PktHeader {
            kind: kind::REQ,
            op: opcode as u8,
            src_qpn: hw.qpn,
            dst_qpn: q.rqpn,
            psn: q.next_psn,
            ..Default::default()
        };
        if w.flags.contains(FmCeSe::SOLICITED) {
            hdr.flags |= flag::SOLICITED;
        }
        hdr.imm = w.imm;
        if let Some(r) = w.raddr {
            hdr.raddr = r.raddr.get();
            hdr.rkey = r.rkey.get();
        }
        let mut body = Body::Empty;
        if let Some(a) = w.atomic {
            // Operands travel as the request's payload: swap/add, then compare.
            let mut ops = SmallVec::new();
            ops.extend_from_slice(&a.swap_add.get().to_ne_bytes());
            ops.extend_from_slice(&a.compare.get().to_ne_bytes());
            body = Body::Inline(ops);
        }
        let mut sges: SmallVec<[Sge; 2]> = SmallVec::new();
        let mut len: u64 = 0;
        match w.data {
            WqeData::Inline(p) => {
                body = Body::Inline(SmallVec::from_slice(p));
                len = p.len() as u64;
            }
            WqeData::Gather(segs) => {
                for d in segs.iter().filter(|d| d.byte_count.get() != 0) {
                    sges.push(Sge {
                        addr: d.addr.get(),
                        len: d.byte_count.get(),
                        lkey: d.lkey.get(),
                    });
                    len += d.byte_count.get() as u64;
                }
            }
        }
        if len > crate::qp::MAX_MESSAGE {
            return self.fail_new(qpn, &ctrl, opcode, nbb, Syndrome::LocalLength);
        }
        let writes_local = opcode.returns_data();
        if opcode.is_atomic() && (sges.len() != 1 || sges[0].len != 8) {
            return bad(self);
        }
        let need = if writes_local {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        let pd = hw.pd;
        self.mrc.sync(&self.mrs);
        if !sges_ok(&self.mrc.slots, pd, &sges, need) {
            return self.fail_new(qpn, &ctrl, opcode, nbb, Syndrome::LocalProt);
        }
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let li = q.link.unwrap();
        if self.links[li].link.dead {
            return self.fail_new(qpn, &ctrl, opcode, nbb, Syndrome::TransportRetryExc);
        }
        hdr.msg_len = len as u32;
        let mut o = OutWqe {
            psn: q.next_psn,
            idx: ctrl.wqe_index(),
            sq_pos: sq_ci,
            opcode,
            signalled,
            done: false,
            len: len as u32,
            got: 0,
            scatter: SmallVec::new(),
        };
        if opcode == Opcode::Nop {
            o.done = true;
        } else if writes_local {
            o.scatter = sges;
        } else if matches!(body, Body::Empty) {
            body = Body::Gather(sges);
        }
        if q.out.is_empty() && !q.not_ready {
            q.progress_at = self.now;
        }
        q.out.push_back(o);
        q.sq_ci += nbb as u64;
        if opcode != Opcode::Nop {
            q.next_psn = q.next_psn.wrapping_add(1);
            self.links[li].queue.push_back(TxJob {
                hdr,
                body,
                pd,
                sent: 0,
            });
        } else {
            complete_front(q, self.now);
        }
        Step::Advanced
    }

    /// A WQE the device cannot parse (or a doorbell record past the ring): error CQE with
    /// LOCAL_QP_OP, QP to error. After a bad WQE the rest of the ring up to the doorbell
    /// record is dropped (its WQEs cannot be trusted); after a bad doorbell record (`ctrl` is
    /// `None`) the consumer index stays, and later doorbells flush what follows it.
    fn malformed(&mut self, qpn: u32, ctrl: Option<&CtrlSeg>, sq_ci: u64, pi: u16) {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let hw = q.hw.clone();
        self.enter_error(qpn, None);
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let opcode = ctrl.map_or(0, |c| c.opcode_byte());
        let mut cqe = err_cqe(
            CqeOpcode::ReqErr,
            Syndrome::LocalQpOp,
            opcode,
            hw.qpn,
            sq_ci as u16,
        );
        push_cqe(&hw.send_cq, &mut cqe);
        if ctrl.is_some() {
            q.sq_ci += pi.wrapping_sub(sq_ci as u16) as u64;
        }
    }

    /// A WQE that fails before anything is sent: its error CQE, then QP to error.
    fn fail_new(
        &mut self,
        qpn: u32,
        ctrl: &CtrlSeg,
        opcode: Opcode,
        nbb: u32,
        s: Syndrome,
    ) -> Step {
        self.enter_error(qpn, None);
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let mut cqe = err_cqe(
            CqeOpcode::ReqErr,
            s,
            opcode as u8,
            q.hw.qpn,
            ctrl.wqe_index(),
        );
        push_cqe(&q.hw.send_cq, &mut cqe);
        q.sq_ci += nbb as u64;
        Step::Advanced
    }

    /// Moves a QP to the error state because its first unfinished WQE failed with `s`: the
    /// oldest outstanding one, or, when none is outstanding (an RNR wait rewound them), the
    /// next one in the send ring.
    fn fail_first(&mut self, qpn: u32, s: Syndrome) {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        complete_front(q, self.now);
        match q.out.front().map(|o| o.psn) {
            Some(psn) => self.enter_error(qpn, Some((psn, s))),
            None => {
                if !q.err {
                    q.fail_next = Some(s);
                }
                self.enter_error(qpn, None);
            }
        }
    }

    /// Moves a QP to the error state. Completed work at the front completes normally; the
    /// outstanding WQE with `failed` = (psn, syndrome) gets that error, the others WR_FLUSH.
    fn enter_error(&mut self, qpn: u32, failed: Option<(u32, Syndrome)>) {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        if q.err {
            return;
        }
        complete_front(q, self.now);
        q.err = true;
        q.hw.state.store(QpState::Error as u8, Ordering::Release);
        q.inmsg = None;
        q.retry_at = None;
        q.pending = true;
        while let Some(o) = q.out.pop_front() {
            let s = match failed {
                Some((psn, s)) if psn == o.psn => s,
                _ => Syndrome::WrFlush,
            };
            let mut cqe = err_cqe(CqeOpcode::ReqErr, s, o.opcode as u8, q.hw.qpn, o.idx);
            push_cqe(&q.hw.send_cq, &mut cqe);
        }
        if let Some(li) = q.link {
            self.links[li]
                .queue
                .retain(|j| !(j.hdr.kind == kind::REQ && j.hdr.src_qpn == qpn));
        }
        // (The host logs the error completion with its syndrome; this marks the transition.)
        tracing::debug!("soft device: QP {qpn:#x} to the error state");
    }

    /// Rewinds the requester to resend from outstanding WQE `k` after `delay`.
    fn rewind(&mut self, qpn: u32, k: usize, delay: Duration) {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let o = &q.out[k];
        let (pos, psn) = (o.sq_pos, o.psn);
        q.sq_ci = pos;
        q.next_psn = psn;
        q.out.truncate(k);
        q.retry_at = Some(self.now + delay);
        q.pending = true;
        if let Some(li) = q.link {
            self.links[li].queue.retain(|j| {
                !(j.hdr.kind == kind::REQ
                    && j.hdr.src_qpn == qpn
                    && !psn_le(j.hdr.psn.wrapping_add(1), psn))
            });
        }
    }

    // ------------------------------------------------------------------ links

    fn poll_link(&mut self, li: usize) -> bool {
        let mut n = 0;
        while let Some((h, payload)) = self.links[li].link.rx.peek() {
            // The payload borrows the ring: copy small headers, hand the slice down.
            let payload: *const [u8] = payload;
            // SAFETY: the record stays valid until pop() below; nothing else touches the ring.
            let payload = unsafe { &*payload };
            if h.kind == kind::REQ {
                self.on_request(li, &h, payload);
            } else {
                self.on_response(li, &h, payload);
            }
            self.links[li].link.rx.pop(&h);
            n += 1;
            if n == 64 {
                break;
            }
        }
        n > 0
    }

    /// Sends queued packets while the ring has room.
    fn pump(&mut self, li: usize) -> bool {
        if self.links[li].queue.is_empty() {
            return false;
        }
        let mut work = false;
        self.mrc.sync(&self.mrs);
        loop {
            // Borrowed, not cloned: a clone's reference count is a line every helper thread
            // would write.
            let slots = &*self.mrc.slots;
            let link = &mut self.links[li];
            let Some(job) = link.queue.front_mut() else {
                break;
            };
            match emit(job, &mut link.link.tx, slots) {
                Emit::Done => {
                    link.queue.pop_front();
                    work = true;
                }
                Emit::Full => break,
                Emit::Fault => {
                    let job = link.queue.pop_front().unwrap();
                    work = true;
                    if job.hdr.kind == kind::REQ {
                        // A requester's lkey vanished under a posted WQE.
                        let (qpn, psn) = (job.hdr.src_qpn, job.hdr.psn);
                        if self.qps.get(qpn as usize).is_some_and(Option::is_some) {
                            self.enter_error(qpn, Some((psn, Syndrome::LocalProt)));
                            return true;
                        }
                    } else {
                        // A read response's region was deregistered: NAK instead.
                        link.queue
                            .push_front(nak(&job.hdr, Syndrome::RemoteAccess as u8));
                    }
                }
            }
        }
        work
    }

    // ------------------------------------------------------------------ responder

    fn on_request(&mut self, li: usize, h: &PktHeader, payload: &[u8]) {
        let qpn = h.dst_qpn;
        if self.qps.get(qpn as usize).is_none_or(Option::is_none)
            && self.ctl.has_cmds.load(Ordering::Acquire)
        {
            self.commands();
        }
        let Some(q) = self.qps.get_mut(qpn as usize).and_then(Option::as_mut) else {
            self.links[li]
                .queue
                .push_back(nak(h, Syndrome::TransportRetryExc as u8));
            return;
        };
        if q.link.is_none() {
            self.links[li].queue.push_back(nak(h, NAK_NOT_READY));
            return;
        }
        if q.link != Some(li) || q.rqpn != h.src_qpn || q.err {
            self.links[li]
                .queue
                .push_back(nak(h, Syndrome::TransportRetryExc as u8));
            return;
        }
        if h.psn != q.exp_psn {
            return; // after a NAK: dropped until the requester resends this psn
        }
        let hw = &*q.hw;
        let Some(op) = Opcode::from_u8(h.op) else {
            self.links[li]
                .queue
                .push_back(nak(h, Syndrome::RemoteInvalReq as u8));
            return;
        };
        self.mrc.sync(&self.mrs);
        let slots = &*self.mrc.slots;
        if h.offset == 0 {
            q.inmsg = None;
            let remote_ok = |need: Access, len: u64| {
                slots.get(h.rkey).is_some_and(|e| {
                    e.pd == hw.pd && e.access.contains(need) && e.covers(h.raddr, len)
                })
            };
            let rq_ci = q.rq_ci as u16;
            let rq_ready = || rq_producer(hw).wrapping_sub(rq_ci) != 0;
            let dest = match op {
                Opcode::RdmaWrite | Opcode::RdmaWriteImm => {
                    if op.consumes_recv() && !rq_ready() {
                        self.links[li].queue.push_back(nak(h, NAK_RNR));
                        return;
                    }
                    if !remote_ok(Access::REMOTE_WRITE, h.msg_len as u64) {
                        self.links[li]
                            .queue
                            .push_back(nak(h, Syndrome::RemoteAccess as u8));
                        return;
                    }
                    Dest::Memory {
                        rkey: h.rkey,
                        addr: h.raddr,
                    }
                }
                Opcode::Send | Opcode::SendImm => {
                    if !rq_ready() {
                        self.links[li].queue.push_back(nak(h, NAK_RNR));
                        return;
                    }
                    let sges = read_recv_wqe(hw, q.rq_ci);
                    let cap: u64 = sges.iter().map(|s| s.len as u64).sum();
                    let (resp_err, to_requester) =
                        if !sges_ok(slots, hw.pd, &sges, Access::LOCAL_WRITE) {
                            (Some(Syndrome::LocalProt), Syndrome::RemoteOp)
                        } else if h.msg_len as u64 > cap {
                            (Some(Syndrome::LocalLength), Syndrome::RemoteInvalReq)
                        } else {
                            (None, Syndrome::RemoteOp)
                        };
                    if let Some(s) = resp_err {
                        self.responder_error(qpn, s);
                        self.links[li].queue.push_back(nak(h, to_requester as u8));
                        return;
                    }
                    Dest::Recv { sges }
                }
                Opcode::RdmaRead => {
                    if !remote_ok(Access::REMOTE_READ, h.msg_len as u64) {
                        self.links[li]
                            .queue
                            .push_back(nak(h, Syndrome::RemoteAccess as u8));
                        return;
                    }
                    q.exp_psn = q.exp_psn.wrapping_add(1);
                    let mut r = reply(h, resp::READ);
                    r.msg_len = h.msg_len;
                    self.links[li].queue.push_back(TxJob {
                        hdr: r,
                        body: Body::Memory {
                            rkey: h.rkey,
                            addr: h.raddr,
                        },
                        pd: hw.pd,
                        sent: 0,
                    });
                    return;
                }
                Opcode::AtomicCs | Opcode::AtomicFa => {
                    if payload.len() < 16 {
                        self.links[li]
                            .queue
                            .push_back(nak(h, Syndrome::RemoteInvalReq as u8));
                        return;
                    }
                    let operand =
                        |i: usize| u64::from_ne_bytes(payload[i..i + 8].try_into().unwrap());
                    let (swap_add, compare) = (operand(0), operand(8));
                    if h.raddr % 8 != 0 || !remote_ok(Access::REMOTE_ATOMIC, 8) {
                        self.links[li]
                            .queue
                            .push_back(nak(h, Syndrome::RemoteAccess as u8));
                        return;
                    }
                    let e = slots.get(h.rkey).unwrap();
                    let Some(old) = e.atomic(h.raddr, |old| {
                        if op == Opcode::AtomicFa {
                            old.wrapping_add(swap_add)
                        } else if old == compare {
                            swap_add
                        } else {
                            old
                        }
                    }) else {
                        self.links[li]
                            .queue
                            .push_back(nak(h, Syndrome::RemoteOp as u8));
                        return;
                    };
                    q.exp_psn = q.exp_psn.wrapping_add(1);
                    self.links[li].queue.push_back(TxJob {
                        hdr: reply(h, resp::ATOMIC),
                        body: Body::Inline(SmallVec::from_slice(&old.to_ne_bytes())),
                        pd: hw.pd,
                        sent: 0,
                    });
                    return;
                }
                _ => {
                    self.links[li]
                        .queue
                        .push_back(nak(h, Syndrome::RemoteInvalReq as u8));
                    return;
                }
            };
            q.inmsg = Some(InMsg {
                op,
                len: h.msg_len,
                got: 0,
                solicited: h.flags & flag::SOLICITED != 0,
                imm: h.imm,
                dest,
            });
        }
        let Some(m) = q.inmsg.as_mut() else { return };
        if h.offset != m.got || payload.len() as u64 > (m.len - m.got) as u64 {
            return;
        }
        let ok = match &m.dest {
            Dest::Memory { rkey, addr } => {
                let a = addr + m.got as u64;
                slots
                    .get(*rkey)
                    .is_some_and(|e| e.access.contains(Access::REMOTE_WRITE) && e.write(a, payload))
            }
            Dest::Recv { sges } => scatter(slots, hw.pd, sges, m.got as u64, payload),
        };
        if !ok {
            let recv = matches!(m.dest, Dest::Recv { .. });
            q.inmsg = None;
            if recv {
                self.responder_error(qpn, Syndrome::LocalProt);
                self.links[li]
                    .queue
                    .push_back(nak(h, Syndrome::RemoteOp as u8));
            } else {
                self.links[li]
                    .queue
                    .push_back(nak(h, Syndrome::RemoteAccess as u8));
            }
            return;
        }
        m.got += payload.len() as u32;
        if m.got < m.len {
            return;
        }
        let m = q.inmsg.take().unwrap();
        if let Some(op) = m.op.responder_cqe() {
            let mut cqe = Cqe64([0; 64]);
            cqe.set_byte_cnt(m.len);
            if m.op.has_imm() {
                cqe.set_imm(m.imm);
            }
            cqe.set_flags_rqpn(h.src_qpn & 0xFF_FFFF);
            cqe.set_sop_drop_qpn(hw.qpn);
            cqe.set_wqe_counter(q.rq_ci as u16);
            cqe.set_op_own(op, m.solicited, 0);
            push_cqe(&hw.recv_cq, &mut cqe);
            q.rq_ci += 1;
        }
        q.exp_psn = q.exp_psn.wrapping_add(1);
        self.links[li].queue.push_back(TxJob {
            hdr: reply(h, resp::ACK),
            body: Body::Empty,
            pd: 0,
            sent: 0,
        });
    }

    /// A responder-side error on the receive at the head of the receive ring: its error
    /// CQE, then the QP to error.
    fn responder_error(&mut self, qpn: u32, s: Syndrome) {
        let q = self.qps[qpn as usize].as_mut().unwrap();
        let mut cqe = err_cqe(CqeOpcode::RespErr, s, 0, q.hw.qpn, q.rq_ci as u16);
        push_cqe(&q.hw.recv_cq, &mut cqe);
        q.rq_ci += 1;
        self.enter_error(qpn, None);
    }

    // ------------------------------------------------------------------ responses

    fn on_response(&mut self, li: usize, h: &PktHeader, payload: &[u8]) {
        let qpn = h.dst_qpn;
        let Some(q) = self.qps.get_mut(qpn as usize).and_then(Option::as_mut) else {
            return;
        };
        if q.err || q.link != Some(li) || q.rqpn != h.src_qpn {
            return;
        }
        if !(h.op == resp::NAK && h.syndrome == NAK_NOT_READY) {
            q.progress_at = self.now;
            q.not_ready = false;
        }
        match h.op {
            resp::ACK => {
                for o in q.out.iter_mut() {
                    if !psn_le(o.psn, h.psn) {
                        break;
                    }
                    if !o.opcode.returns_data() {
                        o.done = true;
                    }
                }
                q.rnr_left = q.hw.cfg.rnr_retry;
                complete_front(q, self.now);
            }
            resp::READ | resp::ATOMIC => {
                let pd = q.hw.pd;
                let Some(o) = q.out.iter_mut().find(|o| o.psn == h.psn && !o.done) else {
                    return;
                };
                self.mrc.sync(&self.mrs);
                let slots = self.mrc.slots.clone();
                let ok = if h.op == resp::READ {
                    h.offset == o.got && scatter(&slots, pd, &o.scatter, h.offset as u64, payload)
                } else {
                    payload.len() == 8 && scatter(&slots, pd, &o.scatter, 0, payload)
                };
                drop(slots);
                if !ok {
                    let psn = o.psn;
                    self.enter_error(qpn, Some((psn, Syndrome::LocalProt)));
                    return;
                }
                o.got += payload.len() as u32;
                if h.op == resp::ATOMIC || o.got >= o.len {
                    o.done = true;
                }
                q.rnr_left = q.hw.cfg.rnr_retry;
                complete_front(q, self.now);
            }
            resp::NAK => {
                let Some(k) = q.out.iter().position(|o| o.psn == h.psn) else {
                    return;
                };
                match h.syndrome {
                    NAK_RNR if q.rnr_left > 0 => {
                        if q.rnr_left != u8::MAX {
                            q.rnr_left -= 1;
                        }
                        let t = q.hw.cfg.rnr_timer;
                        self.rewind(qpn, k, t);
                    }
                    NAK_RNR => self.enter_error(qpn, Some((h.psn, Syndrome::RnrRetryExc))),
                    NAK_NOT_READY => {
                        // Not progress: the QP's timeout keeps running.
                        q.not_ready = true;
                        self.rewind(qpn, k, NOT_READY_DELAY);
                    }
                    s => {
                        let s = Syndrome::from_u8(s).unwrap_or(Syndrome::RemoteOp);
                        self.enter_error(qpn, Some((h.psn, s)));
                    }
                }
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------------ timers

    fn timers(&mut self, now: Instant) -> bool {
        let mut work = false;
        for li in 0..self.links.len() {
            if !self.links[li].link.dead && !self.links[li].link.check_alive(now) {
                let (peer, why) = (self.links[li].link.peer, self.links[li].link.down_reason());
                // A peer that dropped its device closed the link in order; anything else
                // (a process that died, a failed connection) is a fault.
                if self.links[li].link.peer_closed() {
                    tracing::debug!("soft device: link to peer device {peer:016x} closed ({why})");
                } else {
                    tracing::warn!("soft device: link to peer device {peer:016x} is down ({why}): its QPs fail with transport retries exceeded");
                }
                self.links[li].queue.clear();
                for i in 0..self.active.len() {
                    let qpn = self.active[i];
                    let q = self.qps[qpn as usize].as_ref().unwrap();
                    if q.link == Some(li) && !q.err {
                        self.fail_first(qpn, Syndrome::TransportRetryExc);
                        work = true;
                    }
                }
            }
        }
        for i in 0..self.active.len() {
            let qpn = self.active[i];
            let q = self.qps[qpn as usize].as_mut().unwrap();
            if q.retry_at.is_some_and(|t| now >= t) {
                q.retry_at = None;
                q.pending = true;
                work = true;
            }
            let waiting = !q.out.is_empty() || q.not_ready;
            // The stamp comes from the coarse clock (up to ~64 rounds old): one
            // millisecond of slack so the timeout never fires early.
            if !q.err
                && waiting
                && now.duration_since(q.progress_at) > q.hw.cfg.timeout + Duration::from_millis(1)
            {
                tracing::warn!(
                    "soft device: QP {qpn:#x}: no answer from peer QP {:#x} within {:?}: transport retries exceeded",
                    q.rqpn,
                    q.hw.cfg.timeout
                );
                self.fail_first(qpn, Syndrome::TransportRetryExc);
                work = true;
            }
        }
        work
    }
}

enum Step {
    Advanced,
    Stalled,
    Stop,
}

fn q_sq_ci(qps: &[Option<EQp>], qpn: u32) -> u64 {
    qps[qpn as usize].as_ref().unwrap().sq_ci
}

fn load_be32(hw: &QpShared, off: usize) -> u32 {
    crate::mem::load_be32(&hw.ctrl, off)
}

fn rq_producer(hw: &QpShared) -> u16 {
    (load_be32(hw, QP_DBREC + 4 * DBREC_RQ) & 0xFFFF) as u16
}

/// Largest receive WQE stride (16 scatter entries).
const MAX_RQ_STRIDE: usize = crate::qp::MAX_SGE * SEG_SIZE;

/// The scatter list of the receive WQE at `rq_ci`: data segments up to the terminator or
/// the end of the stride (zero-length ones skipped).
fn read_recv_wqe(hw: &QpShared, rq_ci: u64) -> SmallVec<[Sge; 4]> {
    let stride = (hw.rq_stride as usize).min(MAX_RQ_STRIDE);
    let mut slot = [0u8; MAX_RQ_STRIDE];
    hw.buf.read(
        slot_off(0, rq_ci, hw.rq_cnt, hw.rq_stride as usize),
        &mut slot[..stride],
    );
    let segs = RecvWqe::parse(&slot[..stride]).map_or(DataSegs::EMPTY, |w| w.segs);
    segs.iter()
        .filter(|d| d.byte_count.get() > 0)
        .map(|d| Sge {
            addr: d.addr.get(),
            len: d.byte_count.get(),
            lkey: d.lkey.get(),
        })
        .collect()
}

/// Whether every SGE lies in a region of `pd` with `need` rights.
fn sges_ok(slots: &Slots, pd: u32, sges: &[Sge], need: Access) -> bool {
    sges.iter().all(|s| {
        slots.get(s.lkey).is_some_and(|e| {
            e.pd == pd && e.access.contains(need) && e.covers(s.addr, s.len as u64)
        })
    })
}

/// Copies `src` into the scatter list at message offset `off`.
fn scatter(slots: &Slots, pd: u32, sges: &[Sge], mut off: u64, mut src: &[u8]) -> bool {
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
fn gather(slots: &Slots, pd: u32, sges: &[Sge], mut off: u64, mut dst: &mut [u8]) -> bool {
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

fn body_len(j: &TxJob) -> u32 {
    match &j.body {
        Body::Empty => 0,
        Body::Inline(b) => b.len() as u32,
        Body::Gather(_) | Body::Memory { .. } => j.hdr.msg_len,
    }
}

/// Sends the packets of one queued message while the ring has room.
fn emit(job: &mut TxJob, tx: &mut super::link::Producer, slots: &Slots) -> Emit {
    let total = body_len(job);
    loop {
        let seg = (total - job.sent).min(MTU as u32);
        let mut h = job.hdr;
        h.offset = job.sent;
        h.seg_len = seg;
        if job.sent == 0 {
            h.flags |= flag::FIRST;
        }
        if job.sent + seg == total {
            h.flags |= flag::LAST;
        }
        let off = job.sent as u64;
        let pd = job.pd;
        let body = &job.body;
        let r = tx.try_push(&h, seg as usize, |buf| match body {
            Body::Empty => true,
            Body::Inline(b) => {
                buf.copy_from_slice(&b[off as usize..off as usize + buf.len()]);
                true
            }
            Body::Gather(sges) => gather(slots, pd, sges, off, buf),
            Body::Memory { rkey, addr } => {
                let a = addr + off;
                slots
                    .get(*rkey)
                    .is_some_and(|e| e.access.contains(Access::REMOTE_READ) && e.read(a, buf))
            }
        });
        match r {
            None => return Emit::Full,
            Some(false) => return Emit::Fault,
            Some(true) => {}
        }
        job.sent += seg;
        if job.sent >= total {
            return Emit::Done;
        }
    }
}

fn reply(h: &PktHeader, op: u8) -> PktHeader {
    PktHeader {
        kind: kind::RESP,
        op,
        dst_qpn: h.src_qpn,
        src_qpn: h.dst_qpn,
        psn: h.psn,
        ..Default::default()
    }
}

fn nak(h: &PktHeader, code: u8) -> TxJob {
    let mut r = reply(h, resp::NAK);
    if h.kind == kind::RESP {
        // Turning a read response into a NAK: it keeps the requester's addressing.
        r = PktHeader {
            kind: kind::RESP,
            op: resp::NAK,
            dst_qpn: h.dst_qpn,
            src_qpn: h.src_qpn,
            psn: h.psn,
            ..Default::default()
        };
    }
    r.syndrome = code;
    TxJob {
        hdr: r,
        body: Body::Empty,
        pd: 0,
        sent: 0,
    }
}

/// Pops completed WQEs off the front, writing CQEs for the signalled ones.
fn complete_front(q: &mut EQp, now: Instant) {
    while q.out.front().is_some_and(|o| o.done) {
        let o = q.out.pop_front().unwrap();
        if o.signalled {
            let mut cqe = Cqe64([0; 64]);
            if o.opcode == Opcode::RdmaRead {
                cqe.set_byte_cnt(o.len);
            }
            cqe.set_sop_drop_qpn(((o.opcode as u32) << 24) | q.hw.qpn);
            cqe.set_wqe_counter(o.idx);
            cqe.set_op_own(CqeOpcode::Req, false, 0);
            push_cqe(&q.hw.send_cq, &mut cqe);
        }
        q.progress_at = now;
    }
}

fn err_cqe(op: CqeOpcode, s: Syndrome, wqe_opcode: u8, qpn: u32, counter: u16) -> Cqe64 {
    let mut c = Cqe64([0; 64]);
    c.set_syndrome(s, 0);
    c.set_sop_drop_qpn(((wqe_opcode as u32) << 24) | (qpn & 0xFF_FFFF));
    c.set_wqe_counter(counter);
    c.set_op_own(op, false, 0);
    c
}

/// Writes a CQE at the CQ's producer index: bytes 0..63 first, then `op_own` with the
/// owner bit of this pass, with release order. Refuses (and flags the CQ) on overrun.
fn push_cqe(cq: &CqShared, cqe: &mut Cqe64) {
    let pi = cq.hw_pi.load(Ordering::Relaxed);
    let ci = crate::mem::load_be32(&cq.ctrl, crate::cq::CQ_DBREC) & 0xFF_FFFF;
    if ((pi as u32).wrapping_sub(ci) & 0xFF_FFFF) >= cq.cnt {
        if !cq.overrun.swap(true, Ordering::AcqRel) {
            tracing::error!(cqn = cq.cqn, "CQ overrun: completion dropped");
        }
        return;
    }
    if cqe.is_error() {
        cq.errors.lock().push(crate::cq::CqError {
            qpn: cqe.qpn(),
            wqe_counter: cqe.wqe_counter(),
            syndrome: cqe.syndrome().unwrap_or(Syndrome::LocalQpOp),
            responder: cqe.opcode() == Some(CqeOpcode::RespErr),
        });
        cq.has_errors.store(true, Ordering::Release);
    }
    let owner = CqeOwner::expected(pi, cq.cnt);
    let op_own = (cqe.op_own() & !1) | owner;
    let off = slot_off(0, pi, cq.cnt, CQE_SIZE);
    cq.ring.write(off, &cqe.0[..63]);
    cq.ring.u8(off + 63).store(op_own, Ordering::Release);
    cq.hw_pi.store(pi + 1, Ordering::Relaxed);
}
