//! The GPU triggers of the bandwidth example.
//!
//! - `stream`: the CPU prepares and commits the WQEs of one chunk (a quarter of the window),
//!   and hands the stream one op list: wait for the completion of the chunk a window back,
//!   then ring the chunk's doorbells. So the stream rings every doorbell and waits for every
//!   completion, with at most a window of messages in flight; the CPU never polls rank 0.
//! - `kernel`: one thread of a persistent kernel drives rank 0's QP ([`Qp::into_device`],
//!   `bandwidth.cu`). For sends, the CPU keeps rank 1's receives posted and tells the kernel
//!   how many through a credit word. Staged GPU payloads take `bw_staged` instead
//!   (`kstaged.rs`).

use super::{exit_now, Link, Measured, Op, Plan, Responder, Stall, TIMEOUT};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, Function, Module};
use gdasync::gdsync::exec::{Executor, HostStream, OpBatch};
use gdasync::gdsync::kernel::{code, DeviceQp};
use gdasync::gdsync::ops::Ops;
use gdasync::gdsync::{Error, MemoryRegion, SignalWords};
use std::collections::VecDeque;
use std::time::Instant;

pub(crate) const KERNEL: &str = include_str!("bandwidth.cu");
/// How long one wait in the kernel may last (ns).
pub(crate) const KERNEL_WAIT_NS: u64 = 10_000_000_000;
/// The result words of the kernel (`BW_*` in bandwidth.cu).
pub(crate) const DONE: usize = 0;
pub(crate) const RC: usize = 1;
const T0: usize = 2;
const T1: usize = 3;
pub(crate) const SENT: usize = 4;
const CREDIT: usize = 5;

// ---------------------------------------------------------------------------- stream

/// The stream and the word its waits advance: chunks known complete since the start.
struct StreamRun<E> {
    stream: E,
    progress: SignalWords,
    /// Chunks enqueued since the start.
    chunks: u64,
}

/// `n` messages rung by the stream, a window in flight; returns once all completed.
fn stream_phase<E: Executor>(
    link: &mut Link,
    plan: &Plan,
    s: &mut StreamRun<E>,
    size: usize,
    n: u64,
) -> Result<()> {
    let depth = (plan.window / plan.chunk).max(1);
    // The wait op lists of the chunks rung and not yet waited for, oldest first.
    let mut waits: VecDeque<Ops> = VecDeque::new();
    let mut posted = 0u64;
    while posted < n {
        let batch = OpBatch::new();
        if waits.len() == depth {
            batch.submit(waits.pop_front().unwrap())?;
        }
        let end = (posted + plan.chunk as u64).min(n);
        let mut signalled = None;
        for i in posted..end {
            if plan.op == Op::Send {
                // Posted before the stream can ring this send.
                link.rx.post(link.sent + 1, size, true)?;
            }
            let sig = plan.signalled(i, n);
            let wr = link.wr(plan.op, size, sig);
            let p = link.prepare(&wr)?;
            let (t, ops) = link.q0.commit(p).map_err(Error::from)?;
            batch.submit(ops)?;
            link.sent += 1;
            if sig {
                signalled = Some(t);
            }
        }
        let t = signalled.context("a chunk without a signalled send")?;
        let mut wait = link.q0.send_wait_ops(&t)?;
        s.chunks += 1;
        wait.append(s.progress.write64(0, s.chunks));
        waits.push_back(wait);
        batch.flush(&s.stream)?;
        posted = end;
    }
    let batch = OpBatch::new();
    for w in waits {
        batch.submit(w)?;
    }
    batch.flush(&s.stream)?;
    let mut stall = Stall::new();
    loop {
        let done = s.progress.load64(0);
        if done == s.chunks {
            break;
        }
        stall.check(done, "the stream's waits for completions")?;
        std::thread::yield_now();
    }
    link.scq0.check().context("a send failed")?;
    Ok(())
}

pub(crate) fn stream_run(link: Link, plan: &Plan, out: &mut dyn FnMut(Measured)) -> Result<()> {
    if plan.host_stream {
        return run_on(HostStream::with_timeout(TIMEOUT)?, link, plan, out);
    }
    run_on(CudaStream::new(plan.gpu(0))?, link, plan, out)
}

/// The stream trigger on `stream` (a CUDA stream, or a host stream to test the loop where
/// there is no GPU).
fn run_on<E: Executor>(
    stream: E,
    mut link: Link,
    plan: &Plan,
    out: &mut dyn FnMut(Measured),
) -> Result<()> {
    let mut s = StreamRun {
        stream,
        progress: SignalWords::new(1),
        chunks: 0,
    };
    for &size in &plan.sizes {
        let (warmup, iters) = (plan.warmup(size), plan.iters(size));
        // Once the stream has work, a failure ends the process at once (see exit_now).
        let seconds = (|| -> Result<f64> {
            stream_phase(&mut link, plan, &mut s, size, warmup)?;
            let start = Instant::now();
            stream_phase(&mut link, plan, &mut s, size, iters)?;
            Ok(start.elapsed().as_secs_f64())
        })()
        .unwrap_or_else(|e| exit_now(e.context(format!("--trigger stream, {size} B"))));
        out(Measured {
            size,
            iters,
            warmup,
            seconds,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------- kernel

/// What a kernel return code means.
pub(crate) fn describe(rc: i32) -> String {
    match rc {
        code::TIMEOUT => format!(
            "a wait timed out after {} s (no completion, or no receive credit)",
            KERNEL_WAIT_NS / 1_000_000_000
        ),
        code::INVALID => "invalid arguments or QP descriptor".into(),
        code::FULL => "the send ring was full".into(),
        _ => match code::syndrome(rc) {
            Some(s) => format!("an error completion ({s:?})"),
            None => format!("code {rc:#x}"),
        },
    }
}

/// The kernel, its QP and the words it reports in.
struct KernelRun {
    f: Function,
    stream: CudaStream,
    dq: DeviceQp,
    words: SignalWords,
}

pub(crate) fn kernel_run(link: Link, plan: &Plan, out: &mut dyn FnMut(Measured)) -> Result<()> {
    let module =
        Module::compile(plan.gpu(0), KERNEL).context("compile the bandwidth kernel with NVRTC")?;
    let Link {
        q0,
        local,
        mut rx,
        _devs,
        ..
    } = link;
    let dq = q0.into_device()?;
    if !dq.gpu_mapped() {
        bail!("rank 0's rings are not reachable from the GPU (mapping pinned host memory failed)");
    }
    let k = KernelRun {
        f: module.function("bw")?,
        stream: CudaStream::new(plan.gpu(0))?,
        dq,
        words: SignalWords::new(CREDIT + 1),
    };
    for &size in &plan.sizes {
        // Once the kernel runs, a failure ends the process at once (see exit_now).
        let m = kernel_size(&k, &local, &mut rx, plan, size)
            .unwrap_or_else(|e| exit_now(e.context(format!("--trigger kernel, {size} B"))));
        out(m);
    }
    Ok(())
}

/// One launch: the warm-up and the timed messages of one size.
fn kernel_size(
    k: &KernelRun,
    local: &MemoryRegion,
    rx: &mut Responder,
    plan: &Plan,
    size: usize,
) -> Result<Measured> {
    let (warmup, iters) = (plan.warmup(size), plan.iters(size));
    let total = warmup + iters;
    let words = &k.words;
    for w in 0..=CREDIT {
        words.store64(w, 0);
    }
    let sending = plan.op == Op::Send;
    // Receives for this launch are counted from here.
    let base = rx.posted;
    if sending {
        rx.post(base + total, size, false)?;
        words.store64(CREDIT, rx.posted - base);
    }
    let q = k.dq.desc();
    let op: u32 = match plan.op {
        Op::Write => 0,
        Op::Read => 1,
        Op::Send => 2,
    };
    let (laddr, lkey, raddr, rkey) = (local.addr(), local.lkey(), rx.buf.addr(), rx.buf.rkey());
    let (len, warm, n) = (size as u32, warmup, iters);
    let (window, sig_every) = (plan.window as u32, plan.chunk as u32);
    let (words_addr, timeout) = (words.addr(0), KERNEL_WAIT_NS);
    let mut l = k.f.launch_builder(&k.stream);
    l.arg(&q).arg(&op).arg(&laddr).arg(&lkey).arg(&raddr);
    l.arg(&rkey).arg(&len).arg(&warm).arg(&n).arg(&window);
    l.arg(&sig_every).arg(&words_addr).arg(&timeout);
    // SAFETY: the parameters match `bw` in bandwidth.cu; the QP, buffers and words outlive
    // the kernel (it is waited for below, and on failure the process ends without freeing).
    unsafe { l.launch(1, 1)? };
    // Rank 1's CPU keeps receives posted (sends) until the kernel says it is done. The
    // kernel's own waits time out first; the stall check only catches a kernel that never ran.
    let mut stall = Stall::new();
    while words.load64(DONE) == 0 {
        if sending {
            rx.reap()?;
            rx.post(base + total, size, false)?;
            words.store64(CREDIT, rx.posted - base);
        }
        let pr = k.dq.progress();
        stall.check(pr.sends_posted + pr.sends_retired, "the kernel")?;
        std::thread::yield_now();
    }
    k.stream.synchronize()?;
    let (rc, sent) = (words.load64(RC) as i32, words.load64(SENT));
    if rc != code::OK {
        bail!(
            "the kernel failed after {sent} of {total} messages: {}",
            describe(rc)
        );
    }
    if sent != total {
        bail!("the kernel posted {sent} messages, not {total}");
    }
    if sending {
        rx.reap()?;
    }
    let ns = words.load64(T1).saturating_sub(words.load64(T0));
    Ok(Measured {
        size,
        iters,
        warmup,
        seconds: ns as f64 / 1e9,
    })
}
