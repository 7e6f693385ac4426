//! Queue pairs (RC): the send ring and receive ring in mlx5 format, posting from the CPU, and
//! the prepare → commit split that leaves ringing the doorbell to any executor.

use crate::cq::{wait_ops, Cq, CqShared};
use crate::device::{DeviceShared, Endpoint};
use crate::format::*;
use crate::mem::{slot_off, RingMem};
use crate::ops::{KeepAlive, Op, Ops};
use crate::wr::{RecvWr, SendFlags, SendWr, Sge, WrOp};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Offsets in a QP's control page: the doorbell record (`[RQ][SQ]`, BE32), the soft
/// device's doorbell register, and the retired counters executors store (native u64).
/// On an HCA the doorbell register is in the UAR page; the soft device's stand-in shares the
/// doorbell record's cache line, so ringing costs the engine one line transfer, not two.
pub(crate) const QP_DBREC: usize = 0;
pub(crate) const QP_DOORBELL: usize = 8;
pub(crate) const QP_SQ_RETIRED: usize = 64;
pub(crate) const QP_RQ_RETIRED: usize = 128;
/// With a CPU proxy ([`crate::NicHandler::Cpu`]): the producer index the GPU asks the proxy to
/// ring (native u64).
pub(crate) const QP_PROXY: usize = 192;
/// With a kernel driving the QP ([`crate::kernel::DeviceQp`]): its send and receive producer
/// counters (native u64, free-running), stored through by the kernel so that the host reads
/// progress and the next launch resumes.
pub(crate) const QP_KERNEL_SQ_PI: usize = 256;
pub(crate) const QP_KERNEL_RQ_PI: usize = 264;

/// Largest message the soft device moves (2 GiB - 1, the RC limit).
pub const MAX_MESSAGE: u64 = (1 << 31) - 1;
/// Most SGEs in one work request.
pub const MAX_SGE: usize = 16;

/// QP sizes and transport settings.
#[derive(Clone, Debug)]
pub struct QpConfig {
    /// Send ring size in 64-byte WQEBBs (rounded up to a power of two).
    pub send_wqebbs: u32,
    /// Receive ring size in WQEs (rounded up to a power of two).
    pub recv_wqes: u32,
    /// Most SGEs per receive (sets the receive WQE stride).
    pub max_recv_sge: u32,
    /// Most bytes of inline payload per send.
    pub max_inline: u32,
    /// How often a send is retried while the peer has no receive posted; then the work
    /// completes with `RNR_RETRY_EXC`. Unlike verbs, 7 is not "infinite": `u8::MAX` is.
    pub rnr_retry: u8,
    /// Delay between receiver-not-ready retries.
    pub rnr_timer: Duration,
    /// How long outstanding work may go without any answer from the peer before it completes
    /// with `TRANSPORT_RETRY_EXC` (a dead peer process or a closed device is detected sooner).
    pub timeout: Duration,
    /// Who rings the doorbell for op lists from [`Qp::commit`]; `None`: chosen automatically
    /// (`GDSYNC_NIC_HANDLER`, else the GPU).
    pub nic_handler: Option<crate::NicHandler>,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            send_wqebbs: 256,
            recv_wqes: 256,
            max_recv_sge: 4,
            max_inline: 220,
            rnr_retry: 7,
            rnr_timer: Duration::from_millis(2),
            timeout: Duration::from_secs(5),
            nic_handler: None,
        }
    }
}

/// State of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum QpState {
    /// Created; receives may be posted.
    Init = 0,
    /// Connected: ready to send.
    Rts = 1,
    /// In error: remaining and new work completes with `WR_FLUSH`.
    Error = 2,
}

/// The QP as the user handle, the engine and CQ polls share it.
///
/// Aligned so that the `Arc`'s counters (which the engine touches) do not share a cache line
/// with the fields posting threads read.
#[repr(C, align(128))]
pub(crate) struct QpShared {
    pub qpn: u32,
    pub pd: u32,
    /// RQ at offset 0, SQ at `sq_off` (the mlx5 layout).
    pub buf: Arc<RingMem>,
    pub ctrl: Arc<RingMem>,
    pub sq_off: usize,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub rq_stride: u32,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    sq_wrid: Box<[AtomicU64]>,
    sq_wqebbs: Box<[AtomicU8]>,
    rq_wrid: Box<[AtomicU64]>,
    /// Free-running counters of what host polls have retired.
    sq_polled: AtomicU64,
    rq_polled: AtomicU64,
    /// While the receive CQ serves only this receive queue, receive `i` completes as that
    /// CQ's completion `i + rq_cqe_base`, so the CQ's consumption tells which receives are
    /// retired, and executors need not store a retired counter of their own. [`NO_BASE`]
    /// until the first receive; [`BAD_BASE`] for good once the numbering stopped matching.
    rq_cqe_base: AtomicU64,
    pub state: AtomicU8,
    pub cfg: QpConfig,
    /// Who rings for committed op lists.
    pub handler: crate::NicHandler,
}

/// `QpShared::rq_cqe_base`: no receive yet; numbering that stopped matching.
const NO_BASE: u64 = u64::MAX;
const BAD_BASE: u64 = u64::MAX - 1;

impl QpShared {
    /// Host poll saw the requester CQE for `wqe_counter`: frees its slots, returns its wr_id.
    pub(crate) fn retire_send(&self, wqe_counter: u16) -> u64 {
        let slot = (wqe_counter as u32 & (self.sq_cnt - 1)) as usize;
        let wr_id = self.sq_wrid[slot].load(Ordering::Relaxed);
        let end = wqe_counter.wrapping_add(self.sq_wqebbs[slot].load(Ordering::Relaxed) as u16);
        advance16(&self.sq_polled, end);
        wr_id
    }
    /// Host poll saw the responder CQE for RQ index `c`.
    pub(crate) fn retire_recv(&self, c: u16) -> u64 {
        let wr_id = self.rq_wrid[(c as u32 & (self.rq_cnt - 1)) as usize].load(Ordering::Relaxed);
        advance16(&self.rq_polled, c.wrapping_add(1));
        wr_id
    }
    pub(crate) fn state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            0 => QpState::Init,
            1 => QpState::Rts,
            _ => QpState::Error,
        }
    }
    fn sq_retired(&self) -> u64 {
        self.sq_polled
            .load(Ordering::Acquire)
            .max(self.ctrl.u64(QP_SQ_RETIRED).load(Ordering::Acquire))
    }
    fn rq_retired(&self) -> u64 {
        let r = self
            .rq_polled
            .load(Ordering::Acquire)
            .max(self.ctrl.u64(QP_RQ_RETIRED).load(Ordering::Acquire));
        match self.rq_base() {
            Some(base) => r.max(self.recv_cq.consumed().saturating_sub(base)),
            None => r,
        }
    }
    /// `rq_cqe_base`, if the receive CQ's consumption counts this queue's retired receives.
    fn rq_base(&self) -> Option<u64> {
        let base = self.rq_cqe_base.load(Ordering::Acquire);
        (base < BAD_BASE && !self.recv_cq.shared_ever.load(Ordering::Acquire)).then_some(base)
    }
    /// Receive `index` was given completion number `cqe`.
    fn note_rq_cqe(&self, index: u64, cqe: u64) {
        let base = cqe.wrapping_sub(index);
        let old = self.rq_cqe_base.load(Ordering::Relaxed);
        if old == NO_BASE && base < BAD_BASE {
            self.rq_cqe_base.store(base, Ordering::Release);
        } else if old != base {
            self.rq_cqe_base.store(BAD_BASE, Ordering::Release);
        }
    }
    pub(crate) fn keep(&self) -> KeepAlive {
        self.ctrl.clone()
    }
    /// The retired counters executors and kernels store (send WQEBBs, receives).
    pub(crate) fn kernel_retired(&self) -> (u64, u64) {
        (
            self.ctrl.u64(QP_SQ_RETIRED).load(Ordering::Acquire),
            self.ctrl.u64(QP_RQ_RETIRED).load(Ordering::Acquire),
        )
    }
}

/// Moves a free-running counter forward to the 16-bit value `to` (never backwards).
fn advance16(c: &AtomicU64, to: u16) {
    let cur = c.load(Ordering::Relaxed);
    let d = to.wrapping_sub(cur as u16);
    if d != 0 && d < 0x8000 {
        c.store(cur + d as u64, Ordering::Release);
    }
}

/// A send that was prepared (its WQE is in the send ring) but not yet made visible to the
/// device. Commit it ([`Qp::commit`]) to get the op list that rings the doorbell.
///
/// Dropping it uncommitted turns its WQE into a no-op, exposed with the next commit (it then
/// completes as a no-op, with its wr_id, if it was signalled).
#[derive(Debug)]
#[must_use = "a prepared send does nothing until it is committed and its ops run"]
pub struct PreparedSend {
    qpn: u32,
    start: u64,
    end: u64,
    head: [u8; 8],
    ticket: SendTicket,
    /// Where an uncommitted drop records itself.
    abandoned: Arc<parking_lot::Mutex<Vec<u64>>>,
    committed: bool,
}

impl Drop for PreparedSend {
    fn drop(&mut self) {
        if !self.committed {
            self.abandoned.lock().push(self.start);
        }
    }
}

/// A commit refused (out of order, or another QP's send): the error and the prepared send,
/// to commit later. Converts into [`Error`] for `?`.
#[derive(Debug)]
pub struct CommitError {
    /// Why.
    pub error: Error,
    /// The send, still prepared.
    pub prepared: PreparedSend,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for CommitError {}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Error {
        let CommitError { error, prepared: _ } = e;
        error
    }
}

impl PreparedSend {
    /// The ticket the send will have.
    pub fn ticket(&self) -> SendTicket {
        self.ticket
    }
}

/// Identifies a posted send: where it is in the ring and which completion it will produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendTicket {
    /// Producer counter (WQEBBs, free-running) of the WQE's first block.
    pub index: u64,
    /// Producer counter just after the WQE.
    pub end: u64,
    /// Its completion number on the send CQ, when the send is signalled and the CQ serves
    /// this QP's sends only (so completion order is known in advance).
    pub cqe: Option<u64>,
}

/// Identifies a posted receive and its completion number, as [`SendTicket`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvTicket {
    /// Receive counter (free-running).
    pub index: u64,
    /// Its completion number on the receive CQ, when that CQ serves this QP's receives only.
    pub cqe: Option<u64>,
}

/// A reliable-connected queue pair.
pub struct Qp {
    pub(crate) shared: Arc<QpShared>,
    pub(crate) dev: Arc<DeviceShared>,
    sq_pi: u64,
    committed: u64,
    rq_pi: u64,
    /// Where a WQE is assembled before it is copied into the ring.
    scratch: Box<[u8; MAX_WQE_WQEBBS * WQEBB]>,
    /// Where an inline payload is gathered before it is encoded.
    inline: Box<[u8; MAX_WQE_DS * SEG_SIZE]>,
    /// Prepared, not yet committed sends, in ring order: (start, end).
    uncommitted: std::collections::VecDeque<(u64, u64)>,
    /// Starts of prepared sends dropped without a commit.
    abandoned: Arc<parking_lot::Mutex<Vec<u64>>>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.shared.qpn)
            .field("state", &self.state())
            .finish()
    }
}

impl Qp {
    pub(crate) fn create(
        dev: &Arc<DeviceShared>,
        pd: u32,
        qpn: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<Self> {
        if !Arc::ptr_eq(&send_cq._dev, dev) || !Arc::ptr_eq(&recv_cq._dev, dev) {
            return Err(Error::invalid(
                "the QP's CQs must belong to the same device",
            ));
        }
        if cfg.send_wqebbs == 0
            || cfg.send_wqebbs > 1 << 15
            || cfg.recv_wqes == 0
            || cfg.recv_wqes > 1 << 15
        {
            return Err(Error::invalid(
                "send_wqebbs and recv_wqes must be in 1..=32768",
            ));
        }
        if cfg.max_recv_sge == 0 || cfg.max_recv_sge as usize > MAX_SGE {
            return Err(Error::invalid(format!(
                "max_recv_sge must be in 1..={MAX_SGE}"
            )));
        }
        // ctrl + raddr + the inline header must fit in the 63 DS a WQE can have.
        let max_inline = (MAX_WQE_DS * SEG_SIZE - 2 * SEG_SIZE - 4) as u32;
        if cfg.max_inline > max_inline {
            return Err(Error::invalid(format!(
                "max_inline {} exceeds {max_inline}",
                cfg.max_inline
            )));
        }
        let sq_cnt = cfg
            .send_wqebbs
            .next_power_of_two()
            .max(MAX_WQE_WQEBBS as u32);
        let rq_cnt = cfg.recv_wqes.next_power_of_two();
        let rq_stride = (SEG_SIZE as u32 * cfg.max_recv_sge).next_power_of_two();
        let rq_bytes = (rq_cnt * rq_stride) as usize;
        let sq_off = rq_bytes.max(64);
        let (handler, why) = match cfg.nic_handler {
            Some(h) => (h, "set in QpConfig::nic_handler"),
            None => crate::NicHandler::choose_soft()?,
        };
        crate::handler::log_choice(handler, why);
        let buf = Arc::new(RingMem::new(sq_off + sq_cnt as usize * WQEBB));
        let shared = Arc::new(QpShared {
            qpn,
            pd,
            buf,
            ctrl: Arc::new(RingMem::new(crate::mem::PAGE)),
            sq_off,
            sq_cnt,
            rq_cnt,
            rq_stride,
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            sq_wrid: (0..sq_cnt).map(|_| AtomicU64::new(0)).collect(),
            sq_wqebbs: (0..sq_cnt).map(|_| AtomicU8::new(0)).collect(),
            rq_wrid: (0..rq_cnt).map(|_| AtomicU64::new(0)).collect(),
            sq_polled: AtomicU64::new(0),
            rq_polled: AtomicU64::new(0),
            rq_cqe_base: AtomicU64::new(NO_BASE),
            state: AtomicU8::new(QpState::Init as u8),
            cfg: cfg.clone(),
            handler,
        });
        for cq in [&send_cq.shared, &recv_cq.shared] {
            if cq.users.fetch_add(1, Ordering::AcqRel) > 0 {
                cq.shared_ever.store(true, Ordering::Release);
            }
        }
        dev.add_qp(&shared)?;
        if handler == crate::NicHandler::Cpu {
            dev.proxy.watch(&shared, dev)?;
        }
        Ok(Qp {
            shared,
            dev: dev.clone(),
            sq_pi: 0,
            committed: 0,
            rq_pi: 0,
            scratch: Box::new([0; MAX_WQE_WQEBBS * WQEBB]),
            inline: Box::new([0; MAX_WQE_DS * SEG_SIZE]),
            uncommitted: Default::default(),
            abandoned: Default::default(),
        })
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.shared.qpn
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.shared.state()
    }
    /// What a peer needs to connect to this QP: plain data to exchange out of band.
    pub fn endpoint(&self) -> Endpoint {
        self.dev.endpoint(self.shared.qpn)
    }
    /// Connects to the peer QP described by `remote` and moves to RTS.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<()> {
        if self.state() != QpState::Init {
            return Err(Error::invalid(format!(
                "QP {:#x} is {:?}; only a new QP can connect",
                self.qpn(),
                self.state()
            )));
        }
        self.dev.connect(&self.shared, remote)?;
        self.shared
            .state
            .store(QpState::Rts as u8, Ordering::Release);
        Ok(())
    }
    /// Send ring size in WQEBBs.
    pub fn send_ring_size(&self) -> u32 {
        self.shared.sq_cnt
    }
    /// Receive ring size in WQEs.
    pub fn recv_ring_size(&self) -> u32 {
        self.shared.rq_cnt
    }

    /// One line for error reports: the state, how far the send ring is prepared, committed
    /// and rung (the doorbell record, which executors store), and receives posted.
    pub fn describe(&self) -> String {
        let rec = self.sq_doorbell_record();
        format!(
            "QP {:#x} {:?}: send ring prepared to {}, committed to {}, doorbell record {} (low 16 bits, at {:#x}); {} receives posted",
            self.shared.qpn,
            self.state(),
            self.sq_pi,
            self.committed,
            rec,
            self.shared.ctrl.addr(QP_DBREC + 4 * DBREC_SQ),
            self.rq_pi,
        )
    }

    /// Receives that can be posted now (free slots in the receive ring).
    pub fn recv_room(&self) -> u64 {
        (self.shared.rq_cnt as u64).saturating_sub(self.recv_used())
    }

    /// Receives posted and not yet retired.
    fn recv_used(&self) -> u64 {
        self.rq_pi - self.shared.rq_retired()
    }

    /// Writes the WQE for `wr` into the send ring without ringing the doorbell.
    pub fn prepare_send(&mut self, wr: &SendWr) -> Result<PreparedSend> {
        let s = &*self.shared;
        if s.state() == QpState::Init {
            return Err(Error::NotConnected { qpn: s.qpn });
        }
        let ds = encode(
            s,
            &self.dev,
            self.sq_pi,
            wr,
            &mut self.scratch[..],
            &mut self.inline[..],
        )?;
        let wqe = &self.scratch[..];
        let nbb = wqebbs_for_ds(ds) as u64;
        let used = self.sq_pi - s.sq_retired();
        if used + nbb > s.sq_cnt as u64 {
            return Err(Error::RingFull {
                ring: "send",
                qpn: s.qpn,
                used: used as u32,
                size: s.sq_cnt,
                hint: if wr.flags.contains(SendFlags::SIGNALED) {
                    ""
                } else {
                    " (signal a send at least once per ring, or slots can never be freed)"
                },
            });
        }
        let start = self.sq_pi;
        for i in 0..nbb {
            let off = slot_off(s.sq_off, start + i, s.sq_cnt, WQEBB);
            let chunk = &wqe[i as usize * WQEBB..(i as usize + 1) * WQEBB];
            s.buf.write(
                off,
                &chunk[..(ds * SEG_SIZE)
                    .saturating_sub(i as usize * WQEBB)
                    .min(WQEBB)],
            );
        }
        let slot = (start & (s.sq_cnt as u64 - 1)) as usize;
        s.sq_wrid[slot].store(wr.wr_id, Ordering::Relaxed);
        s.sq_wqebbs[slot].store(nbb as u8, Ordering::Relaxed);
        self.sq_pi += nbb;
        let cqe = (wr.flags.contains(SendFlags::SIGNALED)
            && s.send_cq.users.load(Ordering::Acquire) == 1)
            .then(|| s.send_cq.reserved.fetch_add(1, Ordering::AcqRel));
        let head: [u8; 8] = wqe[..8].try_into().unwrap();
        self.uncommitted.push_back((start, self.sq_pi));
        Ok(PreparedSend {
            qpn: s.qpn,
            start,
            end: self.sq_pi,
            head,
            ticket: SendTicket {
                index: start,
                end: self.sq_pi,
                cqe,
            },
            abandoned: self.abandoned.clone(),
            committed: false,
        })
    }

    /// Commits a prepared send: returns its ticket and the op list that exposes it (and any
    /// earlier committed-in-order sends) to the device: store the doorbell record, barrier,
    /// store the 8-byte doorbell. Prepared sends must be committed in the order prepared.
    ///
    /// The returned ops must also run in commit order: running an older commit's ops after a
    /// newer one's moves the doorbell record backwards, which the device treats as a
    /// malformed ring (`LOCAL_QP_OP_ERR`, QP to error). A refused commit hands the prepared
    /// send back in the [`CommitError`].
    pub fn commit(&mut self, mut p: PreparedSend) -> Result<(SendTicket, Ops), CommitError> {
        if p.qpn != self.shared.qpn {
            return Err(CommitError {
                error: Error::invalid("prepared send belongs to another QP"),
                prepared: p,
            });
        }
        if !self.skip_abandoned(p.start) {
            return Err(CommitError {
                error: Error::OutOfOrder {
                    expected: self.committed,
                    got: p.start,
                },
                prepared: p,
            });
        }
        p.committed = true;
        self.uncommitted.pop_front();
        self.committed = p.end;
        let s = &*self.shared;
        let keep = s.keep();
        let mut ops = Ops::new();
        if s.handler == crate::NicHandler::Cpu {
            // The proxy rings: what ran before is visible first, then the request.
            ops.push(Op::Barrier, &keep);
            ops.push(
                Op::Write64 {
                    addr: s.ctrl.addr(QP_PROXY),
                    value: p.end,
                },
                &keep,
            );
            ops.mark_ring(s.ctrl.addr(QP_PROXY));
            return Ok((p.ticket, ops));
        }
        ops.push(
            Op::Write32 {
                addr: s.ctrl.addr(QP_DBREC + 4 * DBREC_SQ),
                value: qp_dbrec_value(p.end).native(),
            },
            &keep,
        );
        ops.push(Op::Barrier, &keep);
        ops.push(
            Op::Write64 {
                addr: s.ctrl.addr(QP_DOORBELL),
                value: doorbell_value(p.head),
            },
            &keep,
        );
        ops.mark_ring(s.ctrl.addr(QP_DBREC));
        Ok((p.ticket, ops))
    }

    /// Whether the send prepared at `start` is next, once prepared sends dropped without a
    /// commit in front of it are turned into no-ops and passed over.
    fn skip_abandoned(&mut self, start: u64) -> bool {
        // Prepared sends dropped without a commit become no-ops and leave the queue.
        let abandoned = std::mem::take(&mut *self.abandoned.lock());
        for a in abandoned {
            if let Some(i) = self.uncommitted.iter().position(|&(s, _)| s == a) {
                let (s, e) = self.uncommitted.remove(i).unwrap();
                self.neutralise(s, e);
            }
        }
        // `uncommitted` holds the live ones in ring order: `start` is next if it is first.
        if self.uncommitted.front().map(|&(s, _)| s) == Some(start) {
            self.committed = start;
            true
        } else {
            false
        }
    }

    /// Rewrites the WQE at `[start, end)` as a no-op of the same size (same completion).
    fn neutralise(&mut self, start: u64, _end: u64) {
        let s = &*self.shared;
        let off = slot_off(s.sq_off, start, s.sq_cnt, WQEBB);
        let mut b = [0u8; 16];
        s.buf.read(off, &mut b);
        b[3] = Opcode::Nop as u8;
        s.buf.write(off, &b);
    }

    /// Whether the send doorbell record has reached `end` (a [`SendTicket::end`]): every send
    /// before it is exposed to the device, whether this thread posted it or an executor ran
    /// its commit ops. A CPU post must wait for this before it moves the record past sends an
    /// executor has not rung yet (the record would otherwise expose them early, then move
    /// backwards).
    pub fn doorbell_reached(&self, end: u64) -> bool {
        self.sq_doorbell_record().wrapping_sub(end as u16) as i16 >= 0
    }

    /// The send doorbell record: the low 16 bits of the producer counter (big-endian in
    /// memory) as last exposed to the device.
    fn sq_doorbell_record(&self) -> u16 {
        let native = self
            .shared
            .ctrl
            .u32(QP_DBREC + 4 * DBREC_SQ)
            .load(Ordering::Acquire);
        u32::from_be(native) as u16
    }

    /// Whether sends committed for an executor ([`commit`](Self::commit)) are not visible to
    /// the device yet (their ops have not run). A CPU post now would ring past them, so they
    /// would go out before whatever the executor waits for, and the executor's own doorbell
    /// would later move backwards: [`post_send`](Self::post_send) refuses then.
    /// (A QP in error flushes all work anyway: never then.)
    pub fn has_unrung_commits(&self) -> bool {
        if self.shared.state() == QpState::Error {
            return false;
        }
        let c = &self.shared.ctrl;
        // Rung once the record has reached the last commit (or passed it, had something
        // else rung).
        let rung = || self.doorbell_reached(self.committed);
        if rung() {
            return false;
        }
        if self.shared.handler == crate::NicHandler::Cpu
            && c.u64(QP_PROXY).load(Ordering::Acquire) == self.committed
        {
            // The executor has asked the proxy thread to ring; it does within microseconds.
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(1) {
                if rung() {
                    return false;
                }
                std::thread::yield_now();
            }
        }
        true
    }

    /// Posts a send from the CPU: prepare, then do what the commit ops describe (store the
    /// doorbell record, order, store the doorbell) directly on this thread. Refused while
    /// sends committed for an executor are not rung yet ([`has_unrung_commits`](Self::has_unrung_commits)).
    pub fn post_send(&mut self, wr: &SendWr) -> Result<SendTicket> {
        if self.has_unrung_commits() {
            return Err(Error::invalid(format!(
                "QP {}: sends committed for an executor have not been rung yet; a CPU post now would expose them early. Post on that executor too (prepare_send + commit), or let it run first",
                self.shared.qpn
            )));
        }
        let mut p = self.prepare_send(wr)?;
        if !self.skip_abandoned(p.start) {
            return Err(Error::OutOfOrder {
                expected: self.committed,
                got: p.start,
            });
        }
        p.committed = true;
        self.uncommitted.pop_front();
        self.committed = p.end;
        let c = &self.shared.ctrl;
        c.u32(QP_DBREC + 4 * DBREC_SQ)
            .store(qp_dbrec_value(p.end).native(), Ordering::Release);
        c.u64(QP_DOORBELL)
            .store(doorbell_value(p.head), Ordering::Release);
        self.dev.kick();
        Ok(p.ticket)
    }

    /// Commits a prepared send and submits its doorbell ops to `exec` (a stream: the send
    /// goes out when the stream reaches it).
    pub fn post_prepared(
        &mut self,
        p: PreparedSend,
        exec: &impl crate::exec::Executor,
    ) -> Result<SendTicket> {
        let (t, ops) = self.commit(p)?;
        exec.submit(ops)?;
        Ok(t)
    }

    /// Submits to `exec` the wait for a signalled send's completion (see
    /// [`send_wait_ops`](Self::send_wait_ops)).
    pub fn wait_send(&self, t: &SendTicket, exec: &impl crate::exec::Executor) -> Result<()> {
        exec.submit(self.send_wait_ops(t)?)
    }

    /// Submits to `exec` the wait for a receive's completion (see
    /// [`recv_wait_ops`](Self::recv_wait_ops)).
    pub fn wait_recv(&self, t: &RecvTicket, exec: &impl crate::exec::Executor) -> Result<()> {
        exec.submit(self.recv_wait_ops(t)?)
    }

    /// The op list that waits for a signalled send's completion and retires it (stores the
    /// CQ consumer index, the CQ's retired counter and this QP's send-ring retired counter),
    /// so the CPU never has to poll.
    pub fn send_wait_ops(&self, t: &SendTicket) -> Result<Ops> {
        let n = t.cqe.ok_or(Error::NotWaitable(
            "the send is unsignalled, or its CQ also serves other queues (use a dedicated send CQ)",
        ))?;
        let mut ops = wait_ops(&self.shared.send_cq, n);
        let keep = self.shared.keep();
        ops.push(
            Op::Write64 {
                addr: self.shared.ctrl.addr(QP_SQ_RETIRED),
                value: t.end,
            },
            &keep,
        );
        Ok(ops)
    }

    /// The op list that waits for a receive's completion and retires it.
    pub fn recv_wait_ops(&self, t: &RecvTicket) -> Result<Ops> {
        let n = t.cqe.ok_or(Error::NotWaitable(
            "the receive CQ also serves other queues (use a dedicated receive CQ)",
        ))?;
        let mut ops = wait_ops(&self.shared.recv_cq, n);
        // The CQ's consumption, which the wait stores, retires the receive, unless the
        // numbering does not tell (then the receive ring's retired counter is stored too).
        if self.shared.rq_base() != Some(n.wrapping_sub(t.index)) {
            let keep = self.shared.keep();
            ops.push(
                Op::Write64 {
                    addr: self.shared.ctrl.addr(QP_RQ_RETIRED),
                    value: t.index + 1,
                },
                &keep,
            );
        }
        Ok(ops)
    }

    /// Posts a receive: writes the scatter list into the receive ring and updates the
    /// doorbell record (receives have no doorbell register).
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<RecvTicket> {
        let s = &*self.shared;
        let max = (s.rq_stride as usize) / SEG_SIZE;
        let sges: smallvec::SmallVec<[&Sge; 4]> = wr.sges.iter().filter(|g| g.len > 0).collect();
        if sges.len() > max {
            return Err(Error::invalid(format!(
                "{} SGEs in a receive; this QP takes at most {max} (max_recv_sge)",
                sges.len()
            )));
        }
        let used = self.recv_used();
        if used >= s.rq_cnt as u64 {
            return Err(Error::RingFull {
                ring: "receive",
                qpn: s.qpn,
                used: used as u32,
                size: s.rq_cnt,
                hint: "",
            });
        }
        let segs: smallvec::SmallVec<[DataSeg; MAX_SGE]> = sges
            .iter()
            .map(|g| DataSeg::new(g.addr, g.len, g.lkey))
            .collect();
        let mut slot = [0u8; MAX_SGE * SEG_SIZE];
        let n = RecvWqe {
            segs: DataSegs::from_segs(&segs),
        }
        .write_to(&mut slot[..s.rq_stride as usize])
        .map_err(|e| Error::invalid(e.to_string()))?;
        let base = slot_off(0, self.rq_pi, s.rq_cnt, s.rq_stride as usize);
        s.buf.write(base, &slot[..n]);
        s.rq_wrid[(self.rq_pi & (s.rq_cnt as u64 - 1)) as usize].store(wr.wr_id, Ordering::Relaxed);
        let index = self.rq_pi;
        self.rq_pi += 1;
        let cqe = (s.recv_cq.users.load(Ordering::Acquire) == 1)
            .then(|| s.recv_cq.reserved.fetch_add(1, Ordering::AcqRel));
        // (Without a number the CQ serves other queues too, which `shared_ever` records.)
        if let Some(n) = cqe {
            s.note_rq_cqe(index, n);
        }
        // The release store orders the segments before the counter the device reads.
        s.ctrl
            .u32(QP_DBREC + 4 * DBREC_RQ)
            .store(qp_dbrec_value(self.rq_pi).native(), Ordering::Release);
        self.dev.kick();
        Ok(RecvTicket { index, cqe })
    }
}

/// Whether every SGE lies in a registered region of host memory (else it is left to the
/// encoder's own checks).
fn in_host_memory(mrs: &crate::mr::Slots, sges: &[Sge]) -> bool {
    sges.iter()
        .all(|g| mrs.get(g.lkey).is_some_and(|e| e.gpu.is_none()))
}

/// Encodes `wr` as a WQE for producer index `sq_pi` into `out`; returns its ds count.
/// Inline payload is gathered into `inline` first.
fn encode(
    s: &QpShared,
    dev: &DeviceShared,
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
    let (opcode, remote, imm) = match wr.op {
        WrOp::Send => (Opcode::Send, None, 0),
        WrOp::SendImm(i) => (Opcode::SendImm, None, i),
        WrOp::Write(r) => (Opcode::RdmaWrite, Some(r), 0),
        WrOp::WriteImm(r, i) => (Opcode::RdmaWriteImm, Some(r), i),
        WrOp::Read(r) => (Opcode::RdmaRead, Some(r), 0),
        WrOp::FetchAdd { remote, .. } => (Opcode::AtomicFa, Some(remote), 0),
        WrOp::CompareSwap { remote, .. } => (Opcode::AtomicCs, Some(remote), 0),
        WrOp::Nop => (Opcode::Nop, None, 0),
    };
    let inlinable = opcode.carries_payload();
    // The region table, read once: for the inline decision and the inline copy.
    let mrs = wr
        .flags
        .intersects(SendFlags::INLINE | SendFlags::INLINE_HOST)
        .then(|| dev.mrs.read());
    let inline_it = wr.flags.contains(SendFlags::INLINE)
        || (wr.flags.contains(SendFlags::INLINE_HOST)
            && inlinable
            && len > 0
            && len <= s.cfg.max_inline as u64
            && mrs.as_ref().is_some_and(|m| in_host_memory(m, &wr.sges)));
    if inline_it && !inlinable {
        return Err(Error::invalid(format!("{opcode:?} cannot be inline")));
    }
    if opcode.is_atomic() {
        if wr.sges.len() != 1 || wr.sges[0].len != 8 {
            return Err(Error::invalid(
                "an atomic takes exactly one 8-byte SGE for the old value",
            ));
        }
        if remote.unwrap().addr % 8 != 0 {
            return Err(Error::invalid(
                "an atomic's remote address must be 8-byte aligned",
            ));
        }
    }
    let atomic = match wr.op {
        WrOp::FetchAdd { add, .. } => Some(AtomicSeg::new(add, 0)),
        WrOp::CompareSwap { compare, swap, .. } => Some(AtomicSeg::new(swap, compare)),
        _ => None,
    };
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
    mrs: &crate::mr::Slots,
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
            .get(g.lkey)
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

impl Qp {
    /// Hands the send ring, the receive ring and both CQs to a GPU kernel, which then posts
    /// and polls by itself through the descriptor [`DeviceQp::desc`](crate::kernel::DeviceQp::desc)
    /// returns (see `gdsync.cuh`). The CPU can no longer post (the QP is consumed) nor poll
    /// the CQs (polls return `Err`); [`DeviceQp::into_host`](crate::kernel::DeviceQp::into_host)
    /// gives the QP back.
    ///
    /// Refused unless each CQ serves only this queue side (a kernel must know every
    /// completion it sees), each CQ holds at least as many entries as its ring (so it cannot
    /// overrun), and nothing is outstanding: no send or receive in flight, no completion
    /// unpolled, no prepared send uncommitted.
    pub fn into_device(self) -> Result<crate::kernel::DeviceQp> {
        let s = &*self.shared;
        if s.state() == QpState::Error {
            return Err(Error::QpInError { qpn: s.qpn });
        }
        if Arc::ptr_eq(&s.send_cq, &s.recv_cq)
            || s.send_cq.users.load(Ordering::Acquire) != 1
            || s.recv_cq.users.load(Ordering::Acquire) != 1
        {
            return Err(Error::invalid(format!(
                "QP {:#x}: a kernel needs a send CQ and a receive CQ used by this QP alone",
                s.qpn
            )));
        }
        if s.send_cq.cnt < s.sq_cnt || s.recv_cq.cnt < s.rq_cnt {
            return Err(Error::invalid(format!(
                "QP {:#x}: the send CQ ({}) and receive CQ ({}) need at least as many entries as the send ring ({} WQEBBs) and receive ring ({}), or they could overrun",
                s.qpn, s.send_cq.cnt, s.recv_cq.cnt, s.sq_cnt, s.rq_cnt
            )));
        }
        if !self.uncommitted.is_empty() || self.committed != self.sq_pi {
            return Err(Error::invalid(format!(
                "QP {:#x}: the send ring holds prepared sends never committed",
                s.qpn
            )));
        }
        if s.sq_retired() != self.sq_pi || s.rq_retired() != self.rq_pi {
            return Err(Error::invalid(format!(
                "QP {:#x}: work is outstanding ({} send WQEBBs, {} receives): wait for its completions before handing the QP to a kernel",
                s.qpn,
                self.sq_pi - s.sq_retired(),
                self.rq_pi - s.rq_retired()
            )));
        }
        s.send_cq.hand_to_kernel()?;
        if let Err(e) = s.recv_cq.hand_to_kernel() {
            s.send_cq.take_from_kernel();
            return Err(e);
        }
        s.ctrl
            .u64(QP_SQ_RETIRED)
            .store(self.sq_pi, Ordering::Release);
        s.ctrl
            .u64(QP_RQ_RETIRED)
            .store(self.rq_pi, Ordering::Release);
        s.ctrl
            .u64(QP_KERNEL_SQ_PI)
            .store(self.sq_pi, Ordering::Release);
        s.ctrl
            .u64(QP_KERNEL_RQ_PI)
            .store(self.rq_pi, Ordering::Release);
        Ok(crate::kernel::DeviceQp::new(self))
    }

    /// Takes the rings back from a kernel that ended with nothing outstanding: posting
    /// resumes at the counters the kernel left.
    pub(crate) fn resume_from_kernel(&mut self, sq_pi: u64, rq_pi: u64) {
        let s = &*self.shared;
        self.sq_pi = sq_pi;
        self.committed = sq_pi;
        self.rq_pi = rq_pi;
        // Host polls count on from here (the kernel may have moved the rings by more than
        // the 16-bit distance `advance16` bridges).
        s.sq_polled.store(sq_pi, Ordering::Release);
        s.rq_polled.store(rq_pi, Ordering::Release);
        s.send_cq.take_from_kernel();
        s.recv_cq.take_from_kernel();
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.shared.send_cq.forget_qp(self.shared.qpn);
        self.shared.recv_cq.forget_qp(self.shared.qpn);
        self.shared.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.shared.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.dev.remove_qp(self.shared.qpn);
    }
}
