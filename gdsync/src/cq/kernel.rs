//! Handing a CQ to a GPU kernel and taking it back: while a kernel consumes it, host polls
//! are refused, and the consumer index passes through the retired counter.

use super::{CqShared, CQ_RETIRED};
use crate::format::{CqeOwner, CQE_SIZE};
use crate::mem::slot_off;
use crate::{Error, Result};
use std::sync::atomic::Ordering;

impl CqShared {
    /// Hands the CQ to a kernel: refuses if a kernel already owns it, a completion waits
    /// unconsumed or an executor wait not run yet covers one; else publishes the consumer index in the retired counter (where the kernel
    /// resumes) and returns it.
    pub(crate) fn hand_to_kernel(&self) -> Result<u64> {
        let mut st = self.poll.lock();
        if self.kernel_owned.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "CQ {:#x} is already consumed by a kernel",
                self.cqn
            )));
        }
        self.catch_up(&mut st);
        // A stream wait would store the consumer index beside the kernel.
        self.check_not_reserved(st.ci)?;
        let op_own = self
            .ring
            .u8(slot_off(0, st.ci, self.cnt, CQE_SIZE) + 63)
            .load(Ordering::Acquire);
        if CqeOwner::is_new(op_own, st.ci, self.cnt) {
            return Err(Error::invalid(format!(
                "CQ {:#x} holds completions not yet polled: poll them before handing it to a kernel",
                self.cqn
            )));
        }
        self.ctrl.u64(CQ_RETIRED).store(st.ci, Ordering::Release);
        self.kernel_owned.store(true, Ordering::Release);
        Ok(st.ci)
    }

    /// Takes the CQ back from a kernel: host polls resume where the kernel stopped.
    pub(crate) fn take_from_kernel(&self) {
        let mut st = self.poll.lock();
        self.catch_up(&mut st);
        self.kernel_owned.store(false, Ordering::Release);
    }
}
