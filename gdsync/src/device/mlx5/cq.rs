//! Completion queues: `ibv_create_cq`, then `mlx5dv_init_obj` for the CQE ring and its
//! doorbell record, with every CQE marked invalid so that a wait on the owner bit alone (a
//! GPU's one-word wait) cannot pass before the HCA wrote the entry; and the number of a CQ an
//! asynchronous event names.

use super::context::Context;
use super::error::RdmaError;
use super::{sys, RdmaResult};
use std::ptr::NonNull;
use std::sync::Arc;

/// The only CQE size the queue layer reads.
pub(crate) const CQE_SIZE: u32 = 64;
/// `op_own` of an entry the HCA has not written: invalid opcode (0xf) and the owner bit set,
/// the opposite of what the first pass (owner 0) expects.
pub(crate) const CQE_UNWRITTEN: u8 = 0xff;

/// Where a CQ's entries and doorbell record are (`struct mlx5dv_cq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqRing {
    /// The CQ number.
    pub cqn: u32,
    /// Address of the first CQE.
    pub buf: usize,
    /// Number of CQEs (a power of two).
    pub cqe_cnt: u32,
    /// Bytes per CQE (64).
    pub cqe_size: u32,
    /// Address of the doorbell record: `[consumer index][arm]`, BE32 each.
    pub dbrec: usize,
}

/// A completion queue (`ibv_cq`) whose ring the caller reads directly.
pub struct Cq {
    pub(crate) ctx: Arc<Context>,
    pub(crate) raw: NonNull<sys::ibv_cq>,
    ring: CqRing,
}

// SAFETY: libibverbs objects may be used from any thread; this type hands out addresses only.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl Context {
    /// `ibv_create_cq` for at least `entries` completions, with 64-byte CQEs.
    pub fn create_cq(self: &Arc<Self>, entries: u32) -> RdmaResult<Arc<Cq>> {
        let n = i32::try_from(entries)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| RdmaError::InvalidArgument(format!("CQ of {entries} entries")))?;
        // SAFETY: FFI on the open context; no completion channel, vector 0.
        let raw = unsafe {
            self.rdma.verbs.ibv_create_cq(
                self.raw.as_ptr(),
                n,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_create_cq"))?;
        Cq::adopt(self, raw)
    }
}

impl Context {
    /// The CQ `cq` that a CQ-error event names failed: its number, from `mlx5dv_init_obj`
    /// (`None` when libmlx5 cannot say); its ring is recorded as written no more, so that
    /// host waits on it fail at once ([`crate::failed_rings`]).
    ///
    /// # Safety
    /// `cq` is a live CQ of this context (an unacknowledged event keeps it alive).
    pub(crate) unsafe fn cq_failed(&self, cq: *mut sys::ibv_cq) -> Option<u32> {
        if cq.is_null() {
            return None;
        }
        let mut dv = sys::mlx5dv_cq::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.cq.in_ = cq;
        obj.cq.out = &mut dv;
        // SAFETY: FFI on a live CQ (the caller's word); `obj` and `dv` outlive the call, and
        // only the CQ pair is selected. (The CQ was already initialised this way at creation.)
        let rc = unsafe {
            self.rdma
                .mlx5
                .mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_CQ.into())
        };
        if rc != 0 {
            return None;
        }
        let len = u64::from(dv.cqe_cnt) * u64::from(dv.cqe_size);
        crate::failed_rings::cq_failed(dv.buf as u64, len, dv.cqn);
        Some(dv.cqn)
    }
}

impl Cq {
    /// Takes a CQ libibverbs created: its ring from `mlx5dv_init_obj`, every entry marked
    /// unwritten.
    pub(crate) fn adopt(ctx: &Arc<Context>, raw: NonNull<sys::ibv_cq>) -> RdmaResult<Arc<Cq>> {
        let mut cq = Cq {
            ctx: ctx.clone(),
            raw,
            ring: CqRing {
                cqn: 0,
                buf: 0,
                cqe_cnt: 0,
                cqe_size: 0,
                dbrec: 0,
            },
        };
        cq.ring = cq.init_obj()?;
        if cq.ring.cqe_size != CQE_SIZE {
            return Err(RdmaError::InvalidArgument(format!(
                "libmlx5 made {}-byte CQEs (is MLX5_CQE_SIZE set?): only 64-byte CQEs are supported",
                cq.ring.cqe_size
            )));
        }
        cq.mark_unwritten();
        Ok(Arc::new(cq))
    }

    /// `mlx5dv_init_obj` for the CQ.
    fn init_obj(&self) -> RdmaResult<CqRing> {
        let mut dv = sys::mlx5dv_cq::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.cq.in_ = self.raw.as_ptr();
        obj.cq.out = &mut dv;
        // SAFETY: FFI; `obj` and `dv` outlive the call, and only the CQ pair is selected.
        let rc = unsafe {
            self.ctx
                .rdma
                .mlx5
                .mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_CQ.into())
        };
        RdmaError::check("mlx5dv_init_obj(CQ)", rc)?;
        if dv.buf.is_null() || dv.dbrec.is_null() || !dv.cqe_cnt.is_power_of_two() {
            return Err(RdmaError::InvalidArgument(format!(
                "mlx5dv_init_obj gave an unusable CQ ring ({dv:?})"
            )));
        }
        Ok(CqRing {
            cqn: dv.cqn,
            buf: dv.buf as usize,
            cqe_cnt: dv.cqe_cnt,
            cqe_size: dv.cqe_size,
            dbrec: dv.dbrec as usize,
        })
    }

    /// Marks every entry unwritten (libmlx5 leaves 0xf0: invalid opcode, owner 0, which its
    /// own poll rejects by the opcode but a wait on the owner bit alone would take).
    fn mark_unwritten(&self) {
        let r = self.ring;
        for i in 0..r.cqe_cnt as usize {
            let op_own = (r.buf + i * r.cqe_size as usize + r.cqe_size as usize - 1) as *mut u8;
            // SAFETY: the ring is cqe_cnt entries of cqe_size bytes that libmlx5 allocated
            // for this CQ; nothing writes it before a QP is attached.
            unsafe { op_own.write_volatile(CQE_UNWRITTEN) };
        }
    }

    /// The ring, doorbell record and CQ number.
    pub fn ring(&self) -> CqRing {
        self.ring
    }

    /// The device it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        crate::failed_rings::forget(self.ring.buf as u64);
        // SAFETY: every QP using the CQ holds an Arc of it, so none is left.
        let rc = unsafe { self.ctx.rdma.verbs.ibv_destroy_cq(self.raw.as_ptr()) };
        if let Err(e) = RdmaError::check("ibv_destroy_cq", rc) {
            tracing::warn!("{}: {e}", self.ctx.name());
        }
    }
}
