//! The soft device's control path: the provider commands ([`Provider`]) on its QP, CQ and
//! translation tables, and the links to peer devices a connect sets up.

use super::engine::{CqHw, QpHw};
use super::link::DeviceShare;
use super::link_budget::LinkSlot;
use super::mr_table::MrTable;
use super::qp_numbers::QpNumbers;
use super::targets::WriteTargets;
use super::uar::{Bfreg, UarPages, BF_SIZE};
use super::{listen, tcp, Cmd, EngineHandle, Link, PEER_WAIT};
use crate::provider::*;
use crate::provider::{choose_link, link_reason, Here};
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// The process's devices, by uid, so in-process peers can find each other.
fn registry() -> &'static Mutex<HashMap<u64, Weak<SoftDevice>>> {
    static R: OnceLock<Mutex<HashMap<u64, Weak<SoftDevice>>>> = OnceLock::new();
    R.get_or_init(Default::default)
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

/// A device's id: random (from the OS's generator), so that other processes cannot guess
/// the ids of devices they were not told of.
fn new_uid() -> u64 {
    crate::random::u64() | 1
}

/// A soft device: the provider commands, served on the control path; the data path is its
/// engine's. Its drop stops the engine.
pub(crate) struct SoftDevice {
    uid: u64,
    /// The translation table (the engine reads its own copy), and the QPs that take direct
    /// writes: what the device shares with its in-process peers.
    pub(super) share: DeviceShare,
    /// QP numbers in use and free for reuse.
    qpns: Mutex<QpNumbers>,
    /// The doorbell pages and the QPs' bfregs in them.
    uars: Mutex<UarPages>,
    /// CQ contexts by number, for the QPs created on them.
    cqs: Mutex<HashMap<u32, Arc<CqHw>>>,
    next_cqn: AtomicU32,
    next_pd: AtomicU32,
    /// Peers this device has a link to, or is dialing (shared with the engine, which forgets
    /// the peer of a link it releases).
    links: Arc<Mutex<Links>>,
    /// Signalled when a link comes up or a dial ends.
    links_changed: Condvar,
    /// Shared-memory links form after the connect that needs them returns, as the HCA of
    /// the emulated driver (set by [`SoftDevice::link_lazily`]): an RTR never waits for the
    /// peer there. gdsync's own connects set the link up before they return.
    lazy_links: AtomicBool,
    engine: EngineHandle,
}

/// A device's links by peer uid. A link is released once its peer is gone (docs/soft-device.md,
/// "Links"): the engine then [forgets](Links::forget) the peer, so that the set holds only
/// live peers and a later connect to that peer sets up a fresh link.
#[derive(Default)]
struct Links {
    up: HashSet<u64>,
    /// TCP dials in progress (made without the lock held).
    dialing: HashSet<u64>,
    /// Peers whose link a QP of this device has used (and the log has named).
    announced: HashSet<u64>,
}

impl Links {
    /// The engine released its link to `peer`.
    fn forget(&mut self, peer: u64) {
        self.up.remove(&peer);
        self.announced.remove(&peer);
    }
}

impl SoftDevice {
    /// The device's name in messages and logs.
    fn label(&self) -> String {
        format!("soft-{:016x}", self.uid)
    }

    fn address(&self, qpn: u32) -> Endpoint {
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
            port: None,
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

    /// Makes sure a link to `remote`'s device exists, then connects the QP over it.
    fn connect(&self, qpn: u32, remote: &Endpoint, rq_psn: u32) -> Result<()> {
        let here = self.here()?;
        let kind = choose_link(&here, remote)?;
        // Whether the link may come up after this connect returns (a shared-memory link whose
        // file the peer has yet to create: its own RTR does).
        let mut lazy = false;
        match kind {
            LinkKind::Loopback | LinkKind::InProcess => self.link_in_process(remote)?,
            LinkKind::SharedMemory => lazy = !self.link_shared_memory(remote)?,
            LinkKind::Tcp => self.link_tcp(remote)?,
            LinkKind::Fabric => unreachable!("choose_link never picks an RDMA fabric"),
        }
        self.announce_link(&here, remote, kind);
        self.engine.send_and_wait(Cmd::Connect {
            qpn,
            rq_psn,
            peer: remote.device,
            rqpn: remote.qpn,
            lazy,
        })?;
        tracing::debug!(
            "{}: QP {:#x} connected to QP {:#x} of device {:016x} (pid {}) over the {kind} link",
            self.label(),
            qpn,
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
        static FIRST_OF_KIND: [AtomicBool; 5] = [const { AtomicBool::new(true) }; 5];
        if !self.links.lock().announced.insert(remote.device) {
            return;
        }
        let why = link_reason(here, remote, kind);
        let name = self.label();
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

    fn link_in_process(&self, remote: &Endpoint) -> Result<()> {
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
        if !peer.qpns.lock().is_live(remote.qpn) {
            return Err(Error::Unreachable(format!(
                "device {:016x} has no QP {:#x}",
                remote.device, remote.qpn
            )));
        }
        if self.uid == peer.uid {
            let mut l = self.links.lock();
            if l.up.insert(self.uid) {
                self.engine
                    .send(Cmd::AddLink(Box::new(Link::loopback(self.uid))))?;
            }
            return Ok(());
        }
        // Lock both link sets in uid order so two threads connecting the pair cannot deadlock.
        let (first, second) = if self.uid < peer.uid {
            (self, &*peer)
        } else {
            (&*peer, self)
        };
        let mut l1 = first.links.lock();
        let mut l2 = second.links.lock();
        if l1.up.contains(&second.uid) {
            return Ok(());
        }
        let (a, b) = Link::in_process_pair((first.uid, &first.share), (second.uid, &second.share));
        first.engine.send(Cmd::AddLink(Box::new(a)))?;
        second.engine.send(Cmd::AddLink(Box::new(b)))?;
        l1.up.insert(second.uid);
        l2.up.insert(first.uid);
        Ok(())
    }

    /// A shared-memory link to `remote`'s device: whether it is up now. The device with the
    /// smaller uid creates the link's file at once; the other maps it once its peer created
    /// it, which may be only at the peer's own connect (its RTR). Where links form lazily
    /// ([`link_lazily`](Self::link_lazily)) that wait runs on a thread of its own, so that
    /// this connect (an RTR, which on a ConnectX returns at once) does not wait for the peer:
    /// QPs connected meanwhile wait for the link ([`Cmd::Connect`]'s `lazy`), their sends
    /// under the transport timeout.
    fn link_shared_memory(&self, remote: &Endpoint) -> Result<bool> {
        let mut l = self.links.lock();
        if l.up.contains(&remote.device) {
            return Ok(true);
        }
        if self.uid < remote.device || !self.lazy_links.load(Ordering::Relaxed) {
            let link = Link::shared_memory(self.uid, remote.device, remote.pid)?;
            self.engine.send(Cmd::AddLink(Box::new(link)))?;
            l.up.insert(remote.device);
            return Ok(true);
        }
        if l.dialing.insert(remote.device) {
            let me = registry()
                .lock()
                .get(&self.uid)
                .cloned()
                .unwrap_or_default();
            let (uid, peer, pid) = (self.uid, remote.device, remote.pid);
            std::thread::Builder::new()
                .name("gdsync-shm-link".into())
                .spawn(move || link_when_created(&me, uid, peer, pid))
                .map_err(|e| Error::Unreachable(format!("a thread to set up a link: {e}")))?;
        }
        Ok(false)
    }

    /// A TCP link to `remote`'s device. The device that connects first dials the other's
    /// listener ([`on_tcp_dial`] accepts); the other's `connect` then finds the link. If both
    /// dial at once, the smaller uid's dial wins and the other device waits for it (up to
    /// [`PEER_WAIT`]). A peer whose endpoint has no address (its process does not listen)
    /// always dials this one.
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
            self.label(),
            remote.pid
        );
        let dialed = tcp::dial(addr, &hello, self.engine.waker());
        let mut l = self.links.lock();
        l.dialing.remove(&peer);
        self.links_changed.notify_all();
        match dialed? {
            tcp::Dialed::Linked(link) => {
                self.engine.send(Cmd::AddLink(link))?;
                l.up.insert(peer);
                Ok(())
            }
            tcp::Dialed::TheirDial => {
                tracing::debug!(
                    "{}: device {peer:016x} is dialing this device too: waiting for its dial",
                    self.label()
                );
                drop(l);
                self.wait_for_dial_from(remote)
            }
        }
    }

    /// Waits (up to [`PEER_WAIT`]) for the link `remote`'s device dials to this process's
    /// listener.
    fn wait_for_dial_from(&self, remote: &Endpoint) -> Result<()> {
        let peer = remote.device;
        let Some(here) = listen::running() else {
            return Err(Error::Unreachable(format!(
                "neither {remote} nor this process accepts TCP links: set GDSYNC_SOFT_LINK=tcp, GDSYNC_SOFT_ADDR or GDSYNC_SOFT_IFACE in one of them (mp's communicator does when its ranks span hosts)"
            )));
        };
        let deadline = Instant::now() + PEER_WAIT;
        let mut l = self.links.lock();
        while !l.up.contains(&peer) {
            if self.links_changed.wait_until(&mut l, deadline).timed_out() {
                return Err(Error::Unreachable(format!(
                    "device {peer:016x} ({remote}) did not set up a TCP link to this process (at {here}) within {} s",
                    PEER_WAIT.as_secs()
                )));
            }
        }
        Ok(())
    }
}

/// Maps the shared-memory link file device `peer` (of process `pid`) creates for device `uid`
/// (`me`, while it lives), waiting for it as [`Link::shared_memory`] does, and hands the link
/// to `me`'s engine. A peer that never creates it (its process exited first, or it never
/// connected within the set-up wait) is logged, and the QPs waiting for the link learn that
/// the peer is gone ([`Cmd::NoLink`]).
fn link_when_created(me: &Weak<SoftDevice>, uid: u64, peer: u64, pid: u32) {
    let link = Link::shared_memory(uid, peer, pid);
    let Some(dev) = me.upgrade() else {
        return;
    };
    let mut l = dev.links.lock();
    l.dialing.remove(&peer);
    dev.links_changed.notify_all();
    match link.and_then(|link| dev.engine.send(Cmd::AddLink(Box::new(link)))) {
        Ok(()) => {
            l.up.insert(peer);
        }
        Err(e) => {
            tracing::warn!("{}: no link to device {peer:016x}: {e}", dev.label());
            let _ = dev.engine.send(Cmd::NoLink(peer));
        }
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
/// is dialing the dialer at this moment, the dial from the smaller uid wins. `slot` is the
/// link's place in the listener's budget: held by the link until it is released.
fn on_tcp_dial(hello: tcp::Hello, mut stream: TcpStream, slot: LinkSlot) {
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
    let linked = tcp::bridge(stream, hello.dialer, dev.engine.waker(), Some(slot))
        .and_then(|link| dev.engine.send(Cmd::AddLink(Box::new(link))));
    match linked {
        Ok(()) => {
            l.up.insert(hello.dialer);
            dev.links_changed.notify_all();
            tracing::debug!(
                "{}: accepted a TCP link from device {:016x} (pid {})",
                dev.label(),
                hello.dialer,
                hello.pid
            );
        }
        Err(e) => tracing::warn!(
            "{}: cannot set up the TCP link device {:016x} (pid {}) dialed: {e}",
            dev.label(),
            hello.dialer,
            hello.pid
        ),
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Logs a new soft device: the first of the process at info level, with why no RDMA NIC is
/// used or which are present (a soft device is always asked for, by `Device::soft`, by name or
/// as the default where no mlx5 port is active: never a warning), the others at debug level.
fn log_soft_device(name: &str) {
    static FIRST: AtomicBool = AtomicBool::new(true);
    if !FIRST.swap(false, Ordering::Relaxed) {
        tracing::debug!("{name}: soft device created");
        return;
    }
    // The probe loads libibverbs: only when an event would be recorded.
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    match crate::probe::rdma() {
        crate::probe::RdmaStatus::LibraryMissing(e) => tracing::info!(
            "{name}: soft device (a software NIC) created: rdma-core is not installed ({e})"
        ),
        crate::probe::RdmaStatus::NoDevice => tracing::info!(
            "{name}: soft device (a software NIC) created: rdma-core found no RDMA device"
        ),
        crate::probe::RdmaStatus::Devices(d) => {
            let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
            tracing::info!(
                "{name}: soft device (a software NIC) created; {} is present too (Device::open or GDSYNC_DEVICE chooses an RDMA device)",
                names.join(", ")
            );
        }
    }
}

impl SoftDevice {
    /// A new soft device with its engine thread, its doorbell pages mapped for the GPUs of
    /// `gpus` (none: host memory only).
    pub(crate) fn new(gpus: Option<&Arc<crate::cuda::Cuda>>) -> Result<Arc<Self>> {
        // A GDSYNC_SOFT_PROGRESS it does not take is an error here (crate::env's rule).
        super::progress::setting_from_env()?;
        let dev = Self::spawn()?;
        dev.uars.lock().map_for(gpus);
        log_soft_device(&dev.label());
        Ok(dev)
    }

    /// Stops the engine, which closes the device's links (peers see it go away in order).
    /// The device serves nothing after.
    pub(crate) fn stop(&self) {
        registry().lock().remove(&self.uid);
        self.engine.stop();
    }

    /// A new soft device that serves as the HCA of a driver above it (the emulated kernel
    /// driver): as [`SoftDevice::new`], without the log of why no RDMA NIC is used.
    pub(crate) fn spawn() -> Result<Arc<Self>> {
        Self::spawn_numbering(QpNumbers::default())
    }

    /// As [`SoftDevice::spawn`], its QPs numbered from `qpns` (a process's share of an
    /// emulated HCA's numbers).
    pub(crate) fn spawn_numbering(qpns: QpNumbers) -> Result<Arc<Self>> {
        let uid = new_uid();
        let share = DeviceShare {
            regions: Arc::new(MrTable::default()),
            targets: Arc::new(WriteTargets::new(super::MAX_QPS)),
        };
        let links = Arc::new(Mutex::new(Links::default()));
        let peers = links.clone();
        let forget = Box::new(move |peer| peers.lock().forget(peer));
        let engine = EngineHandle::spawn(uid, share.clone(), forget)?;
        let dev = Arc::new(SoftDevice {
            uid,
            share,
            qpns: Mutex::new(qpns),
            uars: Mutex::new(UarPages::default()),
            cqs: Mutex::new(HashMap::new()),
            next_cqn: AtomicU32::new(1),
            next_pd: AtomicU32::new(1),
            links,
            links_changed: Condvar::new(),
            lazy_links: AtomicBool::new(false),
            engine,
        });
        registry().lock().insert(uid, Arc::downgrade(&dev));
        Ok(dev)
    }
}

/// What a driver above the soft device already gave a QP (the emulated kernel driver, for
/// libmlx5's QPs): the doorbell register in its UAR page, which libmlx5 rings (the device
/// watches both halves, as for its own), and libmlx5's user index (`uidx`, CQE version 1:
/// CQEs carry it in `srqn_uidx`, and libmlx5 finds the QP by it).
pub(crate) struct DriverQp {
    pub doorbell: MemAt,
    /// The offset in the doorbell's page of a second register that rings the QP too, if
    /// any (a QP on a dynamic UAR page: libmlx5 rings either of the page's two bfregs).
    pub pair: Option<usize>,
    pub user_index: u32,
    /// Where in `buf`'s first page libmlx5 placed the receive ring (any offset the kernel
    /// accepts: a parent domain's allocator may place it inside a page).
    pub rq_off: usize,
}

impl SoftDevice {
    /// The send and receive CQs a QP spec names.
    fn cq_pair(&self, spec: &QpSpec) -> Result<(Arc<CqHw>, Arc<CqHw>)> {
        let cqs = self.cqs.lock();
        let cq = |n: u32| {
            cqs.get(&n)
                .cloned()
                .ok_or_else(|| Error::invalid(format!("no CQ {n:#x} on {}", self.label())))
        };
        Ok((cq(spec.send_cqn)?, cq(spec.recv_cqn)?))
    }

    /// From now on, a connect does not wait for the peer's half of a shared-memory link: the
    /// QP waits for the link instead, as a ConnectX's RTR returns at once (the emulated
    /// driver's HCA, whose programs may move to RTR before their peer does).
    pub(crate) fn link_lazily(&self) {
        self.lazy_links.store(true, Ordering::Relaxed);
    }

    /// Sets the remote access QP `qpn` grants its peer (the emulated driver's modify with
    /// access flags); applied before the command returns, as a HCA's modify is.
    pub(crate) fn set_qp_access(&self, qpn: u32, access: Access) -> Result<()> {
        self.engine.send_and_wait(Cmd::Access { qpn, access })
    }
}

/// The ring memory a create command gave: the soft device owns no rings of its own.
fn given<T>(mem: Option<T>, what: &str) -> Result<T> {
    mem.ok_or_else(|| {
        Error::invalid(format!(
            "a {what} without ring memory: the soft device uses the rings it is given"
        ))
    })
}

impl SoftDevice {
    /// `create_qp`, for a QP whose doorbell register and user index a driver above the device
    /// already gave it (`driver`), or `None`: the device's own register, user index 0.
    pub(crate) fn create_qp_with(
        &self,
        spec: QpSpec,
        driver: Option<DriverQp>,
    ) -> Result<QpCreated> {
        let (send_cq, recv_cq) = self.cq_pair(&spec)?;
        let mem = given(spec.mem, "QP")?;
        if let Some(DriverQp {
            doorbell: at, pair, ..
        }) = &driver
        {
            // Both halves are read as u64s: a register that does not fit is refused here
            // rather than trusted.
            for off in [at.off, pair.unwrap_or(at.off)] {
                if off % 8 != 0 || off + BF_SIZE + 8 > at.mem.len() {
                    return Err(Error::invalid(format!(
                        "doorbell register at offset {off:#x} of a {}-byte page",
                        at.mem.len()
                    )));
                }
            }
        }
        let qpn = self.qpns.lock().take()?;
        // A driver's QP grants no remote access until its INIT says which (`set_qp_access`);
        // the queue layer's QPs grant it all (gdsync's INIT on a ConnectX does).
        let (bfreg, user_index, rq_off, access) = match driver {
            Some(d) => (
                Bfreg {
                    pair: d.pair.unwrap_or(d.doorbell.off),
                    page: d.doorbell.mem,
                    off: d.doorbell.off,
                },
                d.user_index,
                d.rq_off,
                Access::empty(),
            ),
            None => (self.uars.lock().alloc(qpn), 0, 0, Access::all()),
        };
        let hw = QpHw {
            qpn,
            pd: spec.pd,
            buf: mem.buf,
            rq_off,
            sq_off: mem.sq_off,
            sq_cnt: spec.sq_wqebbs,
            rq_cnt: spec.rq_wqes,
            rq_stride: spec.rq_stride,
            dbrec: mem.dbrec.mem,
            dbrec_off: mem.dbrec.off,
            bfreg: bfreg.clone(),
            send_cq,
            recv_cq,
            user_index,
            access,
            timers: QpTimers {
                sq_psn: 0,
                timeout: std::time::Duration::from_secs(5),
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: std::time::Duration::from_millis(2),
            },
        };
        self.engine.ctl().reset_qp(qpn);
        if let Err(e) = self.engine.send(Cmd::AddQp(Box::new(hw))) {
            self.uars.lock().release(qpn);
            self.qpns.lock().give_back(qpn);
            return Err(e);
        }
        Ok(QpCreated {
            qpn,
            doorbell: MemAt {
                mem: bfreg.page,
                off: bfreg.off,
            },
            bf_size: BF_SIZE,
            doorbell_wc: false,
            gpu_doorbell: Ok(()),
            device_rings: None,
        })
    }
}

impl Provider for SoftDevice {
    fn name(&self) -> String {
        self.label()
    }

    fn uid(&self) -> u64 {
        self.uid
    }

    fn query_device(&self) -> DeviceAttr {
        super::attr::device_attr()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        super::attr::port_attr(port)
    }

    fn endpoint(&self, qpn: u32) -> Endpoint {
        self.address(qpn)
    }

    fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind> {
        choose_link(&self.here()?, remote)
    }

    fn alloc_pd(&self) -> u32 {
        self.next_pd.fetch_add(1, Ordering::Relaxed)
    }

    fn dealloc_pd(&self, _pd: u32) {}

    fn reg_mr(&self, spec: &MrSpec) -> Result<MrKeys> {
        let key = self.share.regions.register(spec);
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }

    fn dereg_mr(&self, lkey: u32) {
        self.share.regions.remove(lkey);
    }

    fn create_cq(&self, spec: CqSpec) -> Result<CqCreated> {
        let mem = given(spec.mem, "CQ")?;
        let cqn = self.next_cqn.fetch_add(1, Ordering::Relaxed);
        let cq = Arc::new(CqHw {
            cqn,
            cnt: spec.entries,
            ring: mem.ring,
            dbrec: mem.dbrec.mem,
            dbrec_off: mem.dbrec.off,
            pi: crate::mem::Padded(AtomicU64::new(0)),
            ci_seen: AtomicU32::new(0),
            overrun: AtomicBool::new(false),
            ctl: self.engine.ctl().clone(),
        });
        self.cqs.lock().insert(cqn, cq);
        Ok(CqCreated {
            cqn,
            device_rings: None,
        })
    }

    fn destroy_cq(&self, cqn: u32) {
        self.cqs.lock().remove(&cqn);
    }

    fn create_qp(&self, spec: QpSpec) -> Result<QpCreated> {
        self.create_qp_with(spec, None)
    }

    fn modify_qp(&self, qpn: u32, to: QpModify) -> Result<()> {
        let st = match to {
            QpModify::Init => HwQpState::Init,
            QpModify::Rtr(path) => {
                let port_mtu = super::attr::port_attr(1)?.active_mtu;
                if path.mtu == 0 || path.mtu > port_mtu {
                    return Err(Error::invalid(format!(
                        "path MTU {} out of 1..={port_mtu}",
                        path.mtu
                    )));
                }
                self.connect(qpn, &path.remote, path.rq_psn)?;
                HwQpState::Rtr
            }
            QpModify::Rts(timers) => {
                // The links are reliable: a request is never resent for loss, so the retry
                // count bounds nothing here; the timeout fails a silent peer's work.
                tracing::trace!(
                    "{}: QP {qpn:#x} to RTS (timeout {:?}, retry count {}, RNR retry {})",
                    self.label(),
                    timers.timeout,
                    timers.retry_cnt,
                    timers.rnr_retry
                );
                self.engine.send_and_wait(Cmd::Timers { qpn, timers })?;
                HwQpState::Rts
            }
        };
        // The engine's own move to error wins over a later command.
        if self.engine.ctl().state(qpn) != HwQpState::Error {
            self.engine.ctl().set_state(qpn, st);
        }
        Ok(())
    }

    fn query_qp(&self, qpn: u32) -> QpAttr {
        self.engine.ctl().attr(qpn)
    }

    fn destroy_qp(&self, qpn: u32) {
        // Returns once the engine let go of the QP, as a verbs destroy does; commands are
        // applied in order, so the engine drops it before an AddQp that reuses the number.
        // (A stopped engine holds nothing to let go of.)
        let _ = self.engine.send_and_wait(Cmd::RemoveQp(qpn));
        self.uars.lock().release(qpn);
        self.qpns.lock().give_back(qpn);
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        self.engine.ctl().next_event()
    }

    fn has_async_event(&self) -> bool {
        self.engine.ctl().has_event()
    }

    fn kick(&self) {
        self.engine.kick();
    }

    fn idle(&self) {
        self.engine.help_poll();
    }
}

#[cfg(test)]
impl SoftDevice {
    /// Links the engine holds, and peers the device counts as linked (for tests).
    fn links_now(&self) -> (usize, usize) {
        (self.engine.ctl().links_held(), self.links.lock().up.len())
    }
}

/// The soft device behind a device handle (for tests).
#[cfg(test)]
fn soft_of(d: &crate::Device) -> Arc<SoftDevice> {
    registry()
        .lock()
        .get(&d.info().uid)
        .and_then(Weak::upgrade)
        .expect("a soft device")
}

#[cfg(test)]
#[path = "tcp_tests.rs"]
mod tcp_tests;

#[cfg(test)]
#[path = "direct_write_model_tests.rs"]
mod direct_write_model_tests;
#[cfg(test)]
#[path = "direct_write_tests.rs"]
mod direct_write_tests;
#[cfg(test)]
#[path = "link_release_tests.rs"]
mod link_release_tests;
#[cfg(test)]
#[path = "modify_tests.rs"]
mod modify_tests;
#[cfg(test)]
#[path = "strict_tests.rs"]
mod strict_tests;
#[cfg(test)]
#[path = "waiting_tests.rs"]
mod waiting_tests;
