//! `--op read`: the latency of an RDMA read (a get), as perftest's `ib_read_lat` measures it.
//! Rank 0 reads `size` bytes of rank 1's receive buffer into its own send buffer and waits
//! for the read's completion before it issues the next; rank 1 posts nothing (its NIC
//! answers). One sample is one read's whole round trip, not half of it. GPU triggers, host
//! memory:
//!
//! - `--api gdsync --trigger stream`: one list per read: the read's doorbell, the wait for
//!   its completion, the progress word rank 0's CPU timestamps;
//! - `--api gdsync --trigger kernel`: `pp_read`, fed the same read and wait as descriptors;
//! - `--api mp --trigger stream`: a get from the peer's window (`Comm::iget_on`) and its
//!   wait (`Comm::wait_on`) on the stream, then the progress word;
//! - `--api mp --trigger kernel`: `mp_pp_get`, which gets over its kernel channel
//!   (`gds_peer_get`, `Window::for_kernels`) and waits (`gds_peer_wait_send`) by itself.
//!
//! Rank 1's buffer carries a word the run checks rank 0 read.

use super::gpu::{
    join_ranks, kernel_intervals_us, setup, ProgressClock, Rank, AHEAD, KERNELS, KERNEL_WAIT_NS,
    TIMEOUT,
};
use super::mp_gpu::{kernel_report, MpBuf, MpRank, MP_WORDS};
use super::{Api, Args, Op, Trigger};
use crate::common::gpus::{self, Modules};
use crate::common::stats::{cpu_time_us, Stats};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, Function};
use gdasync::gdsync::exec::{Executor, HostStream, OpBatch};
use gdasync::gdsync::kernel::DescRing;
use gdasync::gdsync::ops::Ops;
use gdasync::gdsync::{Device, PinnedBuffer, SignalWords};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::Request;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The depth of `--api mp`'s kernel channel (reads are one at a time).
const KERNEL_DEPTH: u32 = 64;

/// The word rank 1's buffer ends with, which rank 0's reads of `size` bytes bring back.
fn pattern(size: usize) -> u32 {
    0x5EAD_0000 ^ size as u32
}

/// An error unless rank 0's buffer ends with the word rank 1's buffer holds.
fn check_read(last: [u8; 4], size: usize) -> Result<()> {
    let (got, want) = (u32::from_ne_bytes(last), pattern(size));
    if got != want {
        bail!("rank 0's buffer ends with {got:#x} after the reads, not rank 1's {want:#x}: the reads did not bring the peer's bytes");
    }
    Ok(())
}

/// Runs every size; each size's figures go to `emit` as soon as they are measured.
pub(crate) fn run(args: &Args, emit: &mut dyn FnMut(Stats) -> Result<()>) -> Result<()> {
    // The module stays loaded while its functions are launched.
    let module = (args.trigger == Trigger::Kernel)
        .then(|| Modules::compile(KERNELS, 2).context("the pingpong kernels"))
        .transpose()?;
    let max = args.max_size();
    let dev = crate::common::device::open(&args.device)?;
    for size in args.sizes() {
        let (warm, iters) = (args.warmup(size) as u64, args.iters(size) as u64);
        let n = warm + iters;
        let cpu0 = cpu_time_us();
        let samples = match (args.api, &module) {
            (Api::Gdsync, None) => gdsync_stream(args, &dev, max, size, n)?,
            (Api::Gdsync, Some(m)) => gdsync_kernel(args, &dev, max, size, n, m)?,
            (Api::Mp, m) => {
                let f = m.as_ref().map(|m| m.function(0, "mp_pp_get")).transpose()?;
                mp_reads(args, &dev, max, size, n, f)?
            }
        };
        let cpu = (cpu_time_us() - cpu0) / n as f64;
        emit(Stats::new(size, samples[warm as usize..].to_vec(), cpu))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------- gdsync

/// gdsync's queue pairs: rank 1 sets its word, rank 0's stream or kernel reads.
fn gdsync_ranks(args: &Args, dev: &Device, max: usize, size: usize) -> Result<(Rank, Rank)> {
    let (r0, r1) = setup(dev, args, max)?;
    r1.rbuf.write_at(size - 4, &pattern(size).to_ne_bytes());
    r0.sbuf.write_at(size - 4, &[0; 4]);
    Ok((r0, r1))
}

/// Rank 0's next read of `size` bytes: its commit and the wait for its completion.
fn read_ops(r: &mut Rank, size: usize) -> Result<(Ops, Ops)> {
    let wr = r.wr(Op::Read, size, 0, true);
    let p = r.prepare(&wr)?;
    let (t, commit) = r.qp.commit(p)?;
    Ok((commit, r.qp.send_wait_ops(&t)?))
}

fn gdsync_stream(
    args: &Args,
    dev: &Device,
    max: usize,
    size: usize,
    iters: u64,
) -> Result<Vec<f64>> {
    let (mut r0, _r1) = gdsync_ranks(args, dev, max, size)?;
    let progress = SignalWords::new(1);
    let list = |r: &mut Rank, i: u64| -> Result<Ops> {
        let (mut ops, wait) = read_ops(r, size)?;
        ops.append(wait);
        ops.append(progress.write64(0, i + 1));
        Ok(ops)
    };
    let times = if args.host_stream {
        let s = HostStream::new()?;
        stream_reads(&s, iters, &progress, |i| list(&mut r0, i))?
    } else {
        let s = CudaStream::new(gpus::of(0))?;
        let t = stream_reads(&s, iters, &progress, |i| list(&mut r0, i));
        s.synchronize_within(TIMEOUT)?;
        t?
    };
    let mut last = [0u8; 4];
    r0.sbuf.read_at(size - 4, &mut last);
    check_read(last, size)?;
    Ok(times)
}

/// Submits list `i` of `iters` (built by `list`) to `stream`, at most [`AHEAD`] ahead of
/// it, and times each as the stream's progress word (`progress`, word 0) passes it.
fn stream_reads<E: Executor>(
    stream: &E,
    iters: u64,
    progress: &SignalWords,
    mut list: impl FnMut(u64) -> Result<Ops>,
) -> Result<Vec<f64>> {
    let mut clock = ProgressClock::whole(iters);
    for i in 0..iters {
        stream.submit(list(i)?)?;
        loop {
            clock.observe(progress.load64(0));
            if clock.seen + AHEAD > i {
                break;
            }
            clock.check_stall(iters)?;
            std::hint::spin_loop();
        }
    }
    while clock.seen < iters {
        clock.observe(progress.load64(0));
        clock.check_stall(iters)?;
    }
    Ok(clock.times)
}

/// `pp_read` on rank 0's GPU, fed each read's commit and completion wait by this thread.
fn gdsync_kernel(
    args: &Args,
    dev: &Device,
    max: usize,
    size: usize,
    iters: u64,
    m: &Modules,
) -> Result<Vec<f64>> {
    let (mut r0, _r1) = gdsync_ranks(args, dev, max, size)?;
    let f = m.function(0, "pp_read")?;
    let stream = CudaStream::new(gpus::of(0))?;
    let mut ring = DescRing::new(64);
    let times = PinnedBuffer::new(iters.max(1) as usize * 8);
    let rc = SignalWords::new(1);
    let (desc, n, tms, to, rca) = (
        ring.device_desc(),
        iters,
        times.addr(),
        KERNEL_WAIT_NS,
        rc.addr(0),
    );
    let mut l = f.launch_builder(&stream);
    l.arg(&desc).arg(&n).arg(&tms).arg(&to).arg(&rca);
    // SAFETY: the parameters match `pp_read`; the ring, `times`, `rc` and the queue pair
    // outlive the kernel (the stream is synchronised before any of them is dropped).
    unsafe { l.launch(1, 32)? };
    // How the feeding thread spends its time (GDSYNC_LOG=info): building each read's
    // descriptors, and waiting for ring room (the kernel behind).
    let (mut build, mut push) = (Duration::ZERO, Duration::ZERO);
    let fed = (0..iters).try_for_each(|_| -> Result<()> {
        let t = Instant::now();
        let (commit, wait) = read_ops(&mut r0, size)?;
        let built = Instant::now();
        ring.push_send(commit, TIMEOUT)?;
        ring.push_wait(wait, TIMEOUT)?;
        (build, push) = (build + (built - t), push + built.elapsed());
        Ok(())
    });
    let per = |d: Duration| d.as_secs_f64() * 1e6 / iters.max(1) as f64;
    tracing::info!(
        build_us = per(build),
        push_us = per(push),
        "pingpong --op read: the CPU feeding the read kernel, per read"
    );
    stream.synchronize()?;
    if rc.load32(0) != 1 {
        bail!(
            "the read kernel failed (return code {}; 1 = done)",
            rc.load32(0)
        );
    }
    fed?;
    let mut last = [0u8; 4];
    r0.sbuf.read_at(size - 4, &mut last);
    check_read(last, size)?;
    Ok(kernel_intervals_us(&times, iters))
}

// ---------------------------------------------------------------------------- mp

/// Both ranks as threads with their communicators; rank 0 gets on a stream, or from
/// `kernel` (`mp_pp_get`).
fn mp_reads(
    args: &Args,
    dev: &Device,
    max: usize,
    size: usize,
    iters: u64,
    kernel: Option<Function>,
) -> Result<Vec<f64>> {
    let mut boots = ThreadBootstrap::group(2);
    let (b1, b0) = (boots.pop().unwrap(), boots.pop().unwrap());
    let spawn = |rank: usize, boot: ThreadBootstrap| {
        let (dev, args, kernel) = (dev.clone(), args.clone(), kernel.clone());
        std::thread::spawn(move || -> Result<Vec<f64>> {
            let mut r = MpRank::new(boot, &dev, &args, max)?;
            if rank == 1 {
                r.rbuf.write_at(size - 4, &pattern(size).to_ne_bytes())?;
            }
            let times = match kernel {
                Some(f) => mp_kernel_rank(rank, &mut r, size, iters, &f)?,
                None => mp_stream_rank(rank, &mut r, size, iters, args.host_stream)?,
            };
            if rank == 0 {
                let mut last = [0u8; 4];
                r.sbuf.read_at(size - 4, &mut last)?;
                check_read(last, size)?;
            }
            r.finalize()?;
            Ok(times)
        })
    };
    let t1 = spawn(1, b1);
    let t0 = spawn(0, b0);
    join_ranks(t0, t1)
}

/// Rank 0 gets on its stream (or a host stream), one list per get: the get, its wait, the
/// progress word; requests are released as the stream passes them. Rank 1 waits at the
/// closing barrier.
fn mp_stream_rank(
    rank: usize,
    r: &mut MpRank,
    size: usize,
    iters: u64,
    host_stream: bool,
) -> Result<Vec<f64>> {
    r.comm.barrier()?;
    let times = if rank == 1 {
        Vec::new()
    } else if host_stream {
        let s = HostStream::new()?;
        let t = mp_stream_gets(r, size, iters, &s);
        s.synchronize()?;
        t?
    } else {
        let s = CudaStream::new(gpus::of(0))?;
        let t = mp_stream_gets(r, size, iters, &s);
        s.synchronize_within(TIMEOUT)?;
        t?
    };
    r.comm.barrier()?;
    Ok(times)
}

/// Rank 0's gets of [`mp_stream_rank`] on `stream`.
fn mp_stream_gets<E: Executor>(
    r: &mut MpRank,
    size: usize,
    iters: u64,
    stream: &E,
) -> Result<Vec<f64>> {
    let (MpBuf::Reg(_, dst), Some(w)) = (&r.sbuf, &r.window) else {
        bail!("--op read: gets need a window and registered host memory");
    };
    let (batch, progress) = (OpBatch::new(), SignalWords::new(1));
    let mut live: VecDeque<Request> = VecDeque::new();
    let mut clock = ProgressClock::whole(iters);
    for i in 0..iters {
        let get = r.comm.iget_on(dst.sge(..size), w, r.peer, 0, &batch)?;
        r.comm.wait_on(get, &batch)?;
        live.push_back(get);
        batch.submit(progress.write64(0, i + 1))?;
        batch.flush(stream)?;
        // Release what the stream finished; stay at most AHEAD gets ahead of it.
        while let Some(&front) = live.front() {
            clock.observe(progress.load64(0));
            if r.comm.test(front)?.is_some() {
                live.pop_front();
            } else if live.len() as u64 <= AHEAD {
                break;
            } else {
                clock.check_stall(iters)?;
            }
        }
    }
    while clock.seen < iters {
        clock.observe(progress.load64(0));
        clock.check_stall(iters)?;
    }
    r.comm.wait_all(live.make_contiguous())?;
    Ok(clock.times)
}

/// Rank 0's `mp_pp_get` gets over its kernel channel; rank 1 creates its side of the
/// channel and waits. The channel's counters say every get went through it.
fn mp_kernel_rank(
    rank: usize,
    r: &mut MpRank,
    size: usize,
    iters: u64,
    f: &Function,
) -> Result<Vec<f64>> {
    let ch = r.comm.kernel_channels(KERNEL_DEPTH)?;
    let win = r
        .window
        .as_ref()
        .context("--op read: gets need a window")?
        .for_kernels()?;
    if !ch.gpu_mapped() || !win.gpu_mapped() {
        bail!("the kernel channel's or the window's memory is not reachable from the GPU");
    }
    let MpBuf::Reg(dst, dst_mr) = &r.sbuf else {
        bail!("--op read: gets need registered host memory");
    };
    let times = PinnedBuffer::new(8 * iters.max(1) as usize);
    let result = SignalWords::new(MP_WORDS);
    // Both ranks have made their allocations and registrations before the kernel runs.
    r.comm.barrier()?;
    if rank == 0 {
        let stream = CudaStream::new(gpus::of(0))?;
        let (table, wtable, peer) = (ch.table()?, win.table(), r.peer as u32);
        let (dlkey, len, n) = (dst_mr.lkey(), size as u32, iters);
        let (tms, to, res) = (times.addr(), KERNEL_WAIT_NS, result.addr(0));
        let mut l = f.launch_builder(&stream);
        l.arg(&table).arg(&wtable).arg(&peer).arg(dst).arg(&dlkey);
        l.arg(&len).arg(&n).arg(&tms).arg(&to).arg(&res);
        // SAFETY: the parameters match `mp_pp_get`; the channel, window table, buffer,
        // `times` and `result` outlive the kernel (synchronised below).
        unsafe { l.launch(1, 1)? };
        stream.synchronize()?;
    }
    // Neither rank drops its channel while the other's kernel may still use it.
    r.comm.barrier()?;
    if rank == 1 {
        return Ok(Vec::new());
    }
    kernel_report(rank, &result, size)?;
    let st = ch.progress(r.peer)?;
    if (st.sends, st.sends_waited, st.one_sided, st.error) != (iters, iters, iters, 0) {
        bail!("rank 0: the channel's counters after {iters} gets: {st:?}");
    }
    Ok(kernel_intervals_us(&times, iters))
}
