//! Registration: protection domains and memory regions, through the provider's `alloc_pd`
//! and `reg_mr` commands. The device keeps the translation table; the host keeps the keys and
//! its own record of each region (for inline sends).

use crate::bounds;
use crate::context::{DeviceContext, HostRegion};
use crate::cuda::{Cuda, DeviceBuffer, GpuCtx, MemoryKind};
use crate::provider::{MrMemory, MrSpec};
use crate::wr::{RemoteBuf, Sge};
use crate::{Access, Error, Result};
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

/// A protection domain: QPs only reach memory regions of their own domain.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) id: u32,
    /// Deallocates the domain when the last handle goes.
    _owner: Arc<PdOwner>,
}

/// The last handle of a domain deallocates it (`dealloc_pd`).
struct PdOwner {
    ctx: Arc<DeviceContext>,
    id: u32,
}

impl Drop for PdOwner {
    fn drop(&mut self) {
        self.ctx.provider.dealloc_pd(self.id);
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.id)
            .finish()
    }
}

impl ProtectionDomain {
    /// A new domain of the device (`alloc_pd`).
    pub(crate) fn alloc(ctx: &Arc<DeviceContext>) -> Self {
        let id = ctx.provider.alloc_pd();
        ProtectionDomain {
            ctx: ctx.clone(),
            id,
            _owner: Arc::new(PdOwner {
                ctx: ctx.clone(),
                id,
            }),
        }
    }

    /// Registers `buf` with `access` rights. The region borrows the buffer: it cannot
    /// outlive it, and the buffer is reached only through the region while it exists.
    pub fn register<'buf>(
        &self,
        buf: &'buf mut [u8],
        access: Access,
    ) -> Result<MemoryRegion<'buf>> {
        // SAFETY: the exclusive borrow keeps the buffer alive and untouched by others for 'buf.
        unsafe { self.register_raw(buf.as_mut_ptr(), buf.len(), access) }
    }

    /// Registers `len` bytes at `ptr`: host memory, or device memory of a GPU of the
    /// device's CUDA handle ([`Device::cuda`](crate::Device::cuda)), told apart through
    /// unified addressing.
    ///
    /// # Safety
    /// The memory must stay allocated, and not be accessed other than through the region or
    /// the device, for as long as the returned region exists. Device memory only on a device
    /// with a CUDA handle (or through [`register_device`](Self::register_device)).
    pub unsafe fn register_raw<'buf>(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion<'buf>> {
        let gpu = self
            .ctx
            .cuda
            .as_ref()
            .and_then(|c| match c.memory_kind(ptr as u64) {
                MemoryKind::Device { ordinal } => Some((c.clone(), ordinal)),
                _ => None,
            });
        // SAFETY: the caller's contract.
        unsafe { self.register_at(ptr, len, access, gpu) }
    }

    /// Registers `len` bytes at `ptr`, device memory of `gpu` (its handle and ordinal) or
    /// host memory.
    ///
    /// # Safety
    /// As [`register_raw`](Self::register_raw).
    unsafe fn register_at<'buf>(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        gpu: Option<(Arc<Cuda>, i32)>,
    ) -> Result<MemoryRegion<'buf>> {
        if len == 0 {
            return Err(Error::invalid("cannot register a zero-length region"));
        }
        if ptr.is_null() {
            return Err(Error::invalid("cannot register a null pointer"));
        }
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::invalid(
                "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE as well (as in verbs)",
            ));
        }
        if let Some((c, ordinal)) = &gpu {
            refuse_unordered_target(c, *ordinal, access, &*self.ctx.provider)?;
        }
        let gpu = gpu.map(|(c, ordinal)| c.gpu_ctx(ordinal)).transpose()?;
        let keys = self.ctx.provider.reg_mr(&MrSpec {
            pd: self.id,
            addr: ptr as u64,
            len: len as u64,
            access,
            memory: gpu.map_or(MrMemory::Host, MrMemory::Gpu),
        })?;
        self.ctx.regions.write().insert(
            keys.lkey,
            HostRegion {
                addr: ptr as u64,
                len: len as u64,
                pd: self.id,
                gpu,
            },
        );
        Ok(MemoryRegion {
            ctx: self.ctx.clone(),
            key: keys.lkey,
            ptr,
            len,
            access,
            gpu,
            _buf: PhantomData,
        })
    }

    /// Registers a device buffer. Like [`register`](Self::register), the region borrows it.
    pub fn register_device<'buf>(
        &self,
        buf: &'buf DeviceBuffer,
        access: Access,
    ) -> Result<MemoryRegion<'buf>> {
        let gpu = Some((buf.cuda().clone(), buf.ordinal()));
        // SAFETY: the borrow keeps the allocation alive for 'buf; device memory is reached
        // only through the driver.
        unsafe { self.register_at(buf.ptr() as *mut u8, buf.len(), access, gpu) }
    }
}

/// Refuses GPU `ordinal` memory as a write target (`LOCAL_WRITE`: receives, RDMA writes, read
/// results) of a device whose payload writes travel apart from its completions, where the GPU
/// neither orders nor flushes them ([`crate::cuda::InboundWrites::Unordered`]).
fn refuse_unordered_target(
    c: &Cuda,
    ordinal: i32,
    access: Access,
    dev: &dyn crate::provider::Provider,
) -> Result<()> {
    if !access.contains(Access::LOCAL_WRITE) || !dev.query_device().gpu_writes_separate {
        return Ok(());
    }
    crate::cuda::refuse_write_target(&c.gpu(ordinal)?.caps, ordinal, &dev.name())
        .map_or(Ok(()), Err)
}

/// A registered memory region. Dropping it deregisters: the device no longer touches the
/// memory, and work that still names its key fails with a protection or access error.
pub struct MemoryRegion<'buf> {
    ctx: Arc<DeviceContext>,
    key: u32,
    ptr: *mut u8,
    len: usize,
    access: Access,
    /// Device memory of this GPU (its context, to copy through); `None`: host memory.
    gpu: Option<GpuCtx>,
    _buf: PhantomData<&'buf mut [u8]>,
}

// SAFETY: the region only hands out copies and raw addresses; the memory it covers is
// exclusively borrowed for 'buf, so moving or sharing the handle across threads is sound.
unsafe impl Send for MemoryRegion<'_> {}
// SAFETY: as above; accessors copy through raw pointers, never hand out references.
unsafe impl Sync for MemoryRegion<'_> {}

impl std::fmt::Debug for MemoryRegion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.ptr as u64))
            .field("len", &self.len)
            .field("key", &format_args!("{:#x}", self.key))
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion<'_> {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.key
    }
    /// Remote key (the same key, as on mlx5).
    pub fn rkey(&self) -> u32 {
        self.key
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty (never: zero-length regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The region as peers address it.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.key,
        }
    }
    /// A scatter/gather entry for `range` of the region.
    ///
    /// # Panics
    /// If the range is inverted, out of bounds (`..=usize::MAX` included) or longer than
    /// 4 GiB - 1, as slice indexing does; [`try_sge`](Self::try_sge) returns the error instead.
    pub fn sge(&self, range: impl RangeBounds<usize>) -> Sge {
        self.try_sge(range).unwrap_or_else(|e| panic!("{e}"))
    }
    /// A scatter/gather entry for `range` of the region, or an error if the range is
    /// inverted, out of bounds or longer than 4 GiB - 1.
    pub fn try_sge(&self, range: impl RangeBounds<usize>) -> Result<Sge> {
        let r = bounds::resolve(&range, self.len).ok_or_else(|| {
            Error::invalid(format!(
                "range {} is outside the region of {} bytes",
                bounds::describe(&range),
                self.len
            ))
        })?;
        let len = u32::try_from(r.len()).map_err(|_| {
            Error::invalid(format!(
                "range {} is {} bytes: an SGE is at most 4 GiB - 1",
                bounds::describe(&range),
                r.len()
            ))
        })?;
        Ok(Sge {
            addr: self.addr() + r.start as u64,
            len,
            lkey: self.key,
        })
    }
    /// An error unless `len` bytes at `offset` lie inside the region.
    fn check(&self, offset: usize, len: usize, what: &str) -> Result<()> {
        if bounds::fits(offset, len, self.len) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{what} of {len} bytes at offset {offset} is outside the region of {} bytes",
            self.len
        )))
    }
    /// Copies bytes of the region at `offset` into `dst`.
    ///
    /// # Panics
    /// Out of bounds, or (device memory) when the CUDA copy fails;
    /// [`try_read_at`](Self::try_read_at) returns the error instead.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) {
        self.try_read_at(offset, dst)
            .unwrap_or_else(|e| panic!("{e}"))
    }
    /// Copies bytes of the region at `offset` into `dst`, or an error if they are out of
    /// bounds or (device memory) the CUDA copy fails.
    pub fn try_read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len(), "a read")?;
        if let Some(g) = &self.gpu {
            return g.copy_dtoh(dst, self.addr() + offset as u64);
        }
        // SAFETY: in bounds (checked without overflow); the region owns access to the memory
        // for its lifetime. The device may write concurrently: data is defined once its
        // completion has been seen.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) }
        Ok(())
    }
    /// Copies `src` into the region at `offset`.
    ///
    /// # Panics
    /// Out of bounds, or (device memory) when the CUDA copy fails;
    /// [`try_write_at`](Self::try_write_at) returns the error instead.
    pub fn write_at(&self, offset: usize, src: &[u8]) {
        self.try_write_at(offset, src)
            .unwrap_or_else(|e| panic!("{e}"))
    }
    /// Copies `src` into the region at `offset`, or an error if it is out of bounds or
    /// (device memory) the CUDA copy fails.
    pub fn try_write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len(), "a write")?;
        if let Some(g) = &self.gpu {
            return g.copy_htod(self.addr() + offset as u64, src);
        }
        // SAFETY: in bounds (checked without overflow); see try_read_at.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) }
        Ok(())
    }
    /// The GPU whose memory this is, `None` for host memory.
    pub fn gpu(&self) -> Option<i32> {
        self.gpu.map(|g| g.ordinal)
    }
    /// Volatile read of one byte (for polling a buffer the peer writes, as perftest does).
    pub fn read_volatile_u8(&self, offset: usize) -> u8 {
        assert!(offset < self.len, "read out of region");
        if self.gpu.is_some() {
            let mut b = [0u8];
            self.read_at(offset, &mut b);
            return b[0];
        }
        // SAFETY: in bounds.
        unsafe { std::ptr::read_volatile(self.ptr.add(offset)) }
    }
    /// Volatile write of one byte.
    pub fn write_volatile_u8(&self, offset: usize, v: u8) {
        assert!(offset < self.len, "write out of region");
        if self.gpu.is_some() {
            return self.write_at(offset, &[v]);
        }
        // SAFETY: in bounds.
        unsafe { std::ptr::write_volatile(self.ptr.add(offset), v) }
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        self.ctx.regions.write().remove(&self.key);
        // Once this returns the device no longer touches the memory.
        self.ctx.provider.dereg_mr(self.key);
    }
}

#[cfg(test)]
#[path = "mr_tests.rs"]
mod tests;
