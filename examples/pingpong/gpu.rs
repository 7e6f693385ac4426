//! The GPU triggers of pingpong: `host` (GPU in the loop, CPU-driven), `stream`
//! (stream-triggered) and `kernel` (one persistent kernel per rank), each with its `--raw`
//! floor. Ranks are threads of one process sharing one GPU and one soft device.
//!
//! Message `m` of a run carries the 32-bit marker `m` in its last 4 bytes; rank 0 sends odd
//! markers, rank 1 answers with even ones. The receiver (stream, kernel or CPU) waits for the
//! marker word (`--op write`) or for its receive completion (`write-imm`, `send`).

use super::relay::Relay;
use super::{Args, Mem, Op, Trigger};
use crate::common::gpus::{self, Modules};
use crate::common::payload::Payload;
use crate::common::stats::{cpu_time_us, Stats};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{Cuda, CudaStream, DeviceBuffer, Function};
use gdasync::gdsync::exec::{Executor, HostStream};
use gdasync::gdsync::kernel::{ll, DescRing};
use gdasync::gdsync::ops::{Op as MemOp, Ops, WaitCond};
use gdasync::gdsync::staging::Staging;
use gdasync::gdsync::{
    Access, Cq, Device, Error, GpuMemoryPath, MemoryRegion, PinnedBuffer, Qp, QpConfig, RecvTicket,
    RecvWr, RemoteBuf, SendWr, SignalWords,
};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A signalled send every this many (the waits on them retire send-ring slots); `mp_pp`
/// signals as often.
pub(crate) const SIGNAL_EVERY: u64 = 16;
/// How many iterations a rank's CPU enqueues ahead of its stream.
pub(crate) const AHEAD: u64 = 16;
pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

/// The kernels of the GPU triggers, `pp` and `step` here and `mp_pp` of mp_gpu.rs (also
/// checked with clang by tests/kernel_channel.rs).
pub(crate) const KERNELS: &str = include_str!("kernels.cu");
/// How long a kernel's wait gives up after (it then reports a code instead of spinning).
pub(crate) const KERNEL_WAIT_NS: u64 = 10_000_000_000;

/// A message buffer in pinned host or device memory.
pub(crate) enum Buf {
    Host(PinnedBuffer),
    Dev(DeviceBuffer),
}

impl Buf {
    pub(crate) fn new(mem: Mem, len: usize, rank: usize) -> Result<Buf> {
        Ok(match mem {
            Mem::Host => Buf::Host(PinnedBuffer::new(len)),
            Mem::Device => Buf::Dev(DeviceBuffer::alloc(gpus::of(rank), len)?),
        })
    }
    fn addr(&self) -> u64 {
        match self {
            Buf::Host(b) => b.addr(),
            Buf::Dev(b) => b.ptr(),
        }
    }
    pub(crate) fn leak_register(
        self,
        pd: &gdasync::gdsync::ProtectionDomain,
    ) -> Result<(u64, MemoryRegion<'static>)> {
        let b: &'static Buf = Box::leak(Box::new(self));
        let mr = match b {
            Buf::Host(x) => pd.register_pinned(x, Access::ALL)?,
            Buf::Dev(x) => pd.register_device(x, Access::ALL)?,
        };
        Ok((b.addr(), mr))
    }
}

/// One rank's queues and buffers.
pub(crate) struct Rank {
    pub(crate) qp: Qp,
    _scq: Cq,
    rcq: Cq,
    pub(crate) sbuf: MemoryRegion<'static>,
    sbuf_addr: u64,
    pub(crate) rbuf: MemoryRegion<'static>,
    rbuf_addr: u64,
    pub(crate) remote: RemoteBuf,
    recvs: Vec<RecvTicket>,
    /// With staged GPU memory: the GPU buffers the payloads live in, and the bounces that
    /// `sbuf`/`rbuf` register.
    staged: Option<Staged>,
}

/// A rank's GPU payloads staged through pinned bounces: the sender writes its message into
/// `sdev`, copies it out into slot 0 of `out` (which the send names) in the trigger's order;
/// the receiver's message lands in slot 0 of `inb` and is copied into `rdev` after its wait.
pub(crate) struct Staged {
    out: Staging,
    inb: Staging,
    sdev: Payload,
    rdev: Payload,
}

impl Staged {
    /// Rank `rank`'s bounces of `bounce` bytes and payloads of `max` (`host`: host stand-ins
    /// for GPU memory, for a host stream).
    fn new(max: usize, bounce: usize, rank: usize, host: bool) -> Result<Staged> {
        let cuda = if host { None } else { Some(Cuda::get()?) };
        Ok(Staged {
            out: Staging::new(bounce, cuda),
            inb: Staging::new(bounce, cuda),
            sdev: Payload::new(host, max, gpus::of(rank))?,
            rdev: Payload::new(host, max, gpus::of(rank))?,
        })
    }
    /// Ops: the message's `size` bytes out of GPU memory into the send bounce.
    pub(crate) fn copy_out(&self, size: usize) -> Ops {
        self.sdev.copy(&self.out, 0, 0, size, true)
    }
    /// Ops: the received `size` bytes from the receive bounce into GPU memory.
    pub(crate) fn copy_in(&self, size: usize) -> Ops {
        self.rdev.copy(&self.inb, 0, 0, size, false)
    }
}

/// Registers `bounce` (leaked with its staging buffer for the life of the process): its host
/// address and region.
fn leak_register_bounce(
    st: &Staging,
    pd: &gdasync::gdsync::ProtectionDomain,
) -> Result<(u64, MemoryRegion<'static>)> {
    let b: &'static Staging = Box::leak(Box::new(st.clone()));
    Ok((
        b.bounce().addr(),
        pd.register_pinned(b.bounce(), Access::ALL)?,
    ))
}

/// Whether a message of `size` travels as LL lines (`--proto`).
fn travels_as_ll(args: &Args, size: usize) -> bool {
    size <= args.ll_max
}

/// The bytes of a message of `size` on the wire: its LL lines where it travels as LL
/// (`--proto`), else the payload.
pub(crate) fn wire_bytes(args: &Args, size: usize) -> usize {
    if travels_as_ll(args, size) {
        ll::bytes(size)
    } else {
        size
    }
}

/// A staging bounce's bytes for messages of up to `max` bytes.
fn bounce_bytes(args: &Args, max: usize) -> usize {
    max.max(wire_bytes(args, max.min(args.ll_max)))
}

/// Whether `args` stage GPU payloads through pinned bounces.
pub(crate) fn staged(args: &Args) -> bool {
    matches!(args.gpu_memory, Some((GpuMemoryPath::Staged, _)))
}

/// One rank's send and receive buffers of `args.mem`, registered with `pd`.
fn buffers(
    args: &Args,
    max: usize,
    rank: usize,
    pd: &gdasync::gdsync::ProtectionDomain,
) -> Result<[(u64, MemoryRegion<'static>); 2]> {
    Ok([
        Buf::new(args.mem, max, rank)?.leak_register(pd)?,
        Buf::new(args.mem, max, rank)?.leak_register(pd)?,
    ])
}

pub(crate) fn setup(dev: &Device, args: &Args, max: usize) -> Result<(Rank, Rank)> {
    let mk = |rank: usize| -> Result<Rank> {
        let pd = dev.alloc_pd();
        let (scq, rcq) = (dev.create_cq(1024)?, dev.create_cq(1024)?);
        let cfg = QpConfig {
            ringers: args.ringers,
            ..QpConfig::default()
        };
        let qp = pd.create_qp(&scq, &rcq, &cfg)?;
        let staged = staged(args)
            .then(|| Staged::new(max, bounce_bytes(args, max), rank, args.host_stream))
            .transpose()?;
        let [(reg_addr, sbuf), (rbuf_addr, rbuf)] = match &staged {
            Some(st) => [
                leak_register_bounce(&st.out, &pd)?,
                leak_register_bounce(&st.inb, &pd)?,
            ],
            None => buffers(args, max, rank, &pd)?,
        };
        let sbuf_addr = staged.as_ref().map_or(reg_addr, |st| st.sdev.addr());
        Ok(Rank {
            qp,
            _scq: scq,
            rcq,
            remote: rbuf.remote(),
            sbuf,
            sbuf_addr,
            rbuf,
            rbuf_addr,
            recvs: Vec::new(),
            staged,
        })
    };
    let (mut r0, mut r1) = (mk(0)?, mk(1)?);
    r0.qp.connect(&r1.qp.endpoint())?;
    r1.qp.connect(&r0.qp.endpoint())?;
    // Each rank writes into the other's receive buffer.
    std::mem::swap(&mut r0.remote, &mut r1.remote);
    Ok((r0, r1))
}

/// Both ranks of `args`, on its device, as the benchmark sets them up (for `--explain`).
pub(crate) fn explain_ranks(args: &Args) -> Result<[Rank; 2]> {
    let dev = crate::common::device::open(&args.device)?;
    let (r0, r1) = setup(&dev, args, args.max_size())?;
    Ok([r0, r1])
}

impl Rank {
    /// The marker word of a message of `size` bytes: the receive buffer's last 4 bytes.
    pub(crate) fn recv_word(&self, size: usize) -> u64 {
        self.rbuf_addr + size as u64 - 4
    }
    pub(crate) fn wr(&self, op: Op, size: usize, marker: u32, signalled: bool) -> SendWr {
        let mut wr = match op {
            Op::Write => SendWr::write(self.remote.at(0)),
            Op::WriteImm => SendWr::write_imm(self.remote.at(0), marker),
            Op::Send => SendWr::send(),
            // Rank 0's read of the peer's buffer into its send buffer (read.rs).
            Op::Read => SendWr::read(self.remote.at(0)),
        }
        .sge(self.sbuf.sge(..size));
        if !signalled {
            wr = wr.unsignaled();
        }
        wr
    }
    /// Prepares a send, waiting for ring space (retired by the stream's or kernel's waits).
    pub(crate) fn prepare(&mut self, wr: &SendWr) -> Result<gdasync::gdsync::PreparedSend> {
        let start = Instant::now();
        loop {
            match self.qp.prepare_send(wr) {
                Ok(p) => return Ok(p),
                Err(Error::RingFull { .. }) if start.elapsed() < TIMEOUT => {
                    std::thread::yield_now()
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    /// With staging, after a run of `iters` round trips: the last message rank `rank`
    /// received has reached its GPU memory (the copy in after its wait ran), else an error.
    fn check_staged(&self, size: usize, iters: u64, rank: usize) -> Result<()> {
        let (Some(st), true) = (&self.staged, iters > 0) else {
            return Ok(());
        };
        let want = (2 * iters - rank as u64) as u32;
        let mut got = [0u8; 4];
        st.rdev.read(size - 4, &mut got)?;
        let got = u32::from_ne_bytes(got);
        if got != want {
            bail!("rank {rank}: its GPU memory holds marker {got} after the run, not the last one received ({want}): the staged copy in after the wait did not land");
        }
        Ok(())
    }
    fn post_recv(&mut self, size: usize) -> Result<()> {
        let start = Instant::now();
        loop {
            match self.qp.post_recv(&RecvWr::new().sge(self.rbuf.sge(..size))) {
                Ok(t) => {
                    self.recvs.push(t);
                    return Ok(());
                }
                Err(Error::RingFull { .. }) if start.elapsed() < TIMEOUT => {
                    std::thread::yield_now()
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// An op list of one operation on the benchmark buffers (host or device memory, which the
/// list does not keep alive).
///
/// # Safety
/// The word `op` names must stay allocated until every stream that runs the list is done
/// with it: here it lies in a buffer leaked for the life of the process ([`Buf::leak_register`]).
unsafe fn raw(op: MemOp) -> Ops {
    let mut o = Ops::new();
    // SAFETY: the caller's obligation, passed on.
    unsafe { o.push_raw(op) };
    o
}

/// A write of the marker word at `addr` (the message's last 4 bytes), for a stream.
///
/// # Safety
/// As [`raw`]: `addr` lies in a leaked buffer.
pub(crate) unsafe fn marker_write(addr: u64, marker: u32) -> Ops {
    // SAFETY: the caller's obligation, passed on.
    unsafe {
        raw(MemOp::Write32 {
            addr,
            value: marker,
        })
    }
}

/// A wait for the marker word at `addr`.
///
/// # Safety
/// As [`raw`]: `addr` lies in a leaked buffer.
pub(crate) unsafe fn marker_wait(addr: u64, marker: u32) -> Ops {
    // SAFETY: the caller's obligation, passed on.
    unsafe {
        raw(MemOp::Wait32 {
            addr,
            value: marker,
            cond: WaitCond::Eq,
        })
    }
}

/// Joins both rank threads; rank 0's samples. When both failed, both errors are reported
/// (one rank's failure often makes the other time out: the first error alone may be that).
pub(crate) fn join_ranks(
    t0: std::thread::JoinHandle<Result<Vec<f64>>>,
    t1: std::thread::JoinHandle<Result<Vec<f64>>>,
) -> Result<Vec<f64>> {
    let r0 = t0
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("rank 0 panicked")));
    let r1 = t1
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("rank 1 panicked")));
    match (r0, r1) {
        (Ok(times), Ok(_)) => Ok(times),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(e0), Err(e1)) => bail!("rank 0: {e0:#}; rank 1: {e1:#}"),
    }
}

/// Runs every size; each size's figures go to `emit` as soon as they are measured.
pub(crate) fn run(args: &Args, emit: &mut dyn FnMut(Stats) -> Result<()>) -> Result<()> {
    if !args.host_stream {
        let c = Cuda::get().context("--trigger host|stream|kernel need a CUDA GPU")?;
        if c.gpus.is_empty() {
            bail!("--trigger {:?} needs a GPU; none found", args.trigger);
        }
    }
    let module = if args.trigger != Trigger::Stream {
        Some(Modules::compile(KERNELS, 2).context("the pingpong kernels")?)
    } else {
        None
    };
    let max = *args.sizes().iter().max().unwrap();
    let dev = crate::common::device::open(&args.device)?;
    for size in args.sizes() {
        let (warm, iters) = (args.warmup(size) as u64, args.iters(size) as u64);
        let (r0, r1) = setup(&dev, args, max)?;
        let cpu0 = cpu_time_us();
        let samples = match args.trigger {
            Trigger::Stream => stream_run(args, size, warm + iters, r0, r1)?,
            Trigger::Kernel => {
                kernel_run(args, size, warm + iters, r0, r1, module.as_ref().unwrap())?
            }
            Trigger::Host => host_run(
                args,
                size,
                warm + iters,
                r0,
                r1,
                &module.as_ref().unwrap().functions("step")?,
            )?,
            Trigger::Cpu => unreachable!(),
        };
        let cpu = (cpu_time_us() - cpu0) / (warm + iters) as f64;
        emit(Stats::new(size, samples[warm as usize..].to_vec(), cpu))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------- stream

/// How rank 0's CPU kept up with its stream, logged at the end of a stream loop
/// (`GDSYNC_LOG=info`): after each list was handed to the stream, how many lists the stream
/// had still to finish (near 0: the stream waited for the CPU), and how long the CPU took to
/// build and hand over the list.
#[derive(Default)]
pub(crate) struct KeepUp {
    ahead: Vec<u64>,
    enqueue_ns: Vec<u64>,
}

impl KeepUp {
    pub(crate) fn record(&mut self, lists: u64, done: u64, since: Instant) {
        self.ahead.push(lists.saturating_sub(done));
        self.enqueue_ns.push(since.elapsed().as_nanos() as u64);
    }

    pub(crate) fn log(mut self, api: &str) {
        let median = |v: &mut Vec<u64>| {
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        let (ahead, ns) = (median(&mut self.ahead), median(&mut self.enqueue_ns));
        tracing::info!(
            api,
            lists_ahead_p50 = ahead,
            enqueue_us_p50 = ns as f64 / 1e3,
            "pingpong: rank 0's CPU against its stream"
        );
    }
}

/// Timestamps rank 0's progress word as the CPU sees it advance: one sample per completed
/// iteration, half of it for a round trip (iterations seen together share the interval).
pub(crate) struct ProgressClock {
    pub(crate) seen: u64,
    pub(crate) last: Instant,
    pub(crate) times: Vec<f64>,
    /// What one iteration's interval is divided by: 2 for round trips, 1 for reads.
    per: f64,
}

impl ProgressClock {
    /// A clock of `iters` round trips, each sample half of one.
    pub(crate) fn half_round_trips(iters: u64) -> ProgressClock {
        ProgressClock {
            seen: 0,
            last: Instant::now(),
            times: Vec::with_capacity(iters as usize),
            per: 2.0,
        }
    }

    /// A clock of `iters` steps, each sample a whole one (a read's round trip).
    pub(crate) fn whole(iters: u64) -> ProgressClock {
        ProgressClock {
            per: 1.0,
            ..ProgressClock::half_round_trips(iters)
        }
    }

    pub(crate) fn observe(&mut self, done: u64) {
        if done > self.seen {
            let now = Instant::now();
            let dt = now.duration_since(self.last).as_secs_f64() * 1e6 / (done - self.seen) as f64;
            self.times.extend((self.seen..done).map(|_| dt / self.per));
            self.seen = done;
            self.last = now;
        }
    }

    /// An error once no round trip of `iters` has ended for [`TIMEOUT`].
    pub(crate) fn check_stall(&self, iters: u64) -> Result<()> {
        if self.last.elapsed() > TIMEOUT {
            bail!(
                "stream pingpong stalled at {}/{iters}: no round trip ended in {TIMEOUT:?}",
                self.seen
            );
        }
        Ok(())
    }
}

/// What a rank's stream runs each iteration, and where: the loop's constants.
pub(crate) struct StreamLoop {
    pub(crate) raw: bool,
    pub(crate) op: Op,
    pub(crate) size: usize,
    /// Each rank's marker word (the last 4 bytes of its receive buffer).
    pub(crate) words: [u64; 2],
    /// `--relay`: where `--raw`'s markers go instead of the peer's word.
    pub(crate) relay: Option<Arc<Relay>>,
    /// Rank 0's progress word (word 0), which its CPU timestamps.
    pub(crate) progress: SignalWords,
}

impl StreamLoop {
    fn ring_waits(&self) -> bool {
        !self.raw && self.op != Op::Write
    }

    /// Posts the receives that iterations up to `i` + 63 (of `iters`) wait for.
    pub(crate) fn post_recvs(&self, r: &mut Rank, i: u64, iters: u64) -> Result<()> {
        while self.ring_waits() && (r.recvs.len() as u64) < (i + 64).min(iters) {
            r.post_recv(self.size)?;
        }
        Ok(())
    }

    /// The parts of rank `rank`'s list `i`, named, in the order the stream runs them
    /// (pingpong --explain prints them). Each list begins with a wait: rank 1's for message
    /// `i`, rank 0's for the answer to message `i - 1`, so that the stream's step from one
    /// list to the next, which costs it more than an operation does (docs/benchmarks.md),
    /// falls while it waits rather than between a message's arrival and the answer. Then the
    /// marker written, the send committed (or, `--raw`, the marker stored into the peer's
    /// buffer), rank 0's progress word (round trips done, which its CPU timestamps), and
    /// every [`SIGNAL_EVERY`]th send's completion awaited. Rank 0 has one list more than `iters`
    /// iterations: the last answer's wait.
    /// Receives are posted by the CPU beforehand.
    pub(crate) fn parts(
        &self,
        r: &mut Rank,
        rank: usize,
        i: u64,
        iters: u64,
    ) -> Result<Vec<(&'static str, Ops)>> {
        let wait = |r: &Rank, j: u64| -> Result<(&'static str, Ops)> {
            Ok(if self.ring_waits() {
                // Its retirement (the CQ's consumer index) after the send that follows.
                let w = r.qp.recv_wait_ops(&r.recvs[j as usize])?;
                ("receive wait", w.retire_late())
            } else {
                let theirs = (2 * j + 2 - rank as u64) as u32;
                // SAFETY: the word lies in this rank's leaked receive buffer.
                ("marker wait", unsafe {
                    marker_wait(self.words[rank], theirs)
                })
            })
        };
        let mut parts = Vec::new();
        if rank == 1 {
            parts.push(wait(r, i)?);
        }
        if rank == 0 && i > 0 {
            parts.push(wait(r, i - 1)?);
        }
        if let (Some(st), false) = (&r.staged, parts.is_empty()) {
            // The message just awaited, out of the bounce into GPU memory.
            parts.push(("copy in", st.copy_in(self.size)));
        }
        if i < iters {
            self.send_parts(r, rank, i, &mut parts)?;
        }
        if rank == 0 && i > 0 {
            // After the send (the message does not wait for the clock), before the send's
            // completion is awaited (the clock does not wait for that).
            let at = parts.iter().position(|(n, _)| *n == "send wait");
            let progress = ("progress", self.progress.write64(0, i));
            parts.insert(at.unwrap_or(parts.len()), progress);
        }
        Ok(parts)
    }

    /// The send of iteration `i` of rank `rank` (see [`parts`](Self::parts)).
    fn send_parts(
        &self,
        r: &mut Rank,
        rank: usize,
        i: u64,
        parts: &mut Vec<(&'static str, Ops)>,
    ) -> Result<()> {
        let mine = (2 * i + 1 + rank as u64) as u32;
        if let (true, Some(relay)) = (self.raw, &self.relay) {
            let w = relay.words().write32(Relay::slot(rank), mine);
            parts.push(("marker to the relay", w));
            return Ok(());
        }
        if self.raw {
            // SAFETY: the word lies in the peer's leaked receive buffer.
            let w = unsafe { marker_write(self.words[1 - rank], mine) };
            parts.push(("marker to peer", w));
            return Ok(());
        }
        let out_word = r.sbuf_addr + self.size as u64 - 4;
        // SAFETY: the word lies in this rank's leaked send buffer.
        parts.push(("marker", unsafe { marker_write(out_word, mine) }));
        if let Some(st) = &r.staged {
            parts.push(("copy out", st.copy_out(self.size)));
        }
        let sig = i % SIGNAL_EVERY == SIGNAL_EVERY - 1;
        let wr = r.wr(self.op, self.size, mine, sig);
        let p = r.prepare(&wr)?;
        let (t, commit) = r.qp.commit(p)?;
        parts.push(("commit", commit));
        if sig {
            parts.push(("send wait", r.qp.send_wait_ops(&t)?));
        }
        Ok(())
    }

    /// Rank `rank`'s list for iteration `i`, posting the receives it waits for first.
    fn list(&self, r: &mut Rank, rank: usize, i: u64, iters: u64) -> Result<Ops> {
        self.post_recvs(r, i, iters)?;
        let mut ops = Ops::new();
        for (_, part) in self.parts(r, rank, i, iters)? {
            ops.append(part);
        }
        Ok(ops)
    }
}

/// Each rank's CPU thread enqueues its iterations on its own stream, a few ahead; rank 0's
/// stream bumps a progress word after each round trip, which its CPU timestamps.
fn stream_run(args: &Args, size: usize, iters: u64, r0: Rank, r1: Rank) -> Result<Vec<f64>> {
    let words = [
        r0.rbuf_addr + size as u64 - 4,
        r1.rbuf_addr + size as u64 - 4,
    ];
    let relay = args.relay.then(|| Relay::start(words)).transpose()?;
    let lp = Arc::new(StreamLoop {
        raw: args.raw,
        op: args.op,
        size,
        words,
        relay: relay.map(Arc::new),
        progress: SignalWords::new(2),
    });
    let barrier = Arc::new(Barrier::new(2));
    let host_stream = args.host_stream;
    // A rank's queues outlive both threads: rank 1's last message may still be on its way
    // when its stream is done (a QP destroyed then would lose it).
    let keep = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |rank: usize, r: Rank, barrier: Arc<Barrier>, lp: Arc<StreamLoop>| {
        let keep = keep.clone();
        std::thread::spawn(move || -> Result<Vec<f64>> {
            let mut r = r;
            let run = if host_stream {
                let stream = HostStream::new()?;
                stream_rank(rank, &mut r, &lp, iters, &barrier, &stream, || {
                    Ok(stream.synchronize()?)
                })
            } else {
                let stream = CudaStream::new(gpus::of(rank))?;
                stream_rank(rank, &mut r, &lp, iters, &barrier, &stream, || {
                    Ok(stream.synchronize_within(TIMEOUT)?)
                })
                .map_err(|e| stalled_where(rank, &stream, e))
            };
            keep.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            run
        })
    };
    let t1 = spawn(1, r1, barrier.clone(), lp.clone());
    let t0 = spawn(0, r0, barrier, lp);
    join_ranks(t0, t1)
}

/// `e` with where `stream` sits: the first wait it has not passed, or none (idle, or held
/// by a copy or a kernel); rank 0's also says what the soft engines hold (once per run: the
/// engines serve both ranks).
fn stalled_where(rank: usize, stream: &CudaStream, e: anyhow::Error) -> anyhow::Error {
    let e = match rank {
        0 => match gdasync::gdsync::soft_engines_report() {
            engines if engines.is_empty() => e,
            engines => e.context(engines.join(" / ")),
        },
        _ => e,
    };
    match stream.unmet_wait_report() {
        Some(r) => e.context(r),
        None => e.context("its stream waits on no word: idle, or held by a copy or a kernel"),
    }
}

/// One rank of [`stream_run`] on `stream` (`sync` waits until it has run everything).
fn stream_rank<E: Executor>(
    rank: usize,
    r: &mut Rank,
    lp: &StreamLoop,
    iters: u64,
    barrier: &Barrier,
    stream: &E,
    sync: impl FnOnce() -> Result<()>,
) -> Result<Vec<f64>> {
    barrier.wait();
    let mut clock = ProgressClock::half_round_trips(iters);
    // Rank 0's last list waits for the last answer.
    let lists = if rank == 0 { iters + 1 } else { iters };
    let mut keep_up = KeepUp::default();
    for i in 0..lists {
        let t = Instant::now();
        stream.submit(lp.list(r, rank, i, iters)?)?;
        if rank == 0 {
            keep_up.record(i + 1, lp.progress.load64(0), t);
        }
        // Stay at most AHEAD iterations ahead; rank 0 timestamps progress meanwhile.
        loop {
            let done = if rank == 0 {
                lp.progress.load64(0)
            } else {
                i.saturating_sub(AHEAD)
            };
            if rank == 0 {
                clock.observe(done);
            }
            if rank == 1 || done + AHEAD > i || i + 1 >= iters {
                break;
            }
            clock.check_stall(iters)?;
            std::hint::spin_loop();
        }
    }
    while rank == 0 && clock.seen < iters {
        clock.observe(lp.progress.load64(0));
        clock.check_stall(iters)?;
    }
    if rank == 0 {
        keep_up.log("gdsync");
    }
    sync()?;
    r.rcq.check()?;
    r.check_staged(lp.size, iters, rank)?;
    Ok(clock.times)
}

// ---------------------------------------------------------------------------- kernel

/// One persistent kernel per rank runs every iteration; each rank's CPU keeps its descriptor
/// ring filled (sends, waits for signalled sends, waits for receives) and its receives posted.
fn kernel_run(
    args: &Args,
    size: usize,
    iters: u64,
    r0: Rank,
    r1: Rank,
    m: &Modules,
) -> Result<Vec<f64>> {
    let f = m.functions("pp")?;
    let staged_fns = r0
        .staged
        .is_some()
        .then(|| m.functions("pp_staged"))
        .transpose()?;
    let times = PinnedBuffer::new(iters as usize * 8);
    let rcs = SignalWords::new(2);
    let words = [
        r0.rbuf_addr + size as u64 - 4,
        r1.rbuf_addr + size as u64 - 4,
    ];
    let ring_waits = !args.raw && args.op != Op::Write;
    let (raw, op) = (args.raw, args.op);
    // Kept until the kernels are done (the streams are synchronised before it is dropped).
    let relay = args.relay.then(|| Relay::start(words)).transpose()?;
    let streams = [CudaStream::new(gpus::of(0))?, CudaStream::new(gpus::of(1))?];
    let mut rings = [DescRing::new(64), DescRing::new(64)];
    let ranks = [r0, r1];
    for rank in 0..2 {
        let r = &ranks[rank];
        let out_word = if let Some(relay) = &relay {
            relay.words().gpu_addr(Relay::slot(rank))
        } else if raw {
            words[1 - rank]
        } else {
            r.sbuf_addr + size as u64 - 4
        };
        let ring = rings[rank].device_desc();
        let (rank_i, n, sig, rw, rawi) = (
            rank as i32,
            iters,
            SIGNAL_EVERY,
            ring_waits as i32,
            raw as i32,
        );
        let (my, outw, tms, to, rc) = (
            words[rank],
            out_word,
            times.addr(),
            KERNEL_WAIT_NS,
            rcs.addr(rank),
        );
        if let (Some(st), Some(fs)) = (&r.staged, &staged_fns) {
            let (sdev, outb, rdev, inb) = (
                st.sdev.addr(),
                st.out.bounce().gpu_addr(),
                st.rdev.addr(),
                st.inb.bounce().gpu_addr(),
            );
            let (size, ll) = (size as u64, i32::from(travels_as_ll(args, size)));
            let mut l = fs[rank].launch_builder(&streams[rank]);
            l.arg(&ring).arg(&rank_i).arg(&n).arg(&sig).arg(&rw);
            l.arg(&my).arg(&sdev).arg(&outb).arg(&rdev).arg(&inb);
            l.arg(&size).arg(&tms).arg(&to).arg(&rc).arg(&ll);
            // SAFETY: the parameters match `pp_staged`; rings, words, bounces and GPU
            // buffers outlive the kernels (both streams are synchronised before the ranks
            // are dropped).
            unsafe { l.launch(1, STAGING_THREADS)? };
            continue;
        }
        let mut l = f[rank].launch_builder(&streams[rank]);
        l.arg(&ring).arg(&rank_i).arg(&n).arg(&sig).arg(&rw);
        l.arg(&rawi).arg(&my).arg(&outw).arg(&tms).arg(&to);
        l.arg(&rc);
        // SAFETY: the parameters match `pp`; rings, words and buffers outlive the kernels
        // (both streams are synchronised before they are dropped).
        unsafe { l.launch(1, 32)? };
    }
    if !raw {
        // Feed both rings from this thread, in the order each kernel consumes them.
        let [mut a, mut b] = ranks;
        let mut posted = [0u64; 2];
        for i in 0..iters {
            for rank in [1usize, 0] {
                let (r, ring) = if rank == 0 {
                    (&mut a, &mut rings[0])
                } else {
                    (&mut b, &mut rings[1])
                };
                while ring_waits && posted[rank] < (i + 64).min(iters) {
                    r.post_recv(size)?;
                    posted[rank] += 1;
                }
                for (_, d) in kernel_descs(r, op, wire_bytes(args, size), rank, i)? {
                    match d {
                        KernelDesc::Send(ops) => ring.push_send(ops, TIMEOUT)?,
                        KernelDesc::Wait(ops) => ring.push_wait(ops, TIMEOUT)?,
                    };
                }
            }
        }
        for s in &streams {
            s.synchronize()?;
        }
        a.rcq.check()?;
        b.rcq.check()?;
        a.check_staged(size, iters, 0)?;
        b.check_staged(size, iters, 1)?;
    } else {
        for s in &streams {
            s.synchronize()?;
        }
    }
    if rcs.load32(0) != 1 || rcs.load32(1) != 1 {
        bail!(
            "a pingpong kernel failed (return codes {} {}; 1 = done)",
            rcs.load32(0),
            rcs.load32(1)
        );
    }
    Ok(kernel_half_rtts(&times, iters))
}

/// The threads of `pp_staged`'s block, which copy staged payloads together.
pub(crate) const STAGING_THREADS: u32 = 256;

/// A descriptor a rank's CPU pushes for its kernel: a send's commit or a completion wait.
pub(crate) enum KernelDesc {
    Send(Ops),
    Wait(Ops),
}

/// The descriptors rank `rank`'s CPU pushes for iteration `i` of its kernel, named, in the
/// order the kernel consumes them (pingpong --explain prints them): the receive awaited
/// (rank 1, `--op write-imm|send`), the send's commit, every [`SIGNAL_EVERY`]th send's
/// completion, the receive awaited (rank 0). `--op write` waits on the marker in the kernel.
pub(crate) fn kernel_descs(
    r: &mut Rank,
    op: Op,
    size: usize,
    rank: usize,
    i: u64,
) -> Result<Vec<(&'static str, KernelDesc)>> {
    let ring_waits = op != Op::Write;
    let mut descs = Vec::new();
    let mine = (2 * i + 1 + rank as u64) as u32;
    if rank == 1 && ring_waits {
        let w = r.qp.recv_wait_ops(&r.recvs[i as usize])?;
        descs.push(("receive wait", KernelDesc::Wait(w)));
    }
    let sig = i % SIGNAL_EVERY == SIGNAL_EVERY - 1;
    let wr = r.wr(op, size, mine, sig);
    let p = r.prepare(&wr)?;
    let (t, commit) = r.qp.commit(p)?;
    descs.push(("send", KernelDesc::Send(commit)));
    if sig {
        descs.push(("send wait", KernelDesc::Wait(r.qp.send_wait_ops(&t)?)));
    }
    if rank == 0 && ring_waits {
        let w = r.qp.recv_wait_ops(&r.recvs[i as usize])?;
        descs.push(("receive wait", KernelDesc::Wait(w)));
    }
    Ok(descs)
}

/// Rank 0's kernel stamps the GPU's global timer after each round trip into `times`; one
/// sample per iteration is half the time since the previous stamp (the first iteration, with
/// no stamp before it, gets the second's).
pub(crate) fn kernel_half_rtts(times: &PinnedBuffer, iters: u64) -> Vec<f64> {
    kernel_intervals_us(times, iters)
        .into_iter()
        .map(|t| t / 2.0)
        .collect()
}

/// The time in µs between consecutive stamps of the GPU's global timer in `times` (the
/// first iteration, with no stamp before it, gets the second's).
pub(crate) fn kernel_intervals_us(times: &PinnedBuffer, iters: u64) -> Vec<f64> {
    let mut t = vec![0u8; iters as usize * 8];
    times.read_at(0, &mut t);
    let ns: Vec<u64> = t
        .chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    let mut us: Vec<f64> = ns
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64 / 1000.0)
        .collect();
    us.insert(0, us.first().copied().unwrap_or(0.0));
    us
}

// ---------------------------------------------------------------------------- host

/// GPU in the loop, CPU-driven: each rank launches a GPU step and synchronises, then posts
/// from the CPU and polls from the CPU (the MPI-style baseline).
fn host_run(
    args: &Args,
    size: usize,
    iters: u64,
    r0: Rank,
    r1: Rank,
    step: &[Function; 2],
) -> Result<Vec<f64>> {
    let barrier = Arc::new(Barrier::new(2));
    let (raw, op, mem) = (args.raw, args.op, args.mem);
    let words = [
        r0.rbuf_addr + size as u64 - 4,
        r1.rbuf_addr + size as u64 - 4,
    ];
    let spawn = |rank: usize, mut r: Rank, barrier: Arc<Barrier>| {
        let step = step[rank].clone();
        std::thread::spawn(move || -> Result<Vec<f64>> {
            let stream = CudaStream::new(gpus::of(rank))?;
            let mut times = Vec::with_capacity(iters as usize);
            let recv_op = !raw && op != Op::Write;
            if recv_op {
                for _ in 0..64 {
                    r.post_recv(size)?;
                }
            }
            let read_word = |r: &Rank, addr: u64| -> u32 {
                let mut b = [0u8; 4];
                if raw && mem == Mem::Host {
                    // SAFETY: pinned host memory leaked for the process's life.
                    return unsafe { std::ptr::read_volatile(addr as *const u32) };
                }
                let off = (addr - r.rbuf_addr) as usize;
                r.rbuf.read_at(off, &mut b);
                u32::from_ne_bytes(b)
            };
            let wait = |r: &mut Rank, marker: u32| -> Result<()> {
                let start = Instant::now();
                loop {
                    if recv_op {
                        if let Some(c) = r.rcq.poll_one()? {
                            c.ok()?;
                            return r.post_recv(size);
                        }
                    } else if read_word(r, words[rank]) == marker {
                        return Ok(());
                    }
                    if start.elapsed() > TIMEOUT {
                        bail!("host pingpong: no message {marker}");
                    }
                }
            };
            barrier.wait();
            let mut t0 = Instant::now();
            for i in 0..iters {
                let (mine, theirs) = (
                    (2 * i + 1 + rank as u64) as u32,
                    (2 * i + 2 - rank as u64) as u32,
                );
                if rank == 1 {
                    wait(&mut r, theirs)?;
                    host_copy_in(&r, &stream, size)?;
                }
                // The GPU step that produces the data, then the CPU sends.
                // SAFETY: `step` takes no parameters.
                unsafe { step.launch_builder(&stream).launch(1, 1)? };
                stream.synchronize()?;
                if raw {
                    // SAFETY: pinned host memory leaked for the process's life (--raw host only).
                    unsafe { std::ptr::write_volatile(words[1 - rank] as *mut u32, mine) };
                } else {
                    host_message(&r, &stream, size, mine)?;
                    let sig = i % SIGNAL_EVERY == SIGNAL_EVERY - 1;
                    let wr = r.wr(op, size, mine, sig);
                    r.qp.post_send(&wr)?;
                    while sig && r._scq.poll_one()?.is_none() {}
                }
                if rank == 0 {
                    wait(&mut r, theirs)?;
                    host_copy_in(&r, &stream, size)?;
                    let now = Instant::now();
                    times.push(now.duration_since(t0).as_secs_f64() * 1e6 / 2.0);
                    t0 = now;
                }
            }
            r.check_staged(size, iters, rank)?;
            Ok(times)
        })
    };
    if raw && mem == Mem::Device {
        bail!("--trigger host --raw needs --mem host (the CPU stores to the peer's buffer)");
    }
    let t1 = spawn(1, r1, barrier.clone());
    let t0 = spawn(0, r0, barrier);
    join_ranks(t0, t1)
}

/// `--trigger host`: the message of `size` bytes with `marker` in its last 4, where the send
/// reads it: written into the send buffer, or, staged, into GPU memory and copied out into
/// the send bounce on `stream` (synchronously, as a CPU-driven loop does).
fn host_message(r: &Rank, stream: &CudaStream, size: usize, marker: u32) -> Result<()> {
    let m = marker.to_ne_bytes();
    let Some(st) = &r.staged else {
        r.sbuf.write_at(size - 4, &m);
        return Ok(());
    };
    st.sdev.write(size - 4, &m)?;
    stream.submit(st.copy_out(size))?;
    Ok(stream.synchronize()?)
}

/// `--trigger host`, staged: the message received, out of the receive bounce into GPU memory
/// on `stream`, synchronously.
fn host_copy_in(r: &Rank, stream: &CudaStream, size: usize) -> Result<()> {
    if let Some(st) = &r.staged {
        stream.submit(st.copy_in(size))?;
        stream.synchronize()?;
    }
    Ok(())
}
