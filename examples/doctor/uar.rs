//! The doctor's doorbell step: whether a GPU can store to the HCA's doorbell (UAR) page, so
//! that streams and kernels ring it themselves, or a CPU proxy thread rings for them. Asked of
//! a queue pair made on the device (the library registers the page with CUDA's IOMEMORY flag
//! when it makes one), with what the NVIDIA driver was loaded with (`PeerMappingOverride`).

use crate::step::{Status, Step};
use gdasync::gdsync::cuda::Cuda;
use gdasync::gdsync::{mlx5, Device, NicHandler, QpConfig};

const NAME: &str = "GPU mapping of the doorbell (UAR)";

/// Who rings for GPU-posted work on `dev`: the handler a new QP of it got.
pub fn handler_of(dev: &Device) -> anyhow::Result<NicHandler> {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16)?;
    let qp = pd.create_qp(&cq, &cq, &QpConfig::default())?;
    Ok(qp.nic_handler())
}

/// `PeerMappingOverride` as the NVIDIA kernel module was loaded with it
/// (`/proc/driver/nvidia/params`, `RegistryDwords`).
fn peer_mapping_override() -> String {
    let params = std::fs::read_to_string("/proc/driver/nvidia/params").unwrap_or_default();
    let dwords = params
        .lines()
        .find_map(|l| l.strip_prefix("RegistryDwords:"))
        .map(|v| v.trim().trim_matches('"').to_string());
    match dwords {
        None => "unknown (no /proc/driver/nvidia/params)".into(),
        Some(d) => d
            .split(';')
            .find_map(|kv| kv.trim().strip_prefix("PeerMappingOverride="))
            .map_or_else(|| "not set".into(), |v| v.to_string()),
    }
}

/// Whether this process runs under the emulated RDMA driver (its doorbell pages are
/// ordinary memory).
pub fn emulated() -> bool {
    mlx5::serve_emulated_driver().is_ok()
}

/// Step 6 for the device `about` (`soft`, `mlx5_0:1`) opened as `dev`.
pub fn step(about: &str, dev: &Device, cuda: Option<&Cuda>) -> (Step, Option<NicHandler>) {
    let rdma = about != "soft";
    let emulated = rdma && emulated();
    let memory = match (rdma, emulated) {
        (false, _) => "soft device: the doorbell page is pinned host memory",
        (true, true) => "ordinary memory: emulated driver",
        (true, false) => "I/O memory of the HCA",
    };
    let Some(cuda) = cuda.filter(|c| !c.gpus.is_empty()) else {
        return (
            Step::new(Status::Skip, NAME, about, format!("no GPU; {memory}"), ""),
            None,
        );
    };
    let h = match handler_of(dev) {
        Ok(h) => h,
        Err(e) => {
            let s = Step::new(
                Status::Fail,
                NAME,
                about,
                format!("a queue pair could not be made: {e:#}"),
                "see the device and port step; run with --debug for the library's log",
            );
            return (s, None);
        }
    };
    let asked_cpu = std::env::var("GDSYNC_NIC_HANDLER").is_ok_and(|v| v == "cpu");
    let registration = match (rdma, emulated, h, asked_cpu) {
        (false, ..) => "registered as pinned host memory",
        (true, true, ..) => "registered plainly (IOMEMORY is for device memory)",
        (true, false, _, true) => "not needed (GDSYNC_NIC_HANDLER=cpu)",
        (true, false, NicHandler::Gpu, false) => "IOMEMORY registration accepted",
        (true, false, NicHandler::Cpu, false) => "IOMEMORY registration refused",
    };
    let addr = if cuda.host_pointers_are_device_pointers() {
        "device pointer: the host address (unified addressing)"
    } else {
        "device pointer: differs from the host address"
    };
    let who = match h {
        NicHandler::Gpu => "the GPU",
        NicHandler::Cpu => "the CPU proxy",
    };
    let value = format!(
        "{memory}; {registration}; {addr}; PeerMappingOverride {}; {who} rings for streams and kernels",
        peer_mapping_override()
    );
    let s = if h == NicHandler::Gpu || asked_cpu {
        Step::ok(NAME, about, value)
    } else {
        Step::new(
            Status::Warn,
            NAME,
            about,
            value,
            "load the nvidia module with NVreg_RegistryDwords=\"PeerMappingOverride=1\" (options nvidia in /etc/modprobe.d, then reload it) so the GPU may map the HCA's page",
        )
    };
    (s, Some(h))
}
