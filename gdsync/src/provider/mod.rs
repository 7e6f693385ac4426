//! The provider interface, the room the queue layer and both providers stand on: the commands a NIC driver takes, shaped like the verbs commands a
//! ConnectX driver serves (`ibv_query_device`, `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_create_cq`,
//! `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_*`, `ibv_get_async_event`).
//!
//! Who owns what: the queue layer allocates and initialises ring memory (send and receive
//! rings, CQE rings, doorbell records) and hands it to the device at create time; the device
//! pins it (holds the `Arc`) until the object is destroyed. A device whose driver allocates
//! the rings itself (libmlx5 does) says so ([`DeviceAttr::owns_rings`]): it is given no ring
//! memory, and answers each create with where its rings are ([`DeviceQpRings`],
//! [`DeviceCqRings`]), as ring memory held by the device's object; the queue layer then uses
//! those, through the same code. The device owns its translation table (keys → regions), its
//! QP and CQ contexts, its producer counters and the doorbell register page it hands out. The
//! device writes only CQEs into host memory; what it has to tell the host otherwise it reports
//! through [`Provider::query_qp`] and asynchronous events.

mod attr;
mod endpoint;

pub(crate) use attr::{rnr_delay, transport_timeout};
pub use attr::{DeviceAttr, LinkLayer, PortAttr, PortState};
#[cfg(test)]
pub(crate) use endpoint::fnv1a;
pub use endpoint::host_id;
pub(crate) use endpoint::{choose_link, link_reason, Here};
pub use endpoint::{Endpoint, LinkKind, LinkPolicy, PortAddress};

use crate::format::Syndrome;
use crate::mem::RingMem;
use crate::Result;
use std::sync::Arc;
use std::time::Duration;

bitflags::bitflags! {
    /// Access rights of a memory region (`ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The local device may write it (receive buffers, read and atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write it (needs LOCAL_WRITE).
        const REMOTE_WRITE = 2;
        /// Peers may RDMA-read it.
        const REMOTE_READ = 4;
        /// Peers may run atomics on it (needs LOCAL_WRITE).
        const REMOTE_ATOMIC = 8;
    }
}

impl Access {
    /// Every right.
    pub const ALL: Access = Access::all();
}

/// Largest message (2 GiB - 1, the RC limit).
pub const MAX_MESSAGE: u64 = (1 << 31) - 1;
/// Most SGEs in one work request.
pub const MAX_SGE: usize = 16;

/// A place in memory the queue layer owns: the allocation (which the device pins by holding
/// it) and an offset into it.
#[derive(Clone)]
pub(crate) struct MemAt {
    pub mem: Arc<RingMem>,
    pub off: usize,
}

impl MemAt {
    /// The host address of the place.
    pub(crate) fn addr(&self) -> u64 {
        self.mem.addr(self.off)
    }
    /// The GPUs' address of the place ([`RingMem::gpu_addr`]).
    pub(crate) fn gpu_addr(&self) -> u64 {
        self.mem.gpu_addr(self.off)
    }
}

/// Where a region to register lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrMemory {
    /// Host memory at a virtual address.
    Host,
    /// Memory of this GPU (its context, to copy through), at a device pointer.
    Gpu(crate::cuda::GpuCtx),
}

/// `ibv_reg_mr`: a region of a protection domain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrSpec {
    pub pd: u32,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub memory: MrMemory,
}

/// The keys of a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// `ibv_create_cq` for a ring of `entries` 64-byte CQEs: the queue layer's memory for it, or
/// none where the device owns its rings ([`DeviceAttr::owns_rings`]).
pub(crate) struct CqSpec {
    pub entries: u32,
    pub mem: Option<CqMem>,
}

/// A CQ's memory as the queue layer gives it (as with a DEVX umem): the ring, every `op_own`
/// initialised to invalid with owner 1, and the doorbell record (`[consumer index][arm]`,
/// BE32) the device reads before each write.
#[derive(Clone)]
pub(crate) struct CqMem {
    pub ring: Arc<RingMem>,
    pub dbrec: MemAt,
}

/// What the device returns for a new CQ: its number, and its rings where it owns them.
pub(crate) struct CqCreated {
    pub cqn: u32,
    /// The rings the device allocated itself (`None`: the ones the spec gave it).
    pub device_rings: Option<DeviceCqRings>,
}

/// `ibv_create_qp` for an RC QP: `rq_wqes` receive WQEs of `rq_stride` bytes, a send ring of
/// `sq_wqebbs` 64-byte WQEBBs, the CQs, and the queue layer's memory for the rings, or none
/// where the device owns its rings ([`DeviceAttr::owns_rings`]).
pub(crate) struct QpSpec {
    pub pd: u32,
    pub rq_wqes: u32,
    pub rq_stride: u32,
    pub sq_wqebbs: u32,
    /// The inline payload one send may carry (`QpConfig::max_inline`): a device that makes
    /// its own rings sizes (and checks) its WQEs for it.
    pub max_inline: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub mem: Option<QpMem>,
}

/// A QP's memory as the queue layer gives it: the receive ring at offset 0 of `buf`, the send
/// ring at `sq_off`, and the doorbell record (`[RQ][SQ]`, BE32).
#[derive(Clone)]
pub(crate) struct QpMem {
    pub buf: Arc<RingMem>,
    pub sq_off: usize,
    pub dbrec: MemAt,
}

/// What the device returns for a new QP: its number and the doorbell register to ring (an
/// 8-byte store of the last WQE's first 8 bytes), a bfreg in one of the device's UAR pages.
/// A CPU poster alternates between the register and the one `bf_size` bytes after it, as
/// libmlx5 does; streams and kernels ring the register itself.
pub(crate) struct QpCreated {
    pub qpn: u32,
    pub doorbell: MemAt,
    /// Distance to the bfreg's second half (0: one register only).
    pub bf_size: usize,
    /// The register is write-combining device memory (a HCA's UAR page): a CPU poster fences
    /// before the store (so the WQE and doorbell record are visible first) and after it (to
    /// push it out), as libmlx5 does. Not needed for a soft device's register in host memory.
    pub doorbell_wc: bool,
    /// Whether GPUs can store to the register (its page registered for them), or why not:
    /// then a CPU proxy rings for streams and kernels.
    pub gpu_doorbell: std::result::Result<(), String>,
    /// The rings the device allocated itself (`None`: the ones the spec gave it).
    pub device_rings: Option<DeviceQpRings>,
}

/// A QP's rings as the device allocated them (the layout of [`QpMem`], with their sizes).
pub(crate) struct DeviceQpRings {
    pub mem: QpMem,
    pub rq_wqes: u32,
    pub rq_stride: u32,
    pub sq_wqebbs: u32,
}

/// A CQ's ring as the device allocated it: `entries` 64-byte CQEs, each initialised so that no
/// wait on its owner bit passes before the device wrote it, and the doorbell record.
pub(crate) struct DeviceCqRings {
    pub mem: CqMem,
    pub entries: u32,
}

/// QP states, as `ibv_modify_qp` moves them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum HwQpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Error = 4,
}

impl HwQpState {
    pub(crate) fn from_u8(v: u8) -> Self {
        [Self::Reset, Self::Init, Self::Rtr, Self::Rts]
            .into_iter()
            .find(|s| *s as u8 == v)
            .unwrap_or(Self::Error)
    }
}

/// The first error of a QP, as the device keeps it in the QP's context (a NIC's "last
/// error" of the QP): what its error CQE said. The host reads it with
/// [`Provider::query_qp`] when the CQE itself is gone (an executor consumed it and the
/// device has since written over its slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpLastError {
    pub syndrome: Syndrome,
    /// The WQE opcode (requester errors; 0 for responder errors).
    pub wqe_opcode: u8,
    /// The send ring index, or the receive index for responder errors.
    pub wqe_counter: u16,
    /// A responder (receive-side) error: its CQE went to the receive CQ.
    pub responder: bool,
}

/// `ibv_query_qp`: the QP's state and, once it is in ERROR, its first error (if a WQE or
/// receive failed; a QP can also go to error without one, e.g. on a CQ overrun).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpAttr {
    pub state: HwQpState,
    pub last_error: Option<QpLastError>,
}

/// The path to the peer QP (RTR): its address and number, the starting PSNs and the MTU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpPath {
    pub remote: Endpoint,
    pub rq_psn: u32,
    pub mtu: u32,
    pub route: QpRoute,
}

/// How the path's packets are marked: the RoCE traffic class, the service level and the
/// hop limit of the global route header (an RDMA device's RTR; the soft device's links have
/// no classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpRoute {
    pub traffic_class: u8,
    pub service_level: u8,
    pub hop_limit: u8,
}

impl Default for QpRoute {
    fn default() -> Self {
        QpRoute {
            traffic_class: 0,
            service_level: 0,
            hop_limit: 64,
        }
    }
}

/// The requester's timers (RTS): the transport timeout, the retry counts and the RNR delay.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpTimers {
    pub sq_psn: u32,
    pub timeout: Duration,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: Duration,
}

/// `ibv_modify_qp`: the target state and the attributes that transition takes. (A QP leaves
/// for ERROR on the device's own account, which [`Provider::query_qp`] and a
/// [`AsyncEvent::QpFatal`] report; destroying it takes it out of any state.)
#[derive(Clone, Debug)]
pub(crate) enum QpModify {
    Init,
    Rtr(QpPath),
    Rts(QpTimers),
}

/// An asynchronous event (`ibv_get_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncEvent {
    /// The QP went to the error state.
    QpFatal { qpn: u32 },
    /// A CQE could not be written: the CQ overran.
    CqError { cqn: u32 },
    /// The link to a peer device went down; its QPs fail.
    PeerLost { peer: u64 },
}

/// A NIC driver: the commands the queue layer gives the device.
pub(crate) trait Provider: Send + Sync {
    /// The device's name in messages and logs.
    fn name(&self) -> String;
    /// A unique id of the device.
    fn uid(&self) -> u64;
    /// `ibv_query_device`.
    fn query_device(&self) -> DeviceAttr;
    /// `ibv_query_port`.
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// Where peers reach QP `qpn` of this device (its port's address and the QPN).
    fn endpoint(&self, qpn: u32) -> Endpoint;
    /// The link a QP of this device would use to reach `remote`.
    fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind>;

    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> u32;
    /// `ibv_dealloc_pd`.
    fn dealloc_pd(&self, pd: u32);
    /// `ibv_reg_mr` (host pointer or device pointer).
    fn reg_mr(&self, spec: &MrSpec) -> Result<MrKeys>;
    /// `ibv_dereg_mr`: once it returns, the device no longer touches the region.
    fn dereg_mr(&self, lkey: u32);

    /// `ibv_create_cq`: the CQ (and its rings, where the device owns them).
    fn create_cq(&self, spec: CqSpec) -> Result<CqCreated>;
    /// `ibv_destroy_cq`.
    fn destroy_cq(&self, cqn: u32);
    /// `ibv_create_qp`: the QP (in RESET), its doorbell register (and its rings, where the
    /// device owns them).
    fn create_qp(&self, spec: QpSpec) -> Result<QpCreated>;
    /// `ibv_modify_qp`.
    fn modify_qp(&self, qpn: u32, to: QpModify) -> Result<()>;
    /// `ibv_query_qp`: the QP's state (and its first error, once in ERROR).
    fn query_qp(&self, qpn: u32) -> QpAttr;
    /// `ibv_destroy_qp`.
    fn destroy_qp(&self, qpn: u32);

    /// `ibv_get_async_event`, without blocking.
    fn get_async_event(&self) -> Option<AsyncEvent>;
    /// Whether an asynchronous event waits (one load).
    fn has_async_event(&self) -> bool;

    /// After a CPU store to a doorbell register: a NIC sees the MMIO store at once; a soft
    /// device's engine may nap and is woken.
    fn kick(&self);
    /// A host poll found nothing: where the device is served by the host's own threads, this
    /// is one.
    fn idle(&self);
}

/// A short description of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// The unique id used in endpoints.
    pub uid: u64,
}
