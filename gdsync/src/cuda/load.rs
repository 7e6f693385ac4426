//! Opening the driver: the `GDSYNC_CUDA` switch, `cuInit`, the hardware queues the environment
//! asks for, and each GPU's name, capabilities and primary context.

use super::{failed, Cuda, GpuCaps, GpuInfo, MAX_CONNECTIONS, MAX_CONNECTIONS_VAR};
use crate::{Error, Result};
use cudarc::driver::result;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;

/// The variable that switches CUDA off for a process.
const SWITCH_VAR: &str = "GDSYNC_CUDA";

/// The driver's number of hardware queues per context when [`MAX_CONNECTIONS_VAR`] is unset.
const DEFAULT_QUEUES: u32 = 8;

/// Whether `GDSYNC_CUDA` lets CUDA load: unset (or empty), `on` or `1` do, `off` or `0` do not; anything
/// else is an error that names the valid values.
fn switched_on(value: Option<&str>) -> std::result::Result<bool, String> {
    match value {
        None | Some("" | "on" | "1") => Ok(true),
        Some("off" | "0") => Ok(false),
        Some(v) => Err(format!(
            "{SWITCH_VAR}={v} is not a valid value: use on or off (or 1, 0)"
        )),
    }
}

/// The hardware queues per context, as [`MAX_CONNECTIONS_VAR`] says before `cuInit`, and a
/// line for the log that says where the number came from.
fn queues() -> (u32, String) {
    let set = std::env::var(MAX_CONNECTIONS_VAR).ok();
    // A query that fails with NOT_INITIALIZED until someone calls cuInit.
    let started = result::device::get_count().is_ok();
    let n = set
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_QUEUES);
    let line = match (&set, started) {
        (Some(v), false) => format!("{MAX_CONNECTIONS_VAR}={v}"),
        (Some(v), true) => format!(
            "{MAX_CONNECTIONS_VAR}={v} (if it was set when another library started the driver)"
        ),
        (None, _) => format!(
            "{MAX_CONNECTIONS_VAR} unset ({DEFAULT_QUEUES}; {MAX_CONNECTIONS} keeps up to {MAX_CONNECTIONS} streams apart)"
        ),
    };
    (n, line)
}

impl Cuda {
    /// Loads and initialises the driver and retains every GPU's primary context: a new
    /// handle, which streams, buffers, modules and events made with it hold. Without the
    /// driver (or with `GDSYNC_CUDA=off`) [`Error::NoCuda`] says why; an unknown
    /// `GDSYNC_CUDA` value is refused the same way, naming the valid ones.
    ///
    /// The driver spreads a context's streams over `CUDA_DEVICE_MAX_CONNECTIONS` hardware
    /// queues (8 unless the environment says otherwise, when the driver starts), and a stream
    /// waiting on memory blocks the streams that share its queue: a program with more streams
    /// than that sets [`MAX_CONNECTIONS_VAR`] to [`MAX_CONNECTIONS`] itself, before it starts
    /// threads. A handle warns once when a GPU has more streams than queues.
    pub fn open() -> Result<Arc<Cuda>> {
        Self::load().map(Arc::new).map_err(Error::NoCuda)
    }

    pub(super) fn load() -> std::result::Result<Cuda, String> {
        let loaded = Self::load_driver();
        match &loaded {
            Ok(c) => log_loaded(c),
            Err(e) if e.starts_with(SWITCH_VAR) => {
                tracing::error!("{e}")
            }
            Err(e) => tracing::info!(
                "CUDA not available ({e}): stream and kernel triggers need a GPU; CPU triggers work"
            ),
        }
        loaded
    }

    fn load_driver() -> std::result::Result<Cuda, String> {
        if !switched_on(std::env::var(SWITCH_VAR).ok().as_deref())? {
            return Err(format!("disabled by {SWITCH_VAR}=off"));
        }
        // SAFETY: only tries to dlopen the library; cudarc panics on a missing library later,
        // which this check prevents.
        if !unsafe { sys::is_culib_present() } {
            return Err("the CUDA driver library (libcuda.so) is not installed".into());
        }
        let (queues, queues_line) = queues();
        text(result::init().map_err(failed("cuInit")))?;
        let mut driver_version = 0;
        // SAFETY: a query into a local (`result` has no wrapper for it).
        text(super::check(
            unsafe { sys::cuDriverGetVersion(&mut driver_version) },
            "cuDriverGetVersion",
        ))?;
        let n = text(result::device::get_count().map_err(failed("cuDeviceGetCount")))?;
        let (gpus, ctxs) = text((0..n).map(open_gpu).collect::<Result<Vec<_>>>())?
            .into_iter()
            .unzip();
        Ok(Cuda {
            driver_version,
            gpus,
            ctxs,
            queues,
            streams: (0..n).map(|_| AtomicU32::new(0)).collect(),
            warned: AtomicBool::new(false),
            queues_line,
        })
    }
}

/// A failed call as the text [`Cuda::get`] keeps.
fn text<T>(r: Result<T>) -> std::result::Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// GPU `ordinal`: what it is and can do, and its primary context (retained, never released:
/// it lives as long as the process, like the runtime API's).
fn open_gpu(ordinal: i32) -> Result<(GpuInfo, sys::CUcontext)> {
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(ordinal).map_err(failed("cuDeviceGet"))?;
    let name = result::device::get_name(dev).map_err(failed("cuDeviceGetName"))?;
    let attr = |a| device_attr(dev, a);
    // SAFETY: a device of this driver.
    let ctx =
        unsafe { result::primary_ctx::retain(dev) }.map_err(failed("cuDevicePrimaryCtxRetain"))?;
    let gpu = GpuInfo {
        ordinal,
        name,
        compute_capability: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1) as u32,
        caps: caps(dev),
    };
    Ok((gpu, ctx))
}

/// A device attribute, 0 where the driver does not know it.
fn device_attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> i32 {
    // SAFETY: a device of this driver; a plain query.
    unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0)
}

fn caps(dev: sys::CUdevice) -> GpuCaps {
    use sys::CUdevice_attribute as A;
    let on = |a| device_attr(dev, a) != 0;
    GpuCaps {
        stream_mem_ops_v1: on(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1),
        mem_ops_64: on(A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS),
        wait_nor: on(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR),
        flush_remote_writes: on(A::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES),
        gpudirect_rdma: on(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
        gpudirect_rdma_writes_ordering: device_attr(
            dev,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
        ),
        dma_buf: on(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED),
        unified_addressing: on(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
        host_pointer_for_registered_mem: on(
            A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        ),
        host_register: on(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED),
    }
}

/// The one line a process logs when a handle opens: the driver, the GPUs, the queues.
fn log_loaded(c: &Cuda) {
    let names: Vec<String> = c
        .gpus
        .iter()
        .map(|g| {
            let (major, minor) = g.compute_capability;
            format!("{}: {} (sm_{major}{minor})", g.ordinal, g.name)
        })
        .collect();
    tracing::info!(
        "CUDA driver {}.{} loaded: {} GPU(s) [{}]; {}",
        c.driver_version / 1000,
        c.driver_version % 1000 / 10,
        c.gpus.len(),
        names.join(", "),
        c.queues_line
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_takes_on_and_off_and_names_them_for_anything_else() {
        assert_eq!(switched_on(None), Ok(true));
        assert_eq!(switched_on(Some("")), Ok(true), "empty is unset");
        for v in ["on", "1"] {
            assert_eq!(switched_on(Some(v)), Ok(true), "{v}");
        }
        for v in ["off", "0"] {
            assert_eq!(switched_on(Some(v)), Ok(false), "{v}");
        }
        for v in ["maybe", "OFF", "yes", "2"] {
            let e = switched_on(Some(v)).unwrap_err();
            assert!(
                e.contains(&format!("GDSYNC_CUDA={v} ")) && e.contains("on or off"),
                "{e}"
            );
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
