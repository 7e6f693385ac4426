//! The mlx5 device behind the provider interface: one port of an RDMA device driven by
//! rdma-core's libmlx5, whose PDs, MRs, CQs and RC QPs the queue layer uses as it uses the
//! soft device's. libmlx5 allocates the rings: the device answers each create with where they
//! are ([`DeviceQpRings`], [`DeviceCqRings`]), as ring memory that holds libmlx5's object, so verbs
//! destroys it only once no queue and no op list points into it any more. gdsync's own WQE
//! writer fills libmlx5's send and receive rings and rings its BlueFlame register; CQEs are
//! read from libmlx5's CQ buffers.
//!
//! A QP's endpoint carries its port's address (LID, GID, MTU: [`PortAddress`]), which the
//! peer's RTR uses, so QPs of two processes or two hosts connect as with any verbs library.

use super::event_watch::EventWatch;
use super::qp::gdsync_send_wqe_size;
use super::{
    Context, Cq, DeviceLimits, Gid, LinkLayer, Mr, Pd, PortInfo, Qp, QpCaps, GDSYNC_ATOMIC_OPS,
    GDSYNC_SEND_OPS,
};
use super::{PortState as RdmaPortState, QpState, RdmaError, RemoteQp, RtrAttr, RtsAttr};
use crate::cuda::Cuda;
use crate::mem::RingMem;
use crate::ops::KeepAlive;
use crate::provider::host_id;
use crate::provider::*;
use crate::provider::{rnr_delay, transport_timeout};
use crate::provider::{
    DeviceAttr, Endpoint, LinkKind, LinkLayer as PortLink, LinkPolicy, PortAddress, PortAttr,
    PortState,
};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable that picks the GID index connections use (else the RoCE v2
/// IPv4-mapped entry of the port).
pub const GID_INDEX_VAR: &str = "GDSYNC_GID_INDEX";

/// How peers reach a port: its LID, the GID connections use and its index, its MTU.
#[derive(Clone, Copy, Debug)]
struct PortAddr {
    lid: u16,
    gid: Gid,
    gid_index: u8,
    mtu: u32,
    ethernet: bool,
}

impl PortAddr {
    /// What the port's endpoints carry.
    fn public(&self) -> PortAddress {
        PortAddress {
            roce: self.ethernet,
            lid: self.lid,
            gid: self.gid.0,
            mtu: self.mtu,
        }
    }
}

/// One port of an mlx5 device, as a provider.
pub(crate) struct Mlx5Device {
    ctx: Arc<Context>,
    port: u8,
    uid: u64,
    addr: PortAddr,
    limits: DeviceLimits,
    /// Whether GPUs are present: libmlx5's rings and doorbell page are then registered for
    /// them.
    gpus: Option<Arc<Cuda>>,
    /// What the doorbell pages are (the opener's word).
    uar: UarPages,
    /// That a doorbell page was registered as ordinary memory has been said.
    plain_doorbell_said: AtomicBool,
    next_pd: AtomicU32,
    /// PDs by id; a PD verbs refused keeps the reason, given to whatever uses it.
    pds: Mutex<HashMap<u32, std::result::Result<Arc<Pd>, String>>>,
    mrs: Mutex<HashMap<u32, Mr<'static>>>,
    cqs: Mutex<HashMap<u32, Arc<Cq>>>,
    qps: Mutex<HashMap<u32, Arc<Qp>>>,
    events: EventWatch,
}

/// What the opener knows of the doorbell (UAR) pages the device's driver maps, which decides
/// how they are registered for GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UarPages {
    /// I/O memory (a ConnectX's BAR): registered for GPUs as I/O memory, or not at all.
    Io,
    /// Possibly ordinary memory (a driver that emulates the HCA in software): where the I/O
    /// registration fails, registered as ordinary memory.
    MaybeHostMemory,
}

/// Opens port `port` of the mlx5 device `name` as a provider (the mlx5 data path).
pub(crate) fn open(
    name: &str,
    port: u8,
    uar: UarPages,
    cuda: Option<Arc<Cuda>>,
) -> Result<Arc<dyn Provider>> {
    let dev = Mlx5Device::open(name, port, uar, cuda).map_err(|e| rdma_error(name, e))?;
    Ok(Arc::new(dev))
}

/// An rdma-core error as the queue layer reports it, naming the device.
fn rdma_error(dev: &str, e: RdmaError) -> Error {
    match e {
        RdmaError::InvalidArgument(m) => Error::invalid(format!("{dev}: {m}")),
        RdmaError::Verbs { call, errno } if errno == libc::ENOMEM => Error::os(
            format!(
                "{dev}: {call} ({})",
                crate::memlock::enomem_hint(crate::memlock_limit())
            ),
            std::io::Error::from_raw_os_error(errno),
        ),
        RdmaError::Verbs { call, errno } => Error::os(
            format!("{dev}: {call}"),
            std::io::Error::from_raw_os_error(errno),
        ),
        e => Error::Unsupported(format!("{dev}: {e}")),
    }
}

impl Mlx5Device {
    fn open(
        name: &str,
        port: u8,
        uar: UarPages,
        gpus: Option<Arc<Cuda>>,
    ) -> std::result::Result<Self, RdmaError> {
        let ctx = Context::open(name)?;
        let limits = ctx.query_device()?;
        let info = ctx.query_port(port)?;
        let wanted = match std::env::var(GID_INDEX_VAR) {
            Ok(v) => Some(v.parse::<u32>().map_err(|_| {
                RdmaError::InvalidArgument(format!("{GID_INDEX_VAR}={v:?}: not a GID index"))
            })?),
            Err(_) => None,
        };
        let gid = ctx.choose_gid(port, wanted)?;
        tracing::info!(
            "{name} port {port}: {} LID {:#x}, GID index {} ({}), MTU {}",
            info.link_layer,
            info.lid,
            gid.entry.index,
            gid.why,
            info.active_mtu
        );
        let addr = PortAddr {
            lid: info.lid,
            gid: gid.entry.gid,
            gid_index: u8::try_from(gid.entry.index).map_err(|_| {
                RdmaError::InvalidArgument(format!("GID index {} is above 255", gid.entry.index))
            })?,
            mtu: info.active_mtu,
            ethernet: info.link_layer.is_ethernet(),
        };
        let uid = device_uid(&limits.node_guid, port);
        let events = EventWatch::start(ctx.clone())
            .map_err(|e| RdmaError::InvalidArgument(e.to_string()))?;
        Ok(Mlx5Device {
            ctx,
            port,
            uid,
            addr,
            limits,
            gpus,
            uar,
            plain_doorbell_said: AtomicBool::new(false),
            next_pd: AtomicU32::new(1),
            pds: Mutex::new(HashMap::new()),
            mrs: Mutex::new(HashMap::new()),
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            events,
        })
    }

    fn err(&self, e: RdmaError) -> Error {
        rdma_error(self.ctx.name(), e)
    }

    /// The RDMA port `remote`'s QP is on, if this port can reach it (same link layer).
    fn peer_port(&self, remote: &Endpoint) -> Result<PortAddress> {
        let name = self.ctx.name();
        let Some(peer) = remote.port else {
            return Err(Error::Unreachable(format!(
                "{name}: {remote} is not a QP of an RDMA port (a soft device's?): both sides must use RDMA devices"
            )));
        };
        if peer.roce != self.addr.ethernet {
            let layer = |roce: bool| if roce { "RoCE" } else { "InfiniBand" };
            return Err(Error::Unreachable(format!(
                "{name} port {} is {}, the peer's port ({peer}) {}: they cannot reach each other",
                self.port,
                layer(self.addr.ethernet),
                layer(peer.roce)
            )));
        }
        Ok(peer)
    }

    fn pd(&self, pd: u32) -> Result<Arc<Pd>> {
        match self.pds.lock().get(&pd) {
            Some(Ok(p)) => Ok(p.clone()),
            Some(Err(why)) => Err(Error::invalid(format!("PD {pd}: {why}"))),
            None => Err(Error::invalid(format!("PD {pd} does not exist"))),
        }
    }

    fn cq(&self, cqn: u32) -> Result<Arc<Cq>> {
        self.cqs
            .lock()
            .get(&cqn)
            .cloned()
            .ok_or_else(|| Error::invalid(format!("CQ {cqn:#x} does not exist")))
    }

    /// A QP whose send ring has the WQEBBs `spec` asks for, made with the capabilities
    /// gdsync's WQEs need (its SGEs, `spec.max_inline` bytes inline, its send operations), so
    /// that libmlx5 refuses a device whose WQEs are too small for them. libmlx5 sizes the ring
    /// from requests of the largest such WQE ([`gdsync_send_wqe_size`]): the request count is
    /// chosen to match, and scaled down once more where libmlx5 made the ring larger. A larger
    /// ring would let more work be outstanding than the CQs the caller sized for the ring can
    /// take (a kernel that owns the QP could overrun them).
    fn create_sized_qp(
        &self,
        pd: &Arc<Pd>,
        scq: &Arc<Cq>,
        rcq: &Arc<Cq>,
        spec: &QpSpec,
    ) -> Result<Arc<Qp>> {
        // libmlx5 refuses atomics on a device without them (gdsync refuses them at posting).
        let send_ops = match self.limits.atomic_cap {
            super::sys::IBV_ATOMIC_NONE => GDSYNC_SEND_OPS & !GDSYNC_ATOMIC_OPS,
            _ => GDSYNC_SEND_OPS,
        };
        let caps = |max_send_wr: u32| QpCaps {
            max_send_wr,
            max_recv_wr: spec.rq_wqes,
            max_send_sge: self.limits.max_sge.clamp(1, MAX_SGE as u32),
            max_recv_sge: spec.rq_stride / crate::format::SEG_SIZE as u32,
            max_inline_data: spec.max_inline,
            send_ops,
        };
        let per_wr = gdsync_send_wqe_size(&caps(1)) / crate::format::WQEBB as u32;
        let create = |wr: u32| {
            pd.create_qp(scq, rcq, &caps(wr))
                .map_err(|e| self.qp_refused(e, &caps(wr), spec.sq_wqebbs))
        };
        let first = create((spec.sq_wqebbs / per_wr).max(1))?;
        let got = first.rings().sq_wqe_cnt;
        let qp = if got <= spec.sq_wqebbs {
            first
        } else {
            let per_wr = (got / spec.sq_wqebbs.max(1)).max(1) * per_wr;
            drop(first);
            create((spec.sq_wqebbs / per_wr).max(1))?
        };
        tracing::debug!(
            "{}: QP {:#x}: a send ring of {} WQEBBs (asked for {}), {} bytes inline (asked for {})",
            self.ctx.name(),
            qp.qpn(),
            qp.rings().sq_wqe_cnt,
            spec.sq_wqebbs,
            qp.max_inline_data(),
            spec.max_inline
        );
        Ok(Arc::new(qp))
    }

    /// libmlx5's or the device's refusal of a QP with `caps`: where it found an argument
    /// invalid, what gdsync asked for and what to change.
    fn qp_refused(&self, e: RdmaError, caps: &QpCaps, sq_wqebbs: u32) -> Error {
        let RdmaError::Verbs { call, errno } = e else {
            return self.err(e);
        };
        if errno != libc::EINVAL {
            return self.err(e);
        }
        Error::invalid(format!(
            "{}: {call} refused a QP whose WQEs need {} bytes ({} bytes inline, {} SGEs) with a \
             send ring of {sq_wqebbs} WQEBBs: the device's largest WQE or ring is smaller; \
             lower QpConfig::max_inline or QpConfig::send_wqebbs",
            self.ctx.name(),
            gdsync_send_wqe_size(caps),
            caps.max_inline_data,
            caps.max_send_sge
        ))
    }

    /// Registers GPU memory: through a dma-buf where the GPU exports one, else the device
    /// pointer itself (the peer-memory module), the choice logged.
    fn reg_gpu_mr(&self, pd: &Arc<Pd>, spec: &MrSpec, ordinal: i32) -> Result<Mr<'static>> {
        // The export covers whole pages of the running system (64 KiB on many AArch64 hosts).
        let page = crate::mem::page_size() as u64;
        let (start, len) = crate::mem::page_span(spec.addr, spec.len, page);
        let gpus = self.gpus.as_ref().ok_or_else(|| {
            Error::NoCuda("GPU memory on a device opened without a CUDA handle".into())
        });
        let dmabuf = gpus
            .and_then(|c| crate::cuda::dma_buf(c, ordinal, start, len as usize))
            .and_then(|fd| {
                use std::os::fd::AsFd;
                pd.reg_dmabuf_mr(
                    fd.as_fd(),
                    spec.addr - start,
                    spec.len as usize,
                    spec.addr,
                    spec.access,
                )
                .map_err(|e| self.err(e))
            });
        match dmabuf {
            Ok(mr) => {
                tracing::debug!(
                    "GPU {ordinal} memory at {:#x}: registered as a dma-buf",
                    spec.addr
                );
                Ok(mr)
            }
            Err(why) => {
                tracing::info!(
                    "GPU {ordinal} memory at {:#x}: no dma-buf ({why}); registering the device pointer (needs nvidia-peermem)",
                    spec.addr
                );
                // SAFETY: the queue layer keeps the memory allocated until dereg_mr.
                unsafe { pd.reg_mr_raw(spec.addr, spec.len as usize, spec.access) }
                    .map_err(|e| self.err(e))
            }
        }
    }

    /// `len` bytes at `addr` of memory libmlx5 allocated, held by `owner`, registered for GPUs
    /// where there are any (`io`: a register page); the registration's failure is returned
    /// beside it.
    fn held(&self, addr: usize, len: usize, owner: &KeepAlive, io: bool) -> (MemAt, Option<Error>) {
        // SAFETY: `owner` is the libmlx5 object whose memory this is: it stays allocated and
        // mapped while the object lives, and the ring memory holds the object.
        let (mut mem, off) = unsafe { RingMem::held(addr as u64, len, owner.clone()) };
        let failed = match (&self.gpus, io) {
            (None, _) => None,
            (Some(c), false) => mem.map_for_gpus(c, false).err(),
            (Some(c), true) => match mem.map_for_gpus(c, true) {
                Ok(()) => None,
                // An emulated driver's doorbell page is ordinary memory, which CUDA
                // registers only as such (a ConnectX's is I/O memory: no second try there).
                Err(e)
                    if self.uar == UarPages::MaybeHostMemory
                        && mem.map_for_gpus(c, false).is_ok() =>
                {
                    if !self.plain_doorbell_said.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            "{}: the emulated driver's doorbell page is ordinary memory, not \
                             I/O memory ({e}): registered for GPUs as such",
                            self.ctx.name()
                        );
                    }
                    None
                }
                Err(e) => Some(e),
            },
        };
        let at = MemAt {
            mem: Arc::new(mem),
            off,
        };
        (at, failed)
    }
}

/// A device id for endpoints: the node GUID with the port in the top byte.
fn device_uid(node_guid: &str, port: u8) -> u64 {
    let guid = u64::from_str_radix(&node_guid.replace(':', ""), 16).unwrap_or(0);
    guid ^ (u64::from(port) << 56)
}

/// The largest valid path MTU not above `bytes` (256 at least).
fn path_mtu(bytes: u32) -> u32 {
    [4096, 2048, 1024, 512]
        .into_iter()
        .find(|&m| m <= bytes)
        .unwrap_or(256)
}

/// Why a UAR page may not map for GPUs, as far as this process can tell from `e`.
fn gpu_doorbell_hint(e: &Error) -> &'static str {
    if matches!(e, Error::Cuda { call, .. } if *call == "cuMemHostGetDevicePointer") {
        return "CUDA registered the page but gave no device address for it, and a GPU must not ring it at its host address";
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        "this process is root, so the GPU driver refuses peer mappings of the HCA's page \
         (see NVreg_RegistryDwords=PeerMappingOverride=1) or CUDA cannot map it"
    } else {
        "mapping an HCA's doorbell page for GPUs needs root or the NVIDIA driver's \
         NVreg_RegistryDwords=PeerMappingOverride=1"
    }
}

/// The RTS attributes for the queue layer's timers: its timeout is for all tries together,
/// so each of the `retry_cnt + 1` tries waits the code that covers its share.
fn rts_attr(t: &QpTimers, max_rd_atomic: u8) -> RtsAttr {
    let retry_cnt = t.retry_cnt.min(7);
    let per_try = t.timeout / (u32::from(retry_cnt) + 1);
    RtsAttr {
        sq_psn: t.sq_psn,
        timeout: timeout_code(per_try),
        retry_cnt,
        rnr_retry: rnr_retry_code(t.rnr_retry),
        max_rd_atomic,
        min_rnr_timer: Some(rnr_timer_code(t.min_rnr_timer)),
    }
}

/// `base` with the path's marking: its traffic class, service level and hop limit.
fn rtr_attr(base: RtrAttr, route: &QpRoute) -> RtrAttr {
    RtrAttr {
        traffic_class: route.traffic_class,
        service_level: route.service_level,
        hop_limit: route.hop_limit,
        ..base
    }
}

/// The IB transport-timeout code whose wait (4.096 µs × 2^code) covers `d`.
fn timeout_code(d: Duration) -> u8 {
    (1..32).find(|&c| transport_timeout(c) >= d).unwrap_or(31)
}

/// The IB `rnr_retry` for the queue layer's count: 7 (forever) for `u8::MAX`, else the count,
/// at most 6 (the most IB can say short of forever).
fn rnr_retry_code(n: u8) -> u8 {
    match n {
        u8::MAX => 7,
        n => n.min(6),
    }
}

/// The IB receiver-not-ready timer code (`min_rnr_timer`) whose delay covers `d` (31, the
/// longest, where none does).
fn rnr_timer_code(d: Duration) -> u8 {
    (1..32).find(|&c| rnr_delay(c) >= d).unwrap_or(31)
}

fn port_attr(p: &PortInfo) -> PortAttr {
    PortAttr {
        state: if p.state == RdmaPortState::Active {
            PortState::Active
        } else {
            PortState::Down
        },
        max_mtu: p.max_mtu,
        active_mtu: p.active_mtu,
        max_msg_sz: u64::from(p.max_msg_sz).min(MAX_MESSAGE),
        link_layer: match p.link_layer {
            LinkLayer::Ethernet => PortLink::Ethernet,
            _ => PortLink::InfiniBand,
        },
    }
}

impl Provider for Mlx5Device {
    fn name(&self) -> String {
        self.ctx.name().to_string()
    }

    fn uid(&self) -> u64 {
        self.uid
    }

    fn query_device(&self) -> DeviceAttr {
        let l = &self.limits;
        DeviceAttr {
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge.min(MAX_SGE as u32),
            // libmlx5 adds one entry and rounds up to a power of two.
            max_cqe: l.max_cqe,
            // gdsync's writer copies inline payload itself: a WQE's size is the limit.
            max_inline_data: crate::format::MAX_INLINE_DATA as u32,
            phys_port_cnt: l.phys_port_cnt,
            atomics: l.atomic_cap != super::sys::IBV_ATOMIC_NONE,
            // libmlx5 allocates the rings.
            owns_rings: true,
            // NIC → GPU payloads go peer-to-peer, CQEs to host memory.
            gpu_writes_separate: true,
        }
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let p = self.ctx.query_port(port).map_err(|e| self.err(e))?;
        Ok(port_attr(&p))
    }

    fn endpoint(&self, qpn: u32) -> Endpoint {
        Endpoint {
            host: host_id(),
            pid: std::process::id(),
            device: self.uid,
            qpn,
            addr: None,
            link: LinkPolicy::default(),
            port: Some(self.addr.public()),
        }
    }

    fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind> {
        let peer = self.peer_port(remote)?;
        let here = remote.host == host_id() && remote.pid == std::process::id();
        Ok(match () {
            _ if !here => LinkKind::Fabric,
            _ if peer == self.addr.public() => LinkKind::Loopback,
            _ => LinkKind::InProcess,
        })
    }

    fn alloc_pd(&self) -> u32 {
        let id = self.next_pd.fetch_add(1, Ordering::Relaxed);
        let pd = self.ctx.alloc_pd().map_err(|e| e.to_string());
        if let Err(why) = &pd {
            tracing::warn!("{}: {why}", self.ctx.name());
        }
        self.pds.lock().insert(id, pd);
        id
    }

    fn dealloc_pd(&self, pd: u32) {
        self.pds.lock().remove(&pd);
    }

    fn reg_mr(&self, spec: &MrSpec) -> Result<MrKeys> {
        let pd = self.pd(spec.pd)?;
        let mr = match spec.memory {
            // SAFETY: the queue layer keeps the memory allocated until dereg_mr.
            MrMemory::Host => unsafe { pd.reg_mr_raw(spec.addr, spec.len as usize, spec.access) }
                .map_err(|e| self.err(e))?,
            MrMemory::Gpu(g) => self.reg_gpu_mr(&pd, spec, g.ordinal)?,
        };
        let keys = MrKeys {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        };
        self.mrs.lock().insert(keys.lkey, mr);
        Ok(keys)
    }

    fn dereg_mr(&self, lkey: u32) {
        self.mrs.lock().remove(&lkey);
    }

    fn create_cq(&self, spec: CqSpec) -> Result<CqCreated> {
        // libmlx5 makes room for one entry more than asked, rounded up to a power of two.
        let cq = self
            .ctx
            .create_cq(spec.entries.saturating_sub(1).max(1))
            .map_err(|e| self.err(e))?;
        let r = cq.ring();
        let owner: KeepAlive = cq.clone();
        let (ring, e1) = self.held(r.buf, (r.cqe_cnt * r.cqe_size) as usize, &owner, false);
        let (dbrec, e2) = self.held(r.dbrec, 8, &owner, false);
        if let Some(e) = e1.or(e2) {
            tracing::warn!("CQ {:#x}: GPUs cannot reach its ring ({e})", r.cqn);
        }
        self.cqs.lock().insert(r.cqn, cq);
        Ok(CqCreated {
            cqn: r.cqn,
            device_rings: Some(DeviceCqRings {
                mem: CqMem {
                    ring: ring.mem,
                    dbrec,
                },
                entries: r.cqe_cnt,
            }),
        })
    }

    fn destroy_cq(&self, cqn: u32) {
        self.cqs.lock().remove(&cqn);
    }

    fn create_qp(&self, spec: QpSpec) -> Result<QpCreated> {
        let pd = self.pd(spec.pd)?;
        let (scq, rcq) = (self.cq(spec.send_cqn)?, self.cq(spec.recv_cqn)?);
        let qp = self.create_sized_qp(&pd, &scq, &rcq, &spec)?;
        let r = qp.rings();
        let sq_off = r.sq_buf.checked_sub(r.rq_buf).ok_or_else(|| {
            Error::invalid(format!(
                "QP {:#x}: libmlx5 placed the send ring before the receive ring",
                r.qpn
            ))
        })?;
        if (r.sq_wqe_cnt as usize) < crate::format::MAX_WQE_WQEBBS {
            return Err(Error::invalid(format!(
                "QP {:#x}: a send ring of {} WQEBBs cannot hold the largest WQE",
                r.qpn, r.sq_wqe_cnt
            )));
        }
        let owner: KeepAlive = qp.clone();
        let ring_len = sq_off + (r.sq_wqe_cnt * r.sq_stride) as usize;
        let (buf, e1) = self.held(r.rq_buf, ring_len, &owner, false);
        let (dbrec, e2) = self.held(r.dbrec, 8, &owner, false);
        if let Some(e) = e1.or(e2) {
            tracing::warn!("QP {:#x}: GPUs cannot reach its rings ({e})", r.qpn);
        }
        let (doorbell, e3) = self.held(r.bf_reg, 8 + r.bf_size as usize, &owner, true);
        let gpu_doorbell = match e3 {
            None => Ok(()),
            Some(e) => Err(format!(
                "the doorbell page of {} cannot be mapped for GPUs ({e}; {})",
                self.ctx.name(),
                gpu_doorbell_hint(&e)
            )),
        };
        self.qps.lock().insert(r.qpn, qp);
        Ok(QpCreated {
            qpn: r.qpn,
            doorbell,
            bf_size: r.bf_size as usize,
            doorbell_wc: true,
            gpu_doorbell,
            device_rings: Some(DeviceQpRings {
                mem: QpMem {
                    buf: buf.mem,
                    sq_off,
                    dbrec,
                },
                rq_wqes: r.rq_wqe_cnt,
                rq_stride: r.rq_stride,
                sq_wqebbs: r.sq_wqe_cnt,
            }),
        })
    }

    fn modify_qp(&self, qpn: u32, to: QpModify) -> Result<()> {
        let qp = self
            .qps
            .lock()
            .get(&qpn)
            .cloned()
            .ok_or_else(|| Error::invalid(format!("QP {qpn:#x} does not exist")))?;
        let l = &self.limits;
        let rd_atomic = |max: u32| max.clamp(1, 16) as u8;
        match to {
            QpModify::Init => qp.to_init(self.port, Access::ALL),
            QpModify::Rtr(path) => {
                let peer = self.peer_port(&path.remote)?;
                let remote = RemoteQp {
                    qpn: path.remote.qpn,
                    psn: path.rq_psn,
                    lid: peer.lid,
                    gid: self.addr.ethernet.then_some(Gid(peer.gid)),
                };
                let mtu = path_mtu(path.mtu.min(self.addr.mtu).min(peer.mtu));
                qp.to_rtr(&rtr_attr(
                    RtrAttr {
                        sgid_index: self.addr.gid_index,
                        max_dest_rd_atomic: rd_atomic(l.max_qp_rd_atom),
                        ..RtrAttr::new(remote, self.port, mtu)
                    },
                    &path.route,
                ))
            }
            QpModify::Rts(t) => qp.to_rts(&rts_attr(&t, rd_atomic(l.max_qp_init_rd_atom))),
        }
        .map_err(|e| self.err(e))
    }

    fn query_qp(&self, qpn: u32) -> QpAttr {
        let qp = self.qps.lock().get(&qpn).cloned();
        let state = match qp.map(|q| q.query()) {
            Some(Ok(a)) => match a.state {
                QpState::Reset => HwQpState::Reset,
                QpState::Init => HwQpState::Init,
                QpState::Rtr => HwQpState::Rtr,
                QpState::Rts | QpState::Sqd => HwQpState::Rts,
                _ => HwQpState::Error,
            },
            _ => HwQpState::Error,
        };
        // Verbs does not say which work request failed: the CQE tells it.
        QpAttr {
            state,
            last_error: None,
        }
    }

    fn destroy_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        self.events.next()
    }

    fn has_async_event(&self) -> bool {
        self.events.pending()
    }

    fn kick(&self) {}

    fn idle(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rts_splits_the_timeout_over_the_tries_asked_for() {
        let t = |timeout_ms: u64, retry_cnt: u8| QpTimers {
            sq_psn: 9,
            timeout: Duration::from_millis(timeout_ms),
            retry_cnt,
            rnr_retry: u8::MAX,
            min_rnr_timer: Duration::from_millis(2),
        };
        // 5 s over 8 tries: 625 ms each, covered by 4.096 us << 18 (1.07 s).
        let a = rts_attr(&t(5000, 7), 16);
        assert_eq!((a.sq_psn, a.timeout, a.retry_cnt), (9, 18, 7));
        assert_eq!((a.rnr_retry, a.max_rd_atomic), (7, 16));
        // One try gets the whole timeout: 5 s needs 4.096 us << 21 (8.6 s).
        let a = rts_attr(&t(5000, 0), 16);
        assert_eq!((a.timeout, a.retry_cnt), (21, 0));
        // 300 ms over 4 tries: 75 ms, covered by 4.096 us << 15 (134 ms).
        let a = rts_attr(&t(300, 3), 1);
        assert_eq!((a.timeout, a.retry_cnt), (15, 3));
    }

    #[test]
    fn a_devices_enomem_says_the_locked_memory_limit() {
        let e = |errno| {
            rdma_error(
                "mlx5_0",
                RdmaError::Verbs {
                    call: "ibv_reg_mr",
                    errno,
                },
            )
            .to_string()
        };
        let limit = crate::memlock_limit().expect("getrlimit");
        let m = e(libc::ENOMEM);
        assert!(
            m.contains("mlx5_0: ibv_reg_mr (") && m.contains(&limit.to_string()),
            "{m}"
        );
        assert!(!e(libc::EINVAL).contains("ulimit"));
    }

    #[test]
    fn rtr_carries_the_routes_class_level_and_hop_limit() {
        let remote = RemoteQp {
            qpn: 0x12,
            psn: 0,
            lid: 0,
            gid: Some(Gid([0xfe; 16])),
        };
        let base = RtrAttr::new(remote, 2, 4096);
        assert_eq!(
            (base.traffic_class, base.service_level, base.hop_limit),
            (0, 0, 64)
        );
        let route = QpRoute {
            traffic_class: 106,
            service_level: 3,
            hop_limit: 5,
        };
        let a = rtr_attr(base, &route);
        assert_eq!((a.traffic_class, a.service_level, a.hop_limit), (106, 3, 5));
        assert_eq!((a.remote, a.port, a.mtu), (remote, 2, 4096));
        assert_eq!(rtr_attr(base, &QpRoute::default()), base);
    }

    #[test]
    fn timeouts_become_the_smallest_covering_code() {
        assert_eq!(timeout_code(Duration::from_nanos(4096)), 1);
        assert_eq!(timeout_code(Duration::from_nanos(4096 << 14)), 14);
        assert_eq!(timeout_code(Duration::from_nanos((4096 << 14) + 1)), 15);
        assert_eq!(timeout_code(Duration::from_secs(1 << 20)), 31);
    }

    #[test]
    fn rnr_timers_become_the_smallest_covering_code() {
        assert_eq!(rnr_timer_code(Duration::from_micros(640)), 12);
        assert_eq!(rnr_timer_code(Duration::from_millis(2)), 16);
        assert_eq!(rnr_timer_code(Duration::ZERO), 1);
        assert_eq!(rnr_timer_code(Duration::from_secs(1)), 31);
    }

    #[test]
    fn path_mtus_round_down_to_an_ib_mtu() {
        assert_eq!(path_mtu(4096), 4096);
        assert_eq!(path_mtu(4000), 2048);
        assert_eq!(path_mtu(1500), 1024);
        assert_eq!(path_mtu(100), 256);
    }

    #[test]
    fn device_ids_differ_by_port() {
        let a = device_uid("0c42:a103:00aa:bb01", 1);
        assert_eq!(a, 0x0c42_a103_00aa_bb01 ^ (1 << 56));
        assert_ne!(a, device_uid("0c42:a103:00aa:bb01", 2));
    }
}
