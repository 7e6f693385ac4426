//! Devices: the NIC below the queues. Only the soft device exists so far: a software model
//! of the mlx5 RC data path (see `docs/soft-device.md`).

pub(crate) mod soft;

use crate::cq::Cq;
use crate::mr::{MrTable, ProtectionDomain};
use crate::qp::{Qp, QpConfig, QpShared};
use crate::{Error, Result};
use parking_lot::{Mutex, RwLock};
use soft::{EngineHandle, Link};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};

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

/// An identifier of this boot of this host: peers with the same one share memory.
pub(crate) fn host_id() -> u64 {
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

/// What a peer needs to reach a QP: plain data, exchanged out of band (a thread channel, a
/// file, a socket, MPI). Encodes to 32 bytes ([`Endpoint::to_bytes`]) or a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Host (boot) identifier.
    pub host: u64,
    /// Process id of the QP's owner.
    pub pid: u32,
    /// The device's unique id.
    pub device: u64,
    /// The QP number.
    pub qpn: u32,
}

impl Endpoint {
    const MAGIC: [u8; 4] = *b"GDE1";

    /// The 32-byte wire form.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&Self::MAGIC);
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.host.to_le_bytes());
        b[16..24].copy_from_slice(&self.device.to_le_bytes());
        b[24..28].copy_from_slice(&self.qpn.to_le_bytes());
        b
    }
    /// Parses the 32-byte wire form.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != 32 || b[..4] != Self::MAGIC {
            return Err(Error::invalid(
                "not a gdsync endpoint (expected 32 bytes starting with GDE1)",
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Ok(Self {
            pid: u32_at(4),
            host: u64_at(8),
            device: u64_at(16),
            qpn: u32_at(24),
        })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gdsync:{:016x}:{}:{:016x}:{:x}",
            self.host, self.pid, self.device, self.qpn
        )
    }
}

impl std::str::FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "not an endpoint string: {s:?} (expected gdsync:HOST:PID:DEVICE:QPN)"
            ))
        };
        let p: Vec<&str> = s.trim().split(':').collect();
        if p.len() != 5 || p[0] != "gdsync" {
            return Err(bad());
        }
        Ok(Self {
            host: u64::from_str_radix(p[1], 16).map_err(|_| bad())?,
            pid: p[2].parse().map_err(|_| bad())?,
            device: u64::from_str_radix(p[3], 16).map_err(|_| bad())?,
            qpn: u32::from_str_radix(p[4], 16).map_err(|_| bad())?,
        })
    }
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
    next_qpn: AtomicU32,
    next_cqn: AtomicU32,
    next_pd: AtomicU32,
    /// Peers this device has a link to.
    links: Mutex<HashSet<u64>>,
    /// The CPU proxy for QPs whose doorbells a CPU rings on the GPU's behalf.
    pub proxy: Arc<crate::handler::Proxy>,
    engine: EngineHandle,
}

impl DeviceShared {
    pub(crate) fn endpoint(&self, qpn: u32) -> Endpoint {
        Endpoint {
            host: host_id(),
            pid: std::process::id(),
            device: self.uid,
            qpn,
        }
    }

    pub(crate) fn kick(&self) {
        self.engine.kick();
    }

    pub(crate) fn add_qp(&self, qp: &Arc<QpShared>) -> Result<()> {
        self.qps.0.write().insert(qp.qpn, Arc::downgrade(qp));
        self.engine.send(soft::Cmd::AddQp(qp.clone()))
    }

    pub(crate) fn remove_qp(&self, qpn: u32) {
        self.qps.0.write().remove(&qpn);
        let _ = self.engine.send(soft::Cmd::RemoveQp(qpn));
    }

    /// Makes sure a link to `remote`'s device exists, then connects the QP over it.
    pub(crate) fn connect(self: &Arc<Self>, qp: &Arc<QpShared>, remote: &Endpoint) -> Result<()> {
        if remote.host != host_id() {
            return Err(Error::Unreachable(format!(
                "{remote} is on another host; the soft device links processes on one host (shared memory) and threads of one process"
            )));
        }
        if remote.pid == std::process::id() {
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
            self.link_in_process(&peer)?;
        } else {
            self.link_shared_memory(remote)?;
        }
        self.engine.send(soft::Cmd::Connect {
            qpn: qp.qpn,
            peer: remote.device,
            rqpn: remote.qpn,
        })
    }

    fn link_in_process(self: &Arc<Self>, peer: &Arc<DeviceShared>) -> Result<()> {
        if Arc::ptr_eq(self, peer) {
            let mut l = self.links.lock();
            if l.insert(self.uid) {
                self.engine
                    .send(soft::Cmd::AddLink(Box::new(Link::loopback(self.uid))))?;
            }
            return Ok(());
        }
        // Lock both link sets in uid order so two threads connecting the pair cannot deadlock.
        let (first, second) = if self.uid < peer.uid {
            (self, peer)
        } else {
            (peer, self)
        };
        let mut l1 = first.links.lock();
        let mut l2 = second.links.lock();
        if l1.contains(&second.uid) {
            return Ok(());
        }
        let (a, b) = Link::in_process_pair(first.uid, second.uid);
        first.engine.send(soft::Cmd::AddLink(Box::new(a)))?;
        second.engine.send(soft::Cmd::AddLink(Box::new(b)))?;
        l1.insert(second.uid);
        l2.insert(first.uid);
        Ok(())
    }

    fn link_shared_memory(&self, remote: &Endpoint) -> Result<()> {
        let mut l = self.links.lock();
        if l.contains(&remote.device) {
            return Ok(());
        }
        let link = Link::shared_memory(self.uid, remote.device, remote.pid)?;
        self.engine.send(soft::Cmd::AddLink(Box::new(link)))?;
        l.insert(remote.device);
        Ok(())
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
            next_qpn: AtomicU32::new(1),
            next_cqn: AtomicU32::new(1),
            next_pd: AtomicU32::new(1),
            links: Mutex::new(HashSet::new()),
            proxy: Default::default(),
            engine,
        });
        registry().lock().insert(uid, Arc::downgrade(&shared));
        Ok(Device { shared })
    }

    /// Name and id.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: format!("soft-{:016x}", self.shared.uid),
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

impl ProtectionDomain {
    /// A reliable-connected QP completing sends on `send_cq` and receives on `recv_cq`.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &QpConfig) -> Result<Qp> {
        let qpn = self.dev.next_qpn.fetch_add(1, Ordering::Relaxed);
        if qpn > soft::MAX_QPS {
            return Err(Error::invalid(format!(
                "a soft device serves at most {} QPs",
                soft::MAX_QPS
            )));
        }
        Qp::create(&self.dev, self.id, qpn, send_cq, recv_cq, cfg)
    }
}
