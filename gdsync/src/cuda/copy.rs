//! Copies between host memory and GPU memory, through a GPU's primary context ([`GpuCtx`]) and
//! the calling thread's copy lane (its own stream and bounce), each waited for at most
//! [`COPY_TIMEOUT`]: what memory regions and the soft device's DMA use.

use super::{failed, Cuda};
use crate::Result;
use cudarc::driver::result;
use cudarc::driver::sys;
use std::cell::RefCell;
use std::time::{Duration, Instant};

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

    /// Makes this context the calling thread's current one.
    pub(super) fn bind(&self) -> Result<()> {
        super::bind_context(self.ordinal, self.ctx)
    }

    /// Copies host bytes to device address `dst`, through the thread's copy lane (its pinned
    /// bounce and stream), waiting for the copy at most [`COPY_TIMEOUT`].
    pub(crate) fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        for (k, part) in src.chunks(LANE_BYTES).enumerate() {
            let at = dst + (k * LANE_BYTES) as u64;
            let finish = |_: &CopyLane| {};
            self.on_copy_lane(part.len(), "host-to-GPU", finish, |lane| {
                lane.bounce_mut(part.len()).copy_from_slice(part);
                // SAFETY: the caller checked that at..at+len lies in a live device region; the
                // source is the lane's bounce, which is never freed while a copy from
                // it may still run (an abandoned lane is leaked).
                unsafe { result::memcpy_htod_async(at, lane.bounce(part.len()), lane.stream()) }
                    .map_err(failed("cuMemcpyHtoDAsync"))
            })?;
        }
        Ok(())
    }

    /// Copies from device address `src` into host bytes, through the thread's copy lane,
    /// waiting for the copy at most [`COPY_TIMEOUT`].
    pub(crate) fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        for (k, part) in dst.chunks_mut(LANE_BYTES).enumerate() {
            let from = src + (k * LANE_BYTES) as u64;
            let n = part.len();
            let finish = |lane: &CopyLane| part.copy_from_slice(lane.bounce(n));
            self.on_copy_lane(n, "GPU-to-host", finish, |lane| {
                let stream = lane.stream();
                // SAFETY: as copy_htod; the target is the lane's bounce.
                unsafe { result::memcpy_dtoh_async(lane.bounce_mut(n), from, stream) }
                    .map_err(failed("cuMemcpyDtoHAsync"))
            })?;
        }
        Ok(())
    }

    /// Runs `copy` (which enqueues on the lane's stream) on this thread's lane for this GPU and
    /// waits for it; a copy still running after [`COPY_TIMEOUT`] abandons the lane (leaked,
    /// so that the late copy lands in memory nobody reuses) and fails with
    /// [`Error::GpuCopyStalled`](crate::Error::GpuCopyStalled). `finish` runs on the lane
    /// after the copy (to take bytes out of its bounce); nothing runs when `len` is 0.
    fn on_copy_lane(
        &self,
        len: usize,
        direction: &'static str,
        finish: impl FnOnce(&CopyLane),
        copy: impl FnOnce(&mut CopyLane) -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        LANES.with(|lanes| {
            let mut lanes = lanes.borrow_mut();
            let i = lane_index(&mut lanes, self.ordinal)?;
            let lane = &mut lanes[i];
            copy(lane)?;
            let raw = lane.stream();
            match wait_bounded(COPY_TIMEOUT, || stream_done(raw)) {
                Ok(()) => {
                    finish(lane);
                    Ok(())
                }
                Err(Err(e)) => Err(e),
                Err(Ok(waited)) => {
                    std::mem::forget(lanes.swap_remove(i));
                    let e = crate::Error::GpuCopyStalled {
                        ordinal: self.ordinal,
                        direction,
                        waited_ms: waited.as_millis() as u64,
                    };
                    tracing::error!("{e}");
                    Err(e)
                }
            }
        })
    }
}

/// How long the soft device waits for one of its copies to or from GPU memory before it gives
/// the copy up (a fault ends within 2 s with an error naming it, never as a hang).
pub(crate) const COPY_TIMEOUT: Duration = Duration::from_secs(2);

/// The most bytes one lane's bounce holds (larger copies go in parts of this size).
const LANE_BYTES: usize = 1 << 20;

thread_local!(static LANES: RefCell<Vec<CopyLane>> = const { RefCell::new(Vec::new()) });

/// Where the thread's lane for GPU `ordinal` (whose context is bound) is in `lanes`, made if
/// it has none (a stream that lives as long as the thread: the driver reclaims it at exit).
fn lane_index(lanes: &mut Vec<CopyLane>, ordinal: i32) -> Result<usize> {
    if let Some(i) = lanes.iter().position(|l| l.ordinal == ordinal) {
        return Ok(i);
    }
    lanes.push(CopyLane::new(ordinal)?);
    Ok(lanes.len() - 1)
}

/// A thread's way to one GPU for the soft device's copies: a non-blocking stream of its own
/// (not the legacy default stream) and a bounce the copies go through, so that a copy given up
/// after [`COPY_TIMEOUT`] can never land in the caller's memory later. The bounce is ordinary
/// memory, made at the lane's first copy and kept: allocating or freeing pinned memory is an implicit synchronisation of
/// the GPU, which would wait forever for a program's stream that waits for this very copy.
/// (A copy into ordinary memory returns from the driver only once done, so a GPU-to-host copy
/// stuck in the GPU's queue is bounded only where the driver's call returns.)
struct CopyLane {
    ordinal: i32,
    stream: usize,
    bounce: Vec<u8>,
}

impl CopyLane {
    /// A lane on GPU `ordinal` (whose context is bound).
    fn new(ordinal: i32) -> Result<Self> {
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(failed("cuStreamCreate"))?;
        Ok(Self {
            ordinal,
            stream: raw as usize,
            bounce: Vec::new(),
        })
    }

    fn stream(&self) -> sys::CUstream {
        self.stream as sys::CUstream
    }

    /// The bounce's first `len` bytes (`len` ≤ [`LANE_BYTES`]: callers copy in parts).
    fn bounce(&self, len: usize) -> &[u8] {
        &self.bounce[..len]
    }

    /// The same, to fill or copy into (made at the first call); only between copies (the
    /// lane's previous copy finished, or the lane was abandoned and this is a new one).
    fn bounce_mut(&mut self, len: usize) -> &mut [u8] {
        if self.bounce.is_empty() {
            self.bounce = vec![0; LANE_BYTES];
        }
        &mut self.bounce[..len]
    }
}

/// Whether everything enqueued on `raw` has run: `Ok(true)` done, `Ok(false)` still running.
fn stream_done(raw: sys::CUstream) -> Result<bool> {
    // SAFETY: the query has no side effects (`result` has no wrapper for it).
    match unsafe { sys::cuStreamQuery(raw) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => super::check(r, "cuStreamQuery").map(|()| false),
    }
}

/// Polls `done` until it says yes (`Ok(())`), fails (`Err(Err(e))`), or `timeout` passes
/// (`Err(Ok(waited))`). Spins briefly, then yields: a copy takes microseconds, a stall seconds.
fn wait_bounded(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> std::result::Result<(), Result<Duration>> {
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Err(e)),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Ok(waited));
        }
        looks += 1;
        if looks < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The calling thread's own stream on GPU `ordinal` (whose context is bound): its copy lane's,
/// a non-blocking stream, not the legacy default stream.
pub(super) fn copy_stream(ordinal: i32) -> Result<sys::CUstream> {
    LANES.with(|lanes| {
        let mut lanes = lanes.borrow_mut();
        let i = lane_index(&mut lanes, ordinal)?;
        Ok(lanes[i].stream())
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_that_finishes_is_waited_for() {
        let mut looks = 0;
        let r = wait_bounded(Duration::from_secs(5), || {
            looks += 1;
            Ok(looks == 3)
        });
        assert!(r.is_ok());
        assert_eq!(looks, 3);
    }

    #[test]
    fn a_copy_that_never_finishes_is_given_up_after_the_timeout() {
        let limit = Duration::from_millis(30);
        match wait_bounded(limit, || Ok(false)) {
            Err(Ok(waited)) => assert!(waited >= limit && waited < Duration::from_secs(2)),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn a_failed_query_ends_the_wait_with_its_error() {
        let r = wait_bounded(Duration::from_secs(5), || {
            Err(crate::Error::NoCuda("the driver went away".into()))
        });
        match r {
            Err(Err(e)) => assert!(e.to_string().contains("went away"), "{e}"),
            other => panic!("expected the query's error, got {other:?}"),
        }
    }

    #[test]
    fn a_stalled_copy_says_what_to_do() {
        let e = crate::Error::GpuCopyStalled {
            ordinal: 0,
            direction: "host-to-GPU",
            waited_ms: 2000,
        };
        let m = e.to_string();
        for want in [
            "GPU 0",
            "2000 ms",
            "GDSYNC_STAGING=on",
            "CUDA_DEVICE_MAX_CONNECTIONS=32",
        ] {
            assert!(m.contains(want), "{m}");
        }
        assert_eq!(COPY_TIMEOUT, Duration::from_secs(2));
    }
}
