//! A 2D Jacobi solver (5-point stencil) with a halo exchange every iteration: the classic
//! GPUDirect Async demo.
//!
//! The global grid is split over the ranks in `px × py` blocks (as square as the rank count
//! allows; row strips when it is prime). Every iteration each rank sends the cells next to
//! its neighbours and receives their cells into its halo, then updates its block. `--trigger`
//! picks who computes and who drives the exchange:
//!
//! | trigger | compute | exchange |
//! |---|---|---|
//! | `cpu` | CPU | posted on a host stream (`isend_on`/`wait_on`), runs anywhere |
//! | `host` | GPU | the CPU: synchronise, send, wait, launch (the MPI-style baseline) |
//! | `stream` | GPU | the CUDA stream itself, with no host synchronisation in the loop |
//! | `kernel` | GPU | one persistent kernel per rank: it sends, waits and computes |
//!
//! The GPU triggers keep their halo messages in device memory (`--halo device`, the
//! default) or in pinned host memory that the kernels reach directly (`--halo host`).
//!
//! `--check` runs the same problem on a single rank with the same arithmetic and compares
//! the final grids bit for bit.
//!
//! ```text
//! cargo run --release --bin stencil2d -- --ranks 4 --n 256 --check
//! cargo run --release --bin stencil2d -- --ranks 4 --ranks-as procs --check --json
//! cargo run --release --bin stencil2d -- --trigger stream --ranks 2 --sub 1024 --iters 1000
//! ```

#[path = "../common/mod.rs"]
mod common;
mod cpu;
mod gpu;
mod grid;
mod limits;
mod profile;
mod progress;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use common::device::open;
use common::gpus::Placement;
use common::header::cores;
use common::json::{Object, Value};
use common::out::outln;
use common::tool::usage;
pub use common::Trigger;
use common::{iters, name, DeviceArgs, GpuArgs, RanksAs, Staging as StagingArg, ToolArgs};
use gdasync::gdsync::{Device, DeviceName, GpuMemoryPath, ProgressMode};
use gdasync::mp::bootstrap::{Bootstrap, JobInfo, TcpBootstrap, ThreadBootstrap};
use gdasync::mp::Comm;
use grid::Layout;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the GPU triggers' halo messages live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Halo {
    /// Device memory: kernels pack and unpack every side there. On the soft device every such message costs two driver copies
    /// (device → host → device, ~5 µs each), which a ConnectX would replace by GPUDirect
    /// RDMA.
    Device,
    /// Pinned host memory mapped for the GPU: kernels pack and unpack every side there, and
    /// the soft device moves the bytes with the CPU, as a NIC would by DMA.
    Host,
}

/// Whether the GPU triggers compute the interior while the halos are in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Overlap {
    /// An interior kernel between the sends and the wait for the halos, then a ring kernel:
    /// the interior hides part of the messages' flight, for one more GPU step per iteration.
    On,
    /// One kernel per iteration, after the halos arrived: nothing overlaps the messages, but
    /// the GPU has a step (and, on a stream, a list of memory operations) less per iteration.
    Off,
    /// `off` for blocks of fewer than 512×512 cells, `on` from 512×512 up.
    Auto,
}

/// Smallest block (cells) for which `--overlap auto` overlaps: below it the interior takes
/// the GPU less time than the step it adds. Measured on an H200 with 2 ranks: without
/// overlap both GPU triggers are faster at 64² (halos in host memory: stream 12.2 vs 14.2 µs)
/// and at 256² with host halos (with device halos host-driven was faster with overlap, 40.8
/// vs 42.6 µs, two noisy repetitions), with it at 1024² (device halos: 39.7 vs 42.4 µs).
pub const OVERLAP_MIN_CELLS: usize = 512 * 512;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "stencil2d",
    version,
    about = "2D Jacobi solver with a halo exchange every iteration (GPUDirect Async demo)"
)]
struct Args {
    /// Global grid size N (an N × N grid).
    #[arg(long, default_value_t = 256)]
    n: usize,
    /// Instead of --n: each rank owns a SUB × SUB block (the global grid is SUB·px × SUB·py).
    #[arg(long, conflicts_with = "n")]
    sub: Option<usize>,
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Timed iterations.
    #[arg(long, default_value_t = 100, value_parser = iters::count(1, iters::MAX_ITERS))]
    iters: u64,
    /// Untimed iterations before them.
    #[arg(long, default_value_t = 10, value_parser = iters::count(0, iters::MAX_ITERS))]
    warmup: u64,
    /// Who computes and who drives the exchange (cpu: the CPU computes, a host stream
    /// exchanges; the others compute on the GPU).
    #[arg(long, value_enum, default_value = "cpu")]
    trigger: Trigger,
    /// Compare the result with a single-rank run of the same arithmetic, bit for bit.
    #[arg(long)]
    check: bool,
    /// One JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// How the ranks run.
    #[arg(long, value_enum, default_value = "threads")]
    ranks_as: RanksAs,
    /// GPU triggers: where the halo messages live (default: device).
    #[arg(long, value_enum)]
    halo: Option<Halo>,
    /// With --halo device and a GPU trigger: how halo messages in GPU memory reach the NIC:
    /// `on` through pinned bounces copied in the trigger's own order (mp's pool; the kernel
    /// channels' own bounces with --trigger kernel), `off` registered with the device
    /// directly, `auto` (default) staged where the device cannot DMA GPU memory
    /// (GDSYNC_STAGING decides if set).
    #[arg(long, value_enum)]
    staging: Option<StagingArg>,
    /// GPU triggers host and stream: compute the interior while the halos are in flight
    /// (on), or the whole block once they arrived (off) (default: auto).
    #[arg(long, value_enum)]
    overlap: Option<Overlap>,
    /// Seconds a rank waits for a peer (at start-up, and for each message) before it fails.
    /// A run in which no rank moves for 15 s longer ends with where each rank is.
    #[arg(long, default_value_t = 60, value_parser = iters::count(1, 86_400))]
    timeout: u64,
    /// GPU triggers with ranks as threads: every rank on one soft device (one engine for all)
    /// instead of one device per rank, as one NIC per GPU would be.
    #[arg(long)]
    shared_device: bool,
    /// Where the time goes (GPU triggers), on stderr: each rank's threads, its memory
    /// operations and lists per iteration, and (`--trigger stream`) the CPU's and the GPU's
    /// time in each step of an iteration.
    #[arg(long, alias = "profile")]
    trace: bool,
    /// Internal: this process is one rank of `--ranks-as procs`.
    #[arg(long, hide = true)]
    child: bool,
    /// Internal (tests): flip the last bit of one value of the last rank's result, so that
    /// `--check` must fail.
    #[arg(long, hide = true)]
    corrupt: bool,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    gpus: GpuArgs,
    #[command(flatten)]
    tool: ToolArgs,
}

/// The validated run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Global rows and columns.
    pub gx: usize,
    pub gy: usize,
    pub px: usize,
    pub py: usize,
    pub ranks: usize,
    pub warmup: u64,
    pub iters: u64,
    pub trigger: Trigger,
    pub halo: Halo,
    /// `--halo device` with the host or stream trigger: the path of GPU payloads, and why.
    pub gpu_memory: Option<(GpuMemoryPath, String)>,
    /// `--overlap`, resolved (`auto` decided by the block size).
    pub overlap: bool,
    pub trace: bool,
    /// Ranks as threads on the soft device: one device (engine) per rank, not one for all.
    pub device_per_rank: bool,
    /// `--timeout`.
    timeout: Duration,
    check: bool,
    json: bool,
    ranks_as: RanksAs,
    /// The device every rank runs on.
    device: DeviceName,
    /// The GPU triggers: the GPU of each rank (`--gpus`).
    pub placement: Option<Placement>,
    corrupt: bool,
}

/// Largest block a rank may hold (cells, halo included): two grids of 8 GiB.
const MAX_BLOCK_CELLS: usize = 1 << 30;

/// Whether halo messages of `a` may be staged: in device memory, sent by a GPU trigger (mp's
/// pool for host and stream, the kernel channels' own bounces for the kernel).
fn stages(a: &Args) -> bool {
    a.trigger.gpu() && a.halo.unwrap_or(Halo::Device) == Halo::Device
}

/// Refuses flags that do not apply to the chosen trigger.
fn check_flags(a: &Args) -> Result<()> {
    if a.halo.is_some() && !a.trigger.gpu() {
        bail!("--halo applies to the GPU triggers (host, stream, kernel): --trigger cpu computes and exchanges in host memory");
    }
    if a.staging.is_some() && !stages(a) {
        bail!("--staging applies to --halo device with a GPU trigger (host, stream or kernel)");
    }
    // `auto` (the default, said out loud) fits every trigger; on and off only where they
    // choose something.
    if a.overlap.is_some_and(|o| o != Overlap::Auto)
        && !matches!(a.trigger, Trigger::Host | Trigger::Stream)
    {
        bail!("--overlap applies to --trigger host and stream (the kernel trigger always overlaps, the CPU trigger computes the interior while the host stream exchanges)");
    }
    if a.trace && !a.trigger.gpu() {
        bail!("--trace applies to the GPU triggers (host, stream, kernel)");
    }
    if a.shared_device && !(a.trigger.gpu() && a.ranks_as == RanksAs::Threads) {
        bail!("--shared-device applies to the GPU triggers with --ranks-as threads (the CPU trigger's thread ranks share one device always, processes have one each)");
    }
    if a.corrupt && !a.check {
        bail!("--corrupt is a test of --check: add --check");
    }
    a.gpus
        .refuse_unless(a.trigger.gpu(), "--trigger host, stream or kernel")
}

/// Most ranks of one run (processes of one host, or threads of one process).
const MAX_RANKS: usize = 4096;

impl Config {
    fn new(a: &Args) -> Result<Config> {
        if a.ranks == 0 {
            return Err(usage("--ranks must be at least 1"));
        }
        if a.ranks > MAX_RANKS {
            return Err(usage(format!("--ranks {}: at most {MAX_RANKS}", a.ranks)));
        }
        check_flags(a).map_err(usage)?;
        let (px, py) = grid::decompose(a.ranks);
        let (gx, gy) = match a.sub {
            Some(s) => (s.saturating_mul(px), s.saturating_mul(py)),
            None => (a.n, a.n),
        };
        if gx == 0 || gy == 0 {
            return Err(usage("the grid must have at least one cell (--n / --sub)"));
        }
        if gx < px || gy < py {
            return Err(usage(format!("a {gx} x {gy} grid cannot give each of {px} x {py} ranks a row and a column: use a larger --n or fewer --ranks")));
        }
        let (bx, by) = Layout::largest_block(gx, gy, px, py);
        let block_cells = bx.saturating_add(2).saturating_mul(by.saturating_add(2));
        if block_cells > MAX_BLOCK_CELLS {
            return Err(usage(format!("blocks of {bx} x {by} cells are larger than this example allows ({MAX_BLOCK_CELLS} cells per grid)")));
        }
        // Host memory for the grids: the CPU trigger's blocks (two grids per rank), and for
        // --check the gathered grid, its copies and the single-rank reference.
        let grids = if a.trigger.gpu() {
            0
        } else {
            a.ranks.saturating_mul(2 * 8 * block_cells)
        };
        let check = if a.check {
            gx.saturating_mul(gy).saturating_mul(5 * 8)
        } else {
            0
        };
        let device = a.device.resolve()?;
        if a.shared_device && common::device::is_rdma(&device) {
            return Err(usage("--shared-device applies to the soft device (the ranks on an RDMA device share it already)"));
        }
        // A device per rank while each engine still gets a core to spin on: where the engines
        // would share the cores with the ranks (shared progress), the engines of GPU memory
        // wait for their own threads' naps, and one engine serves better.
        let device_per_rank = a.trigger.gpu()
            && a.ranks_as == RanksAs::Threads
            && !a.shared_device
            && !common::device::is_rdma(&device)
            && gdasync::gdsync::progress_mode_for(a.ranks) == ProgressMode::Thread;
        let sharing = match a.ranks_as {
            RanksAs::Threads if device_per_rank => limits::Sharing::DevicePerThread,
            RanksAs::Threads => limits::Sharing::OneDevice,
            _ => limits::Sharing::Processes,
        };
        limits::check_with(&device, a.ranks, sharing, grids.saturating_add(check))?;
        // MPI ranks may be spread over hosts: this host's cores say nothing about them.
        let local = a.ranks_as != RanksAs::Mpi;
        if let Some(why) = limits::oversubscribed(a.ranks, cores()).filter(|_| local) {
            tracing::warn!("{why}");
        }
        let placement = if a.trigger.gpu() {
            let c = gdasync::gdsync::cuda::Cuda::get()
                .with_context(|| format!("--trigger {} needs a CUDA GPU", name(a.trigger)))?;
            if c.gpus.is_empty() {
                bail!("--trigger {} needs a CUDA GPU; none found", name(a.trigger));
            }
            let p = a.gpus.resolve(c.gpus.len())?;
            let p = match a.ranks_as {
                RanksAs::Mpi => p.under_mpi(),
                _ => p,
            };
            p.tell_gdsync(a.ranks);
            Some(p)
        } else {
            None
        };
        let gpu_memory = match (&placement, stages(a)) {
            (Some(p), true) => Some(common::device::gpu_memory_path(
                &device,
                p.ordinal(0),
                a.staging.and_then(StagingArg::asked),
            )?),
            _ => None,
        };
        Ok(Config {
            gx,
            gy,
            px,
            py,
            ranks: a.ranks,
            warmup: a.warmup,
            iters: a.iters,
            trigger: a.trigger,
            halo: a.halo.unwrap_or(Halo::Device),
            gpu_memory,
            overlap: match a.overlap.unwrap_or(Overlap::Auto) {
                Overlap::On => true,
                Overlap::Off => false,
                Overlap::Auto => bx * by >= OVERLAP_MIN_CELLS,
            },
            trace: a.trace,
            device_per_rank,
            timeout: Duration::from_secs(a.timeout),
            check: a.check,
            json: a.json,
            ranks_as: a.ranks_as,
            device,
            placement,
            corrupt: a.corrupt,
        })
    }
}

/// One rank's solver for one trigger. Iteration `i` reads grid `i % 2` and writes the other.
pub trait Solver {
    /// Runs iterations `first .. first + count`; returns when they are complete on this rank
    /// (nothing of them left on a stream, every request released).
    fn run(&mut self, comm: &mut Comm, first: u64, count: u64) -> Result<()>;
    /// The owned cells (row by row) after `done` iterations.
    fn owned(&self, done: u64) -> Result<Vec<f64>>;
}

/// Warm-up, then the timed iterations between two barriers: returns the time per iteration
/// (wall time of the timed iterations / their number) and the final block.
pub fn drive(comm: &mut Comm, s: &mut dyn Solver, cfg: &Config) -> Result<(f64, Vec<f64>)> {
    // Every rank has set up (allocated and registered its memory) before any stream waits
    // for a peer: CUDA calls that synchronise implicitly must not wait behind such a wait.
    comm.barrier()?;
    s.run(comm, 0, cfg.warmup)?;
    comm.barrier()?;
    let threads = (cfg.trace && comm.rank() == 0).then(profile::ThreadCpu::now);
    let t0 = Instant::now();
    s.run(comm, cfg.warmup, cfg.iters)?;
    comm.barrier()?;
    let us = t0.elapsed().as_secs_f64() * 1e6 / cfg.iters as f64;
    if let Some(t) = threads {
        eprintln!("{}", census(cfg));
        eprintln!("{}", t.since());
    }
    Ok((us, s.owned(cfg.warmup + cfg.iters)?))
}

/// `--trace`: the threads a run starts in this process, and what they do while waiting.
fn census(cfg: &Config) -> String {
    let local = match cfg.ranks_as {
        RanksAs::Threads => cfg.ranks,
        _ => 1,
    };
    let engines = match () {
        _ if common::device::is_rdma(&cfg.device) => 0,
        _ if cfg.device_per_rank => cfg.ranks,
        _ => 1,
    };
    let waits = match cfg.trigger {
        Trigger::Host => "each spins in cuStreamSynchronize and in its CPU wait for the halos",
        Trigger::Stream => "each spins in its run-ahead wait once the stream is full",
        _ => "each blocks in cuStreamSynchronize while its persistent kernel runs",
    };
    let queues = std::env::var(gdasync::gdsync::cuda::MAX_CONNECTIONS_VAR).unwrap_or_default();
    format!(
        "trace process: {local} rank thread(s) ({waits}); {engines} soft-device engine(s), progress {}; {} cores; {} GPU(s) used; CUDA_DEVICE_MAX_CONNECTIONS {queues}",
        progress_label(cfg).unwrap_or_else(|| "by the HCA".into()),
        cores(),
        cfg.placement.as_ref().map_or(0, |p| p.used(0..local).len()),
    )
}

/// Rank 0 receives every block over the communicator and returns the global grid (owned
/// cells, `gx × gy`); the other ranks send theirs and return `None`.
fn gather(comm: &mut Comm, cfg: &Config, lay: &Layout, block: &[f64]) -> Result<Option<Vec<f64>>> {
    if comm.rank() != 0 {
        let mut bytes = grid::to_bytes(block);
        let mr = comm.register(&mut bytes)?;
        let r = comm.isend(mr.sge(..), 0)?;
        comm.wait(r)?;
        return Ok(None);
    }
    let mut global = vec![0.0; cfg.gx * cfg.gy];
    let mut place = |l: &Layout, b: &[f64]| {
        for (i, row) in b.chunks(l.ny).enumerate() {
            let at = (l.row0 + i) * cfg.gy + l.col0;
            global[at..at + l.ny].copy_from_slice(row);
        }
    };
    place(lay, block);
    for r in 1..comm.size() {
        let l = Layout::new(cfg.gx, cfg.gy, cfg.px, cfg.py, r);
        let mut bytes = vec![0u8; l.nx * l.ny * 8];
        let mr = comm.register(&mut bytes)?;
        let req = comm.irecv(mr.sge(..), r)?;
        let n = comm.wait(req)? as usize;
        if n != l.nx * l.ny * 8 {
            bail!(
                "rank {r} sent {n} bytes for its block, expected {}",
                l.nx * l.ny * 8
            );
        }
        let mut b = vec![0u8; n];
        mr.read_at(0, &mut b);
        place(&l, &grid::from_bytes(&b));
    }
    Ok(Some(global))
}

/// How the result compares with the single-rank reference.
struct Check {
    max_diff: f64,
    mismatches: usize,
    first: Option<(usize, f64, f64)>,
}

fn compare(got: &[f64], want: &[f64]) -> Check {
    let mut c = Check {
        max_diff: 0.0,
        mismatches: 0,
        first: None,
    };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.to_bits() != w.to_bits() {
            c.mismatches += 1;
            c.first.get_or_insert((i, g, w));
            let d = (g - w).abs();
            // A NaN difference counts as infinitely large.
            c.max_diff = if d.is_nan() {
                f64::INFINITY
            } else {
                c.max_diff.max(d)
            };
        }
    }
    c
}

/// How halo messages in GPU memory reach the NIC ("staged (why)", "direct (why)"), where
/// that applies.
fn gpu_memory_label(cfg: &Config) -> Option<String> {
    cfg.gpu_memory
        .as_ref()
        .map(common::device::gpu_memory_phrase)
}

/// `--halo` as it applies: the GPU triggers' choice (the CPU trigger has no GPU halo
/// buffers).
fn halo_name(cfg: &Config) -> Option<String> {
    cfg.trigger.gpu().then(|| name(cfg.halo))
}

/// `--overlap` as it applies: only the host and stream triggers choose.
fn overlap_used(cfg: &Config) -> Option<bool> {
    matches!(cfg.trigger, Trigger::Host | Trigger::Stream).then_some(cfg.overlap)
}

/// Whether each rank has a device of its own (processes; thread ranks of the GPU triggers
/// unless `--shared-device`) or all share one (thread ranks otherwise; an RDMA device).
fn devices_label(cfg: &Config) -> &'static str {
    let own = cfg.device_per_rank
        || (cfg.ranks_as != RanksAs::Threads && !common::device::is_rdma(&cfg.device));
    if own {
        "one per rank"
    } else {
        "one for all ranks"
    }
}

/// How the soft device's engines progress (`null` on an RDMA device: its HCA does).
fn progress_label(cfg: &Config) -> Option<String> {
    (!common::device::is_rdma(&cfg.device)).then(|| gdasync::gdsync::progress_mode().to_string())
}

/// The run's description, printed before it starts (the JSON line carries the same).
fn print_header(cfg: &Config) {
    if cfg.json {
        return;
    }
    let (bx, by) = Layout::largest_block(cfg.gx, cfg.gy, cfg.px, cfg.py);
    let halo = halo_name(cfg).map_or(String::new(), |h| format!(", halo in {h} memory"));
    let overlap = overlap_used(cfg).map_or(String::new(), |o| {
        format!(", overlap {}", if o { "on" } else { "off" })
    });
    let gpus = gpus_label(cfg).map_or(String::new(), |g| format!(", GPUs {g}"));
    let staged = gpu_memory_label(cfg).map_or(String::new(), |g| format!(", GPU memory {g}"));
    outln!(
        "stencil2d: {} x {} grid, {} ranks ({} x {}, {}), device {} ({}), trigger {}{halo}{staged}{overlap}{gpus}, {} iterations (+{} warm-up), {} cores",
        cfg.gx,
        cfg.gy,
        cfg.ranks,
        cfg.px,
        cfg.py,
        name(cfg.ranks_as),
        cfg.device,
        devices_label(cfg),
        name(cfg.trigger),
        cfg.iters,
        cfg.warmup,
        cores()
    );
    outln!("subdomain per rank: {bx} x {by} (largest)");
}

/// The result: the time per iteration and the check (a JSON line with `--json`).
fn report(cfg: &Config, us: f64, check: Option<&Check>) {
    if cfg.json {
        let (bx, by) = Layout::largest_block(cfg.gx, cfg.gy, cfg.px, cfg.py);
        let o = Object::new()
            .set("n", cfg.gx)
            .set("ny", cfg.gy)
            .set("ranks", cfg.ranks)
            .set("decomposition", format!("{}x{}", cfg.px, cfg.py))
            .set("ranks_as", name(cfg.ranks_as))
            .set("trigger", name(cfg.trigger))
            .set("halo", halo_name(cfg))
            .set("gpu_memory", gpu_memory_label(cfg))
            .set("overlap", overlap_used(cfg))
            .set("iters", cfg.iters)
            .set("warmup", cfg.warmup)
            .set("subdomain", format!("{bx}x{by}"))
            .set("device", cfg.device.to_string())
            .set("devices", devices_label(cfg))
            .set("gpus", gpus_label(cfg))
            .set("cuda_queues", cuda_queues(cfg))
            .set("cores", cores())
            .set("progress", progress_label(cfg))
            .set("us_per_iter", Value::Fixed(us, 3))
            .set("timing", "total/iters")
            .set(
                "max_diff",
                check.map(|c| match c.max_diff {
                    d if d.is_finite() => Value::Raw(format!("{d:e}")),
                    _ => Value::Null,
                }),
            )
            .set("mismatches", check.map(|c| c.mismatches));
        outln!("{o}");
        return;
    }
    outln!(
        "time per iteration: {us:.3} us (wall time of the timed iterations / {}, on rank 0 between barriers)",
        cfg.iters
    );
    let Some(c) = check else {
        return;
    };
    match c.first {
        None => outln!("check: bit-exact against a single-rank run (max |diff| 0)"),
        Some((i, g, w)) => outln!(
            "check: FAILED: {} of {} values differ from the single-rank run, max |diff| {:e} (first at row {}, column {}: {g:e}, want {w:e})",
            c.mismatches,
            cfg.gx * cfg.gy,
            c.max_diff,
            i / cfg.gy,
            i % cfg.gy
        ),
    }
}

/// One rank, whatever runs it: solve, time, gather and check, report (rank 0).
fn rank_main(
    cfg: &Config,
    boot: Box<dyn Bootstrap>,
    dev: &Device,
    kernels: Option<&gpu::Kernels>,
) -> Result<()> {
    let mut comm = Comm::new(boot, dev)?;
    comm.set_timeout(cfg.timeout);
    progress::started();
    let lay = Layout::new(cfg.gx, cfg.gy, cfg.px, cfg.py, comm.rank());
    let (us, mut block) = match cfg.trigger {
        Trigger::Cpu => cpu::solve(&mut comm, &lay, cfg)?,
        Trigger::Host | Trigger::Stream | Trigger::Kernel => {
            gpu::solve(&mut comm, &lay, cfg, kernels.context("GPU kernels")?)?
        }
    };
    if cfg.corrupt && comm.rank() + 1 == comm.size() {
        let last = block.len() - 1;
        block[last] = f64::from_bits(block[last].to_bits() ^ 1);
    }
    let global = if cfg.check {
        gather(&mut comm, cfg, &lay, &block)?
    } else {
        None
    };
    let rank = comm.rank();
    comm.finalize()?;
    if rank != 0 {
        return Ok(());
    }
    let check = match global {
        Some(got) => {
            let total = cfg.warmup + cfg.iters;
            // The GPU kernels do the CPU's arithmetic in the CPU's order (no fused multiply-add),
            // so every trigger is checked against the CPU's single-rank run.
            let want = cpu::reference(cfg.gx, cfg.gy, total);
            let c = compare(&got, &want);
            if c.mismatches > 0 && cfg.trigger.gpu() {
                // Tell the exchange's faults from the GPU's.
                let k = kernels.context("GPU kernels")?;
                let one = gpu::reference(k, gpu_of(cfg, 0), cfg.gx, cfg.gy, total)?;
                let verdict = match compare(&one, &want).mismatches {
                    0 => "matches it: the exchange is at fault",
                    _ => "differs from it too: the kernels or the GPU are at fault",
                };
                eprintln!("check: a single-rank run on the GPU {verdict}");
            }
            Some(c)
        }
        None => None,
    };
    report(cfg, us, check.as_ref());
    if let Some(c) = check.filter(|c| c.mismatches > 0) {
        bail!(
            "check failed: {} values differ (max |diff| {:e})",
            c.mismatches,
            c.max_diff
        );
    }
    Ok(())
}

/// The GPU kernels for `ranks` (the ranks this process runs), if the trigger uses the GPU.
fn kernels_for(
    cfg: &Config,
    ranks: impl IntoIterator<Item = usize>,
) -> Result<Option<gpu::Kernels>> {
    cfg.placement
        .as_ref()
        .map(|p| gpu::Kernels::compile(&p.used(ranks)))
        .transpose()
}

/// The GPU of rank `rank` (GPU triggers).
fn gpu_of(cfg: &Config, rank: usize) -> i32 {
    cfg.placement.as_ref().map_or(0, |p| p.ordinal(rank))
}

/// `--gpus` as it applies: the GPU of each rank (`null` for the CPU trigger).
fn gpus_label(cfg: &Config) -> Option<String> {
    cfg.placement.as_ref().map(|p| p.label(cfg.ranks))
}

/// The CUDA driver's hardware queues per GPU where GPUs are used (the stream trigger's time
/// depends on it), else `None`.
fn cuda_queues(cfg: &Config) -> Option<u32> {
    cfg.placement.as_ref()?;
    gdasync::gdsync::cuda::Cuda::get().ok().map(|c| c.queues())
}

fn threads(cfg: &Config) -> Result<()> {
    let shared = (!cfg.device_per_rank)
        .then(|| open(&cfg.device))
        .transpose()?;
    let kernels = Arc::new(kernels_for(cfg, 0..cfg.ranks)?);
    let handles: Vec<_> = ThreadBootstrap::group(cfg.ranks)
        .into_iter()
        .map(|b| {
            // A device of its own (an engine of its own, as a NIC per GPU), or the shared one.
            let dev = match &shared {
                Some(d) => d.clone(),
                None => open(&cfg.device)?,
            };
            let (cfg, kernels) = (cfg.clone(), kernels.clone());
            Ok(std::thread::spawn(move || {
                rank_main(&cfg, Box::new(b), &dev, (*kernels).as_ref())
            }))
        })
        .collect::<Result<_>>()?;
    // The first rank to fail ends the run (its peers may wait for it forever, as MPI ranks
    // would: returning ends the process and them), after a moment in which ranks that fail
    // with it (timeouts of one stall) add their errors: each says what its side waits for.
    let mut handles: Vec<Option<_>> = handles.into_iter().map(Some).collect();
    let mut failed: Vec<anyhow::Error> = Vec::new();
    let mut failed_at = None;
    // A run in which no rank moves for longer than mp's own timeouts ends with where each
    // rank is.
    let stall = cfg.timeout + progress::STALL_MARGIN;
    let (mut last, mut since) = (progress::snapshot(cfg.ranks), Instant::now());
    let mut shown = progress::Display::new(cfg.warmup + cfg.iters);
    let begun = Instant::now();
    while handles.iter().any(Option::is_some) {
        let now = progress::snapshot(cfg.ranks);
        shown.tick(cfg.ranks);
        if failed.is_empty()
            && progress::started_ranks() < cfg.ranks
            && begun.elapsed() > cfg.timeout
        {
            bail!(
                "start-up: {} of {} ranks connected within --timeout {} s",
                progress::started_ranks(),
                cfg.ranks,
                cfg.timeout.as_secs()
            );
        }
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > stall && progress::watched(&now) {
            bail!(
                "stalled: no rank moved for {} s\n{}",
                stall.as_secs(),
                progress::report(cfg.ranks)
            );
        }
        for (r, slot) in handles.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|h| h.is_finished()) {
                let res = slot
                    .take()
                    .unwrap()
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("rank {r} panicked")));
                if let Err(e) = res.with_context(|| format!("rank {r}")) {
                    failed.push(e);
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut failed = failed.into_iter();
    match failed.next() {
        None => Ok(()),
        Some(first) => Err(failed.fold(first, |acc, e| acc.context(format!("{e:#}")))),
    }
}

/// One process of `--ranks-as procs` (started by [`common::launch::run_local`]).
fn child(cfg: &Config) -> Result<()> {
    let info = JobInfo::from_env().context("--child is for the processes stencil2d starts")?;
    let rank = info.rank;
    let _shown = (rank == 0).then(|| progress::Shown::start(cfg.warmup + cfg.iters));
    let boot = TcpBootstrap::connect(&info, cfg.timeout).with_context(|| {
        format!(
            "rank {rank}: start-up (--timeout {} s)",
            cfg.timeout.as_secs()
        )
    })?;
    let kernels = kernels_for(cfg, [rank])?;
    rank_main(cfg, Box::new(boot), &open(&cfg.device)?, kernels.as_ref())
        .with_context(|| format!("rank {rank}"))
}

#[cfg(feature = "mpi")]
fn mpi(cfg: &Config) -> Result<()> {
    use gdasync::mp::bootstrap::MpiBootstrap;
    use gdasync::mp::mpi_crate as mpi;
    let universe = mpi::initialize().context("MPI is already initialised")?;
    let boot = MpiBootstrap::new(&universe);
    if boot.size() != cfg.ranks {
        bail!(
            "this MPI job has {} processes: run with --ranks {}",
            boot.size(),
            boot.size()
        );
    }
    let kernels = kernels_for(cfg, [boot.rank()])?;
    let _shown = (boot.rank() == 0).then(|| progress::Shown::start(cfg.warmup + cfg.iters));
    if boot.rank() == 0 {
        print_header(cfg);
    }
    rank_main(cfg, Box::new(boot), &open(&cfg.device)?, kernels.as_ref())
}

#[cfg(not(feature = "mpi"))]
fn mpi(_: &Config) -> Result<()> {
    bail!("--ranks-as mpi needs the mpi feature: cargo build --release -p gdasync-examples --features mpi --bin stencil2d, then mpirun -np R target/release/stencil2d --ranks-as mpi --ranks R")
}

fn run(args: &Args) -> Result<()> {
    let cfg = Config::new(args)?;
    if args.child {
        return child(&cfg);
    }
    if cfg.ranks_as != RanksAs::Mpi {
        print_header(&cfg);
    }
    match cfg.ranks_as {
        RanksAs::Threads => threads(&cfg),
        RanksAs::Procs => common::launch::run_local(cfg.ranks),
        RanksAs::Mpi => mpi(&cfg),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| run(&args))
}
