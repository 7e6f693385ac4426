//! What the emulated RDMA driver's pinning costs: the driver keeps the pages of registered
//! regions and rings mapped until they are destroyed, so it checks every `free`, `realloc`,
//! `munmap` and `mprotect` of the process against them while any are registered. Prints the
//! median of a `malloc`+`free` pair (64 B and 1 MiB) and of an 8-byte RDMA write posted and
//! polled through libmlx5 (which allocates for each poll) on a loopback pair served by the
//! soft device, with `extra` more regions registered. Run it with another build of the
//! preload in `UVEMU_PRELOAD` to compare side by side.
//!
//! ```text
//! cargo run --release -p gdasync-uverbs-emu --example emulated_pins
//! UVEMU_PRELOAD=/path/to/other/libuvemu.so cargo run --release -p gdasync-uverbs-emu --example emulated_pins
//! ```

use gdsync::mlx5::{serve_emulated_driver, Context, QpCaps, RemoteQp, RtrAttr, RtsAttr};
use gdsync::{Access, SendWr};
use std::hint::black_box;
use std::time::Instant;

/// Set in the child that runs under the emulated driver.
const CHILD: &str = "EMULATED_PINS_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_none() {
        let spec = uverbs_emu::parse_devices("mlx5_0").unwrap();
        let emu = uverbs_emu::Emulator::new(&spec).expect("the emulated driver");
        let exe = std::env::current_exe().unwrap();
        let status = emu.command(exe).env(CHILD, "1").status().unwrap();
        std::process::exit(status.code().unwrap_or(1));
    }
    println!("| extra regions | malloc+free 64 B (ns) | malloc+free 1 MiB (ns) | 8 B write, post+poll (ns) |");
    println!("|---|---|---|---|");
    let bench = Bench::new();
    for extra in [0usize, 16, 256] {
        let regions = bench.register(extra);
        let small = median(20_000, || drop(black_box(vec![0u8; 64])));
        let large = median(2_000, || drop(black_box(Vec::<u8>::with_capacity(1 << 20))));
        let write = median(20_000, || bench.write());
        println!("| {extra} | {small:.0} | {large:.0} | {write:.0} |");
        drop(regions);
    }
}

/// The median of `n` timed calls of `f`, in nanoseconds (from 9 batches of `n / 9`).
fn median(n: usize, mut f: impl FnMut()) -> f64 {
    let batch = n / 9;
    let mut runs: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[4]
}

/// A QP connected to itself on the emulated device, with a registered buffer.
struct Bench {
    pd: std::sync::Arc<gdsync::mlx5::Pd>,
    qp: gdsync::mlx5::Qp,
    cq: std::sync::Arc<gdsync::mlx5::Cq>,
    mr: gdsync::mlx5::Mr<'static>,
}

impl Bench {
    fn new() -> Bench {
        serve_emulated_driver().unwrap();
        let ctx = Context::open("mlx5_0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let port = ctx.query_port(1).unwrap();
        let gid = ctx.choose_gid(1, None).unwrap().entry;
        let cq = ctx.create_cq(64).unwrap();
        let qp = pd.create_qp(&cq, &cq, &QpCaps::default()).unwrap();
        let buf: &'static mut [u8] = Vec::leak(vec![0u8; 1 << 16]);
        let mr = pd.reg_mr(buf, Access::ALL).unwrap();
        qp.to_init(1, Access::ALL).unwrap();
        let me = RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            lid: port.lid,
            gid: Some(gid.gid),
        };
        let rtr = RtrAttr {
            sgid_index: gid.index as u8,
            ..RtrAttr::new(me, 1, port.active_mtu)
        };
        qp.to_rtr(&rtr).unwrap();
        qp.to_rts(&RtsAttr::default()).unwrap();
        Bench { pd, qp, cq, mr }
    }

    /// `n` more regions of 4 KiB each, registered while the result lives.
    fn register(&self, n: usize) -> Vec<gdsync::mlx5::Mr<'static>> {
        (0..n)
            .map(|_| {
                let buf: &'static mut [u8] = Vec::leak(vec![0u8; 4096]);
                self.pd.reg_mr(buf, Access::ALL).unwrap()
            })
            .collect()
    }

    /// An 8-byte RDMA write to the buffer's second half, posted and polled until it completes.
    fn write(&self) {
        let wr = SendWr::write(self.mr.remote(32768)).sge(self.mr.sge(0, 8));
        // SAFETY: both ends lie in the registered, leaked buffer.
        unsafe { self.qp.verbs_post_send(&[wr]) }.unwrap();
        while self.cq.verbs_poll(1).unwrap().is_empty() {}
    }
}
