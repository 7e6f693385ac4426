//! `--device`: which device a tool's ranks run on, the same flag in every tool (perftest's
//! `-d`). Resolved once, so the header names the device and every rank opens the same one.

use anyhow::{bail, Context, Result};
use gdasync::gdsync::{mlx5, Device, DeviceName, DeviceSelection, GpuMemoryPath};

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
    /// The device named (an RDMA device must be present), else the process's default choice
    /// ([`DeviceSelection`]). Called before anything is printed, so that a wrong name is one
    /// line.
    pub fn resolve(&self) -> Result<DeviceName> {
        match &self.device {
            Some(d) => present(d).map(|()| d.clone()),
            None => Ok(DeviceSelection::for_process()?.device),
        }
    }
}

/// Whether device `d` is here; if not, an error that names the devices that are.
fn present(d: &DeviceName) -> Result<()> {
    let DeviceName::Rdma { name, .. } = d else {
        return Ok(());
    };
    let (mut here, why) = match mlx5::devices() {
        Ok(list) => (list.into_iter().map(|i| i.name).collect::<Vec<_>>(), None),
        Err(e) => (Vec::new(), Some(e)),
    };
    if here.contains(name) {
        return Ok(());
    }
    here.insert(0, "soft".into());
    let why = why.map(|e| format!(" ({e})")).unwrap_or_default();
    bail!(
        "device {d}: no such device; the devices here: {}{why}",
        here.join(", ")
    )
}

/// Opens `name` for a rank.
pub fn open(name: &DeviceName) -> Result<Device> {
    Device::open(&name.to_string()).with_context(|| format!("device {name}"))
}

/// Whether `name` is an RDMA device (its QPs reach each other through the HCA).
pub fn is_rdma(name: &DeviceName) -> bool {
    matches!(name, DeviceName::Rdma { .. })
}

/// How GPU payloads reach device `name` (staged or direct, [`GpuMemoryPath`]) and why, with
/// `asked` the program's choice (`None`: GDSYNC_STAGING, else automatic). An RDMA device goes
/// direct where GPU `gpu` exports dma-bufs or a peer-memory module is loaded.
pub fn gpu_memory_path(
    name: &DeviceName,
    gpu: i32,
    asked: Option<GpuMemoryPath>,
) -> Result<(GpuMemoryPath, String)> {
    if !is_rdma(name) {
        return Ok(GpuMemoryPath::choose_soft(asked)?);
    }
    let dma_buf = gdasync::gdsync::cuda::Cuda::get()?.gpu(gpu)?.caps.dma_buf;
    Ok(GpuMemoryPath::choose_mlx5(
        asked,
        dma_buf,
        gdasync::gdsync::peer_memory_loaded(),
    )?)
}

/// `path` and why, as one phrase for a header: "staged (why)" or "direct (why)".
pub fn gpu_memory_phrase(path: &(GpuMemoryPath, String)) -> String {
    let p = match path.0 {
        GpuMemoryPath::Staged => "staged",
        GpuMemoryPath::Direct => "direct",
    };
    format!("{p} ({})", path.1)
}
