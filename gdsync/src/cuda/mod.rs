//! CUDA glue: the driver, loaded at run time (cudarc with dynamic loading), so one binary runs
//! with or without a GPU and the build needs no CUDA toolkit.
//!
//! [`Cuda::get`] loads and initialises the driver once; without `libcuda` (or with
//! `GDSYNC_CUDA=off`) it returns [`Error::NoCuda`] and nothing in this module panics. Each GPU is
//! used through its primary context. Host memory the GPU must reach (the soft device's rings,
//! doorbell words and CQs, signal words) is registered as pinned, device-mapped memory; on the
//! machines we support (unified addressing, `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`) its
//! device address is its host address.

mod event;
mod executor;
mod foreign;
mod memory;
mod module;
mod stream;

pub use event::CudaEvent;
pub(crate) use foreign::{dma_buf, register_foreign, unregister_foreign};
pub(crate) use memory::{copy_dtoh, copy_htod};
pub use memory::{DeviceBuffer, IpcHandle, MemoryKind};
pub use module::{nvrtc_available, Function, Module};
pub use stream::{CudaStream, MAX_QUEUED_OPS};

use crate::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CStr;
use std::sync::OnceLock;

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
    /// `CU_STREAM_WAIT_VALUE_FLUSH` / flushing remote writes.
    pub flush_remote_writes: bool,
    /// GPUDirect RDMA.
    pub gpudirect_rdma: bool,
    /// Ordering of GPUDirect RDMA writes (0 none, 100 owner, 200 all devices).
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

/// The loaded CUDA driver and its GPUs.
pub struct Cuda {
    /// `cuDriverGetVersion` (e.g. 13000).
    pub driver_version: i32,
    /// The GPUs.
    pub gpus: Vec<GpuInfo>,
    ctxs: Vec<sys::CUcontext>,
}

// SAFETY: CUDA contexts are process-wide handles the driver lets any thread make current.
unsafe impl Send for Cuda {}
// SAFETY: as above; the struct is immutable after initialisation.
unsafe impl Sync for Cuda {}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("driver_version", &self.driver_version)
            .field("gpus", &self.gpus)
            .finish()
    }
}

/// Turns a driver result into a `Result`, naming the call.
pub(crate) fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
    let name = unsafe {
        if sys::cuGetErrorName(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    Err(Error::Cuda {
        call,
        code: r as i32,
        name,
    })
}

/// The driver's variable for how many hardware queues a context spreads its streams over.
pub const MAX_CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// What [`Cuda::get`] sets [`MAX_CONNECTIONS_VAR`] to when it is not set: the driver's maximum,
/// so that up to this many streams of a context never share a queue (and never wait for each
/// other's memory waits).
pub const MAX_CONNECTIONS: u32 = 32;

/// A new non-blocking stream in GPU `ordinal`'s context (bound here: a call between an
/// earlier bind and this one, such as a host registration, may have bound another GPU).
pub(crate) fn new_stream(ordinal: i32) -> Result<sys::CUstream> {
    Cuda::get()?.bind(ordinal)?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: creates a stream into a local.
    check(
        unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        },
        "cuStreamCreate",
    )?;
    Ok(raw)
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: plain query into a local.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    if r == sys::CUresult::CUDA_SUCCESS {
        v
    } else {
        0
    }
}

impl Cuda {
    /// The driver, loaded and initialised on first use. [`Error::NoCuda`] says why not.
    pub fn get() -> Result<&'static Cuda> {
        static C: OnceLock<std::result::Result<Cuda, String>> = OnceLock::new();
        C.get_or_init(|| {
            Self::load().inspect_err(|e| {
                tracing::info!("CUDA not available ({e}): stream and kernel triggers need a GPU; CPU triggers work")
            })
        })
        .as_ref()
            .map_err(|e| Error::NoCuda(e.clone()))
    }

    /// Whether the driver loaded and has at least one GPU.
    pub fn available() -> bool {
        Self::get().is_ok_and(|c| !c.gpus.is_empty())
    }

    fn load() -> std::result::Result<Cuda, String> {
        if std::env::var("GDSYNC_CUDA").is_ok_and(|v| v == "off" || v == "0") {
            return Err("disabled by GDSYNC_CUDA=off".into());
        }
        // SAFETY: only tries to dlopen the library; cudarc panics on a missing library later,
        // which this check prevents.
        if !unsafe { sys::is_culib_present() } {
            return Err("the CUDA driver library (libcuda.so) is not installed".into());
        }
        // A stream waiting on memory blocks every stream that shares its hardware queue, and a
        // context maps its streams onto CUDA_DEVICE_MAX_CONNECTIONS queues (8 by default):
        // with more streams than that (four ranks' streams and their copy streams are eight),
        // one rank's wait for a message could hold back the peer's stream that sends it. A
        // precaution: stencil2d's start-up stall, first blamed on this, occurred with 32 queues
        // too (docs/benchmarks.md). The driver reads the variable when it starts; 32 is
        // its largest value. A value the user set is kept.
        // (std serialises this with every Rust reader of the environment; C code reading it on
        // another thread at this very moment is the remaining, accepted risk.)
        let mut n = 0;
        // SAFETY: a query into a local; before any cuInit it fails with NOT_INITIALIZED.
        let started = unsafe { sys::cuDeviceGetCount(&mut n) } == sys::CUresult::CUDA_SUCCESS;
        let set = std::env::var(MAX_CONNECTIONS_VAR).ok();
        let queues = match (&set, started) {
            (Some(v), _) => format!("{MAX_CONNECTIONS_VAR}={v} (from the environment)"),
            (None, true) => {
                format!("{MAX_CONNECTIONS_VAR} unset (8: the driver was started before gdsync)")
            }
            (None, false) => format!("{MAX_CONNECTIONS_VAR}={MAX_CONNECTIONS} (set by gdsync)"),
        };
        if started {
            // Another library (an MPI, a framework) started the driver: too late to choose.
            if set.as_deref().and_then(|v| v.parse::<u32>().ok()) < Some(MAX_CONNECTIONS) {
                tracing::warn!("the CUDA driver was started before gdsync with {MAX_CONNECTIONS_VAR}={}: streams may share hardware queues, and a stream's memory wait then blocks the others (set {MAX_CONNECTIONS_VAR}={MAX_CONNECTIONS} in the environment)", set.as_deref().unwrap_or("unset (8)"));
            }
        } else if set.is_none() {
            std::env::set_var(MAX_CONNECTIONS_VAR, MAX_CONNECTIONS.to_string());
        }
        let e = |r: Result<()>| r.map_err(|e| e.to_string());
        // SAFETY: cuInit with flags 0 is always valid.
        e(check(unsafe { sys::cuInit(0) }, "cuInit"))?;
        let mut driver_version = 0;
        // SAFETY: query into a local.
        e(check(
            unsafe { sys::cuDriverGetVersion(&mut driver_version) },
            "cuDriverGetVersion",
        ))?;
        let mut n = 0;
        // SAFETY: query into a local.
        e(check(
            unsafe { sys::cuDeviceGetCount(&mut n) },
            "cuDeviceGetCount",
        ))?;
        let mut gpus = Vec::new();
        let mut ctxs = Vec::new();
        for ordinal in 0..n {
            let mut dev = 0;
            // SAFETY: ordinal < count.
            e(check(
                unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
                "cuDeviceGet",
            ))?;
            let mut name = [0 as std::ffi::c_char; 256];
            // SAFETY: the buffer is 256 bytes and the driver NUL-terminates.
            e(check(
                unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev) },
                "cuDeviceGetName",
            ))?;
            // SAFETY: NUL-terminated by the driver.
            let name = unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            use sys::CUdevice_attribute as A;
            let caps = GpuCaps {
                stream_mem_ops_v1: attr(dev, A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1) != 0,
                mem_ops_64: attr(dev, A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0,
                wait_nor: attr(dev, A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) != 0,
                flush_remote_writes: attr(dev, A::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES) != 0,
                gpudirect_rdma: attr(dev, A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0,
                gpudirect_rdma_writes_ordering: attr(
                    dev,
                    A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
                ),
                dma_buf: attr(dev, A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0,
                unified_addressing: attr(dev, A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) != 0,
                host_pointer_for_registered_mem: attr(
                    dev,
                    A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                ) != 0,
                host_register: attr(dev, A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED) != 0,
            };
            let cc = (
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            );
            let mut ctx = std::ptr::null_mut();
            // SAFETY: retains the device's primary context (released never: it lives as long
            // as the process, like the runtime API's).
            e(check(
                unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
                "cuDevicePrimaryCtxRetain",
            ))?;
            gpus.push(GpuInfo {
                ordinal,
                name,
                compute_capability: cc,
                multiprocessors: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1)
                    as u32,
                caps,
            });
            ctxs.push(ctx);
        }
        let names: Vec<String> = gpus
            .iter()
            .map(|g| {
                let (major, minor) = g.compute_capability;
                format!("{}: {} (sm_{major}{minor})", g.ordinal, g.name)
            })
            .collect();
        tracing::info!(
            "CUDA driver {}.{} loaded: {} GPU(s) [{}]; {queues}",
            driver_version / 1000,
            driver_version % 1000 / 10,
            gpus.len(),
            names.join(", ")
        );
        Ok(Cuda {
            driver_version,
            gpus,
            ctxs,
        })
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
        thread_local!(static BOUND: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) });
        if BOUND.with(|b| b.get()) == ordinal {
            return Ok(());
        }
        // SAFETY: a valid primary context retained in load().
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctxs[ordinal as usize]) },
            "cuCtxSetCurrent",
        )?;
        BOUND.with(|b| b.set(ordinal));
        Ok(())
    }

    /// Registers host memory as pinned and mapped for every GPU (`cuMemHostRegister` with
    /// PORTABLE | DEVICEMAP).
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be allocated, and stay so until [`Cuda::unregister_host`].
    pub(crate) unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<()> {
        self.bind(0)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller guarantees the range.
        check(
            unsafe { sys::cuMemHostRegister_v2(ptr as *mut _, len, flags) },
            "cuMemHostRegister",
        )
    }

    /// Undoes [`Cuda::register_host`].
    pub(crate) fn unregister_host(&self, ptr: *mut u8) {
        if self.bind(0).is_ok() {
            // SAFETY: ptr was registered by register_host (errors are ignored on teardown).
            unsafe { sys::cuMemHostUnregister(ptr as *mut _) };
        }
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
}
