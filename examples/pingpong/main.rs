//! Half round-trip latency between two ranks, perftest style.
//!
//! Rank 0 writes a message into rank 1's buffer (or sends it); rank 1 sees it land and
//! answers the same way; the time of one round trip, halved, is one sample. `--raw` runs the
//! same loop with the NIC replaced by direct stores into the peer's memory: the floor of the
//! run.
//!
//! ```text
//! cargo run --release --example pingpong                       # soft device, threads
//! cargo run --release --example pingpong -- --ranks procs --sizes 8,4096
//! cargo run --release --example pingpong -- --raw --json
//! cargo run --release --example pingpong -- --api mp --op send --trigger kernel --mem device
//! ```
//!
//! `--api mp` runs the same loop through the messaging layer (`mp::Comm`, send/receive with
//! credits) on every trigger; with `--trigger kernel` each rank's persistent kernel drives
//! its kernel channel (`Comm::kernel_channels`) by itself. Its floor is `--api gdsync` with
//! the same `--op send --trigger` (and that one's `--raw`).

mod gpu;
mod mp_gpu;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use gdasync::gdsync::{
    Access, Cq, Device, Endpoint, MemoryRegion, Qp, QpConfig, RecvWr, RemoteBuf, SendWr,
    SharedMemory,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    Write,
    WriteImm,
    Send,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Trigger {
    /// The CPU posts and polls.
    Cpu,
    /// GPU in the loop, CPU-driven: GPU step, synchronise, post and poll from the CPU.
    Host,
    /// Stream-triggered: the CUDA stream rings the doorbell and waits for completions.
    Stream,
    /// Kernel-initiated: one persistent kernel per rank sends and waits (`--api mp`: through
    /// its kernel channel, posting its receives and credits too).
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Ranks {
    /// Two threads of this process sharing one soft device (as two processes of one host
    /// share its HCA); `--separate-devices` gives each its own.
    Threads,
    /// Two processes on this host (shared-memory link).
    Procs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Api {
    Gdsync,
    Mp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mem {
    Host,
    Device,
}

#[derive(Parser, Debug, Clone)]
#[command(about = "Half round-trip latency between two ranks (perftest style)")]
struct Args {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Who triggers the NIC.
    #[arg(long, value_enum, default_value = "cpu")]
    trigger: Trigger,
    /// Replace the NIC with direct signalling through shared memory (the floor).
    #[arg(long)]
    raw: bool,
    /// Where the buffers live.
    #[arg(long, value_enum, default_value = "host")]
    mem: Mem,
    /// How the two ranks run.
    #[arg(long, value_enum, default_value = "threads")]
    ranks: Ranks,
    /// One message size in bytes.
    #[arg(long, conflicts_with = "sizes")]
    size: Option<usize>,
    /// Comma-separated message sizes in bytes.
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Timed iterations per size (default: 10000, fewer for large sizes).
    #[arg(long)]
    iters: Option<usize>,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1000)]
    warmup: usize,
    /// With `--ranks threads`: one soft device (engine) per rank instead of a shared one.
    #[arg(long)]
    separate_devices: bool,
    /// `gdsync` (queue pairs directly) or `mp` (the messaging layer: send/recv with credits;
    /// `--op send`, ranks as threads, every trigger).
    #[arg(long, value_enum, default_value = "gdsync")]
    api: Api,
    /// With `--api mp --trigger cpu` or `kernel`: receives are kept 64 deep and posted again
    /// this many at a time, with one credit per batch (1: a credit for every message).
    #[arg(long, default_value_t = 16)]
    recv_batch: usize,
    /// One JSON object per size instead of a table.
    #[arg(long)]
    json: bool,
    /// With `--api mp --trigger stream`: run the stream loop on a host stream (no GPU), to
    /// test the loop where there is no GPU.
    #[arg(long, hide = true)]
    host_stream: bool,
    /// Internal: this process is rank 1 of `--ranks procs`.
    #[arg(long, hide = true)]
    child: bool,
}

impl Args {
    fn sizes(&self) -> Vec<usize> {
        match (&self.size, &self.sizes) {
            (Some(s), _) => vec![*s],
            (None, Some(v)) => v.clone(),
            (None, None) => vec![8, 64, 512, 4096, 65536, 1 << 20],
        }
    }
    fn iters(&self, size: usize) -> usize {
        self.iters
            .unwrap_or_else(|| (10_000usize).min(((1usize << 31) / size.max(1)).max(200)))
    }
    fn warmup(&self, size: usize) -> usize {
        self.warmup.min(self.iters(size) / 5 + 1)
    }
}

/// One rank's view of the exchange: send message `i` of `size` bytes, wait for the peer's.
trait Wire {
    fn send(&mut self, i: u64, size: usize) -> Result<()>;
    fn wait(&mut self, i: u64, size: usize) -> Result<()>;
    /// Before a new size: clear what the peer writes into.
    fn reset(&mut self, size: usize) -> Result<()>;
    /// After the last iteration of a size: finish what is still queued (before the ranks
    /// synchronise, when this rank stops driving its work forward).
    fn drain(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Set with ranks as processes: packets from the peer process reach this process's soft
/// engine only through a thread that runs it, so a rank spinning on memory lends itself.
static DRIVE_ENGINE: AtomicBool = AtomicBool::new(false);

/// Spin, but let other threads run when the machine has fewer cores than busy threads.
fn relax(spins: u32) {
    if DRIVE_ENGINE.load(Ordering::Relaxed) {
        // A no-op unless the soft engines progress on shared threads (few cores).
        gdasync::gdsync::progress();
    }
    if spins < 2000 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn marker(i: u64) -> u8 {
    (i % 251) as u8 + 1
}

// ---------------------------------------------------------------------------- soft device

struct Nic {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    sbuf: MemoryRegion<'static>,
    rbuf: MemoryRegion<'static>,
    remote: RemoteBuf,
    op: Op,
    inline_max: usize,
    posted: u64,
    signal_every: u64,
    unacked_signals: u64,
    _dev: Device,
}

struct NicSetup {
    dev: Device,
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    sbuf: MemoryRegion<'static>,
    rbuf: MemoryRegion<'static>,
}

fn leak(n: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; n.max(64)].into_boxed_slice())
}

fn nic_setup(dev: &Device, max: usize) -> Result<NicSetup> {
    let dev = dev.clone();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(1024)?;
    let rcq = dev.create_cq(1024)?;
    let qp = pd.create_qp(&scq, &rcq, &QpConfig::default())?;
    let sbuf = pd.register(leak(max), Access::LOCAL_WRITE)?;
    let rbuf = pd.register(leak(max), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    Ok(NicSetup {
        dev,
        qp,
        scq,
        rcq,
        sbuf,
        rbuf,
    })
}

impl NicSetup {
    fn connect(mut self, peer: &Endpoint, remote: RemoteBuf, op: Op) -> Result<Nic> {
        self.qp.connect(peer)?;
        let mut n = Nic {
            qp: self.qp,
            scq: self.scq,
            rcq: self.rcq,
            sbuf: self.sbuf,
            rbuf: self.rbuf,
            remote,
            op,
            inline_max: QpConfig::default().max_inline as usize,
            posted: 0,
            signal_every: 64, // a power of two
            unacked_signals: 0,
            _dev: self.dev,
        };
        if op != Op::Write {
            for _ in 0..128 {
                n.post_recv()?;
            }
        }
        Ok(n)
    }
}

impl Nic {
    fn post_recv(&mut self) -> Result<()> {
        let sge = self.rbuf.sge(..);
        self.qp.post_recv(&RecvWr::new().sge(sge))?;
        Ok(())
    }
    fn reap_sends(&mut self) -> Result<()> {
        while let Some(c) = self.scq.poll_one()? {
            c.ok().context("send completion")?;
            self.unacked_signals -= 1;
        }
        Ok(())
    }
}

impl Wire for Nic {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if size > 0 {
            self.sbuf.write_volatile_u8(size - 1, marker(i));
        }
        let sge = self.sbuf.sge(..size);
        let mut wr = match self.op {
            Op::Write => SendWr::write(self.remote.at(0)),
            Op::WriteImm => SendWr::write_imm(self.remote.at(0), i as u32),
            Op::Send => SendWr::send(),
        };
        if size > 0 {
            wr = wr.sge(sge);
        }
        if size <= self.inline_max {
            wr = wr.inline();
        }
        self.posted += 1;
        if self.posted & (self.signal_every - 1) != 0 {
            wr = wr.unsignaled();
        } else {
            self.unacked_signals += 1;
        }
        // Keep at most two signalled sends in flight so the ring never fills.
        while self.unacked_signals > 2 {
            self.reap_sends()?;
        }
        self.qp.post_send(&wr)?;
        if self.unacked_signals > 0 {
            self.reap_sends()?;
        }
        Ok(())
    }

    fn wait(&mut self, i: u64, size: usize) -> Result<()> {
        match self.op {
            Op::Write => {
                if size == 0 {
                    bail!("--op write needs a size of at least 1 byte (the receiver polls the last byte)");
                }
                let m = marker(i);
                let start = Instant::now();
                let mut spins = 0u32;
                while self.rbuf.read_volatile_u8(size - 1) != m {
                    spins += 1;
                    if spins % 4096 == 0 && start.elapsed() > Duration::from_secs(10) {
                        bail!("no message {i} after 10 s (QP state {:?})", self.qp.state());
                    }
                    relax(spins);
                }
                fence(Ordering::Acquire);
                Ok(())
            }
            Op::WriteImm | Op::Send => {
                // Busy-poll, as perftest does (Cq::wait_one backs off to sleeping).
                let start = Instant::now();
                let mut spins = 0u32;
                let c = loop {
                    if let Some(c) = self.rcq.poll_one()? {
                        break c.ok()?;
                    }
                    spins += 1;
                    if spins % 4096 == 0 && start.elapsed() > Duration::from_secs(10) {
                        bail!("no message {i} after 10 s (QP state {:?})", self.qp.state());
                    }
                    relax(spins);
                };
                if c.byte_len as usize != size {
                    bail!("received {} bytes, expected {size}", c.byte_len);
                }
                self.post_recv()
            }
        }
    }

    fn reset(&mut self, size: usize) -> Result<()> {
        self.rbuf.write_at(0, &vec![0u8; size]);
        Ok(())
    }
}

// ---------------------------------------------------------------------------- mp

/// The messaging layer: `isend`/`irecv` with credits, waited on the CPU. Receives are kept
/// [`RECVS_AHEAD`] deep, as the gdsync loop keeps its receive ring full, and posted again
/// `--recv-batch` at a time (`Comm::irecv_batch`: one credit, a request and a response
/// through the NIC, per batch); sends are waited for one behind.
struct MpWire {
    comm: gdasync::mp::Comm,
    sbuf: MemoryRegion<'static>,
    rbuf: MemoryRegion<'static>,
    recvs: std::collections::VecDeque<gdasync::mp::Request>,
    send: Option<gdasync::mp::Request>,
    batch: usize,
}

/// Receives `--api mp` keeps posted.
const RECVS_AHEAD: usize = 64;

impl MpWire {
    fn new(
        boot: Box<dyn gdasync::mp::bootstrap::Bootstrap>,
        dev: &Device,
        max: usize,
        batch: usize,
    ) -> Result<Self> {
        if !(1..=RECVS_AHEAD).contains(&batch) {
            bail!("--recv-batch must be 1..={RECVS_AHEAD}, not {batch}");
        }
        let comm = gdasync::mp::Comm::new(boot, dev)?;
        let sbuf = comm.register(leak(max))?;
        let rbuf = comm.register(leak(max))?;
        Ok(Self {
            comm,
            sbuf,
            rbuf,
            recvs: Default::default(),
            send: None,
            batch,
        })
    }
    fn peer(&self) -> usize {
        1 - self.comm.rank()
    }
    /// Posts receives again once `batch` of them are used (every one, into the whole
    /// buffer: messages of one ping-pong never overlap).
    fn top_up(&mut self, min: usize) -> Result<()> {
        let missing = RECVS_AHEAD - self.recvs.len();
        if missing >= min {
            let sges = vec![self.rbuf.sge(..); missing];
            let peer = self.peer();
            self.recvs.extend(self.comm.irecv_batch(&sges, peer)?);
        }
        Ok(())
    }
}

impl Wire for MpWire {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if let Some(prev) = self.send.take() {
            self.comm.wait(prev)?;
        }
        if size > 0 {
            self.sbuf.write_volatile_u8(size - 1, marker(i));
        }
        self.send = Some(self.comm.isend(self.sbuf.sge(..size), self.peer())?);
        // Receives topped up right behind the send: their credit travels after the
        // message, not in front of it, and reaches the peer before the peer answers.
        self.top_up(self.batch)
    }
    fn wait(&mut self, _i: u64, size: usize) -> Result<()> {
        if self.recvs.is_empty() {
            self.top_up(1)?;
        }
        let r = self.recvs.pop_front().expect("receives posted ahead");
        let n = self.comm.wait(r)?;
        if n as usize != size {
            bail!("received {n} bytes, expected {size}");
        }
        Ok(())
    }
    fn reset(&mut self, _size: usize) -> Result<()> {
        self.top_up(1)
    }
    fn drain(&mut self) -> Result<()> {
        // The last send may still wait for its credit: only calls into the communicator post
        // it, and the peer waits for it.
        if let Some(s) = self.send.take() {
            self.comm.wait(s)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------- raw floor

/// The NIC replaced by stores into the peer's buffer: the same loop's floor.
struct Raw {
    local: SharedBuf,
    peer: SharedBuf,
    src: Vec<u8>,
}

#[derive(Clone)]
struct SharedBuf {
    ptr: *mut u8,
    len: usize,
    _keep: Arc<dyn Send + Sync>,
}
// SAFETY: the pointer refers to memory kept alive by `_keep`; accesses are byte-wise volatile
// or bulk copies ordered by fences, as a NIC's DMA would be.
unsafe impl Send for SharedBuf {}

impl SharedBuf {
    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len);
        // SAFETY: in bounds; AtomicU8 has alignment 1.
        unsafe { &*(self.ptr.add(off) as *const AtomicU8) }
    }
    fn copy_in(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        // SAFETY: in bounds; the source is a private Vec.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, src.len()) }
    }
}

impl Wire for Raw {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if size == 0 {
            bail!("--raw needs a size of at least 1 byte");
        }
        self.src[size - 1] = marker(i);
        self.peer.copy_in(&self.src[..size - 1]);
        fence(Ordering::Release);
        self.peer.byte(size - 1).store(marker(i), Ordering::Release);
        Ok(())
    }
    fn wait(&mut self, i: u64, size: usize) -> Result<()> {
        let m = marker(i);
        let mut spins = 0u32;
        while self.local.byte(size - 1).load(Ordering::Acquire) != m {
            spins += 1;
            relax(spins);
        }
        Ok(())
    }
    fn reset(&mut self, size: usize) -> Result<()> {
        for o in 0..size {
            self.local.byte(o).store(0, Ordering::Relaxed);
        }
        Ok(())
    }
}

struct HeapBuf(#[allow(dead_code)] Box<[u8]>);

fn heap_buf(n: usize) -> SharedBuf {
    let mut b = vec![0u8; n.max(64)].into_boxed_slice();
    let ptr = b.as_mut_ptr();
    let len = b.len();
    SharedBuf {
        ptr,
        len,
        _keep: Arc::new(std::sync::Mutex::new(HeapBuf(b))),
    }
}

/// Two buffers of `n` bytes in a shared-memory file (for `--raw --ranks procs`): rank 0
/// creates it, rank 1 maps it.
fn shm_bufs(path: &str, n: usize, create: bool) -> Result<(SharedBuf, SharedBuf)> {
    let len = 2 * n.max(64).next_multiple_of(4096);
    let mem = if create {
        SharedMemory::create(path, len)?
    } else {
        SharedMemory::open(path, len)?
            .with_context(|| format!("{path} is missing or not {len} bytes"))?
    };
    let p = mem.as_ptr();
    let keep: Arc<dyn Send + Sync> = Arc::new(mem);
    let half = len / 2;
    let a = SharedBuf {
        ptr: p,
        len: half,
        _keep: keep.clone(),
    };
    // SAFETY: the second half of the mapping.
    let b = SharedBuf {
        ptr: unsafe { p.add(half) },
        len: half,
        _keep: keep,
    };
    Ok((a, b))
}

// ---------------------------------------------------------------------------- the loop

struct Stats {
    bytes: usize,
    iters: usize,
    min: f64,
    p50: f64,
    avg: f64,
    p99: f64,
    cpu_us_per_iter: f64,
}

fn cpu_time_us() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs every size on one rank; rank 0 measures. `sync` separates sizes.
fn run_rank(
    rank: usize,
    w: &mut dyn Wire,
    args: &Args,
    sync: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<Stats>> {
    let mut out = Vec::new();
    let mut i = 0u64;
    for size in args.sizes() {
        w.reset(size)?;
        sync()?;
        let (warm, iters) = (args.warmup(size), args.iters(size));
        let mut samples = Vec::with_capacity(iters);
        let mut cpu0 = 0.0;
        for k in 0..warm + iters {
            if k == warm {
                cpu0 = cpu_time_us();
            }
            let t0 = Instant::now();
            if rank == 0 {
                w.send(i, size)?;
                w.wait(i + 1, size)?;
            } else {
                w.wait(i, size)?;
                w.send(i + 1, size)?;
            }
            i += 2;
            if k >= warm {
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        let cpu = (cpu_time_us() - cpu0) / iters as f64;
        w.drain()?;
        sync()?;
        samples.sort_by(f64::total_cmp);
        let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
        out.push(Stats {
            bytes: size,
            iters,
            min: samples[0],
            p50: pct(0.5),
            avg: samples.iter().sum::<f64>() / samples.len() as f64,
            p99: pct(0.99),
            cpu_us_per_iter: cpu,
        });
    }
    Ok(out)
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::WriteImm => "write-imm",
        Op::Send => "send",
    }
}

fn trigger_name(t: Trigger) -> &'static str {
    match t {
        Trigger::Cpu => "cpu",
        Trigger::Host => "host",
        Trigger::Stream => "stream",
        Trigger::Kernel => "kernel",
    }
}

fn report(args: &Args, stats: &[Stats], extra_cpu: &[f64]) {
    let (trigger, mem) = (
        trigger_name(args.trigger),
        if args.mem == Mem::Host {
            "host"
        } else {
            "device"
        },
    );
    let ranks = match args.ranks {
        Ranks::Threads if args.api == Api::Mp => "threads-mp",
        Ranks::Threads if args.separate_devices && !args.raw => "threads-2dev",
        Ranks::Threads => "threads",
        Ranks::Procs => "procs",
    };
    if !args.json {
        println!(
            "# pingpong: op {} trigger {trigger}{} mem {mem} ranks {ranks}",
            op_name(args.op),
            if args.raw { " (raw floor)" } else { "" }
        );
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>14}",
            "bytes", "iters", "t_min[us]", "t_p50[us]", "t_avg[us]", "t_p99[us]", "cpu_us/iter"
        );
    }
    for (k, s) in stats.iter().enumerate() {
        let cpu = s.cpu_us_per_iter + extra_cpu.get(k).copied().unwrap_or(0.0);
        if args.json {
            println!(
                "{{\"op\":\"{}\",\"trigger\":\"{trigger}\",\"raw\":{},\"mem\":\"{mem}\",\"ranks\":\"{ranks}\",\"bytes\":{},\"iters\":{},\"t_min_us\":{:.3},\"t_p50_us\":{:.3},\"t_avg_us\":{:.3},\"t_p99_us\":{:.3},\"cpu_us_per_iter\":{:.3}}}",
                op_name(args.op), args.raw, s.bytes, s.iters, s.min, s.p50, s.avg, s.p99, cpu
            );
        } else {
            println!(
                "{:>10} {:>10} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>14.3}",
                s.bytes, s.iters, s.min, s.p50, s.avg, s.p99, cpu
            );
        }
    }
}

fn check(args: &Args) -> Result<()> {
    if args.api == Api::Mp && (args.ranks != Ranks::Threads || args.raw || args.op != Op::Send) {
        bail!("--api mp runs --op send with --ranks threads (its floor is --api gdsync --op send, and that one's --raw)");
    }
    if args.trigger == Trigger::Cpu && args.mem != Mem::Host {
        bail!("--trigger cpu polls host memory: use --mem host, or a GPU trigger for --mem device");
    }
    if args.trigger != Trigger::Cpu && !args.host_stream {
        if args.ranks != Ranks::Threads || args.separate_devices {
            bail!("GPU triggers run the ranks as threads of one process sharing a soft device (CUDA time-slices separate processes on one GPU)");
        }
        if let Err(e) = gdasync::gdsync::cuda::Cuda::get().and_then(|c| c.gpu(0).map(|_| ())) {
            bail!(
                "--trigger {} needs a CUDA GPU: {e}",
                trigger_name(args.trigger)
            );
        }
    }
    let sizes = args.sizes();
    if sizes.is_empty() {
        bail!("no sizes given");
    }
    if (args.op == Op::Write || args.raw) && sizes.contains(&0) {
        bail!("--op write and --raw poll the last byte of the message: sizes must be at least 1");
    }
    if let Some(&s) = sizes.iter().find(|&&s| s > 1 << 30) {
        bail!("size {s} is larger than this benchmark's 1 GiB buffers");
    }
    if args.separate_devices && args.ranks != Ranks::Threads {
        bail!("--separate-devices applies to --ranks threads (processes always have their own device)");
    }
    if args.iters == Some(0) {
        bail!("--iters must be at least 1");
    }
    Ok(())
}

fn threads(args: &Args) -> Result<()> {
    let max = *args.sizes().iter().max().unwrap();
    let batch = args.recv_batch;
    let barrier = Arc::new(Barrier::new(2));
    let (w0, w1): (Box<dyn Wire + Send>, Box<dyn Wire + Send>) = if args.raw {
        let (a, b) = (heap_buf(max), heap_buf(max));
        (
            Box::new(Raw {
                local: a.clone(),
                peer: b.clone(),
                src: vec![0; max.max(64)],
            }),
            Box::new(Raw {
                local: b,
                peer: a,
                src: vec![0; max.max(64)],
            }),
        )
    } else if args.api == Api::Mp {
        let dev = Device::soft()?;
        let mut boots = gdasync::mp::bootstrap::ThreadBootstrap::group(2);
        let (b1, b0) = (boots.pop().unwrap(), boots.pop().unwrap());
        let d = dev.clone();
        let h = std::thread::spawn(move || MpWire::new(Box::new(b1), &d, max, batch));
        let w0 = MpWire::new(Box::new(b0), &dev, max, batch)?;
        let w1 = h.join().map_err(|_| anyhow::anyhow!("rank 1 panicked"))??;
        (Box::new(w0), Box::new(w1))
    } else {
        let d0 = Device::soft()?;
        let d1 = if args.separate_devices {
            Device::soft()?
        } else {
            d0.clone()
        };
        let (s0, s1) = (nic_setup(&d0, max)?, nic_setup(&d1, max)?);
        let (e0, e1) = (s0.qp.endpoint(), s1.qp.endpoint());
        let (r0, r1) = (s0.rbuf.remote(), s1.rbuf.remote());
        (
            Box::new(s0.connect(&e1, r1, args.op)?),
            Box::new(s1.connect(&e0, r0, args.op)?),
        )
    };
    let a1 = args.clone();
    let b1 = barrier.clone();
    let t1 = std::thread::spawn(move || -> Result<()> {
        let mut w1 = w1;
        run_rank(1, &mut *w1, &a1, &mut || {
            b1.wait();
            Ok(())
        })?;
        Ok(())
    });
    let mut w0 = w0;
    let stats = run_rank(0, &mut *w0, args, &mut || {
        barrier.wait();
        Ok(())
    });
    t1.join()
        .map_err(|_| anyhow::anyhow!("rank 1 panicked"))??;
    report(args, &stats?, &[]);
    Ok(())
}

/// Line-based exchange with the other process (the child's stdin/stdout).
struct Pipe {
    r: Box<dyn BufRead>,
    w: Box<dyn Write>,
}

impl Pipe {
    fn put(&mut self, s: &str) -> Result<()> {
        writeln!(self.w, "{s}")?;
        self.w.flush()?;
        Ok(())
    }
    fn get(&mut self) -> Result<String> {
        let mut s = String::new();
        if self.r.read_line(&mut s)? == 0 {
            bail!("the other rank exited");
        }
        Ok(s.trim().to_string())
    }
    fn sync(&mut self) -> Result<()> {
        self.put("sync")?;
        let s = self.get()?;
        if s != "sync" {
            bail!("protocol error: got {s:?}");
        }
        Ok(())
    }
}

fn remote_str(r: &RemoteBuf) -> String {
    format!("{:x} {:x} {:x}", r.addr, r.len, r.rkey)
}

fn parse_remote(s: &str) -> Result<RemoteBuf> {
    let v: Vec<u64> = s
        .split_whitespace()
        .map(|x| u64::from_str_radix(x, 16))
        .collect::<Result<_, _>>()?;
    if v.len() != 3 {
        bail!("bad remote buffer line {s:?}");
    }
    Ok(RemoteBuf {
        addr: v[0],
        len: v[1],
        rkey: v[2] as u32,
    })
}

/// Both processes of `--ranks procs` run this; rank 1 talks through its stdin/stdout.
fn procs_rank(rank: usize, args: &Args, pipe: &mut Pipe) -> Result<Vec<Stats>> {
    let max = *args.sizes().iter().max().unwrap();
    let mut wire: Box<dyn Wire> = if args.raw {
        let path = if rank == 0 {
            let p = format!("/dev/shm/gdsync-pingpong-raw-{}", std::process::id());
            pipe.put(&p)?;
            p
        } else {
            pipe.get()?
        };
        let (a, b) = shm_bufs(&path, max, rank == 0)?;
        pipe.sync()?;
        if rank == 0 {
            let _ = std::fs::remove_file(&path);
        }
        let (local, peer) = if rank == 0 { (a, b) } else { (b, a) };
        Box::new(Raw {
            local,
            peer,
            src: vec![0; max.max(64)],
        })
    } else {
        let s = nic_setup(&Device::soft()?, max)?;
        pipe.put(&format!(
            "{} {}",
            s.qp.endpoint(),
            remote_str(&s.rbuf.remote())
        ))?;
        let line = pipe.get()?;
        let (ep, rb) = line.split_once(' ').context("bad endpoint line")?;
        let ep: Endpoint = ep.parse()?;
        Box::new(s.connect(&ep, parse_remote(rb)?, args.op)?)
    };
    run_rank(rank, &mut *wire, args, &mut || pipe.sync())
}

fn procs(args: &Args) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(std::env::args().skip(1))
        .arg("--child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawn rank 1")?;
    let mut pipe = Pipe {
        r: Box::new(BufReader::new(child.stdout.take().unwrap())),
        w: Box::new(child.stdin.take().unwrap()),
    };
    let res = procs_rank(0, args, &mut pipe);
    let child_cpu: Vec<f64> = match &res {
        Ok(_) => pipe
            .get()?
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect(),
        Err(_) => {
            let _ = child.kill();
            Vec::new()
        }
    };
    let status = child.wait()?;
    let stats = res?;
    if !status.success() {
        bail!("rank 1 failed: {status}");
    }
    report(args, &stats, &child_cpu);
    Ok(())
}

fn child(args: &Args) -> Result<()> {
    let mut pipe = Pipe {
        r: Box::new(BufReader::new(std::io::stdin())),
        w: Box::new(std::io::stdout()),
    };
    let stats = procs_rank(1, args, &mut pipe)?;
    let cpu: Vec<String> = stats
        .iter()
        .map(|s| format!("{:.3}", s.cpu_us_per_iter))
        .collect();
    pipe.put(&cpu.join(" "))?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    check(&args)?;
    if args.child || args.ranks == Ranks::Procs {
        DRIVE_ENGINE.store(true, Ordering::Relaxed);
    }
    if args.child {
        return child(&args);
    }
    if args.trigger != Trigger::Cpu {
        let stats = if args.api == Api::Mp {
            mp_gpu::run(&args)?
        } else {
            gpu::run(&args)?
        };
        report(&args, &stats, &[]);
        return Ok(());
    }
    match args.ranks {
        Ranks::Threads => threads(&args),
        Ranks::Procs => procs(&args),
    }
}
