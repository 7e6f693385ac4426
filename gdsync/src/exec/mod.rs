//! Executors: what runs an [`Ops`] list.
//!
//! | executor | runs the ops |
//! |---|---|
//! | [`HostExecutor`] | now, on the calling thread |
//! | [`HostStream`] | on a CPU thread, queued in order like a CUDA stream |
//! | [`OpBatch`] | later: collects them for one submission to another executor |
//!
//! Waits never spin forever: each executor has a timeout (default [`DEFAULT_WAIT_TIMEOUT`]),
//! and waits on completion entries look at the owner bit only, so error completions release
//! them too.

mod host;
mod host_stream;

pub use crate::cuda::CudaStream;
pub use host::HostExecutor;
pub use host_stream::HostStream;

use crate::ops::Ops;
use crate::Result;

/// Something that runs op lists: now ([`HostExecutor`]), or queued in order ([`HostStream`],
/// [`CudaStream`]).
pub trait Executor {
    /// Runs `ops`, or queues them behind what was submitted before.
    fn submit(&self, ops: Ops) -> Result<()>;
}

impl Executor for HostExecutor {
    fn submit(&self, ops: Ops) -> Result<()> {
        self.run(&ops)
    }
}

impl Executor for HostStream {
    fn submit(&self, ops: Ops) -> Result<()> {
        self.enqueue(ops);
        Ok(())
    }
}

impl Executor for CudaStream {
    fn submit(&self, ops: Ops) -> Result<()> {
        self.enqueue(ops)
    }
}

/// Collects op lists instead of running them, to hand them to an executor as one list
/// ([`flush`](Self::flush)): a CUDA stream then runs one batch of memory operations where
/// it would run one per call, which costs it less per operation.
#[derive(Default)]
pub struct OpBatch(std::cell::RefCell<Ops>);

impl OpBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Submits everything collected to `exec`, as one op list, and empties the batch.
    pub fn flush(&self, exec: &impl Executor) -> Result<()> {
        let ops = self.0.take();
        if ops.is_empty() {
            return Ok(());
        }
        exec.submit(ops)
    }
    /// Whether nothing is collected.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

impl Executor for OpBatch {
    fn submit(&self, ops: Ops) -> Result<()> {
        self.0.borrow_mut().append(ops);
        Ok(())
    }
}

use std::time::Duration;

/// Default bound on one wait of a host executor or host stream.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Spin, then yield, then sleep: how CPU-side pollers back off without burning a core.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    n: u32,
}

impl Backoff {
    pub(crate) const SPINS: u32 = 1024;
    pub(crate) const YIELDS: u32 = 1024 + 256;

    pub(crate) fn reset(&mut self) {
        self.n = 0;
    }
    /// Whether the caller is still in the busy-spinning phase.
    pub(crate) fn spinning(&self) -> bool {
        self.n < Self::SPINS
    }
    /// Whether the next step sleeps (the caller may announce it first).
    pub(crate) fn would_sleep(&self) -> bool {
        self.n + 1 >= Self::YIELDS
    }
    /// A sleeping step that an `unpark` of this thread cuts short.
    pub(crate) fn snooze_parked(&mut self) {
        self.n = self.n.saturating_add(1);
        let k = self.n.saturating_sub(Self::YIELDS).min(5);
        std::thread::park_timeout(Duration::from_micros(32 << k));
    }
    /// Like [`snooze`](Self::snooze), but the first steps skip even the `pause` hint (which
    /// costs ~140 cycles on recent x86): for the engine, whose detection delay is latency.
    pub(crate) fn snooze_busy(&mut self) {
        if self.n < 256 {
            self.n += 1;
        } else {
            self.pause();
        }
    }

    /// One step of backing off; returns whether the caller is now sleeping between polls.
    /// When soft engines progress on shared threads, the step runs their rounds first.
    pub(crate) fn snooze(&mut self) -> bool {
        crate::device::soft::help(crate::device::soft::Why::Poll);
        self.pause()
    }

    /// [`snooze`](Self::snooze) without lending the thread to the engines: for callers
    /// that just did (an empty CQ poll) or are an engine.
    pub(crate) fn pause(&mut self) -> bool {
        self.n = self.n.saturating_add(1);
        if self.n < Self::SPINS {
            std::hint::spin_loop();
            false
        } else if self.n < Self::YIELDS {
            std::thread::yield_now();
            false
        } else {
            let k = (self.n - Self::YIELDS).min(6);
            std::thread::sleep(Duration::from_micros(20 << k));
            true
        }
    }
}
#[cfg(test)]
mod tests;
