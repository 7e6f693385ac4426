//! `pingpong --explain`: what each rank of a GPU trigger runs per iteration, built by the
//! benchmark's own code on the soft device and printed instead of run (no GPU needed with
//! `--mem host`). For `--trigger stream`, the parts of each rank's list and the stream memory
//! operations they become; for `--trigger kernel`, the stores, fences, polls and descriptor
//! fetches of each rank's kernel, the descriptors' parts as `gdsync.cuh` runs them. An
//! unsignalled iteration is shown, then the signalled one (every `SIGNAL_EVERY`th), then the
//! average per iteration. The `shape:` lines are what `memop_cost --shape` times.

use super::gpu::{explain_ranks, kernel_descs, KernelDesc, StreamLoop, SIGNAL_EVERY};
use super::{Args, Op, Trigger};
use crate::common::name;
use crate::common::out::outln;
use anyhow::Result;
use gdasync::gdsync::cuda::{stream_memops, MARK_EVERY};
use gdasync::gdsync::kernel::{SendDesc, WaitDesc};
use gdasync::gdsync::ops::{Op as MemOp, Ops};
use gdasync::gdsync::SignalWords;

/// Prints the lists of `args`' trigger, op and `--raw`; with the default trigger (cpu),
/// those of every GPU trigger and op and their floors.
pub(crate) fn run(args: &Args) -> Result<()> {
    let combos: Vec<(Trigger, Op, bool)> = if args.trigger.gpu() {
        vec![(args.trigger, args.op, args.raw)]
    } else {
        let mut v = vec![];
        for t in [Trigger::Stream, Trigger::Kernel] {
            v.push((t, Op::Write, true));
            for op in [Op::Write, Op::WriteImm, Op::Send] {
                v.push((t, op, false));
            }
        }
        v
    };
    for (trigger, op, raw) in combos {
        let a = Args {
            trigger,
            op,
            raw,
            ..args.clone()
        };
        let what = format!(
            "--trigger {} --op {}{}",
            name(trigger),
            name(op),
            if raw { " --raw" } else { "" }
        );
        outln!("== {what} ({} B, ringers {:?})", a.sizes[0], a.ringers);
        match trigger {
            Trigger::Stream => explain_stream(&a)?,
            _ => explain_kernel(&a)?,
        }
    }
    Ok(())
}

/// Short names of op kinds, as `memop_cost --shape` reads them.
fn kind(op: &MemOp) -> String {
    match op {
        MemOp::Write32 { .. } => "w32".into(),
        MemOp::Write64 { .. } => "w64".into(),
        MemOp::Doorbell { .. } => "db".into(),
        MemOp::Barrier => "bar".into(),
        MemOp::Wait32 { .. } | MemOp::Wait64 { .. } => "wait".into(),
        #[allow(unreachable_patterns)]
        other => format!("{other:?}")
            .split([' ', '{', '('])
            .next()
            .unwrap_or("?")
            .into(),
    }
}

fn explain_stream(a: &Args) -> Result<()> {
    let size = a.sizes[0];
    let mut ranks = explain_ranks(a)?;
    let lp = StreamLoop {
        raw: a.raw,
        op: a.op,
        size,
        words: [ranks[0].recv_word(size), ranks[1].recv_word(size)],
        relay: None,
        progress: SignalWords::new(2),
    };
    for (rank, r) in ranks.iter_mut().enumerate() {
        let mut total = 0;
        // Lists 1..=16 (rank 0's list 0 has no answer to wait for yet).
        for i in 1..=SIGNAL_EVERY {
            lp.post_recvs(r, i, SIGNAL_EVERY + 64)?;
            let parts = lp.parts(r, rank, i, u64::MAX)?;
            let mut all = Ops::new();
            let show = i == 1 || i == SIGNAL_EVERY - 1;
            if show {
                let sig = if i == 1 { "unsignalled" } else { "signalled" };
                outln!("  rank {rank}, list {i} ({sig} send):");
            }
            for (part, ops) in parts {
                if show {
                    let kinds: Vec<String> = ops.as_slice().iter().map(kind).collect();
                    let late = match ops.deferred_len() {
                        0 => String::new(),
                        n => format!(" (the last {n} after what follows, before the next wait)"),
                    };
                    outln!("    {part:<14} {}{late}", kinds.join(" "));
                }
                all.append(ops);
            }
            let n = stream_memops(all.as_slice());
            total += n;
            if show {
                let shape: Vec<String> = shape_of(all.as_slice());
                outln!("    = {} ops, {n} stream memory operations", all.len());
                outln!("    shape: {}", shape.join(" "));
            }
        }
        outln!(
            "  rank {rank}: {:.3} stream memory operations per iteration (+ {:.3} of the stream's own progress write, one list in {MARK_EVERY})",
            total as f64 / SIGNAL_EVERY as f64,
            1.0 / MARK_EVERY as f64
        );
    }
    Ok(())
}

/// The op kinds a stream runs (a barrier right before a write dropped, as the stream drops it).
fn shape_of(ops: &[MemOp]) -> Vec<String> {
    let elided = |k: usize| {
        matches!(ops[k], MemOp::Barrier) && k + 1 < ops.len() && stream_memops(&ops[k..k + 2]) == 1
    };
    (0..ops.len())
        .filter(|&k| !elided(k))
        .map(|k| kind(&ops[k]))
        .collect()
}

/// The steps `gds_send` runs for a send descriptor.
fn send_steps(d: &SendDesc) -> Vec<&'static str> {
    let mut s = vec!["fence.sys"];
    if d.dbrec != 0 {
        s.extend(["st dbrec", "fence.sys"]);
    }
    s.push(if d.dbrec != 0 {
        "st doorbell"
    } else {
        "st proxy-request"
    });
    if d.rung != 0 {
        s.push("st.release.sys rung-to");
    }
    s
}

/// The steps `gds_wait` runs for a wait descriptor.
fn wait_steps(d: &WaitDesc) -> Vec<&'static str> {
    let mut s = vec!["poll ld.acquire.sys cqe"];
    for (addr, what) in [
        (d.ci_rec, "st cq-ci"),
        (d.retired, "st retired"),
        (d.ring_retired, "st ring-retired"),
    ] {
        if addr != 0 {
            s.push(what);
        }
    }
    s
}

/// The steps of `pp` (kernels.cu) for rank `rank`, iteration `i`, in its order: marker,
/// send, waits and the timestamp, each descriptor's fetch listed before it (`pp`'s warp
/// fetches most of them an iteration early, while the peer works, several at once where
/// several come together). Keep in step with `pp`.
fn kernel_steps(
    a: &Args,
    r: &mut super::gpu::Rank,
    rank: usize,
    i: u64,
) -> Result<Vec<(String, Vec<&'static str>)>> {
    let mut steps: Vec<(String, Vec<&'static str>)> = vec![];
    let marker_wait = (
        "marker wait".to_string(),
        vec!["poll ld.acquire.sys marker"],
    );
    if a.raw {
        if rank == 1 {
            steps.push(marker_wait.clone());
        }
        steps.push((
            "marker to peer".into(),
            vec!["fence.sys", "st marker", "fence.sys"],
        ));
        if rank == 0 {
            steps.push(marker_wait);
            steps.push(("timestamp".into(), vec!["st time"]));
        }
        return Ok(steps);
    }
    let descs = kernel_descs(r, a.op, a.sizes[0], rank, i)?;
    let fetch = (
        "descriptor fetch".to_string(),
        // The warp's fetch (gds_ring_fetch_warp); entries fetched together share one.
        vec![
            "poll seq (lane 0)",
            "fence.gpu",
            "ld.cv 16 B in 5 lanes, at once",
            "shfl",
            "fence.gpu",
            "st consumed",
        ],
    );
    let mut waits_done = false;
    for (part, d) in descs {
        steps.push(fetch.clone());
        match d {
            KernelDesc::Send(ops) => {
                if rank == 1 && a.op == Op::Write {
                    steps.insert(steps.len() - 1, marker_wait.clone());
                }
                steps.push(("marker".into(), vec!["st marker"]));
                steps.push((part.into(), send_steps(&SendDesc::from_ops(&ops)?)));
            }
            KernelDesc::Wait(ops) => {
                steps.push((part.into(), wait_steps(&WaitDesc::from_ops(&ops)?)));
                waits_done |= part == "receive wait";
            }
        }
    }
    if rank == 0 {
        if !waits_done {
            steps.push(marker_wait);
        }
        steps.push(("timestamp".into(), vec!["st time"]));
    }
    Ok(steps)
}

fn explain_kernel(a: &Args) -> Result<()> {
    let mut ranks = explain_ranks(a)?;
    let lp = StreamLoop {
        raw: a.raw,
        op: a.op,
        size: a.sizes[0],
        words: [0, 0],
        relay: None,
        progress: SignalWords::new(1),
    };
    for (rank, r) in ranks.iter_mut().enumerate() {
        let (mut fences, mut stores, mut polls) = (0, 0, 0);
        for i in 0..SIGNAL_EVERY {
            lp.post_recvs(r, i, SIGNAL_EVERY + 64)?;
            let steps = kernel_steps(a, r, rank, i)?;
            let show = i == 0 || i == SIGNAL_EVERY - 1;
            if show {
                let sig = if i == 0 { "unsignalled" } else { "signalled" };
                outln!("  rank {rank}, iteration {i} ({sig} send), one thread:");
            }
            for (part, s) in &steps {
                if show {
                    outln!("    {part:<16} {}", s.join("; "));
                }
                for step in s {
                    if *step == "fence.sys" || step.contains("release.sys") {
                        fences += 1;
                    }
                    if step.starts_with("st") {
                        stores += 1;
                    }
                    if step.starts_with("poll") {
                        polls += 1;
                    }
                }
            }
        }
        let per = |n: u32| n as f64 / SIGNAL_EVERY as f64;
        outln!(
            "  rank {rank} per iteration: {:.3} system-scope orderings (fences and release stores), {:.3} stores, {:.3} polls",
            per(fences),
            per(stores),
            per(polls)
        );
    }
    Ok(())
}
