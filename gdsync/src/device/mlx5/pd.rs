//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_reg_mr` of host memory (or
//! of a raw address such as a device pointer with peer memory), `ibv_reg_dmabuf_mr`.

use super::context::Context;
use super::error::RdmaError;
use super::{sys, RdmaResult};
use crate::Access;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain (`ibv_pd`), deallocated when its last MR and QP are gone.
pub struct Pd {
    pub(crate) ctx: Arc<Context>,
    pub(crate) raw: NonNull<sys::ibv_pd>,
    /// A parent domain's parts (the PD it extends and its allocator's state,
    /// `caller_rings::ParentParts`), released after it.
    pub(crate) parent: Option<Box<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs objects may be used from any thread; this type hands out no interior
// references.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(self: &Arc<Self>) -> RdmaResult<Arc<Pd>> {
        // SAFETY: FFI on the open context.
        let raw = unsafe { self.rdma.verbs.ibv_alloc_pd(self.raw.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_alloc_pd"))?;
        Ok(Arc::new(Pd {
            ctx: self.clone(),
            raw,
            parent: None,
        }))
    }
}

impl Pd {
    /// The device it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The kernel's handle of the PD.
    pub fn handle(&self) -> u32 {
        // SAFETY: the PD lives as long as self.
        unsafe { (*self.raw.as_ptr()).handle }
    }

    /// `ibv_reg_mr` of a host buffer; the region borrows the buffer, so it cannot outlive it.
    pub fn reg_mr<'a>(self: &Arc<Self>, buf: &'a mut [u8], access: Access) -> RdmaResult<Mr<'a>> {
        // SAFETY: the buffer is borrowed for the region's lifetime.
        unsafe { self.reg_mr_raw(buf.as_mut_ptr() as u64, buf.len(), access) }
    }

    /// `ibv_reg_mr` of `len` bytes at `addr` (host memory, or a CUDA device pointer where the
    /// peer-memory kernel module takes it).
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped: the HCA writes into it.
    pub unsafe fn reg_mr_raw(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: Access,
    ) -> RdmaResult<Mr<'static>> {
        let raw = self.ctx.rdma.verbs.ibv_reg_mr(
            self.raw.as_ptr(),
            addr as *mut libc::c_void,
            len,
            access.bits() as i32,
        );
        self.wrap_mr(raw, "ibv_reg_mr")
    }

    /// `ibv_reg_dmabuf_mr`: `len` bytes at `offset` of a dma-buf (from
    /// `cuMemGetHandleForAddressRange`), addressed by peers as `iova`. The kernel holds the
    /// dma-buf while the region lives; the caller may close its descriptor.
    pub fn reg_dmabuf_mr(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> RdmaResult<Mr<'static>> {
        // SAFETY: FFI; the kernel takes its own reference to the dma-buf.
        let raw = unsafe {
            self.ctx.rdma.verbs.ibv_reg_dmabuf_mr(
                self.raw.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access.bits() as i32,
            )
        };
        self.wrap_mr(raw, "ibv_reg_dmabuf_mr")
    }

    fn wrap_mr(
        self: &Arc<Self>,
        raw: *mut sys::ibv_mr,
        call: &'static str,
    ) -> RdmaResult<Mr<'static>> {
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last(call))?;
        Ok(Mr {
            pd: self.clone(),
            raw,
            _buf: PhantomData,
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of the PD holds an Arc of it, so none is left.
        let rc = unsafe { self.ctx.rdma.verbs.ibv_dealloc_pd(self.raw.as_ptr()) };
        if let Err(e) = RdmaError::check("ibv_dealloc_pd", rc) {
            tracing::warn!("{}: {e}", self.ctx.name());
        }
    }
}

/// A registered memory region (`ibv_mr`), deregistered on drop.
pub struct Mr<'a> {
    pd: Arc<Pd>,
    raw: NonNull<sys::ibv_mr>,
    _buf: PhantomData<&'a mut [u8]>,
}

// SAFETY: as for Pd.
unsafe impl Send for Mr<'_> {}
// SAFETY: as for Pd.
unsafe impl Sync for Mr<'_> {}

impl Mr<'_> {
    fn attr(&self) -> &sys::ibv_mr {
        // SAFETY: the MR lives as long as self; libibverbs does not change these fields.
        unsafe { self.raw.as_ref() }
    }

    /// The local key (in SGEs).
    pub fn lkey(&self) -> u32 {
        self.attr().lkey
    }

    /// The remote key (what peers put in RDMA and atomic requests).
    pub fn rkey(&self) -> u32 {
        self.attr().rkey
    }

    /// The first address of the region.
    pub fn addr(&self) -> u64 {
        self.attr().addr as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.attr().length
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The PD it belongs to.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by this type, deregistered once.
        let rc = unsafe { self.pd.ctx.rdma.verbs.ibv_dereg_mr(self.raw.as_ptr()) };
        if let Err(e) = RdmaError::check("ibv_dereg_mr", rc) {
            tracing::warn!("{}: {e}", self.pd.ctx.name());
        }
    }
}
