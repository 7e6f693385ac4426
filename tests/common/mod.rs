//! Helpers shared by the integration tests: connected QP pairs on the soft device (or on the
//! emulated RDMA driver's mlx5 devices, in a child under the driver), completion
//! polling with a deadline, deterministic data, the examples' binaries (`example`), the GPU
//! gate (`gpu`), CUDA compile checks (`clang`), the real gdsync.cuh built for the host (`gds`), the
//! kernel-driven QP fixtures (`kernel_qp`), a child process's lines to its parent (`child`).
//!
//! Each test binary uses a subset of these.
#![allow(dead_code)]

pub mod child;
pub mod clang;
pub mod clang_cuda;
pub mod example;
pub mod gds;
pub mod gpu;
pub mod kernel_qp;
pub mod output;

/// [`example::path`] in an `Option`, always `Some` (a missing example is built, or the test
/// fails): the form tests/cli.rs was written against, when a missing example was skipped.
pub fn example(name: &str) -> Option<std::path::PathBuf> {
    Some(example::path(name))
}

/// [`example::run`] in an `Option`, always `Some`, as [`example()`].
pub fn run_example(name: &str, args: &[&str]) -> Option<(bool, String, String)> {
    Some(example::run(name, args))
}

use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::format::Syndrome;
use gdasync::gdsync::{
    Access, Completion, Cq, Device, ProtectionDomain, Qp, QpConfig, RecvWr, SendWr, WcStatus,
};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::{Comm, KernelChannels};
use std::time::{Duration, Instant};

/// How long a test waits for something that should happen promptly. Generous: a loaded,
/// 2-core machine running a debug build must never trip it.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Entries of every CQ the helpers create.
pub const CQ_ENTRIES: u32 = 4096;

/// Where the two QPs of a pair live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topo {
    /// Both QPs on one device (the engine's loopback link).
    Loopback,
    /// One QP on each of two devices in this process (an in-process link).
    TwoDevices,
    /// Both QPs on `mlx5_0` of the emulated RDMA driver (libmlx5's QPs, served by a soft
    /// HCA): only in a process started under the driver ([`under_emulated_driver`]).
    Mlx5Loopback,
    /// One QP on `mlx5_0` and one on `mlx5_1` of the emulated driver.
    Mlx5TwoDevices,
}

/// The emulated devices the mlx5 topologies run on (`uverbs_emu::parse_devices`).
pub const EMULATED_DEVICES: &str = "mlx5_0,mlx5_1";

impl Topo {
    /// The devices of the two sides (one device twice for a loopback).
    pub fn devices(self) -> (Device, Device) {
        let soft = || Device::soft().expect("soft device");
        let open = |name: &str| Device::open(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let same = |d: Device| (d.clone(), d);
        match self {
            Topo::Loopback => same(soft()),
            Topo::TwoDevices => (soft(), soft()),
            Topo::Mlx5Loopback => same(open("mlx5_0")),
            Topo::Mlx5TwoDevices => (open("mlx5_0"), open("mlx5_1")),
        }
    }
}

/// An emulated RDMA driver serving `spec`'s devices (`uverbs_emu::parse_devices`), for
/// processes the test starts under it.
#[allow(dead_code)]
pub fn emulator(spec: &str) -> uverbs_emu::Emulator {
    let devices = uverbs_emu::parse_devices(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    uverbs_emu::Emulator::new(&devices)
        .unwrap_or_else(|e| panic!("the emulated driver is not usable: {e}"))
}

/// For a test on an mlx5 topology: in the test's process, runs test `path` (its
/// `module_path!()`, whose first part is the test binary's name, and `name`) again in a
/// child under the emulated RDMA driver and returns true once it passed there; in that
/// child, returns false (run the body).
pub fn under_emulated_driver(path: &str, name: &str) -> bool {
    let test = match path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(), // a test at the binary's top level
    };
    uverbs_emu::in_child_under_emulator(&test, EMULATED_DEVICES)
}

/// One end of a connection: its device and PD handles, the QP and its dedicated CQs.
///
/// Dropping a `Side` drops every handle it holds; when nothing else holds the device, the
/// device (and its engine) goes away.
pub struct Side {
    pub dev: Device,
    pub pd: ProtectionDomain,
    pub qp: Qp,
    /// Send CQ, used by this QP's sends only (so send tickets are waitable).
    pub scq: Cq,
    /// Receive CQ, used by this QP's receives only.
    pub rcq: Cq,
}

impl Side {
    /// A new, unconnected QP on `dev` with its own PD and CQs.
    pub fn new(dev: &Device, cfg: &QpConfig) -> Self {
        Self::with_pd(dev, &dev.alloc_pd(), cfg)
    }

    /// A new, unconnected QP in protection domain `pd` of `dev`, with its own CQs.
    pub fn with_pd(dev: &Device, pd: &ProtectionDomain, cfg: &QpConfig) -> Self {
        let pd = pd.clone();
        let scq = dev.create_cq(CQ_ENTRIES).expect("create send CQ");
        let rcq = dev.create_cq(CQ_ENTRIES).expect("create recv CQ");
        let qp = pd.create_qp(&scq, &rcq, cfg).expect("create QP");
        Side {
            dev: dev.clone(),
            pd,
            qp,
            scq,
            rcq,
        }
    }
}

/// Two connected QPs: `a` and `b`.
pub struct Pair {
    pub a: Side,
    pub b: Side,
}

impl Pair {
    /// A pair with default configurations on fresh device(s).
    pub fn new(topo: Topo) -> Self {
        Self::with_config(topo, &QpConfig::default(), &QpConfig::default())
    }

    /// A pair on fresh device(s).
    pub fn with_config(topo: Topo, cfg_a: &QpConfig, cfg_b: &QpConfig) -> Self {
        let (dev_a, dev_b) = topo.devices();
        Self::on(&dev_a, &dev_b, cfg_a, cfg_b)
    }

    /// A pair with `a` on `dev_a` and `b` on `dev_b` (which may be the same device).
    pub fn on(dev_a: &Device, dev_b: &Device, cfg_a: &QpConfig, cfg_b: &QpConfig) -> Self {
        let mut a = Side::new(dev_a, cfg_a);
        let mut b = Side::new(dev_b, cfg_b);
        a.qp.connect(&b.qp.endpoint()).expect("connect a -> b");
        b.qp.connect(&a.qp.endpoint()).expect("connect b -> a");
        Pair { a, b }
    }

    /// Another pair, default configuration, on the same devices and in the same protection
    /// domains (so regions registered for this pair serve the new one too).
    pub fn another(&self) -> Pair {
        let cfg = QpConfig::default();
        let mut a = Side::with_pd(&self.a.dev, &self.a.pd, &cfg);
        let mut b = Side::with_pd(&self.b.dev, &self.b.pd, &cfg);
        a.qp.connect(&b.qp.endpoint()).expect("connect a -> b");
        b.qp.connect(&a.qp.endpoint()).expect("connect b -> a");
        Pair { a, b }
    }
}

/// Polls `cq` until `n` completions have arrived; panics (listing what did arrive) after
/// [`TIMEOUT`].
pub fn poll_n(cq: &Cq, n: usize) -> Vec<Completion> {
    poll_n_within(cq, n, TIMEOUT)
}

/// As [`poll_n`] with an explicit deadline.
pub fn poll_n_within(cq: &Cq, n: usize, timeout: Duration) -> Vec<Completion> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let before = out.len();
        let got = cq.poll(&mut out, n - before).expect("poll CQ");
        if got == 0 {
            if start.elapsed() > timeout {
                panic!(
                    "only {} of {n} completions on CQ {:#x} within {timeout:?}: {out:#?}",
                    out.len(),
                    cq.cqn()
                );
            }
            std::thread::yield_now();
        }
    }
    out
}

/// Polls one completion (panics after [`TIMEOUT`]).
pub fn poll1(cq: &Cq) -> Completion {
    poll_n(cq, 1).pop().unwrap()
}

/// Polls `n` completions and asserts each succeeded.
pub fn poll_ok(cq: &Cq, n: usize) -> Vec<Completion> {
    let v = poll_n(cq, n);
    for c in &v {
        assert!(c.is_ok(), "completion failed: {c:?}");
    }
    v
}

/// Asserts that nothing (more) arrives on `cq` within `quiet`.
pub fn assert_quiet(cq: &Cq, quiet: Duration) {
    std::thread::sleep(quiet);
    let mut v = Vec::new();
    cq.poll(&mut v, 16).expect("poll CQ");
    assert!(
        v.is_empty(),
        "unexpected completions on CQ {:#x}: {v:#?}",
        cq.cqn()
    );
}

/// Asserts the completion failed with `s`.
pub fn assert_err(c: &Completion, s: Syndrome) {
    assert_eq!(c.status, WcStatus::Error(s), "completion {c:?}");
}

/// A small deterministic PRNG (xorshift64*), so the tests need no extra crates.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Never zero: xorshift has a fixed point there.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Fills `buf` with pseudo-random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let v = self.next_u64().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&v[..n]);
    }
}

/// `len` pseudo-random bytes from `seed`.
/// The number in environment variable `name` (a test's longer, opt-in run), else `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// 64-bit FNV-1a of `b`, word-wise over 8-byte chunks for speed in debug builds (not the
/// standard FNV; any change of a byte or of the length changes it with high probability).
pub fn checksum(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ b.len() as u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    for &x in chunks.remainder() {
        h = (h ^ x as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Checks that `p` works: an RDMA write of a few KiB from `a` to `b` and a send from `b` to
/// `a` complete successfully and move the right bytes.
pub fn assert_healthy(p: &mut Pair) {
    const N: usize = 4096;
    let mut src = pattern(0xA11CE, N);
    let mut dst = vec![0u8; N];
    let src_mr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dst_mr =
        p.b.pd
            .register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    p.a.qp
        .post_send(
            &SendWr::write(dst_mr.remote().at(0))
                .sge(src_mr.sge(..))
                .wr_id(0x4EA1),
        )
        .expect("post write on the healthy pair");
    let c = poll1(&p.a.scq);
    assert!(c.is_ok(), "write on the healthy pair failed: {c:?}");
    assert_eq!(c.wr_id, 0x4EA1);
    let mut got = vec![0u8; N];
    dst_mr.read_at(0, &mut got);
    assert!(
        got == pattern(0xA11CE, N),
        "healthy write moved wrong bytes"
    );

    // And the other direction, with a send.
    let mut rbuf = vec![0u8; 64];
    let rmr = p.a.pd.register(&mut rbuf, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_recv(&RecvWr::new().sge(rmr.sge(..)).wr_id(0x4EA2))
        .unwrap();
    p.b.qp
        .post_send(&SendWr::send().sge(dst_mr.sge(..64)).wr_id(0x4EA3))
        .unwrap();
    let s = poll1(&p.b.scq);
    assert!(s.is_ok() && s.wr_id == 0x4EA3, "{s:?}");
    let r = poll1(&p.a.rcq);
    assert!(r.is_ok() && r.wr_id == 0x4EA2 && r.byte_len == 64, "{r:?}");
    let mut got = [0u8; 64];
    rmr.read_at(0, &mut got);
    assert_eq!(&got[..], &pattern(0xA11CE, N)[..64]);
}

/// Posts `n` send-queue work requests built by `make(i)` on `side`, signalling every
/// `every`-th one and the last, and polling the send CQ so that at most `2 * every` are
/// outstanding. Asserts every completion succeeded, in order, with the expected wr_id
/// (`make` chooses wr_ids; the signalled ones must be distinct and increasing).
pub fn post_all(side: &mut Side, n: usize, every: usize, mut make: impl FnMut(usize) -> SendWr) {
    let mut signalled = std::collections::VecDeque::new();
    for i in 0..n {
        let mut wr = make(i);
        if (i + 1) % every == 0 || i + 1 == n {
            signalled.push_back(wr.wr_id);
        } else {
            wr = wr.unsignaled();
        }
        side.qp
            .post_send(&wr)
            .unwrap_or_else(|e| panic!("post {i}: {e}"));
        while signalled.len() > 2 || (i + 1 == n && !signalled.is_empty()) {
            let c = poll1(&side.scq);
            let want = signalled.pop_front().unwrap();
            assert!(
                c.is_ok() && c.wr_id == want,
                "expected wr {want} ok, got {c:?}"
            );
        }
    }
}

/// A host stream whose waits give up after [`TIMEOUT`] (not the default minute), so a test
/// that fails to produce a completion fails instead of hanging.
pub fn host_stream() -> HostStream {
    HostStream::with_timeout(TIMEOUT).expect("host stream")
}

/// The tests of a body on the soft device's topologies: `loopback`, `two_devices`.
#[allow(unused_macros)]
macro_rules! soft_topologies {
    ($name:ident $(, #[$m:meta])*) => {
        #[test]
        $(#[$m])*
        fn loopback() {
            super::$name(Topo::Loopback)
        }
        #[test]
        $(#[$m])*
        fn two_devices() {
            super::$name(Topo::TwoDevices)
        }
    };
}

/// Runs a test body once per topology: `mod name { loopback, two_devices, mlx5_loopback,
/// mlx5_two_devices }`, the mlx5 ones in a child under the emulated RDMA driver (ignored
/// where rdma-core is not installed).
#[allow(unused_macros)]
macro_rules! both {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            soft_topologies!($name $(, #[$m])*);
            #[test]
            #[cfg_attr(
                not(rdma_core),
                ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
            )]
            $(#[$m])*
            fn mlx5_loopback() {
                if !under_emulated_driver(module_path!(), "mlx5_loopback") {
                    super::$name(Topo::Mlx5Loopback)
                }
            }
            #[test]
            #[cfg_attr(
                not(rdma_core),
                ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
            )]
            $(#[$m])*
            fn mlx5_two_devices() {
                if !under_emulated_driver(module_path!(), "mlx5_two_devices") {
                    super::$name(Topo::Mlx5TwoDevices)
                }
            }
        }
    )*};
}

/// Runs a test body on the soft device's topologies only: `mod name { loopback, two_devices }`
/// (for what only the soft device reports).
#[allow(unused_macros)]
macro_rules! soft_only {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            soft_topologies!($name $(, #[$m])*);
        }
    )*};
}

/// The value of `key` in a flat JSON object on one line (what the examples' `--json` print),
/// without its quotes.
pub fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    let rest = &json[at..];
    rest[..rest.find([',', '}']).unwrap()].trim_matches('"')
}

/// A kernel channel's counters and error as one tuple: (sends, sends_done, sends_waited,
/// recvs, recvs_waited, error).
pub fn peer_counts(st: &gdasync::mp::PeerState) -> (u64, u64, u64, u64, u64, u32) {
    let s = st;
    (
        s.sends,
        s.sends_done,
        s.sends_waited,
        s.recvs,
        s.recvs_waited,
        s.error,
    )
}

/// Runs `f` on two thread ranks, each with a communicator and kernel channels of `depth`;
/// then a barrier (no rank tears down while its peer's "kernel" still uses the channels).
pub fn kernel_channel_ranks<T: Send>(
    depth: u32,
    f: impl Fn(&mut Comm, &KernelChannels) -> T + Sync,
) -> Vec<T> {
    channel_ranks(depth, None, f)
}

/// [`kernel_channel_ranks`] with staged kernel channels, bounces of `bounce` bytes.
pub fn staged_channel_ranks<T: Send>(
    depth: u32,
    bounce: usize,
    f: impl Fn(&mut Comm, &KernelChannels) -> T + Sync,
) -> Vec<T> {
    channel_ranks(depth, Some(bounce), f)
}

fn channel_ranks<T: Send>(
    depth: u32,
    bounce: Option<usize>,
    f: impl Fn(&mut Comm, &KernelChannels) -> T + Sync,
) -> Vec<T> {
    let dev = Device::soft().unwrap();
    std::thread::scope(|s| {
        let ranks: Vec<_> = ThreadBootstrap::group(2)
            .into_iter()
            .map(|boot| {
                let (dev, f) = (&dev, &f);
                s.spawn(move || {
                    let mut comm = Comm::new(Box::new(boot), dev).unwrap();
                    let ch = match bounce {
                        Some(b) => comm.kernel_channels_staged(depth, b).unwrap(),
                        None => comm.kernel_channels(depth).unwrap(),
                    };
                    let out = f(&mut comm, &ch);
                    comm.barrier().unwrap();
                    drop(ch);
                    comm.finalize().unwrap();
                    out
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// Runs `f` on `n` thread ranks of one soft device.
pub fn on_threads(n: usize, f: fn(&mut Comm)) {
    let dev = Device::soft().unwrap();
    let hs: Vec<_> = ThreadBootstrap::group(n)
        .into_iter()
        .map(|b| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                f(&mut comm);
                comm.finalize().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
}

/// Staged messages on `exec` between two ranks: rank 0 sends `n` messages of `len` bytes from
/// consecutive slices of `reg` (one byte apart), rank 1 receives each into the same slice of
/// its own `reg` and waits for it on `exec`. Returns the requests (wait for them after the
/// executor has run).
pub fn staged_stream_of_messages(
    comm: &mut Comm,
    reg: &gdasync::mp::GpuRegion,
    n: usize,
    len: usize,
    exec: &impl gdasync::gdsync::exec::Executor,
) -> Vec<gdasync::mp::Request> {
    let peer = 1 - comm.rank();
    (0..n)
        .map(|m| {
            let s = reg.slice(m * (len + 1)..m * (len + 1) + len);
            if comm.rank() == 1 {
                let r = comm.irecv_gpu_on(s, peer, exec).unwrap();
                comm.wait_on(r, exec).unwrap();
                r
            } else {
                comm.isend_gpu_on(s, peer, exec).unwrap()
            }
        })
        .collect()
}
