//! What GPUDirect Async can use on this machine, and why not, in the manner of
//! `ibv_devinfo -v`: every device gdasync can drive with its limits and port, the RDMA devices
//! found, the device a program opens by default and why, the CUDA driver and GPUs with their
//! capabilities, gdrcopy, NVRTC, and (where a GPU exists) the NIC handler the GPU triggers
//! would use.
//!
//! ```text
//! cargo run --release --bin info
//! cargo run --release --bin info -- --json
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::Result;
use clap::Parser;
use common::json::{array, Object, Value};
use common::out::outln;
use common::rdma::{link_layer, mtu_code, state, yes, RdmaDevice, RdmaPort};
use common::ToolArgs;
use gdasync::gdsync::cuda::{nvrtc_available, Cuda, GpuInfo, InboundWrites};
use gdasync::gdsync::mlx5::{DeviceLimits, RdmaError};
use gdasync::gdsync::probe::Gdrcopy;
use gdasync::gdsync::{
    peer_memory_loaded, Device, DeviceAttr, DeviceSelection, GpuMemoryPath, NicHandler, PortAttr,
};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "info",
    version,
    about = "What GPUDirect Async can use on this machine (as ibv_devinfo -v)"
)]
struct Args {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tool: ToolArgs,
}

/// Everything probed, once.
struct Machine {
    cuda: Result<&'static Cuda, String>,
    /// The RDMA devices rdma-core finds, or why it finds none.
    rdma: Result<Vec<RdmaDevice>, RdmaError>,
    /// The device `Device::default()` opens (`GDSYNC_DEVICE`, else the first active mlx5
    /// port, else the soft device), and why.
    default: Result<DeviceSelection, String>,
    gdr: Gdrcopy,
    nvrtc: bool,
    dev: DeviceAttr,
    port: PortAttr,
    /// `GDSYNC_SOFT_LINK`, as set.
    link_policy: String,
}

impl Machine {
    fn probe() -> Result<Machine> {
        let soft = Device::soft()?;
        Ok(Machine {
            cuda: Cuda::get().map(|c| &**c).map_err(|e| e.to_string()),
            rdma: RdmaDevice::probe(),
            default: DeviceSelection::for_process().map_err(|e| e.to_string()),
            gdr: Gdrcopy::probe(),
            nvrtc: nvrtc_available(),
            dev: soft.query(),
            port: soft.query_port(1)?,
            link_policy: std::env::var("GDSYNC_SOFT_LINK").unwrap_or_else(|_| "auto".into()),
        })
    }
    /// The GPUs, if CUDA works and has any.
    fn gpus(&self) -> &[GpuInfo] {
        self.cuda.as_ref().map_or(&[], |c| &c.gpus)
    }
}

// ---------------------------------------------------------------------------- text

/// The RDMA devices rdma-core finds, printed as `ibv_devinfo` does, or why there are none.
fn rdma_text(rdma: &Result<Vec<RdmaDevice>, RdmaError>) {
    let list = match rdma {
        Ok(l) if l.is_empty() => return outln!("RDMA devices: none (rdma-core found no device)"),
        Ok(l) => l,
        Err(e) => return outln!("RDMA devices: none ({e})"),
    };
    for d in list {
        let (usable, why) = d.usable();
        let not = if usable { "" } else { "not usable: " };
        outln!("hca_id:\t{} (rdma-core; {not}{why})", d.name);
        match &d.query {
            Ok((a, ports)) => device_text(a, ports),
            Err(e) => outln!("\t{e}"),
        }
    }
}

fn device_text(a: &DeviceLimits, ports: &[RdmaPort]) {
    outln!("\ttransport:\t\t\tInfiniBand (0)");
    outln!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    outln!("\tnode_guid:\t\t\t{}", a.node_guid);
    outln!("\tsys_image_guid:\t\t\t{}", a.sys_image_guid);
    outln!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    outln!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    outln!("\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    outln!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    for p in ports {
        port_text(p);
    }
}

fn port_text(port: &RdmaPort) {
    let p = &port.info;
    outln!("\t\tport:\t{}", p.port);
    outln!("\t\t\tstate:\t\t\t{}", p.state);
    outln!("\t\t\tmax_mtu:\t\t{} ({})", p.max_mtu, mtu_code(p.max_mtu));
    outln!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu,
        mtu_code(p.active_mtu)
    );
    outln!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    outln!("\t\t\tport_lid:\t\t{}", p.lid);
    outln!("\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
    outln!("\t\t\tlink_layer:\t\t{}", p.link_layer);
    match &port.gid {
        Ok(g) => outln!(
            "\t\t\tGID[{:>3}]:\t\t{}, {} (used for connections: {})",
            g.entry.index,
            g.entry.gid,
            g.entry.kind,
            g.why
        ),
        Err(e) => outln!("\t\t\tGID:\t\t\t{e}"),
    }
}

fn text(m: &Machine) {
    outln!("gdasync {}", env!("CARGO_PKG_VERSION"));
    let (d, p) = (&m.dev, &m.port);
    outln!("hca_id: soft (software model of the mlx5 RC data path; always available)");
    outln!("\ttransport:\t\tRC over the soft device's links");
    outln!("\tmax_qp:\t\t\t{}", d.max_qp);
    outln!("\tmax_qp_wr:\t\t{}", d.max_qp_wr);
    outln!("\tmax_sge:\t\t{}", d.max_sge);
    outln!("\tmax_cqe:\t\t{}", d.max_cqe);
    outln!("\tmax_inline_data:\t{}", d.max_inline_data);
    outln!("\tphys_port_cnt:\t\t{}", d.phys_port_cnt);
    outln!("\t\tport:\t1");
    outln!("\t\t\tstate:\t\t{}", state(p.state));
    outln!("\t\t\tmax_mtu:\t{}", p.max_mtu);
    outln!("\t\t\tactive_mtu:\t{}", p.active_mtu);
    outln!("\t\t\tmax_msg_sz:\t{:#x}", p.max_msg_sz);
    outln!(
        "\t\t\tlink_layer:\t{} (in-process rings, shared memory between processes, TCP between hosts; GDSYNC_SOFT_LINK={})",
        link_layer(p.link_layer),
        m.link_policy
    );
    rdma_text(&m.rdma);
    match &m.default {
        Ok(s) => outln!("default device: {} ({})", s.device, s.why),
        Err(e) => outln!("default device: none ({e})"),
    }
    match &m.cuda {
        Ok(c) => {
            outln!(
                "CUDA driver: {}.{} ({} GPU(s)); hardware queues per context ({}): {}",
                c.driver_version / 1000,
                (c.driver_version % 1000) / 10,
                c.gpus.len(),
                gdasync::gdsync::cuda::MAX_CONNECTIONS_VAR,
                std::env::var(gdasync::gdsync::cuda::MAX_CONNECTIONS_VAR)
                    .unwrap_or("unset".into())
            );
            for g in &c.gpus {
                gpu_text(g);
            }
        }
        Err(e) => outln!(
            "CUDA: not usable ({e}); the stream and kernel triggers are unavailable, the CPU paths work"
        ),
    }
    outln!(
        "NVRTC (run-time kernel compiler): {}",
        if m.nvrtc {
            "available"
        } else {
            "missing (kernel-initiated mode unavailable)"
        }
    );
    outln!(
        "gdrcopy: {} (library libgdrapi.so.2: {}, driver /dev/gdrdrv: {})",
        if m.gdr.usable() {
            "usable"
        } else {
            "not usable"
        },
        yes(m.gdr.library),
        yes(m.gdr.driver)
    );
    if !m.gpus().is_empty() {
        match NicHandler::choose_soft() {
            Ok((h, why)) => outln!("NIC handler (who rings the soft device's doorbells for GPU triggers): {h:?} ({why})"),
            Err(e) => outln!("NIC handler: {e}"),
        }
    }
    for (dev, path) in gpu_memory_paths(m) {
        match path {
            Ok((p, why)) => outln!("GPU memory path ({dev}): {p:?} ({why})"),
            Err(e) => outln!("GPU memory path ({dev}): {e}"),
        }
    }
}

/// How GPU payloads reach each kind of device ([`GpuMemoryPath`]): the soft device, and an
/// mlx5 device on GPU 0 where a GPU exists (dma-buf export, peer-memory module).
fn gpu_memory_paths(
    m: &Machine,
) -> Vec<(
    &'static str,
    gdasync::gdsync::Result<(GpuMemoryPath, String)>,
)> {
    let mut v = vec![("soft device", GpuMemoryPath::choose_soft(None))];
    if let Some(g) = m.gpus().first() {
        v.push((
            "mlx5",
            GpuMemoryPath::choose_mlx5(None, g.caps.dma_buf, peer_memory_loaded()),
        ));
    }
    v
}

fn gpu_text(g: &GpuInfo) {
    let k = &g.caps;
    outln!(
        "  GPU {}: {} (sm_{}{})",
        g.ordinal,
        g.name,
        g.compute_capability.0,
        g.compute_capability.1
    );
    outln!(
        "    stream memops (v2 API) ............ yes (64-bit: {}, NOR waits: {}, flush remote writes: {})",
        yes(k.mem_ops_64),
        yes(k.wait_nor),
        yes(k.flush_remote_writes)
    );
    outln!(
        "    legacy v1 memops enabled .......... {}",
        yes(k.stream_mem_ops_v1)
    );
    outln!(
        "    GPUDirect RDMA .................... {} (writes ordering {})",
        yes(k.gpudirect_rdma),
        k.gpudirect_rdma_writes_ordering
    );
    outln!(
        "    inbound RDMA writes flush ......... {}",
        k.inbound_line()
    );
    outln!("    dma-buf export .................... {}", yes(k.dma_buf));
    outln!(
        "    unified addressing ................ {} (host pointers usable: {})",
        yes(k.unified_addressing),
        yes(k.host_pointer_for_registered_mem)
    );
}

// ---------------------------------------------------------------------------- JSON

fn json(m: &Machine) -> Object {
    let (d, p) = (&m.dev, &m.port);
    let port = Object::new()
        .set("port", 1u32)
        .set("state", state(p.state))
        .set("max_mtu", p.max_mtu)
        .set("active_mtu", p.active_mtu)
        .set("max_msg_sz", p.max_msg_sz)
        .set("link_layer", link_layer(p.link_layer))
        .set("link_policy", m.link_policy.as_str());
    let soft = Object::new()
        .set("name", "soft")
        .set("usable", true)
        .set("max_qp", d.max_qp)
        .set("max_qp_wr", d.max_qp_wr)
        .set("max_sge", d.max_sge)
        .set("max_cqe", d.max_cqe)
        .set("max_inline_data", d.max_inline_data)
        .set("phys_port_cnt", d.phys_port_cnt)
        .set("ports", array([port]));
    let mut devices = vec![Value::from(soft)];
    if let Ok(list) = &m.rdma {
        devices.extend(list.iter().map(rdma_device_json));
    }
    let rdma = match &m.rdma {
        Err(e @ (RdmaError::LibraryMissing { .. } | RdmaError::LibraryTooOld { .. })) => {
            Object::new()
                .set("status", "library missing")
                .set("detail", e.to_string())
        }
        Err(e @ RdmaError::NoDevice(_)) => Object::new()
            .set("status", "no device")
            .set("detail", e.to_string()),
        Err(e) => Object::new()
            .set("status", "error")
            .set("detail", e.to_string()),
        Ok(l) if l.is_empty() => Object::new().set("status", "no device"),
        Ok(_) => Object::new().set("status", "devices"),
    };
    let default = match &m.default {
        Ok(s) => Object::new()
            .set("name", s.device.to_string())
            .set("why", s.why.as_str()),
        Err(e) => Object::new().set("error", e.as_str()),
    };
    let cuda = match &m.cuda {
        Ok(c) => Object::new()
            .set("driver_version", c.driver_version)
            .set("gpus", array(c.gpus.iter().map(gpu_json))),
        Err(e) => Object::new().set("error", e.as_str()),
    };
    let handler = if m.gpus().is_empty() {
        Value::Null
    } else {
        match NicHandler::choose_soft() {
            Ok((h, why)) => Object::new()
                .set("soft", format!("{h:?}"))
                .set("why", why)
                .into(),
            Err(e) => Object::new().set("error", e.to_string()).into(),
        }
    };
    Object::new()
        .set("version", env!("CARGO_PKG_VERSION"))
        .set("devices", array(devices))
        .set("rdma", rdma)
        .set("default_device", default)
        .set("cuda", cuda)
        .set(
            "gdrcopy",
            Object::new()
                .set("library", m.gdr.library)
                .set("driver", m.gdr.driver),
        )
        .set("nvrtc", m.nvrtc)
        .set("nic_handler", handler)
        .set("gpu_memory", gpu_memory_json(m))
}

/// `gpu_memory_paths` as an object: device kind to path and why.
fn gpu_memory_json(m: &Machine) -> Object {
    let mut o = Object::new();
    for (dev, path) in gpu_memory_paths(m) {
        let key = if dev == "mlx5" { "mlx5" } else { "soft" };
        o = o.set(
            key,
            match path {
                Ok((p, why)) => Object::new().set("path", format!("{p:?}")).set("why", why),
                Err(e) => Object::new().set("error", e.to_string()),
            },
        );
    }
    o
}

/// An RDMA device as `ibv_devinfo` describes it, with the GID each port's connections use.
fn rdma_device_json(d: &RdmaDevice) -> Value {
    let (usable, why) = d.usable();
    let o = Object::new()
        .set("name", d.name.as_str())
        .set("usable", usable)
        .set("why", why);
    let (a, ports) = match &d.query {
        Ok(q) => q,
        Err(e) => return o.set("error", e.to_string()).into(),
    };
    o.set("fw_ver", a.fw_ver.as_str())
        .set("node_guid", a.node_guid.as_str())
        .set("sys_image_guid", a.sys_image_guid.as_str())
        .set("vendor_id", a.vendor_id)
        .set("vendor_part_id", a.vendor_part_id)
        .set("hw_ver", a.hw_ver)
        .set("max_qp", a.max_qp)
        .set("max_qp_wr", a.max_qp_wr)
        .set("max_sge", a.max_sge)
        .set("max_cqe", a.max_cqe)
        .set("phys_port_cnt", a.phys_port_cnt)
        .set("ports", array(ports.iter().map(rdma_port_json)))
        .into()
}

fn rdma_port_json(port: &RdmaPort) -> Value {
    let p = &port.info;
    let gid = match &port.gid {
        Ok(g) => Object::new()
            .set("index", g.entry.index)
            .set("gid", g.entry.gid.to_string())
            .set("type", g.entry.kind.to_string())
            .set("why", g.why),
        Err(e) => Object::new().set("error", e.to_string()),
    };
    Object::new()
        .set("port", p.port)
        .set("state", p.state.name_and_value().0)
        .set("max_mtu", p.max_mtu)
        .set("active_mtu", p.active_mtu)
        .set("max_msg_sz", p.max_msg_sz)
        .set("link_layer", p.link_layer.to_string())
        .set("lid", p.lid)
        .set("sm_lid", p.sm_lid)
        .set("gid", gid)
        .into()
}

fn gpu_json(g: &GpuInfo) -> Value {
    let k = &g.caps;
    Object::new()
        .set("ordinal", g.ordinal)
        .set("name", g.name.as_str())
        .set(
            "compute_capability",
            format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
        )
        .set("mem_ops_64", k.mem_ops_64)
        .set("wait_nor", k.wait_nor)
        .set("flush_remote_writes", k.flush_remote_writes)
        .set(
            "inbound_rdma_writes",
            Object::new()
                .set(
                    "policy",
                    match k.inbound_writes(true) {
                        InboundWrites::InOrder => "not needed",
                        InboundWrites::Flush => "stream waits flush",
                        InboundWrites::Unordered => "unordered: GPU memory refused as a target",
                    },
                )
                .set("why", k.inbound_line()),
        )
        .set("gpudirect_rdma", k.gpudirect_rdma)
        .set(
            "gpudirect_rdma_writes_ordering",
            k.gpudirect_rdma_writes_ordering,
        )
        .set("dma_buf", k.dma_buf)
        .set("unified_addressing", k.unified_addressing)
        .set(
            "host_pointer_for_registered_mem",
            k.host_pointer_for_registered_mem,
        )
        .set("stream_mem_ops_v1", k.stream_mem_ops_v1)
        .into()
}

fn run(args: &Args) -> Result<()> {
    let m = Machine::probe()?;
    if args.json {
        outln!("{}", json(&m));
    } else {
        text(&m);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| run(&args))
}
