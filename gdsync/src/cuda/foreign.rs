//! Host memory made reachable by GPUs (the handle's side of [`GpuMapper`]): ring memory of
//! ours, and memory another driver owns (pages libmlx5 allocated, rings and doorbell records,
//! and the HCA's doorbell (UAR) page), registered with `cuMemHostRegister` once per page range
//! however many queues share it, each with the GPUs' address of it (`cuMemHostGetDevicePointer`,
//! which for I/O memory need not be the host address); and a GPU buffer exported as a dma-buf
//! for `ibv_reg_dmabuf_mr`.

use super::{check, sys, Cuda};
use crate::mem::GpuMapper;
use crate::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};

/// One registered range of someone else's pages: its length, its holders, the GPUs' address.
type Registered = (usize, usize, u64);

/// Registrations by first address. Queues share pages (libmlx5 packs doorbell records of
/// several queues into one page, and hands out several doorbell registers of one UAR page),
/// and CUDA refuses to register a range twice.
static REGISTERED: Mutex<Option<HashMap<u64, Registered>>> = Mutex::new(None);

/// The GPUs' address of registered host memory at `host` (`cuMemHostGetDevicePointer` in the
/// bound context; with unified addressing it is the same in every context).
fn device_pointer(host: u64) -> Result<u64> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: FFI; `dptr` outlives the call, which writes one pointer; flags must be 0.
    check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host as *mut _, 0) },
        "cuMemHostGetDevicePointer",
    )?;
    Ok(dptr)
}

impl Cuda {
    /// The GPUs' address of registered host memory at `host` (`cuMemHostGetDevicePointer`,
    /// in GPU 0's context): what a stream or kernel must use for it. Fails for memory that
    /// is not registered with CUDA.
    pub fn host_device_pointer(&self, host: u64) -> Result<u64> {
        self.bind(0)?;
        device_pointer(host)
    }
}

impl GpuMapper for Cuda {
    fn has_gpus(&self) -> bool {
        !self.gpus.is_empty()
    }

    /// Registers host memory as pinned and mapped for every GPU (`cuMemHostRegister` with
    /// PORTABLE | DEVICEMAP) and answers its device pointer; undone if there is none.
    unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<u64> {
        self.bind(0)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller guarantees the range.
        check(
            unsafe { sys::cuMemHostRegister_v2(ptr as *mut _, len, flags) },
            "cuMemHostRegister",
        )?;
        device_pointer(ptr as u64).inspect_err(|_| self.unregister(ptr))
    }

    fn unregister(&self, ptr: *mut u8) {
        if self.bind(0).is_ok() {
            // SAFETY: ptr was registered by register (errors are ignored on teardown).
            unsafe { sys::cuMemHostUnregister(ptr as *mut _) };
        }
    }

    /// Registers `len` bytes at the page-aligned `addr` for every GPU (PORTABLE | DEVICEMAP,
    /// and IOMEMORY for a device's register page), or counts one more holder of the same
    /// range; answers the device pointer. A range whose device pointer cannot be had is
    /// unregistered again and the call fails (a GPU must not be handed the host address).
    unsafe fn register_foreign(&self, addr: u64, len: usize, io: bool) -> Result<u64> {
        let mut reg = REGISTERED.lock();
        let reg = reg.get_or_insert_with(HashMap::new);
        if let Some((l, n, at)) = reg.get_mut(&addr) {
            if *l == len {
                *n += 1;
                return Ok(*at);
            }
        }
        self.bind(0)?;
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        if io {
            flags |= sys::CU_MEMHOSTREGISTER_IOMEMORY;
        }
        // SAFETY: the caller guarantees the range stays mapped while registered.
        check(
            unsafe { sys::cuMemHostRegister_v2(addr as *mut _, len, flags) },
            "cuMemHostRegister",
        )?;
        let at = device_pointer(addr).inspect_err(|_| self.unregister(addr as *mut u8))?;
        if at != addr {
            tracing::info!("host memory at {addr:#x} (io {io}) has device pointer {at:#x}");
        }
        reg.insert(addr, (len, 1, at));
        Ok(at)
    }

    /// Drops one holder of a [`register_foreign`](GpuMapper::register_foreign) range; the
    /// last unregisters it.
    fn unregister_foreign(&self, addr: u64) {
        let mut reg = REGISTERED.lock();
        let Some(reg) = reg.as_mut() else { return };
        let Some((_, n, _)) = reg.get_mut(&addr) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            reg.remove(&addr);
            self.unregister(addr as *mut u8);
        }
    }
}

/// A dma-buf of `len` bytes of GPU memory at `dptr` (`cuMemGetHandleForAddressRange`), for
/// `ibv_reg_dmabuf_mr`. `dptr` and `len` must be page-aligned, as the driver requires.
pub(crate) fn dma_buf(c: &Cuda, ordinal: i32, dptr: u64, len: usize) -> Result<OwnedFd> {
    c.bind(ordinal)?;
    let mut fd: i32 = -1;
    // SAFETY: FFI; `fd` outlives the call, which writes one int.
    check(
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                dptr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
        "cuMemGetHandleForAddressRange",
    )?;
    // SAFETY: the driver returned a new descriptor, owned by the caller from now on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
