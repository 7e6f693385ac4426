//! The soft device: a software model of the mlx5 RC data path.
//!
//! [`SoftDevice`] serves the provider commands ([`crate::provider::Provider`]); each
//! device owns an engine thread ([`engine`]) that watches its QPs' doorbells, executes the
//! WQEs it finds in the send rings, talks to peer engines over [`link`]s, and writes
//! mlx5-format CQEs. It plays both roles of an RC connection: requester (send ring) and
//! responder (receive ring, memory access checks). It knows only what a ConnectX knows: the
//! ring addresses and sizes and doorbell records the host gave it, the UAR page it handed out,
//! its translation table ([`mr_table`]) and its QP and CQ contexts. Under the emulated
//! kernel driver it also serves as the HCA of rdma-core's libmlx5 ([`emulated`]).

mod attr;
mod bridge;
mod device;
#[cfg(feature = "emulated-hca")]
mod emulated;
mod engine;
mod link;
mod link_budget;
mod listen;
mod mr_table;
mod progress;
mod qp_numbers;
mod ring;
mod shm_link;
mod targets;
pub(crate) mod tcp;
mod uar;
mod waiting;
mod watch;
mod wire;

pub use crate::provider::host_id;
pub use device::accept_tcp_links;
pub(crate) use device::SoftDevice;
#[cfg(feature = "emulated-hca")]
pub use emulated::serve_emulated_driver;

use progress::Why;
pub use progress::{
    lend_thread, progress, progress_mode, progress_mode_for, soft_engines_report,
    soft_writes_taken_in, ProgressMode,
};

pub(crate) use link::{Link, PEER_WAIT};

use crate::provider::{Access, AsyncEvent, HwQpState, QpAttr, QpLastError, QpTimers};
use crate::{Error, Result};
use engine::QpHw;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU8;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};

/// Most QPs one soft device serves.
pub(crate) const MAX_QPS: u32 = 1 << 16;

/// Control-path requests to an engine, applied in order between polling rounds.
pub(crate) enum Cmd {
    AddQp(Box<QpHw>),
    RemoveQp(u32),
    Connect {
        qpn: u32,
        peer: u64,
        rqpn: u32,
        rq_psn: u32,
        /// The link to `peer` is being set up (it may not be up yet): the QP waits for it
        /// instead of failing.
        lazy: bool,
    },
    Timers {
        qpn: u32,
        timers: QpTimers,
    },
    /// The remote access a QP grants (a modify that sets its access flags).
    Access {
        qpn: u32,
        access: Access,
    },
    AddLink(Box<Link>),
    /// The link to this peer device, being set up for QPs that wait for it, will not come:
    /// the peer is gone.
    NoLink(u64),
}

/// What the engine thread and the device handles share.
pub(crate) struct EngineCtl {
    cmds: Mutex<Vec<Cmd>>,
    has_cmds: AtomicBool,
    /// Commands sent so far (counted under the `cmds` lock) and applied by the engine.
    sent: std::sync::atomic::AtomicU64,
    applied: std::sync::atomic::AtomicU64,
    stop: AtomicBool,
    /// Set while the engine sleeps between polls; posters then unpark it.
    sleeping: AtomicBool,
    /// The engine's thread, once started.
    thread: std::sync::OnceLock<Thread>,
    /// The QP table's states, by QPN (the device's own memory; `query_qp` reads it).
    states: Box<[AtomicU8]>,
    /// The first error of each QP in ERROR (the QP context's "last error"), by QPN.
    last_errors: Mutex<HashMap<u32, QpLastError>>,
    /// Asynchronous events not yet read by the host.
    events: Mutex<VecDeque<AsyncEvent>>,
    has_events: AtomicBool,
    /// What a waiting thread compares with memory before it runs a round ([`watch`]), and a
    /// generation that moves on when the engine replaces it (its QPs or links changed).
    watch: Mutex<Arc<watch::Watch>>,
    watch_gen: std::sync::atomic::AtomicU64,
    /// Links the engine holds now (a dead link is released at the check that finds it).
    links_held: std::sync::atomic::AtomicUsize,
}

pub(crate) struct EngineHandle {
    core: Arc<progress::EngineCore>,
    waker: EngineWaker,
    join: Mutex<Option<JoinHandle<()>>>,
}

/// Wakes an engine that sleeps between polling rounds; costs a fence when it is awake. Held by
/// whatever feeds the engine from outside its own thread: CPU posts, TCP bridge threads.
#[derive(Clone)]
pub(crate) struct EngineWaker {
    ctl: Arc<EngineCtl>,
}

impl EngineWaker {
    pub(crate) fn wake(&self) {
        self.ctl.wake();
    }
}

impl EngineCtl {
    /// The QP's state in the device's QP table.
    pub(crate) fn state(&self, qpn: u32) -> HwQpState {
        let v = self
            .states
            .get(qpn as usize)
            .map_or(0, |s| s.load(Ordering::Acquire));
        HwQpState::from_u8(v)
    }

    /// The QP's state and, in ERROR, its first error (`query_qp`).
    pub(crate) fn attr(&self, qpn: u32) -> QpAttr {
        let state = self.state(qpn);
        let last_error = match state {
            HwQpState::Error => self.last_errors.lock().get(&qpn).copied(),
            _ => None,
        };
        QpAttr { state, last_error }
    }

    /// Keeps a QP's first error in its context (later ones leave it).
    pub(crate) fn note_error(&self, qpn: u32, e: QpLastError) {
        self.last_errors.lock().entry(qpn).or_insert(e);
    }

    /// A new QP's context: RESET, no error.
    pub(crate) fn reset_qp(&self, qpn: u32) {
        self.last_errors.lock().remove(&qpn);
        self.set_state(qpn, HwQpState::Reset);
    }

    /// How many links the engine holds now.
    #[cfg(test)]
    pub(crate) fn links_held(&self) -> usize {
        self.links_held.load(Ordering::Acquire)
    }

    /// The oldest asynchronous event the host has not read.
    pub(crate) fn next_event(&self) -> Option<AsyncEvent> {
        let mut q = self.events.lock();
        let e = q.pop_front();
        self.has_events.store(!q.is_empty(), Ordering::Release);
        e
    }

    /// Whether an asynchronous event waits.
    pub(crate) fn has_event(&self) -> bool {
        self.has_events.load(Ordering::Acquire)
    }

    /// Unparks the engine thread if it announced a nap (whichever thread calls it).
    pub(crate) fn wake(&self) {
        // Pairs with the engine's SeqCst store of `sleeping` before its last look.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.unpark();
        }
    }

    /// Unparks the engine thread, asleep or not.
    fn unpark(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

impl EngineHandle {
    /// A new engine thread for device `uid`; `forget_peer` is called (from a round) with the
    /// peer device of each link the engine releases.
    pub(crate) fn spawn(
        uid: u64,
        share: link::DeviceShare,
        forget_peer: engine::ForgetPeer,
    ) -> Result<Self> {
        let ctl = Arc::new(EngineCtl {
            cmds: Mutex::new(Vec::new()),
            has_cmds: AtomicBool::new(false),
            sent: Default::default(),
            applied: Default::default(),
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            thread: std::sync::OnceLock::new(),
            states: (0..=MAX_QPS).map(|_| AtomicU8::new(0)).collect(),
            last_errors: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            has_events: AtomicBool::new(false),
            watch: Mutex::new(Arc::new(watch::Watch::empty(share.regions.clone()))),
            watch_gen: Default::default(),
            links_held: Default::default(),
        });
        let engine = engine::Engine::new(ctl.clone(), share, forget_peer);
        let core = progress::EngineCore::new(ctl.clone(), engine);
        let c = core.clone();
        let join = std::thread::Builder::new()
            .name(format!("gdsync-soft-{:04x}", uid as u16))
            .spawn(move || progress::engine_thread(c))
            .map_err(|e| Error::os("spawn soft-device engine", e))?;
        let _ = ctl.thread.set(join.thread().clone());
        core.register();
        Ok(Self {
            core,
            waker: EngineWaker { ctl },
            join: Mutex::new(Some(join)),
        })
    }

    pub(crate) fn send(&self, cmd: Cmd) -> Result<()> {
        let ctl = &self.waker.ctl;
        if ctl.stop.load(Ordering::Acquire) {
            return Err(Error::DeviceClosed(
                "the soft device's engine has stopped".into(),
            ));
        }
        self.post(cmd);
        Ok(())
    }

    /// Queues a command; returns its sequence number.
    fn post(&self, cmd: Cmd) -> u64 {
        let ctl = &self.waker.ctl;
        let seq = {
            let mut q = ctl.cmds.lock();
            q.push(cmd);
            ctl.sent.fetch_add(1, Ordering::AcqRel) + 1
        };
        ctl.has_cmds.store(true, Ordering::SeqCst);
        ctl.unpark();
        seq
    }

    /// Sends a command and returns once the engine applied it, as a verbs modify or destroy
    /// returns once the HCA took the command: a doorbell rung afterwards finds the QP in its
    /// new state (a send posted right after the move to RTS goes out with the PSN that
    /// modify set), the caller may free what a destroy named, and a loop of creates and
    /// destroys cannot pile up work for the engine.
    pub(crate) fn send_and_wait(&self, cmd: Cmd) -> Result<()> {
        let ctl = &self.waker.ctl;
        if ctl.stop.load(Ordering::Acquire) {
            return Err(Error::DeviceClosed(
                "the soft device's engine has stopped".into(),
            ));
        }
        let seq = self.post(cmd);
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while ctl.applied.load(Ordering::Acquire) < seq && !ctl.stop.load(Ordering::Acquire) {
            // (Not `kick`: the engine must not become this thread's own.)
            self.waker.wake();
            progress::help_command(&self.core);
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            if spins % 4096 == 0 && start.elapsed() > std::time::Duration::from_secs(10) {
                tracing::warn!("soft device: the engine has not applied a command for 10 s; going on without it");
                break;
            }
        }
        Ok(())
    }

    /// After a CPU-side doorbell: wakes the engine if it sleeps, or, when engines progress
    /// on shared threads, runs the rounds here.
    pub(crate) fn kick(&self) {
        match progress_mode() {
            ProgressMode::Thread => self.waker.wake(),
            ProgressMode::Shared => progress::help_engine(&self.core, Why::Doorbell),
        }
    }

    /// Where engines progress on shared threads: runs this engine's pending rounds here (an
    /// empty poll of one of its CQs).
    pub(crate) fn help_poll(&self) {
        progress::help_engine(&self.core, Why::Poll);
    }

    /// The device's shared control state (QP states, events).
    pub(crate) fn ctl(&self) -> &Arc<EngineCtl> {
        &self.waker.ctl
    }

    /// A handle that wakes the engine, for threads that feed it packets.
    pub(crate) fn waker(&self) -> EngineWaker {
        self.waker.clone()
    }

    pub(crate) fn stop(&self) {
        self.waker.ctl.stop.store(true, Ordering::Release);
        self.waker.ctl.unpark();
        if let Some(j) = self.join.lock().take() {
            if j.thread().id() != std::thread::current().id() {
                let _ = j.join();
            }
            self.core.unregister();
        }
    }
}
