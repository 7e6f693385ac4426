//! Staged GPU payloads for `bandwidth --mem device` (RDMA writes, every trigger), where the
//! device cannot DMA GPU memory.
//!
//! A message is cut into chunks over a ring of pinned host bounces per rank
//! ([`ChunkPlan`]). For each chunk rank 0 waits until the chunk that last used the bounce is
//! credited, copies the chunk out of its GPU buffer into the bounce, and writes the bounce with
//! an immediate (the chunk's sequence number) into the same bounce of rank 1. Rank 1's CPU, a
//! thread of its own, polls for each chunk, has its own stream copy it into its GPU buffer,
//! and once that copy is done writes the count of chunks copied (the credit) into a word of
//! rank 0's memory. So a bounce is reused on either side only once its chunk has left it, and
//! while one chunk is on the wire the next is copied out and the previous copied in.
//!
//! The copies run in the trigger's own order: `--trigger stream` enqueues the credit wait,
//! the copy (a copy kernel on the stream) and the doorbell on one CUDA stream; `--trigger cpu`
//! waits on the CPU, waits for a CUDA copy, and rings; `--trigger kernel` runs all of rank 0
//! in one persistent kernel per phase (`kstaged.rs`: the block copies, thread 0 waits and
//! rings), with the same rank 1. With `--host-stream`, pinned host
//! memory stands in for GPU memory and CPU threads run every copy, to test the pipeline where
//! there is no GPU.

use super::kstaged::KernelPush;
use super::{exit_now, prepare, usage, Args, Link, Measured, Op, Plan, Responder, Stall, TIMEOUT};
use crate::common::device::gpu_memory_path;
use crate::common::payload::Payload;
use crate::common::{Mem, Staging as StagingArg, Trigger};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{Cuda, CudaStream};
use gdasync::gdsync::exec::{Executor, HostExecutor, HostStream};
use gdasync::gdsync::ops::{Ops, WaitCond};
use gdasync::gdsync::staging::Staging;
use gdasync::gdsync::{
    Access, ChunkPlan, DeviceName, Error, GpuMemoryPath, MemoryRegion, PinnedBuffer, Qp, RecvWr,
    RemoteBuf, SendTicket, SendWr, SignalWords,
};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Instant;

/// Bounces per rank unless told otherwise: enough that a copy out, a write and a copy in
/// overlap with room for one late credit.
const DEFAULT_BOUNCES: usize = 4;
/// Bytes per chunk unless `--chunk` says: each chunk pays a fixed cost on its trigger (a
/// stream's step between memory operations and a copy, or the CPU's wait for its copy), about
/// 15 µs on an H200, so bandwidth wants chunks larger than the latency paths' bounces
/// (docs/benchmarks.md, "Bandwidth and message rate").
const DEFAULT_CHUNK: usize = 1 << 20;
/// Most bounces per rank (each is a chunk of pinned memory).
const MAX_BOUNCES: usize = 64;
/// Largest chunk.
const MAX_CHUNK: usize = 64 << 20;

/// The pipeline's shape.
pub(crate) struct Stage {
    /// Bytes per chunk (the bounce size).
    pub chunk: usize,
    /// Bounces per rank.
    pub bounces: usize,
}

/// The path GPU payloads take (`None` for host memory), chosen as pingpong chooses it
/// (`--staging`, else GDSYNC_STAGING, else staged where the device cannot DMA GPU memory),
/// for what this tool stages: RDMA writes, from every trigger. Reads and sends run direct.
pub(crate) fn gpu_memory(
    a: &Args,
    device: &DeviceName,
    gpu0: i32,
) -> Result<Option<(GpuMemoryPath, String)>> {
    if a.mem != Mem::Device {
        if a.staging.is_some() {
            return Err(usage("--staging applies to --mem device"));
        }
        return Ok(None);
    }
    let asked = a.staging.and_then(StagingArg::asked);
    if a.op != Op::Write {
        if asked == Some(GpuMemoryPath::Staged) || a.host_stream {
            return Err(usage("staging covers --op write: use it, or --staging off"));
        }
        let why = "this tool stages RDMA writes only";
        return Ok(Some((GpuMemoryPath::Direct, why.into())));
    }
    if a.host_stream && a.trigger == Trigger::Kernel {
        return Err(usage("--host-stream stands in for the GPU on the cpu and stream triggers: the kernel trigger needs a GPU"));
    }
    let path = if a.host_stream {
        GpuMemoryPath::choose_soft(asked)?
    } else {
        gpu_memory_path(device, gpu0, asked)?
    };
    if a.host_stream && path.0 == GpuMemoryPath::Direct {
        return Err(usage("--host-stream --mem device runs staged only (host memory stands in for the GPU's): drop --staging off"));
    }
    Ok(Some(path))
}

impl Stage {
    /// The shape asked for where GPU payloads are staged; `--chunk`, `--bounces` and
    /// `--check` are refused elsewhere.
    pub(crate) fn new(a: &Args, path: Option<&(GpuMemoryPath, String)>) -> Result<Option<Stage>> {
        if path.map(|p| p.0) != Some(GpuMemoryPath::Staged) {
            if a.chunk.is_some() || a.bounces.is_some() || a.check {
                return Err(usage("--chunk, --bounces and --check apply to staged GPU payloads (--mem device --op write)"));
            }
            return Ok(None);
        }
        if a.duration.is_some() {
            return Err(usage(
                "--duration does not apply to staged GPU payloads: use --iters",
            ));
        }
        let chunk = a.chunk.unwrap_or(DEFAULT_CHUNK);
        if chunk == 0 || chunk > MAX_CHUNK {
            return Err(usage(format!("--chunk must be 1 to {MAX_CHUNK} bytes")));
        }
        let bounces = a.bounces.unwrap_or(DEFAULT_BOUNCES);
        if !(2..=MAX_BOUNCES).contains(&bounces) {
            return Err(usage(format!("--bounces must be 2 to {MAX_BOUNCES}")));
        }
        Ok(Some(Stage { chunk, bounces }))
    }
    /// The plan of one `size`-byte message whose first chunk is chunk `first` of the stream.
    fn plan(&self, size: usize, first: usize) -> ChunkPlan {
        ChunkPlan::new(size, self.chunk, self.bounces)
            .expect("chunk and bounces are checked non-zero")
            .starting_at(first)
    }
}

/// Runs copies, and the stream trigger's whole chunk lists: a CUDA stream, or a host stream
/// where host memory stands in for GPU memory.
enum Lane {
    Gpu(CudaStream),
    Host(HostStream),
}

impl Lane {
    fn new(plan: &Plan, rank: usize) -> Result<Lane> {
        Ok(if plan.host_stream {
            Lane::Host(HostStream::with_timeout(TIMEOUT)?)
        } else {
            Lane::Gpu(CudaStream::new(plan.gpu(rank))?)
        })
    }
    fn submit(&self, ops: Ops) -> Result<()> {
        match self {
            Lane::Gpu(s) => s.submit(ops)?,
            Lane::Host(s) => s.submit(ops)?,
        }
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        match self {
            Lane::Gpu(s) => s.synchronize()?,
            Lane::Host(s) => s.synchronize()?,
        }
        Ok(())
    }
}

/// One chunk's work on rank 0, in order: wait for the bounce, copy into it, ring.
struct Step {
    before: Ops,
    copy: Ops,
    post: Ops,
}

/// Rank 0: its QP, bounces, payload and the credit word rank 1 writes.
struct Sender<'a, 'b> {
    qp: &'a mut Qp,
    bounce: &'a MemoryRegion<'b>,
    remote: RemoteBuf,
    st: &'a Staging,
    src: &'a Payload,
    credit: &'a PinnedBuffer,
    /// Chunks sent since the start.
    seq: usize,
    /// The signalled writes not yet waited for, oldest first, with their chunks' sequence
    /// numbers. One write in `bounces` is signalled: the credits already say when a bounce is
    /// free, the completions only retire the send ring (one wait fewer per chunk on a stream).
    writes: VecDeque<(usize, SendTicket)>,
    /// Chunks known credited (by the last drain): their bounces need no wait.
    drained: usize,
}

impl Sender<'_, '_> {
    /// `n` messages of `size` bytes, each chunk's step handed to `run`.
    fn phase(
        &mut self,
        stage: &Stage,
        size: usize,
        n: u64,
        run: &mut dyn FnMut(Step) -> Result<()>,
    ) -> Result<()> {
        for _ in 0..n {
            let plan = stage.plan(size, self.seq);
            for c in plan.chunks() {
                let before = match plan.must_be_credited(c.index) {
                    Some(old) => self.reuse(old)?,
                    None => Ops::new(),
                };
                let copy = self.src.copy(self.st, c.bounce, c.offset, c.len, true);
                let off = self.st.slot_off(c.bounce);
                let signalled = (c.seq + 1) % stage.bounces == 0;
                let wr = SendWr::write_imm(self.remote.at(off as u64), c.seq as u32)
                    .sge(self.bounce.sge(off..off + c.len));
                let wr = if signalled { wr } else { wr.unsignaled() };
                let p = prepare(self.qp, &wr)?;
                let (t, post) = self.qp.commit(p).map_err(Error::from)?;
                if signalled {
                    self.writes.push_back((c.seq, t));
                }
                run(Step { before, copy, post })?;
            }
            self.seq += plan.count();
        }
        Ok(())
    }

    /// Ops: wait until chunk `old` is credited (its bounce is free on both sides) and, where
    /// its write was signalled, retire it (done, since rank 1 copied what it carried).
    /// Nothing where a drain did it.
    fn reuse(&mut self, old: usize) -> Result<Ops> {
        if old < self.drained {
            return Ok(Ops::new());
        }
        let mut o = self.credit.wait64(0, old as u64 + 1, WaitCond::Geq);
        if self.writes.front().is_some_and(|w| w.0 == old) {
            let (_, t) = self.writes.pop_front().context("no write in flight")?;
            o.append(self.qp.send_wait_ops(&t)?);
        }
        Ok(o)
    }

    /// Ops: wait until every chunk sent is credited, and retire every write.
    fn drain(&mut self) -> Result<Ops> {
        self.drained = self.seq;
        let mut o = self.credit.wait64(0, self.seq as u64, WaitCond::Geq);
        for (_, t) in self.writes.drain(..) {
            o.append(self.qp.send_wait_ops(&t)?);
        }
        Ok(o)
    }
}

/// Rank 1: its QP (receives, credit writes), bounces and payload.
struct Receiver<'a, 'b> {
    rx: &'a mut Responder<'b>,
    st: &'a Staging,
    dst: &'a Payload,
    /// Rank 0's credit word, and the registered word rank 1 writes it from.
    credit: RemoteBuf,
    credit_src: &'a MemoryRegion<'b>,
    credit_buf: &'a PinnedBuffer,
    lane: Lane,
    /// Word 0: chunks copied in since the start (the lane stores it after each copy).
    copied: SignalWords,
    /// Chunks arrived since the start, and the count last credited.
    seq: usize,
    credited: u64,
    bounces: usize,
    /// `--slow-copy-in`: a pause before each copy in (a test of the credits).
    slow: Option<std::time::Duration>,
}

impl Receiver<'_, '_> {
    /// Keeps a receive posted for every bounce rank 0 may fill (writes with immediate
    /// consume one each).
    fn keep_posted(&mut self) -> Result<()> {
        while self.rx.posted < (self.seq + self.bounces) as u64 {
            self.rx.qp.post_recv(&RecvWr::new())?;
            self.rx.posted += 1;
        }
        Ok(())
    }

    /// `n` messages of `size` bytes: each chunk copied in as it arrives and credited once
    /// copied.
    fn phase(&mut self, stage: &Stage, size: usize, n: u64) -> Result<()> {
        let count = stage.plan(size, 0).count();
        let start = self.seq;
        let end = n as usize * count + start;
        let mut stall = Stall::new();
        while self.credited < end as u64 {
            while self.seq < end {
                let Some(c) = self.rx.cq.poll_one()? else {
                    break;
                };
                let c = c.ok().context("rank 1: a chunk or a credit failed")?;
                let Some(imm) = c.imm else {
                    continue; // a credit write's completion
                };
                if imm != self.seq as u32 {
                    bail!(
                        "rank 1: chunk {imm} arrived where chunk {} was due",
                        self.seq as u32
                    );
                }
                // The first chunk of the message this chunk belongs to.
                let first = self.seq - (self.seq - start) % count;
                let chunk = stage
                    .plan(size, first)
                    .get(self.seq - first)
                    .context("chunk")?;
                // The next receive first: receives only count arrivals, the credits after
                // the copies are what keep rank 0 off a bounce not yet copied.
                self.seq += 1;
                self.keep_posted()?;
                if let Some(d) = self.slow {
                    std::thread::sleep(d);
                }
                let mut copy = self
                    .dst
                    .copy(self.st, chunk.bounce, chunk.offset, chunk.len, false);
                copy.append(self.copied.write64(0, self.seq as u64));
                self.lane.submit(copy)?;
            }
            self.credit()?;
            stall.check(self.seq as u64 + self.credited, "rank 1: chunks and copies")?;
        }
        Ok(())
    }

    /// Credits what was copied in since the last credit: the count, written into rank 0's
    /// credit word (inline: the bytes are taken when posted).
    fn credit(&mut self) -> Result<()> {
        let done = self.copied.load64(0);
        if done > self.credited {
            self.credit_buf.write_at(0, &done.to_ne_bytes());
            let wr = SendWr::write(self.credit.at(0))
                .sge(self.credit_src.sge(..8))
                .inline();
            self.rx.qp.post_send(&wr)?;
            self.credited = done;
        }
        Ok(())
    }
}

/// The pattern rank 0 sends: byte `i` of the payload (not periodic at any power of 2, so a
/// chunk landing at another chunk's offset shows).
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i / 251) as u8)
        .collect()
}

/// `--check`: the first `size` bytes of rank 1's payload are rank 0's pattern; then clears
/// them for the next size.
fn check(dst: &Payload, size: usize) -> Result<()> {
    let mut got = vec![0u8; size];
    dst.read(0, &mut got)?;
    let want = pattern(size);
    if let Some(i) = (0..size).find(|&i| got[i] != want[i]) {
        bail!(
            "--check: after {size}-byte messages the receiver's byte {i} is {:#04x}, the sender's {:#04x}",
            got[i],
            want[i]
        );
    }
    dst.write(0, &vec![0u8; size])
}

/// Rank 0's driver: what runs each step and the drain, and waits for the drain.
enum Driver {
    /// The stream trigger: everything on one lane.
    Stream {
        lane: Lane,
        progress: SignalWords,
        drains: u64,
    },
    /// The cpu trigger: waits and doorbells on this thread, copies on a lane, waited for.
    Cpu { host: HostExecutor, copies: Lane },
}

impl Driver {
    fn new(plan: &Plan) -> Result<Driver> {
        let lane = Lane::new(plan, 0)?;
        Ok(match plan.trigger {
            Trigger::Stream => Driver::Stream {
                lane,
                progress: SignalWords::new(1),
                drains: 0,
            },
            _ => Driver::Cpu {
                host: HostExecutor::with_timeout(TIMEOUT),
                copies: lane,
            },
        })
    }
    fn step(&self, s: Step) -> Result<()> {
        match self {
            Driver::Stream { lane, .. } => {
                let mut o = s.before;
                o.append(s.copy);
                o.append(s.post);
                lane.submit(o)
            }
            Driver::Cpu { host, copies } => {
                host.run(&s.before)?;
                copies.submit(s.copy)?;
                copies.synchronize()?;
                Ok(host.run(&s.post)?)
            }
        }
    }
    /// Runs `drain` and returns once it is done, or fails with what rank 1 reports.
    fn finish(&mut self, drain: Ops, done: &mpsc::Receiver<Result<()>>) -> Result<()> {
        let (lane, progress, drains) = match self {
            Driver::Cpu { host, .. } => {
                host.run(&drain)?;
                return done
                    .recv_timeout(TIMEOUT)
                    .context("rank 1 did not finish")?;
            }
            Driver::Stream {
                lane,
                progress,
                drains,
            } => (lane, progress, drains),
        };
        *drains += 1;
        let mut o = drain;
        o.append(progress.write64(0, *drains));
        lane.submit(o)?;
        let (mut stall, mut rank1) = (Stall::new(), false);
        while !rank1 || progress.load64(0) != *drains {
            if let Ok(r) = done.try_recv() {
                r?;
                rank1 = true;
            }
            stall.check(
                progress.load64(0) + rank1 as u64,
                "the stream's waits for credits",
            )?;
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Rank 0, by trigger: the host-driven pipeline (cpu, stream) or the staged kernel.
enum Rank0<'a, 'b> {
    Host { tx: Sender<'a, 'b>, driver: Driver },
    Kernel(KernelPush<'a>),
}

impl Rank0<'_, '_> {
    /// `n` messages of `size` bytes, returning once rank 1 credited every chunk (or with the
    /// first failure of either rank).
    fn phase(
        &mut self,
        stage: &Stage,
        size: usize,
        n: u64,
        done: &mpsc::Receiver<Result<()>>,
    ) -> Result<()> {
        match self {
            Rank0::Host { tx, driver } => {
                tx.phase(stage, size, n, &mut |s| driver.step(s))?;
                driver.finish(tx.drain()?, done)
            }
            Rank0::Kernel(k) => k.phase(size, n, done),
        }
    }
}

/// Rank 1's thread: one phase per job until the jobs end or a phase fails; every phase's
/// result goes back on `done`.
fn serve(
    mut r: Receiver,
    stage: &Stage,
    jobs: mpsc::Receiver<(usize, u64)>,
    done: mpsc::Sender<Result<()>>,
) {
    if let Err(e) = r.keep_posted() {
        return drop(done.send(Err(e)));
    }
    for (size, n) in jobs {
        let res = r.phase(stage, size, n);
        let failed = res.is_err();
        if done.send(res).is_err() || failed {
            return;
        }
    }
}

/// Every size: `one` runs the warm-up, then the timed messages (and `--check`); a failure
/// ends the process at once, since queued work still names the buffers (see exit_now).
fn measure(
    plan: &Plan,
    dst: &Payload,
    one: &mut dyn FnMut(usize, u64) -> Result<()>,
    out: &mut dyn FnMut(Measured),
) {
    for &size in &plan.sizes {
        let (warmup, iters) = (plan.warmup(size), plan.iters(size));
        // Once work is queued, a failure ends the process at once (see exit_now).
        let seconds = (|| -> Result<f64> {
            one(size, warmup)?;
            let start = Instant::now();
            one(size, iters)?;
            let seconds = start.elapsed().as_secs_f64();
            if plan.check {
                check(dst, size)?;
            }
            Ok(seconds)
        })()
        .unwrap_or_else(|e| exit_now(e.context(format!("staged, {size} B"))));
        out(Measured {
            size,
            iters,
            warmup,
            seconds,
        });
    }
}

/// The staged run: every size, warm-up then timed, with rank 1 on a thread of its own.
pub(crate) fn run(plan: &Plan, stage: &Stage, out: &mut dyn FnMut(Measured)) -> Result<()> {
    let max = *plan.sizes.iter().max().context("no sizes")?;
    let (src, dst) = (
        Payload::new(plan.host_stream, max, plan.gpu(0))?,
        Payload::new(plan.host_stream, max, plan.gpu(1))?,
    );
    src.write(0, &pattern(max))?;
    let cuda = if plan.host_stream {
        None
    } else {
        Some(Cuda::get()?)
    };
    let bounce = stage.chunk.min(max);
    let st0 = Staging::with_slots(bounce, stage.bounces, cuda);
    let st1 = Staging::with_slots(bounce, stage.bounces, cuda);
    let (credit, credit_buf) = (PinnedBuffer::new(8), PinnedBuffer::new(8));
    let link = Link::new(&plan.device, st0.bounce(), st1.bounce())?;
    let credit_mr = link.pds.0.register_pinned(&credit, Access::ALL)?;
    let credit_src = link.pds.1.register_pinned(&credit_buf, Access::ALL)?;
    let Link {
        mut q0,
        local,
        remote,
        mut rx,
        ..
    } = link;
    let mut rank0 = if plan.trigger == Trigger::Kernel {
        let bounce = (&st0, &local);
        Rank0::Kernel(KernelPush::new(
            plan, stage, q0, bounce, remote, &src, &credit,
        )?)
    } else {
        let tx = Sender {
            qp: &mut q0,
            bounce: &local,
            remote,
            st: &st0,
            src: &src,
            credit: &credit,
            seq: 0,
            writes: VecDeque::new(),
            drained: 0,
        };
        let driver = Driver::new(plan)?;
        Rank0::Host { tx, driver }
    };
    let (jobs_tx, jobs) = mpsc::channel::<(usize, u64)>();
    let (done_tx, done) = mpsc::channel::<Result<()>>();
    let rank1 = Receiver {
        rx: &mut rx,
        st: &st1,
        dst: &dst,
        credit: credit_mr.remote(),
        credit_src: &credit_src,
        credit_buf: &credit_buf,
        lane: Lane::new(plan, 1)?,
        copied: SignalWords::new(1),
        seq: 0,
        credited: 0,
        bounces: stage.bounces,
        slow: plan.slow_copy_in,
    };
    let dst = &dst;
    std::thread::scope(|scope| {
        // Dropped when this closure returns, early too, so rank 1 ends before the scope joins it.
        let jobs_tx = jobs_tx;
        scope.spawn(move || serve(rank1, stage, jobs, done_tx));
        let mut one = |size: usize, n: u64| -> Result<()> {
            jobs_tx.send((size, n)).ok().context("rank 1 ended early")?;
            let r = rank0.phase(stage, size, n, &done);
            // Where rank 1 failed first (rank 0 then waits for a credit in vain), its error.
            match (r, done.try_recv()) {
                (Err(_), Ok(Err(e))) => Err(e),
                (r, _) => r,
            }
        };
        measure(plan, dst, &mut one, out);
        drop(jobs_tx);
        Ok(())
    })
}
