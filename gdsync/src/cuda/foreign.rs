//! Memory another driver owns, made reachable by GPUs: pages libmlx5 allocated (rings,
//! doorbell records) and the HCA's doorbell (UAR) page, registered with `cuMemHostRegister`
//! once per page range however many queues share it; and a GPU buffer exported as a dma-buf
//! for `ibv_reg_dmabuf_mr`.

use super::{check, sys, Cuda};
use crate::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};

/// Registrations by first address: (length, holders). Queues share pages (libmlx5 packs
/// doorbell records of several queues into one page, and hands out several doorbell registers
/// of one UAR page), and CUDA refuses to register a range twice.
static REGISTERED: Mutex<Option<HashMap<u64, (usize, usize)>>> = Mutex::new(None);

/// Registers `len` bytes at the page-aligned `addr` for every GPU (PORTABLE | DEVICEMAP, and
/// IOMEMORY for a device's register page), or counts one more holder of the same range.
///
/// # Safety
/// The range must stay mapped until the matching [`unregister_foreign`].
pub(crate) unsafe fn register_foreign(c: &Cuda, addr: u64, len: usize, io: bool) -> Result<()> {
    let mut reg = REGISTERED.lock();
    let reg = reg.get_or_insert_with(HashMap::new);
    if let Some((l, n)) = reg.get_mut(&addr) {
        if *l == len {
            *n += 1;
            return Ok(());
        }
    }
    c.bind(0)?;
    let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    if io {
        flags |= sys::CU_MEMHOSTREGISTER_IOMEMORY;
    }
    // SAFETY: the caller guarantees the range stays mapped while registered.
    check(
        unsafe { sys::cuMemHostRegister_v2(addr as *mut _, len, flags) },
        "cuMemHostRegister",
    )?;
    reg.insert(addr, (len, 1));
    Ok(())
}

/// Drops one holder of a [`register_foreign`] range; the last unregisters it.
pub(crate) fn unregister_foreign(c: &Cuda, addr: u64) {
    let mut reg = REGISTERED.lock();
    let Some(reg) = reg.as_mut() else { return };
    let Some((_, n)) = reg.get_mut(&addr) else {
        return;
    };
    *n -= 1;
    if *n == 0 {
        reg.remove(&addr);
        c.unregister_host(addr as *mut u8);
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
