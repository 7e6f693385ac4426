//! What GPUDirect Async can use on this machine, and why not, in the manner of `ibv_devinfo`:
//! the CUDA driver and GPUs with their capabilities, RDMA devices, gdrcopy, NVRTC, the devices
//! gdasync can drive and the NIC handler it would choose.
//!
//! ```text
//! cargo run --release --example info
//! cargo run --release --example info -- --json
//! ```

use anyhow::Result;
use clap::Parser;
use gdasync::gdsync::cuda::{nvrtc_available, Cuda};
use gdasync::gdsync::probe::{rdma, Gdrcopy, RdmaStatus};
use gdasync::gdsync::NicHandler;

#[derive(Parser)]
#[command(about = "What GPUDirect Async can use on this machine")]
struct Args {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cuda = Cuda::get();
    let rdma = rdma();
    let gdr = Gdrcopy::probe();
    let nvrtc = nvrtc_available();
    let handler = NicHandler::choose_soft();
    let rdma_count = match &rdma {
        RdmaStatus::Devices(d) => d.len(),
        _ => 0,
    };

    if args.json {
        let mut o = String::from("{");
        match &cuda {
            Ok(c) => {
                o += &format!(
                    "\"cuda\":{{\"driver_version\":{},\"gpus\":[",
                    c.driver_version
                );
                for (i, g) in c.gpus.iter().enumerate() {
                    let k = &g.caps;
                    o += &format!(
                        "{}{{\"ordinal\":{},\"name\":\"{}\",\"compute_capability\":\"{}.{}\",\"mem_ops_64\":{},\"wait_nor\":{},\"flush_remote_writes\":{},\"gpudirect_rdma\":{},\"gpudirect_rdma_writes_ordering\":{},\"dma_buf\":{},\"unified_addressing\":{},\"host_pointer_for_registered_mem\":{},\"stream_mem_ops_v1\":{}}}",
                        if i > 0 { "," } else { "" },
                        g.ordinal,
                        esc(&g.name),
                        g.compute_capability.0,
                        g.compute_capability.1,
                        k.mem_ops_64,
                        k.wait_nor,
                        k.flush_remote_writes,
                        k.gpudirect_rdma,
                        k.gpudirect_rdma_writes_ordering,
                        k.dma_buf,
                        k.unified_addressing,
                        k.host_pointer_for_registered_mem,
                        k.stream_mem_ops_v1
                    );
                }
                o += "]},";
            }
            Err(e) => o += &format!("\"cuda\":{{\"error\":\"{}\"}},", esc(&e.to_string())),
        }
        o += &match &rdma {
            RdmaStatus::LibraryMissing(e) => format!(
                "\"rdma\":{{\"status\":\"library missing\",\"detail\":\"{}\"}},",
                esc(e)
            ),
            RdmaStatus::NoDevice => "\"rdma\":{\"status\":\"no device\"},".to_string(),
            RdmaStatus::Devices(d) => format!(
                "\"rdma\":{{\"status\":\"devices\",\"devices\":[{}]}},",
                d.iter()
                    .map(|x| format!("\"{}\"", esc(&x.name)))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        o += &format!(
            "\"gdrcopy\":{{\"library\":{},\"driver\":{}}},\"nvrtc\":{},",
            gdr.library, gdr.driver, nvrtc
        );
        o += "\"devices\":[\"soft\"],";
        o += &match &handler {
            Ok((h, why)) => format!(
                "\"nic_handler\":{{\"soft\":\"{h:?}\",\"why\":\"{}\"}}",
                esc(why)
            ),
            Err(e) => format!("\"nic_handler\":{{\"error\":\"{}\"}}", esc(&e.to_string())),
        };
        o += "}";
        println!("{o}");
        return Ok(());
    }

    println!("gdasync {}", env!("CARGO_PKG_VERSION"));
    match &cuda {
        Ok(c) => {
            println!(
                "CUDA driver: {}.{} ({} GPU(s)); hardware queues per context ({}): {}",
                c.driver_version / 1000,
                (c.driver_version % 1000) / 10,
                c.gpus.len(),
                gdasync::gdsync::cuda::MAX_CONNECTIONS_VAR,
                std::env::var(gdasync::gdsync::cuda::MAX_CONNECTIONS_VAR).unwrap_or("unset".into())
            );
            for g in &c.gpus {
                let k = &g.caps;
                println!(
                    "  GPU {}: {} (sm_{}{})",
                    g.ordinal, g.name, g.compute_capability.0, g.compute_capability.1
                );
                println!("    stream memops (v2 API) ............ yes (64-bit: {}, NOR waits: {}, flush remote writes: {})", yes(k.mem_ops_64), yes(k.wait_nor), yes(k.flush_remote_writes));
                println!(
                    "    legacy v1 memops enabled .......... {}",
                    yes(k.stream_mem_ops_v1)
                );
                println!(
                    "    GPUDirect RDMA .................... {} (writes ordering {})",
                    yes(k.gpudirect_rdma),
                    k.gpudirect_rdma_writes_ordering
                );
                println!("    dma-buf export .................... {}", yes(k.dma_buf));
                println!(
                    "    unified addressing ................ {} (host pointers usable: {})",
                    yes(k.unified_addressing),
                    yes(k.host_pointer_for_registered_mem)
                );
            }
        }
        Err(e) => println!(
            "CUDA: not usable ({e}); stream and kernel triggers unavailable, CPU paths work"
        ),
    }
    println!(
        "NVRTC (run-time kernel compiler): {}",
        if nvrtc {
            "available"
        } else {
            "missing (kernel-initiated mode unavailable)"
        }
    );
    match &rdma {
        RdmaStatus::LibraryMissing(e) => println!("RDMA: rdma-core not installed ({e})"),
        RdmaStatus::NoDevice => {
            println!("RDMA: rdma-core installed, no RDMA device (/sys/class/infiniband is empty)")
        }
        RdmaStatus::Devices(d) => {
            println!("RDMA: {} device(s)", d.len());
            for x in d {
                println!(
                    "  {} fw {} ports [{}]",
                    x.name,
                    x.fw_ver.as_deref().unwrap_or("?"),
                    x.ports.join(", ")
                );
            }
        }
    }
    println!(
        "gdrcopy: {} (library libgdrapi.so.2: {}, driver /dev/gdrdrv: {})",
        if gdr.usable() { "usable" } else { "not usable" },
        yes(gdr.library),
        yes(gdr.driver)
    );
    println!("Devices gdasync can use:");
    println!("  soft   software model of the mlx5 RC data path (always available)");
    if rdma_count > 0 {
        println!(
            "  mlx5   {rdma_count} RDMA device(s) found, but this build has no hardware path yet"
        );
    } else {
        println!("  mlx5   none (no RDMA device): using the soft device");
    }
    match handler {
        Ok((h, why)) => println!("NIC handler (soft device): {h:?} ({why})"),
        Err(e) => println!("NIC handler: {e}"),
    }
    Ok(())
}
