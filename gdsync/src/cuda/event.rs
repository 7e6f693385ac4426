//! Timing events: where a stream's time goes, measured on the GPU.

use super::{check, Cuda, CudaStream};
use crate::Result;
use cudarc::driver::sys;

/// A CUDA event with timing: record it on a stream, then read the GPU time between two
/// recorded events once both have passed.
pub struct TimingEvent {
    raw: sys::CUevent,
    ordinal: i32,
}

// SAFETY: CUDA events may be used from any thread once their context is bound (done per call).
unsafe impl Send for TimingEvent {}

impl std::fmt::Debug for TimingEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimingEvent").finish_non_exhaustive()
    }
}

impl TimingEvent {
    /// A new event on GPU `ordinal`.
    pub fn new(ordinal: i32) -> Result<Self> {
        Cuda::get()?.bind(ordinal)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: creates an event into a local.
        check(
            unsafe { sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
            "cuEventCreate",
        )?;
        Ok(Self { raw, ordinal })
    }

    /// Records the event on `stream`, behind everything enqueued there so far.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        Cuda::get()?.bind(self.ordinal)?;
        // SAFETY: our event, a live stream of the same GPU.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw()) },
            "cuEventRecord",
        )
    }

    /// Milliseconds of GPU time from `start` to this event (both recorded; waits for this
    /// one to pass).
    pub fn elapsed_ms(&self, start: &TimingEvent) -> Result<f32> {
        Cuda::get()?.bind(self.ordinal)?;
        let mut ms = 0f32;
        // SAFETY: our events; the result goes into a local.
        unsafe {
            check(sys::cuEventSynchronize(self.raw), "cuEventSynchronize")?;
            check(
                sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw),
                "cuEventElapsedTime",
            )?;
        }
        Ok(ms)
    }
}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        if Cuda::get().and_then(|c| c.bind(self.ordinal)).is_ok() {
            // SAFETY: our event, destroyed once.
            unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}
