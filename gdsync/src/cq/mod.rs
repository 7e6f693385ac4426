//! Completion queues: a ring of 64-byte mlx5 CQEs the device writes, polled on the host or
//! waited for by an executor.

use crate::backoff::Backoff;
use crate::context::DeviceContext;
use crate::device::provider::{CqSpec, MemAt};
use crate::format::{
    cq_ci_value, Cqe64, CqeOpcode, CqeOwner, Opcode, Syndrome, CQE_INIT_OP_OWN,
    CQE_OWNER_WORD_OFFSET, CQE_SIZE,
};
use crate::mem::{slot_off, RingMem};
use crate::ops::{KeepAlive, Op, Ops, WaitCond};
use crate::{Error, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Offsets in a CQ's control block: the doorbell record (`[ci][arm]`, BE32), which the
/// device reads before it writes a CQE and whoever consumes a CQE stores (host polls,
/// executors' waits, kernels), and the retired counter (native u64, free-running), which
/// kernels store beside it. (A device that places the CQ itself has its own doorbell record:
/// [`CqShared::dbrec`].)
pub(crate) const CQ_DBREC: usize = 0;
pub(crate) const CQ_RETIRED: usize = 64;

/// A queue side (the send or receive queue of a QP) that completes on a CQ: a poll hands it
/// the completions it decodes.
pub(crate) trait CqUser: Send + Sync {
    /// The requester CQE for `wqe_counter` was polled: frees its slots, returns its wr_id.
    fn retire_send(&self, wqe_counter: u16) -> u64;
    /// The responder CQE for receive index `c` was polled: returns its wr_id.
    fn retire_recv(&self, c: u16) -> u64;
    /// Whether the QP is in the error state (for the log line of an error completion).
    fn in_error(&self) -> bool;
    /// The QP's first error as the device keeps it, if the QP is in the error state and
    /// that error completed on CQ `cqn` (for errors whose CQE was overwritten).
    fn first_error_on(&self, cqn: u32) -> Option<CqError>;
}

/// The CQ as every handle shares it.
#[repr(C, align(128))]
pub(crate) struct CqShared {
    pub cqn: u32,
    pub cnt: u32,
    /// The CQE ring.
    pub ring: Arc<RingMem>,
    /// Retired counter at [`CQ_RETIRED`] (and the doorbell record at [`CQ_DBREC`], unless the
    /// device placed its own).
    pub ctrl: Arc<RingMem>,
    /// The doorbell record (`[ci][arm]`, BE32).
    pub dbrec: MemAt,
    /// Next completion number handed to a ticket (see `QpShared` tickets).
    pub reserved: AtomicU64,
    /// Number of queue sides (send or receive of a QP) that complete here.
    pub users: AtomicU32,
    /// Set once a second queue side completes here (never cleared): from then on its
    /// completions cannot be told apart by their count alone.
    pub shared_ever: AtomicBool,
    /// Set while a GPU kernel consumes this CQ ([`crate::kernel::DeviceQp`]): host polls
    /// would steal its completions, so they are refused.
    pub kernel_owned: AtomicBool,
    poll: Mutex<PollState>,
    /// The queue sides completing here, by QPN.
    users_by_qpn: RwLock<HashMap<u32, Weak<dyn CqUser>>>,
    ctx: Arc<DeviceContext>,
}

struct PollState {
    /// Completions consumed, by host polls or (as far as the host has looked) executors.
    ci: u64,
    /// Completions whose CQE the host has looked at for errors.
    scanned: u64,
    /// QPs whose first error is among `errors` (or was taken): a QP's first error read from
    /// the device after its CQE was overwritten is then not reported twice.
    reported: HashSet<u32>,
    /// The queue side of the last completion (cleared when that QP is destroyed).
    last: Option<(u32, Arc<dyn CqUser>)>,
    /// Error completions found and not yet taken, with whether a poll logged them: at most
    /// [`MAX_KEPT_ERRORS`] between two [`Cq::take_errors`] (a program that only polls never
    /// takes them); the rest are counted in `errors_dropped`.
    errors: Vec<(CqError, bool)>,
    errors_dropped: u64,
}

impl PollState {
    /// Keeps an error completion for [`Cq::take_errors`], if there is room.
    fn keep_error(&mut self, e: CqError, logged: bool) {
        if e.syndrome != Syndrome::WrFlush {
            self.reported.insert(e.qpn);
        }
        if self.errors.len() < MAX_KEPT_ERRORS {
            self.errors.push((e, logged));
        } else {
            self.errors_dropped += 1;
        }
    }
}

impl CqShared {
    /// A queue side starts completing here.
    pub(crate) fn attach(&self, qpn: u32, user: Weak<dyn CqUser>) {
        self.users_by_qpn.write().insert(qpn, user);
    }

    /// Drops the CQ's references to a QP being destroyed.
    pub(crate) fn forget_qp(&self, qpn: u32) {
        self.users_by_qpn.write().remove(&qpn);
        let mut st = self.poll.lock();
        if st.last.as_ref().is_some_and(|(n, _)| *n == qpn) {
            st.last = None;
        }
        // (Its number may name a new QP later.)
        st.reported.remove(&qpn);
    }

    /// The device this CQ belongs to.
    pub(crate) fn ctx(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// What op lists on this CQ keep alive: the ring, the control block and the doorbell
    /// record's memory.
    pub(crate) fn keep(self: &Arc<Self>) -> (KeepAlive, KeepAlive, KeepAlive) {
        (self.ring.clone(), self.ctrl.clone(), self.dbrec.mem.clone())
    }

    /// Stores the consumer index `ci` to the doorbell record: the slots before it are the
    /// device's again.
    pub(crate) fn store_ci(&self, ci: u64) {
        self.dbrec
            .mem
            .u32(self.dbrec.off)
            .store(cq_ci_value(ci).native(), Ordering::Release);
    }

    /// The consumer index: completions consumed by host polls or executor waits.
    pub(crate) fn consumed(&self) -> u64 {
        let mut st = self.poll.lock();
        self.catch_up(&mut st);
        st.ci
    }

    /// Takes in what executors and kernels consumed beyond `st.ci`: the doorbell record's
    /// 24-bit consumer index, which they store as they consume (read relative to `st.ci`:
    /// they run at most 2^23 completions ahead of the host's last look), and the retired
    /// counter kernels store beside it. Their CQEs are looked at for errors only when
    /// errors are asked for ([`Cq::take_errors`]).
    fn catch_up(&self, st: &mut PollState) {
        let rec = u64::from(crate::mem::load_be32(&self.dbrec.mem, self.dbrec.off) & 0xFF_FFFF);
        st.ci = crate::format::catch_up24(st.ci, rec as u32);
        st.ci = st.ci.max(self.ctrl.u64(CQ_RETIRED).load(Ordering::Acquire));
    }

    /// Looks at the CQEs from `st.scanned` on for errors: those consumed (up to `st.ci`) and
    /// those written and not consumed yet. A consumed CQE may have been overwritten by the
    /// device's next pass through the ring (its owner bit then says so, or the host fell
    /// more than a ring behind): returns whether any was, so the caller asks the device for
    /// the QPs' first errors instead.
    fn scan(&self, st: &mut PollState) -> bool {
        let cnt = self.cnt as u64;
        let mut lost = false;
        if st.ci > st.scanned + cnt {
            lost = true;
            st.scanned = st.ci - cnt;
        }
        while st.scanned < st.ci + cnt {
            let i = st.scanned;
            let consumed = i < st.ci;
            let off = slot_off(0, i, self.cnt, CQE_SIZE);
            let op_own = self.ring.u8(off + 63).load(Ordering::Acquire);
            if !CqeOwner::is_new(op_own, i, self.cnt) {
                if !consumed {
                    break; // not written yet
                }
                lost = true; // the next pass wrote over it
            } else if CqeOpcode::from_u8(op_own >> 4).is_some_and(CqeOpcode::is_error) {
                let mut cqe = Cqe64([0; 64]);
                self.ring.read(off, &mut cqe.0);
                // Still the same CQE after the read: the device did not start writing over it.
                if self.ring.u8(off + 63).load(Ordering::Acquire) == op_own {
                    st.keep_error(cq_error(&cqe), false);
                } else {
                    lost = true;
                }
            }
            st.scanned = i + 1;
        }
        lost
    }

    /// The first errors of this CQ's QPs, from the device (`query_qp`), for QPs whose error
    /// CQE was overwritten before the host looked at it. Each QP's once.
    fn recover_lost_errors(&self, st: &mut PollState) {
        let users: Vec<Arc<dyn CqUser>> = self
            .users_by_qpn
            .read()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for u in users {
            if let Some(e) = u.first_error_on(self.cqn) {
                if !st.reported.contains(&e.qpn) {
                    st.keep_error(e, false);
                }
            }
        }
    }

    /// Hands the CQ to a kernel: refuses if a kernel already owns it or a completion waits
    /// unconsumed; else publishes the consumer index in the retired counter (where the kernel
    /// resumes) and returns it.
    pub(crate) fn hand_to_kernel(&self) -> Result<u64> {
        let mut st = self.poll.lock();
        if self.kernel_owned.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "CQ {:#x} is already consumed by a kernel",
                self.cqn
            )));
        }
        self.catch_up(&mut st);
        let op_own = self
            .ring
            .u8(slot_off(0, st.ci, self.cnt, CQE_SIZE) + 63)
            .load(Ordering::Acquire);
        if CqeOwner::is_new(op_own, st.ci, self.cnt) {
            return Err(Error::invalid(format!(
                "CQ {:#x} holds completions not yet polled: poll them before handing it to a kernel",
                self.cqn
            )));
        }
        self.ctrl.u64(CQ_RETIRED).store(st.ci, Ordering::Release);
        self.kernel_owned.store(true, Ordering::Release);
        Ok(st.ci)
    }

    /// Takes the CQ back from a kernel: host polls resume where the kernel stopped.
    pub(crate) fn take_from_kernel(&self) {
        let mut st = self.poll.lock();
        self.catch_up(&mut st);
        self.kernel_owned.store(false, Ordering::Release);
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        self.ctx.provider.destroy_cq(self.cqn);
    }
}

/// The error a CQE reports.
fn cq_error(cqe: &Cqe64) -> CqError {
    CqError {
        qpn: cqe.qpn(),
        wqe_counter: cqe.wqe_counter(),
        syndrome: cqe.syndrome().unwrap_or(Syndrome::LocalQpOp),
        responder: cqe.opcode() == Some(CqeOpcode::RespErr),
    }
}

/// An error completion, as its CQE reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqError {
    /// The QP.
    pub qpn: u32,
    /// Its WQE counter (send ring index, or receive index for responder errors).
    pub wqe_counter: u16,
    /// The syndrome.
    pub syndrome: Syndrome,
    /// A responder (receive-side) error.
    pub responder: bool,
}

/// Status of a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Success.
    Success,
    /// Error, with the syndrome the device wrote (unknown values map to `GeneralErr`-like
    /// [`Syndrome::LocalQpOp`] only if undecodable; see `vendor_err`).
    Error(Syndrome),
}

/// What a completion completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionOp {
    /// Send or send with immediate (requester).
    Send,
    /// RDMA write (requester).
    Write,
    /// RDMA read (requester).
    Read,
    /// Compare and swap (requester).
    CompareSwap,
    /// Fetch and add (requester).
    FetchAdd,
    /// No-op (requester).
    Nop,
    /// A send arrived (responder).
    Recv,
    /// An RDMA write with immediate arrived (responder).
    RecvWriteImm,
}

/// One completion, decoded from a CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Success or the error syndrome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: CompletionOp,
    /// Bytes received (responder) or read (RDMA read; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (sends and writes with immediate), host order.
    pub imm: Option<u32>,
    /// The local QP.
    pub qpn: u32,
    /// The remote QP (responder completions).
    pub src_qpn: u32,
    /// The WQE counter of the CQE (SQ wqe_index or RQ index).
    pub wqe_counter: u16,
    /// Vendor syndrome of an error CQE.
    pub vendor_err: u8,
    /// Position of this completion in the CQ (free-running).
    pub cqe_index: u64,
}

impl Completion {
    /// Whether the work succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
    /// `Ok(self)` on success, else [`Error::Completion`].
    pub fn ok(self) -> Result<Self> {
        match self.status {
            WcStatus::Success => Ok(self),
            WcStatus::Error(syndrome) => Err(Error::Completion {
                wr_id: self.wr_id,
                qpn: self.qpn,
                syndrome,
            }),
        }
    }
}

/// A completion queue. Cloning gives another handle to the same queue.
#[derive(Clone)]
pub struct Cq {
    pub(crate) shared: Arc<CqShared>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("cqn", &self.shared.cqn)
            .field("entries", &self.shared.cnt)
            .finish()
    }
}

impl Cq {
    pub(crate) fn create(ctx: &Arc<DeviceContext>, entries: u32) -> Result<Self> {
        let max = ctx.provider.query_device().max_cqe;
        if entries == 0 || entries > max {
            return Err(Error::invalid(format!(
                "CQ size {entries} out of 1..={max}"
            )));
        }
        let cnt = entries.next_power_of_two();
        let ring = Arc::new(RingMem::new(cnt as usize * CQE_SIZE));
        // Every entry starts as opcode INVALID, owner 1: neither a CPU poll nor an
        // owner-bit wait can pass before the device writes the entry.
        for i in 0..cnt as usize {
            ring.u8(i * CQE_SIZE + 63)
                .store(CQE_INIT_OP_OWN, Ordering::Relaxed);
        }
        let ctrl = Arc::new(RingMem::new(128));
        let dbrec = MemAt {
            mem: ctrl.clone(),
            off: CQ_DBREC,
        };
        let cqn = ctx.provider.create_cq(CqSpec {
            ring: ring.clone(),
            entries: cnt,
            dbrec: dbrec.clone(),
        })?;
        let (ring, cnt, dbrec) = match ctx.provider.placed_cq(cqn) {
            Some(p) => (p.ring, p.entries, p.dbrec),
            None => (ring, cnt, dbrec),
        };
        let shared = Arc::new(CqShared {
            cqn,
            cnt,
            ring,
            ctrl,
            dbrec,
            reserved: AtomicU64::new(0),
            users: AtomicU32::new(0),
            shared_ever: AtomicBool::new(false),
            kernel_owned: AtomicBool::new(false),
            poll: Mutex::new(PollState {
                ci: 0,
                scanned: 0,
                last: None,
                errors: Vec::new(),
                errors_dropped: 0,
                reported: HashSet::new(),
            }),
            users_by_qpn: RwLock::new(HashMap::new()),
            ctx: ctx.clone(),
        });
        Ok(Cq { shared })
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }
    /// Number of entries (a power of two).
    pub fn entries(&self) -> u32 {
        self.shared.cnt
    }
    /// The consumer index: completions consumed so far, by host polls or executor waits.
    pub fn consumer_index(&self) -> u64 {
        self.shared.consumed()
    }

    /// One line for error reports: completions consumed, whether the next one is written,
    /// and the ring addresses (to match against a stalled executor's wait).
    pub fn describe(&self) -> String {
        let s = &*self.shared;
        let ci = s.consumed();
        let off = slot_off(0, ci, s.cnt, CQE_SIZE);
        let written = CqeOwner::is_new(s.ring.u8(off + 63).load(Ordering::Acquire), ci, s.cnt);
        format!(
            "CQ {:#x}: {ci} consumed, completion {ci} {} (its owner word at {:#x}), ring {:#x}..{:#x}",
            s.cqn,
            if written { "written" } else { "not written yet" },
            s.ring.addr(off + CQE_OWNER_WORD_OFFSET),
            s.ring.addr(0),
            s.ring.addr(0) + (s.cnt as usize * CQE_SIZE) as u64,
        )
    }

    /// Polls up to `max` completions into `out`; returns how many were added.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.poll_with(max, |c| out.push(c))
    }

    fn poll_with(&self, max: usize, mut sink: impl FnMut(Completion)) -> Result<usize> {
        let s = &*self.shared;
        if s.kernel_owned.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "CQ {:#x} is consumed by a GPU kernel (DeviceQp): the host cannot poll it",
                s.cqn
            )));
        }
        let mut st = s.poll.lock();
        // Completions an executor or kernel consumed are consumed.
        s.catch_up(&mut st);
        let mut n = 0;
        while n < max {
            let off = slot_off(0, st.ci, s.cnt, CQE_SIZE);
            let op_own = s.ring.u8(off + 63).load(Ordering::Acquire);
            if !CqeOwner::is_new(op_own, st.ci, s.cnt) {
                break;
            }
            let mut cqe = Cqe64([0; 64]);
            s.ring.read(off, &mut cqe.0);
            let c = decode(&cqe, st.ci, &mut st.last, &s.users_by_qpn);
            if !c.is_ok() {
                let in_error = st.last.as_ref().is_some_and(|(_, q)| q.in_error());
                log_polled_error(s, &c, in_error);
                if st.ci >= st.scanned {
                    st.keep_error(cq_error(&cqe), true);
                }
            }
            st.ci += 1;
            st.scanned = st.scanned.max(st.ci);
            s.store_ci(st.ci);
            sink(c);
            n += 1;
        }
        if n == 0 && s.ctx.cq_overran(s.cqn) {
            return Err(Error::CqOverrun { cqn: s.cqn });
        }
        if n == 0 {
            // Nothing yet: where the device is served by the host's threads, this is one.
            drop(st);
            s.ctx.provider.idle();
        }
        Ok(n)
    }

    /// The error completions written since the last call, whether a CPU poll or an executor's
    /// wait consumed them. Call it after a stream synchronises to learn whether work it
    /// waited for failed (a wait on a completion passes for errors too).
    ///
    /// Errors are learnt from the CQEs themselves: those a CPU poll decoded, those an executor
    /// or kernel consumed (still in the ring), and those written and not consumed yet. Where
    /// the device has since written over a consumed CQE (executors ran more than a ring
    /// ahead of the last call), each QP's first error comes from the device, which keeps it
    /// in the QP's context; the flushes that followed it are then not reported.
    pub fn take_errors(&self) -> Vec<CqError> {
        let s = &*self.shared;
        let mut st = s.poll.lock();
        s.catch_up(&mut st);
        if s.scan(&mut st) {
            s.recover_lost_errors(&mut st);
        }
        let errors = std::mem::take(&mut st.errors);
        let dropped = std::mem::take(&mut st.errors_dropped);
        drop(st);
        log_taken_errors(s, &errors);
        if dropped > 0 {
            tracing::warn!(
                "CQ {:#x}: {dropped} more error completions since the last take_errors than the {MAX_KEPT_ERRORS} kept: the first ones are returned",
                s.cqn
            );
        }
        errors.into_iter().map(|(e, _)| e).collect()
    }

    /// `Err` with the first error completion since the last check (see
    /// [`take_errors`](Self::take_errors)), also when the CQ overran.
    pub fn check(&self) -> Result<()> {
        if self.shared.ctx.cq_overran(self.shared.cqn) {
            return Err(Error::CqOverrun {
                cqn: self.shared.cqn,
            });
        }
        match self.take_errors().first() {
            None => Ok(()),
            Some(e) => Err(Error::Completion {
                wr_id: u64::MAX,
                qpn: e.qpn,
                syndrome: e.syndrome,
            }),
        }
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut out = None;
        self.poll_with(1, |c| out = Some(c))?;
        Ok(out)
    }

    /// Polls until a completion arrives (spinning, then backing off), or `timeout` passes.
    pub fn wait_one(&self, timeout: Duration) -> Result<Completion> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            for _ in 0..64 {
                if let Some(c) = self.poll_one()? {
                    return Ok(c);
                }
                // (An empty poll already lent the thread to the engines.)
                backoff.pause();
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!("a completion on CQ {:#x}", self.shared.cqn),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
        }
    }

    /// The op list that waits for completion number `n` (free-running) and then consumes it:
    /// a wait on the owner bit of its CQE (which error CQEs satisfy too) and a store of the
    /// new consumer index to the doorbell record, which the host reads back, so no CPU poll
    /// is needed afterwards.
    pub fn wait_ops(&self, n: u64) -> Ops {
        wait_ops(&self.shared, n)
    }
}

/// Most error completions a CQ keeps for [`Cq::take_errors`] between two calls.
pub const MAX_KEPT_ERRORS: usize = 1024;

/// Logs an error completion a CPU poll decoded: at error level with its syndrome and what it
/// means, or at debug level for flushed work (the first error says why).
#[cold]
fn log_polled_error(s: &CqShared, c: &Completion, in_error: bool) {
    let WcStatus::Error(syndrome) = c.status else {
        return;
    };
    let e = Error::Completion {
        wr_id: c.wr_id,
        qpn: c.qpn,
        syndrome,
    };
    let (cqn, wqe, vendor) = (s.cqn, c.wqe_counter, c.vendor_err);
    let state = if in_error {
        "; the QP is in the error state"
    } else {
        ""
    };
    if syndrome == Syndrome::WrFlush {
        tracing::debug!("CQ {cqn:#x}: {e} (WQE {wqe}){state}");
    } else {
        tracing::error!("CQ {cqn:#x}: {e} (WQE {wqe}, vendor syndrome {vendor:#x}){state}");
    }
}

/// Logs the error completions [`Cq::take_errors`] hands out that no CPU poll logged (an
/// executor consumed them), as [`log_polled_error`] does.
#[cold]
fn log_taken_errors(s: &CqShared, errors: &[(CqError, bool)]) {
    for (e, logged) in errors {
        if *logged {
            continue;
        }
        let side = if e.responder { "receive" } else { "send" };
        let what = crate::error::describe_syndrome(e.syndrome);
        let (cqn, qpn, wqe) = (s.cqn, e.qpn, e.wqe_counter);
        if e.syndrome == Syndrome::WrFlush {
            tracing::debug!("CQ {cqn:#x}: a {side} on QP {qpn:#x} (WQE {wqe}) failed with {what}");
        } else {
            tracing::error!("CQ {cqn:#x}: a {side} on QP {qpn:#x} (WQE {wqe}) failed with {what}");
        }
    }
}

pub(crate) fn wait_ops(s: &Arc<CqShared>, n: u64) -> Ops {
    let (ring, _, dbrec) = s.keep();
    let (cond, value) = CqeOwner::wait_word(n, s.cnt);
    let word = s
        .ring
        .addr(slot_off(0, n, s.cnt, CQE_SIZE) + CQE_OWNER_WORD_OFFSET);
    let mut ops = Ops::new();
    ops.push(
        Op::Wait32 {
            addr: word,
            value,
            cond,
        },
        &ring,
    );
    // Consumed: the slot is the device's again (an error it held is found by the host's
    // scan while the ring still holds it, else from the QP's context).
    ops.push(
        Op::Write32 {
            addr: s.dbrec.addr(),
            value: cq_ci_value(n + 1).native(),
        },
        &dbrec,
    );
    debug_assert!(matches!(cond, WaitCond::And | WaitCond::Nor));
    ops
}

fn decode(
    cqe: &Cqe64,
    index: u64,
    last: &mut Option<(u32, Arc<dyn CqUser>)>,
    users: &RwLock<HashMap<u32, Weak<dyn CqUser>>>,
) -> Completion {
    let qpn = cqe.qpn();
    if last.as_ref().is_none_or(|(n, _)| *n != qpn) {
        *last = users
            .read()
            .get(&qpn)
            .and_then(Weak::upgrade)
            .map(|q| (qpn, q));
    }
    let qp = last.as_ref().map(|(_, q)| q);
    let op = cqe.opcode().unwrap_or(CqeOpcode::Invalid);
    let status = if op.is_error() {
        WcStatus::Error(cqe.syndrome().unwrap_or(Syndrome::LocalQpOp))
    } else {
        WcStatus::Success
    };
    let is_req = matches!(op, CqeOpcode::Req | CqeOpcode::ReqErr);
    let wqe_counter = cqe.wqe_counter();
    let wr_id = match (&qp, is_req) {
        (Some(q), true) => q.retire_send(wqe_counter),
        (Some(q), false) => q.retire_recv(wqe_counter),
        (None, _) => 0,
    };
    let opcode = if is_req {
        match Opcode::from_u8(cqe.wqe_opcode()) {
            Some(Opcode::Send | Opcode::SendImm) => CompletionOp::Send,
            Some(Opcode::RdmaWrite | Opcode::RdmaWriteImm) => CompletionOp::Write,
            Some(Opcode::RdmaRead) => CompletionOp::Read,
            Some(Opcode::AtomicCs) => CompletionOp::CompareSwap,
            Some(Opcode::AtomicFa) => CompletionOp::FetchAdd,
            _ => CompletionOp::Nop,
        }
    } else if op == CqeOpcode::RespWrImm {
        CompletionOp::RecvWriteImm
    } else {
        CompletionOp::Recv
    };
    let imm = matches!(op, CqeOpcode::RespWrImm | CqeOpcode::RespSendImm)
        .then(|| u32::from_be_bytes(cqe.imm()));
    let byte_len = match op {
        CqeOpcode::Req if matches!(opcode, CompletionOp::CompareSwap | CompletionOp::FetchAdd) => 8,
        _ if op.is_error() => 0,
        _ => cqe.byte_cnt(),
    };
    Completion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm,
        qpn,
        src_qpn: cqe.flags_rqpn() & 0xFF_FFFF,
        wqe_counter,
        vendor_err: if op.is_error() {
            cqe.vendor_syndrome()
        } else {
            0
        },
        cqe_index: index,
    }
}
