//! Memory regions: host memory, or GPU memory of a GPU the device's CUDA handle reaches (told
//! apart through unified addressing), registered until deregistered.

use crate::args;
use crate::device::gdasync_pd;
use crate::handle::{self, handle_impl};
use crate::status::{guard, Fail, GDASYNC_OK};
use gdsync::{Access, MemoryRegion};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A registered memory region. Thread-safe. The memory must stay allocated until
/// `gdasync_mr_dereg`; work still naming its keys afterwards fails with a protection error.
pub struct gdasync_mr {
    _opaque: [u8; 0],
}
/// The region, shared by calls in flight.
pub(crate) type SharedMr = Arc<MemoryRegion<'static>>;
handle_impl!(gdasync_mr, 5, SharedMr);

/// The local device may write the region (receives, read and atomic results).
pub const GDASYNC_ACCESS_LOCAL_WRITE: u32 = 1;
/// Peers may RDMA-write it (needs `GDASYNC_ACCESS_LOCAL_WRITE`).
pub const GDASYNC_ACCESS_REMOTE_WRITE: u32 = 2;
/// Peers may RDMA-read it.
pub const GDASYNC_ACCESS_REMOTE_READ: u32 = 4;
/// Peers may run atomics on it (needs `GDASYNC_ACCESS_LOCAL_WRITE`).
pub const GDASYNC_ACCESS_REMOTE_ATOMIC: u32 = 8;

/// What a region is: where, how long, its keys, and whose memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_mr_info {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Local key (scatter/gather entries).
    pub lkey: u32,
    /// Remote key (what a peer needs, with the address, to write or read it).
    pub rkey: u32,
    /// The GPU whose memory it is, or -1 for host memory.
    pub gpu: i32,
    /// Zero.
    pub reserved: u32,
}

/// Registers `length` bytes at `addr` with `access` rights (`GDASYNC_ACCESS_*`): host
/// memory, or memory of a GPU the device reaches. The memory must stay allocated until
/// `gdasync_mr_dereg`.
#[no_mangle]
pub extern "C" fn gdasync_mr_reg(
    pd: *mut gdasync_pd,
    addr: *mut c_void,
    length: usize,
    access: u32,
    out: *mut *mut gdasync_mr,
) -> c_int {
    guard("gdasync_mr_reg", || {
        args::check_ptr(out, "out")?;
        let access = Access::from_bits(access).ok_or_else(|| {
            Fail::invalid(format!(
                "access {access:#x} has bits that are no GDASYNC_ACCESS_ flag"
            ))
        })?;
        let pd = handle::get(pd, "pd")?;
        // SAFETY: the header's contract: the memory stays allocated until gdasync_mr_dereg,
        // and what the device writes there the program reads only after its completion.
        // register_raw refuses NULL and zero lengths.
        let mr = unsafe { pd.register_raw(addr.cast(), length, access)? };
        args::write(out, handle::insert(Arc::new(mr))?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Stores what `mr` is in `info`.
#[no_mangle]
pub extern "C" fn gdasync_mr_query(mr: *mut gdasync_mr, info: *mut gdasync_mr_info) -> c_int {
    guard("gdasync_mr_query", || {
        args::check_ptr(info, "info")?;
        let mr = handle::get(mr, "mr")?;
        let i = gdasync_mr_info {
            addr: mr.addr(),
            length: mr.len() as u64,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            gpu: mr.gpu().unwrap_or(-1),
            reserved: 0,
        };
        args::write(info, i, "info")?;
        Ok(GDASYNC_OK)
    })
}

/// Deregisters `mr`: the device no longer touches the memory.
#[no_mangle]
pub extern "C" fn gdasync_mr_dereg(mr: *mut gdasync_mr) -> c_int {
    guard("gdasync_mr_dereg", || {
        handle::remove(mr, "mr")?;
        Ok(GDASYNC_OK)
    })
}
