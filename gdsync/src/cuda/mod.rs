//! CUDA glue, layered as cudarc layers it: the driver is loaded at run time (cudarc with
//! dynamic loading), so one binary runs with or without a GPU and the build needs no CUDA
//! toolkit; calls go through cudarc's `result` layer (which turns a `CUresult` into a
//! `Result`), and through `sys` only where `result` has no wrapper (stream memory operations,
//! host registration, IPC, pointer attributes).
//!
//! [`Cuda::open`] loads and initialises the driver and gives a handle ([`Arc<Cuda>`]) that
//! streams, buffers, modules and events hold; [`Cuda::get`] is the process's default handle,
//! a convenience for applications. Without `libcuda` (or with `GDSYNC_CUDA=off`) they return
//! [`Error::NoCuda`] and nothing in this module panics. Each GPU is used through its primary
//! context. Host memory the GPU must reach (rings, doorbell words and CQs, signal words) is
//! registered as pinned, device-mapped memory when its creator passes a handle; on the
//! machines we support (unified addressing, `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`) its
//! device address is its host address; a device's register page registered as I/O memory need
//! not be, so every registration asks `cuMemHostGetDevicePointer` and what a GPU executes uses
//! that address.

mod copy;
mod copy_kernel;
mod event;
mod executor;
mod foreign;
#[cfg(test)]
mod gpu_addr_tests;
mod idle_streams;
mod inbound;
mod launch;
mod list_kernel;
mod list_profile;
mod load;
mod memory;
mod module;
mod staging_kernels;
mod stream;
mod stream_span;

pub(crate) use copy::{read_region, GpuCtx};
pub use event::CudaEvent;
pub(crate) use foreign::dma_buf;
pub(crate) use inbound::refuse_write_target;
pub use inbound::{InboundWrites, WRITES_ORDERING_OWNER};
pub use launch::{KernelArg, LaunchArgs};
pub use list_kernel::LIST_COPY_MAX;
pub use memory::{DeviceBuffer, IpcHandle, MemoryKind};
pub use module::{nvrtc_available, Function, Module};
pub use staging_kernels::{prepare_staged_copies, staged_copy_kernels, StagingCopy};
pub use stream::{stream_memops, CudaStream, ListKernel, MARK_EVERY, MAX_QUEUED_OPS};
pub use stream_span::set_job_spans_gpus;

use crate::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// What a GPU can do, as far as GPUDirect Async cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuCaps {
    /// Legacy (v1) stream memory operations are enabled (needs `NVreg_EnableStreamMemOPs=1`);
    /// the v2 API this crate uses does not need them.
    pub stream_mem_ops_v1: bool,
    /// 64-bit stream writes and waits.
    pub mem_ops_64: bool,
    /// `CU_STREAM_WAIT_VALUE_NOR`.
    pub wait_nor: bool,
    /// `CU_STREAM_WAIT_VALUE_FLUSH` / flushing remote writes (used where the GPU does not
    /// order them: [`GpuCaps::inbound_writes`]).
    pub flush_remote_writes: bool,
    /// GPUDirect RDMA.
    pub gpudirect_rdma: bool,
    /// Ordering of GPUDirect RDMA writes (0 none, 100 owner, 200 all devices): at least
    /// [`WRITES_ORDERING_OWNER`] and no flush is needed.
    pub gpudirect_rdma_writes_ordering: i32,
    /// dma-buf export of device memory (for `ibv_reg_dmabuf_mr`).
    pub dma_buf: bool,
    /// Unified virtual addressing.
    pub unified_addressing: bool,
    /// Registered host memory is usable at its host address.
    pub host_pointer_for_registered_mem: bool,
    /// `cuMemHostRegister` is supported.
    pub host_register: bool,
}

/// One GPU.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: i32,
    /// Marketing name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors (bounds how many blocks of a persistent kernel run at once).
    pub multiprocessors: u32,
    /// Capabilities.
    pub caps: GpuCaps,
}

/// The loaded CUDA driver and its GPUs: a handle, opened with [`Cuda::open`] (or the process's
/// default, [`Cuda::get`]) and held ([`Arc`]) by what is made with it.
pub struct Cuda {
    /// `cuDriverGetVersion` (e.g. 13000).
    pub driver_version: i32,
    /// The GPUs.
    pub gpus: Vec<GpuInfo>,
    /// Each GPU's primary context (retained for the process's life, as the runtime API does).
    ctxs: Vec<sys::CUcontext>,
    /// Hardware queues per context ([`MAX_CONNECTIONS_VAR`], as the environment says).
    queues: u32,
    /// Streams made on each GPU and not destroyed.
    streams: Vec<AtomicU32>,
    /// Whether more streams than queues were reported already.
    warned: AtomicBool,
    /// Where `queues` came from, for the log.
    queues_line: String,
}

// SAFETY: CUDA contexts are process-wide handles the driver lets any thread make current.
unsafe impl Send for Cuda {}
// SAFETY: as above; the rest is immutable after opening, or atomic (the stream counts).
unsafe impl Sync for Cuda {}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("driver_version", &self.driver_version)
            .field("gpus", &self.gpus)
            .finish()
    }
}

/// Makes `ctx`, GPU `ordinal`'s primary context, current on the calling thread (unless it is
/// already: primary contexts are one per GPU, whichever handle retained them).
fn bind_context(ordinal: i32, ctx: sys::CUcontext) -> Result<()> {
    thread_local!(static BOUND: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) });
    if BOUND.with(|b| b.get()) == ordinal {
        return Ok(());
    }
    // SAFETY: a primary context a handle retained (and never releases); a null one (a test's
    // unbacked context) is refused by the driver.
    unsafe { result::ctx::set_current(ctx) }.map_err(failed("cuCtxSetCurrent"))?;
    BOUND.with(|b| b.set(ordinal));
    Ok(())
}

/// Turns a failed driver call into an [`Error::Cuda`] that names the call.
pub(crate) fn failed(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        code: e.0 as i32,
        name: e.error_name().map_or_else(
            |_| format!("{:?}", e.0),
            |n| n.to_string_lossy().into_owned(),
        ),
    }
}

/// A driver call that `result` does not wrap (stream memory operations, host registration,
/// IPC, pointer attributes), checked as [`failed`] does.
pub(crate) fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    r.result().map_err(failed(call))
}

/// The driver's variable for how many hardware queues a context spreads its streams over.
pub const MAX_CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// What to set [`MAX_CONNECTIONS_VAR`] to, in the environment before the program starts: the
/// driver's maximum, so that up to this many streams of a context never share a queue (and
/// never wait for each other's memory waits). The driver's default is 8.
pub const MAX_CONNECTIONS: u32 = 32;

impl Cuda {
    /// The process's default handle, opened on first use ([`Cuda::open`]): a convenience for
    /// applications that use one handle throughout. [`Error::NoCuda`] says why there is none.
    pub fn get() -> Result<&'static Arc<Cuda>> {
        static C: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();
        C.get_or_init(|| Self::load().map(Arc::new))
            .as_ref()
            .map_err(|e| Error::NoCuda(e.clone()))
    }

    /// Whether the default handle ([`Cuda::get`]) has at least one GPU.
    pub fn available() -> bool {
        Self::get().is_ok_and(|c| !c.gpus.is_empty())
    }

    /// The default handle ([`Cuda::get`]) where it has a GPU: what the conveniences that take
    /// no handle ([`Device::open`](crate::Device::open), [`SignalWords::new`](crate::SignalWords::new),
    /// ...) map their memory for.
    pub(crate) fn default_gpus() -> Option<&'static Arc<Cuda>> {
        Self::get().ok().filter(|c| !c.gpus.is_empty())
    }

    /// The hardware queues per context that the driver started with ([`MAX_CONNECTIONS_VAR`]
    /// as the environment said, else the driver's default of 8). Stream-triggered latency
    /// depends on it (docs/benchmarks.md, "The stream trigger's two modes and the GPU's
    /// hardware queues"), so benchmarks report it.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The GPU with this ordinal.
    pub fn gpu(&self, ordinal: i32) -> Result<&GpuInfo> {
        self.gpus.get(ordinal as usize).ok_or_else(|| {
            Error::NoCuda(format!(
                "no GPU {ordinal} (this machine has {})",
                self.gpus.len()
            ))
        })
    }

    /// Makes GPU `ordinal`'s primary context current on the calling thread.
    pub fn bind(&self, ordinal: i32) -> Result<()> {
        self.gpu(ordinal)?;
        bind_context(ordinal, self.ctxs[ordinal as usize])
    }

    /// Whether host memory registered with CUDA (as ring memory is) is addressed by GPUs at
    /// its host address (true with unified addressing on Linux x86-64).
    pub fn host_pointers_are_device_pointers(&self) -> bool {
        !self.gpus.is_empty()
            && self
                .gpus
                .iter()
                .all(|g| g.caps.unified_addressing && g.caps.host_pointer_for_registered_mem)
    }

    /// A new non-blocking stream in GPU `ordinal`'s context (bound here: a call between an
    /// earlier bind and this one, such as a host registration, may have bound another GPU).
    /// Says once, as a warning, when a GPU has more streams than hardware queues.
    pub(crate) fn create_stream(&self, ordinal: i32) -> Result<sys::CUstream> {
        self.bind(ordinal)?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(failed("cuStreamCreate"))?;
        let n = self.streams[ordinal as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.queues && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("GPU {ordinal} has {n} streams on {} hardware queues: a stream's memory wait can hold back another stream's work; set {MAX_CONNECTIONS_VAR}={MAX_CONNECTIONS} in the environment before the program starts", self.queues);
        }
        Ok(raw)
    }

    /// Destroys a stream of [`Cuda::create_stream`].
    ///
    /// # Safety
    /// `raw` is a stream of GPU `ordinal` made by `create_stream`, destroyed once.
    pub(crate) unsafe fn destroy_stream(&self, ordinal: i32, raw: sys::CUstream) {
        self.streams[ordinal as usize].fetch_sub(1, Ordering::Relaxed);
        if self.bind(ordinal).is_ok() {
            // SAFETY: the caller's contract (errors are ignored on teardown).
            let _ = unsafe { result::stream::destroy(raw) };
        }
    }
}
