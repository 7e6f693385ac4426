//! Unidirectional bandwidth and message rate, perftest style (`ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw`).
//!
//! Rank 0 keeps a window of RDMA writes (or reads, or sends) in flight to rank 1 and counts
//! completions; rank 1 only serves (for sends, its CPU keeps receives posted). The ranks are
//! threads of this process, each with its own soft device. Who drives rank 0 (`--trigger`):
//!
//! - `cpu`: the CPU posts and polls;
//! - `stream`: the CPU prepares the work requests, a CUDA stream rings the doorbells and waits
//!   for the completions with memory operations, one chunk of the window at a time;
//! - `kernel`: a persistent CUDA kernel composes the WQEs, rings the doorbell and polls the
//!   completion queue itself (`gds_qp_post_send`, `gds_cq_wait`).
//!
//! GPU payloads (`--mem device`) go through pinned host bounces where the device cannot DMA
//! GPU memory (`--staging auto`, the default, on the soft device; `on`/`off` choose), for
//! RDMA writes from every trigger: a pipeline of `--chunk`-byte chunks over a ring of
//! `--bounces` bounces per rank (see `staged.rs`). On the `kernel` trigger the persistent
//! kernel's block copies each chunk into its bounce and its thread 0 rings the chunk's write
//! (`kstaged.rs`). The header says which path ran (`gpu_memory`).
//!
//! Every trigger signals one send per chunk (a quarter of the window) and the last one, so
//! their numbers compare. GB/s are decimal (10^9 bytes per second). The default sizes are the
//! powers of 2 from 1 B to 8 MiB.
//!
//! ```text
//! cargo run --release --bin bandwidth                          # 1 B .. 8 MiB, RDMA write
//! cargo run --release --bin bandwidth -- --op read --sizes 4K,1M --json
//! cargo run --release --bin bandwidth -- --size 64K --duration 2
//! cargo run --release --bin bandwidth -- --trigger kernel --mem device   # with a GPU
//! cargo run --release --bin bandwidth -- --trigger stream --mem device --staging on --sizes 64K,1M --check
//! cargo run --release --bin bandwidth -- --trigger kernel --mem device --staging on --sizes 64K,1M,8M --check
//! ```

#[path = "../common/mod.rs"]
mod common;
mod gpu;
mod kstaged;
mod staged;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use common::device::{is_rdma, open};
use common::gpus::Placement;
use common::header::{cores, Header};
use common::json::{Object, Value};
use common::noise::{descheduled, involuntary_switches};
use common::out::outln;
use common::sizes::SizeArgs;
use common::tool::{exit_now, usage};
use common::{
    iters, name, one_of, DeviceArgs, GpuArgs, Mem, Staging as StagingArg, ToolArgs, Trigger,
};
use gdasync::gdsync::cuda::{Cuda, DeviceBuffer};
use gdasync::gdsync::{
    Access, Cq, Device, DeviceName, Error, GpuMemoryPath, MemoryRegion, PinnedBuffer, PreparedSend,
    ProtectionDomain, Qp, QpConfig, RecvWr, RemoteBuf, SendWr,
};
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long any wait for progress (a completion, ring space, the stream, the kernel) may
/// last before the run fails.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Largest message.
const MAX_SIZE: usize = 1 << 30;
/// Largest window (the send ring holds 512 WQEBBs, one per message; the stream trigger has a
/// window and a chunk prepared at once).
const MAX_WINDOW: usize = 128;
/// Bytes moved per size by default (fewer messages for large sizes), and the bounds on the
/// message count: the default sweep takes seconds on the soft device.
const DEFAULT_BYTES: usize = 1 << 30;
const MIN_ITERS: usize = 100;
const MAX_ITERS: usize = 20_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Send (the responder keeps receives posted).
    Send,
}

#[derive(Parser, Debug)]
#[command(
    name = "bandwidth",
    version,
    about = "Unidirectional bandwidth and message rate between two soft devices (perftest style)"
)]
struct Args {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Where both ranks' buffers live.
    #[arg(long, value_enum, default_value = "host")]
    mem: Mem,
    /// Who posts the work and waits for its completions.
    #[arg(long, value_parser = one_of(&[Trigger::Cpu, Trigger::Stream, Trigger::Kernel]), default_value = "cpu")]
    trigger: Trigger,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    gpus: GpuArgs,
    #[command(flatten)]
    sizes: SizeArgs,
    /// Timed messages per size (default: 1 GiB worth, between 100 and 20000).
    #[arg(long, value_parser = iters::count(1, iters::MAX_ITERS), conflicts_with = "duration")]
    iters: Option<u64>,
    /// Instead of --iters: send for this many seconds per size (--trigger cpu).
    #[arg(long, value_parser = iters::parse_duration)]
    duration: Option<Duration>,
    /// Untimed messages first, per size (default: a tenth of the timed ones).
    #[arg(long, value_parser = iters::count(0, iters::MAX_ITERS))]
    warmup: Option<u64>,
    /// Messages in flight (1 to 128).
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// One JSON object per line and size instead of a table.
    #[arg(long)]
    json: bool,
    /// With --mem device: how GPU payloads reach the NIC. auto (default): staged through
    /// pinned host bounces where the device cannot DMA GPU memory (the soft device), for
    /// RDMA writes (every trigger).
    #[arg(long, value_enum)]
    staging: Option<StagingArg>,
    /// Staged: bytes per chunk, the size of a bounce (default 1M).
    #[arg(long, value_parser = common::sizes::parse_size)]
    chunk: Option<usize>,
    /// Staged: bounces per rank, the chunks in flight at most (2 to 64, default 4).
    #[arg(long)]
    bounces: Option<usize>,
    /// Staged: after each size, compare the receiver's buffer with the sender's and fail the
    /// run where a byte differs.
    #[arg(long)]
    check: bool,
    /// With `--trigger stream`: run the stream loop on a host stream (a CPU thread), to test
    /// it where there is no GPU. With a staged `--mem device`, pinned host memory stands in
    /// for the GPU's and the CPU runs the copies (cpu and stream triggers).
    #[arg(long, hide = true)]
    host_stream: bool,
    /// Staged: rank 1 pauses this many seconds before each copy in, so that a sender that
    /// did not wait for its credits would overwrite bounces not yet copied (a test).
    #[arg(long, hide = true, value_parser = iters::parse_duration)]
    slow_copy_in: Option<Duration>,
    #[command(flatten)]
    tool: ToolArgs,
}

/// What to run, checked.
struct Plan {
    op: Op,
    mem: Mem,
    trigger: Trigger,
    /// The device both ranks run on.
    device: DeviceName,
    /// Where a GPU is used: the GPU of each rank (`--gpus`).
    placement: Option<Placement>,
    sizes: Vec<usize>,
    iters: Option<u64>,
    duration: Option<Duration>,
    warmup: Option<u64>,
    window: usize,
    /// Messages per chunk: one in this many is signalled.
    chunk: usize,
    json: bool,
    host_stream: bool,
    /// With --mem device: the path GPU payloads take, and why.
    gpu_memory: Option<(GpuMemoryPath, String)>,
    /// Where GPU payloads are staged: the pipeline's shape.
    stage: Option<staged::Stage>,
    /// `--check`.
    check: bool,
    /// `--slow-copy-in`.
    slow_copy_in: Option<Duration>,
}

impl Plan {
    fn new(a: &Args) -> Result<Plan> {
        let sizes = a.sizes.or(|| (0..=23).map(|k| 1usize << k).collect());
        common::sizes::check(&sizes, 1, MAX_SIZE, "empty messages have no bandwidth")
            .map_err(usage)?;
        if a.window == 0 || a.window > MAX_WINDOW {
            return Err(usage(format!("--window must be 1 to {MAX_WINDOW}")));
        }
        if a.host_stream && a.mem == Mem::Host && a.trigger != Trigger::Stream {
            return Err(usage("--host-stream runs --trigger stream with --mem host, or a staged --mem device write"));
        }
        if a.duration.is_some() && a.trigger != Trigger::Cpu {
            return Err(usage("--duration applies to --trigger cpu (GPU triggers enqueue a fixed number of messages: use --iters)"));
        }
        let device = a.device.resolve()?;
        let gpu_need = match (a.trigger, a.mem) {
            _ if a.host_stream => None,
            (Trigger::Cpu, Mem::Host) => None,
            (Trigger::Cpu, Mem::Device) => Some("--mem device".to_string()),
            (t, _) => Some(format!("--trigger {}", name(t))),
        };
        a.gpus
            .refuse_unless(
                gpu_need.is_some(),
                "--trigger stream or kernel, or --mem device",
            )
            .map_err(usage)?;
        let placement = match gpu_need {
            Some(what) => {
                if let Err(e) = Cuda::get().and_then(|c| c.gpu(0).map(|_| ())) {
                    bail!("{what} needs a CUDA GPU: {e}");
                }
                let p = a.gpus.resolve_here()?;
                p.tell_gdsync(2);
                Some(p)
            }
            None => None,
        };
        let gpu0 = placement.as_ref().map_or(0, |p| p.ordinal(0));
        let gpu_memory = staged::gpu_memory(a, &device, gpu0)?;
        let stage = staged::Stage::new(a, gpu_memory.as_ref())?;
        Ok(Plan {
            op: a.op,
            mem: a.mem,
            trigger: a.trigger,
            device,
            placement,
            sizes,
            iters: a.iters,
            duration: a.duration,
            warmup: a.warmup,
            window: a.window,
            chunk: (a.window / 4).max(1),
            json: a.json,
            host_stream: a.host_stream,
            gpu_memory,
            stage,
            check: a.check,
            slow_copy_in: a.slow_copy_in,
        })
    }
    fn iters(&self, size: usize) -> u64 {
        self.iters
            .unwrap_or_else(|| (DEFAULT_BYTES / size).clamp(MIN_ITERS, MAX_ITERS) as u64)
    }
    /// The GPU of rank `rank` (0 where no GPU is used).
    fn gpu(&self, rank: usize) -> i32 {
        self.placement.as_ref().map_or(0, |p| p.ordinal(rank))
    }
    fn warmup(&self, size: usize) -> u64 {
        self.warmup.unwrap_or_else(|| self.iters(size).div_ceil(10))
    }
    /// The trigger as reported: `host-stream` for the stream loop run by a CPU thread,
    /// `host-cpu` for the cpu trigger with host memory standing in for GPU memory (tests, not
    /// measurements of a GPU).
    fn trigger_label(&self) -> String {
        match (self.host_stream, self.trigger) {
            (true, Trigger::Stream) => "host-stream".into(),
            (true, t) => format!("host-{}", name(t)),
            (false, t) => name(t),
        }
    }
    /// Whether message `i` (0-based) of a run of `n` is signalled.
    fn signalled(&self, i: u64, n: u64) -> bool {
        i + 1 == n || (i + 1) % self.chunk as u64 == 0
    }
    /// What runs where, for the header and every JSON row.
    fn header(&self) -> Header {
        let rdma = is_rdma(&self.device);
        let h = Header::new("bandwidth")
            .field("op", name(self.op))
            .field("trigger", self.trigger_label())
            .field("mem", name(self.mem))
            .field("device", self.device.to_string())
            .field(
                "link",
                if rdma {
                    "RDMA (the HCA's loopback)"
                } else {
                    "in-process"
                },
            )
            .field("ranks", 2u32)
            .field("ranks_as", "threads")
            .field("gpus", self.placement.as_ref().map(|p| p.label(2)))
            .field("window", self.window)
            .field("signal_every", self.chunk)
            .field(
                "gpu_memory",
                self.gpu_memory
                    .as_ref()
                    .map(common::device::gpu_memory_phrase),
            )
            .field("chunk", self.stage.as_ref().map(|s| s.chunk))
            .field("bounces", self.stage.as_ref().map(|s| s.bounces))
            .field("cores", cores());
        let h = if rdma {
            h
        } else {
            h.field(
                "progress",
                gdasync::gdsync::progress_mode_for(2).to_string(),
            )
        };
        h.note("rank 0 sends, rank 1 serves; GB/s = 10^9 bytes/s, Gb/s = 10^9 bits/s; rate in millions of messages/s")
    }
}

/// A message buffer in pinned host memory or GPU memory.
enum Buffer {
    Host(PinnedBuffer),
    Device(Arc<DeviceBuffer>),
}

/// Memory a rank registers with its device.
trait Register {
    fn register(&self, pd: &ProtectionDomain) -> Result<MemoryRegion<'_>>;
}

impl Buffer {
    /// Rank `rank`'s buffer (in GPU memory: on the rank's GPU; in pinned host memory for
    /// `--host-stream`, which stands in for it).
    fn new(plan: &Plan, rank: usize, len: usize) -> Result<Buffer> {
        Ok(match plan.mem {
            Mem::Device if !plan.host_stream => Buffer::Device(Arc::new(
                DeviceBuffer::alloc(plan.gpu(rank), len)
                    .with_context(|| format!("allocate {len} bytes of GPU memory"))?,
            )),
            _ => Buffer::Host(PinnedBuffer::new(len)),
        })
    }
}

impl Register for Buffer {
    fn register(&self, pd: &ProtectionDomain) -> Result<MemoryRegion<'_>> {
        Ok(match self {
            Buffer::Host(b) => pd.register_pinned(b, Access::ALL)?,
            Buffer::Device(b) => pd.register_device(b, Access::ALL)?,
        })
    }
}

impl Register for PinnedBuffer {
    fn register(&self, pd: &ProtectionDomain) -> Result<MemoryRegion<'_>> {
        Ok(pd.register_pinned(self, Access::ALL)?)
    }
}

/// The two ranks: rank 0's QP (with a send CQ of its own, which streams and kernels need)
/// and buffer; rank 1 serves.
struct Link<'b> {
    _devs: (Device, Device),
    /// Each rank's protection domain (for more regions: the staged path's credit words).
    pds: (ProtectionDomain, ProtectionDomain),
    q0: Qp,
    scq0: Cq,
    _rcq0: Cq,
    local: MemoryRegion<'b>,
    remote: RemoteBuf,
    /// Messages rank 0 has posted since the start.
    sent: u64,
    rx: Responder<'b>,
}

/// Rank 1: its QP and buffer, and the receives it keeps posted for sends (its CPU does that
/// whoever drives rank 0).
struct Responder<'b> {
    qp: Qp,
    cq: Cq,
    buf: MemoryRegion<'b>,
    posted: u64,
    done: u64,
}

impl<'b> Link<'b> {
    fn new(
        device: &DeviceName,
        local: &'b dyn Register,
        remote: &'b dyn Register,
    ) -> Result<Link<'b>> {
        let cfg = QpConfig {
            send_wqebbs: 512,
            recv_wqes: 512,
            ..QpConfig::default()
        };
        // Two soft devices, as on two hosts; an RDMA device serves both ranks.
        let d0 = open(device)?;
        let d1 = if is_rdma(device) {
            d0.clone()
        } else {
            open(device)?
        };
        let (pd0, pd1) = (d0.alloc_pd(), d1.alloc_pd());
        let (scq0, rcq0, cq1) = (d0.create_cq(512)?, d0.create_cq(512)?, d1.create_cq(1024)?);
        let mut q0 = pd0.create_qp(&scq0, &rcq0, &cfg)?;
        let mut q1 = pd1.create_qp(&cq1, &cq1, &cfg)?;
        q0.connect(&q1.endpoint())?;
        q1.connect(&q0.endpoint())?;
        let local = local.register(&pd0)?;
        let buf = remote.register(&pd1)?;
        Ok(Link {
            remote: buf.remote(),
            _devs: (d0, d1),
            pds: (pd0, pd1),
            q0,
            scq0,
            _rcq0: rcq0,
            local,
            sent: 0,
            rx: Responder {
                qp: q1,
                cq: cq1,
                buf,
                posted: 0,
                done: 0,
            },
        })
    }

    fn wr(&self, op: Op, size: usize, signalled: bool) -> SendWr {
        let wr = match op {
            Op::Write => SendWr::write(self.remote.at(0)),
            Op::Read => SendWr::read(self.remote.at(0)),
            Op::Send => SendWr::send(),
        }
        .sge(self.local.sge(..size));
        if signalled {
            wr
        } else {
            wr.unsignaled()
        }
    }

    /// Prepares a send on rank 0, waiting for send-ring space (freed by the stream's waits).
    fn prepare(&mut self, wr: &SendWr) -> Result<PreparedSend> {
        prepare(&mut self.q0, wr)
    }
}

/// Prepares a send on `qp`, waiting for send-ring space (freed by an executor's waits).
fn prepare(qp: &mut Qp, wr: &SendWr) -> Result<PreparedSend> {
    let start = Instant::now();
    loop {
        match qp.prepare_send(wr) {
            Err(Error::RingFull { .. }) if start.elapsed() < TIMEOUT => std::thread::yield_now(),
            r => return Ok(r?),
        }
    }
}

impl Responder<'_> {
    /// Counts the receives that completed.
    fn reap(&mut self) -> Result<()> {
        while let Some(c) = self.cq.poll_one()? {
            c.ok().context("a receive failed")?;
            self.done += 1;
        }
        Ok(())
    }

    /// Posts receives of `size` bytes until `total` were posted since the start, waiting for
    /// ring space; with `wait` false, only what fits now.
    fn post(&mut self, total: u64, size: usize, wait: bool) -> Result<()> {
        let start = Instant::now();
        let ring = self.qp.recv_ring_size() as u64;
        while self.posted < total {
            if self.posted - self.done < ring {
                self.qp
                    .post_recv(&RecvWr::new().sge(self.buf.sge(..size)))?;
                self.posted += 1;
                continue;
            }
            self.reap()?;
            if !wait {
                return Ok(());
            }
            if start.elapsed() > TIMEOUT {
                bail!("rank 1: no receive completed in {TIMEOUT:?}");
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// One size's measurement.
struct Measured {
    size: usize,
    iters: u64,
    warmup: u64,
    seconds: f64,
}

/// Watches a progress counter: an error once it has not moved for [`TIMEOUT`].
struct Stall {
    value: u64,
    since: Instant,
}

impl Stall {
    fn new() -> Stall {
        Stall {
            value: u64::MAX,
            since: Instant::now(),
        }
    }
    fn check(&mut self, value: u64, what: &str) -> Result<()> {
        if value != self.value {
            self.value = value;
            self.since = Instant::now();
        } else if self.since.elapsed() > TIMEOUT {
            bail!("{what}: no progress in {TIMEOUT:?} (stuck at {value})");
        }
        Ok(())
    }
}

/// Up to `n` messages from the CPU, at most a window in flight, or fewer if `deadline` passes
/// first (posting stops at the end of a chunk, whose last message is signalled); returns how
/// many were sent, once all completed.
fn cpu_phase(
    link: &mut Link,
    plan: &Plan,
    size: usize,
    mut n: u64,
    deadline: Option<Instant>,
) -> Result<u64> {
    let (mut posted, mut done) = (0u64, 0u64);
    // The message counts at the signalled sends in flight, oldest first.
    let mut signalled = VecDeque::new();
    while done < n {
        while posted < n && posted - done < plan.window as u64 {
            if plan.op == Op::Send {
                link.rx.post(link.sent + 1, size, true)?;
            }
            let sig = plan.signalled(posted, n);
            link.q0.post_send(&link.wr(plan.op, size, sig))?;
            link.sent += 1;
            posted += 1;
            if sig {
                signalled.push_back(posted);
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    n = posted;
                }
            }
        }
        link.scq0.wait_one(TIMEOUT)?.ok().context("a send failed")?;
        done = signalled
            .pop_front()
            .context("a completion with no signalled send in flight")?;
        if plan.op == Op::Send {
            link.rx.reap()?;
        }
    }
    Ok(n)
}

/// Messages a `--duration` run may send per size at most.
const DURATION_MAX_MESSAGES: u64 = iters::MAX_ITERS;

fn cpu_run(mut link: Link, plan: &Plan, out: &mut dyn FnMut(Measured)) -> Result<()> {
    for &size in &plan.sizes {
        let warmup = plan.warmup(size);
        cpu_phase(&mut link, plan, size, warmup, None)?;
        let start = Instant::now();
        let iters = match plan.duration {
            None => cpu_phase(&mut link, plan, size, plan.iters(size), None)?,
            Some(d) => cpu_phase(
                &mut link,
                plan,
                size,
                DURATION_MAX_MESSAGES,
                Some(start + d),
            )?,
        };
        out(Measured {
            size,
            iters,
            warmup,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    Ok(())
}

/// `x` with 4 significant digits and no exponent (for the table).
fn fixed4(x: f64) -> String {
    let decimals = if x > 0.0 {
        (3 - x.log10().floor() as i32).clamp(0, 9) as usize
    } else {
        3
    };
    format!("{x:.decimals$}")
}

const COLUMNS: [&str; 6] = [
    "bytes",
    "iters",
    "seconds",
    "BW[GB/s]",
    "BW[Gb/s]",
    "rate[Mmsg/s]",
];

/// One size's row; `noisy` says why its figures cannot be trusted, if they cannot (a note
/// after the row, `"noisy": true` in JSON; the rule is in `common/noise.rs`).
fn report(plan: &Plan, header: &Header, m: &Measured, noisy: Option<&str>) {
    let bytes = m.size as f64 * m.iters as f64;
    let (gbytes, mmsgs) = (bytes / m.seconds / 1e9, m.iters as f64 / m.seconds / 1e6);
    if plan.json {
        let o = Object::new()
            .extend(header.json())
            .set("bytes", m.size)
            .set("iters", m.iters)
            .set("warmup", m.warmup)
            .set("seconds", Value::Sig(m.seconds))
            .set("gbytes_per_s", Value::Sig(gbytes))
            .set("gbits_per_s", Value::Sig(gbytes * 8.0))
            .set("mmsg_per_s", Value::Sig(mmsgs))
            .set("noisy", noisy.is_some());
        match noisy {
            Some(why) => outln!("{}", o.set("noisy_why", why)),
            None => outln!("{o}"),
        }
    } else {
        let note = noisy
            .map(|why| format!("   noisy: {why}"))
            .unwrap_or_default();
        outln!(
            "{:>10} {:>10} {:>12} {:>12} {:>12} {:>14}{note}",
            m.size,
            m.iters,
            fixed4(m.seconds),
            fixed4(gbytes),
            fixed4(gbytes * 8.0),
            fixed4(mmsgs)
        );
    }
}

fn run(args: &Args) -> Result<()> {
    let plan = Plan::new(args)?;
    let header = plan.header();
    if !plan.json {
        outln!("{}", header.text());
        let [a, b, c, d, e, f] = COLUMNS;
        outln!("{a:>10} {b:>10} {c:>12} {d:>12} {e:>12} {f:>14}");
    }
    // Involuntary context switches while each size was measured (its warm-up included).
    let mut switches = involuntary_switches();
    let mut out = |m: Measured| {
        let now = involuntary_switches();
        let noisy = descheduled(now.saturating_sub(switches), m.warmup + m.iters);
        switches = now;
        report(&plan, &header, &m, noisy.as_deref())
    };
    if let Some(stage) = &plan.stage {
        return staged::run(&plan, stage, &mut out);
    }
    let max = *plan.sizes.iter().max().context("no sizes")?;
    let (b0, b1) = (Buffer::new(&plan, 0, max)?, Buffer::new(&plan, 1, max)?);
    let link = Link::new(&plan.device, &b0, &b1)?;
    match plan.trigger {
        Trigger::Stream => gpu::stream_run(link, &plan, &mut out),
        Trigger::Kernel => gpu::kernel_run(link, &plan, &mut out),
        _ => cpu_run(link, &plan, &mut out),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| run(&args))
}
