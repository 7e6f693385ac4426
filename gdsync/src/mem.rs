//! Ring memory: page-aligned, zeroed allocations for the rings, doorbell records and doorbell
//! words that the device and the executors share, or the pages of such memory another driver
//! placed (libmlx5's rings under the emulated kernel driver). All raw access to it lives here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// The page size of the running system (`sysconf(_SC_PAGESIZE)`, read once): every ring
/// allocation is aligned to it, and ranges registered with CUDA or exported as dma-bufs are
/// widened to it (4 KiB on x86-64; 64 KiB on many AArch64 kernels, Grace-Hopper's among them).
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n)
            .ok()
            .filter(|n| n.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The whole pages of size `page` (a power of two) around `len` bytes at `addr`: their first
/// address and their length.
pub(crate) fn page_span(addr: u64, len: u64, page: u64) -> (u64, u64) {
    let start = addr & !(page - 1);
    let end = addr.saturating_add(len.max(1)).next_multiple_of(page);
    (start, end - start)
}

/// A value on its own cache lines, so that writers of its neighbours do not steal it.
#[repr(align(128))]
#[derive(Default, Debug)]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What pins host memory and maps it for GPUs (a CUDA handle): ring memory is told which, by
/// whoever creates it, and keeps it to undo the registration. Registering answers the GPUs'
/// address of the memory (`cuMemHostGetDevicePointer`), which is not always its host address
/// (a device's register page mapped as I/O memory): what a GPU executes uses that one.
pub(crate) trait GpuMapper: Send + Sync {
    /// Whether there is a GPU to map for.
    fn has_gpus(&self) -> bool;
    /// Pins and maps `[ptr, ptr+len)` for every GPU; returns the GPUs' address of `ptr`.
    ///
    /// # Safety
    /// The range is allocated, and stays so until [`GpuMapper::unregister`].
    unsafe fn register(&self, ptr: *mut u8, len: usize) -> crate::Result<u64>;
    /// Undoes [`GpuMapper::register`].
    fn unregister(&self, ptr: *mut u8);
    /// Maps someone else's pages (IOMEMORY for a device's register page); pages several
    /// holders share are registered once. Returns the GPUs' address of `addr`.
    ///
    /// # Safety
    /// The range stays mapped until the matching [`GpuMapper::unregister_foreign`].
    unsafe fn register_foreign(&self, addr: u64, len: usize, io: bool) -> crate::Result<u64>;
    /// Drops one holder of a [`GpuMapper::register_foreign`] range.
    fn unregister_foreign(&self, addr: u64);
}

/// What keeps someone else's pages allocated (an op list's keep-alive handle is the same
/// type: memory names no op list, op lists name memory).
type Holder = Arc<dyn std::any::Any + Send + Sync>;

/// A zeroed, page-aligned allocation that lives as long as its longest holder (queues, the
/// engine, and any op list that points into it hold an `Arc`).
pub(crate) struct RingMem {
    ptr: *mut u8,
    len: usize,
    /// The CUDA handle this was registered with (pinned, mapped for GPUs), if its creator
    /// asked for that.
    cuda: Option<Arc<dyn GpuMapper>>,
    /// Allocated here (freed on drop), or pages someone else owns ([`RingMem::foreign`]).
    owned: bool,
    /// The handle someone else's pages were registered with ([`RingMem::map_for_gpus`]).
    foreign_cuda: Option<Arc<dyn GpuMapper>>,
    /// The GPUs' address of byte 0, once registered (see [`RingMem::gpu_addr`]).
    gpu_base: OnceLock<u64>,
    /// What keeps someone else's pages allocated while this lives ([`RingMem::held`]).
    _owner: Option<Holder>,
}

// SAFETY: RingMem is a plain allocation; every access goes through the atomic or
// bounds-checked copy methods below, which are safe to call from any thread.
unsafe impl Send for RingMem {}
// SAFETY: as above; concurrent readers and writers use atomics or disjoint regions.
unsafe impl Sync for RingMem {}

impl RingMem {
    /// Allocates `len` zeroed bytes (rounded up to a page), pinned and mapped for the GPUs of
    /// `gpus` where the caller gives a handle (streams and kernels write doorbells and wait on
    /// CQEs here), plain host memory where it gives none.
    pub(crate) fn new<G: GpuMapper + 'static>(len: usize, gpus: Option<&Arc<G>>) -> Self {
        let len = len.max(1).next_multiple_of(page_size());
        let layout = Layout::from_size_align(len, page_size()).expect("ring layout");
        // SAFETY: layout has a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let gpu_base = OnceLock::new();
        let cuda = gpus.filter(|c| c.has_gpus()).and_then(|c| {
            // SAFETY: the allocation lives until Drop, which unregisters it first.
            match unsafe { c.register(ptr, len) } {
                Ok(at) => {
                    let _ = gpu_base.set(at);
                    Some(c.clone() as Arc<dyn GpuMapper>)
                }
                Err(e) => {
                    tracing::warn!("ring memory stays unregistered (GPUs cannot reach it): {e}");
                    None
                }
            }
        });
        Self {
            ptr,
            len,
            cuda,
            owned: true,
            foreign_cuda: None,
            gpu_base,
            _owner: None,
        }
    }

    /// `len` zeroed bytes (rounded up to a page) of plain host memory, which no GPU reaches.
    pub(crate) fn host(len: usize) -> Self {
        Self::new::<NoGpus>(len, None)
    }

    /// The whole pages around `len` bytes at `addr`, which another driver allocated (as a
    /// kernel driver maps the rings a user library placed), and the offset of `addr` in them.
    /// Nothing is allocated, registered or freed.
    ///
    /// # Safety
    /// The pages must stay mapped, readable and writable, and be accessed by their owner only
    /// through the ring protocol (doorbells, owner bits), as long as the RingMem lives.
    pub(crate) unsafe fn foreign(addr: u64, len: usize) -> (Self, usize) {
        let (start, span) = page_span(addr, len as u64, page_size() as u64);
        let mem = Self {
            ptr: start as *mut u8,
            len: span as usize,
            cuda: None,
            owned: false,
            foreign_cuda: None,
            gpu_base: OnceLock::new(),
            _owner: None,
        };
        (mem, (addr - start) as usize)
    }

    /// As [`RingMem::foreign`], for pages a device placed itself (libmlx5's rings, doorbell
    /// records and doorbell page): `owner` (the device's object) keeps them allocated as long
    /// as this lives, so an op list that points into them outlives the queue safely.
    ///
    /// # Safety
    /// `owner` must keep the pages mapped, readable and writable while it lives.
    pub(crate) unsafe fn held(addr: u64, len: usize, owner: Holder) -> (Self, usize) {
        // SAFETY: the caller's contract, kept for as long as `owner` is held here.
        let (mut mem, off) = unsafe { Self::foreign(addr, len) };
        mem._owner = Some(owner);
        (mem, off)
    }

    /// Makes someone else's pages reachable by the GPUs of `cuda` (`cuMemHostRegister`, with
    /// IOMEMORY for a device's register page), unregistered when this is dropped. Pages
    /// several queues share are registered once.
    pub(crate) fn map_for_gpus<G: GpuMapper + 'static>(
        &mut self,
        cuda: &Arc<G>,
        io: bool,
    ) -> crate::Result<()> {
        if self.owned || self.foreign_cuda.is_some() {
            return Ok(());
        }
        // SAFETY: the pages stay mapped while this lives (the contract of `held`), and Drop
        // unregisters them before the owner is released.
        let at = unsafe { cuda.register_foreign(self.ptr as u64, self.len, io)? };
        let _ = self.gpu_base.set(at);
        self.foreign_cuda = Some(cuda.clone() as Arc<dyn GpuMapper>);
        Ok(())
    }

    /// Whether GPUs can reach this memory (registered with CUDA).
    pub(crate) fn gpu_mapped(&self) -> bool {
        self.cuda.is_some() || self.foreign_cuda.is_some()
    }

    /// Host address of byte `off`: what the CPU (and CPU executors) store to and load from.
    pub(crate) fn addr(&self, off: usize) -> u64 {
        assert!(off <= self.len, "ring offset {off} out of {}", self.len);
        self.ptr as u64 + off as u64
    }

    /// The GPUs' address of byte `off` (`cuMemHostGetDevicePointer` of the registration):
    /// what stream memory operations and kernels use. Memory no GPU maps answers its host
    /// address (no GPU executes on it: see [`RingMem::gpu_mapped`]).
    pub(crate) fn gpu_addr(&self, off: usize) -> u64 {
        let host = self.addr(off);
        self.gpu_base.get().map_or(host, |b| b + off as u64)
    }

    /// [`RingMem::gpu_addr`] of the host address `host`, if a word there lies in this memory
    /// (its end is not: the next allocation may begin there).
    pub(crate) fn gpu_addr_of(&self, host: u64) -> Option<u64> {
        let off = host.checked_sub(self.ptr as u64)?;
        (off < self.len as u64).then(|| self.gpu_addr(off as usize))
    }

    /// Takes `base` as the GPUs' address of this memory, as a registration would answer
    /// (tests: a fake mapper without a GPU). No effect once an address is known.
    #[cfg(test)]
    pub(crate) fn fake_gpu_map(&self, base: u64) {
        let _ = self.gpu_base.set(base);
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, off: usize, len: usize, align: usize) {
        assert!(
            crate::bounds::fits(off, len, self.len) && off % align == 0,
            "ring access {off}+{len} out of {}",
            self.len
        );
    }

    pub(crate) fn u8(&self, off: usize) -> &AtomicU8 {
        self.check(off, 1, 1);
        // SAFETY: in bounds (checked), AtomicU8 has alignment 1, the memory lives as long as self.
        unsafe { &*(self.ptr.add(off) as *const AtomicU8) }
    }

    pub(crate) fn u32(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and 4-aligned (checked; the base is page-aligned).
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    pub(crate) fn u64(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds and 8-aligned (checked; the base is page-aligned).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// Copies `src` into the ring at `off`. The caller's protocol (doorbells, owner bits)
    /// orders these plain stores against the other side's reads.
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len(), 1);
        // SAFETY: in bounds (checked); src cannot overlap ring memory handed out only as atomics.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
    }

    /// Hints the CPU to fetch the cache line at `off` (e.g. the next WQE slot, so its
    /// transfer overlaps the doorbell's). Not a memory access: it cannot race or fault.
    pub(crate) fn prefetch(&self, off: usize) {
        self.check(off, 1, 1);
        prefetch_line::<false>(self.ptr.wrapping_add(off));
    }

    /// Copies from the ring at `off` into `dst`, after the loads before it (the owner bit that
    /// said a device wrote these bytes: [`crate::barrier::dma_rmb`]).
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len(), 1);
        crate::barrier::dma_rmb();
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        // Releases stay in order: pages someone else owns go after the releases queued before.
        let queued_behind = self._owner.is_some() && crate::release::pending();
        if self.cuda.is_none() && self.foreign_cuda.is_none() && !queued_behind {
            if self.owned {
                // SAFETY: allocated in new() with this exact layout; nothing else points here.
                unsafe {
                    dealloc(
                        self.ptr,
                        Layout::from_size_align_unchecked(self.len, page_size()),
                    )
                }
            }
            return;
        }
        // The driver's unregister waits for the whole device: done on the release thread, so
        // a drop never waits for a stream (see `release`). The pages and whatever keeps
        // someone else's pages allocated go only after the unregister.
        let (addr, len, owned) = (self.ptr as usize, self.len, self.owned);
        let (cuda, foreign, owner) = (
            self.cuda.take(),
            self.foreign_cuda.take(),
            self._owner.take(),
        );
        crate::release::later(move || {
            if let Some(c) = foreign {
                c.unregister_foreign(addr as u64);
            }
            if !owned {
                drop(owner);
                return;
            }
            if let Some(c) = cuda {
                c.unregister(addr as *mut u8);
            }
            // SAFETY: allocated in new() with this exact layout; the last holder is gone and
            // the driver no longer maps it.
            unsafe {
                dealloc(
                    addr as *mut u8,
                    Layout::from_size_align_unchecked(len, page_size()),
                )
            }
        });
    }
}

/// No GPU: the mapper of [`RingMem::host`] memory (never called).
enum NoGpus {}

impl GpuMapper for NoGpus {
    fn has_gpus(&self) -> bool {
        match *self {}
    }
    unsafe fn register(&self, _: *mut u8, _: usize) -> crate::Result<u64> {
        match *self {}
    }
    fn unregister(&self, _: *mut u8) {
        match *self {}
    }
    unsafe fn register_foreign(&self, _: u64, _: usize, _: bool) -> crate::Result<u64> {
        match *self {}
    }
    fn unregister_foreign(&self, _: u64) {
        match *self {}
    }
}

/// A hint that the cache line at `p` will be read, or written (`WRITE`), soon. Not a memory
/// access: it cannot race or fault, whatever the address.
#[inline]
pub(crate) fn prefetch_line<const WRITE: bool>(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint with no architectural effect, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        if WRITE {
            _mm_prefetch::<_MM_HINT_ET0>(p as *const i8)
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The ring memory among `kept` that `host` lies in, and the GPUs' address of `host` there.
fn ring_in(kept: &[Holder], host: u64) -> Option<(&RingMem, u64)> {
    kept.iter().find_map(|k| {
        let r = k.downcast_ref::<RingMem>()?;
        Some((r, r.gpu_addr_of(host)?))
    })
}

/// Whether `host` lies in ring memory among `kept` that is mapped for the GPUs (so a GPU may
/// dereference [`gpu_addr_in`]'s answer for it).
pub(crate) fn gpu_mapped_in(kept: &[Holder], host: u64) -> bool {
    ring_in(kept, host).is_some_and(|(r, _)| r.gpu_mapped())
}

/// The address a GPU uses for the host address `host` of an op whose list keeps `kept`: the
/// GPUs' address of the ring memory it lies in ([`RingMem::gpu_addr`]), else `host` itself
/// (memory an op names without the list keeping it, device memory).
pub(crate) fn gpu_addr_in(kept: &[Holder], host: u64) -> u64 {
    ring_in(kept, host).map_or(host, |(_, a)| a)
}

/// Wraps a ring of `cnt` entries of `size` bytes at `base` in a RingMem: offset of entry `i`.
pub(crate) fn slot_off(base: usize, i: u64, cnt: u32, size: usize) -> usize {
    base + (i & (cnt as u64 - 1)) as usize * size
}

/// Acquire load of a big-endian u32 field at `off`, returned in host order.
pub(crate) fn load_be32(mem: &RingMem, off: usize) -> u32 {
    u32::from_be(mem.u32(off).load(Ordering::Acquire))
}

/// Orders earlier stores before a store to a write-combining doorbell page, or pushes such a
/// store out of the CPU's write-combining buffer (libmlx5's `mmio_wc_start` and
/// `mmio_flush_writes`): [`crate::barrier::mmio_flush_writes`], under the name its callers
/// know.
#[inline(always)]
pub(crate) fn wc_fence() {
    crate::barrier::mmio_flush_writes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_pages_keep_their_owner_until_the_last_holder_goes() {
        let page = page_size();
        // The owner stands for libmlx5's object; its pages are an allocation of ours here.
        let pages = Arc::new(RingMem::host(2 * page));
        let owner: crate::ops::KeepAlive = pages.clone();
        // SAFETY: `owner` keeps the pages allocated while the wrapper lives.
        let (held, off) = unsafe { RingMem::held(pages.addr(page + 0x40), 8, owner) };
        assert_eq!(
            (off, held.len()),
            (0x40, page),
            "the whole page around the record"
        );
        assert_eq!(held.addr(off), pages.addr(page + 0x40));
        assert_eq!(Arc::strong_count(&pages), 2);
        held.u32(off).store(7, Ordering::Release);
        assert_eq!(pages.u32(page + 0x40).load(Ordering::Acquire), 7);
        drop(held);
        assert_eq!(Arc::strong_count(&pages), 1, "released with the wrapper");
        // Not freed by the wrapper: still ours.
        pages.u32(page).store(1, Ordering::Relaxed);
    }

    #[test]
    fn rings_are_aligned_to_the_page_size_of_the_running_system() {
        // SAFETY: sysconf has no preconditions.
        let sys = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), sys);
        let ring = RingMem::host(100);
        assert_eq!((ring.addr(0) % sys as u64, ring.len()), (0, sys));
    }

    #[test]
    fn page_spans_cover_whole_pages_of_any_size() {
        // 4 KiB pages (x86-64), and 64 KiB pages (many AArch64 kernels), where a range that
        // is 4 KiB-aligned is not page-aligned.
        assert_eq!(page_span(0x1_2345, 8, 4096), (0x1_2000, 4096));
        assert_eq!(page_span(0x1_3000, 0x1000, 4096), (0x1_3000, 0x1000));
        assert_eq!(page_span(0x1_3000, 0x1000, 65536), (0x1_0000, 0x1_0000));
        assert_eq!(page_span(0x1_fff8, 16, 65536), (0x1_0000, 0x2_0000));
        assert_eq!(page_span(0x2_0000, 0, 65536), (0x2_0000, 0x1_0000));
    }
}
