//! CUDA events: points in a stream's timeline, for timing what a stream ran.

use super::{check, Cuda, CudaStream};
use crate::Result;
use cudarc::driver::sys;
use std::time::Duration;

/// A timing event on GPU `ordinal` (`cuEventCreate` with timing on). Recording it on a stream
/// marks the moment the stream reaches that point; two recorded events give the GPU time
/// between them, with the driver's ~0.5 µs resolution.
pub struct CudaEvent {
    raw: sys::CUevent,
    ordinal: i32,
}

// SAFETY: events may be used from any thread once their context is bound (done per call).
unsafe impl Send for CudaEvent {}
// SAFETY: the driver's event calls are thread-safe.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// A new timing event on GPU `ordinal`.
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

    /// Marks this point of `stream` (enqueued behind everything enqueued before).
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        Cuda::get()?.bind(self.ordinal)?;
        // SAFETY: our event and a live stream of the same GPU.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw()) },
            "cuEventRecord",
        )
    }

    /// GPU time from `earlier` to this event; blocks until this event has been reached.
    pub fn since(&self, earlier: &CudaEvent) -> Result<Duration> {
        Cuda::get()?.bind(self.ordinal)?;
        let mut ms = 0f32;
        // SAFETY: our events; synchronising first makes the elapsed time available.
        unsafe {
            check(sys::cuEventSynchronize(self.raw), "cuEventSynchronize")?;
            check(
                sys::cuEventElapsedTime_v2(&mut ms, earlier.raw, self.raw),
                "cuEventElapsedTime",
            )?;
        }
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 * 1e-3))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if Cuda::get().is_ok_and(|c| c.bind(self.ordinal).is_ok()) {
            // SAFETY: our event, destroyed once (the driver defers it past pending records).
            unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}
