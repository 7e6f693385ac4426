//! `--api mp` with the GPU triggers: the loops of gpu.rs through the messaging layer
//! (`mp::Comm` send/receive with credits), `--op send` only. Ranks are threads sharing one
//! GPU and one soft device; each has its own communicator.
//!
//! Receives are posted by each rank's CPU 64 ahead (their credits reach the peer early, so
//! a stream send rarely needs to wait for one); requests are released by the CPU as the
//! stream finishes them, which also bounds how far each CPU runs ahead of its stream.

use super::gpu::{join_ranks, marker_write, stats, Buf, ProgressClock, TIMEOUT};
use super::{Args, Stats, Trigger};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, Function, Module};
use gdasync::gdsync::exec::{Executor, HostStream, OpBatch};
use gdasync::gdsync::{Device, MemoryRegion, SignalWords};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::{Comm, Request};
use std::collections::VecDeque;
use std::time::Instant;

/// Receives posted ahead of the iteration that consumes them.
const RECV_AHEAD: u64 = 64;
/// Iterations a rank's CPU enqueues ahead of its stream.
const AHEAD: usize = 16;

/// One rank: its communicator and registered buffers.
struct MpRank {
    comm: Comm,
    peer: usize,
    sbuf: MemoryRegion<'static>,
    sbuf_addr: u64,
    rbuf: MemoryRegion<'static>,
    recvs: VecDeque<Request>,
    posted: u64,
}

impl MpRank {
    fn new(boot: ThreadBootstrap, dev: &Device, args: &Args, max: usize) -> Result<Self> {
        let comm = Comm::new(Box::new(boot), dev)?;
        let (sbuf_addr, sbuf) = Buf::new(args.mem, max)?.leak_register(comm.pd())?;
        let (_, rbuf) = Buf::new(args.mem, max)?.leak_register(comm.pd())?;
        Ok(Self {
            peer: 1 - comm.rank(),
            comm,
            sbuf,
            sbuf_addr,
            rbuf,
            recvs: VecDeque::new(),
            posted: 0,
        })
    }
    /// Keeps receives posted up to `RECV_AHEAD` past iteration `i`; returns iteration i's.
    fn recv_for(&mut self, i: u64, size: usize, iters: u64) -> Result<Request> {
        while self.posted < (i + RECV_AHEAD).min(iters) {
            let r = self.comm.irecv(self.rbuf.sge(..size), self.peer)?;
            self.recvs.push_back(r);
            self.posted += 1;
        }
        Ok(self.recvs.pop_front().expect("posted ahead"))
    }
}

pub(crate) fn run(args: &Args) -> Result<Vec<Stats>> {
    // The module stays loaded while its function is launched.
    let module = if args.trigger == Trigger::Host {
        Some(
            Module::compile(0, "extern \"C\" __global__ void step() {}")
                .context("compile the step kernel with NVRTC")?,
        )
    } else {
        None
    };
    let step = module.as_ref().map(|m| m.function("step")).transpose()?;
    if args.trigger == Trigger::Kernel {
        bail!(
            "--api mp --trigger kernel is not in this build yet: use --api gdsync --trigger kernel"
        );
    }
    if args.sizes().iter().any(|&s| s < 4 || s % 4 != 0) {
        bail!("GPU triggers put a 32-bit marker at the end of each message: sizes must be multiples of 4");
    }
    let max = *args.sizes().iter().max().unwrap();
    let dev = Device::soft()?;
    let mut out = Vec::new();
    for size in args.sizes() {
        let (warm, iters) = (args.warmup(size) as u64, args.iters(size) as u64);
        let cpu0 = super::cpu_time_us();
        let progress = SignalWords::new(1);
        let mut boots = ThreadBootstrap::group(2);
        let (b1, b0) = (boots.pop().unwrap(), boots.pop().unwrap());
        let spawn = |rank: usize, boot: ThreadBootstrap| {
            let (dev, args, progress, step) = (dev.clone(), args.clone(), progress.clone(), step);
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let r = MpRank::new(boot, &dev, &args, max)?;
                match step {
                    Some(step) => host_rank(rank, r, size, warm + iters, &step),
                    None if args.host_stream => {
                        let s = HostStream::new()?;
                        stream_rank(rank, r, size, warm + iters, &progress, s, |s| {
                            s.synchronize()
                        })
                    }
                    None => {
                        let s = CudaStream::new(0)?;
                        stream_rank(rank, r, size, warm + iters, &progress, s, |s| {
                            s.synchronize()
                        })
                    }
                }
            })
        };
        let t1 = spawn(1, b1);
        let t0 = spawn(0, b0);
        let samples = join_ranks(t0, t1)?;
        let cpu = (super::cpu_time_us() - cpu0) / (warm + iters) as f64;
        out.push(stats(size, samples[warm as usize..].to_vec(), cpu));
    }
    Ok(out)
}

/// Stream-triggered: per iteration the CPU enqueues (rank 1) wait for the receive, write the
/// marker, send; (rank 0) write, send, wait, bump the progress word. Nothing on the CPU is
/// in the message's path.
fn stream_rank<E: Executor>(
    rank: usize,
    mut r: MpRank,
    size: usize,
    iters: u64,
    progress: &SignalWords,
    stream: E,
    synchronize: fn(&E) -> gdasync::gdsync::Result<()>,
) -> Result<Vec<f64>> {
    let out_word = r.sbuf_addr + size as u64 - 4;
    let mut live: VecDeque<Request> = VecDeque::new();
    let batch = OpBatch::new();
    r.comm.barrier()?;
    let mut clock = ProgressClock {
        seen: 0,
        last: Instant::now(),
        times: Vec::with_capacity(iters as usize),
    };
    for i in 0..iters {
        let mine = (2 * i + 1 + rank as u64) as u32;
        let recv = r.recv_for(i, size, iters)?;
        // One iteration's ops reach the stream as one list (one batch of memory operations).
        if rank == 1 {
            r.comm.wait_on(recv, &batch)?;
        }
        batch.submit(marker_write(out_word, mine))?;
        let send = r.comm.isend_on(r.sbuf.sge(..size), r.peer, &batch)?;
        if rank == 0 {
            r.comm.wait_on(recv, &batch)?;
            batch.submit(progress.write64(0, i + 1))?;
        }
        batch.flush(&stream)?;
        live.push_back(send);
        live.push_back(recv);
        // Release what the stream finished; stay at most AHEAD iterations ahead of it.
        let start = Instant::now();
        while let Some(&front) = live.front() {
            if rank == 0 {
                clock.observe(progress.load64(0));
            }
            if r.comm.test(front)?.is_some() {
                live.pop_front();
            } else if live.len() <= 2 * AHEAD {
                break;
            } else if start.elapsed() > TIMEOUT {
                bail!("mp stream pingpong stalled at iteration {i}");
            }
        }
    }
    while rank == 0 && clock.seen < iters {
        clock.observe(progress.load64(0));
        if clock.last.elapsed() > TIMEOUT {
            bail!("mp stream pingpong stalled at {}/{iters}", clock.seen);
        }
    }
    synchronize(&stream)?;
    r.comm.wait_all(live.make_contiguous())?;
    r.comm.barrier()?;
    Ok(clock.times)
}

/// GPU in the loop, CPU-driven: launch the GPU step and synchronise, then send and wait from
/// the CPU (the MPI-style baseline).
fn host_rank(
    rank: usize,
    mut r: MpRank,
    size: usize,
    iters: u64,
    step: &Function,
) -> Result<Vec<f64>> {
    let stream = CudaStream::new(0)?;
    let mut sends: VecDeque<Request> = VecDeque::new();
    let mut times = Vec::with_capacity(iters as usize);
    r.comm.barrier()?;
    let mut t0 = Instant::now();
    for i in 0..iters {
        let mine = (2 * i + 1 + rank as u64) as u32;
        let recv = r.recv_for(i, size, iters)?;
        if rank == 1 {
            r.comm.wait(recv)?;
        }
        // SAFETY: `step` takes no parameters.
        unsafe { step.launch(&stream, 1, 1, &mut [])? };
        stream.synchronize()?;
        r.sbuf.write_at(size - 4, &mine.to_ne_bytes());
        sends.push_back(r.comm.isend(r.sbuf.sge(..size), r.peer)?);
        if sends.len() > AHEAD {
            r.comm.wait(sends.pop_front().unwrap())?;
        }
        if rank == 0 {
            r.comm.wait(recv)?;
            let now = Instant::now();
            times.push(now.duration_since(t0).as_secs_f64() * 1e6 / 2.0);
            t0 = now;
        }
    }
    r.comm.wait_all(sends.make_contiguous())?;
    if !r.recvs.is_empty() {
        bail!("{} receives left over", r.recvs.len());
    }
    r.comm.barrier()?;
    Ok(times)
}
