//! The soft device's software cost per message, on one thread: the posting thread also runs
//! the engines (shared progress, as on a machine with fewer cores than engines and ranks), so
//! each iteration is exactly the work of the messages, with no waiting on another core.
//! `cargo bench --bench soft_device` (add `-- --sample-count 200` for tighter figures).
//!
//! What a two-rank benchmark adds on top of this (`pingpong`, `scripts/bench-cores.sh`) is the
//! hand-over of cache lines between cores; this is the part the device's code decides.

use divan::Bencher;
use gdasync::gdsync::{progress, Access, Cq, Device, MemoryRegion, Qp, QpConfig, SendWr};

fn main() {
    // Engines progress on the calling thread: the figures are the messages' own work.
    std::env::set_var("GDSYNC_SOFT_PROGRESS", "shared");
    divan::main();
}

/// One end: a QP with its CQs and a small registered buffer.
struct End {
    qp: Qp,
    scq: Cq,
    mr: MemoryRegion<'static>,
    _rcq: Cq,
}

impl End {
    fn new(dev: &Device) -> End {
        let pd = dev.alloc_pd();
        let scq = dev.create_cq(1024).expect("create CQ");
        let rcq = dev.create_cq(1024).expect("create CQ");
        let qp = pd
            .create_qp(&scq, &rcq, &QpConfig::default())
            .expect("create QP");
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 2 * BIG].into_boxed_slice());
        let mr = pd
            .register(buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .expect("register");
        End {
            qp,
            scq,
            mr,
            _rcq: rcq,
        }
    }
}

/// The larger message: over the inline limit, gathered from memory as a NIC reads it.
const BIG: usize = 4096;

const TWO_DEVICES: &str = "two devices";
const ONE_DEVICE: &str = "one device";

/// Two connected ends, on two devices or on one (the engine's loopback link).
fn pair(two_devices: bool) -> (End, End, Device, Device) {
    let da = Device::soft().expect("soft device");
    let db = if two_devices {
        Device::soft().expect("soft device")
    } else {
        da.clone()
    };
    let (mut a, mut b) = (End::new(&da), End::new(&db));
    a.qp.connect(&b.qp.endpoint()).expect("connect");
    b.qp.connect(&a.qp.endpoint()).expect("connect");
    (a, b, da, db)
}

/// An RDMA write of `len` bytes from `from` to `to` (inline up to 8 bytes), run until its
/// last byte lands (every 64th signalled and its completion reaped, as pingpong does).
fn write(from: &mut End, to: &End, len: usize, i: u64) {
    let m = (i % 251) as u8 + 1;
    from.mr.write_volatile_u8(BIG + len - 1, m);
    let signalled = i % 64 == 63;
    let mut wr = SendWr::write(to.mr.remote().at(0)).sge(from.mr.sge(BIG..BIG + len));
    if len <= 8 {
        wr = wr.inline();
    }
    if !signalled {
        wr = wr.unsignaled();
    }
    from.qp.post_send(&wr).expect("post");
    while to.mr.read_volatile_u8(len - 1) != m {
        progress();
    }
    if signalled {
        while from.scq.poll_one().expect("poll").is_none() {
            progress();
        }
    }
}

/// A round trip of RDMA writes (two messages) as pingpong's default run sends them: 8 bytes
/// inline, 512 bytes and 4 KiB (both gathered from memory).
#[divan::bench(args = [TWO_DEVICES, ONE_DEVICE], consts = [8, 512, BIG], sample_count = 1000, sample_size = 100)]
fn write_round_trip<const LEN: usize>(bencher: Bencher, devices: &str) {
    let (mut a, mut b, _da, _db) = pair(devices == TWO_DEVICES);
    let mut i = 0u64;
    bencher.bench_local(|| {
        write(&mut a, &b, LEN, i);
        write(&mut b, &a, LEN, i);
        i += 1;
    });
}

/// A poll that finds nothing to do: what a waiting rank pays between looks at its memory.
#[divan::bench(sample_count = 1000, sample_size = 1000)]
fn idle_progress(bencher: Bencher) {
    let (mut a, b, _da, _db) = pair(true);
    write(&mut a, &b, 8, 0);
    bencher.bench_local(progress);
}
