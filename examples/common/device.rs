//! `--device`: which device a tool's ranks run on, the same flag in every tool (perftest's
//! `-d`). Resolved once, so the header names the device and every rank opens the same one.

use anyhow::{Context, Result};
use gdasync::gdsync::{Device, DeviceName, DeviceSelection};

/// The device flag.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// The device: `soft` (the software NIC), or an RDMA device and port (`mlx5_0`,
    /// `mlx5_0:1`). Default: GDSYNC_DEVICE, else the first active mlx5 port, else soft.
    #[arg(long, short = 'd', value_parser = parse_device)]
    pub device: Option<DeviceName>,
}

fn parse_device(s: &str) -> std::result::Result<DeviceName, String> {
    s.parse()
}

impl DeviceArgs {
    /// The device named, else the process's default choice ([`DeviceSelection`]).
    pub fn resolve(&self) -> Result<DeviceName> {
        match &self.device {
            Some(d) => Ok(d.clone()),
            None => Ok(DeviceSelection::for_process()?.device),
        }
    }
}

/// Opens `name` for a rank.
pub fn open(name: &DeviceName) -> Result<Device> {
    Device::open(&name.to_string()).with_context(|| format!("device {name}"))
}

/// Whether `name` is an RDMA device (its QPs reach each other through the HCA).
pub fn is_rdma(name: &DeviceName) -> bool {
    matches!(name, DeviceName::Rdma { .. })
}
