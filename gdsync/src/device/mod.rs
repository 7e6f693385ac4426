//! Devices: the NIC below the queues. Only the soft device exists so far: a software model
//! of the mlx5 RC data path (see `docs/soft-device.md`).

mod attr;
mod endpoint;
mod listen;
pub(crate) mod soft;

pub use attr::{DeviceAttr, LinkLayer, PortAttr, PortState};
pub use endpoint::{Endpoint, LinkKind, LinkPolicy};
pub use soft::{progress, progress_mode, progress_mode_for, ProgressMode};

use crate::cq::Cq;
use crate::mr::{MrTable, ProtectionDomain};
use crate::qp::{Qp, QpConfig, QpShared};
use crate::{Error, Result};
use endpoint::{choose_link, link_reason, Here};
use parking_lot::{Condvar, Mutex, RwLock};
use soft::{tcp, EngineHandle, Link};
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// QPN → QP, for routing completions to their queue.
#[derive(Default)]
pub(crate) struct QpTable(RwLock<HashMap<u32, Weak<QpShared>>>);

impl QpTable {
    pub(crate) fn get(&self, qpn: u32) -> Option<Weak<QpShared>> {
        self.0.read().get(&qpn).cloned()
    }
}

/// The process's devices, by uid, so in-process peers can find each other.
fn registry() -> &'static Mutex<HashMap<u64, Weak<DeviceShared>>> {
    static R: OnceLock<Mutex<HashMap<u64, Weak<DeviceShared>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// An identifier of this boot of this host (the [`Endpoint::host`] of its devices): processes
/// with the same one share memory.
pub fn host_id() -> u64 {
    static H: OnceLock<u64> = OnceLock::new();
    *H.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        fnv1a(boot.trim().as_bytes())
    })
}

pub(crate) fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// This process's link policy, from `GDSYNC_SOFT_LINK` (read once).
fn link_policy() -> Result<LinkPolicy> {
    static P: OnceLock<std::result::Result<LinkPolicy, String>> = OnceLock::new();
    P.get_or_init(|| {
        let v = std::env::var("GDSYNC_SOFT_LINK").unwrap_or_default();
        v.parse()
            .map_err(|_| format!("GDSYNC_SOFT_LINK={v:?}: expected auto (the default), shm or tcp"))
    })
    .clone()
    .map_err(Error::InvalidArgument)
}

/// Starts accepting soft-device TCP links in this process, on `ip` (unless `GDSYNC_SOFT_ADDR`
/// or `GDSYNC_SOFT_IFACE` say where; `None`: loopback), and returns the address peers dial.
/// Endpoints made from then on carry it. A listener that runs already stays where it is.
///
/// Needed only where peers in other processes will link to this process over TCP and nothing
/// else made it listen: by default a process listens only under `GDSYNC_SOFT_LINK=tcp` or when
/// `GDSYNC_SOFT_ADDR`/`GDSYNC_SOFT_IFACE` is set, and mp's communicator calls this (on the
/// address its bootstrap reaches the other ranks from) when its ranks span hosts. Every
/// connection must prove the job's secret ([`crate::auth`]).
pub fn accept_tcp_links(ip: Option<std::net::IpAddr>) -> Result<SocketAddr> {
    listen::start(ip, on_tcp_dial)
}

/// Where this process accepts TCP links for an endpoint made under `policy`: the listener's
/// address if it runs or is called for (policy `tcp`, or the environment names where to
/// listen); `None` otherwise (policy `shm`; `auto` on loopback, where TCP would serve only this
/// host, whose peers link through memory), or if it cannot start (logged).
fn tcp_address(policy: LinkPolicy) -> Option<SocketAddr> {
    match policy {
        LinkPolicy::Shm => None,
        LinkPolicy::Tcp => accept_tcp_links(None).ok(),
        LinkPolicy::Auto if listen::configured() => accept_tcp_links(None).ok(),
        LinkPolicy::Auto => listen::running(),
    }
}

fn new_uid() -> u64 {
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut seed = [0u8; 28];
    seed[..16].copy_from_slice(&t.to_le_bytes());
    seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    seed[20..24].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let here = &seed as *const _ as usize as u32;
    seed[24..].copy_from_slice(&here.to_le_bytes());
    fnv1a(&seed) | 1
}

/// A short description of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// The unique id used in endpoints.
    pub uid: u64,
}

/// The device state every handle shares. Its drop stops the engine.
pub(crate) struct DeviceShared {
    pub uid: u64,
    pub mrs: Arc<MrTable>,
    pub qps: Arc<QpTable>,
    /// QP numbers in use and free for reuse.
    qpns: Mutex<QpNumbers>,
    next_cqn: AtomicU32,
    next_pd: AtomicU32,
    /// Peers this device has a link to, or is dialing.
    links: Mutex<Links>,
    /// Signalled when a link comes up or a dial ends.
    links_changed: Condvar,
    /// The CPU proxy for QPs whose doorbells a CPU rings on the GPU's behalf.
    pub proxy: Arc<crate::handler::Proxy>,
    engine: EngineHandle,
}

/// A device's QP numbers. As an HCA does, numbers of destroyed QPs are used again, so the
/// numbers and the engine's tables stay bounded by the most QPs alive at once (plus
/// [`QPN_REST`]). A freed number rests behind at least `QPN_REST` others before it names a
/// new QP: packets of its old life still on a link are long gone by then (every QP's packet
/// sequence starts at 0, so the sequence alone would not tell an old packet from a new one).
#[derive(Default)]
struct QpNumbers {
    /// The smallest number never handed out (0 is never a QPN).
    next: u32,
    free: std::collections::VecDeque<u32>,
}

/// How many freed QP numbers wait before the oldest is used again.
const QPN_REST: usize = 1024;

impl QpNumbers {
    fn take(&mut self) -> Result<u32> {
        let fresh_left = self.next < soft::MAX_QPS;
        if self.free.len() > QPN_REST || (!fresh_left && !self.free.is_empty()) {
            return Ok(self.free.pop_front().expect("checked"));
        }
        if !fresh_left {
            return Err(Error::invalid(format!(
                "a soft device serves at most {} QPs at a time: destroy some first",
                soft::MAX_QPS
            )));
        }
        self.next += 1;
        Ok(self.next)
    }
    fn give_back(&mut self, n: u32) {
        self.free.push_back(n);
    }
}

/// A device's links by peer uid.
#[derive(Default)]
struct Links {
    up: HashSet<u64>,
    /// TCP dials in progress (made without the lock held).
    dialing: HashSet<u64>,
    /// Peers whose link a QP of this device has used (and the log has named).
    announced: HashSet<u64>,
}

impl DeviceShared {
    /// The device's name in messages and logs.
    pub(crate) fn name(&self) -> String {
        format!("soft-{:016x}", self.uid)
    }

    pub(crate) fn endpoint(&self, qpn: u32) -> Endpoint {
        // An invalid GDSYNC_SOFT_LINK is reported by connect; the endpoint says auto.
        let link = link_policy().unwrap_or_default();
        // Without a listener the endpoint has no address: peers that need TCP then dial
        // from their side, or get Unreachable naming this endpoint.
        let addr = tcp_address(link);
        Endpoint {
            host: host_id(),
            pid: std::process::id(),
            device: self.uid,
            qpn,
            addr,
            link,
        }
    }

    /// This device's half of the link choice.
    fn here(&self) -> Result<Here> {
        Ok(Here {
            host: host_id(),
            pid: std::process::id(),
            device: self.uid,
            link: link_policy()?,
        })
    }

    /// The link a connect to `remote` uses.
    fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind> {
        choose_link(&self.here()?, remote)
    }

    pub(crate) fn kick(&self) {
        self.engine.kick();
    }

    pub(crate) fn add_qp(&self, qp: &Arc<QpShared>) -> Result<()> {
        self.qps.0.write().insert(qp.qpn, Arc::downgrade(qp));
        self.engine.send(soft::Cmd::AddQp(qp.clone()))
    }

    /// A destroyed QP: out of the tables, its number free for a later QP.
    pub(crate) fn remove_qp(&self, qpn: u32) {
        self.forget_qp(qpn);
        self.qpns.lock().give_back(qpn);
    }

    /// Takes a QP out of the device's tables (its number stays taken).
    pub(crate) fn forget_qp(&self, qpn: u32) {
        self.qps.0.write().remove(&qpn);
        // The engine drops the QP before it sees a later AddQp that reuses the number:
        // commands are applied in order.
        self.engine.send_and_wait(soft::Cmd::RemoveQp(qpn));
    }

    /// Makes sure a link to `remote`'s device exists, then connects the QP over it.
    pub(crate) fn connect(self: &Arc<Self>, qp: &Arc<QpShared>, remote: &Endpoint) -> Result<()> {
        let here = self.here()?;
        let kind = choose_link(&here, remote)?;
        match kind {
            LinkKind::Loopback | LinkKind::InProcess => self.link_in_process(remote)?,
            LinkKind::SharedMemory => self.link_shared_memory(remote)?,
            LinkKind::Tcp => self.link_tcp(remote)?,
        }
        self.announce_link(&here, remote, kind);
        self.engine.send(soft::Cmd::Connect {
            qpn: qp.qpn,
            peer: remote.device,
            rqpn: remote.qpn,
        })?;
        tracing::debug!(
            "{}: QP {:#x} connected to QP {:#x} of device {:016x} (pid {}) over the {kind} link",
            self.name(),
            qp.qpn,
            remote.qpn,
            remote.device,
            remote.pid
        );
        Ok(())
    }

    /// Logs the link to `remote`'s device when a QP of this device first uses it: at info
    /// level for the first link of its kind in this process (a choice made once a run), at
    /// debug level for the others.
    fn announce_link(&self, here: &Here, remote: &Endpoint, kind: LinkKind) {
        static FIRST_OF_KIND: [AtomicBool; 4] = [const { AtomicBool::new(true) }; 4];
        if !self.links.lock().announced.insert(remote.device) {
            return;
        }
        let why = link_reason(here, remote, kind);
        let name = self.name();
        let to = match (kind, remote.addr) {
            (LinkKind::Loopback, _) => String::new(),
            (LinkKind::Tcp, Some(a)) => {
                format!(
                    " to device {:016x} (pid {} at {a})",
                    remote.device, remote.pid
                )
            }
            _ => format!(" to device {:016x} (pid {})", remote.device, remote.pid),
        };
        if FIRST_OF_KIND[kind as usize].swap(false, Ordering::Relaxed) {
            tracing::info!("{name}: {kind} link{to}: {why}");
        } else {
            tracing::debug!("{name}: {kind} link{to}: {why}");
        }
    }

    fn link_in_process(self: &Arc<Self>, remote: &Endpoint) -> Result<()> {
        let peer = registry()
            .lock()
            .get(&remote.device)
            .and_then(Weak::upgrade)
            .ok_or_else(|| {
                Error::Unreachable(format!(
                    "no device {:016x} in this process (dropped?)",
                    remote.device
                ))
            })?;
        if !peer.qps.0.read().contains_key(&remote.qpn) {
            return Err(Error::Unreachable(format!(
                "device {:016x} has no QP {:#x}",
                remote.device, remote.qpn
            )));
        }
        if Arc::ptr_eq(self, &peer) {
            let mut l = self.links.lock();
            if l.up.insert(self.uid) {
                self.engine
                    .send(soft::Cmd::AddLink(Box::new(Link::loopback(self.uid))))?;
            }
            return Ok(());
        }
        // Lock both link sets in uid order so two threads connecting the pair cannot deadlock.
        let (first, second) = if self.uid < peer.uid {
            (self, &peer)
        } else {
            (&peer, self)
        };
        let mut l1 = first.links.lock();
        let mut l2 = second.links.lock();
        if l1.up.contains(&second.uid) {
            return Ok(());
        }
        let (a, b) = Link::in_process_pair(first.uid, second.uid);
        first.engine.send(soft::Cmd::AddLink(Box::new(a)))?;
        second.engine.send(soft::Cmd::AddLink(Box::new(b)))?;
        l1.up.insert(second.uid);
        l2.up.insert(first.uid);
        Ok(())
    }

    fn link_shared_memory(&self, remote: &Endpoint) -> Result<()> {
        let mut l = self.links.lock();
        if l.up.contains(&remote.device) {
            return Ok(());
        }
        let link = Link::shared_memory(self.uid, remote.device, remote.pid)?;
        self.engine.send(soft::Cmd::AddLink(Box::new(link)))?;
        l.up.insert(remote.device);
        Ok(())
    }

    /// A TCP link to `remote`'s device. The device that connects first dials the other's
    /// listener ([`on_tcp_dial`] accepts); the other's `connect` then finds the link. If both
    /// dial at once, the smaller uid's dial wins and the other device waits for it (up to
    /// [`soft::PEER_WAIT`]). A peer whose endpoint has no address (its process does not
    /// listen) always dials this one.
    fn link_tcp(&self, remote: &Endpoint) -> Result<()> {
        let peer = remote.device;
        let Some(addr) = dialable(remote)? else {
            return self.wait_for_dial_from(remote);
        };
        {
            // One dial per peer: another QP of this device may be dialing it right now.
            let mut l = self.links.lock();
            loop {
                if l.up.contains(&peer) {
                    return Ok(());
                }
                if l.dialing.insert(peer) {
                    break;
                }
                self.links_changed.wait(&mut l);
            }
        }
        let hello = tcp::Hello::new(self.uid, peer, host_id(), std::process::id());
        tracing::debug!(
            "{}: dialing device {peer:016x} (pid {}) at {addr}",
            self.name(),
            remote.pid
        );
        let dialed = tcp::dial(addr, &hello, self.engine.waker());
        let mut l = self.links.lock();
        l.dialing.remove(&peer);
        self.links_changed.notify_all();
        match dialed? {
            tcp::Dialed::Linked(link) => {
                self.engine.send(soft::Cmd::AddLink(Box::new(link)))?;
                l.up.insert(peer);
                Ok(())
            }
            tcp::Dialed::TheirDial => {
                tracing::debug!(
                    "{}: device {peer:016x} is dialing this device too: waiting for its dial",
                    self.name()
                );
                drop(l);
                self.wait_for_dial_from(remote)
            }
        }
    }

    /// Waits (up to [`soft::PEER_WAIT`]) for the link `remote`'s device dials to this
    /// process's listener.
    fn wait_for_dial_from(&self, remote: &Endpoint) -> Result<()> {
        let peer = remote.device;
        let Some(here) = listen::running() else {
            return Err(Error::Unreachable(format!(
                "neither {remote} nor this process accepts TCP links: set GDSYNC_SOFT_LINK=tcp, GDSYNC_SOFT_ADDR or GDSYNC_SOFT_IFACE in one of them (mp's communicator does when its ranks span hosts)"
            )));
        };
        let deadline = Instant::now() + soft::PEER_WAIT;
        let mut l = self.links.lock();
        while !l.up.contains(&peer) {
            if self.links_changed.wait_until(&mut l, deadline).timed_out() {
                return Err(Error::Unreachable(format!(
                    "device {peer:016x} ({remote}) did not set up a TCP link to this process (at {here}) within {} s",
                    soft::PEER_WAIT.as_secs()
                )));
            }
        }
        Ok(())
    }
}

/// The address to dial `remote` at; `None` if it has none (it dials this process instead).
/// An error for a loopback address of another host.
fn dialable(remote: &Endpoint) -> Result<Option<SocketAddr>> {
    match remote.addr {
        Some(a) if a.ip().is_loopback() && remote.host != host_id() => {
            Err(Error::Unreachable(format!(
                "{remote} is on another host and accepts TCP links on its loopback interface only: set GDSYNC_SOFT_ADDR or GDSYNC_SOFT_IFACE in its process"
            )))
        }
        a => Ok(a),
    }
}

/// Serves a hello that reached this process's TCP listener: hands the connection to the
/// device it names, if that device exists and has no link to the dialer yet. If the device
/// is dialing the dialer at this moment, the dial from the smaller uid wins.
fn on_tcp_dial(hello: tcp::Hello, mut stream: TcpStream) {
    let target = registry().lock().get(&hello.target).and_then(Weak::upgrade);
    let refuse = |mut s: TcpStream, a: tcp::Answer| {
        tracing::debug!(
            "soft device: refused a TCP link from device {:016x} (pid {}) to device {:016x}: {a:?}",
            hello.dialer,
            hello.pid,
            hello.target
        );
        let _ = tcp::answer(&mut s, a);
    };
    let Some(dev) = target else {
        return refuse(stream, tcp::Answer::NoDevice);
    };
    if !hello.compatible() {
        return refuse(stream, tcp::Answer::Incompatible);
    }
    let mut l = dev.links.lock();
    let refusal = if l.up.contains(&hello.dialer) {
        Some(tcp::Answer::AlreadyLinked)
    } else if l.dialing.contains(&hello.dialer) && dev.uid < hello.dialer {
        Some(tcp::Answer::Crossed)
    } else {
        None
    };
    if let Some(a) = refusal {
        drop(l);
        return refuse(stream, a);
    }
    if tcp::answer(&mut stream, tcp::Answer::Accepted).is_err() {
        return; // the dialer gave up
    }
    let linked = tcp::bridge(stream, hello.dialer, dev.engine.waker())
        .and_then(|link| dev.engine.send(soft::Cmd::AddLink(Box::new(link))));
    match linked {
        Ok(()) => {
            l.up.insert(hello.dialer);
            dev.links_changed.notify_all();
            tracing::debug!(
                "{}: accepted a TCP link from device {:016x} (pid {})",
                dev.name(),
                hello.dialer,
                hello.pid
            );
        }
        Err(e) => tracing::warn!(
            "{}: cannot set up the TCP link device {:016x} (pid {}) dialed: {e}",
            dev.name(),
            hello.dialer,
            hello.pid
        ),
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        registry().lock().remove(&self.uid);
        self.engine.stop();
    }
}

/// A NIC: owns the engine that serves its queues. Cloning gives another handle.
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("uid", &format_args!("{:016x}", self.shared.uid))
            .finish()
    }
}

impl Device {
    /// A soft device: a software model of the mlx5 RC data path, served by its own engine
    /// thread. Needs no hardware.
    pub fn soft() -> Result<Self> {
        let uid = new_uid();
        let mrs = Arc::new(MrTable::default());
        let engine = EngineHandle::spawn(uid, mrs.clone())?;
        let shared = Arc::new(DeviceShared {
            uid,
            mrs,
            qps: Arc::new(QpTable::default()),
            qpns: Mutex::new(QpNumbers::default()),
            next_cqn: AtomicU32::new(1),
            next_pd: AtomicU32::new(1),
            links: Mutex::new(Links::default()),
            links_changed: Condvar::new(),
            proxy: Default::default(),
            engine,
        });
        registry().lock().insert(uid, Arc::downgrade(&shared));
        log_soft_device(&shared.name());
        Ok(Device { shared })
    }

    /// The link a [`Qp::connect`] to `remote` would use, or why there is none (conflicting
    /// link policies, another host under `GDSYNC_SOFT_LINK=shm`, an invalid policy).
    pub fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind> {
        self.shared.link_kind(remote)
    }

    /// Name and id.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.shared.name(),
            uid: self.shared.uid,
        }
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            dev: self.shared.clone(),
            id: self.shared.next_pd.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A completion queue of at least `entries` CQEs (rounded up to a power of two).
    pub fn create_cq(&self, entries: u32) -> Result<Cq> {
        Cq::create(
            &self.shared,
            self.shared.next_cqn.fetch_add(1, Ordering::Relaxed),
            entries,
        )
    }
}

/// Logs a new soft device: the first of the process at info level, with why no RDMA NIC is
/// used (warn where one exists: this build drives none), the others at debug level.
fn log_soft_device(name: &str) {
    static FIRST: AtomicBool = AtomicBool::new(true);
    if !FIRST.swap(false, Ordering::Relaxed) {
        tracing::debug!("{name}: soft device created");
        return;
    }
    // The probe loads libibverbs: only when an event would be recorded.
    if !tracing::enabled!(tracing::Level::WARN) {
        return;
    }
    match crate::probe::rdma() {
        crate::probe::RdmaStatus::LibraryMissing(e) => tracing::info!(
            "{name}: soft device (a software NIC) created: rdma-core is not installed ({e})"
        ),
        crate::probe::RdmaStatus::NoDevice => tracing::info!(
            "{name}: soft device (a software NIC) created: no RDMA device in /sys/class/infiniband"
        ),
        crate::probe::RdmaStatus::Devices(d) => {
            let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
            tracing::warn!(
                "{name}: soft device (a software NIC) created: this build drives no RDMA hardware, so {} stays unused",
                names.join(", ")
            );
        }
    }
}

impl ProtectionDomain {
    /// A reliable-connected QP completing sends on `send_cq` and receives on `recv_cq`.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &QpConfig) -> Result<Qp> {
        let qpn = self.dev.qpns.lock().take()?;
        Qp::create(&self.dev, self.id, qpn, send_cq, recv_cq, cfg).inspect_err(|_| {
            // Never created (its drop will not give the number back).
            self.dev.qpns.lock().give_back(qpn)
        })
    }
}

#[cfg(test)]
mod tcp_tests;
