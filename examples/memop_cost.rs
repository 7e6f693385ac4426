//! What stream memory operations cost the GPU, timed with CUDA events: a list of writes or
//! satisfied waits between two kernels, and chains of kernels with and without lists between
//! them, queued ahead (the stream is held at a gate until all is enqueued) so that only the
//! GPU's time counts. These are the costs a stream-triggered iteration pays per list and per
//! operation (docs/benchmarks.md).
//!
//! ```text
//! cargo run --release --bin memop_cost
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{Context, Result};
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
    #[command(flatten)]
    tool: ToolArgs,
}

const EMPTY: &str = "extern \"C\" __global__ void empty(unsigned long long x) {}";
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
    args.tool.run(measure)
}

fn measure() -> Result<()> {
    Cuda::get()
        .and_then(|c| c.gpu(0).map(|_| ()))
        .context("memop_cost needs a CUDA GPU")?;
    let m = Module::compile(0, EMPTY)?;
    let f = m.function("empty")?;
    let s = CudaStream::new(0)?;
    let w = SignalWords::new(GATE + 1);
    let ev: Vec<CudaEvent> = (0..3)
        .map(|_| CudaEvent::new(0))
        .collect::<Result<_, _>>()?;
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
            let (mut a, mut b) = (vec![], vec![]);
            for i in 0..300u32 {
                launch(&f, &s)?;
                ev[0].record(&s)?;
                if n > 0 {
                    s.submit(list(&w, kind, n, i))?;
                }
                ev[1].record(&s)?;
                launch(&f, &s)?;
                ev[2].record(&s)?;
                a.push(us(&ev[0], &ev[1])?);
                b.push(us(&ev[1], &ev[2])?);
            }
            outln!("{kind:>6} {n:>3} {:>10.2} {:>12.2}", median(a), median(b));
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
    Ok(())
}
