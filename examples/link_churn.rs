//! link_churn: short-lived peer devices come and go against one long-lived soft device, and
//! the long-lived device's healthy pair is timed between them. Each peer connects a QP to a
//! new QP of the long-lived device, writes `--bytes` into it, and is dropped (the long-lived
//! device destroys its QP). Every `--every` peers the table gets a row: the process's
//! resident and virtual memory, its mappings and threads, and the median time of an 8-byte
//! RDMA write on the healthy pair (post to completion, `--iters` of them). Links to peers
//! that are gone must be released: the columns stay flat.
//!
//! ```sh
//! cargo run --release --bin link_churn -- --peers 1000
//! cargo run --release --bin link_churn -- --peers 300 --link tcp
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{Context, Result};
use clap::Parser;
use common::ToolArgs;
use gdasync::gdsync::{
    accept_tcp_links, Access, Cq, Device, Endpoint, LinkPolicy, ProtectionDomain, Qp, QpConfig,
    SendWr,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "link_churn",
    version,
    about = "Peer devices come and go against a long-lived soft device: its memory, mappings, threads and a healthy pair's write latency"
)]
struct Args {
    /// Peer devices, one after the other.
    #[arg(long, default_value_t = 300)]
    peers: usize,
    /// A row every this many peers.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    every: u64,
    /// Bytes each peer writes.
    #[arg(long, default_value_t = 4 << 20)]
    bytes: usize,
    /// Timed writes on the healthy pair per row.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// How the devices link: `memory` (in this process) or `tcp` (through this process's
    /// listener).
    #[arg(long, default_value = "memory", value_parser = ["memory", "tcp"])]
    link: String,
    #[command(flatten)]
    tool: ToolArgs,
}

/// A QP on a device, with its PD and CQ.
struct End {
    pd: ProtectionDomain,
    cq: Cq,
    qp: Qp,
}

impl End {
    fn on(dev: &Device) -> Result<End> {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64)?;
        let qp = pd.create_qp(&cq, &cq, &QpConfig::default())?;
        Ok(End { pd, cq, qp })
    }
}

fn endpoint(e: &End, tcp: bool) -> Endpoint {
    let ep = e.qp.endpoint();
    if tcp {
        Endpoint {
            link: LinkPolicy::Tcp,
            ..ep
        }
    } else {
        ep
    }
}

/// Connects two QPs (from two threads: over TCP the first to dial may wait for the other).
fn connect(a: &mut End, b: &mut End, tcp: bool) -> Result<()> {
    let (ea, eb) = (endpoint(a, tcp), endpoint(b, tcp));
    std::thread::scope(|s| {
        let qb = &mut b.qp;
        let h = s.spawn(move || qb.connect(&ea));
        a.qp.connect(&eb)?;
        h.join().expect("connect thread")?;
        Ok(())
    })
}

/// Writes `src` into `dst` (a region of `b`) from `a` and waits for the completion.
fn write(
    a: &mut End,
    src: &gdasync::gdsync::MemoryRegion<'_>,
    dst: gdasync::gdsync::RemoteAddr,
) -> Result<()> {
    a.qp.post_send(&SendWr::write(dst).sge(src.sge(..)))?;
    let c = a.cq.wait_one(Duration::from_secs(10))?;
    anyhow::ensure!(c.is_ok(), "write failed: {c:?}");
    Ok(())
}

/// Resident and virtual memory (MiB), mappings and threads of this process.
fn usage() -> (f64, f64, usize, usize) {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let mut f = statm
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(0.0));
    let (size, rss) = (f.next().unwrap_or(0.0), f.next().unwrap_or(0.0));
    let maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    (rss * 4.0 / 1024.0, size * 4.0 / 1024.0, maps, threads)
}

fn run(args: &Args) -> Result<()> {
    let tcp = args.link == "tcp";
    if tcp {
        accept_tcp_links(None).context("listen for TCP links")?;
    }
    let server = Device::soft()?;
    let other = Device::soft()?;
    let (mut ha, mut hb) = (End::on(&server)?, End::on(&other)?);
    connect(&mut ha, &mut hb, tcp)?;
    let mut word = [1u8; 8];
    let mut target = [0u8; 8];
    let src8 = ha.pd.register(&mut word, Access::empty())?;
    let dst8 = hb.pd.register(&mut target, Access::ALL)?;
    let mut payload = vec![7u8; args.bytes];
    println!("# link_churn: {} peers over {} links, {} B each; healthy pair: 8-byte RDMA write, post to completion, median of {}", args.peers, args.link, args.bytes, args.iters);
    println!(
        "{:>6} {:>9} {:>9} {:>6} {:>8} {:>12}",
        "peers", "RSS_MiB", "VM_MiB", "maps", "threads", "write8_p50_us"
    );
    let mut samples = Vec::with_capacity(args.iters);
    for peers in 0..=args.peers {
        if peers as u64 % args.every == 0 || peers == args.peers {
            samples.clear();
            for _ in 0..args.iters {
                let t = Instant::now();
                write(&mut ha, &src8, dst8.remote().at(0))?;
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
            samples.sort_by(f64::total_cmp);
            let p50 = samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN);
            let (rss, vm, maps, threads) = usage();
            println!("{peers:>6} {rss:>9.1} {vm:>9.1} {maps:>6} {threads:>8} {p50:>12.3}");
        }
        if peers == args.peers {
            break;
        }
        let mut s = End::on(&server)?;
        let peer = Device::soft()?;
        let mut p = End::on(&peer)?;
        connect(&mut p, &mut s, tcp)?;
        let mut dst = vec![0u8; args.bytes];
        let dmr = s.pd.register(&mut dst, Access::ALL)?;
        let smr = p.pd.register(&mut payload, Access::empty())?;
        write(&mut p, &smr, dmr.remote().at(0))?;
        // The long-lived device's QP goes first, then the peer.
        drop((smr, dmr, s));
        drop((p, peer));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| run(&args))
}
