//! The CUDA stream executor: runs op lists as `cuStreamBatchMemOp` (v2 API only), or a list
//! with staged copies as a list kernel (`list_kernel.rs`), at the GPUs' addresses of the memory
//! they name (`mem::gpu_addr_in`), and holds each list until the stream has run it.

use super::list_profile::ListProfile;
use super::{check, failed, Cuda, GpuCaps, InboundWrites};
use crate::backoff::Backoff;
use crate::mem::{gpu_addr_in, RingMem};
use crate::ops::{Op, Ops, WaitCond};
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `cuStreamBatchMemOp` takes fewer than 256 operations per call.
const MAX_BATCH: usize = 255;

/// Most memory operations one stream may have enqueued and not yet executed. Enqueuing
/// thousands behind a wait that is not satisfied yet fills the GPU's command queue and blocks
/// the enqueuing thread inside the driver (seen at ~2000 on an H200; 200 was fine). If that
/// thread is the one that would satisfy the wait, it is a deadlock; so past this bound
/// [`CudaStream::enqueue`] waits for earlier work to drain, and gives up with an error
/// instead of blocking forever.
pub const MAX_QUEUED_OPS: usize = 512;

/// The stream writes its progress word at the end of at least one list in this many (and after
/// at most `MARK_OPS` operations): each write costs the GPU ~0.6 µs (H200), as much as a
/// doorbell, so most lists go without one. A list without its own write is known to have run
/// once a later list's write lands, or once the stream is idle (`cuStreamQuery`).
pub const MARK_EVERY: u32 = 8;
/// See [`MARK_EVERY`].
const MARK_OPS: usize = 128;

/// Which lists a stream runs as list kernels (`GDSYNC_LIST_KERNEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKernel {
    /// Lists with staged copies, where the list allows.
    Staged,
    /// Lists with staged copies where the list allows, and, while this process has streams on
    /// more than one GPU, lists without copies too: on a two-H200 host a stream's own stores
    /// cost about 3 µs each while streams on both GPUs run them, where a list kernel orders its
    /// stores with one fence per barrier (docs/benchmarks.md, "pingpong across two GPUs"); on
    /// one GPU neither way wins for every list ([`All`](Self::All)). Other processes' streams
    /// count where the job says its ranks on this host span GPUs
    /// ([`set_job_spans_gpus`](super::set_job_spans_gpus)). The default.
    Auto,
    /// None: memory-operation batches, with a copy kernel or the copy engines between them.
    Off,
    /// Every list the list kernel can run, with copies or without. On one H200 this kept four
    /// stencil2d ranks sharing the GPU out of a slow mode that memory operations fall into one
    /// run in two or three, left gdsync's stream sends as fast, and made `mp`'s send 17% slower.
    All,
}

impl ListKernel {
    /// `GDSYNC_LIST_KERNEL` (`auto` | `staged` | `off` | `all`); unset: auto.
    pub fn from_env() -> Result<ListKernel> {
        Ok(
            match crate::env::choice("GDSYNC_LIST_KERNEL", &["auto", "staged", "off", "all"])? {
                Some("staged") => ListKernel::Staged,
                Some("off") => ListKernel::Off,
                Some("all") => ListKernel::All,
                _ => ListKernel::Auto,
            },
        )
    }

    /// Whether a list without copies runs as a list kernel now.
    pub(super) fn copy_free_lists(self) -> bool {
        match self {
            ListKernel::All => true,
            ListKernel::Auto => super::stream_span::spans_gpus(),
            ListKernel::Staged | ListKernel::Off => false,
        }
    }
}

/// An enqueued list, kept alive until the stream is known to have run it.
struct Pending {
    seq: u32,
    ops: usize,
    /// The list itself: keeps the memory it points into alive, and says what it waits for.
    list: Ops,
}

/// What the stream has run, as the stream itself reports it: every few enqueued lists end with
/// a write of their sequence number into `done` (pinned host memory), so that knowing which
/// lists have run is a load, not a driver call (an event per list cost the enqueuing thread
/// several driver calls, ~10 µs per list with two threads enqueuing on one GPU).
struct Lists {
    pending: VecDeque<Pending>,
    /// Sequence number of the last list enqueued.
    seq: u32,
    /// Lists, and their operations, enqueued since the last one that writes its number.
    unmarked: u32,
    unmarked_ops: usize,
}

/// A CUDA stream that runs op lists: writes as `WRITE_VALUE_32/64`, waits as
/// `WAIT_VALUE_32/64` (GEQ, EQ, AND, NOR), barriers as system-scope memory barriers.
/// 64-bit writes become two 32-bit writes (low word first) where the GPU lacks 64-bit memops.
/// A list with staged copies runs as one list kernel where it can ([`ListKernel`]).
///
/// The memory an enqueued list points into is kept alive until the stream has run it.
pub struct CudaStream {
    raw: sys::CUstream,
    /// Made by us (destroyed on drop), or the program's ([`Cuda::wrap_stream`]).
    owned: bool,
    ordinal: i32,
    cuda: Arc<Cuda>,
    caps: GpuCaps,
    lists: Mutex<Lists>,
    /// The sequence number of the last list the stream ran (32 bits: one write, on any GPU).
    done: RingMem,
    timeout: Duration,
    /// How lists with staged copies run (`GDSYNC_LIST_KERNEL`, read when the stream is made).
    list_kernel: ListKernel,
    /// The list kernel's timestamps, with `GDSYNC_LIST_PROFILE=1` (logged on drop).
    profile: Option<Box<ListProfile>>,
}

// SAFETY: CUDA streams may be used from any thread once their context is bound (done per call).
unsafe impl Send for CudaStream {}
// SAFETY: the pending list is behind a mutex; the stream handle is thread-safe in the driver.
unsafe impl Sync for CudaStream {}

impl std::fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStream")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl Cuda {
    /// A new non-blocking stream on GPU `ordinal`. It runs its first work before it is
    /// returned (a memory operation, and the staged-copy kernel where staging bounces made
    /// before it compiled one; at most 5 s, then a warning): a new stream's first work queued
    /// while another stream waited has been seen never to run. Make streams before any of
    /// them waits for a peer.
    pub fn new_stream(self: &Arc<Self>, ordinal: i32) -> Result<CudaStream> {
        self.stream_on(ordinal, None)
    }

    /// Runs op lists on `raw`, a stream the program made in GPU `ordinal`'s primary context
    /// (the CUDA runtime's streams are), in order with the program's own work on it. The
    /// stream stays the program's: dropping the returned value waits for the lists, not for
    /// the stream, and does not destroy it.
    ///
    /// # Safety
    /// `raw` is a live stream of GPU `ordinal`'s primary context (or NULL, the legacy default
    /// stream), and stays alive as long as the returned value.
    pub unsafe fn wrap_stream(
        self: &Arc<Self>,
        ordinal: i32,
        raw: sys::CUstream,
    ) -> Result<CudaStream> {
        self.stream_on(ordinal, Some(raw))
    }

    /// A stream executor on `raw` (the program's), or on a new stream of ours (`None`).
    fn stream_on(self: &Arc<Self>, ordinal: i32, raw: Option<sys::CUstream>) -> Result<CudaStream> {
        let caps = self.gpu(ordinal)?.caps.clone();
        let list_kernel = ListKernel::from_env()?;
        if list_kernel == ListKernel::All
            || (list_kernel == ListKernel::Auto
                && (self.gpus.len() > 1 || super::stream_span::job_spans_gpus()))
        {
            // Lists without copies may run as the list kernel: load it on every GPU when the
            // process makes its first stream, before any of its streams can wait (loading a
            // module waits for the GPU to go idle, which a waiting stream never lets it).
            // Streams made meanwhile on other threads wait here for that load.
            static FIRST: std::sync::Once = std::sync::Once::new();
            FIRST.call_once(|| super::prepare_staged_copies(self));
        }
        let profile = ListProfile::from_env(ordinal)?.map(Box::new);
        if !self.host_pointers_are_device_pointers() {
            return Err(Error::Unsupported(
                "stream memory operations on host memory need unified addressing and CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM".into(),
            ));
        }
        self.bind(ordinal)?;
        let done = RingMem::new(64, Some(self));
        if !done.gpu_mapped() {
            return Err(Error::Unsupported(
                "pinned host memory could not be mapped for the GPU (cuMemHostRegister)".into(),
            ));
        }
        let ctx = self.gpu_ctx(ordinal)?;
        let (raw, owned) = match raw {
            Some(raw) => (raw, false),
            None => (self.create_stream(ordinal)?, true),
        };
        let stream = CudaStream {
            raw,
            owned,
            ordinal,
            cuda: self.clone(),
            caps,
            lists: Mutex::new(Lists {
                pending: VecDeque::new(),
                seq: 0,
                unmarked: 0,
                unmarked_ops: 0,
            }),
            done,
            timeout: crate::exec::DEFAULT_WAIT_TIMEOUT,
            list_kernel,
            profile,
        };
        super::stream_span::opened(ordinal);
        super::idle_streams::watch(raw, ctx);
        if owned {
            stream.warm_up();
        }
        Ok(stream)
    }
}

/// How long a new stream's first work may take before the warning.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(5);

impl CudaStream {
    /// Runs the kinds of work a stream of ours runs (a memory operation, and the staging
    /// kernels where they were compiled for its GPU) once, and waits for them. On an H200, a new
    /// stream whose first work was queued while another stream of the process stood in a
    /// memory wait sometimes never ran it: two ranks each waiting for the other's first
    /// message stalled at the start in 26 of 193 runs, nothing posted by either. A stream
    /// that has run its first work before any wait is queued has not shown it. Bounded: a
    /// stream made while others already wait may not pass; then a warning, and the stream is
    /// used as it is.
    fn warm_up(&self) {
        let word = self.done.gpu_addr(0);
        let mut first = Ops::new();
        // SAFETY: `done` is the stream's own word: it lives as long as the stream, whose drop
        // waits for the work enqueued on it (or leaks `done` when that wait gives up).
        unsafe {
            first.push_raw(Op::Write32 {
                addr: word,
                value: 0,
            })
        };
        let ran = self
            .enqueue(first)
            .and_then(|()| self.copy_by_kernel(word, word, 0).map(drop))
            .and_then(|()| self.warm_list_kernel())
            .and_then(|()| self.synchronize_within(WARM_UP_TIMEOUT));
        if let Err(e) = ran {
            tracing::warn!(
                "GPU {}: a new stream's first work did not run: {e} (make streams, and staging bounces, before any stream waits for a peer)",
                self.ordinal
            );
        }
    }
}

impl CudaStream {
    /// A new non-blocking stream on GPU `ordinal`, with the process's default handle
    /// ([`Cuda::get`]); [`Cuda::new_stream`] with a handle of your own.
    pub fn new(ordinal: i32) -> Result<Self> {
        Cuda::get()?.new_stream(ordinal)
    }

    /// The raw stream, to launch kernels on or to record events.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The GPU this stream runs on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The handle the stream was made with.
    pub(super) fn cuda(&self) -> &Arc<Cuda> {
        &self.cuda
    }

    /// What the stream's GPU can do.
    pub(super) fn caps(&self) -> &GpuCaps {
        &self.caps
    }

    /// Which lists this stream runs as list kernels.
    pub fn list_kernel(&self) -> ListKernel {
        self.list_kernel
    }

    /// This stream, running lists as list kernels as `how` says, whatever
    /// `GDSYNC_LIST_KERNEL` said when it was made.
    pub fn with_list_kernel(mut self, how: ListKernel) -> Self {
        self.list_kernel = how;
        self
    }

    /// The list kernel's timestamps, if `GDSYNC_LIST_PROFILE=1` asked for them.
    pub(super) fn list_profile(&self) -> Option<&ListProfile> {
        self.profile.as_deref()
    }

    /// Logs the list kernel's profile, if there is one (once the stream has run its lists).
    fn log_profile(&self) {
        match self.profile.as_deref().map(ListProfile::report) {
            Some(Ok(Some(r))) => tracing::info!("GPU {}: {r}", self.ordinal),
            Some(Err(e)) => tracing::warn!("GPU {}: the list kernel profile: {e}", self.ordinal),
            _ => {}
        }
    }

    /// Operations enqueued (memory operations, and the ops of list kernels) and not yet known
    /// to have run.
    pub fn queued_ops(&self) -> usize {
        let mut l = self.lists.lock();
        self.reap(&mut l);
        l.pending.iter().map(|x| x.ops).sum()
    }

    /// For error reports when the stream seems stalled: the first wait, in enqueue order
    /// among the lists not known to have run, whose condition does not hold now, with the
    /// word's current value. Waits on device memory are skipped (the CPU cannot read it);
    /// `None` if the stream is idle or every such wait holds. A hint, not a proof: a wait
    /// that passed can fail again later (a CQE slot reused once the CQ wrapped).
    pub fn unmet_wait(&self) -> Option<(Op, u64)> {
        if self.idle() {
            return None;
        }
        let l = self.lists.lock();
        l.pending
            .iter()
            .flat_map(|p| p.list.as_slice().iter().copied())
            .find_map(|op| {
                let (cur, holds) = match op {
                    Op::Wait32 { addr, value, cond } => {
                        let cur = read_host::<u32>(&self.cuda, addr)?;
                        (cur as u64, cond.test32(cur, value))
                    }
                    Op::Wait64 { addr, value, cond } => {
                        let cur = read_host::<u64>(&self.cuda, addr)?;
                        (cur, cond.test64(cur, value))
                    }
                    _ => return None,
                };
                (!holds).then_some((op, cur))
            })
    }

    /// Drops the lists the stream has run.
    fn reap(&self, l: &mut Lists) {
        let done = self.done.u32(0).load(Ordering::Acquire);
        // Sequence numbers wrap: compare by distance.
        while l
            .pending
            .front()
            .is_some_and(|f| (done.wrapping_sub(f.seq) as i32) >= 0)
        {
            l.pending.pop_front();
        }
    }

    /// Enqueues `ops` behind everything enqueued on this stream before.
    pub fn enqueue(&self, ops: Ops) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut params = translate(&ops, &self.caps)?;
        let n = params.len();
        self.enqueue_launched(ops, n, |mark| {
            if let Some((word, seq)) = mark {
                // SAFETY: an all-zero params union is a valid (empty) value; set as a write.
                let mut p: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
                p.writeValue = write_params(
                    sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32,
                    word,
                    seq as u64,
                );
                params.push(p);
            }
            for chunk in params.chunks(MAX_BATCH) {
                let mut chunk = chunk.to_vec();
                // SAFETY: the params point at memory kept alive by `ops` (held until the
                // stream has written this list's sequence number) and at `done`, which
                // outlives the stream's work (Drop waits for it).
                check(
                    unsafe {
                        sys::cuStreamBatchMemOp_v2(
                            self.raw,
                            chunk.len() as u32,
                            chunk.as_mut_ptr(),
                            0,
                        )
                    },
                    "cuStreamBatchMemOp_v2",
                )?;
            }
            Ok(())
        })
    }

    /// Puts `ops` (`n` operations once enqueued) on the stream with `launch`, and holds the
    /// list until the stream has run it. `launch` gets `Some((word, seq))` when this list is
    /// one that marks the stream's progress: it must store `seq` (32 bits) at the GPUs'
    /// address `word` after everything else it enqueues.
    pub(super) fn enqueue_launched(
        &self,
        ops: Ops,
        n: usize,
        launch: impl FnOnce(Option<(u64, u32)>) -> Result<()>,
    ) -> Result<()> {
        self.cuda.bind(self.ordinal)?;
        // One more for the sequence number.
        self.make_room(n + 1)?;
        let mut l = self.lists.lock();
        let seq = l.seq.wrapping_add(1);
        let mut mark = l.unmarked + 1 >= MARK_EVERY || l.unmarked_ops + n >= MARK_OPS;
        let launched = {
            let _open = crate::quiet::enqueuing();
            launch(mark.then(|| (self.done.gpu_addr(0), seq)))
        };
        if launched.is_err() {
            // Part of the list may be on the stream: it stays held (a later list's mark, or
            // the stream going idle, releases it) and counts as unmarked.
            mark = false;
        }
        if mark {
            l.unmarked = 0;
            l.unmarked_ops = 0;
        } else {
            l.unmarked += 1;
            l.unmarked_ops += n;
        }
        l.seq = seq;
        l.pending.push_back(Pending {
            seq,
            ops: n + usize::from(mark),
            list: ops,
        });
        launched
    }

    /// Like [`synchronize`](Self::synchronize), but gives up after `timeout` with an error
    /// naming the first wait not met, where `synchronize` blocks for as long as a wait does
    /// not pass (a peer that never writes the word: for ever).
    pub fn synchronize_within(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        while !self.idle() {
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!("the stream to run what was enqueued{}", self.first_unmet()),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            backoff.snooze();
        }
        // Everything enqueued has run, marked or not.
        self.lists.lock().pending.clear();
        Ok(())
    }

    /// [`unmet_wait`](Self::unmet_wait) as words for an error report, or `None`. It names the
    /// first wait enqueued that does not hold: the stream stands there, or is held by work
    /// before it (a copy, a kernel), which the CPU cannot tell apart.
    pub fn unmet_wait_report(&self) -> Option<String> {
        let (op, cur) = self.unmet_wait()?;
        Some(format!(
            "its stream's first wait not met is {op:?} (the word holds {cur:#x}; the stream is there, or held by work before it)"
        ))
    }

    /// For this module's errors: `; ` and [`unmet_wait_report`](Self::unmet_wait_report), or
    /// nothing when every wait holds.
    fn first_unmet(&self) -> String {
        self.unmet_wait_report()
            .map(|r| format!("; {r}"))
            .unwrap_or_default()
    }

    /// Blocks until everything enqueued has run.
    pub fn synchronize(&self) -> Result<()> {
        self.cuda.bind(self.ordinal)?;
        // SAFETY: our stream.
        unsafe { result::stream::synchronize(self.raw) }.map_err(failed("cuStreamSynchronize"))?;
        // Everything enqueued has run, marked or not.
        self.lists.lock().pending.clear();
        Ok(())
    }

    /// Whether the stream has run everything enqueued on it (`cuStreamQuery`).
    fn idle(&self) -> bool {
        if self.cuda.bind(self.ordinal).is_err() {
            return false;
        }
        // SAFETY: our stream; the query has no side effects (`result` has no wrapper for it).
        let r = unsafe { sys::cuStreamQuery(self.raw) };
        r == sys::CUresult::CUDA_SUCCESS
    }

    /// Forgets the pending lists if the stream is idle (those after the last marked one are
    /// known to have run only that way).
    fn reap_idle(&self) {
        let mut l = self.lists.lock();
        if !l.pending.is_empty() && self.idle() {
            l.pending.clear();
        }
    }

    fn make_room(&self, n: usize) -> Result<()> {
        if n > MAX_QUEUED_OPS {
            return Err(Error::invalid(format!(
                "{n} operations in one list; at most {MAX_QUEUED_OPS}"
            )));
        }
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            let queued = self.queued_ops();
            if queued + n <= MAX_QUEUED_OPS {
                return Ok(());
            }
            self.reap_idle();
            if start.elapsed() > self.timeout {
                let first = self.first_unmet();
                return Err(Error::Timeout {
                    what: format!("room on the stream: {queued} operations are queued behind waits that have not passed (bound {MAX_QUEUED_OPS}){first}"),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            backoff.snooze();
        }
    }
}

/// The stream memory operations that run `ops` on a GPU with `caps`: every address resolved
/// to the GPUs' address of the memory it names, and every wait flushing inbound RDMA writes
/// first where the GPU does not order them but can flush ([`InboundWrites::Flush`]: a
/// stream does not know which NIC wrote the word it waits on, so every wait flushes there).
pub(super) fn translate(ops: &Ops, caps: &GpuCaps) -> Result<Vec<sys::CUstreamBatchMemOpParams>> {
    use sys::CUstreamBatchMemOpType as T;
    let flush = if caps.inbound_writes(true) == InboundWrites::Flush {
        sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_FLUSH as u32
    } else {
        0
    };
    let mut out = Vec::with_capacity(ops.len() + 2);
    for (k, op) in ops.as_slice().iter().enumerate() {
        // SAFETY: an all-zero params union is a valid (empty) value; fields are set below.
        let mut p: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
        match *op {
            Op::Write32 { addr, value } => {
                let at = gpu_addr_in(ops.kept(), addr);
                p.writeValue = write_params(T::CU_STREAM_MEM_OP_WRITE_VALUE_32, at, value as u64);
            }
            // (A stream's write leaves no write-combining buffer to flush: the doorbell is a
            // plain 64-bit write.)
            Op::Write64 { addr, value } | Op::Doorbell { addr, value } if caps.mem_ops_64 => {
                let at = gpu_addr_in(ops.kept(), addr);
                p.writeValue = write_params(T::CU_STREAM_MEM_OP_WRITE_VALUE_64, at, value);
            }
            Op::Write64 { addr, value } | Op::Doorbell { addr, value } => {
                // Two 32-bit writes, low word first (as libgdsync does without 64-bit memops).
                let at = gpu_addr_in(ops.kept(), addr);
                let low = value & 0xFFFF_FFFF;
                p.writeValue = write_params(T::CU_STREAM_MEM_OP_WRITE_VALUE_32, at, low);
                out.push(p);
                p.writeValue =
                    write_params(T::CU_STREAM_MEM_OP_WRITE_VALUE_32, at + 4, value >> 32);
            }
            Op::Wait32 { addr, value, cond } => {
                let (at, flags) = (
                    gpu_addr_in(ops.kept(), addr),
                    wait_cond(caps, cond)? | flush,
                );
                p.waitValue =
                    wait_params(T::CU_STREAM_MEM_OP_WAIT_VALUE_32, at, value as u64, flags);
            }
            Op::Wait64 { addr, value, cond } => {
                if !caps.mem_ops_64 {
                    return Err(Error::Unsupported(
                        "64-bit stream waits: this GPU lacks 64-bit stream memory operations"
                            .into(),
                    ));
                }
                let (at, flags) = (
                    gpu_addr_in(ops.kept(), addr),
                    wait_cond(caps, cond)? | flush,
                );
                p.waitValue = wait_params(T::CU_STREAM_MEM_OP_WAIT_VALUE_64, at, value, flags);
            }
            // A write carries its own fence: a barrier right before one adds nothing.
            Op::Copy { .. } => {
                return Err(Error::invalid(
                    "a copy is not a stream memory operation: submit the list through the executor (Executor::submit), which copies between batches",
                ))
            }
            Op::Barrier if barrier_elided(ops.as_slice(), k) => continue,
            Op::Barrier => p.memoryBarrier = system_barrier(),
        }
        out.push(p);
    }
    Ok(out)
}

fn system_barrier() -> sys::CUstreamBatchMemOpParams_union_CUstreamMemOpMemoryBarrierParams_st {
    sys::CUstreamBatchMemOpParams_union_CUstreamMemOpMemoryBarrierParams_st {
        operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_BARRIER,
        flags: sys::CUstreamMemoryBarrier_flags::CU_STREAM_MEMORY_BARRIER_TYPE_SYS as u32,
    }
}

fn wait_cond(caps: &GpuCaps, c: WaitCond) -> Result<u32> {
    use sys::CUstreamWaitValue_flags as F;
    Ok(match c {
        WaitCond::Geq => F::CU_STREAM_WAIT_VALUE_GEQ as u32,
        WaitCond::Eq => F::CU_STREAM_WAIT_VALUE_EQ as u32,
        WaitCond::And => F::CU_STREAM_WAIT_VALUE_AND as u32,
        WaitCond::Nor if caps.wait_nor => F::CU_STREAM_WAIT_VALUE_NOR as u32,
        WaitCond::Nor => {
            return Err(Error::Unsupported(
                "NOR stream waits (CAN_USE_STREAM_WAIT_VALUE_NOR = 0): completion waits on the first pass of a CQ need them".into(),
            ))
        }
    })
}

/// A word of host memory that a pending list's wait points at, or `None` for device memory.
fn read_host<T: Copy>(cuda: &Cuda, addr: u64) -> Option<T> {
    use super::MemoryKind;
    if !matches!(
        cuda.memory_kind(addr),
        MemoryKind::Host | MemoryKind::PinnedHost
    ) {
        return None;
    }
    // SAFETY: host memory that an enqueued list waits on: the list keeps it alive (the
    // caller holds the lists lock, so it is not dropped meanwhile) and ops are aligned for
    // their size (Op's contract).
    Some(unsafe { std::ptr::read_volatile(addr as *const T) })
}

fn write_params(
    op: sys::CUstreamBatchMemOpType,
    addr: u64,
    v: u64,
) -> sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
    sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
        operation: op,
        address: addr,
        __bindgen_anon_1:
            sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                value64: v,
            },
        // A stream write fences by itself (what ran before it is visible first). The
        // NO_MEMORY_BARRIER flag is refused by batched memops on our H200 (driver 580:
        // CUDA_ERROR_INVALID_VALUE), so ordering is per write and barriers before writes are
        // dropped as redundant.
        flags: 0,
        alias: 0,
    }
}

fn wait_params(
    op: sys::CUstreamBatchMemOpType,
    addr: u64,
    v: u64,
    flags: u32,
) -> sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st {
    sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st {
        operation: op,
        address: addr,
        __bindgen_anon_1:
            sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 {
                value64: v,
            },
        flags,
        alias: 0,
    }
}

/// How many stream memory operations `ops` becomes on a GPU with 64-bit memory operations
/// (the stream drops a barrier right before a write, which fences by itself); a stream
/// adds a write of its own at the end of one list in several ([`MARK_EVERY`]).
pub fn stream_memops(ops: &[Op]) -> usize {
    (0..ops.len())
        .filter(|&k| !(matches!(ops[k], Op::Barrier) && barrier_elided(ops, k)))
        .count()
}

/// Whether the barrier at `k` is followed by a write (which fences by itself).
fn barrier_elided(ops: &[Op], k: usize) -> bool {
    ops.get(k + 1).is_some_and(Op::is_store)
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        super::stream_span::closed(self.ordinal);
        if self.cuda.bind(self.ordinal).is_err() {
            super::idle_streams::unwatch(self.raw, self.ordinal);
            return;
        }
        // Wait (bounded) for enqueued work, and on our own stream for everything on it (kernels
        // launched on it too), before releases stop waiting for it; memory the work still
        // points to is leaked rather than freed under a running stream.
        let start = Instant::now();
        let mut stuck = false;
        loop {
            self.reap_idle();
            let mut l = self.lists.lock();
            self.reap(&mut l);
            if l.pending.is_empty() && (!self.owned || self.idle()) {
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                tracing::error!("dropping a CUDA stream whose work never finished: leaking the memory it points to, and the stream (releases of GPU-visible memory wait for it)");
                std::mem::forget(std::mem::take(&mut l.pending));
                // The stream may still write its progress word: leak that too (and the
                // profile's stamps, whose free would wait for the device).
                std::mem::forget(std::mem::replace(&mut self.done, RingMem::host(64)));
                std::mem::forget(self.profile.take());
                stuck = true;
                break;
            }
            drop(l);
            std::thread::sleep(Duration::from_micros(100));
        }
        self.log_profile();
        if stuck && self.owned {
            // Our stream stays, and releases keep waiting for it: one run meanwhile would wait
            // inside the driver and hold up other threads' allocations (see `quiet`).
            return;
        }
        // A stream of the program's is the program's to finish: releases stop watching it here.
        super::idle_streams::unwatch(self.raw, self.ordinal);
        if self.owned {
            // SAFETY: our stream, made by create_stream, destroyed once.
            unsafe { self.cuda.destroy_stream(self.ordinal, self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stream_memops;
    use crate::ops::{Op, WaitCond};

    /// A barrier right before a write is dropped (the write fences by itself); before a wait
    /// or at the end of a list it stays.
    #[test]
    fn stream_memops_drop_only_barriers_before_writes() {
        let w = Op::Write32 { addr: 8, value: 1 };
        let db = Op::Doorbell { addr: 16, value: 1 };
        let wait = Op::Wait32 {
            addr: 8,
            value: 1,
            cond: WaitCond::Geq,
        };
        assert_eq!(stream_memops(&[w, Op::Barrier, db]), 2);
        assert_eq!(stream_memops(&[w, Op::Barrier, wait]), 3);
        assert_eq!(stream_memops(&[w, Op::Barrier]), 2);
        assert_eq!(stream_memops(&[]), 0);
    }
}
