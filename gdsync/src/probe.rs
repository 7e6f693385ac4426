//! What this machine offers for GPUDirect Async: RDMA devices, gdrcopy, NVRTC. GPUs and their
//! capabilities are in [`crate::cuda`]. Used by the `info` example, like `ibv_devinfo`.

use std::ffi::CString;
use std::path::Path;

/// One RDMA device, as rdma-core finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    /// Name (e.g. `mlx5_0`).
    pub name: String,
    /// Firmware version, if the device could be queried.
    pub fw_ver: Option<String>,
    /// Port states (`1: PORT_ACTIVE`, ...), port by port.
    pub ports: Vec<String>,
}

/// Whether RDMA hardware is usable, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdmaStatus {
    /// rdma-core (`libibverbs.so.1`, `libmlx5.so.1`) does not load, or is too old.
    LibraryMissing(String),
    /// rdma-core loads but finds no RDMA device.
    NoDevice,
    /// Devices found.
    Devices(Vec<RdmaDevice>),
}

/// Whether `lib` can be loaded by the dynamic linker (it is unloaded again).
pub fn library_loads(lib: &str) -> Result<(), String> {
    let c = CString::new(lib).map_err(|_| "bad library name".to_string())?;
    // SAFETY: dlopen with a NUL-terminated name and standard flags; the handle is closed below.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local message or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            format!("{lib} not found")
        } else {
            // SAFETY: a NUL-terminated message owned by libdl.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    // SAFETY: a handle dlopen returned.
    unsafe { libc::dlclose(h) };
    Ok(())
}

/// RDMA devices, or why there are none: rdma-core's device list (sysfs and RDMA netlink, as
/// `ibv_devices` sees them), each device queried for its firmware and port states.
pub fn rdma() -> RdmaStatus {
    use crate::mlx5::{devices, Context, RdmaError};
    let list = match devices() {
        Ok(l) => l,
        Err(e @ (RdmaError::LibraryMissing { .. } | RdmaError::LibraryTooOld { .. })) => {
            return RdmaStatus::LibraryMissing(e.to_string())
        }
        Err(_) => return RdmaStatus::NoDevice,
    };
    let devs: Vec<RdmaDevice> = list
        .into_iter()
        .map(|d| {
            let ctx = Context::open(&d.name).ok();
            let limits = ctx.as_ref().and_then(|c| c.query_device().ok());
            let ports = match (&ctx, &limits) {
                (Some(c), Some(l)) => (1..=l.phys_port_cnt)
                    .map(|p| match c.query_port(p) {
                        Ok(info) => format!("{p}: {}", info.state.name_and_value().0),
                        Err(e) => format!("{p}: {e}"),
                    })
                    .collect(),
                _ => Vec::new(),
            };
            RdmaDevice {
                name: d.name,
                fw_ver: limits.map(|l| l.fw_ver),
                ports,
            }
        })
        .collect();
    if devs.is_empty() {
        RdmaStatus::NoDevice
    } else {
        RdmaStatus::Devices(devs)
    }
}

/// gdrcopy: whether its library loads and its driver node exists (both are needed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gdrcopy {
    /// `libgdrapi.so.2` loads.
    pub library: bool,
    /// `/dev/gdrdrv` exists.
    pub driver: bool,
}

impl Gdrcopy {
    /// Probes this machine.
    pub fn probe() -> Gdrcopy {
        Gdrcopy {
            library: library_loads("libgdrapi.so.2").is_ok(),
            driver: Path::new("/dev/gdrdrv").exists(),
        }
    }
    /// Whether gdrcopy is usable.
    pub fn usable(&self) -> bool {
        self.library && self.driver
    }
}
