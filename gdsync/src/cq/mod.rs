//! Completion queues: a ring of 64-byte mlx5 CQEs the device writes, polled on the host or
//! waited for by an executor.

mod errors;
mod kernel;
mod poll;
#[cfg(test)]
mod poll_tests;
mod reserve;

pub use crate::format::CompletionOp;
pub use errors::{CqError, MAX_KEPT_ERRORS};
pub use poll::CqPoll;

use crate::backoff::Backoff;
use crate::context::DeviceContext;
use crate::format::{
    cq_ci_value, CqeOwner, Syndrome, CQE_INIT_OP_OWN, CQE_OWNER_WORD_OFFSET, CQE_SIZE,
};
use crate::mem::{slot_off, RingMem};
use crate::ops::{KeepAlive, Op, Ops, WaitCond};
use crate::provider::{CqMem, CqSpec, MemAt};
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
    /// The completions that prepared executor waits cover: CPU polls leave them alone.
    waits: Arc<reserve::Waits>,
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
}

impl Drop for CqShared {
    fn drop(&mut self) {
        self.ctx.provider.destroy_cq(self.cqn);
    }
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
        let attr = ctx.provider.query_device();
        let max = attr.max_cqe;
        if entries == 0 || entries > max {
            return Err(Error::invalid(format!(
                "CQ size {entries} out of 1..={max}"
            )));
        }
        let cnt = entries.next_power_of_two();
        let ctrl = Arc::new(RingMem::new(128, ctx.cuda.as_ref()));
        // A device that owns its rings is given none; otherwise every entry starts as opcode
        // INVALID, owner 1: neither a CPU poll nor an owner-bit wait can pass before the
        // device writes the entry.
        let mem = (!attr.owns_rings).then(|| {
            let ring = Arc::new(RingMem::new(cnt as usize * CQE_SIZE, ctx.cuda.as_ref()));
            for i in 0..cnt as usize {
                ring.u8(i * CQE_SIZE + 63)
                    .store(CQE_INIT_OP_OWN, Ordering::Relaxed);
            }
            let dbrec = MemAt {
                mem: ctrl.clone(),
                off: CQ_DBREC,
            };
            CqMem { ring, dbrec }
        });
        let spec = CqSpec {
            entries: cnt,
            mem: mem.clone(),
        };
        let created = ctx.provider.create_cq(spec)?;
        let cqn = created.cqn;
        let (CqMem { ring, dbrec }, cnt) = match (created.device_rings, mem) {
            (Some(d), _) => (d.mem, d.entries),
            (None, Some(mem)) => (mem, cnt),
            (None, None) => {
                ctx.provider.destroy_cq(cqn);
                return Err(Error::invalid(format!(
                    "CQ {cqn:#x}: {} owns its rings but gave none",
                    ctx.provider.name()
                )));
            }
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
            waits: Arc::default(),
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
        let mut polled = self.poll_iter()?;
        let mut n = 0;
        while n < max {
            let Some(c) = polled.next() else { break };
            sink(c?);
            n += 1;
        }
        Ok(n)
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
    ///
    /// The store consumes every completion up to `n`: until the list has run (or every copy
    /// of it is dropped unrun), CPU polls of those completions fail with
    /// [`Error::CqBusy`]. Refused where the store would move the consumer index backwards
    /// (completion `n` is polled past already, or a wait for a later completion is
    /// prepared: prepare waits on one CQ in completion order) and on a CQ a GPU kernel
    /// consumes.
    pub fn wait_ops(&self, n: u64) -> Result<Ops> {
        wait_ops(&self.shared, n, Ops::new())
    }
}

/// The wait for completion `n` of the CQ, then `between`, then the store of the consumer
/// index that retires it: whoever learns of the completion from that index (a CPU's poll while
/// an executor consumes the CQ) knows `between` ran too.
pub(crate) fn wait_ops(s: &Arc<CqShared>, n: u64, between: Ops) -> Result<Ops> {
    let hold = s.reserve_wait(n)?;
    let ring: KeepAlive = s.ring.clone();
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
    let stores = between.as_slice().iter().any(Op::is_store);
    ops.append(between);
    let dbrec: KeepAlive = s.dbrec.mem.clone();
    if stores {
        // Whoever learns of the completion from the retirement knows `between` ran: its stores
        // first (a store orders nothing by itself; a stream elides the barrier).
        ops.push_retire(Op::Barrier, &dbrec);
    }
    // Consumed: the slot is the device's again (an error it held is found by the host's
    // scan while the ring still holds it, else from the QP's context). The list keeps the
    // doorbell record's memory (where a GPU executor finds its address) and `hold`, which
    // keeps the completions up to `n` reserved until the list has run or is dropped.
    ops.push_retire(
        Op::Write32 {
            addr: s.dbrec.addr(),
            value: cq_ci_value(n + 1).native(),
        },
        &dbrec,
    );
    ops.hold(hold);
    debug_assert!(matches!(cond, WaitCond::And | WaitCond::Nor));
    Ok(ops)
}
