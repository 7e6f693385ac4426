//! CUDA events: points in a stream's timeline, for timing what a stream ran.

use super::{failed, Cuda, CudaStream};
use crate::Result;
use cudarc::driver::{result, sys};
use std::sync::Arc;
use std::time::Duration;

/// A timing event on GPU `ordinal` (`cuEventCreate` with timing on). Recording it on a stream
/// marks the moment the stream reaches that point; two recorded events give the GPU time
/// between them, with the driver's ~0.5 µs resolution.
pub struct CudaEvent {
    raw: sys::CUevent,
    ordinal: i32,
    cuda: Arc<Cuda>,
}

// SAFETY: events may be used from any thread once their context is bound (done per call).
unsafe impl Send for CudaEvent {}
// SAFETY: the driver's event calls are thread-safe.
unsafe impl Sync for CudaEvent {}

impl Cuda {
    /// A new timing event on GPU `ordinal`.
    pub fn new_event(self: &Arc<Self>, ordinal: i32) -> Result<CudaEvent> {
        self.bind(ordinal)?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(failed("cuEventCreate"))?;
        Ok(CudaEvent {
            raw,
            ordinal,
            cuda: self.clone(),
        })
    }
}

impl CudaEvent {
    /// A new timing event on GPU `ordinal`, with the process's default handle
    /// ([`Cuda::get`]); [`Cuda::new_event`] with a handle of your own.
    pub fn new(ordinal: i32) -> Result<Self> {
        Cuda::get()?.new_event(ordinal)
    }

    /// Marks this point of `stream` (enqueued behind everything enqueued before).
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        self.cuda.bind(self.ordinal)?;
        // SAFETY: our event and a live stream of the same GPU.
        unsafe { result::event::record(self.raw, stream.raw()) }.map_err(failed("cuEventRecord"))
    }

    /// GPU time from `earlier` to this event; blocks until this event has been reached.
    pub fn since(&self, earlier: &CudaEvent) -> Result<Duration> {
        self.cuda.bind(self.ordinal)?;
        // SAFETY: our events; synchronising first makes the elapsed time available.
        let ms = unsafe {
            result::event::synchronize(self.raw).map_err(failed("cuEventSynchronize"))?;
            result::event::elapsed(earlier.raw, self.raw).map_err(failed("cuEventElapsedTime"))?
        };
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 * 1e-3))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.cuda.bind(self.ordinal).is_ok() {
            // SAFETY: our event, destroyed once (the driver defers it past pending records;
            // errors are ignored on teardown).
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}
