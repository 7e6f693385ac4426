//! The asynchronous events of an mlx5 device as the queue layer reads them: a thread waits on
//! the context's event descriptor ([`Context::next_async_event`]), logs each event, and
//! queues the ones about queues (a QP that failed, a CQ that overran) for [`Provider::get_async_event`](crate::provider::Provider),
//! so that the queue layer's check for an event is one load, never a system call.

use super::{AsyncEvent as RdmaEvent, Context};
use crate::provider::AsyncEvent;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the thread waits for an event before it looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Events read and not yet taken, and whether any waits.
#[derive(Default)]
struct Queue {
    events: Mutex<VecDeque<AsyncEvent>>,
    any: AtomicBool,
    stop: AtomicBool,
}

/// The thread that reads a device's events, stopped on drop.
pub(crate) struct EventWatch {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl EventWatch {
    /// Starts reading `ctx`'s events.
    pub(crate) fn start(ctx: Arc<Context>) -> crate::Result<Self> {
        let queue = Arc::new(Queue::default());
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("gdsync-mlx5-events".into())
            .spawn(move || read_events(&ctx, &q))
            .map_err(|e| crate::Error::os("spawn the mlx5 event thread", e))?;
        Ok(EventWatch {
            queue,
            thread: Some(thread),
        })
    }

    /// The next queue event, without waiting.
    pub(crate) fn next(&self) -> Option<AsyncEvent> {
        let mut ev = self.queue.events.lock();
        let e = ev.pop_front();
        self.queue.any.store(!ev.is_empty(), Ordering::Release);
        e
    }

    /// Whether an event waits (one load).
    pub(crate) fn pending(&self) -> bool {
        self.queue.any.load(Ordering::Acquire)
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        self.queue.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_events(ctx: &Context, q: &Queue) {
    while !q.stop.load(Ordering::Acquire) {
        match ctx.next_async_event(STOP_CHECK) {
            Ok(Some(e)) => {
                if let Some(e) = queue_event(ctx.name(), e) {
                    q.events.lock().push_back(e);
                    q.any.store(true, Ordering::Release);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(
                    "{}: asynchronous events are no longer read: {e}",
                    ctx.name()
                );
                return;
            }
        }
    }
}

/// Logs a device event; returns what it means for the queues, if anything.
fn queue_event(dev: &str, e: RdmaEvent) -> Option<AsyncEvent> {
    match e {
        RdmaEvent::QpFatal { qpn }
        | RdmaEvent::QpRequestError { qpn }
        | RdmaEvent::QpAccessError { qpn } => {
            tracing::debug!("{dev}: {e}");
            Some(AsyncEvent::QpFatal { qpn })
        }
        RdmaEvent::CqError { cqn: Some(cqn) } => {
            tracing::warn!("{dev}: {e}");
            Some(AsyncEvent::CqError { cqn })
        }
        RdmaEvent::PortError { .. } | RdmaEvent::DeviceFatal | RdmaEvent::CqError { .. } => {
            tracing::warn!("{dev}: {e}");
            None
        }
        e => {
            tracing::info!("{dev}: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_and_cq_errors_reach_the_queues_and_port_events_are_only_logged() {
        for e in [
            RdmaEvent::QpFatal { qpn: 7 },
            RdmaEvent::QpRequestError { qpn: 7 },
            RdmaEvent::QpAccessError { qpn: 7 },
        ] {
            assert_eq!(queue_event("d", e), Some(AsyncEvent::QpFatal { qpn: 7 }));
        }
        assert_eq!(
            queue_event("d", RdmaEvent::CqError { cqn: Some(0x401) }),
            Some(AsyncEvent::CqError { cqn: 0x401 })
        );
        assert_eq!(queue_event("d", RdmaEvent::CqError { cqn: None }), None);
        assert_eq!(queue_event("d", RdmaEvent::PortError { port: 1 }), None);
        assert_eq!(queue_event("d", RdmaEvent::PortActive { port: 1 }), None);
    }
}
