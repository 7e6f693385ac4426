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

#[cfg(test)]
pub(crate) use host::test_hooks;
pub use host::HostExecutor;
pub use host_stream::HostStream;

use crate::ops::Ops;
use crate::Result;

/// Something that runs op lists: now ([`HostExecutor`]), or queued in order ([`HostStream`],
/// [`CudaStream`](crate::cuda::CudaStream)).
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

#[cfg(test)]
mod tests;
