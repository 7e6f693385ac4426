//! What stream memory operations cost the GPU, timed with CUDA events: a list of writes or
//! satisfied waits between two kernels, and chains of kernels with and without lists between
//! them, queued ahead (the stream is held at a gate until all is enqueued) so that only the
//! GPU's time counts. These are the costs a stream-triggered iteration pays per list and per
//! operation (docs/benchmarks.md). Then the step sequences of the pingpong kernels (the raw
//! floor's marker store, a send as `gds_send` rings it with and without "rung to", a
//! satisfied poll, a completion wait that retires), timed in a kernel with the GPU's clock.
//!
//! `--shape` times lists of the shapes `pingpong --explain` prints instead (`w32`, `w64`,
//! `db`: writes; `wait`: a satisfied wait; `bar`: a system barrier), each between two kernels.
//!
//! ```text
//! cargo run --release --bin memop_cost
//! cargo run --release --bin memop_cost -- --shape "w32 wait w64" --shape "w32 w32 db wait w64"
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::out::outln;
use common::ToolArgs;
use gdasync::gdsync::cuda::{Cuda, CudaEvent, CudaStream, Function, Module};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::ops::{Ops, WaitCond};
use gdasync::gdsync::SignalWords;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "memop_cost",
    version,
    about = "What stream memory operations cost the GPU, timed with CUDA events (needs a CUDA GPU)"
)]
struct Args {
    /// Time a list of this shape (as `pingpong --explain` prints: w32 w64 db wait bar),
    /// instead of the default tables; may be given several times.
    #[arg(long)]
    shape: Vec<String>,
    #[command(flatten)]
    tool: ToolArgs,
}

const EMPTY: &str = "extern \"C\" __global__ void empty(unsigned long long x) {}";

/// The pingpong kernels' step sequences (kernels.cu, gdsync.cuh), `n` rounds of one `kind`,
/// on pinned words at `w` (0..64 stored, 64 polled: always satisfied); the GPU's clock for all
/// rounds goes to `out`.
const SEQ: &str = include_str!("memop_cost.cu");
/// The sequences `SEQ` times, by kind.
const SEQS: [&str; 19] = [
    "raw marker to peer: fence.sys; st; fence.sys",
    "marker + send: st; fence.sys; st dbrec; fence.sys; st doorbell",
    "marker + send + rung-to: ... ; st.release.sys rung-to",
    "satisfied poll: ld.acquire.sys",
    "completion wait: ld.acquire.sys; st cq-ci; st retired",
    "descriptor fetch (gds_ring_fetch): ld seq; fence; 5 x ld.cv 16 B; fence; st consumed",
    "two descriptors in one gds_ring_fetch_n",
    "three descriptors in one gds_ring_fetch_n",
    "one ld.cv of 16 B",
    "five ld.cv of 16 B, issued together",
    "five ld.relaxed.sys of 8 B",
    "five lanes of a warp, one ld.cv of 16 B each",
    "one descriptor fetched by a warp (gds_ring_fetch_warp)",
    "two descriptors fetched by a warp (gds_ring_fetch_warp)",
    "marker + send as mp posts it (gds_qp_post_send: WQE composed, stored, rung)",
    "seven more stores, then marker + send",
    "completion wait + marker + send (a pp rank's answer, without its descriptor fetches)",
    "poll + 4 stores + marker + gds_qp_post_send (an mp channel's answer)",
    "marker + send as mp posts it, on a ring of 128 WQEBBs",
];
/// Signal words: 0..8 written by the lists, 8 waited on (always satisfied), 9 the gate.
const WAITED: usize = 8;
const GATE: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn launch(f: &Function, s: &CudaStream) -> Result<()> {
    let x = 0u64;
    // SAFETY: the kernel takes one u64 by value (copied at launch) and touches no memory.
    unsafe { f.launch_builder(s).arg(&x).launch(16, 256)? };
    Ok(())
}

/// `n` operations of one kind, as one list.
fn list(w: &SignalWords, kind: &str, n: usize, v: u32) -> Ops {
    let mut ops = Ops::new();
    for k in 0..n {
        ops.append(match kind {
            "write" => w.write32(k % WAITED, v),
            _ => w.wait32(WAITED, 0, WaitCond::Geq),
        });
    }
    ops
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| measure(&args.shape))
}

/// A list of the shape `shape` (`w32 w64 db wait bar`): writes to words 0..8, satisfied
/// waits on word [`WAITED`].
fn shaped(w: &SignalWords, shape: &str, v: u32) -> Result<Ops> {
    let mut ops = Ops::new();
    for (k, tok) in shape.split_whitespace().enumerate() {
        ops.append(match tok {
            "w32" => w.write32(k % WAITED, v),
            "w64" | "db" => w.write64(k % WAITED, v as u64),
            "wait" => w.wait32(WAITED, 0, WaitCond::Geq),
            "bar" => Ops::barrier(),
            other => bail!("--shape: unknown operation {other:?} (w32 w64 db wait bar)"),
        });
    }
    Ok(ops)
}

/// GPU µs of a list between two kernels, and of the kernel after it (medians of 300).
fn time_list(
    f: &Function,
    s: &CudaStream,
    ev: &[CudaEvent],
    mut list: impl FnMut(u32) -> Result<Option<Ops>>,
) -> Result<(f64, f64)> {
    let us = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> { Ok(b.since(a)?.as_secs_f64() * 1e6) };
    let (mut a, mut b) = (vec![], vec![]);
    for i in 0..300u32 {
        launch(f, s)?;
        ev[0].record(s)?;
        if let Some(ops) = list(i)? {
            s.submit(ops)?;
        }
        ev[1].record(s)?;
        launch(f, s)?;
        ev[2].record(s)?;
        a.push(us(&ev[0], &ev[1])?);
        b.push(us(&ev[1], &ev[2])?);
    }
    Ok((median(a), median(b)))
}

/// The lists of `--shape`.
fn shapes(shapes: &[String]) -> Result<()> {
    let m = Module::compile(0, EMPTY)?;
    let f = m.function("empty")?;
    let s = CudaStream::new(0)?;
    let w = SignalWords::new(GATE + 1);
    let ev = events()?;
    outln!("GPU µs: list = kernel, event, [list], event, kernel, event (median of 300);");
    outln!("in a chain = {CHAIN} lists back to back behind a gate, per list (median of 20)");
    outln!(
        "{:>10} {:>12} {:>11}  shape",
        "list",
        "next kernel",
        "in a chain"
    );
    for shape in shapes {
        shaped(&w, shape, 0)?;
        let (a, b) = time_list(&f, &s, &ev, |i| shaped(&w, shape, i).map(Some))?;
        let c = time_chain(&s, &w, &ev, shape)?;
        outln!("{a:>10.2} {b:>12.2} {c:>11.2}  {shape}");
    }
    s.synchronize()?;
    Ok(())
}

/// Lists per chain: as a stream-triggered loop runs them, one after another (few enough that
/// the stream's bound on queued operations is never reached behind the gate).
const CHAIN: usize = 32;

/// GPU µs per list of `shape` in chains of [`CHAIN`] queued behind a gate (median of 20).
fn time_chain(s: &CudaStream, w: &SignalWords, ev: &[CudaEvent], shape: &str) -> Result<f64> {
    let mut v = vec![];
    for i in 0..20u32 {
        w.store32(GATE, 0);
        s.submit(w.wait32(GATE, 1, WaitCond::Geq))?;
        ev[0].record(s)?;
        for _ in 0..CHAIN {
            s.submit(shaped(w, shape, i)?)?;
        }
        ev[1].record(s)?;
        w.store32(GATE, 1);
        v.push(ev[1].since(&ev[0])?.as_secs_f64() * 1e6 / CHAIN as f64);
    }
    Ok(median(v))
}

fn events() -> Result<Vec<CudaEvent>> {
    Ok((0..3)
        .map(|_| CudaEvent::new(0))
        .collect::<Result<_, _>>()?)
}

/// The kernels' step sequences ([`SEQ`]): ns per round, median of 20 launches of 1000 rounds.
fn kernel_steps() -> Result<()> {
    let m = Module::compile(0, SEQ)?;
    let f = m.function("seq")?;
    let s = CudaStream::new(0)?;
    // Words 0..8 stored, 8 polled; a descriptor ring's entries from byte 256 (word 32, 80
    // bytes each) with their sequence numbers filled, its consumed counter at byte 512; a
    // QP's host copies from byte 576, more stored words from 600, a send ring from 768 (from
    // 1280, 8 KiB, for the ring of 128 WQEBBs).
    let w = SignalWords::new(1200);
    for k in 0..3 {
        w.store64(32 + 10 * k, k as u64 + 1);
    }
    let out = SignalWords::new(1);
    outln!("\npingpong kernel steps on pinned host words: GPU ns per round (median of 20 x 1000)");
    for (kind, what) in SEQS.iter().enumerate() {
        let mut v = vec![];
        for _ in 0..20 {
            let (k, n, wa, oa) = (kind as i32, 1000u64, w.addr(0), out.addr(0));
            let mut l = f.launch_builder(&s);
            l.arg(&k).arg(&n).arg(&wa).arg(&oa);
            // SAFETY: the parameters match `seq`; the words outlive the launch (synchronised below).
            unsafe { l.launch(1, 32)? };
            s.synchronize()?;
            v.push(out.load64(0) as f64 / 1000.0);
        }
        outln!("{:>8.0}  {what}", median(v));
    }
    Ok(())
}

fn measure(shape: &[String]) -> Result<()> {
    Cuda::get()
        .and_then(|c| c.gpu(0).map(|_| ()))
        .context("memop_cost needs a CUDA GPU")?;
    if !shape.is_empty() {
        return shapes(shape);
    }
    let m = Module::compile(0, EMPTY)?;
    let f = m.function("empty")?;
    let s = CudaStream::new(0)?;
    let w = SignalWords::new(GATE + 1);
    let ev = events()?;
    let us = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> { Ok(b.since(a)?.as_secs_f64() * 1e6) };
    outln!("GPU µs (median of 300): kernel, event, [list of n ops], event, kernel, event");
    outln!(
        "{:>6} {:>3} {:>10} {:>12}",
        "ops",
        "n",
        "list",
        "next kernel"
    );
    for kind in ["write", "wait"] {
        for n in [0usize, 1, 2, 4, 8] {
            let (a, b) = time_list(&f, &s, &ev, |i| Ok((n > 0).then(|| list(&w, kind, n, i))))?;
            outln!("{kind:>6} {n:>3} {a:>10.2} {b:>12.2}");
        }
    }
    outln!("\nchains of 50 steps queued behind a gate: GPU µs per step (median of 20)");
    for writes in [0usize, 1, 3, 6] {
        let mut v = vec![];
        for i in 0..20u32 {
            w.store32(GATE, 0);
            s.submit(w.wait32(GATE, 1, WaitCond::Geq))?;
            ev[0].record(&s)?;
            for _ in 0..50 {
                launch(&f, &s)?;
                if writes > 0 {
                    s.submit(list(&w, "write", writes, i))?;
                }
            }
            ev[1].record(&s)?;
            w.store32(GATE, 1);
            v.push(us(&ev[0], &ev[1])? / 50.0);
        }
        let what = match writes {
            0 => "kernel".to_string(),
            n => format!("kernel + list of {n} writes"),
        };
        outln!("{what:>28} {:>6.2}", median(v));
    }
    s.synchronize()?;
    kernel_steps()
}
