//! Queue pairs (RC): the send ring and receive ring in mlx5 format, posting from the CPU, and
//! the prepare → commit split that leaves ringing the doorbell to any executor.
//!
//! [`config`]: sizes, limits and states; [`shared`]: what the handle, the engine and CQ polls
//! share; [`post`]: preparing, committing and posting; [`encode`]: work requests as WQEs;
//! [`wait`]: completion waits as op lists. Handing the rings to a GPU kernel is in
//! [`crate::kernel`].

mod config;
mod encode;
mod post;
mod shared;
mod wait;

pub use config::{QpConfig, QpState, MAX_MESSAGE, MAX_SGE};
pub use post::{CommitError, PreparedSend, RecvTicket, SendTicket};
pub(crate) use shared::{
    QpShared, QP_DBREC, QP_DOORBELL, QP_KERNEL_RQ_PI, QP_KERNEL_SQ_PI, QP_PROXY, QP_RQ_RETIRED,
    QP_SQ_RETIRED,
};

use crate::cq::Cq;
use crate::device::{DeviceShared, Endpoint};
use crate::format::*;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A reliable-connected queue pair.
pub struct Qp {
    pub(crate) shared: Arc<QpShared>,
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) sq_pi: u64,
    pub(crate) committed: u64,
    pub(crate) rq_pi: u64,
    /// Where a WQE is assembled before it is copied into the ring.
    scratch: Box<[u8; MAX_WQE_WQEBBS * WQEBB]>,
    /// Where an inline payload is gathered before it is encoded.
    inline: Box<[u8; MAX_WQE_DS * SEG_SIZE]>,
    /// Prepared, not yet committed sends, in ring order: (start, end).
    pub(crate) uncommitted: std::collections::VecDeque<(u64, u64)>,
    /// Starts of prepared sends dropped without a commit.
    abandoned: Arc<parking_lot::Mutex<Vec<u64>>>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.shared.qpn)
            .field("state", &self.state())
            .finish()
    }
}

impl Qp {
    pub(crate) fn create(
        dev: &Arc<DeviceShared>,
        pd: u32,
        qpn: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<Self> {
        if !Arc::ptr_eq(&send_cq._dev, dev) || !Arc::ptr_eq(&recv_cq._dev, dev) {
            return Err(Error::invalid(
                "the QP's CQs must belong to the same device",
            ));
        }
        cfg.check()?;
        let (handler, why) = match cfg.nic_handler {
            Some(h) => (h, "set in QpConfig::nic_handler"),
            None => crate::NicHandler::choose_soft()?,
        };
        crate::handler::log_choice(handler, why);
        let shared = Arc::new(QpShared::new(
            qpn,
            pd,
            &send_cq.shared,
            &recv_cq.shared,
            cfg,
            handler,
        ));
        for cq in [&send_cq.shared, &recv_cq.shared] {
            if cq.users.fetch_add(1, Ordering::AcqRel) > 0 {
                cq.shared_ever.store(true, Ordering::Release);
            }
        }
        let attached = dev.add_qp(&shared).and_then(|()| match handler {
            crate::NicHandler::Cpu => dev.proxy.watch(&shared, dev),
            _ => Ok(()),
        });
        if let Err(e) = attached {
            // Undo what the device and the CQs hold (the caller gives the number back).
            dev.forget_qp(qpn);
            for cq in [&send_cq.shared, &recv_cq.shared] {
                cq.users.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(e);
        }
        Ok(Qp {
            shared,
            dev: dev.clone(),
            sq_pi: 0,
            committed: 0,
            rq_pi: 0,
            scratch: Box::new([0; MAX_WQE_WQEBBS * WQEBB]),
            inline: Box::new([0; MAX_WQE_DS * SEG_SIZE]),
            uncommitted: Default::default(),
            abandoned: Default::default(),
        })
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.shared.state()
    }

    /// What a peer needs to connect to this QP: plain data to exchange out of band.
    pub fn endpoint(&self) -> Endpoint {
        self.dev.endpoint(self.shared.qpn)
    }

    /// Connects to the peer QP described by `remote` and moves to RTS.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<()> {
        if self.state() != QpState::Init {
            return Err(Error::invalid(format!(
                "QP {:#x} is {:?}; only a new QP can connect",
                self.qpn(),
                self.state()
            )));
        }
        self.dev.connect(&self.shared, remote)?;
        self.shared
            .state
            .store(QpState::Rts as u8, Ordering::Release);
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
    /// and rung (the doorbell record, which executors store), and receives posted.
    pub fn describe(&self) -> String {
        let rec = self.sq_doorbell_record();
        format!(
            "QP {:#x} {:?}: send ring prepared to {}, committed to {}, doorbell record {} (low 16 bits, at {:#x}); {} receives posted",
            self.shared.qpn,
            self.state(),
            self.sq_pi,
            self.committed,
            rec,
            self.shared.ctrl.addr(QP_DBREC + 4 * DBREC_SQ),
            self.rq_pi,
        )
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.shared.send_cq.forget_qp(self.shared.qpn);
        self.shared.recv_cq.forget_qp(self.shared.qpn);
        self.shared.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.shared.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.dev.remove_qp(self.shared.qpn);
    }
}
