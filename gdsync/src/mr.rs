//! Registration: protection domains and memory regions.

use crate::bounds;
use crate::device::DeviceShared;
use crate::wr::Sge;
use crate::{Error, Result};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// One registered region, as the device's translation table holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub pd: u32,
    /// Device memory of this GPU, moved through the CUDA driver; `None`: host memory.
    pub gpu: Option<i32>,
}

impl MrEntry {
    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| self.addr.checked_add(self.len).is_some_and(|e| end <= e))
    }

    /// The device's DMA write: copies `src` to `addr`, which must lie inside the region.
    /// Callers hold the table (or the engine's copy of it), so the region is registered.
    pub fn write(&self, addr: u64, src: &[u8]) -> bool {
        if !self.covers(addr, src.len() as u64) {
            return false;
        }
        match self.gpu {
            Some(ordinal) => crate::cuda::copy_htod(ordinal, addr, src).is_ok(),
            None => {
                // SAFETY: inside a registered host region (checked above), whose owner lent it
                // to the device for the registration's lifetime.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
                true
            }
        }
    }

    /// The device's DMA read from `addr` into `dst`.
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        if !self.covers(addr, dst.len() as u64) {
            return false;
        }
        match self.gpu {
            Some(ordinal) => crate::cuda::copy_dtoh(ordinal, dst, addr).is_ok(),
            None => {
                // SAFETY: as in write().
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
                };
                true
            }
        }
    }

    /// An 8-byte atomic at `addr` (8-aligned, inside the region): stores `f(old)`, returns
    /// `old`. Atomic against host CPUs; on device memory it is a read and a write through
    /// the driver, not atomic against GPU kernels.
    pub fn atomic(&self, addr: u64, f: impl Fn(u64) -> u64) -> Option<u64> {
        if addr % 8 != 0 || !self.covers(addr, 8) {
            return None;
        }
        match self.gpu {
            Some(_) => {
                let mut b = [0u8; 8];
                self.read(addr, &mut b).then_some(())?;
                let old = u64::from_ne_bytes(b);
                self.write(addr, &f(old).to_ne_bytes()).then_some(old)
            }
            None => {
                // SAFETY: 8 aligned bytes inside a registered host region (checked above).
                let w = unsafe { &*(addr as *const AtomicU64) };
                let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(f(v)));
                Some(r.unwrap_or_else(|v| v))
            }
        }
    }
}

/// A value on its own cache line, so writers of neighbours do not steal it.
#[repr(align(64))]
#[derive(Default)]
struct Padded<T>(T);

/// The device's key → region table (the model of the HCA's memory translation table).
///
/// The engine works from its own copy ([`MrCache`]) so that its hot path writes no cache
/// line that posting threads also write. Every change bumps `version`; a deregistration
/// then waits until the engine has taken a copy at least that new (`seen`), which it does
/// only between polling rounds, so it can no longer touch the removed region.
#[derive(Default)]
pub(crate) struct MrTable {
    inner: RwLock<Slots>,
    version: Padded<AtomicU64>,
    seen: Padded<AtomicU64>,
    engine: Mutex<Option<std::thread::Thread>>,
    /// Registered regions in GPU memory: only the engine's own thread copies to and from
    /// them (a copy binds a CUDA context to the thread that makes it).
    gpu_regions: AtomicU64,
}

/// The engine's private copy of the table.
#[derive(Default)]
pub(crate) struct MrCache {
    version: u64,
    pub slots: Arc<Slots>,
}

impl MrCache {
    /// Refreshes the copy if the table changed; cheap (one load) when it did not.
    pub fn sync(&mut self, t: &MrTable) {
        let v = t.version.0.load(Ordering::Acquire);
        if v != self.version {
            self.slots = Arc::new(t.inner.read().clone());
            self.version = v;
            t.seen.0.store(v, Ordering::Release);
        }
    }
}

#[derive(Default, Clone)]
pub(crate) struct Slots {
    slots: Vec<(u8, Option<MrEntry>)>,
    free: Vec<usize>,
}

impl Slots {
    /// The region `key` names, if it is registered.
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        let (tag, e) = self.slots.get((key >> 8) as usize)?;
        if *tag != key as u8 {
            return None;
        }
        e.as_ref()
    }
}

impl MrTable {
    fn insert(&self, e: MrEntry) -> u32 {
        let mut t = self.inner.write();
        let idx = match t.free.pop() {
            Some(i) => i,
            None => {
                // Index 0 and 1 are never used, so no key is 0 or the terminator lkey 0x100.
                if t.slots.len() < 2 {
                    t.slots.resize(2, (0, None));
                }
                t.slots.push((0, None));
                t.slots.len() - 1
            }
        };
        let slot = &mut t.slots[idx];
        // A fresh, nonzero tag per use of the slot, so stale keys do not alias new regions.
        slot.0 = match slot.0.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        slot.1 = Some(e);
        if e.gpu.is_some() {
            self.gpu_regions.fetch_add(1, Ordering::Relaxed);
        }
        let key = ((idx as u32) << 8) | slot.0 as u32;
        self.version.0.fetch_add(1, Ordering::AcqRel);
        key
    }

    fn remove(&self, key: u32) {
        let v = {
            let mut t = self.inner.write();
            let idx = (key >> 8) as usize;
            if !t
                .slots
                .get(idx)
                .is_some_and(|s| s.0 == key as u8 && s.1.is_some())
            {
                return;
            }
            if t.slots[idx].1.take().is_some_and(|e| e.gpu.is_some()) {
                self.gpu_regions.fetch_sub(1, Ordering::Relaxed);
            }
            t.free.push(idx);
            self.version.0.fetch_add(1, Ordering::AcqRel) + 1
        };
        // Wait until the engine works from a copy without the region.
        let mut spins = 0u32;
        while self.seen.0.load(Ordering::Acquire) < v {
            let Some(engine) = self.engine.lock().clone() else {
                return;
            };
            engine.unpark();
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Whether a region in GPU memory is registered.
    pub fn has_gpu_regions(&self) -> bool {
        self.gpu_regions.load(Ordering::Relaxed) != 0
    }

    /// Called by the engine thread when it starts (`Some`) and stops (`None`): while no
    /// engine runs, deregistration has nobody to wait for.
    pub fn set_engine(&self, t: Option<std::thread::Thread>) {
        *self.engine.lock() = t;
    }

    /// Shared read access (posting threads; the engine uses its [`MrCache`]).
    pub fn read(&self) -> RwLockReadGuard<'_, Slots> {
        self.inner.read()
    }
}

/// A protection domain: QPs only reach memory regions of their own domain.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) id: u32,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.id)
            .finish()
    }
}

impl ProtectionDomain {
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

    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay allocated, and not be accessed other than through the region or
    /// the device, for as long as the returned region exists.
    pub unsafe fn register_raw<'buf>(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
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
        let gpu = match crate::cuda::MemoryKind::of(ptr as u64) {
            crate::cuda::MemoryKind::Device { ordinal } => Some(ordinal),
            _ => None,
        };
        let e = MrEntry {
            addr: ptr as u64,
            len: len as u64,
            access,
            pd: self.id,
            gpu,
        };
        let key = self.dev.mrs.insert(e);
        let entry = e;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            key,
            ptr,
            len,
            access,
            gpu: entry.gpu,
            _buf: PhantomData,
        })
    }

    /// Registers a device buffer. Like [`register`](Self::register), the region borrows it.
    pub fn register_device<'buf>(
        &self,
        buf: &'buf crate::cuda::DeviceBuffer,
        access: Access,
    ) -> Result<MemoryRegion<'buf>> {
        // SAFETY: the borrow keeps the allocation alive for 'buf; device memory is reached
        // only through the driver.
        unsafe { self.register_raw(buf.ptr() as *mut u8, buf.len(), access) }
    }
}

/// Where in a peer's memory region an operation goes: address and rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// A peer's whole memory region, as exchanged between ranks: address, length and rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteBuf {
    /// The address `offset` bytes into the region. Not checked here: the peer's device
    /// checks every access against the region, and an address that wraps past `u64::MAX`
    /// fails there with a remote access error, as any out-of-bounds access does.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

/// A registered memory region. Dropping it deregisters: the device no longer touches the
/// memory, and work that still names its key fails with a protection or access error.
pub struct MemoryRegion<'buf> {
    dev: Arc<DeviceShared>,
    key: u32,
    ptr: *mut u8,
    len: usize,
    access: Access,
    gpu: Option<i32>,
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
        if let Some(ordinal) = self.gpu {
            return crate::cuda::copy_dtoh(ordinal, dst, self.addr() + offset as u64);
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
        if let Some(ordinal) = self.gpu {
            return crate::cuda::copy_htod(ordinal, self.addr() + offset as u64, src);
        }
        // SAFETY: in bounds (checked without overflow); see try_read_at.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) }
        Ok(())
    }
    /// The GPU whose memory this is, `None` for host memory.
    pub fn gpu(&self) -> Option<i32> {
        self.gpu
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
        // Takes the table's write lock: once this returns the engine cannot touch the memory.
        self.dev.mrs.remove(self.key);
    }
}

#[cfg(test)]
#[path = "mr_tests.rs"]
mod tests;
