//! Copies between host memory and GPU memory, on the calling thread's own copy stream, through
//! a GPU's primary context ([`GpuCtx`]): what memory regions and the soft device's DMA use.

use super::{failed, Cuda};
use crate::Result;
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

/// One GPU's primary context, as a registered region of its memory keeps it to copy through.
/// Plain data (the soft device's region tables copy it with every lookup), valid for the
/// process's life: a handle retains the primary contexts and never releases them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GpuCtx {
    /// The GPU.
    pub ordinal: i32,
    ctx: sys::CUcontext,
}

// SAFETY: a primary context is a process-wide handle that the driver lets any thread make
// current, and it is never released.
unsafe impl Send for GpuCtx {}
// SAFETY: as above; the value is immutable.
unsafe impl Sync for GpuCtx {}

impl Cuda {
    /// GPU `ordinal`'s context, for regions of its memory.
    pub(crate) fn gpu_ctx(&self, ordinal: i32) -> Result<GpuCtx> {
        self.gpu(ordinal)?;
        Ok(GpuCtx {
            ordinal,
            ctx: self.ctxs[ordinal as usize],
        })
    }

    /// Copies host bytes to device address `dst` of GPU `ordinal` ([`GpuCtx::copy_htod`]).
    pub(crate) fn copy_htod(&self, ordinal: i32, dst: u64, src: &[u8]) -> Result<()> {
        self.gpu_ctx(ordinal)?.copy_htod(dst, src)
    }

    /// Copies from device address `src` of GPU `ordinal` ([`GpuCtx::copy_dtoh`]).
    pub(crate) fn copy_dtoh(&self, ordinal: i32, dst: &mut [u8], src: u64) -> Result<()> {
        self.gpu_ctx(ordinal)?.copy_dtoh(dst, src)
    }
}

impl GpuCtx {
    /// A context that no GPU backs, for tests of tables that must refuse GPU regions
    /// (copying through it fails).
    #[cfg(test)]
    pub(crate) fn unbacked(ordinal: i32) -> Self {
        Self {
            ordinal,
            ctx: std::ptr::null_mut(),
        }
    }

    /// Copies host bytes to device address `dst` (on the thread's copy stream, waiting for the
    /// copy).
    pub(crate) fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.on_copy_stream(src.is_empty(), "cuMemcpyHtoDAsync", |s| {
            // SAFETY: the caller checked that dst..dst+len lies in a live device region; src
            // is a slice that outlives the copy (on_copy_stream synchronises).
            unsafe { result::memcpy_htod_async(dst, src, s) }
        })
    }

    /// Copies from device address `src` into host bytes (on the thread's copy stream, waiting
    /// for the copy).
    pub(crate) fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.on_copy_stream(dst.is_empty(), "cuMemcpyDtoHAsync", |s| {
            // SAFETY: as copy_htod.
            unsafe { result::memcpy_dtoh_async(dst, src, s) }
        })
    }

    /// Enqueues `copy` (the driver call `call`) on the thread's copy stream of this GPU and
    /// waits for it; nothing when `empty`.
    fn on_copy_stream(
        &self,
        empty: bool,
        call: &'static str,
        copy: impl FnOnce(sys::CUstream) -> std::result::Result<(), DriverError>,
    ) -> Result<()> {
        if empty {
            return Ok(());
        }
        super::bind_context(self.ordinal, self.ctx)?;
        let s = copy_stream(self.ordinal)?;
        copy(s).map_err(failed(call))?;
        // SAFETY: the thread's own stream.
        unsafe { result::stream::synchronize(s) }.map_err(failed("cuStreamSynchronize"))
    }
}

/// The calling thread's own stream on GPU `ordinal` (whose context is bound), for the soft
/// device's data moves: the engine copies on a non-blocking stream of its own, not the legacy
/// default stream.
pub(super) fn copy_stream(ordinal: i32) -> Result<sys::CUstream> {
    thread_local!(static STREAMS: std::cell::RefCell<Vec<(i32, usize)>> = const { std::cell::RefCell::new(Vec::new()) });
    if let Some(s) = STREAMS.with(|v| {
        v.borrow()
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, s)| *s)
    }) {
        return Ok(s as sys::CUstream);
    }
    // Never destroyed: it lives as long as the thread, and the driver reclaims it at exit.
    let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(failed("cuStreamCreate"))?;
    STREAMS.with(|v| v.borrow_mut().push((ordinal, raw as usize)));
    Ok(raw)
}

/// Copies `dst.len()` bytes at `addr` into `dst`: host memory, or memory of the GPU of `gpu`.
/// Returns whether the copy succeeded.
///
/// # Safety
/// For host memory, the range must be readable: inside a registered region, whose owner lent
/// it to the device for the registration's lifetime.
pub(crate) unsafe fn read_region(gpu: Option<GpuCtx>, addr: u64, dst: &mut [u8]) -> bool {
    match gpu {
        Some(g) => g.copy_dtoh(dst, addr).is_ok(),
        None => {
            // SAFETY: the caller's contract.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
            };
            true
        }
    }
}
