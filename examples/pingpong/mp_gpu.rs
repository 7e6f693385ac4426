//! `--api mp` with the GPU triggers: the loops of gpu.rs through the messaging layer
//! (`mp::Comm` send/receive with credits; `--op write`: puts into the peer's window, on a
//! stream or from a kernel, host memory). Ranks are threads sharing one GPU and one soft
//! device; each has its own communicator.
//!
//! `host` and `stream`: receives are posted by each rank's CPU 64 ahead (their credits reach
//! the peer early, so a stream send rarely needs to wait for one); requests are released by
//! the CPU as the stream finishes them, which also bounds how far each CPU runs ahead of its
//! stream. `kernel`: one persistent kernel per rank drives the rank's kernel channel
//! (`Comm::kernel_channels`, `gds_peer_*`) by itself, receives and credits included (one
//! credit per `--recv-batch` receives; one send in 16 signalled, as `--api gdsync` does),
//! timed as gpu.rs times `--api gdsync --trigger kernel` (the GPU's global timer in rank 0's
//! kernel). With `--mem device` staged, the channel is staged (`Comm::kernel_channels_staged`,
//! bounces of the message size) and the kernel (`mp_pp_staged`) copies each message between
//! GPU memory and the bounces with a block of threads. `--op write` from a kernel
//! (`mp_pp_put`) puts each message into the peer's window over the channel
//! (`Window::for_kernels`, `gds_peer_put_flags`) and awaits the answer's marker.

use super::gpu::{
    join_ranks, kernel_half_rtts, marker_wait, marker_write, staged, Buf, KeepUp, ProgressClock,
    KERNELS, KERNEL_WAIT_NS, SIGNAL_EVERY, STAGING_THREADS, TIMEOUT,
};
use super::{Args, Op, Trigger};
use crate::common::gpus::{self, Modules};
use crate::common::stats::{cpu_time_us, Stats};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer, Function};
use gdasync::gdsync::exec::{Executor, HostStream, OpBatch};
use gdasync::gdsync::kernel::code;
use gdasync::gdsync::{Device, GpuMemoryPath, MemoryRegion, PinnedBuffer, SignalWords};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::{Comm, GpuRegion, Request, Window};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Receives posted ahead of the iteration that consumes them.
const RECV_AHEAD: u64 = 64;
/// Iterations a rank's CPU enqueues ahead of its stream.
const AHEAD: usize = 16;

/// Receives a kernel keeps posted ahead, and the depth of its kernel channel.
const KERNEL_RECV_AHEAD: u32 = 64;
/// The most pinned memory a staged kernel channel's bounces take per rank (3 × depth bounces
/// of the message size): large messages get a shallower channel.
const KERNEL_BOUNCE_BYTES: usize = 256 << 20;
/// Result words of `mp_pp` (as `MP_*` in kernels.cu).
const MP_DONE: usize = 0;
const MP_RC: usize = 1;
const MP_AT: usize = 2;
const MP_STEP: usize = 3;
const MP_LEN: usize = 4;
pub(crate) const MP_WORDS: usize = 5;
/// `mp_pp`'s code for a message of the wrong length.
const MP_WRONG_LENGTH: i32 = 0x1000;

/// The GPU function of a trigger: the step of `host`, the persistent loop of `kernel`.
#[derive(Clone)]
enum GpuFn {
    Step(Function),
    Loop(Function),
}

/// A message buffer: registered (host memory, or GPU memory reached directly), or GPU
/// memory that mp stages through its bounces (`--mem device`, staged).
pub(crate) enum MpBuf {
    Reg(u64, MemoryRegion<'static>),
    Gpu(GpuRegion),
}

impl MpBuf {
    /// A buffer of `max` bytes for rank `rank`: staged GPU memory where `args` say so (host
    /// memory standing in for it on a host stream), else registered `args.mem`.
    fn new(comm: &Comm, args: &Args, max: usize, rank: usize) -> Result<MpBuf> {
        if !staged(args) {
            let (addr, mr) = Buf::new(args.mem, max, rank)?.leak_register(comm.pd())?;
            return Ok(MpBuf::Reg(addr, mr));
        }
        Ok(MpBuf::Gpu(if args.host_stream {
            comm.register_gpu_stand_in(PinnedBuffer::with_cuda(max, None))
        } else {
            let buf = Arc::new(DeviceBuffer::alloc(gpus::of(rank), max)?);
            comm.register_gpu(buf, GpuMemoryPath::Staged)?
        }))
    }
    pub(crate) fn addr(&self) -> u64 {
        match self {
            MpBuf::Reg(a, _) => *a,
            MpBuf::Gpu(g) => g.addr(),
        }
    }
    /// The lkey of a registered buffer, 0 for a staged one (the kernel then copies it
    /// through the channel's bounces, and names no key of its own).
    pub(crate) fn lkey(&self) -> u32 {
        match self {
            MpBuf::Reg(_, mr) => mr.lkey(),
            MpBuf::Gpu(_) => 0,
        }
    }
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) -> Result<()> {
        match self {
            MpBuf::Reg(_, mr) => mr.write_at(off, src),
            MpBuf::Gpu(g) => g.write_at(off, src)?,
        }
        Ok(())
    }
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            MpBuf::Reg(_, mr) => mr.read_at(off, dst),
            MpBuf::Gpu(g) => g.read_at(off, dst)?,
        }
        Ok(())
    }
}

/// One rank: its communicator and buffers.
pub(crate) struct MpRank {
    pub(crate) comm: Comm,
    pub(crate) peer: usize,
    pub(crate) sbuf: MpBuf,
    pub(crate) rbuf: MpBuf,
    recvs: VecDeque<Request>,
    posted: u64,
    /// Receives kept posted ahead (fewer when messages go in chunks: each chunk takes a
    /// slot of the receive ring).
    recv_ahead: u64,
    /// `--op write|read`: the window over every rank's receive buffer, which puts write into
    /// and gets read from.
    pub(crate) window: Option<Window>,
}

impl MpRank {
    pub(crate) fn new(
        boot: ThreadBootstrap,
        dev: &Device,
        args: &Args,
        max: usize,
    ) -> Result<Self> {
        let mut comm = Comm::new(Box::new(boot), dev)?;
        let rank = comm.rank();
        let mut recv_ahead = RECV_AHEAD;
        // The kernel trigger stages through its channel's bounces, not mp's pool.
        if staged(args) && args.trigger != Trigger::Kernel {
            // A bounce per receive posted ahead and per iteration the CPU runs ahead of its
            // stream, each as large as the largest message; or, with --stage-bounce, as many
            // bounces per message as it has chunks, with as few receives posted ahead as
            // keep every chunk in mp's receive ring (512), beside the stream's run-ahead.
            let bounce = args.stage_bounce.unwrap_or(max).clamp(1, max.max(1));
            let chunks = max.div_ceil(bounce).max(1);
            let ring = 512 / chunks;
            let lag = if args.trigger == Trigger::Stream {
                AHEAD
            } else {
                0
            };
            if ring <= lag {
                bail!("--stage-bounce {bounce}: {max}-byte messages go in {chunks} chunks, too many for mp's receive ring of 512 with the stream trigger's {AHEAD} messages ahead: use a bounce of at least {} bytes", max.div_ceil(512 / (AHEAD + 1)));
            }
            recv_ahead = RECV_AHEAD.min((ring - lag) as u64);
            let (recvs, sends) = (recv_ahead as usize + AHEAD, 2 * AHEAD);
            comm.set_staging(bounce, recvs * chunks, sends * chunks)?;
        }
        let sbuf = MpBuf::new(&comm, args, max, rank)?;
        let rbuf = MpBuf::new(&comm, args, max, rank)?;
        let window = match (&rbuf, args.op) {
            (MpBuf::Reg(_, mr), Op::Write | Op::Read) => Some(comm.window(mr)?),
            (_, Op::Write | Op::Read) => {
                bail!("--op write|read: puts and gets need registered host memory")
            }
            _ => None,
        };
        Ok(Self {
            peer: 1 - comm.rank(),
            comm,
            sbuf,
            rbuf,
            recvs: VecDeque::new(),
            posted: 0,
            recv_ahead,
            window,
        })
    }
    /// Keeps receives posted up to `recv_ahead` past iteration `i`; returns iteration i's.
    fn recv_for(&mut self, i: u64, size: usize, iters: u64) -> Result<Request> {
        while self.posted < (i + self.recv_ahead).min(iters) {
            let r = match &self.rbuf {
                MpBuf::Reg(_, mr) => self.comm.irecv(mr.sge(..size), self.peer)?,
                MpBuf::Gpu(g) => self.comm.irecv_gpu(g.slice(..size), self.peer)?,
            };
            self.recvs.push_back(r);
            self.posted += 1;
        }
        Ok(self.recvs.pop_front().expect("posted ahead"))
    }
    /// Sends `size` bytes of the send buffer, from the CPU or on `exec`; with a window, puts
    /// them at the start of the peer's receive buffer (on `exec`).
    fn send(&mut self, size: usize, exec: Option<&impl Executor>) -> Result<Request> {
        let peer = self.peer;
        if let (Some(w), MpBuf::Reg(_, mr), Some(e)) = (&self.window, &self.sbuf, exec) {
            return Ok(self.comm.iput_on(mr.sge(..size), w, peer, 0, e)?);
        }
        Ok(match (&self.sbuf, exec) {
            (MpBuf::Reg(_, mr), None) => self.comm.isend(mr.sge(..size), peer)?,
            (MpBuf::Reg(_, mr), Some(e)) => self.comm.isend_on(mr.sge(..size), peer, e)?,
            (MpBuf::Gpu(g), None) => self.comm.isend_gpu(g.slice(..size), peer)?,
            (MpBuf::Gpu(g), Some(e)) => self.comm.isend_gpu_on(g.slice(..size), peer, e)?,
        })
    }
    /// Leaves together with the other rank (`Comm::finalize`): a rank that dropped its
    /// communicator right after the last barrier could take its own barrier write with it
    /// before the NIC sent it, and leave its partner waiting.
    pub(crate) fn finalize(self) -> Result<()> {
        let MpRank { comm, window, .. } = self;
        drop(window);
        Ok(comm.finalize()?)
    }
    /// After a run of `iters` round trips: the last message this rank received is in its
    /// receive buffer (with staging: the copy in after the wait landed), else an error.
    fn check_last(&self, size: usize, iters: u64, rank: usize) -> Result<()> {
        if iters == 0 {
            return Ok(());
        }
        let mut last = [0u8; 4];
        self.rbuf.read_at(size - 4, &mut last)?;
        let want = (2 * iters - rank as u64) as u32;
        if u32::from_ne_bytes(last) != want {
            bail!(
                "rank {rank}: the last message carries marker {}, not {want}",
                u32::from_ne_bytes(last)
            );
        }
        Ok(())
    }
}

/// Runs every size; each size's figures go to `emit` as soon as they are measured.
pub(crate) fn run(args: &Args, emit: &mut dyn FnMut(Stats) -> Result<()>) -> Result<()> {
    // The module stays loaded while its functions are launched.
    let module = if args.trigger != Trigger::Stream {
        Some(Modules::compile(KERNELS, 2).context("the pingpong kernels")?)
    } else {
        None
    };
    let kernel_of = |rank: usize| -> Result<Option<GpuFn>> {
        Ok(match args.trigger {
            Trigger::Host => Some(GpuFn::Step(
                module.as_ref().unwrap().function(rank, "step")?,
            )),
            Trigger::Kernel => Some(GpuFn::Loop(module.as_ref().unwrap().function(
                rank,
                match (args.op, staged(args)) {
                    (Op::Write, _) => "mp_pp_put",
                    (_, true) => "mp_pp_staged",
                    _ => "mp_pp",
                },
            )?)),
            _ => None,
        })
    };
    let kernels = [kernel_of(0)?, kernel_of(1)?];
    // `kernel` gives credits in batches, as the CPU loop of `--api mp` does (`irecv_batch`).
    let recv_batch = u32::try_from(args.recv_batch)
        .ok()
        .filter(|b| (1..=KERNEL_RECV_AHEAD).contains(b))
        .with_context(|| {
            format!(
                "--recv-batch must be 1..={KERNEL_RECV_AHEAD}, not {}",
                args.recv_batch
            )
        })?;
    let max = *args.sizes().iter().max().unwrap();
    let dev = crate::common::device::open(&args.device)?;
    for size in args.sizes() {
        let (warm, iters) = (args.warmup(size) as u64, args.iters(size) as u64);
        let cpu0 = cpu_time_us();
        let progress = SignalWords::new(1);
        let mut boots = ThreadBootstrap::group(2);
        let (b1, b0) = (boots.pop().unwrap(), boots.pop().unwrap());
        let spawn = |rank: usize, boot: ThreadBootstrap| {
            let (dev, args, progress) = (dev.clone(), args.clone(), progress.clone());
            let kernel = kernels[rank].clone();
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let mut r = MpRank::new(boot, &dev, &args, max)?;
                let n = warm + iters;
                let times = match kernel {
                    Some(GpuFn::Step(step)) => host_rank(rank, &mut r, size, n, &step),
                    Some(GpuFn::Loop(f)) => {
                        kernel_rank(rank, &mut r, size, n, recv_batch, &f, staged(&args))
                    }
                    None if args.host_stream => {
                        let s = HostStream::new()?;
                        stream_rank(rank, &mut r, size, n, &progress, s, |s| s.synchronize())
                    }
                    None => {
                        let s = CudaStream::new(gpus::of(rank))?;
                        stream_rank(rank, &mut r, size, n, &progress, s, |s| {
                            s.synchronize_within(crate::gpu::TIMEOUT)
                        })
                    }
                }?;
                r.finalize()?;
                Ok(times)
            })
        };
        let t1 = spawn(1, b1);
        let t0 = spawn(0, b0);
        let samples = join_ranks(t0, t1)?;
        let cpu = (cpu_time_us() - cpu0) / (warm + iters) as f64;
        emit(Stats::new(size, samples[warm as usize..].to_vec(), cpu))?;
    }
    Ok(())
}

/// Stream-triggered: per iteration the CPU enqueues one list: (rank 1) wait for the receive,
/// write the marker, send; (rank 0) wait for the answer to the previous message, write, send,
/// bump the progress word (one list more than iterations: the last answer's wait). Each list
/// begins with its wait, as gdsync's stream loop, so the stream's step from one list to the
/// next falls while the message is in flight. Nothing on the CPU is in the message's path.
/// With puts (`--op write`) no receive is posted: the wait is for the message's marker in the
/// receive buffer, as in gdsync's write loop.
fn stream_rank<E: Executor>(
    rank: usize,
    r: &mut MpRank,
    size: usize,
    iters: u64,
    progress: &SignalWords,
    stream: E,
    synchronize: fn(&E) -> gdasync::gdsync::Result<()>,
) -> Result<Vec<f64>> {
    let out_word = r.sbuf.addr() + size as u64 - 4;
    let mut live: VecDeque<Request> = VecDeque::new();
    let batch = OpBatch::new();
    r.comm.barrier()?;
    let mut clock = ProgressClock::half_round_trips(iters);
    let lists = if rank == 0 { iters + 1 } else { iters };
    // Rank 0's receive for the message it sent in the list before.
    let mut answer: Option<Request> = None;
    let in_word = r.rbuf.addr() + size as u64 - 4;
    let puts = r.window.is_some();
    let mut keep_up = KeepUp::default();
    for i in 0..lists {
        let t = Instant::now();
        let recv = if i < iters && !puts {
            Some(r.recv_for(i, size, iters)?)
        } else {
            None
        };
        // One list's ops reach the stream as one list (one batch of memory operations).
        let wait = if rank == 1 { recv } else { answer.take() };
        if let Some(w) = wait {
            r.comm.wait_on(w, &batch)?;
            live.push_back(w);
        }
        // The marker of the message this list answers: rank 0's i-th (rank 1), or the
        // answer to rank 0's previous one.
        let awaited = if rank == 1 {
            (i < iters).then_some(2 * i + 1)
        } else {
            (i > 0).then_some(2 * i)
        };
        if let (true, Some(m)) = (puts, awaited) {
            // SAFETY: the word lies in this rank's receive buffer, leaked for the process's life.
            batch.submit(unsafe { marker_wait(in_word, m as u32) })?;
        }
        if i < iters {
            let mine = (2 * i + 1 + rank as u64) as u32;
            // SAFETY: the word lies in this rank's send buffer, leaked for the process's life.
            batch.submit(unsafe { marker_write(out_word, mine) })?;
            live.push_back(r.send(size, Some(&batch))?);
        }
        if rank == 0 {
            answer = recv;
            if i > 0 {
                // After the send: the message does not wait for the clock.
                batch.submit(progress.write64(0, i))?;
            }
        }
        batch.flush(&stream)?;
        if rank == 0 {
            keep_up.record(i + 1, progress.load64(0), t);
        }
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
    if rank == 0 {
        keep_up.log("mp");
    }
    synchronize(&stream)?;
    r.comm.wait_all(live.make_contiguous())?;
    r.comm.barrier()?;
    r.check_last(size, iters, rank)?;
    Ok(clock.times)
}

/// GPU in the loop, CPU-driven: launch the GPU step and synchronise, then send and wait from
/// the CPU (the MPI-style baseline).
fn host_rank(
    rank: usize,
    r: &mut MpRank,
    size: usize,
    iters: u64,
    step: &Function,
) -> Result<Vec<f64>> {
    let stream = CudaStream::new(gpus::of(rank))?;
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
        unsafe { step.launch_builder(&stream).launch(1, 1)? };
        stream.synchronize()?;
        r.sbuf.write_at(size - 4, &mine.to_ne_bytes())?;
        sends.push_back(r.send(size, None::<&HostStream>)?);
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
    r.check_last(size, iters, rank)?;
    Ok(times)
}

/// Kernel-initiated: one persistent kernel per rank (`mp_pp`) runs every iteration through
/// the rank's kernel channel, posting its receives (with their credits), sending, and
/// waiting for completions itself; the CPU only launches it and reads its report. Rank 0's
/// kernel stamps the GPU's global timer after each round trip, as `pp` does for
/// `--api gdsync --trigger kernel`.
fn kernel_rank(
    rank: usize,
    r: &mut MpRank,
    size: usize,
    iters: u64,
    recv_batch: u32,
    f: &Function,
    staged: bool,
) -> Result<Vec<f64>> {
    // Staged: bounces of the message size, in a channel no deeper than keeps them within
    // KERNEL_BOUNCE_BYTES (and at least recv_batch deep).
    let depth = if staged {
        let fits = (KERNEL_BOUNCE_BYTES / (3 * size.max(1))).min(KERNEL_RECV_AHEAD as usize);
        (fits as u32).max(recv_batch)
    } else {
        KERNEL_RECV_AHEAD
    };
    let ch = if staged {
        r.comm.kernel_channels_staged(depth, size.max(1))?
    } else {
        r.comm.kernel_channels(depth)?
    };
    if !ch.gpu_mapped() {
        bail!("the kernel channel's rings and words are not reachable from the GPU");
    }
    let stream = CudaStream::new(gpus::of(rank))?;
    // Only rank 0's kernel stamps the iterations.
    let times = PinnedBuffer::new(8 * if rank == 0 { iters.max(1) as usize } else { 1 });
    let result = SignalWords::new(MP_WORDS);
    let (table, me, peer) = (ch.table()?, rank as u32, r.peer as u32);
    let (sbuf, slkey) = (r.sbuf.addr(), r.sbuf.lkey());
    let (rbuf, rlkey) = (r.rbuf.addr(), r.rbuf.lkey());
    let sig_every = SIGNAL_EVERY;
    let (len, n, ahead) = (size as u32, iters, depth);
    let (times_addr, timeout, result_addr) = (
        if rank == 0 { times.addr() } else { 0 },
        KERNEL_WAIT_NS,
        result.addr(0),
    );
    // `--op write`: puts into the peer's window (`mp_pp_put`), kept while the kernel runs.
    let win = r.window.as_ref().map(|w| w.for_kernels()).transpose()?;
    if win.as_ref().is_some_and(|w| !w.gpu_mapped()) {
        bail!("the window's table is not reachable from the GPU");
    }
    let win_table = win.as_ref().map(|w| w.table());
    let mut l = f.launch_builder(&stream);
    l.arg(&table);
    if let Some(w) = &win_table {
        l.arg(w);
    }
    l.arg(&me).arg(&peer).arg(&sbuf);
    if !staged {
        l.arg(&slkey);
    }
    l.arg(&rbuf);
    if win_table.is_none() {
        if !staged {
            l.arg(&rlkey);
        }
        l.arg(&len).arg(&n).arg(&ahead).arg(&recv_batch);
    } else {
        l.arg(&len).arg(&n);
    }
    l.arg(&sig_every)
        .arg(&times_addr)
        .arg(&timeout)
        .arg(&result_addr);
    // Both ranks have made their CUDA allocations and registrations before either kernel
    // runs: a running kernel could block them.
    r.comm.barrier()?;
    // SAFETY: the parameters match `mp_pp` (`mp_pp_staged`: without the lkeys; `mp_pp_put`:
    // the window's table after the channels', no receive key, depth or batch); the tables,
    // channel, buffers, `times` and `result` outlive the kernel (the stream is synchronised
    // below, before any of them is dropped).
    unsafe { l.launch(1, if staged { STAGING_THREADS } else { 1 })? };
    let synced = stream.synchronize();
    // Neither rank drops its channel while the other's kernel may still write credits to it.
    let after = r.comm.barrier();
    synced?;
    after?;
    kernel_report(rank, &result, size)?;
    // Every message went through the channel (puts: as one-sided sends, no receives), and
    // the last one's marker is in the buffer.
    let st = ch.progress(r.peer)?;
    let (recvs, one_sided) = if win.is_some() {
        (0, iters)
    } else {
        (iters, 0)
    };
    if (
        st.sends,
        st.sends_done,
        st.sends_waited,
        st.recvs,
        st.recvs_waited,
        st.one_sided,
        st.error,
    ) != (iters, iters, iters, recvs, recvs, one_sided, 0)
    {
        bail!("rank {rank}: the channel's counters after {iters} iterations: {st:?}");
    }
    r.check_last(size, iters, rank)?;
    Ok(if rank == 0 {
        kernel_half_rtts(&times, iters)
    } else {
        Vec::new()
    })
}

/// What a rank's `mp_pp*` kernel reported in its result words: an error naming the step it
/// stopped at and why, or none.
pub(crate) fn kernel_report(rank: usize, result: &SignalWords, size: usize) -> Result<()> {
    if result.load64(MP_DONE) != 1 {
        bail!("rank {rank}'s pingpong kernel ended without reporting");
    }
    let rc = result.load64(MP_RC) as i32;
    if rc != code::OK {
        let at = result.load64(MP_AT);
        let step = match result.load64(MP_STEP) {
            1 => "posting a receive (gds_peer_post_recv, staged: gds_peer_post_recv_staged)",
            2 => "sending (gds_peer_prepare_send, gds_peer_ring_send; staged: gds_peer_next_send_bounce, gds_peer_send_bounce)",
            3 => "waiting for sends (gds_peer_wait_sends)",
            4 => "waiting for a receive (gds_peer_wait_recv)",
            5 => "giving credit (gds_peer_give_credit)",
            6 => "putting (gds_peer_put_flags)",
            7 => "waiting for the peer's marker",
            8 => "getting (gds_peer_get)",
            _ => "checking its arguments",
        };
        let why = match rc {
            code::TIMEOUT => format!(
                "a wait timed out after {} s (the peer stopped, or no credit or completion came)",
                KERNEL_WAIT_NS / 1_000_000_000
            ),
            code::INVALID => "an invalid argument or channel descriptor".into(),
            code::FULL => "the receive ring was full".into(),
            MP_WRONG_LENGTH => format!(
                "a message of {} bytes arrived, {size} expected",
                result.load64(MP_LEN)
            ),
            rc => match code::syndrome(rc) {
                Some(s) => format!("an error completion ({s:?})"),
                None => format!("code {rc:#x}"),
            },
        };
        bail!("rank {rank}'s pingpong kernel stopped at iteration {at} {step}: {why}");
    }
    Ok(())
}
