//! What this machine offers for GPUDirect Async: RDMA devices, gdrcopy, NVRTC. GPUs and their
//! capabilities are in [`crate::cuda`]. Used by the `info` example, like `ibv_devinfo`.

use std::ffi::CString;
use std::path::Path;

/// One RDMA device under `/sys/class/infiniband`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    /// Name (e.g. `mlx5_0`).
    pub name: String,
    /// Firmware version, if reported.
    pub fw_ver: Option<String>,
    /// Port states (`4: ACTIVE`, ...), port by port.
    pub ports: Vec<String>,
}

/// Whether RDMA hardware is usable, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdmaStatus {
    /// rdma-core's `libibverbs.so.1` does not load.
    LibraryMissing(String),
    /// The library loads but the kernel exposes no RDMA device.
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

/// RDMA devices, or why there are none.
pub fn rdma() -> RdmaStatus {
    if let Err(e) = library_loads("libibverbs.so.1") {
        return RdmaStatus::LibraryMissing(e);
    }
    let dir = Path::new("/sys/class/infiniband");
    let mut devs = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let read = |f: &str| {
                std::fs::read_to_string(p.join(f))
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            let mut ports = Vec::new();
            if let Ok(pr) = std::fs::read_dir(p.join("ports")) {
                for port in pr.flatten() {
                    let state =
                        std::fs::read_to_string(port.path().join("state")).unwrap_or_default();
                    ports.push(format!(
                        "{}: {}",
                        port.file_name().to_string_lossy(),
                        state.trim()
                    ));
                }
            }
            ports.sort();
            devs.push(RdmaDevice {
                name: e.file_name().to_string_lossy().into_owned(),
                fw_ver: read("fw_ver"),
                ports,
            });
        }
    }
    devs.sort_by(|a, b| a.name.cmp(&b.name));
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
