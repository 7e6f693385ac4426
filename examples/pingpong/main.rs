//! Half round-trip latency between two ranks, perftest style (`ib_write_lat`,
//! `ib_send_lat`).
//!
//! Rank 0 writes a message into rank 1's buffer (or sends it); rank 1 sees it land and
//! answers the same way; the time of one round trip, halved, is one sample. `--raw` runs the
//! same loop with the NIC replaced by direct stores into the peer's memory: the floor of the
//! run; `--vs-raw` measures that floor in the same run, in blocks alternating with the NIC's,
//! and adds it and the ratio to each row. The header (device, link, trigger, memory, ranks, cores) is printed at once, and each
//! size's row as soon as it is measured.
//!
//! ```text
//! cargo run --release --bin pingpong                       # soft device, threads
//! cargo run --release --bin pingpong -- --ranks-as procs --sizes 8,4K
//! cargo run --release --bin pingpong -- --raw --json
//! cargo run --release --bin pingpong -- --vs-raw --size 8 --iters 20000
//! cargo run --release --bin pingpong -- --duration 2 --size 8
//! cargo run --release --bin pingpong -- --api mp --trigger kernel --mem device
//! cargo run --release --bin pingpong -- --trigger stream --mem device --staging off
//! ```
//!
//! `--mem device` stages GPU payloads through pinned bounces where the device cannot DMA GPU
//! memory (`--staging auto`, the default; `on`/`off` choose), copied in the trigger's own
//! order; the header says which path ran (`gpu_memory`). `--api mp` stages on the host and
//! stream triggers through mp's own bounce pool, and on the kernel trigger through a staged
//! kernel channel (`Comm::kernel_channels_staged`) whose bounces the kernel copies through.
//!
//! `--api mp` runs the same loop through the messaging layer (`mp::Comm`, send/receive with
//! credits) on every trigger; with `--trigger kernel` each rank's persistent kernel drives
//! its kernel channel (`Comm::kernel_channels`) by itself. Its floor is `--api gdsync` with
//! the same `--op send --trigger` (and that one's `--raw`).

#[path = "../common/mod.rs"]
mod common;
mod explain;
mod gpu;
mod mp_gpu;
mod mp_wire;
mod nic;
mod ranks;
mod raw;
mod read;
mod relay;
mod report;
mod shm;
mod wire;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use common::device::{is_rdma, open};
use common::gpus::Placement;
use common::header::{cores, Header};
use common::sizes::SizeArgs;
use common::tool::usage;
use common::{
    iters, name, one_of, DeviceArgs, GpuArgs, Mem, RanksAs, Staging as StagingArg, ToolArgs,
    Trigger,
};
use gdasync::gdsync::{DeviceName, GpuMemoryPath, LinkPolicy, Ringers};
use gdasync::mp::bootstrap::{Bootstrap, JobInfo, TcpBootstrap, ThreadBootstrap};
use report::Report;
use std::process::ExitCode;
use std::time::Duration;
use wire::Wire;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    /// RDMA write; the receiver polls the message's last byte.
    Write,
    /// RDMA write with immediate; the receiver polls its completion queue.
    WriteImm,
    /// Send; the receiver polls its completion queue.
    Send,
    /// RDMA read (with --api mp: a get), as ib_read_lat: rank 0 reads rank 1's buffer and
    /// waits for each read's completion; times are whole reads, not halved (--trigger
    /// stream|kernel, --mem host).
    Read,
}

/// `--ringers`: who rings the QPs' doorbells ([`Ringers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RingersArg {
    /// Only the stream or kernel rings: commits store nothing after the doorbell.
    Executors,
    /// As where CPU posts interleave: every commit stores "rung to" after its doorbell.
    Mixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Api {
    /// Queue pairs directly.
    Gdsync,
    /// The messaging layer: send/receive with credits (`--op send`, ranks as threads).
    Mp,
}

/// Most samples per size: bounds the sample buffer (80 MB).
const MAX_SAMPLES: u64 = 10_000_000;
/// Largest message (the buffers are allocated at the largest size).
const MAX_SIZE: usize = 1 << 30;
/// How long the rank processes of `--ranks-as procs` wait for each other at start-up.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug, Clone)]
#[command(
    name = "pingpong",
    version,
    about = "Half round-trip latency between two ranks (perftest style)"
)]
struct Cli {
    /// Operation (default: write; with --api mp: send).
    #[arg(long, value_enum)]
    op: Option<Op>,
    /// Who triggers the NIC.
    #[arg(long, value_parser = one_of(&[Trigger::Cpu, Trigger::Host, Trigger::Stream, Trigger::Kernel]), default_value = "cpu")]
    trigger: Trigger,
    /// Replace the NIC with direct stores into the peer's memory (the floor of the run).
    #[arg(long)]
    raw: bool,
    /// With --raw (--trigger stream|kernel, --mem host): each rank stores its marker into a
    /// word of its own, and a CPU thread per rank copies it into the peer's buffer, as the soft
    /// device's engine thread carries a doorbell: the floor of a NIC made of CPU threads.
    #[arg(long)]
    relay: bool,
    /// Also measure the --raw floor in the same run (--trigger cpu): blocks of round trips
    /// alternate between the NIC and direct stores, so both see the same cores and load;
    /// each row adds the floor's p50 and the ratio.
    #[arg(long)]
    vs_raw: bool,
    /// Where the buffers live.
    #[arg(long, value_enum, default_value = "host")]
    mem: Mem,
    /// With --mem device (a GPU trigger, not --raw): how payloads in GPU memory
    /// reach the NIC: `on` through pinned host bounce buffers copied in the trigger's own
    /// order, `off` registered with the device directly, `auto` (default) staged where the
    /// device cannot DMA GPU memory (GDSYNC_STAGING decides if set).
    #[arg(long, value_enum)]
    staging: Option<StagingArg>,
    /// With --api mp and staged GPU memory (host or stream trigger): the staging bounce in
    /// bytes (default: the largest size, a bounce per message); larger messages go in chunks
    /// of this size.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    stage_bounce: Option<u64>,
    /// With --trigger kernel --op write and staged GPU memory (--api gdsync): how a message
    /// travels. `ll`: as 8-byte lines of 4 data bytes and a flag, which the receiving kernel
    /// polls (NCCL's LL protocol: no marker wait and no second read of the bounce; twice the
    /// bytes on the wire; up to 1024 bytes). `simple`: the payload with its marker, which the
    /// receiver waits for, then copies the payload in. Default: ll up to 1024 bytes, simple
    /// above.
    #[arg(long, value_enum)]
    proto: Option<Proto>,
    /// Number of ranks (pingpong runs between 2).
    #[arg(long, default_value_t = 2, value_parser = parse_ranks)]
    ranks: usize,
    /// How the ranks run: threads of this process, or processes (shared-memory link).
    #[arg(long, value_parser = one_of(&[RanksAs::Threads, RanksAs::Procs]), default_value = "threads")]
    ranks_as: RanksAs,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    gpus: GpuArgs,
    #[command(flatten)]
    sizes: SizeArgs,
    /// Timed round trips per size (default: 10000, fewer for large sizes).
    #[arg(long, value_parser = iters::count(1, MAX_SAMPLES), conflicts_with = "duration")]
    iters: Option<u64>,
    /// Instead of --iters: measure each size for this many seconds (--trigger cpu).
    #[arg(long, value_parser = iters::parse_duration)]
    duration: Option<Duration>,
    /// Untimed round trips first, per size (at most a fifth of --iters, plus one).
    #[arg(long, value_parser = iters::count(0, MAX_SAMPLES), default_value_t = 1000)]
    warmup: u64,
    /// With --ranks-as threads: both ranks on one soft device (one engine, a loopback link)
    /// instead of one device per rank as on two hosts. Faster with a free core for the
    /// engine; slower on few cores, where the ranks' threads take turns running its rounds.
    #[arg(long)]
    shared_device: bool,
    /// The queue pairs directly, or the messaging layer.
    #[arg(long, value_enum, default_value = "gdsync")]
    api: Api,
    /// With --api mp --trigger cpu or kernel: receives are kept 64 deep and posted again this
    /// many at a time, with one credit per batch (1: a credit for every message; default 16).
    #[arg(long, value_parser = iters::count(1, mp_wire::RECVS_AHEAD as u64))]
    recv_batch: Option<u64>,
    /// With --trigger stream|kernel: who rings the QPs' doorbells. These loops never post
    /// from the CPU, so their commits need not publish how far they rang (default:
    /// executors); `mixed` measures what publishing it costs.
    #[arg(long, value_enum)]
    ringers: Option<RingersArg>,
    /// Print what each rank runs per iteration (stream memory operations; a kernel's stores,
    /// fences and polls), as the benchmark builds it, instead of running: for --trigger
    /// stream|kernel, or with no --trigger for every GPU trigger, op and --raw floor. Needs
    /// no GPU with --mem host.
    #[arg(long)]
    explain: bool,
    /// One JSON object per size instead of a table.
    #[arg(long)]
    json: bool,
    /// With --trigger stream: run the stream loop on a host stream (no GPU), to test the
    /// loop where there is no GPU.
    #[arg(long, hide = true)]
    host_stream: bool,
    /// Internal: this process is a rank of --ranks-as procs.
    #[arg(long, hide = true)]
    child: bool,
    #[command(flatten)]
    tool: ToolArgs,
}

/// `--ranks`: a count. The old spellings `threads` and `procs` get a pointer to
/// `--ranks-as`.
fn parse_ranks(s: &str) -> Result<usize, String> {
    match s {
        "threads" | "procs" => Err(format!(
            "--ranks is the number of ranks now: use --ranks-as {s}"
        )),
        _ => s
            .parse()
            .map_err(|_| format!("{s:?} is not a number of ranks")),
    }
}

/// The run, checked: every flag applies to the chosen mode.
#[derive(Clone, Debug)]
struct Args {
    op: Op,
    trigger: Trigger,
    raw: bool,
    /// `--relay`: a CPU thread per rank carries `--raw`'s markers.
    relay: bool,
    vs_raw: bool,
    mem: Mem,
    /// With --mem device: how GPU payloads reach the NIC, and why (`None`: host memory,
    /// `--raw`, or `--api mp`, which registers GPU memory with the device).
    gpu_memory: Option<(GpuMemoryPath, String)>,
    ranks_as: RanksAs,
    /// The device the ranks run on (soft with --raw, which uses none).
    device: DeviceName,
    sizes: Vec<usize>,
    iters: Option<u64>,
    duration: Option<Duration>,
    warmup: u64,
    shared_device: bool,
    api: Api,
    recv_batch: usize,
    /// `--stage-bounce`: mp's staging bounce (None: the largest size).
    stage_bounce: Option<usize>,
    /// `--proto`: messages up to this many bytes travel as LL lines (0: none do).
    ll_max: usize,
    json: bool,
    host_stream: bool,
    /// The GPU triggers: the GPU of each rank (`--gpus`).
    placement: Option<Placement>,
    ringers: Ringers,
    explain: bool,
}

impl Args {
    fn new(c: &Cli) -> Result<Args> {
        if c.ranks != 2 {
            return Err(usage(format!(
                "--ranks {}: pingpong runs between 2 ranks (for more, see stencil2d)",
                c.ranks
            )));
        }
        let op = match (c.api, c.op) {
            // A put into the peer's window (`mp::Comm::iput_on` on a stream, `gds_peer_put`
            // in a kernel), measured against `--api gdsync --op write`: the same RDMA write,
            // the same marker wait.
            (Api::Mp, Some(Op::Write))
                if matches!(c.trigger, Trigger::Stream | Trigger::Kernel) && c.mem == Mem::Host =>
            {
                Op::Write
            }
            (Api::Mp, Some(Op::Write)) => {
                return Err(usage("--api mp --op write (a put into the peer's window, on a stream or from a kernel) runs with --trigger stream or kernel, --mem host"));
            }
            (_, Some(Op::Read))
                if matches!(c.trigger, Trigger::Stream | Trigger::Kernel)
                    && c.mem == Mem::Host
                    && !c.raw =>
            {
                Op::Read
            }
            (_, Some(Op::Read)) => {
                return Err(usage("--op read (the latency of a read, as ib_read_lat; with --api mp a get) runs with --trigger stream or kernel, --mem host, without --raw"));
            }
            (Api::Mp, Some(op)) if op != Op::Send => {
                let why = format!("--api mp sends messages: --op {} does not apply", name(op));
                return Err(usage(why));
            }
            (Api::Mp, _) => Op::Send,
            (Api::Gdsync, op) => op.unwrap_or(Op::Write),
        };
        check_flags(c, op)?;
        let sizes = check_sizes(c, op).map_err(usage)?;
        let named = c.device.device.as_ref();
        refuse_if(
            c.shared_device && named.is_some_and(is_rdma),
            SHARED_SOFT_ONLY,
        )?;
        let device = if c.raw {
            DeviceName::Soft
        } else {
            c.device.resolve()?
        };
        refuse_if(c.shared_device && is_rdma(&device), SHARED_SOFT_ONLY)?;
        let gpu = c.trigger.gpu() && !c.host_stream;
        refuse_if(
            c.gpus.gpus.is_some() && !gpu,
            "--gpus applies to the GPU triggers (host, stream, kernel)",
        )?;
        // --explain prints the lists without running them: a GPU only for device memory.
        let gpu_needed = !c.explain || c.mem == Mem::Device;
        let placement = if gpu && gpu_needed {
            if let Err(e) = gdasync::gdsync::cuda::Cuda::get().and_then(|c| c.gpu(0).map(|_| ())) {
                bail!("--trigger {} needs a CUDA GPU: {e}", name(c.trigger));
            }
            let p = c.gpus.resolve_here()?;
            if c.raw && c.mem == Mem::Device && p.ordinal(0) != p.ordinal(1) {
                bail!("--raw --mem device stores into the other rank's GPU memory, which this tool does not map across GPUs: put both ranks on one GPU (--gpus 0)");
            }
            p.tell_gdsync(2);
            common::gpus::place(p.clone());
            Some(p)
        } else {
            None
        };
        // A host stream stages too, with host memory standing in for the GPU's.
        let staged_paths = c.mem == Mem::Device && !c.raw && c.trigger.gpu() && staging_api(c);
        let gpu_memory = if staged_paths {
            let gpu0 = placement.as_ref().map_or(0, |p| p.ordinal(0));
            let asked = c.staging.and_then(StagingArg::asked);
            Some(common::device::gpu_memory_path(&device, gpu0, asked)?)
        } else {
            None
        };
        refuse_if(
            c.host_stream && c.mem == Mem::Device && !matches!(gpu_memory, Some((GpuMemoryPath::Staged, _))),
            "--host-stream --mem device runs staged only (host memory stands in for the GPU's): drop --staging off",
        )?;
        let ll_max = ll_max(c, op, &sizes, &gpu_memory)?;
        Ok(Args {
            op,
            trigger: c.trigger,
            raw: c.raw,
            relay: c.relay,
            vs_raw: c.vs_raw,
            mem: c.mem,
            gpu_memory,
            ranks_as: c.ranks_as,
            device,
            sizes,
            iters: c.iters,
            duration: c.duration,
            warmup: c.warmup,
            shared_device: c.shared_device,
            api: c.api,
            recv_batch: c.recv_batch.unwrap_or(16) as usize,
            stage_bounce: c.stage_bounce.map(|b| b as usize),
            ll_max,
            json: c.json,
            host_stream: c.host_stream,
            placement,
            ringers: match c.ringers {
                Some(RingersArg::Mixed) => Ringers::Mixed,
                Some(RingersArg::Executors) => Ringers::Executors,
                // The loops that commit and never post from the CPU.
                None if matches!(c.trigger, Trigger::Stream | Trigger::Kernel) || c.explain => {
                    Ringers::Executors
                }
                None => Ringers::Mixed,
            },
            explain: c.explain,
        })
    }
    fn sizes(&self) -> Vec<usize> {
        self.sizes.clone()
    }
    fn iters(&self, size: usize) -> usize {
        self.iters
            .map(|n| n as usize)
            .unwrap_or_else(|| 10_000usize.min(((1usize << 31) / size.max(1)).max(200)))
    }
    fn warmup(&self, size: usize) -> usize {
        (self.warmup as usize).min(self.iters(size) / 5 + 1)
    }
    fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// Whether `c`'s API stages GPU payloads: gdsync and mp on every GPU trigger (mp's kernel
/// trigger through a staged kernel channel).
fn staging_api(c: &Cli) -> bool {
    c.api == Api::Gdsync
        || (c.api == Api::Mp
            && matches!(c.trigger, Trigger::Host | Trigger::Stream | Trigger::Kernel))
}

/// How a message travels (`--proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Proto {
    /// The payload with its marker: the receiver waits for the marker, then copies in.
    Simple,
    /// 8-byte lines of 4 data bytes and a flag, which the receiver polls.
    Ll,
}

/// Up to how many bytes messages travel as LL lines (`--proto`; 0: none): by default every
/// size up to the LL limit where LL applies (`--api gdsync --trigger kernel --op write`, staged
/// GPU memory).
fn ll_max(
    c: &Cli,
    op: Op,
    sizes: &[usize],
    gpu_memory: &Option<(GpuMemoryPath, String)>,
) -> Result<usize> {
    let applies = c.api == Api::Gdsync
        && c.trigger == Trigger::Kernel
        && op == Op::Write
        && matches!(gpu_memory, Some((GpuMemoryPath::Staged, _)));
    let max = gdasync::gdsync::kernel::ll::MAX;
    match c.proto {
        Some(_) if !applies => Err(usage(
            "--proto applies to --api gdsync --trigger kernel --op write with staged GPU memory (--mem device)",
        )),
        Some(Proto::Ll) if sizes.iter().any(|&s| s > max) => Err(usage(format!(
            "--proto ll carries messages of up to {max} bytes: give smaller --sizes, or leave --proto out (ll up to {max} bytes, simple above)"
        ))),
        Some(Proto::Simple) => Ok(0),
        _ if applies => Ok(max),
        _ => Ok(0),
    }
}

/// Refuses flags that do not apply to the chosen mode.
fn check_flags(c: &Cli, op: Op) -> Result<()> {
    refuse_if(
        c.api == Api::Mp && c.raw,
        "--raw is the floor of --api gdsync (--api gdsync --op send --raw)",
    )?;
    refuse_if(
        c.api == Api::Mp && c.ranks_as == RanksAs::Procs,
        "--api mp runs its ranks as threads",
    )?;
    refuse_if(
        c.ranks_as == RanksAs::Procs && c.trigger != Trigger::Cpu,
        "--ranks-as procs applies to --trigger cpu: the GPU triggers run both ranks as threads of this process (stencil2d --ranks-as procs runs GPU ranks as processes)",
    )?;
    refuse_if(
        c.vs_raw && c.raw,
        "--vs-raw measures the NIC next to --raw: give one of them",
    )?;
    refuse_if(
        c.vs_raw && c.trigger != Trigger::Cpu,
        "--vs-raw applies to --trigger cpu (the floor of GPU triggers is their own --raw)",
    )?;
    refuse_if(
        c.vs_raw && c.duration.is_some(),
        "--vs-raw alternates blocks of --iters round trips: use --iters, not --duration",
    )?;
    refuse_if(
        c.raw && op != Op::Write,
        "--raw stores into the peer's memory: --op does not apply",
    )?;
    refuse_if(
        c.relay
            && !(c.raw
                && matches!(c.trigger, Trigger::Stream | Trigger::Kernel)
                && c.mem == Mem::Host
                && !c.explain),
        "--relay puts a CPU thread into --raw's loop: it applies to --raw --trigger stream|kernel --mem host (runs, not --explain)",
    )?;
    refuse_if(
        c.raw && c.shared_device,
        "--raw uses no device: --shared-device does not apply",
    )?;
    refuse_if(
        c.raw && c.device.device.is_some(),
        "--raw uses no device: --device does not apply",
    )?;
    refuse_if(c.shared_device && (c.ranks_as != RanksAs::Threads || c.trigger.gpu()),
        "--shared-device applies to --ranks-as threads --trigger cpu (processes always have their own device)")?;
    refuse_if(
        c.trigger == Trigger::Cpu && c.mem != Mem::Host,
        "--trigger cpu polls host memory: use --mem host, or a GPU trigger for --mem device",
    )?;
    refuse_if(
        c.staging.is_some() && !(c.mem == Mem::Device && staging_api(c) && !c.raw),
        "--staging applies to --mem device with a GPU trigger (not --raw)",
    )?;
    refuse_if(
        c.stage_bounce.is_some()
            && !(c.api == Api::Mp
                && c.mem == Mem::Device
                && staging_api(c)
                && !c.raw
                && c.trigger != Trigger::Kernel),
        "--stage-bounce applies to --api mp --mem device with staging (host or stream trigger; a staged kernel channel's bounces are the message size)",
    )?;
    refuse_if(
        c.host_stream && c.trigger != Trigger::Stream,
        "--host-stream applies to --trigger stream",
    )?;
    refuse_if(
        c.recv_batch.is_some()
            && !(c.api == Api::Mp && matches!(c.trigger, Trigger::Cpu | Trigger::Kernel)),
        "--recv-batch applies to --api mp with --trigger cpu or kernel",
    )?;
    refuse_if(
        c.ringers.is_some()
            && (c.api != Api::Gdsync
                || c.raw
                || !(c.explain || matches!(c.trigger, Trigger::Stream | Trigger::Kernel))),
        "--ringers applies to --api gdsync --trigger stream|kernel (not --raw), and to --explain",
    )?;
    refuse_if(
        c.explain
            && (c.api != Api::Gdsync
                || op == Op::Read
                || c.vs_raw
                || c.ranks_as != RanksAs::Threads
                || c.trigger == Trigger::Host),
        "--explain prints the lists of --api gdsync --trigger stream|kernel (threads; no --vs-raw, no --op read)",
    )?;
    refuse_if(c.duration.is_some() && c.trigger != Trigger::Cpu,
        "--duration applies to --trigger cpu (GPU triggers enqueue a fixed number of round trips: use --iters)")?;
    refuse_if(c.trigger.gpu() && !c.host_stream && c.ranks_as != RanksAs::Threads,
        "GPU triggers run the ranks as threads of one process sharing a soft device (CUDA time-slices separate processes on one GPU)")?;
    Ok(())
}

/// The sizes, checked against what the chosen mode can move.
fn check_sizes(c: &Cli, op: Op) -> Result<Vec<usize>> {
    let sizes = c.sizes.or(|| vec![8, 64, 512, 4096, 65536, 1 << 20]);
    let gpu = c.trigger.gpu();
    let (min, why) = if gpu {
        (
            4,
            "GPU triggers put a 32-bit marker at the end of each message",
        )
    } else if op == Op::Write || c.raw || c.vs_raw {
        (
            1,
            "--op write, --raw and --vs-raw poll the message's last byte",
        )
    } else {
        (0, "")
    };
    common::sizes::check(&sizes, min, MAX_SIZE, why)?;
    if gpu && sizes.iter().any(|s| s % 4 != 0) {
        bail!("GPU triggers put a 32-bit marker at the end of each message: sizes must be multiples of 4");
    }
    Ok(sizes)
}

/// Why `--shared-device` does not go with an RDMA device.
const SHARED_SOFT_ONLY: &str =
    "--shared-device applies to the soft device (the ranks on an RDMA device share it already)";

/// A [`usage`] error saying `why` when a flag does not apply to the chosen mode.
fn refuse_if(refused: bool, why: &str) -> Result<()> {
    if refused {
        return Err(usage(why));
    }
    Ok(())
}

/// What runs where, for the header and every JSON row.
fn header(a: &Args) -> Result<Header> {
    let link = if a.relay {
        "stores relayed by a CPU thread per rank"
    } else if a.raw {
        "direct stores"
    } else if is_rdma(&a.device) {
        // QPs of one RDMA port reach each other through the HCA, in one process or two.
        "RDMA (the HCA's loopback)"
    } else if a.ranks_as == RanksAs::Procs {
        match std::env::var("GDSYNC_SOFT_LINK")
            .unwrap_or_default()
            .parse::<LinkPolicy>()?
        {
            LinkPolicy::Tcp => "TCP",
            _ => "shared memory",
        }
    } else if a.shared_device {
        "loopback"
    } else {
        "in-process"
    };
    // What one sample times: half a round trip, or a whole read (ib_read_lat's way).
    let (sample, note) = if a.op == Op::Read {
        ("read", "times are whole reads (a round trip each, not halved) in microseconds; cpu: CPU time of both ranks per read")
    } else {
        ("half round trip", "times are half round trips in microseconds; cpu: CPU time of both ranks per round trip")
    };
    let mut h = Header::new("pingpong")
        .field("op", name(a.op))
        .field("sample", sample)
        .field("api", name(a.api))
        .field(
            "trigger",
            if a.host_stream {
                "host-stream".into()
            } else {
                name(a.trigger)
            },
        )
        .field("raw", a.raw)
        .field("relay", a.relay)
        .field("vs_raw", a.vs_raw)
        .field("mem", name(a.mem))
        .field(
            "device",
            if a.raw {
                "none".into()
            } else {
                a.device.to_string()
            },
        )
        .field("link", link)
        .field("ranks", 2u32)
        .field("ranks_as", name(a.ranks_as))
        .field("cores", cores());
    if !a.raw && !is_rdma(&a.device) {
        // Where the soft device's engine runs: its own spinning thread, or the ranks'
        // threads when the cores are too few for both.
        let engines = if a.shared_device { 1 } else { 2 };
        h = h.field(
            "progress",
            gdasync::gdsync::progress_mode_for(engines).to_string(),
        );
    }
    if let Some(path) = &a.gpu_memory {
        // How GPU payloads reach the NIC: staged through pinned bounces, or directly.
        h = h.field("gpu_memory", common::device::gpu_memory_phrase(path));
    }
    if a.ll_max > 0 {
        h = h.field(
            "proto",
            format!("ll up to {} bytes, simple above", a.ll_max),
        );
    }
    if a.trigger.gpu() && !a.host_stream {
        let c = gdasync::gdsync::cuda::Cuda::get()?;
        let p = a.placement.as_ref().context("the GPU placement")?;
        h = h.field("gpu", c.gpu(p.ordinal(0))?.name.clone());
        // The driver's hardware queues per GPU: the stream trigger's latency depends on it.
        h = h.field("cuda_queues", c.queues());
    }
    // The GPU of each rank (`null` where no GPU is used).
    h = h.field("gpus", a.placement.as_ref().map(|p| p.label(2)));
    if a.duration.is_some() {
        h = h.field(
            "duration_s",
            common::json::Value::Fixed(a.duration.unwrap_or_default().as_secs_f64(), 3),
        );
    }
    Ok(h.note(note))
}

/// Both ranks as threads of this process.
fn threads(args: &Args, report: &Report) -> Result<()> {
    let max = args.max_size();
    let (w0, w1): (Box<dyn Wire + Send>, Box<dyn Wire + Send>) = if args.raw {
        let [r0, r1] = raw::heap_pair(max);
        (Box::new(r0), Box::new(r1))
    } else if args.api == Api::Mp {
        // One soft device per rank, as for the gdsync loop below, unless asked to share one.
        let dev = open(&args.device)?;
        let d = if args.shared_device || is_rdma(&args.device) {
            dev.clone()
        } else {
            open(&args.device)?
        };
        let [b0, b1] = pair(ThreadBootstrap::group(2));
        let batch = args.recv_batch;
        let h = std::thread::spawn(move || mp_wire::MpWire::new(Box::new(b1), &d, max, batch));
        let w0 = mp_wire::MpWire::new(Box::new(b0), &dev, max, batch)?;
        let w1 = h.join().map_err(|_| anyhow::anyhow!("rank 1 panicked"))??;
        (Box::new(w0), Box::new(w1))
    } else {
        // One soft device per rank, as on two hosts, unless asked to share one; an RDMA
        // device serves both ranks, as a host's NIC serves its processes.
        let d0 = open(&args.device)?;
        let d1 = if args.shared_device || is_rdma(&args.device) {
            d0.clone()
        } else {
            open(&args.device)?
        };
        let (s0, s1) = (nic::NicSetup::new(&d0, max)?, nic::NicSetup::new(&d1, max)?);
        let (e0, e1) = (s0.qp.endpoint(), s1.qp.endpoint());
        let (r0, r1) = (s0.rbuf.remote(), s1.rbuf.remote());
        (
            Box::new(s0.connect(&e1, r1, args.op)?),
            Box::new(s1.connect(&e0, r0, args.op)?),
        )
    };
    let [mut f0, mut f1] = match args.vs_raw {
        true => raw::heap_pair(max).map(Some),
        false => [None, None],
    };
    let [mut b0, mut b1] = pair(ThreadBootstrap::group(2));
    let a1 = args.clone();
    let t1 = std::thread::spawn(move || -> Result<()> {
        let mut w1 = w1;
        let floor = f1.as_mut().map(|f| f as &mut dyn Wire);
        ranks::run_rank(1, &mut *w1, floor, &a1, &mut b1, false, &mut |_, _| Ok(()))
    });
    let mut w0 = w0;
    let floor = f0.as_mut().map(|f| f as &mut dyn Wire);
    // A failure of rank 0 ends the run at once (rank 1 may wait for it until its timeout).
    ranks::run_rank(0, &mut *w0, floor, args, &mut b0, false, &mut |s, f| {
        report.row(&s, f.as_ref());
        Ok(())
    })?;
    t1.join().map_err(|_| anyhow::anyhow!("rank 1 panicked"))?
}

fn pair<T>(v: Vec<T>) -> [T; 2] {
    v.try_into()
        .unwrap_or_else(|_| unreachable!("a group of two"))
}

/// One rank process of `--ranks-as procs` (started by [`common::launch::run_local`]).
fn child(args: &Args, report: &Report) -> Result<()> {
    let info = JobInfo::from_env().context("--child is for the processes pingpong starts")?;
    let rank = info.rank;
    let mut boot = TcpBootstrap::connect(&info, BOOT_TIMEOUT)?;
    let max = args.max_size();
    let mut wire: Box<dyn Wire> = if args.raw {
        Box::new(raw_procs(rank, &mut boot, max)?)
    } else {
        let s = nic::NicSetup::new(&open(&args.device)?, max)?;
        let all = boot.all_gather(s.card().as_bytes())?;
        let card = String::from_utf8_lossy(&all[1 - rank]).into_owned();
        Box::new(s.connect_card(&card, args.op)?)
    };
    let mut floor = match args.vs_raw {
        true => Some(raw_procs(rank, &mut boot, max)?),
        false => None,
    };
    let floor = floor.as_mut().map(|f| f as &mut dyn Wire);
    ranks::run_rank(
        rank,
        &mut *wire,
        floor,
        args,
        &mut boot,
        true,
        &mut |s, f| {
            report.row(&s, f.as_ref());
            Ok(())
        },
    )
    .with_context(|| format!("rank {rank}"))
}

/// The `--raw` wire of a rank process: buffers in a shared-memory file rank 0 creates.
fn raw_procs(rank: usize, boot: &mut TcpBootstrap, max: usize) -> Result<raw::Raw> {
    const PREFIX: &str = "/dev/shm/gdsync-pingpong-raw-";
    let mine = format!("{PREFIX}{}", std::process::id());
    // Created before the exchange, so that it exists when rank 1 opens it.
    let created = if rank == 0 {
        Some(shm::shm_bufs(&mine, max, true)?)
    } else {
        None
    };
    let all = boot.all_gather(mine.as_bytes())?;
    let path = String::from_utf8(all[0].clone())
        .ok()
        .filter(|p| p.starts_with(PREFIX))
        .context("bad shared-memory path from rank 0")?;
    let (a, b) = match created {
        Some(bufs) => bufs,
        None => shm::shm_bufs(&path, max, false)?,
    };
    boot.barrier()?;
    if rank == 0 {
        let _ = std::fs::remove_file(&path);
    }
    let (local, peer) = if rank == 0 { (a, b) } else { (b, a) };
    Ok(raw::Raw::new(local, peer, max))
}

fn run(cli: &Cli) -> Result<()> {
    let args = Args::new(cli)?;
    if args.explain {
        return explain::run(&args);
    }
    let report = Report::new(header(&args)?, args.json, args.vs_raw);
    if cli.child {
        return child(&args, &report);
    }
    report.header();
    let mut emit = |s: common::stats::Stats| {
        report.row(&s, None);
        Ok(())
    };
    match (args.trigger, args.api, args.ranks_as) {
        (Trigger::Cpu, _, RanksAs::Procs) => common::launch::run_local(2),
        (Trigger::Cpu, _, _) => threads(&args, &report),
        _ if args.op == Op::Read => read::run(&args, &mut emit),
        (_, Api::Mp, _) => mp_gpu::run(&args, &mut emit),
        (_, Api::Gdsync, _) => gpu::run(&args, &mut emit),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.tool.run(|| run(&cli))
}
