//! Unidirectional bandwidth and message rate, perftest style (`ib_write_bw`).
//!
//! Rank 0 keeps a window of RDMA writes (or reads, or sends) in flight to rank 1 and counts
//! completions; rank 1 only serves (and, for sends, keeps receives posted).
//!
//! ```text
//! cargo run --release --example bandwidth -- --sizes 4096,65536,1048576
//! ```

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use gdasync::gdsync::{Access, Device, QpConfig, RecvWr, SendWr};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    Write,
    Read,
    Send,
}

#[derive(Parser, Debug)]
#[command(about = "Unidirectional bandwidth between two soft devices (perftest style)")]
struct Args {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Comma-separated message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = vec![4096usize, 65536, 1 << 20])]
    sizes: Vec<usize>,
    /// Messages per size (default: 20000, fewer for large sizes).
    #[arg(long)]
    iters: Option<usize>,
    /// Messages in flight.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// One JSON object per size instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let max = *args.sizes.iter().max().unwrap_or(&0);
    if max == 0 || max > 1 << 30 {
        bail!("sizes must be in 1..=1 GiB");
    }
    if args.window == 0 || args.window > 128 {
        bail!("--window must be in 1..=128");
    }
    let cfg = QpConfig {
        send_wqebbs: 512,
        recv_wqes: 512,
        ..QpConfig::default()
    };
    let (d0, d1) = (Device::soft()?, Device::soft()?);
    let (pd0, pd1) = (d0.alloc_pd(), d1.alloc_pd());
    let (cq0, cq1) = (d0.create_cq(1024)?, d1.create_cq(1024)?);
    let mut q0 = pd0.create_qp(&cq0, &cq0, &cfg)?;
    let mut q1 = pd1.create_qp(&cq1, &cq1, &cfg)?;
    q0.connect(&q1.endpoint())?;
    q1.connect(&q0.endpoint())?;
    let mut b0 = vec![1u8; max];
    let mut b1 = vec![2u8; max];
    let m0 = pd0.register(&mut b0, Access::ALL)?;
    let m1 = pd1.register(&mut b1, Access::ALL)?;
    let remote = m1.remote();

    if !args.json {
        println!(
            "# bandwidth: op {:?} trigger cpu mem host ranks threads window {}",
            args.op, args.window
        );
        println!(
            "{:>10} {:>10} {:>12} {:>12}",
            "bytes", "iters", "BW[GB/s]", "rate[Mmsg/s]"
        );
    }
    for &size in &args.sizes {
        let iters = args
            .iters
            .unwrap_or_else(|| 20_000usize.min(((8usize << 30) / size).max(100)));
        let mut posted = 0usize;
        let mut done = 0usize;
        let mut recvs = 0usize;
        let start = Instant::now();
        while done < iters {
            while posted < iters && posted - done < args.window {
                if args.op == Op::Send {
                    // The server keeps receives ahead of the sends (credits, not RNR).
                    while recvs < posted + args.window && recvs < iters {
                        q1.post_recv(&RecvWr::new().sge(m1.sge(..size)))?;
                        recvs += 1;
                    }
                }
                let wr = match args.op {
                    Op::Write => SendWr::write(remote.at(0)),
                    Op::Read => SendWr::read(remote.at(0)),
                    Op::Send => SendWr::send(),
                };
                q0.post_send(&wr.sge(m0.sge(..size)))?;
                posted += 1;
            }
            let c = cq0.wait_one(Duration::from_secs(10))?;
            c.ok()?;
            done += 1;
            if args.op == Op::Send {
                while cq1.poll_one()?.is_some() {}
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let gbs = (iters * size) as f64 / secs / 1e9;
        let rate = iters as f64 / secs / 1e6;
        if args.json {
            println!("{{\"op\":\"{:?}\",\"trigger\":\"cpu\",\"mem\":\"host\",\"bytes\":{size},\"iters\":{iters},\"window\":{},\"gbytes_per_s\":{gbs:.3},\"mmsg_per_s\":{rate:.4}}}", args.op, args.window);
        } else {
            println!("{size:>10} {iters:>10} {gbs:>12.3} {rate:>12.4}");
        }
        while cq1.poll_one()?.is_some() {}
    }
    Ok(())
}
