//! The streams a release waits to be idle: every live [`CudaStream`](super::CudaStream) (made
//! or wrapped) is watched from its creation until it is destroyed, and [`crate::quiet`] asks
//! whether each has run everything queued on it (`cuStreamQuery`) before it gives memory back.
//! Work gdsync does not know of is not seen: a stream never wrapped, and, on a stream the
//! program wrapped, its own work after the wrapper is dropped. A release that waits for such
//! work inside the driver holds back every enqueue on gdsync's streams until it passes.

use super::GpuCtx;
use cudarc::driver::sys;
use parking_lot::Mutex;

/// Each watched stream's handle (as an address) and its GPU's context.
static STREAMS: Mutex<Vec<(usize, GpuCtx)>> = Mutex::new(Vec::new());

/// Watches stream `raw` of `ctx`'s GPU.
pub(super) fn watch(raw: sys::CUstream, ctx: GpuCtx) {
    crate::quiet::register(every_stream_idle);
    STREAMS.lock().push((raw as usize, ctx));
}

/// Stops watching stream `raw` of GPU `ordinal` (before it is destroyed; one entry of two
/// wrappers of the same stream, or of the legacy NULL stream, which every GPU has).
pub(super) fn unwatch(raw: sys::CUstream, ordinal: i32) {
    let mut s = STREAMS.lock();
    if let Some(i) = s
        .iter()
        .position(|(r, c)| *r == raw as usize && c.ordinal == ordinal)
    {
        s.swap_remove(i);
    }
}

/// Whether every watched stream has run everything queued on it. A query that fails for
/// another reason than "not ready" counts as idle: the stream's context is broken, and the
/// release will fail (and say so) rather than wait for it.
fn every_stream_idle() -> bool {
    STREAMS.lock().iter().all(|&(raw, ctx)| {
        if ctx.bind().is_err() {
            return true;
        }
        // SAFETY: a live stream (unwatched before it is destroyed, under the same lock); the
        // query has no side effects.
        let r = unsafe { sys::cuStreamQuery(raw as sys::CUstream) };
        r != sys::CUresult::CUDA_ERROR_NOT_READY
    })
}
