//! Message rate over one soft-device link with several QP pairs: a stand-alone probe that
//! builds unchanged on this and older builds (it uses only API they share), to compare them
//! side by side.
//!
//! Two soft devices of this process; `QPS` QP pairs between them. One thread posts RDMA
//! writes (or sends) round-robin over the pairs, each pair with `WINDOW` messages in flight
//! and one in `WINDOW / 4` signalled, for `SECONDS` after a quarter of that as warm-up; prints
//! messages/s. The link is the one the process's `GDSYNC_SOFT_LINK` picks (`tcp` forces TCP
//! between the two devices). It is an example of the `gdasync-examples` package; in a checkout
//! older than that package, copy it into examples/ first
//! (`cp scripts/msgrate-probe.rs examples/msgrate_probe.rs`).
//!
//! ```text
//! cargo build --release --example msgrate_probe
//! GDSYNC_SOFT_LINK=tcp target/release/examples/msgrate_probe 8 8 1.2 64 write
//! #                                                  QPS BYTES SECONDS WINDOW write|send
//! ```

use gdasync::gdsync::{Access, Device, PinnedBuffer, Qp, QpConfig, RecvWr, SendWr};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn arg(i: usize, default: &str) -> String {
    std::env::args()
        .nth(i)
        .unwrap_or_else(|| default.to_string())
}

fn main() -> R<()> {
    let qps: usize = arg(1, "8").parse()?;
    let size: usize = arg(2, "8").parse()?;
    let seconds: f64 = arg(3, "2").parse()?;
    let window: u64 = arg(4, "64").parse()?;
    let send = arg(5, "write") == "send";
    let chunk = (window / 4).max(1);
    let cfg = QpConfig {
        send_wqebbs: 512,
        recv_wqes: 512,
        ..QpConfig::default()
    };
    let (d0, d1) = (Device::soft()?, Device::soft()?);
    let (pd0, pd1) = (d0.alloc_pd(), d1.alloc_pd());
    let scq = d0.create_cq(4096)?;
    let rcq0 = d0.create_cq(64)?;
    let rcq1 = d1.create_cq(4096)?;
    let mut q0: Vec<Qp> = Vec::new();
    let mut q1: Vec<Qp> = Vec::new();
    for _ in 0..qps {
        let mut a = pd0.create_qp(&scq, &rcq0, &cfg)?;
        let mut b = pd1.create_qp(&rcq1, &rcq1, &cfg)?;
        a.connect(&b.endpoint())?;
        b.connect(&a.endpoint())?;
        q0.push(a);
        q1.push(b);
    }
    let kind = d0.link_kind(&q1[0].endpoint())?;
    let (b0, b1) = (
        PinnedBuffer::new(size.max(8)),
        PinnedBuffer::new(size.max(8)),
    );
    let local = pd0.register_pinned(&b0, Access::ALL)?;
    let remote = pd1.register_pinned(&b1, Access::ALL)?;
    let raddr = remote.remote();
    let wr = |signalled: bool, id: u64| {
        let w = if send {
            SendWr::send()
        } else {
            SendWr::write(raddr.at(0))
        }
        .sge(local.sge(..size))
        .wr_id(id);
        if signalled {
            w
        } else {
            w.unsignaled()
        }
    };
    // Per pair: messages posted, messages known complete (through signalled ones).
    let mut posted = vec![0u64; qps];
    let mut done = vec![0u64; qps];
    let mut recvs_posted = vec![0u64; qps];
    let mut recvs_done = 0u64;
    let mut total = 0u64;
    let warm = Duration::from_secs_f64(seconds / 4.0);
    let run = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let (mut t0, mut n0) = (None::<Instant>, 0u64);
    let mut last_progress = Instant::now();
    loop {
        let now = Instant::now();
        if t0.is_none() && now - start >= warm {
            t0 = Some(now);
            n0 = total;
        }
        if let Some(t) = t0 {
            if now - t >= run {
                break;
            }
        }
        for i in 0..qps {
            while posted[i] - done[i] < window {
                if send {
                    while recvs_posted[i] <= posted[i] {
                        q1[i].post_recv(&RecvWr::new().sge(remote.sge(..size)))?;
                        recvs_posted[i] += 1;
                    }
                }
                posted[i] += 1;
                let sig = posted[i] % chunk == 0;
                // wr_id: the pair and its count at this message.
                q0[i].post_send(&wr(sig, (i as u64) << 40 | posted[i]))?;
            }
        }
        while let Some(c) = scq.poll_one()? {
            let c = c.ok()?;
            let i = (c.wr_id >> 40) as usize;
            let n = c.wr_id & ((1 << 40) - 1);
            total += n - done[i];
            done[i] = n;
            last_progress = Instant::now();
        }
        if send {
            while let Some(c) = rcq1.poll_one()? {
                c.ok()?;
                recvs_done += 1;
            }
        }
        if last_progress.elapsed() > TIMEOUT {
            return Err(format!("no completion in {TIMEOUT:?}").into());
        }
    }
    let secs = t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(1.0);
    let rate = (total - n0) as f64 / secs;
    println!(
        "link={kind:?} qps={qps} size={size} window={window} op={} seconds={secs:.3} msgs={} rate_msgs_per_s={rate:.0}",
        if send { "send" } else { "write" },
        total - n0
    );
    // Let the signalled messages in flight complete before the devices go.
    let end = Instant::now();
    while (0..qps).any(|i| done[i] < posted[i] / chunk * chunk) && end.elapsed() < TIMEOUT {
        while let Some(c) = scq.poll_one()? {
            let i = (c.wr_id >> 40) as usize;
            done[i] = c.wr_id & ((1 << 40) - 1);
        }
    }
    let _ = recvs_done;
    Ok(())
}
