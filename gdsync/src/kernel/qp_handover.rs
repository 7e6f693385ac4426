//! Handing a QP's rings to a GPU kernel and taking them back: the checks that nothing is
//! outstanding (a refusal hands the QP back: [`IntoDeviceError`]), and the counters the
//! kernel starts from and leaves.

use crate::kernel::IntoDeviceError;
use crate::qp::{Qp, QpState, QP_KERNEL_RQ_PI, QP_KERNEL_SQ_PI, QP_RQ_RETIRED, QP_SQ_RETIRED};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Qp {
    /// Hands the send ring, the receive ring and both CQs to a GPU kernel, which then posts
    /// and polls by itself through the descriptor [`DeviceQp::desc`](crate::kernel::DeviceQp::desc)
    /// returns (see `gdsync.cuh`). The CPU can no longer post (the QP is consumed) nor poll
    /// the CQs (polls return `Err`); [`DeviceQp::into_host`](crate::kernel::DeviceQp::into_host)
    /// gives the QP back.
    ///
    /// Refused unless each CQ serves only this queue side (a kernel must know every
    /// completion it sees), each CQ holds at least as many entries as its ring (so it cannot
    /// overrun), and nothing is outstanding: no send or receive in flight, no completion
    /// unpolled, no prepared send uncommitted.
    ///
    /// A refused QP is lost here; [`Qp::try_into_device`] hands it back.
    pub fn into_device(self) -> Result<crate::kernel::DeviceQp> {
        self.try_into_device().map_err(Error::from)
    }

    /// [`Qp::into_device`], which hands the QP back, unchanged, when it refuses (the QP can
    /// be used on the CPU as before, or handed over once its work is done).
    pub fn try_into_device(self) -> Result<crate::kernel::DeviceQp, IntoDeviceError> {
        if let Err(error) = self.check_hand_over() {
            return Err(IntoDeviceError {
                error,
                qp: Box::new(self),
            });
        }
        // The kernel starts from the CPU's counters, and the host reads them as retired.
        let (sq, rq) = (self.sq_pi, self.rq_pi);
        for (at, v) in [
            (QP_SQ_RETIRED, sq),
            (QP_RQ_RETIRED, rq),
            (QP_KERNEL_SQ_PI, sq),
            (QP_KERNEL_RQ_PI, rq),
        ] {
            self.shared.ctrl.u64(at).store(v, Ordering::Release);
        }
        Ok(crate::kernel::DeviceQp::new(self))
    }

    /// Whether the QP may go to a kernel (see [`Qp::into_device`]); where it may, its CQs are
    /// marked as the kernel's.
    fn check_hand_over(&self) -> Result<()> {
        let s = &*self.shared;
        if s.state() == QpState::Error {
            return Err(Error::QpInError { qpn: s.qpn });
        }
        if Arc::ptr_eq(&s.send_cq, &s.recv_cq)
            || s.send_cq.users.load(Ordering::Acquire) != 1
            || s.recv_cq.users.load(Ordering::Acquire) != 1
        {
            return Err(Error::invalid(format!(
                "QP {:#x}: a kernel needs a send CQ and a receive CQ used by this QP alone",
                s.qpn
            )));
        }
        if s.send_cq.cnt < s.sq_cnt || s.recv_cq.cnt < s.rq_cnt {
            return Err(Error::invalid(format!(
                "QP {:#x}: the send CQ ({}) and receive CQ ({}) need at least as many entries as the send ring ({} WQEBBs) and receive ring ({}), or they could overrun",
                s.qpn, s.send_cq.cnt, s.recv_cq.cnt, s.sq_cnt, s.rq_cnt
            )));
        }
        if !self.uncommitted.is_empty() || self.committed != self.sq_pi {
            return Err(Error::invalid(format!(
                "QP {:#x}: the send ring holds prepared sends never committed",
                s.qpn
            )));
        }
        if s.sq_retired() != self.sq_pi || s.rq_retired() != self.rq_pi {
            return Err(Error::invalid(format!(
                "QP {:#x}: work is outstanding ({} send WQEBBs, {} receives): wait for its completions before handing the QP to a kernel",
                s.qpn,
                self.sq_pi.wrapping_sub(s.sq_retired()),
                self.rq_pi.wrapping_sub(s.rq_retired())
            )));
        }
        s.send_cq.hand_to_kernel()?;
        if let Err(e) = s.recv_cq.hand_to_kernel() {
            s.send_cq.take_from_kernel();
            return Err(e);
        }
        Ok(())
    }

    /// Takes the rings back from a kernel that ended with nothing outstanding: posting
    /// resumes at the counters the kernel left.
    pub(crate) fn resume_from_kernel(&mut self, sq_pi: u64, rq_pi: u64) {
        let s = &*self.shared;
        self.sq_pi = sq_pi;
        self.committed = sq_pi;
        // The kernel rang everything it posted (its sends completed): CPU posts may follow.
        s.sq_rung().store(sq_pi, Ordering::Release);
        self.rq_pi = rq_pi;
        // Host polls count on from here (the kernel may have moved the rings by more than
        // the 16-bit distance `advance16` bridges).
        s.sq_polled.store(sq_pi, Ordering::Release);
        s.rq_polled.store(rq_pi, Ordering::Release);
        s.send_cq.take_from_kernel();
        s.recv_cq.take_from_kernel();
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, QpConfig, RecvWr};

    /// A refused hand-over gives the QP back, unchanged and usable on the CPU; once the
    /// reason is gone it goes to the kernel.
    #[test]
    fn a_refused_hand_over_hands_the_qp_back() {
        let dev = Device::soft().unwrap();
        let pd = dev.alloc_pd();
        let (scq, rcq) = (dev.create_cq(1024).unwrap(), dev.create_cq(1024).unwrap());
        let mut qp = pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap();
        let qpn = qp.qpn();
        qp.post_recv(&RecvWr::new()).unwrap();
        let e = qp.try_into_device().unwrap_err();
        assert!(e.to_string().contains("outstanding"), "{e}");
        let mut qp = *e.qp;
        assert_eq!(qp.qpn(), qpn);
        // Still the CPU's: it posts, and its CQs are not the kernel's.
        qp.post_recv(&RecvWr::new()).unwrap();
        assert!(rcq.poll_one().is_ok());
        drop(qp);
        let fresh = pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap();
        assert!(fresh.try_into_device().is_ok());
    }
}
