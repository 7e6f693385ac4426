//! The host stream: a CPU thread that runs queued op lists in order, blocking on waits, the
//! way a CUDA stream runs memory operations. Used by tests and GPU-less users of the
//! on-stream API.

use super::host::run_ops;
use super::DEFAULT_WAIT_TIMEOUT;
use crate::ops::Ops;
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

struct State {
    queue: VecDeque<Ops>,
    /// Lists taken off the queue and not finished yet.
    running: usize,
    /// The first error (sticky, like a CUDA stream error) until `synchronize` reports it.
    error: Option<Error>,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    idle: Condvar,
    stop: AtomicBool,
}

/// A CPU thread that runs op lists in the order they were enqueued.
///
/// A failed list (a wait that timed out) makes the stream skip what follows until
/// [`synchronize`](HostStream::synchronize) reports the error, as a CUDA stream does.
pub struct HostStream {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HostStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStream").finish_non_exhaustive()
    }
}

impl HostStream {
    /// A stream whose waits give up after [`DEFAULT_WAIT_TIMEOUT`].
    pub fn new() -> Result<Self> {
        Self::with_timeout(DEFAULT_WAIT_TIMEOUT)
    }

    /// A stream whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                running: 0,
                error: None,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gdsync-host-stream".into())
            .spawn(move || worker(&s, timeout))
            .map_err(|e| Error::os("spawn host stream thread", e))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues `ops` behind everything queued before.
    pub fn enqueue(&self, ops: Ops) {
        if ops.is_empty() {
            return;
        }
        self.shared.state.lock().queue.push_back(ops);
        self.shared.work.notify_one();
    }

    /// Whether everything queued so far has run.
    pub fn is_idle(&self) -> bool {
        let st = self.shared.state.lock();
        st.queue.is_empty() && st.running == 0
    }

    /// Blocks until everything queued so far has run; reports (and clears) the first error.
    pub fn synchronize(&self) -> Result<()> {
        let mut st = self.shared.state.lock();
        while !(st.queue.is_empty() && st.running == 0) {
            self.shared.idle.wait(&mut st);
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn worker(s: &Shared, timeout: Duration) {
    loop {
        let ops = {
            let mut st = s.state.lock();
            loop {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(ops) = st.queue.pop_front() {
                    st.running += 1;
                    break ops;
                }
                s.idle.notify_all();
                s.work.wait(&mut st);
            }
        };
        let skip = s.state.lock().error.is_some();
        let res = if skip {
            Ok(())
        } else {
            run_ops(&ops, timeout, Some(&s.stop))
        };
        drop(ops);
        let mut st = s.state.lock();
        st.running -= 1;
        if let Err(e) = res {
            st.error.get_or_insert(e);
        }
        if st.queue.is_empty() {
            s.idle.notify_all();
        }
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        {
            // Under the lock, so the worker cannot check `stop` and then miss the wakeup.
            let _st = self.shared.state.lock();
            self.shared.stop.store(true, Ordering::Relaxed);
            self.shared.work.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
