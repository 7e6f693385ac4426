//! RC queue pairs: `mlx5dv_create_qp` (scatter-to-CQE off, so every completion's data lands
//! in the buffers the work request named), `mlx5dv_init_obj` for the rings, doorbell record
//! and BlueFlame register, and the INIT → RTR → RTS connection with the transport's timers
//! and retry counts as parameters.

use super::cq::Cq;
use super::error::RdmaError;
use super::gid::Gid;
use super::pd::Pd;
use super::port::{mtu_bytes, mtu_enum};
use super::{sys, RdmaResult};
use crate::Access;
use std::ptr::NonNull;
use std::sync::Arc;

/// What a QP must hold (`ibv_qp_cap`); libmlx5 rounds up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries in one send.
    pub max_send_sge: u32,
    /// Scatter/gather entries in one receive.
    pub max_recv_sge: u32,
    /// Bytes of inline payload in one send.
    pub max_inline_data: u32,
    /// The send operations the QP is used for (`IBV_QP_EX_WITH_*` bits, [`GDSYNC_SEND_OPS`]
    /// for what gdsync writes); 0: libmlx5's default set. libmlx5 sizes every send request
    /// for the largest of them: the default set (with memory-window binds) takes 4 WQEBBs a
    /// request, gdsync's 1 with one SGE and no inline data.
    pub send_ops: u64,
}

/// The send operations gdsync writes WQEs for: RDMA write (with immediate), send (with
/// immediate), RDMA read, compare-and-swap and fetch-and-add (verbs.h's
/// `IBV_QP_EX_WITH_*` bits 0 to 6, which the generated bindings leave out).
pub const GDSYNC_SEND_OPS: u64 = 0x7f;

/// The atomics among [`GDSYNC_SEND_OPS`] (`IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`,
/// `…_FETCH_AND_ADD`): libmlx5 refuses a QP that asks for them on a device without atomics.
pub const GDSYNC_ATOMIC_OPS: u64 = 0x60;

/// The bytes libmlx5 sets aside for one send request of a QP made with `caps` whose send
/// operations are among [`GDSYNC_SEND_OPS`] (a multiple of the 64-byte WQEBB): the control,
/// remote-address and atomic segments, then the larger of the data segments and the inline
/// payload with its header.
pub(crate) fn gdsync_send_wqe_size(caps: &QpCaps) -> u32 {
    // Control and remote address, and the atomic segment where atomics are among them.
    let headers = if caps.send_ops & GDSYNC_ATOMIC_OPS != 0 {
        48
    } else {
        32
    };
    let gather = headers + 16 * caps.max_send_sge;
    let inline = match caps.max_inline_data {
        0 => 0,
        n => headers + (4 + n).next_multiple_of(16),
    };
    gather.max(inline).next_multiple_of(64)
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            send_ops: 0,
        }
    }
}

/// Where a QP's rings, doorbell record and doorbell register are (`struct mlx5dv_qp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRings {
    /// The QP number.
    pub qpn: u32,
    /// Address of the send ring.
    pub sq_buf: usize,
    /// 64-byte WQE basic blocks in the send ring (a power of two).
    pub sq_wqe_cnt: u32,
    /// Bytes per send-ring slot (64).
    pub sq_stride: u32,
    /// Address of the receive ring.
    pub rq_buf: usize,
    /// Receive WQEs in the receive ring.
    pub rq_wqe_cnt: u32,
    /// Bytes per receive WQE.
    pub rq_stride: u32,
    /// Address of the doorbell record: `[receive][send]`, BE32 each.
    pub dbrec: usize,
    /// Address of the doorbell (BlueFlame) register in the UAR page.
    pub bf_reg: usize,
    /// Bytes of one BlueFlame buffer (0: a doorbell-only register).
    pub bf_size: u32,
}

/// The peer QP a connection goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// Its QP number.
    pub qpn: u32,
    /// The first packet sequence number it sends (our receive PSN).
    pub psn: u32,
    /// Its port's LID (InfiniBand).
    pub lid: u16,
    /// Its GID: required on RoCE; on InfiniBand, given to route through a global header.
    pub gid: Option<Gid>,
}

/// The receive side of a connection (`ibv_modify_qp` to RTR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer.
    pub remote: RemoteQp,
    /// The local port (from 1).
    pub port: u8,
    /// The path MTU in bytes (256 … 4096): the smaller of both ports' active MTUs.
    pub mtu: u32,
    /// The local GID index (used when `remote.gid` is given).
    pub sgid_index: u8,
    /// RDMA reads and atomics the peer may have outstanding on this QP.
    pub max_dest_rd_atomic: u8,
    /// Receiver-not-ready delay code (0 … 31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RoCE traffic class (DSCP << 2 | ECN): selects the lossless priority on most fabrics.
    pub traffic_class: u8,
    /// InfiniBand service level.
    pub service_level: u8,
    /// Hop limit of the global header.
    pub hop_limit: u8,
}

impl RtrAttr {
    /// Defaults for a connection to `remote` on `port` with path MTU `mtu`.
    pub fn new(remote: RemoteQp, port: u8, mtu: u32) -> Self {
        RtrAttr {
            remote,
            port,
            mtu,
            sgid_index: 0,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            traffic_class: 0,
            service_level: 0,
            hop_limit: 64,
        }
    }
}

/// The send side of a connection (`ibv_modify_qp` to RTS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// Our first packet sequence number (the peer's `RemoteQp::psn`).
    pub sq_psn: u32,
    /// Transport timeout code: 4.096 µs × 2^timeout (0 … 31; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Retransmissions after a timeout (0 … 7).
    pub retry_cnt: u8,
    /// Retries after receiver-not-ready (0 … 7; 7 = forever).
    pub rnr_retry: u8,
    /// RDMA reads and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// A new receiver-not-ready delay code (0 … 31), replacing the one set at RTR (an
    /// optional attribute of this transition); `None`: keep it.
    pub min_rnr_timer: Option<u8>,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            min_rnr_timer: None,
        }
    }
}

/// A QP's state (`ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not yet configured.
    Reset,
    /// Bound to a port; receives can be posted.
    Init,
    /// Ready to receive: connected to its peer.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue draining.
    Sqd,
    /// Send queue error (unreliable transports only).
    Sqe,
    /// Failed: outstanding work completes flushed.
    Error,
    /// A value this version does not know.
    Other(u32),
}

impl QpState {
    fn from_raw(v: sys::ibv_qp_state) -> Self {
        match v {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::Rtr,
            sys::IBV_QPS_RTS => QpState::Rts,
            sys::IBV_QPS_SQD => QpState::Sqd,
            sys::IBV_QPS_SQE => QpState::Sqe,
            sys::IBV_QPS_ERR => QpState::Error,
            v => QpState::Other(v),
        }
    }
}

/// What `ibv_query_qp` reports of an RC QP: its state and connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// The state the device holds it in (a fatal error moves it to [`QpState::Error`]).
    pub state: QpState,
    /// The local port (from 1; 0 before INIT).
    pub port: u8,
    /// Access peers have to this QP's memory.
    pub access: Access,
    /// The path MTU in bytes (0 before RTR).
    pub mtu: u32,
    /// The peer: its QP number, the PSN it starts with, its LID and GID.
    pub remote: RemoteQp,
    /// The local GID index the path uses.
    pub sgid_index: u8,
    /// Our first send PSN.
    pub sq_psn: u32,
    /// Transport timeout code.
    pub timeout: u8,
    /// Retransmissions after a timeout.
    pub retry_cnt: u8,
    /// Retries after receiver-not-ready.
    pub rnr_retry: u8,
    /// Receiver-not-ready delay code.
    pub min_rnr_timer: u8,
    /// RDMA reads and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// RDMA reads and atomics the peer may have outstanding on this QP.
    pub max_dest_rd_atomic: u8,
}

/// An RC queue pair made by libmlx5, whose rings the caller writes directly.
pub struct Qp {
    pd: Arc<Pd>,
    // Held so that the CQs outlive the QP (verbs destroys a QP before its CQs).
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    pub(crate) raw: NonNull<sys::ibv_qp>,
    rings: QpRings,
    /// The inline payload one send may carry, as libmlx5 sized the QP (at least what was
    /// asked for).
    max_inline_data: u32,
}

// SAFETY: libibverbs objects may be used from any thread; this type hands out addresses only.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Pd {
    /// `mlx5dv_create_qp`: an RC QP on this PD completing into `send_cq` and `recv_cq`.
    pub fn create_qp(
        self: &Arc<Self>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: &QpCaps,
    ) -> RdmaResult<Qp> {
        let ctx = &self.ctx;
        if !Arc::ptr_eq(&send_cq.ctx, ctx) || !Arc::ptr_eq(&recv_cq.ctx, ctx) {
            return Err(RdmaError::InvalidArgument(
                "the QP's CQs belong to another device context".into(),
            ));
        }
        let mut attr = sys::ibv_qp_init_attr_ex {
            send_cq: send_cq.raw.as_ptr(),
            recv_cq: recv_cq.raw.as_ptr(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: caps.max_inline_data,
            },
            qp_type: sys::IBV_QPT_RC,
            comp_mask: sys::IBV_QP_INIT_ATTR_PD,
            pd: self.raw.as_ptr(),
            ..Default::default()
        };
        if caps.send_ops != 0 {
            attr.comp_mask |= sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            attr.send_ops_flags = caps.send_ops;
        }
        let mut dv = sys::mlx5dv_qp_init_attr {
            comp_mask: sys::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS.into(),
            create_flags: sys::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
            ..Default::default()
        };
        // SAFETY: FFI; the attributes outlive the call and name live objects of this context.
        let raw = unsafe {
            ctx.rdma
                .mlx5
                .mlx5dv_create_qp(ctx.raw.as_ptr(), &mut attr, &mut dv)
        };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("mlx5dv_create_qp"))?;
        let mut qp = Qp {
            pd: self.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            raw,
            rings: QpRings {
                qpn: 0,
                sq_buf: 0,
                sq_wqe_cnt: 0,
                sq_stride: 0,
                rq_buf: 0,
                rq_wqe_cnt: 0,
                rq_stride: 0,
                dbrec: 0,
                bf_reg: 0,
                bf_size: 0,
            },
            max_inline_data: attr.cap.max_inline_data,
        };
        qp.rings = qp.init_obj()?;
        Ok(qp)
    }
}

impl Qp {
    /// `mlx5dv_init_obj` for the QP.
    fn init_obj(&self) -> RdmaResult<QpRings> {
        let mut dv = sys::mlx5dv_qp::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.qp.in_ = self.raw.as_ptr();
        obj.qp.out = &mut dv;
        let mlx5 = &self.pd.ctx.rdma.mlx5;
        // SAFETY: FFI; `obj` and `dv` outlive the call, and only the QP pair is selected.
        let rc = unsafe { mlx5.mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_QP.into()) };
        RdmaError::check("mlx5dv_init_obj(QP)", rc)?;
        let sq_ok = dv.sq.wqe_cnt.is_power_of_two() && dv.sq.stride == 64;
        if dv.dbrec.is_null() || dv.sq.buf.is_null() || dv.bf.reg.is_null() || !sq_ok {
            return Err(RdmaError::InvalidArgument(format!(
                "mlx5dv_init_obj gave an unusable QP ({dv:?})"
            )));
        }
        Ok(QpRings {
            qpn: self.qpn(),
            sq_buf: dv.sq.buf as usize,
            sq_wqe_cnt: dv.sq.wqe_cnt,
            sq_stride: dv.sq.stride,
            rq_buf: dv.rq.buf as usize,
            rq_wqe_cnt: dv.rq.wqe_cnt,
            rq_stride: dv.rq.stride,
            dbrec: dv.dbrec as usize,
            bf_reg: dv.bf.reg as usize,
            bf_size: dv.bf.size,
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP lives as long as self; qp_num never changes.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// Its rings, doorbell record and doorbell register.
    pub fn rings(&self) -> QpRings {
        self.rings
    }

    /// The inline payload one send may carry, as libmlx5 made the QP (`cap.max_inline_data`
    /// after creation: at least what [`QpCaps::max_inline_data`] asked for).
    pub fn max_inline_data(&self) -> u32 {
        self.max_inline_data
    }

    /// `ibv_query_qp`: the state and connection the device holds for this QP.
    pub fn query(&self) -> RdmaResult<QpAttr> {
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_MIN_RNR_TIMER
            | sys::IBV_QP_MAX_QP_RD_ATOMIC
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC;
        // SAFETY: FFI on the live QP; both structs outlive the call.
        let rc = unsafe {
            self.pd
                .ctx
                .rdma
                .verbs
                .ibv_query_qp(self.raw.as_ptr(), &mut a, mask as i32, &mut init)
        };
        RdmaError::check("ibv_query_qp", rc)?;
        let ah = &a.ah_attr;
        // SAFETY: reading the raw bytes of the GID union (every bit pattern is valid).
        let gid = Gid(unsafe { ah.grh.dgid.raw });
        Ok(QpAttr {
            state: QpState::from_raw(a.qp_state),
            port: a.port_num,
            access: Access::from_bits_retain(a.qp_access_flags),
            mtu: mtu_bytes(a.path_mtu),
            remote: RemoteQp {
                qpn: a.dest_qp_num,
                psn: a.rq_psn,
                lid: ah.dlid,
                gid: (ah.is_global != 0).then_some(gid),
            },
            sgid_index: ah.grh.sgid_index,
            sq_psn: a.sq_psn,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
        })
    }

    /// RESET → INIT on `port`, with the access peers get to this QP's memory.
    pub fn to_init(&self, port: u8, access: Access) -> RdmaResult<()> {
        let attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: access.bits(),
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        self.modify(attr, mask, "ibv_modify_qp(INIT)")
    }

    /// INIT → RTR: the path to the peer.
    pub fn to_rtr(&self, a: &RtrAttr) -> RdmaResult<()> {
        let mtu = mtu_enum(a.mtu).ok_or_else(|| {
            RdmaError::InvalidArgument(format!(
                "path MTU {}: expected 256, 512, 1024, 2048 or 4096",
                a.mtu
            ))
        })?;
        check_range("receive PSN", a.remote.psn, 0xff_ffff)?;
        check_range("min_rnr_timer", a.min_rnr_timer.into(), 31)?;
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: a.remote.qpn,
            rq_psn: a.remote.psn,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            ..Default::default()
        };
        attr.ah_attr.dlid = a.remote.lid;
        attr.ah_attr.sl = a.service_level;
        attr.ah_attr.port_num = a.port;
        if let Some(gid) = a.remote.gid {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = gid.0;
            attr.ah_attr.grh.sgid_index = a.sgid_index;
            attr.ah_attr.grh.hop_limit = a.hop_limit;
            attr.ah_attr.grh.traffic_class = a.traffic_class;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(attr, mask, "ibv_modify_qp(RTR)")
    }

    /// RTR → RTS: the requester's PSN, timeout and retry counts.
    pub fn to_rts(&self, a: &RtsAttr) -> RdmaResult<()> {
        check_range("send PSN", a.sq_psn, 0xff_ffff)?;
        check_range("timeout", a.timeout.into(), 31)?;
        check_range("retry_cnt", a.retry_cnt.into(), 7)?;
        check_range("rnr_retry", a.rnr_retry.into(), 7)?;
        let rnr = a.min_rnr_timer.unwrap_or(0);
        check_range("min_rnr_timer", rnr.into(), 31)?;
        let attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn: a.sq_psn,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: rnr,
            ..Default::default()
        };
        let mut mask = sys::IBV_QP_STATE
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        if a.min_rnr_timer.is_some() {
            mask |= sys::IBV_QP_MIN_RNR_TIMER;
        }
        self.modify(attr, mask, "ibv_modify_qp(RTS)")
    }

    /// Any state → ERROR: outstanding work completes flushed.
    pub fn to_error(&self) -> RdmaResult<()> {
        let attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(attr, sys::IBV_QP_STATE, "ibv_modify_qp(ERR)")
    }

    fn modify(&self, mut attr: sys::ibv_qp_attr, mask: u32, call: &'static str) -> RdmaResult<()> {
        // SAFETY: FFI on the live QP; `attr` outlives the call.
        let rc = unsafe {
            self.pd
                .ctx
                .rdma
                .verbs
                .ibv_modify_qp(self.raw.as_ptr(), &mut attr, mask as i32)
        };
        RdmaError::check(call, rc)
    }
}

fn check_range(what: &str, v: u32, max: u32) -> RdmaResult<()> {
    if v > max {
        return Err(RdmaError::InvalidArgument(format!(
            "{what} {v}: at most {max}"
        )));
    }
    Ok(())
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by this type, destroyed once, before its CQs and PD (held above).
        let rc = unsafe { self.pd.ctx.rdma.verbs.ibv_destroy_qp(self.raw.as_ptr()) };
        if let Err(e) = RdmaError::check("ibv_destroy_qp", rc) {
            tracing::warn!("{}: QP {:#x}: {e}", self.pd.ctx.name(), self.rings.qpn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libmlx5_budgets_a_request_by_gdsyncs_largest_wqe() {
        let caps = |sge, inline, send_ops| QpCaps {
            max_send_sge: sge,
            max_inline_data: inline,
            send_ops,
            ..QpCaps::default()
        };
        // One WQEBB for a one-SGE QP (libmlx5's default operations take four).
        assert_eq!(gdsync_send_wqe_size(&caps(1, 0, GDSYNC_SEND_OPS)), 64);
        // 48 + 16 SGEs = 304, 48 + 4 + 220 inline = 272 (rounded to 16: 48 + 224).
        assert_eq!(gdsync_send_wqe_size(&caps(16, 220, GDSYNC_SEND_OPS)), 320);
        // The largest inline payload: 48 + 976 = 1024 bytes.
        assert_eq!(gdsync_send_wqe_size(&caps(1, 972, GDSYNC_SEND_OPS)), 1024);
        // Without atomics, no atomic segment: 32 + 976.
        let no_atomics = GDSYNC_SEND_OPS & !GDSYNC_ATOMIC_OPS;
        assert_eq!(gdsync_send_wqe_size(&caps(1, 972, no_atomics)), 1024);
        assert_eq!(gdsync_send_wqe_size(&caps(2, 0, no_atomics)), 64);
        assert_eq!(gdsync_send_wqe_size(&caps(2, 0, GDSYNC_SEND_OPS)), 128);
    }

    #[test]
    fn out_of_range_attributes_are_refused_with_their_name() {
        assert!(check_range("timeout", 31, 31).is_ok());
        let e = check_range("retry_cnt", 8, 7).unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: retry_cnt 8: at most 7");
    }
}
