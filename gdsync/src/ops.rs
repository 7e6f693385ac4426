//! Memory-operation lists: the vocabulary every trigger and every wait is expressed in.
//!
//! Posting a work request leaves memory operations to do (barrier, store the doorbell record,
//! barrier, ring the 8-byte doorbell, barrier, publish how far the queue is rung); waiting for
//! a completion is a wait on a CQE word followed by stores of the new consumer index and a retired counter. An [`Ops`] list holds
//! such operations together with handles that keep the memory they point to alive, so running
//! a list is always memory-safe. Executors ([`crate::exec`]) run lists: on the calling thread,
//! on a host stream, later on a CUDA stream or exported to a kernel.

use smallvec::SmallVec;
use std::any::Any;
use std::sync::Arc;

/// Condition of a wait, with CUDA's `cuStreamWaitValue` semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitCond {
    /// `(signed)(*addr - value) >= 0`: wrap-aware "greater or equal".
    Geq,
    /// `*addr == value`.
    Eq,
    /// `(*addr & value) != 0`.
    And,
    /// `~(*addr | value) != 0`.
    Nor,
}

impl WaitCond {
    /// The condition's code in the kernel header and descriptors (`GDS_COND_*`): GEQ 0, EQ 1,
    /// AND 2, NOR 3.
    pub const fn code(self) -> u32 {
        match self {
            WaitCond::Geq => 0,
            WaitCond::Eq => 1,
            WaitCond::And => 2,
            WaitCond::Nor => 3,
        }
    }
    /// Whether a 32-bit word `cur` satisfies the condition against `value`.
    pub const fn test32(self, cur: u32, value: u32) -> bool {
        match self {
            WaitCond::Geq => (cur.wrapping_sub(value) as i32) >= 0,
            WaitCond::Eq => cur == value,
            WaitCond::And => cur & value != 0,
            WaitCond::Nor => !(cur | value) != 0,
        }
    }
    /// Whether a 64-bit word `cur` satisfies the condition against `value`.
    pub const fn test64(self, cur: u64, value: u64) -> bool {
        match self {
            WaitCond::Geq => (cur.wrapping_sub(value) as i64) >= 0,
            WaitCond::Eq => cur == value,
            WaitCond::And => cur & value != 0,
            WaitCond::Nor => !(cur | value) != 0,
        }
    }
}

/// One memory operation. Addresses are host addresses of memory the list keeps alive (ring
/// memory, signal words, pinned buffers: a CPU executor stores there), or whatever address the
/// caller of [`Ops::push_raw`] gave; an executor on a GPU resolves each through the list to
/// the GPUs' address of that memory (`mem::gpu_addr_in`). Values are native integers, i.e. what
/// a plain load of the word returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Store a 32-bit value. A write implies no ordering with earlier work: put a
    /// [`Op::Barrier`] before it where that matters.
    Write32 {
        /// Target address, 4-byte aligned.
        addr: u64,
        /// Value to store.
        value: u32,
    },
    /// Store a 64-bit value in one access (the doorbell needs one 8-byte write).
    Write64 {
        /// Target address, 8-byte aligned.
        addr: u64,
        /// Value to store.
        value: u64,
    },
    /// Block until a 32-bit word satisfies a condition.
    Wait32 {
        /// Address of the word, 4-byte aligned.
        addr: u64,
        /// Operand of the condition.
        value: u32,
        /// The condition.
        cond: WaitCond,
    },
    /// Block until a 64-bit word satisfies a condition.
    Wait64 {
        /// Address of the word, 8-byte aligned.
        addr: u64,
        /// Operand of the condition.
        value: u64,
        /// The condition.
        cond: WaitCond,
    },
    /// Order every earlier store before every later one, system-wide.
    Barrier,
    /// Ring a send queue's doorbell register: one 8-byte store, as [`Op::Write64`], to a
    /// register that may be write-combining device memory (a ConnectX's UAR). A CPU executor
    /// pushes the store out of the core's write-combining buffer right after it (one store
    /// fence per doorbell, as libmlx5's `mmio_flush_writes`); a CUDA stream or kernel writes
    /// it as any other 64-bit value (its writes leave no such buffer behind).
    Doorbell {
        /// The register's address, 8-byte aligned.
        addr: u64,
        /// The 8 doorbell bytes, as a native 64-bit store writes them.
        value: u64,
    },
    /// Copy `len` bytes from `src` to `dst` (ranges that do not overlap), after every earlier
    /// op and before every later one: how a payload in memory the NIC cannot reach (GPU
    /// memory without GPUDirect RDMA) moves through a pinned host bounce buffer in the
    /// trigger's own order ([`crate::staging`]). A CPU executor copies with the CPU (both
    /// ranges must be CPU-reachable); a CUDA stream runs a list with copies as one list kernel
    /// where it can, else copies between its memory operations, with a copy kernel where both
    /// ranges are reachable from its GPU and the kernels are prepared
    /// (`cuda::prepare_staged_copies`), else with `cuMemcpyAsync`.
    Copy {
        /// Destination address.
        dst: u64,
        /// Source address.
        src: u64,
        /// Bytes to copy.
        len: u64,
    },
}

impl Op {
    /// Whether this is a wait.
    pub const fn is_wait(&self) -> bool {
        matches!(self, Op::Wait32 { .. } | Op::Wait64 { .. })
    }
    /// Whether this is a store (a write or a doorbell).
    pub const fn is_store(&self) -> bool {
        matches!(
            self,
            Op::Write32 { .. } | Op::Write64 { .. } | Op::Doorbell { .. }
        )
    }
    /// Whether this is a copy (which a CUDA stream runs in a list kernel, or between batches
    /// of memory operations).
    pub const fn is_copy(&self) -> bool {
        matches!(self, Op::Copy { .. })
    }
}

/// Something an op list keeps alive while it exists (the memory its addresses point into).
pub(crate) type KeepAlive = Arc<dyn Any + Send + Sync>;

/// An ordered list of memory operations, with the memory it touches kept alive.
#[derive(Clone, Default)]
pub struct Ops {
    ops: SmallVec<[Op; 4]>,
    keep: SmallVec<[KeepAlive; 2]>,
    /// `Some((start, qp))`: `ops[start..]` rings the doorbell of the send queue `qp` (its
    /// doorbell record's address) and nothing follows it but the deferred stores.
    ring_tail: Option<(usize, u64)>,
    /// The last `retire` ops store a completion's retirement (the CQ's consumer index, a
    /// ring's retired counter): what [`retire_late`](Self::retire_late) defers.
    retire: usize,
    /// The last `deferred` ops are retirement stores that [`append`](Self::append) keeps at
    /// the end, until a list with a wait is appended.
    deferred: usize,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.ops.iter()).finish()
    }
}

impl Ops {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }
    /// The operations, in order.
    pub fn as_slice(&self) -> &[Op] {
        &self.ops
    }
    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Appends every operation of `other` (and what it keeps alive).
    ///
    /// A doorbell of a send queue directly followed by another doorbell of the same queue
    /// is dropped: the later one exposes every request the earlier one did (one doorbell for
    /// several requests, as `ibv_post_send` rings once for a list), and an executor saves
    /// the stores.
    ///
    /// Retirement stores deferred with [`retire_late`](Self::retire_late) stay at the end:
    /// `other`'s operations go before them, unless `other` waits (a wait never runs before a
    /// retirement stored ahead of it in the list, so that no wait can depend on one held back).
    pub fn append(&mut self, mut other: Ops) {
        let waits = other.ops[..other.ordinary_len()].iter().any(Op::is_wait);
        let mut held = SmallVec::<[Op; 4]>::new();
        if waits {
            // The held stores run before the wait, as written.
            self.retire_now();
        } else {
            held.extend(self.ops.drain(self.ordinary_len()..));
        }
        held.extend(other.ops.drain(other.ordinary_len()..));
        self.deferred = 0;
        other.deferred = 0;
        self.append_ordinary(other);
        self.deferred = held.len();
        self.ops.extend(held);
        self.retire = 0;
    }

    /// [`append`](Self::append) of a list without deferred stores onto one without any.
    fn append_ordinary(&mut self, other: Ops) {
        let base = match (self.ring_tail, other.ring_tail) {
            (Some((start, a)), Some((0, b))) if a == b => {
                self.ops.truncate(start);
                start
            }
            _ => self.ops.len(),
        };
        self.ops.extend(other.ops);
        self.ring_tail = other.ring_tail.map(|(s, qp)| (base + s, qp));
        for k in other.keep {
            self.keep_alive(k);
        }
    }
    /// Operations before the deferred stores.
    fn ordinary_len(&self) -> usize {
        self.ops.len() - self.deferred
    }
    /// Lets what is appended to this list later run before its last operations, the stores
    /// that retire the completion it waits for (the consumer index, a retired counter), until
    /// a list with a wait is appended: the work that follows the wait (a send's doorbell,
    /// say) starts an operation or two earlier, and the retirement runs after it. The
    /// retirement still runs in this list, after its wait, so whoever learns of the
    /// completion from it learns of it that much later, and nothing else changes. A CQ fills
    /// only with completions of posted work, and a receive's slot is posted again only once
    /// its retirement is seen, so deferring the consumer index delays reposting, never
    /// overruns the CQ. A CPU that learns of the completion from a store appended after the
    /// wait (a flag) may see it before the retirement: call [`retire_now`](Self::retire_now)
    /// and append an [`Op::Barrier`] before such a store (a store orders nothing by itself).
    ///
    /// Lists other than completion waits have no retirement stores: for them this does
    /// nothing.
    pub fn retire_late(mut self) -> Self {
        self.deferred = self.retire;
        self
    }
    /// Ends the deferral: the retirement stores held at the end of the list run before anything
    /// appended from now on, as written.
    pub fn retire_now(&mut self) {
        if self.deferred > 0 {
            // Stores follow the ring now: it can no longer be merged with a later one.
            self.ring_tail = None;
        }
        self.settle();
    }
    /// Number of operations at the end that [`append`](Self::append) keeps last.
    pub fn deferred_len(&self) -> usize {
        self.deferred
    }
    /// Appends a store that retires a completion this list waits for (the consumer index, a
    /// retired counter): it may be deferred with [`retire_late`](Self::retire_late).
    pub(crate) fn push_retire(&mut self, op: Op, keep: &KeepAlive) {
        let retire = self.retire;
        self.push(op, keep);
        self.retire = retire + 1;
    }
    /// Ends the deferral: later pushes go after the deferred stores, as written.
    fn settle(&mut self) {
        self.deferred = 0;
        self.retire = 0;
    }
    /// Marks the whole list as the ring of the doorbell whose record is at `dbrec`, so that
    /// [`append`](Self::append) can merge it with a ring of the same queue just before it.
    pub(crate) fn mark_ring(&mut self, dbrec: u64) {
        self.ring_tail = Some((0, dbrec));
    }
    /// A list of one [`Op::Barrier`] (which names no memory).
    pub fn barrier() -> Self {
        let mut o = Self::new();
        o.ops.push(Op::Barrier);
        o
    }
    /// Appends an operation on arbitrary memory, which the list does not keep alive.
    ///
    /// Memory the library owns has builders that return lists keeping it alive instead
    /// ([`SignalWords`](crate::SignalWords), [`PinnedBuffer`](crate::PinnedBuffer), the
    /// lists of queue pairs and completion queues): prefer them.
    ///
    /// # Safety
    /// Every address in `op` must stay valid for the access (and suitably aligned) until
    /// every executor that runs this list has finished with it: for a stream, until it has
    /// passed the list, whatever handle the memory came from has been dropped meanwhile.
    pub unsafe fn push_raw(&mut self, op: Op) {
        self.settle();
        self.ops.push(op);
        self.ring_tail = None;
    }
    /// Appends an op whose memory is kept alive by `keep` (library-internal).
    pub(crate) fn push(&mut self, op: Op, keep: &KeepAlive) {
        self.settle();
        self.ops.push(op);
        self.ring_tail = None;
        self.keep_alive(keep.clone());
    }
    /// Appends a copy of `len` bytes from `src` to `dst`, keeping `keep` (the memory of both
    /// sides) alive with the list (library-internal).
    pub(crate) fn push_copy(&mut self, dst: u64, src: u64, len: u64, keep: &[&KeepAlive]) {
        self.settle();
        self.ops.push(Op::Copy { dst, src, len });
        self.ring_tail = None;
        for k in keep {
            self.keep_alive((*k).clone());
        }
    }
    /// The list cut at its copies: runs of other ops (each keeping everything this list
    /// keeps) and the copies between them, in order, for an executor that runs copies apart
    /// from memory operations (a CUDA stream). A list without copies is one run.
    pub(crate) fn split_at_copies(&self) -> Vec<Result<Ops, Op>> {
        let mut out = Vec::new();
        let mut run = Ops::new();
        for op in &self.ops {
            if op.is_copy() {
                if !run.is_empty() {
                    out.push(Ok(std::mem::take(&mut run)));
                }
                out.push(Err(*op));
            } else {
                run.ops.push(*op);
                if run.keep.is_empty() {
                    run.keep = self.keep.clone();
                }
            }
        }
        if !run.is_empty() {
            out.push(Ok(run));
        }
        out
    }
    /// Keeps `owner` alive with the list: the memory that ops pushed with
    /// [`push_raw`](Self::push_raw) name (a GPU buffer, a bounce), so the list stays valid
    /// after its maker's handles are dropped.
    pub fn keep_alive_with(&mut self, owner: Arc<dyn Any + Send + Sync>) {
        self.keep_alive(owner);
    }
    /// Keeps `keep` alive with the list without naming memory an op touches (e.g. a
    /// reservation that ends when the list has run or is dropped).
    pub(crate) fn hold(&mut self, keep: KeepAlive) {
        self.keep_alive(keep);
    }
    /// What the list keeps alive: the memory its ops name (where a GPU executor looks up
    /// the GPUs' address of an op's memory).
    pub(crate) fn kept(&self) -> &[KeepAlive] {
        &self.keep
    }
    fn keep_alive(&mut self, k: KeepAlive) {
        if !self.keep.iter().any(|h| Arc::ptr_eq(h, &k)) {
            self.keep.push(k);
        }
    }
}

/// Builds an op list from `ops` on arbitrary memory (tests).
///
/// # Safety
/// Every address in `ops` must stay valid and aligned until every executor that runs the list
/// has finished with it.
#[cfg(test)]
pub(crate) unsafe fn ops_of(ops: &[Op]) -> Ops {
    let mut l = Ops::new();
    for &op in ops {
        // SAFETY: forwarded to the caller.
        unsafe { l.push_raw(op) };
    }
    l
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
