//! Which device a program runs on: [`Device::open`] by name, and [`Device::default`] —
//! `GDSYNC_DEVICE` where set (`soft`, `mlx5_0`, `mlx5_0:2`), else the first active mlx5 port,
//! else the soft device — with the choice and its reason logged and reported
//! ([`DeviceSelection`]).
//!
//! The mlx5 data path plugs in through [`MLX5_DATA_PATH`]; where a build has none, naming an
//! mlx5 device is an error that says so, and the automatic choice stays on the soft device.
//!
//! This is the one place that knows both the providers and the queue layer: it opens a
//! provider and builds the [`Device`] over it. With the `emulated-hca` feature (on by
//! default), opening an mlx5 device first makes this process's soft devices the HCA of the
//! emulated kernel driver the process may run under (`uverbs-emu`), so rdma-core's libmlx5
//! runs against them.

use super::mlx5::{Context, PortState, RdmaError, UarPages};
use super::soft::SoftDevice;
use crate::cuda::Cuda;
use crate::Device;
use crate::{Error, Result};
use std::sync::Arc;

/// The environment variable that picks the device.
pub const DEVICE_VAR: &str = "GDSYNC_DEVICE";

/// Opens port `port` of the mlx5 device `name` as a [`Device`]: the mlx5 data path's
/// constructor, where this build has one.
pub(crate) type Mlx5Open = fn(name: &str, port: u8, cuda: Option<Arc<Cuda>>) -> Result<Device>;

/// The mlx5 data path of this build: gdsync's queues on libmlx5's QPs.
pub(crate) const MLX5_DATA_PATH: Option<Mlx5Open> = Some(open_mlx5);

/// The mlx5 data path: the provider over port `port` of `name`, as a [`Device`].
fn open_mlx5(name: &str, port: u8, cuda: Option<Arc<Cuda>>) -> Result<Device> {
    let provider = super::mlx5::open_provider(name, port, uar_pages(), cuda.clone())?;
    Ok(Device::from_provider(provider, cuda))
}

/// What the doorbell pages of the mlx5 devices this process opens are: ordinary memory where
/// the process runs under the emulated kernel driver, whose HCA this process's soft devices
/// then become; else a HCA's I/O memory.
#[cfg(feature = "emulated-hca")]
fn uar_pages() -> UarPages {
    match super::soft::serve_emulated_driver() {
        Ok(n) => {
            tracing::debug!("emulated RDMA driver: {n} device(s) served by soft HCAs");
            UarPages::MaybeHostMemory
        }
        Err(why) => {
            tracing::trace!("{why}");
            UarPages::Io
        }
    }
}

/// What the doorbell pages of the mlx5 devices this process opens are: a build without the
/// emulated driver's HCA drives HCAs only.
#[cfg(not(feature = "emulated-hca"))]
fn uar_pages() -> UarPages {
    UarPages::Io
}

/// A device as a user names it: `soft`, or an RDMA device and optionally its port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceName {
    /// The soft device.
    Soft,
    /// An RDMA device (`mlx5_0`) and port (from 1; `None`: its first active port).
    Rdma {
        /// Its name, as `ibv_devices` lists it.
        name: String,
        /// The port, if named.
        port: Option<u8>,
    },
}

impl std::str::FromStr for DeviceName {
    type Err = String;

    /// `soft`, `mlx5_0` or `mlx5_0:1`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        const FORMS: &str = "expected soft, an RDMA device such as mlx5_0, or mlx5_0:1";
        if s == "soft" {
            return Ok(DeviceName::Soft);
        }
        let (name, port) = match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        };
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !name_ok {
            return Err(format!("{s:?}: not a device name ({FORMS})"));
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    return Err(format!(
                        "{s:?}: port {p:?} is not a port number from 1 ({FORMS})"
                    ))
                }
            },
        };
        Ok(DeviceName::Rdma {
            name: name.into(),
            port,
        })
    }
}

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceName::Soft => f.write_str("soft"),
            DeviceName::Rdma { name, port: None } => f.write_str(name),
            DeviceName::Rdma {
                name,
                port: Some(p),
            } => write!(f, "{name}:{p}"),
        }
    }
}

/// The device [`Device::default`] opens, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSelection {
    /// The device (for an RDMA device, with its port).
    pub device: DeviceName,
    /// Why it: `GDSYNC_DEVICE=...`, the first active mlx5 port, or why no mlx5 port is used.
    pub why: String,
}

impl DeviceSelection {
    /// The choice for this process: `GDSYNC_DEVICE` where set, else the first active mlx5
    /// port where this build drives mlx5, else the soft device. An invalid `GDSYNC_DEVICE` is
    /// an error.
    pub fn for_process() -> Result<DeviceSelection> {
        let env = std::env::var(DEVICE_VAR).ok();
        choose(env.as_deref(), MLX5_DATA_PATH.is_some(), first_active_port)
    }
}

/// The first active port of an mlx5 device, or why there is none.
fn first_active_port() -> std::result::Result<(String, u8), RdmaError> {
    let (ctx, port) = Context::open_first_active()?;
    Ok((ctx.name().to_string(), port))
}

/// The choice, from `GDSYNC_DEVICE`'s value, whether the mlx5 data path is built, and the
/// search for an active mlx5 port.
fn choose(
    env: Option<&str>,
    mlx5_built: bool,
    first_active: impl FnOnce() -> std::result::Result<(String, u8), RdmaError>,
) -> Result<DeviceSelection> {
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        let device = v
            .parse::<DeviceName>()
            .map_err(|e| Error::invalid(format!("{DEVICE_VAR}={e}")))?;
        return Ok(DeviceSelection {
            device,
            why: format!("{DEVICE_VAR}={v}"),
        });
    }
    let soft = |why: String| DeviceSelection {
        device: DeviceName::Soft,
        why,
    };
    Ok(match first_active() {
        Ok((name, port)) if mlx5_built => DeviceSelection {
            device: DeviceName::Rdma {
                name,
                port: Some(port),
            },
            why: "the first active mlx5 port".into(),
        },
        Ok((name, port)) => soft(format!(
            "{name} port {port} is active, but this build has no mlx5 data path"
        )),
        Err(e) => soft(format!("no mlx5 port to use: {e}")),
    })
}

/// Port `port` of the open device, or its first active port; or why it cannot be used.
fn usable_port(ctx: &Context, port: Option<u8>) -> std::result::Result<u8, RdmaError> {
    let count = ctx.query_device()?.phys_port_cnt;
    let ports: Vec<u8> = match port {
        Some(p) if p > count => {
            return Err(RdmaError::InvalidArgument(format!(
                "{} has {count} port(s), not {p}",
                ctx.name()
            )))
        }
        Some(p) => vec![p],
        None => (1..=count).collect(),
    };
    let mut seen = Vec::new();
    for p in ports {
        let state = ctx.query_port(p)?.state;
        if state == PortState::Active {
            return Ok(p);
        }
        seen.push(format!("port {p} is {state}"));
    }
    Err(RdmaError::InvalidArgument(format!(
        "{}: no active port ({})",
        ctx.name(),
        seen.join(", ")
    )))
}

/// What opening RDMA device `name` answers for `e`: a device not there names the one that
/// always is (`soft`); an invalid argument is said once.
fn open_error(name: &str, e: RdmaError) -> Error {
    match e {
        RdmaError::LibraryMissing { .. } | RdmaError::LibraryTooOld { .. } => {
            Error::Unsupported(format!("{name}: {e}"))
        }
        RdmaError::NoDevice(_) | RdmaError::UnknownDevice { .. } => {
            Error::invalid(format!("{e}; the soft device is always there: soft"))
        }
        RdmaError::InvalidArgument(m) => Error::invalid(m),
        e => Error::invalid(e.to_string()),
    }
}

/// Opens an RDMA device by name: checks it and its port, then hands it to the mlx5 data path.
fn open_rdma(name: &str, port: Option<u8>, cuda: Option<Arc<Cuda>>) -> Result<Device> {
    let on = |e: RdmaError| open_error(name, e);
    let ctx = Context::open(name).map_err(on)?;
    let port = usable_port(&ctx, port).map_err(on)?;
    drop(ctx);
    match MLX5_DATA_PATH {
        Some(open) => open(name, port, cuda),
        None => Err(Error::Unsupported(format!(
            "{name} port {port}: the mlx5 data path is not available in this build \
             (the soft device is: {DEVICE_VAR}=soft)"
        ))),
    }
}

impl Device {
    /// A soft device: a software model of the mlx5 RC data path, served by its own engine
    /// thread. Needs no hardware. Its queues' memory is mapped for the GPUs of the process's
    /// default CUDA handle ([`Cuda::get`]) where it has any; [`Device::soft_with_cuda`] takes
    /// a handle of your own.
    pub fn soft() -> Result<Self> {
        Self::soft_with_cuda(Cuda::default_gpus().cloned())
    }

    /// A soft device whose queues' memory (rings, doorbell pages, CQs) is mapped for the GPUs
    /// of `cuda`, or stays plain host memory (`None`: CPU triggers only).
    pub fn soft_with_cuda(cuda: Option<Arc<Cuda>>) -> Result<Self> {
        let provider: Arc<dyn crate::provider::Provider> = SoftDevice::new(cuda.as_ref())?;
        Ok(Device::from_provider(provider, cuda))
    }

    /// Opens the device `name`: `soft` (a new soft device), or an RDMA device and port
    /// (`mlx5_0`, `mlx5_0:2`; without a port, its first active one). Its queues' memory is
    /// mapped for the GPUs of the process's default CUDA handle ([`Cuda::get`]) where it has
    /// any; [`Device::open_with_cuda`] takes a handle of your own.
    pub fn open(name: &str) -> Result<Device> {
        Self::open_with_cuda(name, Cuda::default_gpus().cloned())
    }

    /// [`Device::open`], the queues' memory mapped for the GPUs of `cuda` (`None`: host
    /// memory only, CPU triggers).
    pub fn open_with_cuda(name: &str, cuda: Option<Arc<Cuda>>) -> Result<Device> {
        match name.parse::<DeviceName>().map_err(Error::invalid)? {
            DeviceName::Soft => Device::soft_with_cuda(cuda),
            DeviceName::Rdma { name, port } => open_rdma(&name, port, cuda),
        }
    }

    /// The device this process should use ([`DeviceSelection::for_process`]): the one
    /// `GDSYNC_DEVICE` names, else the first active mlx5 port, else the soft device. The
    /// choice and its reason are logged.
    #[allow(clippy::should_implement_trait)] // fallible: not `Default`
    pub fn default() -> Result<Device> {
        let s = DeviceSelection::for_process()?;
        tracing::info!("device {} ({})", s.device, s.why);
        let cuda = Cuda::default_gpus().cloned();
        match s.device {
            DeviceName::Soft => Device::soft_with_cuda(cuda),
            DeviceName::Rdma { name, port } => open_rdma(&name, port, cuda),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_bad_ones_say_why() {
        assert_eq!("soft".parse(), Ok(DeviceName::Soft));
        let n: DeviceName = "mlx5_0:2".parse().unwrap();
        assert_eq!(
            n,
            DeviceName::Rdma {
                name: "mlx5_0".into(),
                port: Some(2)
            }
        );
        assert_eq!(n.to_string(), "mlx5_0:2");
        assert_eq!(
            "mlx5_bond_0".parse::<DeviceName>().unwrap().to_string(),
            "mlx5_bond_0"
        );
        for bad in [
            "",
            ":1",
            "mlx5_0:",
            "mlx5_0:0",
            "mlx5_0:x",
            "mlx5_0:1:2",
            "a b",
        ] {
            let e = bad.parse::<DeviceName>().unwrap_err();
            assert!(e.contains("expected soft"), "{bad:?}: {e}");
        }
    }

    fn none_found() -> std::result::Result<(String, u8), RdmaError> {
        Err(RdmaError::NoDevice("no mlx5 device found".into()))
    }

    fn found() -> std::result::Result<(String, u8), RdmaError> {
        Ok(("mlx5_1".into(), 2))
    }

    #[test]
    fn the_environment_wins_and_a_bad_value_is_an_error() {
        let s = choose(Some("mlx5_0:1"), false, || unreachable!()).unwrap();
        assert_eq!(s.device.to_string(), "mlx5_0:1");
        assert_eq!(s.why, "GDSYNC_DEVICE=mlx5_0:1");
        let s = choose(Some("soft"), true, || unreachable!()).unwrap();
        assert_eq!(s.device, DeviceName::Soft);
        let e = choose(Some("mlx5_0:zero"), true, found).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid argument: GDSYNC_DEVICE=\"mlx5_0:zero\""),
            "{e}"
        );
        // Set but empty: as unset.
        assert_eq!(
            choose(Some(""), true, found).unwrap().device.to_string(),
            "mlx5_1:2"
        );
    }

    #[test]
    fn otherwise_the_first_active_mlx5_port_where_the_data_path_is_built() {
        let s = choose(None, true, found).unwrap();
        assert_eq!(s.device.to_string(), "mlx5_1:2");
        assert_eq!(s.why, "the first active mlx5 port");
        let s = choose(None, false, found).unwrap();
        assert_eq!(s.device, DeviceName::Soft);
        assert_eq!(
            s.why,
            "mlx5_1 port 2 is active, but this build has no mlx5 data path"
        );
        let s = choose(None, true, none_found).unwrap();
        assert_eq!(s.device, DeviceName::Soft);
        assert_eq!(
            s.why,
            "no mlx5 port to use: no RDMA device: no mlx5 device found"
        );
    }

    #[test]
    fn open_errors_say_invalid_argument_once_and_name_soft() {
        let e = open_error(
            "mlx5_0",
            RdmaError::InvalidArgument("mlx5_0 has 1 port(s), not 7".into()),
        );
        assert_eq!(
            e.to_string(),
            "invalid argument: mlx5_0 has 1 port(s), not 7"
        );
        let e = open_error(
            "x",
            RdmaError::NoDevice("the kernel has no RDMA subsystem".into()),
        );
        assert_eq!(
            e.to_string(),
            "invalid argument: no RDMA device: the kernel has no RDMA subsystem; the soft device is always there: soft"
        );
        let unknown = RdmaError::UnknownDevice {
            name: "mlx5_9".into(),
            present: "mlx5_0".into(),
        };
        let e = open_error("mlx5_9", unknown).to_string();
        assert!(e.contains("no RDMA device named \"mlx5_9\" (present: mlx5_0); the soft device is always there: soft"), "{e}");
    }

    #[test]
    fn opening_soft_by_name_gives_a_soft_device() {
        assert!(Device::open("soft").is_ok());
        assert!(matches!(
            Device::open("so ft"),
            Err(Error::InvalidArgument(_))
        ));
    }
}
