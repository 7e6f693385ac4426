//! A queue pair driven by a GPU kernel: the kernel writes the WQEs, the doorbell record and
//! the doorbell, and polls the CQs (`gds_qp_post_send`, `gds_cq_poll`, ... in the header),
//! with a descriptor the host fills once. Unlike a [`super::DescRing`], the host prepares
//! nothing per message.

use crate::cq::{CqShared, CQ_RETIRED};
use crate::qp::{
    Qp, QpState, QP_KERNEL_RQ_PI, QP_KERNEL_SQ_PI, QP_PROXY, QP_RQ_RETIRED, QP_SQ_RETIRED,
};
use crate::{Error, NicHandler};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A CQ as a kernel drives it (`gds_cq`): where the CQEs and the consumer-index record are,
/// and the kernel's working counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqDesc {
    /// Address of the CQE ring (64-byte entries).
    pub cqes: u64,
    /// Address of the CQ doorbell record's consumer-index word (BE32).
    pub dbrec: u64,
    /// Address of the CQ's retired counter (native u64): the consumer index, for the host.
    pub retired: u64,
    /// Address of the served ring's retired counter (native u64): send WQEBBs or receives
    /// known complete, for the host and the next launch.
    pub wq_retired: u64,
    /// Consumer index (free-running): the next CQE to look at.
    pub ci: u64,
    /// Entries of the served ring known complete (free-running).
    pub wq_ci: u64,
    /// Number of entries (a power of two).
    pub entries: u32,
    /// CQ number.
    pub cqn: u32,
    /// Zero.
    pub reserved: u64,
}
const _: () = assert!(std::mem::size_of::<CqDesc>() == 64);
// SAFETY: `#[repr(C)]` plain data laid out as `gds_cq` (the size is asserted above).
unsafe impl crate::cuda::KernelArg for CqDesc {}

/// A QP as a kernel drives it (`gds_qp`): rings, doorbells, both CQs and the kernel's working
/// counters. Pass it to a kernel (by value, or in GPU-reachable memory); the kernel copies it
/// into a local variable and one thread drives it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpDesc {
    /// Address of the send ring (64-byte WQEBBs).
    pub sq: u64,
    /// Address of the receive ring.
    pub rq: u64,
    /// Address of the doorbell record (`[RQ][SQ]`, BE32 each).
    pub dbrec: u64,
    /// Address of the doorbell register (0 when a CPU proxy rings: see `proxy`).
    pub db: u64,
    /// Address of the CPU proxy's word (0 when the GPU rings): the kernel stores its send
    /// producer counter there and the proxy rings.
    pub proxy: u64,
    /// Address of the state block in pinned host memory: send producer counter at +0,
    /// receive producer counter at +8 (native u64), stored through by the kernel.
    pub state: u64,
    /// Send producer counter in WQEBBs (free-running); every WQE a kernel posts is one WQEBB.
    pub sq_pi: u64,
    /// Receive producer counter (free-running).
    pub rq_pi: u64,
    /// QP number.
    pub qpn: u32,
    /// Send ring size in WQEBBs (a power of two).
    pub sq_wqebbs: u32,
    /// Receive ring size in WQEs (a power of two).
    pub rq_wqes: u32,
    /// Receive WQE size in bytes (16 per scatter entry).
    pub rq_stride: u32,
    /// Zero from the host; a kernel keeps a send it prepared there (`gds_qp_prepare_send`).
    pub reserved: [u64; 2],
    /// The send CQ.
    pub send_cq: CqDesc,
    /// The receive CQ.
    pub recv_cq: CqDesc,
}
const _: () = assert!(std::mem::size_of::<QpDesc>() == 224);
// SAFETY: `#[repr(C)]` plain data laid out as `gds_qp` (the size is asserted above).
unsafe impl crate::cuda::KernelArg for QpDesc {}

/// What a kernel has done with a [`DeviceQp`], as it stored it through to host memory
/// (`#[repr(C)]`: the C API hands it out as `gdasync_kernel_progress`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceQpProgress {
    /// Sends posted (WQEBBs; one per send).
    pub sends_posted: u64,
    /// Sends known complete (from the send completions the kernel consumed).
    pub sends_retired: u64,
    /// Receives posted.
    pub recvs_posted: u64,
    /// Receives complete.
    pub recvs_retired: u64,
    /// Send CQ consumer index.
    pub send_cqes: u64,
    /// Receive CQ consumer index.
    pub recv_cqes: u64,
}

/// Clears the CQs' kernel ownership when the QP is dropped or handed back.
struct KernelOwned {
    send: Arc<CqShared>,
    recv: Arc<CqShared>,
}

impl Drop for KernelOwned {
    fn drop(&mut self) {
        self.send.take_from_kernel();
        self.recv.take_from_kernel();
    }
}

/// A QP whose rings and CQs a GPU kernel drives ([`Qp::into_device`]). Keep it alive until
/// every kernel using its descriptor has ended: dropping it frees the rings.
pub struct DeviceQp {
    qp: Qp,
    _owned: KernelOwned,
}

impl std::fmt::Debug for DeviceQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceQp")
            .field("qpn", &self.qp.qpn())
            .field("progress", &self.progress())
            .finish()
    }
}

/// A hand-over of a QP between the CPU and a kernel refused: why, and the QP, unchanged.
#[derive(Debug)]
pub struct HandOverError<Q> {
    /// Why.
    pub error: Error,
    /// The QP, unchanged (still with the kernel, or still the CPU's).
    pub qp: Box<Q>,
}

/// [`DeviceQp::into_host`] refused: why, and the QP, still with the kernel.
pub type IntoHostError = HandOverError<DeviceQp>;

/// [`Qp::try_into_device`] refused: why, and the QP, still the CPU's.
pub type IntoDeviceError = HandOverError<Qp>;

impl<Q> std::fmt::Display for HandOverError<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<Q: std::fmt::Debug> std::error::Error for HandOverError<Q> {}

impl<Q> From<HandOverError<Q>> for Error {
    fn from(e: HandOverError<Q>) -> Error {
        e.error
    }
}

fn cq_desc(cq: &CqShared, wq_retired: u64, wq_ci: u64) -> CqDesc {
    CqDesc {
        cqes: cq.ring.gpu_addr(0),
        dbrec: cq.dbrec.gpu_addr(),
        retired: cq.ctrl.gpu_addr(CQ_RETIRED),
        wq_retired,
        ci: cq.ctrl.u64(CQ_RETIRED).load(Ordering::Acquire),
        wq_ci,
        entries: cq.cnt,
        cqn: cq.cqn,
        reserved: 0,
    }
}

impl DeviceQp {
    pub(crate) fn new(qp: Qp) -> Self {
        let _owned = KernelOwned {
            send: qp.shared.send_cq.clone(),
            recv: qp.shared.recv_cq.clone(),
        };
        Self { qp, _owned }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }
    /// Current state (an error completion moves it to `Error`).
    pub fn state(&self) -> QpState {
        self.qp.state()
    }
    /// Whether GPUs can reach the rings, doorbells and CQs (pinned and mapped); without it a
    /// kernel cannot use the descriptor.
    pub fn gpu_mapped(&self) -> bool {
        let s = &*self.qp.shared;
        s.buf.gpu_mapped()
            && s.ctrl.gpu_mapped()
            && s.dbrec.mem.gpu_mapped()
            && [&s.send_cq, &s.recv_cq]
                .iter()
                .all(|c| c.ring.gpu_mapped() && c.ctrl.gpu_mapped() && c.dbrec.mem.gpu_mapped())
    }

    /// The descriptor to pass to a kernel, with the counters where the last kernel left them
    /// (so a new launch resumes), at the GPUs' addresses of the rings, records and doorbell. Take a new one for each launch, never while a kernel runs.
    pub fn desc(&self) -> QpDesc {
        let s = &*self.qp.shared;
        let (sq_ci, rq_ci) = s.kernel_retired();
        let gpu_rings = s.handler == NicHandler::Gpu;
        QpDesc {
            sq: s.buf.gpu_addr(s.sq_off),
            rq: s.buf.gpu_addr(0),
            dbrec: s.dbrec.gpu_addr(),
            db: if gpu_rings { s.doorbell.gpu_addr() } else { 0 },
            proxy: if gpu_rings {
                0
            } else {
                s.ctrl.gpu_addr(QP_PROXY)
            },
            state: s.ctrl.gpu_addr(QP_KERNEL_SQ_PI),
            sq_pi: s.ctrl.u64(QP_KERNEL_SQ_PI).load(Ordering::Acquire),
            rq_pi: s.ctrl.u64(QP_KERNEL_RQ_PI).load(Ordering::Acquire),
            qpn: s.qpn,
            sq_wqebbs: s.sq_cnt,
            rq_wqes: s.rq_cnt,
            rq_stride: s.rq_stride,
            reserved: [0; 2],
            send_cq: cq_desc(&s.send_cq, s.ctrl.gpu_addr(QP_SQ_RETIRED), sq_ci),
            recv_cq: cq_desc(&s.recv_cq, s.ctrl.gpu_addr(QP_RQ_RETIRED), rq_ci),
        }
    }

    /// What the kernel has posted and consumed so far (it stores its counters through to
    /// host memory after every call).
    pub fn progress(&self) -> DeviceQpProgress {
        let s = &*self.qp.shared;
        let (sends_retired, recvs_retired) = s.kernel_retired();
        DeviceQpProgress {
            sends_posted: s.ctrl.u64(QP_KERNEL_SQ_PI).load(Ordering::Acquire),
            sends_retired,
            recvs_posted: s.ctrl.u64(QP_KERNEL_RQ_PI).load(Ordering::Acquire),
            recvs_retired,
            send_cqes: s.send_cq.ctrl.u64(CQ_RETIRED).load(Ordering::Acquire),
            recv_cqes: s.recv_cq.ctrl.u64(CQ_RETIRED).load(Ordering::Acquire),
        }
    }

    /// Gives the QP back to the CPU once the kernels using it have ended with nothing
    /// outstanding (every send and receive they posted completed and was polled). Posting
    /// and polling on the CPU resume where the kernel stopped.
    pub fn into_host(self) -> Result<Qp, IntoHostError> {
        let p = self.progress();
        if p.sends_posted != p.sends_retired || p.recvs_posted != p.recvs_retired {
            return Err(IntoHostError {
                error: Error::invalid(format!(
                    "QP {:#x}: the kernel left work outstanding ({} sends, {} receives): poll their completions in the kernel first",
                    self.qpn(),
                    // Wrapping: the counters are the kernel's, and one that overshot must
                    // give a message, not an overflow.
                    p.sends_posted.wrapping_sub(p.sends_retired),
                    p.recvs_posted.wrapping_sub(p.recvs_retired)
                )),
                qp: Box::new(self),
            });
        }
        let DeviceQp { mut qp, _owned } = self;
        qp.resume_from_kernel(p.sends_posted, p.recvs_posted);
        Ok(qp)
    }
}
