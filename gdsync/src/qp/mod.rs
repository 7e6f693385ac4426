//! Queue pairs (RC): the send ring and receive ring in mlx5 format, posting from the CPU, and
//! the prepare → commit split that leaves ringing the doorbell to any executor.
//!
//! [`config`]: sizes, limits and states; [`shared`]: what the handle, the engine and CQ polls
//! share; [`post`]: preparing, committing and posting; [`batch`]: several sends rung with one
//! doorbell; [`doorbell`]: the one doorbell store sequence; [`encode`]: work requests as
//! WQEs; [`wait`]: completion waits as op lists. Handing the rings to a GPU kernel is in
//! [`crate::kernel`].

mod batch;
#[cfg(test)]
pub(crate) mod batch_tests;
mod config;
mod doorbell;
mod encode;
#[cfg(test)]
mod encode_tests;
mod post;
#[cfg(test)]
mod ring_order_tests;
#[cfg(test)]
mod ringers_tests;
mod shared;
mod wait;

pub use batch::SendBatch;
pub use config::{
    QpConfig, QpState, Ringers, IB_HOP_LIMIT_VAR, IB_SL_VAR, IB_TC_VAR, MAX_MESSAGE, MAX_SGE,
};
pub use post::{CommitError, PreparedSend, RecvTicket, SendTicket};
pub(crate) use shared::{
    QpShared, QP_KERNEL_RQ_PI, QP_KERNEL_SQ_PI, QP_PROXY, QP_RQ_RETIRED, QP_SQ_RETIRED, QP_SQ_RUNG,
};

use crate::context::DeviceContext;
use crate::cq::{Cq, CqUser};
use crate::format::*;
use crate::handler::ProxyTarget;
use crate::mr::ProtectionDomain;
use crate::provider::{Endpoint, PortAttr};
use crate::provider::{HwQpState, MemAt, QpModify, QpPath, QpTimers};
use crate::{Error, Result};
use shared::QpRingsAsked;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// A reliable-connected queue pair.
pub struct Qp {
    pub(crate) shared: Arc<QpShared>,
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) sq_pi: u64,
    pub(crate) committed: u64,
    pub(crate) rq_pi: u64,
    /// The device has reported the QP past INIT: sends need not ask it again.
    connected: bool,
    /// Send WQEBBs retired, as last read (a lower bound: the counters only grow).
    sq_retired_seen: u64,
    /// Where a WQE is assembled when it wraps around the ring's end (others are written in
    /// place).
    scratch: Box<[u8; MAX_WQE_WQEBBS * WQEBB]>,
    /// Where an inline payload is gathered before it is encoded.
    inline: Box<[u8; MAX_WQE_DS * SEG_SIZE]>,
    /// The region the last inline send copied from (while no registration changes).
    last_region: crate::context::RegionCache,
    /// Prepared, not yet committed sends, in ring order: (start, end).
    pub(crate) uncommitted: std::collections::VecDeque<(u64, u64)>,
    /// Starts of prepared sends dropped without a commit.
    abandoned: Arc<parking_lot::Mutex<Vec<u64>>>,
    /// The half of the doorbell register the next CPU post rings (libmlx5's `bf.offset`).
    pub(crate) bf_offset: usize,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.shared.qpn)
            .field("state", &self.state())
            .finish()
    }
}

impl ProtectionDomain {
    /// A reliable-connected QP completing sends on `send_cq` and receives on `recv_cq`.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &QpConfig) -> Result<Qp> {
        Qp::create(&self.ctx, self.id, send_cq, recv_cq, cfg)
    }
}

impl Qp {
    /// `create_qp` on rings this layer allocates (or the device's own), then `modify_qp` to INIT (receives may be
    /// posted from then on).
    pub(crate) fn create(
        ctx: &Arc<DeviceContext>,
        pd: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<Self> {
        if !Arc::ptr_eq(send_cq.shared.ctx(), ctx) || !Arc::ptr_eq(recv_cq.shared.ctx(), ctx) {
            return Err(Error::invalid(
                "the QP's CQs must belong to the same device",
            ));
        }
        cfg.check()?;
        let env_handler = crate::NicHandler::from_env()?;
        let asked = QpRingsAsked::new(
            cfg,
            ctx.provider.query_device().owns_rings,
            ctx.cuda.as_ref(),
        );
        let spec = asked.spec(pd, send_cq.shared.cqn, recv_cq.shared.cqn);
        let mut created = ctx.provider.create_qp(spec)?;
        let Some(rings) = asked.rings(created.device_rings.take()) else {
            ctx.provider.destroy_qp(created.qpn);
            return Err(Error::invalid(format!(
                "QP {:#x}: {} owns its rings but gave none",
                created.qpn,
                ctx.provider.name()
            )));
        };
        let (handler, why) = match cfg.nic_handler {
            Some(h) => (h, "set in QpConfig::nic_handler".into()),
            None => crate::handler::choose(env_handler, &created.gpu_doorbell),
        };
        crate::handler::log_choice(handler, &why);
        let shared = Arc::new(QpShared::new(
            rings,
            created,
            pd,
            &send_cq.shared,
            &recv_cq.shared,
            cfg,
            handler,
            ctx,
        ));
        let qpn = shared.qpn;
        let user: Weak<dyn CqUser> = Arc::downgrade(&shared) as Weak<dyn CqUser>;
        for cq in [&send_cq.shared, &recv_cq.shared] {
            if cq.users.fetch_add(1, Ordering::AcqRel) > 0 {
                cq.shared_ever.store(true, Ordering::Release);
            }
            cq.attach(qpn, user.clone());
        }
        ctx.watch_qp(qpn, shared.hw_state.clone());
        // From here on the QP's drop destroys it.
        let qp = Qp {
            shared,
            ctx: ctx.clone(),
            sq_pi: 0,
            committed: 0,
            rq_pi: 0,
            connected: false,
            sq_retired_seen: 0,
            scratch: Box::new([0; MAX_WQE_WQEBBS * WQEBB]),
            inline: Box::new([0; MAX_WQE_DS * SEG_SIZE]),
            last_region: Default::default(),
            uncommitted: Default::default(),
            abandoned: Default::default(),
            bf_offset: 0,
        };
        ctx.provider.modify_qp(qpn, QpModify::Init)?;
        qp.shared.moved_to(HwQpState::Init);
        if handler == crate::NicHandler::Cpu {
            qp.ring_by_proxy()?;
        }
        Ok(qp)
    }

    /// Has the CPU proxy ring this QP's doorbell for executors ([`crate::NicHandler::Cpu`]):
    /// it watches the proxy request word in the control page.
    fn ring_by_proxy(&self) -> Result<()> {
        let s = &self.shared;
        let at = |off| MemAt {
            mem: s.ctrl.clone(),
            off,
        };
        let target = ProxyTarget {
            qpn: s.qpn,
            request: at(QP_PROXY),
            sq_dbrec: MemAt {
                mem: s.dbrec.mem.clone(),
                off: s.dbrec.off + 4 * DBREC_SQ,
            },
            doorbell: s.doorbell.clone(),
            rung: at(QP_SQ_RUNG),
            doorbell_wc: s.doorbell_wc,
            ring: doorbell::ring_for_proxy,
        };
        self.ctx.proxy.watch(target, &self.ctx.provider)
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    /// Who rings this QP's doorbell for work that streams and kernels post: the GPU, or the
    /// CPU proxy (chosen when the QP was made; see [`crate::NicHandler`]).
    pub fn nic_handler(&self) -> crate::NicHandler {
        self.shared.handler
    }

    /// The current state, as this library knows it: from its own transitions (create,
    /// [`connect`](Self::connect)), the device's asynchronous events about the QP, and the
    /// error completions polled or checked ([`Cq::take_errors`]) on its CQs. Asks the device
    /// nothing (cheap enough for every progress loop). An error completion an executor or
    /// kernel consumed shows here once its CQ's errors are taken or checked.
    pub fn state(&self) -> QpState {
        self.shared.state()
    }

    /// The current state as the device reports it: `ibv_query_qp`, on a ConnectX a
    /// firmware command (tens of microseconds, serialised for the whole NIC). For
    /// diagnostics; [`state`](Self::state) is what progress loops should read. The answer
    /// is kept: `state` reports it from then on.
    pub fn query_state(&self) -> QpState {
        self.shared.query_state()
    }

    /// What a peer needs to connect to this QP: plain data to exchange out of band.
    pub fn endpoint(&self) -> Endpoint {
        self.ctx.provider.endpoint(self.shared.qpn)
    }

    /// Connects to the peer QP described by `remote` and moves to RTS.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<()> {
        let state = self.query_state();
        if state != QpState::Init {
            return Err(Error::invalid(format!(
                "QP {:#x} is {state:?}; only a new QP can connect",
                self.qpn(),
            )));
        }
        let p = &self.ctx.provider;
        let route = self.shared.cfg.route()?;
        let mtu = own_port_mtu(&self.endpoint(), || p.query_port(1))?;
        let path = QpPath {
            remote: *remote,
            rq_psn: 0,
            mtu,
            route,
        };
        p.modify_qp(self.qpn(), QpModify::Rtr(path))?;
        let cfg = &self.shared.cfg;
        let timers = QpTimers {
            sq_psn: 0,
            timeout: cfg.timeout,
            retry_cnt: cfg.retry_count,
            rnr_retry: cfg.rnr_retry,
            min_rnr_timer: cfg.rnr_timer,
        };
        p.modify_qp(self.qpn(), QpModify::Rts(timers))?;
        self.shared.moved_to(HwQpState::Rts);
        Ok(())
    }

    /// Send ring size in WQEBBs.
    pub fn send_ring_size(&self) -> u32 {
        self.shared.sq_cnt
    }

    /// Receive ring size in WQEs.
    pub fn recv_ring_size(&self) -> u32 {
        self.shared.rq_cnt
    }

    /// One line for error reports: the state, how far the send ring is prepared, committed
    /// and rung (the "rung to" word every ringer stores after its doorbell, and the doorbell
    /// record, which ringers store before it), and receives posted.
    pub fn describe(&self) -> String {
        let rec = self.sq_doorbell_record();
        format!(
            "QP {:#x} {:?}: send ring prepared to {}, committed to {}, rung to {}, doorbell record {} (low 16 bits, at {:#x}); {} receives posted",
            self.shared.qpn,
            self.state(),
            self.sq_pi,
            self.committed,
            self.shared.sq_rung().load(Ordering::Acquire),
            rec,
            self.shared.dbrec.addr() + 4 * DBREC_SQ as u64,
            self.rq_pi,
        )
    }
}

/// The active MTU of the port a QP is on: the one its endpoint `own` carries (an RDMA
/// device's port, which may be port 2), else port 1's (`port1`: the soft device has one).
fn own_port_mtu(own: &Endpoint, port1: impl FnOnce() -> Result<PortAttr>) -> Result<u32> {
    match own.port {
        Some(p) => Ok(p.mtu),
        None => Ok(port1()?.active_mtu),
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.shared.send_cq.forget_qp(self.shared.qpn);
        self.shared.recv_cq.forget_qp(self.shared.qpn);
        self.shared.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.shared.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.ctx.forget_qp(self.shared.qpn);
        self.ctx.provider.destroy_qp(self.shared.qpn);
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;
    use crate::provider::PortAddress;

    #[test]
    fn a_qp_connects_with_its_own_ports_mtu() {
        let mut own: Endpoint =
            "gdsync:0123456789abcdef:4242:fedcba9876543211:10000:auto@-+ib/44/fe80::e42:a1ff:fe07:1/4096"
                .parse()
                .unwrap();
        let port = own.port.expect("an RDMA port's endpoint");
        assert_eq!(port.mtu, 4096);
        // Port 1 of the same device is a RoCE port of 2048 bytes: not asked, not used.
        let port1 = || -> Result<PortAttr> { panic!("port 1 asked for a QP of another port") };
        assert_eq!(own_port_mtu(&own, port1).unwrap(), 4096);
        own.port = Some(PortAddress { mtu: 1024, ..port });
        assert_eq!(own_port_mtu(&own, || unreachable!()).unwrap(), 1024);
        // A soft device's endpoint names no port: its one port is asked.
        own.port = None;
        let soft = PortAttr {
            state: crate::provider::PortState::Active,
            max_mtu: 8192,
            active_mtu: 8192,
            max_msg_sz: 1 << 30,
            link_layer: crate::provider::LinkLayer::Soft,
        };
        assert_eq!(own_port_mtu(&own, || Ok(soft.clone())).unwrap(), 8192);
    }
}
