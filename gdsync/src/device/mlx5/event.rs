//! A device's asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`): a link
//! going down or up, a QP that failed outside any completion, a CQ that overran (named by its
//! number), a fatal device error. Read with
//! a timeout from the context's event descriptor (made non-blocking, as the verbs manual
//! suggests), and acknowledged at once: verbs cannot destroy a QP or CQ with an event about it
//! unacknowledged.

use super::context::Context;
use super::error::RdmaError;
use super::{sys, RdmaResult};
use std::time::{Duration, Instant};

/// An asynchronous event of a device (`ibv_event_type`, with what it is about).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A QP failed with an error no completion reports; it is in the error state.
    QpFatal {
        /// The QP number.
        qpn: u32,
    },
    /// A QP's request was refused by its peer (invalid request); the QP is in error.
    QpRequestError {
        /// The QP number.
        qpn: u32,
    },
    /// A peer's access to memory through a QP was refused; the QP is in error.
    QpAccessError {
        /// The QP number.
        qpn: u32,
    },
    /// A QP in RTR received its first packet.
    CommEstablished {
        /// The QP number.
        qpn: u32,
    },
    /// A QP's send queue drained (SQD).
    SqDrained {
        /// The QP number.
        qpn: u32,
    },
    /// The last WQE of a QP attached to an SRQ was reached.
    LastWqeReached {
        /// The QP number.
        qpn: u32,
    },
    /// A QP migrated to its alternate path, or failed to.
    PathMigration {
        /// The QP number.
        qpn: u32,
        /// Whether the migration failed.
        failed: bool,
    },
    /// A CQ overran or failed: it writes no more completions, and its QPs are in error.
    CqError {
        /// The CQ number (`None`: libmlx5 could not say which CQ the event names).
        cqn: Option<u32>,
    },
    /// A port became active.
    PortActive {
        /// The port (from 1).
        port: u8,
    },
    /// A port left the active state (link down).
    PortError {
        /// The port (from 1).
        port: u8,
    },
    /// A port's LID, P_Key table, subnet manager or GID table changed, or the subnet manager
    /// asks for re-registration.
    PortChange {
        /// The port (from 1).
        port: u8,
        /// What changed (`ibv_event_type`).
        event: u32,
    },
    /// The device failed: every object of it is unusable, the context must be reopened.
    DeviceFatal,
    /// An event about an SRQ or WQ, which this backend does not create.
    Other(u32),
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            AsyncEvent::QpFatal { qpn } => write!(f, "QP {qpn:#x}: fatal error"),
            AsyncEvent::QpRequestError { qpn } => write!(f, "QP {qpn:#x}: invalid request"),
            AsyncEvent::QpAccessError { qpn } => write!(f, "QP {qpn:#x}: access error"),
            AsyncEvent::CommEstablished { qpn } => {
                write!(f, "QP {qpn:#x}: communication established")
            }
            AsyncEvent::SqDrained { qpn } => write!(f, "QP {qpn:#x}: send queue drained"),
            AsyncEvent::LastWqeReached { qpn } => write!(f, "QP {qpn:#x}: last WQE reached"),
            AsyncEvent::PathMigration { qpn, failed } => write!(
                f,
                "QP {qpn:#x}: path migration {}",
                if failed { "failed" } else { "done" }
            ),
            AsyncEvent::CqError { cqn: Some(cqn) } => write!(f, "CQ {cqn:#x}: error (overrun)"),
            AsyncEvent::CqError { cqn: None } => f.write_str("CQ error (which CQ is unknown)"),
            AsyncEvent::PortActive { port } => write!(f, "port {port}: active"),
            AsyncEvent::PortError { port } => write!(f, "port {port}: down"),
            AsyncEvent::PortChange { port, event } => write!(f, "port {port}: change {event}"),
            AsyncEvent::DeviceFatal => f.write_str("device fatal error"),
            AsyncEvent::Other(e) => write!(f, "event {e}"),
        }
    }
}

impl AsyncEvent {
    /// The event `e` describes (read before it is acknowledged: the QP or CQ it names is
    /// alive); `cq_number` tells a CQ's number ([`Context::cq_failed`]).
    ///
    /// # Safety
    /// `e` was filled by `ibv_get_async_event` and is not yet acknowledged.
    unsafe fn from_raw(
        e: &sys::ibv_async_event,
        cq_number: impl FnOnce(*mut sys::ibv_cq) -> Option<u32>,
    ) -> AsyncEvent {
        let qpn = || (*e.element.qp).qp_num;
        let port = || e.element.port_num as u8;
        match e.event_type {
            sys::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal { qpn: qpn() },
            sys::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpRequestError { qpn: qpn() },
            sys::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessError { qpn: qpn() },
            sys::IBV_EVENT_COMM_EST => AsyncEvent::CommEstablished { qpn: qpn() },
            sys::IBV_EVENT_SQ_DRAINED => AsyncEvent::SqDrained { qpn: qpn() },
            sys::IBV_EVENT_QP_LAST_WQE_REACHED => AsyncEvent::LastWqeReached { qpn: qpn() },
            sys::IBV_EVENT_PATH_MIG | sys::IBV_EVENT_PATH_MIG_ERR => AsyncEvent::PathMigration {
                qpn: qpn(),
                failed: e.event_type == sys::IBV_EVENT_PATH_MIG_ERR,
            },
            sys::IBV_EVENT_CQ_ERR => AsyncEvent::CqError {
                cqn: cq_number(e.element.cq),
            },
            sys::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive { port: port() },
            sys::IBV_EVENT_PORT_ERR => AsyncEvent::PortError { port: port() },
            sys::IBV_EVENT_LID_CHANGE
            | sys::IBV_EVENT_PKEY_CHANGE
            | sys::IBV_EVENT_SM_CHANGE
            | sys::IBV_EVENT_CLIENT_REREGISTER
            | sys::IBV_EVENT_GID_CHANGE => AsyncEvent::PortChange {
                port: port(),
                event: e.event_type,
            },
            sys::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
            other => AsyncEvent::Other(other),
        }
    }
}

impl Context {
    /// The device's next asynchronous event, waiting at most `timeout` (zero: only look);
    /// `None` when none came. The event is acknowledged before this returns. (A CQ error
    /// also marks the CQ's ring as written no more: host executors' waits on it fail.)
    pub fn next_async_event(&self, timeout: Duration) -> RdmaResult<Option<AsyncEvent>> {
        // SAFETY: the context is open; async_fd is its event descriptor, owned by libibverbs.
        let fd = unsafe { (*self.raw.as_ptr()).async_fd };
        set_nonblocking(fd)?;
        let deadline = Instant::now() + timeout;
        loop {
            let mut e = sys::ibv_async_event::default();
            // SAFETY: FFI on the open context; the descriptor is non-blocking, so this returns
            // at once, with an event or EAGAIN.
            let rc = unsafe {
                self.rdma
                    .verbs
                    .ibv_get_async_event(self.raw.as_ptr(), &mut e)
            };
            if rc == 0 {
                // SAFETY: just filled by ibv_get_async_event, acknowledged right after (so
                // the CQ it may name is alive while its number is read).
                let ev = unsafe { AsyncEvent::from_raw(&e, |cq| self.cq_failed(cq)) };
                // SAFETY: an event ibv_get_async_event returned, acknowledged once.
                unsafe { self.rdma.verbs.ibv_ack_async_event(&mut e) };
                return Ok(Some(ev));
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                _ => return Err(RdmaError::last("ibv_get_async_event")),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            wait_readable(fd, left)?;
        }
    }
}

/// Makes `fd` non-blocking (idempotent).
fn set_nonblocking(fd: i32) -> RdmaResult<()> {
    // SAFETY: fcntl on a descriptor the open context owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::last("fcntl(async_fd, O_NONBLOCK)"));
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passed (whichever comes first; either is fine).
fn wait_readable(fd: i32, timeout: Duration) -> RdmaResult<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // Rounded up, so that a wait of less than a millisecond still waits.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: poll on one descriptor the open context owns; `p` outlives the call.
    if unsafe { libc::poll(&mut p, 1, ms) } < 0
        && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
    {
        return Err(RdmaError::last("poll(async_fd)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_events_name_their_port() {
        let e = sys::ibv_async_event {
            element: sys::ibv_async_event__bindgen_ty_1 { port_num: 2 },
            event_type: sys::IBV_EVENT_PORT_ERR,
        };
        // SAFETY: a port event: only the port number is read.
        let ev = unsafe { AsyncEvent::from_raw(&e, |_| None) };
        assert_eq!(ev, AsyncEvent::PortError { port: 2 });
        assert_eq!(ev.to_string(), "port 2: down");
        let e = sys::ibv_async_event {
            event_type: sys::IBV_EVENT_GID_CHANGE,
            ..e
        };
        // SAFETY: as above.
        let ev = unsafe { AsyncEvent::from_raw(&e, |_| None) };
        assert_eq!(
            ev,
            AsyncEvent::PortChange {
                port: 2,
                event: sys::IBV_EVENT_GID_CHANGE
            }
        );
    }

    #[test]
    fn qp_events_read_the_qp_number() {
        let mut qp = sys::ibv_qp {
            qp_num: 0x1234,
            ..Default::default()
        };
        let e = sys::ibv_async_event {
            element: sys::ibv_async_event__bindgen_ty_1 { qp: &mut qp },
            event_type: sys::IBV_EVENT_QP_FATAL,
        };
        // SAFETY: the element is a live QP struct.
        let ev = unsafe { AsyncEvent::from_raw(&e, |_| None) };
        assert_eq!(ev, AsyncEvent::QpFatal { qpn: 0x1234 });
        assert_eq!(ev.to_string(), "QP 0x1234: fatal error");
    }

    #[test]
    fn cq_errors_name_the_cq() {
        let mut cq = sys::ibv_cq::default();
        let at: *mut sys::ibv_cq = &mut cq;
        let e = sys::ibv_async_event {
            element: sys::ibv_async_event__bindgen_ty_1 { cq: at },
            event_type: sys::IBV_EVENT_CQ_ERR,
        };
        // SAFETY: the element is a live CQ struct; only its address is compared.
        let ev = unsafe { AsyncEvent::from_raw(&e, |c| (c == at).then_some(0x401)) };
        assert_eq!(ev, AsyncEvent::CqError { cqn: Some(0x401) });
        assert_eq!(ev.to_string(), "CQ 0x401: error (overrun)");
        // SAFETY: as above.
        let ev = unsafe { AsyncEvent::from_raw(&e, |_| None) };
        assert_eq!(ev.to_string(), "CQ error (which CQ is unknown)");
    }
}
