//! The stream trigger's round trip without a NIC: two streams pass a counter back and forth
//! through pinned host words, each direction carried either by the streams themselves (one
//! stream stores into the word the other waits on, as `pingpong --raw` does) or by a CPU
//! thread that copies each stream's word to the other's (as the soft device's engine thread
//! carries a doorbell to a completion), with both streams on one GPU or on two. Where
//! `pingpong --trigger stream` costs more across two GPUs than on one while its `--raw` floor
//! does not, this says whether the difference lies in the GPUs seeing a CPU's stores and the
//! CPU seeing theirs, with no soft device in the loop (docs/benchmarks.md, "pingpong across
//! two GPUs").
//!
//! ```text
//! cargo run --release --bin stream_echo -- --iters 3000 --reps 3
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use common::out::outln;
use common::ToolArgs;
use gdasync::gdsync::cuda::{Cuda, CudaStream};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::ops::{Ops, WaitCond};
use gdasync::gdsync::SignalWords;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "stream_echo",
    version,
    about = "Two streams pass a counter back and forth, directly or through a CPU thread, on one GPU or two (needs a CUDA GPU)"
)]
struct Args {
    /// Round trips per run (the first tenth untimed).
    #[arg(long, default_value_t = 3000)]
    iters: u32,
    /// Runs per cell, alternating over the cells.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// What each stream's CPU thread polls to stay ahead: `progress`, a word its stream stores
    /// after each round trip's store, off the path (as pingpong's rank 0 does), or `waited`,
    /// the very word its stream waits on.
    #[arg(long, value_enum, default_value = "progress")]
    watch: Watch,
    /// Run both streams as host streams (CPU threads that execute the lists): no GPU needed,
    /// to check the loop itself.
    #[arg(long)]
    host_stream: bool,
    #[command(flatten)]
    tool: ToolArgs,
}

/// What the CPU threads that enqueue the lists poll.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Watch {
    Progress,
    Waited,
}

/// Who carries each direction of the round trip.
#[derive(Clone, Copy)]
struct Relay {
    name: &'static str,
    /// A to B through the CPU thread (else A's stream stores into B's word).
    a_to_b: bool,
    /// B to A through the CPU thread.
    b_to_a: bool,
    /// Stores each stream makes before the one that carries the counter (to words nobody
    /// waits on), as a NIC trigger's memory-operation list stores the message's marker and
    /// the doorbell record before the doorbell (each a stream write, which fences by itself).
    before: u32,
}

const RELAYS: [Relay; 6] = [
    Relay {
        name: "streams store directly (as --raw)",
        a_to_b: false,
        b_to_a: false,
        before: 0,
    },
    Relay {
        name: "CPU thread both ways (as the soft device)",
        a_to_b: true,
        b_to_a: true,
        before: 0,
    },
    Relay {
        name: "CPU thread A to B only",
        a_to_b: true,
        b_to_a: false,
        before: 0,
    },
    Relay {
        name: "CPU thread B to A only",
        a_to_b: false,
        b_to_a: true,
        before: 0,
    },
    Relay {
        name: "streams store directly, 2 stores before",
        a_to_b: false,
        b_to_a: false,
        before: 2,
    },
    Relay {
        name: "CPU thread both ways, 2 stores before",
        a_to_b: true,
        b_to_a: true,
        before: 2,
    },
];

/// The words, 128 bytes apart so that no two share a cache line: what A's stream stores
/// (relayed), what B waits on, what B stores (relayed), what A waits on.
const A_OUT: usize = 0;
const B_IN: usize = 16;
const B_OUT: usize = 32;
const A_IN: usize = 48;
/// The words that the stores before the counter's go to (A's, B's).
const A_BEFORE: usize = 64;
const B_BEFORE: usize = 80;
/// Round trips done, as each stream stores them for its CPU thread (`--watch progress`).
const A_PROGRESS: usize = 96;
const B_PROGRESS: usize = 112;
const WORDS: usize = 128;
/// How many round trips the CPU enqueues ahead of the streams.
const AHEAD: u32 = 32;
/// A run that makes no progress for this long has stalled.
const STALL: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| measure(&args))
}

/// Copies A's and B's words to their peers' as they change, until `stop`.
fn relay(w: &SignalWords, r: Relay, stop: &AtomicBool) {
    let (mut a, mut b) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        if r.a_to_b {
            let v = w.load32(A_OUT);
            if v != a {
                w.store32(B_IN, v);
                a = v;
            }
        }
        if r.b_to_a {
            let v = w.load32(B_OUT);
            if v != b {
                w.store32(A_IN, v);
                b = v;
            }
        }
        std::hint::spin_loop();
    }
}

/// One run: µs per half round trip over the timed round trips.
fn run(r: Relay, gpus: Option<(i32, i32)>, iters: u32, watch: Watch) -> Result<f64> {
    let w = SignalWords::new(WORDS);
    match gpus {
        Some((a, b)) => {
            let streams = (CudaStream::new(a)?, CudaStream::new(b)?);
            run_on(&w, r, &streams, iters, watch, |s| {
                Ok(s.synchronize_within(STALL)?)
            })
        }
        None => {
            let streams = (HostStream::new()?, HostStream::new()?);
            run_on(&w, r, &streams, iters, watch, |s| Ok(s.synchronize()?))
        }
    }
}

/// [`run`] on two executors (`sync` waits until one has run everything, or fails): a thread
/// per stream enqueues its lists, as pingpong's ranks do, and a relay thread where the CPU
/// carries a direction.
fn run_on<E: Executor + Sync>(
    w: &SignalWords,
    r: Relay,
    (sa, sb): &(E, E),
    iters: u32,
    watch: Watch,
    sync: impl Fn(&E) -> Result<()>,
) -> Result<f64> {
    let a_target = if r.a_to_b { A_OUT } else { B_IN };
    let b_target = if r.b_to_a { B_OUT } else { A_IN };
    let stop = AtomicBool::new(false);
    let progress = watch == Watch::Progress;
    std::thread::scope(|scope| -> Result<f64> {
        let relay_thread = (r.a_to_b || r.b_to_a).then(|| scope.spawn(|| relay(w, r, &stop)));
        let b = scope.spawn(move || {
            let watched = if progress { B_PROGRESS } else { B_IN };
            enqueue(sb, w, watched, iters, None, |i| {
                let mut l = w.wait32(B_IN, i, WaitCond::Geq);
                (0..r.before).for_each(|_| l.append(w.write32(B_BEFORE, i)));
                l.append(w.write32(b_target, i));
                if progress {
                    l.append(w.write32(B_PROGRESS, i));
                }
                l
            })
        });
        // A's progress for round trip i - 1 goes after its store for round trip i (off the
        // path, as pingpong's rank 0 places it); the last comes alone at the end.
        let watched = if progress { A_PROGRESS } else { A_IN };
        let tail = progress.then(|| w.write32(A_PROGRESS, iters));
        let timed = enqueue(sa, w, watched, iters, tail, |i| {
            let mut l = Ops::new();
            (0..r.before).for_each(|_| l.append(w.write32(A_BEFORE, i)));
            l.append(w.write32(a_target, i));
            if progress && i > 1 {
                l.append(w.write32(A_PROGRESS, i - 1));
            }
            l.append(w.wait32(A_IN, i, WaitCond::Geq));
            l
        });
        let b = b.join().map_err(|_| anyhow!("stream B's thread panicked"));
        stop.store(true, Ordering::Relaxed);
        if let Some(t) = relay_thread {
            t.join().map_err(|_| anyhow!("the relay thread panicked"))?;
        }
        let synced = sync(sa).and(sync(sb));
        let us = timed?;
        b??;
        synced?;
        Ok(us)
    })
}

/// Enqueues round trips 1..=iters on `s` (`list(i)`, then `tail`), at most [`AHEAD`] ahead
/// of word `watch`, which reaches i when the stream's round trip i is done; µs per half round
/// trip over the round trips after the first tenth, as this thread saw `watch` advance.
fn enqueue<E: Executor>(
    s: &E,
    w: &SignalWords,
    watch: usize,
    iters: u32,
    mut tail: Option<Ops>,
    list: impl Fn(u32) -> Ops,
) -> Result<f64> {
    let warm = iters / 10;
    let (mut queued, mut start, mut last) = (0u32, None, (0u32, Instant::now()));
    loop {
        let done = w.load32(watch);
        if done != last.0 {
            last = (done, Instant::now());
        }
        if done >= warm && start.is_none() {
            start = Some((done, Instant::now()));
        }
        if done >= iters {
            break;
        }
        if last.1.elapsed() > STALL {
            bail!("stalled at round trip {done} of {iters} (streams or relay not progressing)");
        }
        while queued < iters && queued < done + AHEAD {
            queued += 1;
            s.submit(list(queued))?;
        }
        if queued == iters {
            if let Some(t) = tail.take() {
                s.submit(t)?;
            }
        }
        std::hint::spin_loop();
    }
    let (from, t0) = start.context("no round trip was timed")?;
    let n = iters - from;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64 / 2.0)
}

fn measure(args: &Args) -> Result<()> {
    if args.iters < 10 || args.reps == 0 {
        bail!("--iters must be at least 10 and --reps at least 1");
    }
    let (pairs, queues) = if args.host_stream {
        (vec![None], "host streams".to_string())
    } else {
        let c = Cuda::get().context("stream_echo needs a CUDA GPU (or --host-stream)")?;
        let pairs = match c.gpus.len() {
            0 => bail!("stream_echo needs a CUDA GPU (none found; or --host-stream)"),
            1 => vec![Some((0, 0))],
            _ => vec![Some((0, 0)), Some((0, 1)), Some((1, 1))],
        };
        (pairs, format!("{} hardware queues", c.queues()))
    };
    let mut cells = vec![vec![Vec::new(); pairs.len()]; RELAYS.len()];
    for _ in 0..args.reps {
        for (ri, r) in RELAYS.iter().enumerate() {
            for (pi, &p) in pairs.iter().enumerate() {
                let us = run(*r, p, args.iters, args.watch)
                    .with_context(|| format!("{}, streams on {p:?}", r.name))?;
                cells[ri][pi].push(us);
            }
        }
    }
    outln!(
        "µs per half round trip, median [range] of {} runs of {} round trips; stream A on the first GPU, B on the second; {}; CPU threads poll {}",
        args.reps,
        args.iters,
        queues,
        match args.watch {
            Watch::Progress => "progress words",
            Watch::Waited => "the words the streams wait on",
        }
    );
    let mut head = format!("{:<44}", "who carries the counter");
    for p in &pairs {
        let name = p.map_or("host streams".into(), |(a, b)| format!("GPUs {a},{b}"));
        head += &format!("{name:>22}");
    }
    outln!("{head}");
    for (ri, r) in RELAYS.iter().enumerate() {
        let mut line = format!("{:<44}", r.name);
        for v in cells[ri].iter_mut() {
            // Median and range of the runs (--reps is at least 1).
            v.sort_by(f64::total_cmp);
            let (lo, mid, hi) = (v[0], v[v.len() / 2], v[v.len() - 1]);
            line += &format!("{:>22}", format!("{mid:.2} [{lo:.2}-{hi:.2}]"));
        }
        outln!("{line}");
    }
    Ok(())
}
