//! The GPU triggers. Each rank owns one CUDA stream and one device allocation (both grids,
//! and, with `--halo device`, the halo buffers), registered as one memory region; with
//! `--halo host` the halo buffers are pinned host memory the kernels reach directly,
//! registered as a second region. The ring kernel reads received halos straight from the
//! receive buffers and packs the next sends as it goes (no pack or unpack kernels).
//!
//! - `host`: per iteration the CPU synchronises the stream, posts the sends, launches the
//!   interior, waits for the messages on the CPU, then launches the ring.
//! - `stream`: the CPU only enqueues: per peer the credit for a receive whose buffer the last
//!   ring read and `isend_on(stream)` (one doorbell for both) → interior → `wait_on(stream)`
//!   for the halos → ring, all on the stream, at most [`AHEAD`] iterations ahead of it.
//!
//! With `--overlap off` (the default for small blocks, see [`crate::OVERLAP_MIN_CELLS`]) both
//! run one kernel per iteration, [`whole`](GpuRank::whole), after the halos arrived, instead
//! of the interior and the ring: on the stream the sends and the waits then make one list of
//! memory operations. Each kernel and each list costs the GPU ~1.5–2 µs of front-end time;
//! a small interior does not hide that much.
//! - `kernel`: one persistent kernel per rank (cooperative launch, grid-wide barriers) runs
//!   every iteration: thread 0 of one block per neighbour drives that neighbour's kernel
//!   channel (`gds_peer_*`; block 0's thread 0 drives every staged channel) while the others
//!   compute; the ring cells read the halos straight from the receive buffers.
//!
//! Kernels (kernels.cu) are compiled at run time with NVRTC, with fused multiply-add off
//! (`--fmad=false`) and the update written in the same order as the CPU's, so every variant
//! gives the same bits.

use crate::grid::{self, Layout, Side, C0, C1};
use crate::profile::{Counted, OpCount, StepClock};
use crate::progress::{self, Step};
use crate::{Config, Halo, Solver, Trigger};
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{Cuda, CudaEvent, CudaStream, DeviceBuffer, Function, Module};
use gdasync::gdsync::exec::OpBatch;
use gdasync::gdsync::kernel::code;
use gdasync::gdsync::{Access, GpuMemoryPath, MemoryRegion, PinnedBuffer, Sge};
use gdasync::mp::{Comm, GpuRegion, GpuSlice, KernelChannels, Request};
use std::collections::VecDeque;
use std::sync::Arc;

/// How many iterations the CPU may enqueue ahead of the stream (`--trigger stream`). Each
/// holds a few dozen memory operations; a stream takes at most `cuda::MAX_QUEUED_OPS` (512).
pub const AHEAD: usize = 4;

/// The kernels' source (also checked with clang by tests/stencil.rs).
pub const KERNELS: &str = include_str!("kernels.cu");

/// Threads per block of every kernel (the persistent kernel's `__launch_bounds__` in kernels.cu
/// names the same number).
const BLOCK: u32 = 256;

/// The persistent kernel's own error codes (kernels.cu: `STENCIL_*`), beside gdsync's.
const BARRIER_TIMEOUT: i32 = 0x1001;
const SHORT_MESSAGE: i32 = 0x1002;

/// Bound on every device-side wait of the persistent kernel.
const KERNEL_TIMEOUT_NS: u64 = 10_000_000_000;

/// The compiled kernels, one module per GPU that this process's ranks use (shared by the rank
/// threads of a process). Where each rank runs is `--gpus`' placement ([`Config::placement`]).
pub struct Kernels {
    /// Indexed by GPU ordinal; `None` for GPUs none of this process's ranks runs on.
    per_gpu: Vec<Option<GpuKernels>>,
}

/// The kernels loaded on one GPU.
struct GpuKernels {
    ordinal: i32,
    _module: Module,
    interior: Function,
    ring: Function,
    whole: Function,
    pack: Function,
    persistent: Function,
}

impl Kernels {
    /// Compiles and loads the kernels on `gpus` (the GPUs this process's ranks run on).
    pub fn compile(gpus: &[i32]) -> Result<Kernels> {
        let n = Cuda::get()?.gpus.len();
        let mut per_gpu: Vec<Option<GpuKernels>> = (0..n).map(|_| None).collect();
        for &ordinal in gpus {
            let m = Module::compile_with_options(ordinal, KERNELS, &["--fmad=false"])
                .with_context(|| {
                    format!("compile the stencil kernels with NVRTC for GPU {ordinal}")
                })?;
            per_gpu[ordinal as usize] = Some(GpuKernels {
                ordinal,
                interior: m.function("interior")?,
                ring: m.function("ring")?,
                whole: m.function("whole")?,
                pack: m.function("pack")?,
                persistent: m.function("persistent")?,
                _module: m,
            });
        }
        Ok(Kernels { per_gpu })
    }

    /// The kernels of GPU `gpu`.
    fn on(&self, gpu: i32) -> Result<&GpuKernels> {
        self.per_gpu
            .get(gpu as usize)
            .and_then(Option::as_ref)
            .with_context(|| format!("the kernels were not compiled for GPU {gpu}"))
    }
}

/// A kernel argument (kept alive while the launch reads it).
enum Arg {
    U64(u64),
    I32(i32),
    I64(i64),
    F64(f64),
    Run(Box<PersistentArgs>),
}

/// One side's channel as the persistent kernel reads it (kernels.cu: `StencilSide`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SideArgs {
    /// [`SENDS`] send buffers, then [`RECVS`] receive buffers, each `len` bytes.
    send: u64,
    recv: u64,
    send_lkey: u32,
    recv_lkey: u32,
    /// Bytes per message; 0: no neighbour on this side.
    len: u32,
    peer: u32,
    nsend: u32,
    nrecv: u32,
}

/// The persistent kernel's argument (kernels.cu: `StencilRun`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PersistentArgs {
    side: [SideArgs; 4],
    peers: u64,
    grid: [u64; 2],
    bar: u64,
    status: u64,
    first: i64,
    end: i64,
    timeout_ns: u64,
    nx: i32,
    ny: i32,
    /// 1: the channels are staged (the halos are in GPU memory the device cannot reach).
    staged: i32,
    pad: i32,
    /// `--trace`: pinned host words the kernel adds its step times into (0: none).
    trace: u64,
}
// SAFETY: `#[repr(C)]` plain data laid out as kernels.cu's `StencilRun`.
unsafe impl gdasync::gdsync::cuda::KernelArg for PersistentArgs {}

const _: () = assert!(std::mem::size_of::<SideArgs>() == 40);
const _: () = assert!(std::mem::size_of::<PersistentArgs>() == 248);

/// Send buffers per side: iteration `i` sends from buffer `i % SENDS`. The stream trigger
/// leaves send completions to the CPU, which has waited for iteration `i - AHEAD` before it
/// enqueues iteration `i` (whose ring kernel packs buffer `(i + 1) % SENDS`).
const SENDS: usize = AHEAD + 1;

/// Receive buffers per side: iteration `i` receives into buffer `i % RECVS`. The stream
/// trigger gives the credit for receive `i + RECVS` once iteration `i` has read its halos (in
/// the next iteration's list, just before the send to the same peer, whose doorbell it
/// shares), so a peer's credit is there before the CPU enqueues the send that needs it (the
/// CPU runs at most [`AHEAD`] iterations ahead): the stream need not wait for it.
const RECVS: usize = AHEAD + 2;

// The persistent kernel posts receives up to 3 iterations ahead (two at a time, under one
// credit) into buffers that iteration's ring read 6 iterations before (kernels.cu).
const _: () = assert!(RECVS == 6);

/// One neighbour's messages: iteration `i` sends `send[i % SENDS]` and receives into
/// `recv[i % RECVS]`.
struct Link {
    side: Side,
    peer: usize,
    send: [Sge; SENDS],
    recv: [Sge; RECVS],
}

impl Link {
    fn send(&self, i: u64) -> Sge {
        self.send[(i % SENDS as u64) as usize]
    }
    fn recv(&self, i: u64) -> Sge {
        self.recv[(i % RECVS as u64) as usize]
    }
}

/// Byte offsets in the device allocation: the two grids, then (persistent kernel) its
/// barrier words, then (`--halo device`) per side its send and receive buffers.
struct Offsets {
    grids: [usize; 2],
    barrier: usize,
    total: usize,
}

impl Offsets {
    fn new(l: &Layout) -> Offsets {
        let grid = 8 * l.cells();
        Offsets {
            grids: [0, grid],
            barrier: 2 * grid,
            total: 2 * grid + 16,
        }
    }
}

/// Bytes of halo buffers a rank needs outside its grids: per side, its send and receive
/// buffers.
fn halo_bytes(l: &Layout) -> usize {
    l.links()
        .map(|(side, _)| (SENDS + RECVS) * 8 * l.side_len(side))
        .sum()
}

/// One rank on the GPU (also the single-rank reference, with no links).
struct GpuRank<'m> {
    lay: Layout,
    k: &'m GpuKernels,
    mem: &'m DeviceBuffer,
    off: Offsets,
    links: Vec<Link>,
    stream: CudaStream,
    trigger: Trigger,
    // Field order matters: the registrations are dropped before the memory they cover.
    _mrs: Vec<MemoryRegion<'m>>,
    /// The persistent kernel's channels and status words (`--trigger kernel`).
    chans: Option<(KernelChannels, PinnedBuffer)>,
    /// Ranks whose persistent kernels share this GPU.
    ranks_on_gpu: u32,
    /// This rank (its line in the stall report, [`progress`]).
    rank: usize,
    /// `--trace`: time the CPU's steps of the stream trigger.
    trace: bool,
    /// `--trace`: the CPU's time per step of the last run (the timed one).
    clock: std::cell::RefCell<Option<StepClock>>,
    /// `--trace` with the kernel trigger: the persistent kernel's time per step of its
    /// last launch (kernels.cu: `StepTimes`).
    kernel_steps: Option<PinnedBuffer>,
    /// The memory operations the stream trigger's last run handed its stream.
    ops: OpCount,
    /// `--overlap`: an interior kernel while the halos fly, then a ring kernel; else one
    /// [`whole`](Self::whole) kernel once they arrived.
    overlap: bool,
    /// The sides' buffers, grids and sizes, as the ring, pack and persistent kernels take
    /// them (the persistent kernel's per-launch fields are set at its launch).
    run: PersistentArgs,
    /// `--halo device` staged: the device allocation as mp stages it (the links' SGEs then
    /// name its bytes, not a registration).
    staged: Option<GpuRegion>,
}

impl<'m> GpuRank<'m> {
    fn new(
        lay: &Layout,
        k: &'m GpuKernels,
        mem: &'m DeviceBuffer,
        host: Option<&'m PinnedBuffer>,
        comm: Option<&mut Comm>,
        trigger: Trigger,
        staged: Option<GpuRegion>,
    ) -> Result<GpuRank<'m>> {
        let off = Offsets::new(lay);
        let init = grid::to_bytes(&lay.initial_grid());
        for g in off.grids {
            mem.copy_from_host(g, &init)?;
        }
        let mut mrs = Vec::new();
        let mut links = Vec::new();
        if let Some(comm) = comm.as_deref() {
            // Staged halos are not registered (the device may not reach GPU memory).
            let dev_mr = match staged {
                None => Some(comm.pd().register_device(mem, Access::ALL)?),
                Some(_) => None,
            };
            let host_mr = host
                .map(|h| comm.pd().register_pinned(h, Access::ALL))
                .transpose()?;
            // Halo buffers, one side after another: its sends, then its receives.
            let (mr, mut at) = match &host_mr {
                Some(h) => (Some(h), 0),
                None => (dev_mr.as_ref(), off.total),
            };
            for (side, peer) in lay.links() {
                let n = 8 * lay.side_len(side);
                let mut sge = |_| {
                    at += n;
                    match mr {
                        Some(mr) => mr.sge(at - n..at),
                        // Staged: the bytes, for `GpuRank::halo`.
                        None => Sge {
                            addr: mem.ptr() + (at - n) as u64,
                            len: n as u32,
                            lkey: 0,
                        },
                    }
                };
                links.push(Link {
                    side,
                    peer,
                    send: std::array::from_fn(&mut sge),
                    recv: std::array::from_fn(&mut sge),
                });
            }
            mrs.extend(dev_mr);
            mrs.extend(host_mr);
        }
        let chans = match (trigger, comm) {
            (Trigger::Kernel, Some(comm)) => {
                // Two receives in flight per peer (iterations i and i + 1), with room; staged
                // halos go through bounces as long as any rank's longest message (every
                // rank passes the same size: a block's side is at most the grid's).
                let ch = match &staged {
                    Some(_) => comm.kernel_channels_staged(4, 8 * lay.gx.max(lay.gy))?,
                    None => comm.kernel_channels(4)?,
                };
                if !ch.gpu_mapped() {
                    bail!("--trigger kernel: the kernel channels' host memory is not mapped for the GPU (cuMemHostRegister failed)");
                }
                Some((ch, PinnedBuffer::new(8)))
            }
            _ => None,
        };
        let mut run = PersistentArgs {
            grid: [
                mem.ptr() + off.grids[0] as u64,
                mem.ptr() + off.grids[1] as u64,
            ],
            bar: mem.ptr() + off.barrier as u64,
            timeout_ns: KERNEL_TIMEOUT_NS,
            nx: lay.nx as i32,
            ny: lay.ny as i32,
            staged: staged.is_some() as i32,
            ..PersistentArgs::default()
        };
        for l in &links {
            run.side[l.side as usize] = SideArgs {
                send: l.send[0].addr,
                recv: l.recv[0].addr,
                send_lkey: l.send[0].lkey,
                recv_lkey: l.recv[0].lkey,
                len: l.send[0].len,
                peer: l.peer as u32,
                nsend: SENDS as u32,
                nrecv: RECVS as u32,
            };
        }
        Ok(GpuRank {
            run,
            staged,
            lay: lay.clone(),
            k,
            mem,
            off,
            links,
            stream: CudaStream::new(k.ordinal)?,
            trigger,
            _mrs: mrs,
            chans,
            ranks_on_gpu: 1,
            rank: 0,
            trace: false,
            clock: std::cell::RefCell::new(None),
            kernel_steps: None,
            ops: OpCount::default(),
            overlap: true,
        })
    }

    fn launch(&self, f: &Function, threads: usize, args: Vec<Arg>) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        // The kernels loop over their cells, so the grid may be smaller than the work.
        let blocks = threads.div_ceil(BLOCK as usize).min(1 << 16) as u32;
        self.launch_blocks(f, blocks, false, args)
    }

    fn launch_blocks(
        &self,
        f: &Function,
        blocks: u32,
        cooperative: bool,
        args: Vec<Arg>,
    ) -> Result<()> {
        let mut l = f.launch_builder(&self.stream);
        for a in &args {
            match a {
                Arg::U64(x) => l.arg(x),
                Arg::I32(x) => l.arg(x),
                Arg::I64(x) => l.arg(x),
                Arg::F64(x) => l.arg(x),
                Arg::Run(x) => l.arg(&**x),
            };
        }
        // SAFETY: `args` match the kernel's parameters (kernels.cu) in number and type, and
        // the memory they point into outlives the stream, which is synchronised before it
        // is dropped.
        unsafe {
            if cooperative {
                l.launch_cooperative(blocks, BLOCK)?
            } else {
                l.launch(blocks, BLOCK)?
            }
        };
        Ok(())
    }

    /// Notes where this rank's CPU is (see [`progress`]).
    fn at(&self, i: u64, step: Step) {
        progress::at(self.rank, i, step);
        if let Some(c) = self.clock.borrow_mut().as_mut() {
            c.enter(step);
        }
    }

    fn grid(&self, p: usize) -> u64 {
        self.run.grid[p]
    }

    /// The interior cells of iteration parity `p` (they touch no halo).
    fn interior(&self, p: usize) -> Result<()> {
        let (nx, ny) = (self.lay.nx, self.lay.ny);
        let n = nx.saturating_sub(2) * ny.saturating_sub(2);
        let args = vec![
            Arg::U64(self.grid(p)),
            Arg::U64(self.grid(1 - p)),
            Arg::I32(nx as i32),
            Arg::I32(ny as i32),
            Arg::F64(C0),
            Arg::F64(C1),
        ];
        self.launch(&self.k.interior, n, args)
    }

    /// The ring cells of iteration `i`, reading the received halos; with `pack_next`, also
    /// the send buffers of the next iteration.
    fn ring(&self, i: u64, pack_next: bool) -> Result<()> {
        let n = grid::ring_len(self.lay.nx, self.lay.ny);
        self.halo_kernel(&self.k.ring, n, i, pack_next)
    }

    /// Every cell of iteration `i` in one kernel (ring and interior), reading the received
    /// halos; with `pack_next`, also the send buffers of the next iteration.
    fn whole(&self, i: u64, pack_next: bool) -> Result<()> {
        let (nx, ny) = (self.lay.nx, self.lay.ny);
        let n = grid::ring_len(nx, ny) + nx.saturating_sub(2) * ny.saturating_sub(2);
        self.halo_kernel(&self.k.whole, n, i, pack_next)
    }

    /// Launches `ring` or `whole` (same parameters) over `n` cells.
    fn halo_kernel(&self, f: &Function, n: usize, i: u64, pack_next: bool) -> Result<()> {
        let args = vec![
            Arg::Run(Box::new(self.run)),
            Arg::I64(i as i64),
            Arg::I32(pack_next as i32),
            Arg::F64(C0),
            Arg::F64(C1),
        ];
        self.launch(f, n, args)
    }

    /// Packs the send buffers of iteration `i` from its grid (before the first iteration;
    /// later ones are packed by [`ring`](Self::ring)).
    fn pack(&self, i: u64) -> Result<()> {
        if self.links.is_empty() {
            return Ok(());
        }
        let args = vec![Arg::Run(Box::new(self.run)), Arg::I64(i as i64)];
        self.launch(&self.k.pack, self.lay.nx.max(self.lay.ny), args)
    }

    /// The staged bytes a link's `sge` names (`None`: not staged, send the SGE itself).
    fn halo(&self, sge: Sge) -> Option<GpuSlice<'_>> {
        self.staged.as_ref().map(|g| {
            let off = (sge.addr - g.addr()) as usize;
            g.slice(off..off + sge.len as usize)
        })
    }
    /// A send of `sge` to `peer` (`send`), or a receive into it (given its credit by the CPU
    /// or by `exec`), posted by the CPU or by `exec`.
    fn post(
        &self,
        comm: &mut Comm,
        send: bool,
        sge: Sge,
        peer: usize,
        exec: Option<&OpBatch>,
    ) -> Result<Request> {
        Ok(match (self.halo(sge), exec, send) {
            (None, None, false) => comm.irecv(sge, peer)?,
            (None, Some(e), false) => comm.irecv_on(sge, peer, e)?,
            (Some(s), None, false) => comm.irecv_gpu(s, peer)?,
            (Some(s), Some(e), false) => comm.irecv_gpu_on(s, peer, e)?,
            (None, None, true) => comm.isend(sge, peer)?,
            (None, Some(e), true) => comm.isend_on(sge, peer, e)?,
            (Some(s), None, true) => comm.isend_gpu(s, peer)?,
            (Some(s), Some(e), true) => comm.isend_gpu_on(s, peer, e)?,
        })
    }

    /// `--trigger host`: the CPU drives every exchange.
    fn run_host(&mut self, comm: &mut Comm, first: u64, end: u64) -> Result<()> {
        if first == end {
            // No iteration: post nothing (a receive posted here would take the next run's
            // first message and leave that run's last receive unmatched).
            return Ok(());
        }
        let mut recvs: Vec<[Option<Request>; 2]> = vec![[None, None]; self.links.len()];
        let p0 = (first % 2) as usize;
        self.at(first, Step::Recv);
        for (k, l) in self.links.iter().enumerate() {
            recvs[k][p0] = Some(self.post(comm, false, l.recv(first), l.peer, None)?);
        }
        self.pack(first)?;
        for i in first..end {
            let p = (i % 2) as usize;
            // The data to send (packed by the last ring kernel) is in memory, and the last
            // ring kernel is done with the other receive buffers.
            self.at(i, Step::Synchronize);
            self.stream.synchronize()?;
            self.at(i, Step::Send);
            let mut reqs = Vec::with_capacity(2 * self.links.len());
            for (k, l) in self.links.iter().enumerate() {
                if i + 1 < end {
                    recvs[k][1 - p] = Some(self.post(comm, false, l.recv(i + 1), l.peer, None)?);
                }
                reqs.push(self.post(comm, true, l.send(i), l.peer, None)?);
            }
            if self.overlap {
                self.at(i, Step::Interior);
                self.interior(p)?;
            }
            reqs.extend(recvs.iter_mut().map(|r| r[p].take().expect("posted ahead")));
            self.at(i, Step::WaitAll);
            comm.wait_all(&reqs)?;
            self.at(i, Step::Ring);
            if self.overlap {
                self.ring(i, i + 1 < end)?;
            } else {
                self.whole(i, i + 1 < end)?;
            }
        }
        self.at(end, Step::Synchronize);
        self.stream.synchronize()?;
        self.at(end, Step::Out);
        Ok(())
    }

    /// `--trigger stream`: the stream drives every exchange; the CPU enqueues, at most
    /// [`AHEAD`] iterations ahead, and never synchronises inside the loop. Per iteration the
    /// CPU makes two launches and hands the stream two lists of memory operations (one kernel
    /// and one list with `--overlap off`); the stream waits for receives only (send
    /// completions are the CPU's, see [`SENDS`]).
    fn run_stream(&mut self, comm: &mut Comm, first: u64, end: u64) -> Result<()> {
        let batch = OpBatch::new();
        // What the stream is handed, counted for `--trace`.
        let exec = Counted::new(&self.stream);
        let mut trace = match self.trace && end - first > Trace::ITERS {
            true => Some(Trace::new(end, self.k.ordinal)?),
            false => None,
        };
        let mut recvs: Vec<[Option<Request>; RECVS]> =
            vec![std::array::from_fn(|_| None); self.links.len()];
        let slot = |i: u64| (i % RECVS as u64) as usize;
        // Receives are posted now (the CPU writes their WQEs); their credits, which let the
        // peer send, are given by the stream once it is done with the buffer.
        for i in first..end.min(first + RECVS as u64) {
            for (k, l) in self.links.iter().enumerate() {
                recvs[k][slot(i)] =
                    Some(self.post(comm, false, l.recv(i), l.peer, Some(&batch))?);
            }
        }
        self.pack(first)?;
        // A start-up fence: every rank's stream has run its first kernel and given its first
        // credits before any stream waits for a peer. Without it, 4 ranks on one GPU stalled
        // in about one run in ten (H100, 4096² blocks): some ranks' streams never ran their
        // first list while the others' waited for those credits (see docs/benchmarks.md).
        batch.flush(&exec)?;
        self.at(first, Step::Synchronize);
        self.stream.synchronize()?;
        comm.barrier()?;
        let mut in_flight: VecDeque<Vec<Request>> = VecDeque::with_capacity(AHEAD + 1);
        for i in first..end {
            let p = (i % 2) as usize;
            // Bound the run-ahead: wait (on the CPU) until iteration i - AHEAD is complete,
            // its sends included (their buffer is packed again by this iteration's ring).
            self.at(i, Step::RunAheadWait);
            while in_flight.len() >= AHEAD {
                let done = in_flight.pop_front().unwrap();
                comm.wait_all(&done)?;
            }
            self.at(i, Step::Send);
            let stream = &self.stream;
            let mut mark = |k: usize| -> Result<()> {
                match trace.as_mut() {
                    Some(t) => t.mark(i, k, stream),
                    None => Ok(()),
                }
            };
            mark(0)?;
            // Per peer: the credit for receive i - 1 + RECVS (its buffer was read by the last
            // iteration's kernel, which the stream runs before this list), then the send. A
            // credit and a send to one peer, next to each other in the list, are rung with one
            // doorbell: with two neighbours, all credits before all sends took a doorbell each
            // (4 rings, 19.7 memory operations per iteration, against 2 rings and 12).
            let mut reqs = Vec::with_capacity(2 * self.links.len());
            for (k, l) in self.links.iter().enumerate() {
                let j = i + RECVS as u64 - 1;
                if i > first && j < end {
                    recvs[k][slot(j)] =
                        Some(self.post(comm, false, l.recv(j), l.peer, Some(&batch))?);
                }
                reqs.push(self.post(comm, true, l.send(i), l.peer, Some(&batch))?);
            }
            if self.overlap {
                self.at(i, Step::Flush);
                batch.flush(&exec)?;
            }
            mark(1)?;
            // The interior needs no halo: it overlaps with the messages in flight. Without
            // overlap the sends and the waits make one list. (One list per iteration with
            // the interior kernel before it measured slower with device halos, 37 vs 34 µs
            // at 64²: the messages overlap nothing and the GPU keeps both kernels.)
            if self.overlap {
                self.at(i, Step::Interior);
                self.interior(p)?;
            }
            mark(2)?;
            self.at(i, Step::WaitOn);
            let recvd: Vec<Request> = recvs
                .iter_mut()
                .map(|r| r[slot(i)].take().expect("posted RECVS iterations ahead"))
                .collect();
            // The stream waits for the halos, consuming their completions itself.
            comm.wait_all_on(&recvd, &batch)?;
            self.at(i, Step::Flush);
            batch.flush(&exec)?;
            reqs.extend(recvd);
            mark(3)?;
            self.at(i, Step::Ring);
            if self.overlap {
                self.ring(i, i + 1 < end)?;
            } else {
                self.whole(i, i + 1 < end)?;
            }
            mark(4)?;
            mark(5)?;
            in_flight.push_back(reqs);
        }
        self.at(end, Step::Flush);
        batch.flush(&exec)?;
        self.ops = exec.count.get();
        self.at(end, Step::Synchronize);
        self.stream.synchronize()?;
        self.at(end, Step::RunAheadWait);
        for done in in_flight {
            comm.wait_all(&done)?;
        }
        self.at(end, Step::Out);
        if let Some(t) = trace {
            t.report(comm.rank(), self.overlap)?;
        }
        Ok(())
    }

    /// `--trigger kernel`: one cooperative launch runs iterations `first..end`.
    fn run_kernel(&mut self, first: u64, end: u64) -> Result<()> {
        let (ch, status) = self
            .chans
            .as_ref()
            .expect("kernel channels for --trigger kernel");
        if self.trace && self.kernel_steps.is_none() {
            self.kernel_steps = Some(PinnedBuffer::new(8 * (KERNEL_STEPS.len() + 1)));
        }
        let a = PersistentArgs {
            peers: ch.table()?,
            status: status.addr(),
            first: first as i64,
            end: end as i64,
            trace: self.kernel_steps.as_ref().map_or(0, |t| {
                t.write_at(0, &[0u8; 8 * (KERNEL_STEPS.len() + 1)]);
                t.addr()
            }),
            ..self.run
        };
        // The barrier words start at zero (an earlier launch that stopped early may have left
        // some behind).
        self.mem.copy_from_host(self.off.barrier, &[0u8; 16])?;
        status.write_at(0, &[0u8; 8]);
        let blocks = self.persistent_blocks()?;
        let args = vec![Arg::Run(Box::new(a)), Arg::F64(C0), Arg::F64(C1)];
        self.at(first, Step::Kernel);
        self.launch_blocks(&self.k.persistent, blocks, true, args)?;
        self.stream.synchronize()?;
        self.at(end, Step::Out);
        let mut b = [0u8; 8];
        status.read_at(0, &mut b);
        let rc = u32::from_ne_bytes(b[..4].try_into().unwrap()) as i32;
        let at = u32::from_ne_bytes(b[4..].try_into().unwrap());
        if rc != code::OK {
            bail!(
                "the persistent kernel stopped at iteration {at}: {}",
                kernel_error(rc)
            );
        }
        Ok(())
    }

    /// Blocks of the persistent kernel: enough for the block's cells, but few enough that
    /// the kernels of every rank sharing the GPU are resident together (their grid-wide
    /// barriers wait for every block).
    fn persistent_blocks(&self) -> Result<u32> {
        let sms = Cuda::get()?.gpu(self.k.ordinal)?.multiprocessors;
        let per_sm = self.k.persistent.max_blocks_per_multiprocessor(BLOCK)?;
        let ranks = self.ranks_on_gpu.max(1);
        let room = (sms * per_sm / ranks).max(1);
        let cells = (self.lay.nx * self.lay.ny).div_ceil(BLOCK as usize) as u32;
        Ok(cells.clamp(1, room))
    }
}

/// The persistent kernel's steps as `--trace` names them (kernels.cu: `StepTimes`).
const KERNEL_STEPS: [&str; 7] = [
    "send", "interior", "wait", "barrier", "ring", "barrier", "receives",
];

/// `--trace` with the kernel trigger: block 0's thread 0's time per step of an iteration of
/// the last launch, in µs, as one line (None if the kernel wrote none).
fn kernel_steps_line(rank: usize, words: &PinnedBuffer) -> Option<String> {
    let mut b = [0u8; 8 * (KERNEL_STEPS.len() + 1)];
    words.read_at(0, &mut b);
    let w: Vec<u64> = b
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let iters = *w.last()?;
    if iters == 0 {
        return None;
    }
    Some(steps_line(
        &format!("trace rank {rank}, kernel (block 0, thread 0) µs per iteration:"),
        KERNEL_STEPS
            .iter()
            .zip(&w)
            .map(|(name, ns)| (*name, *ns as f64 / 1e3 / iters as f64)),
        "total",
    ))
}

/// One `--trace` line: `head`, each step's µs as ` name us |`, then `last` and their sum.
fn steps_line<'a>(
    head: &str,
    steps: impl IntoIterator<Item = (&'a str, f64)>,
    last: &str,
) -> String {
    let mut line = head.to_string();
    let mut total = 0.0;
    for (name, us) in steps {
        total += us;
        line += &format!(" {name} {us:.2} |");
    }
    format!("{line} {last} {total:.2}")
}

/// `--trace` (stream trigger), over the last [`Trace::ITERS`] iterations of a run: the CPU's
/// time in each step of enqueuing an iteration and in the run-ahead wait, and the GPU's time in
/// each step of running it (CUDA events recorded between the steps). The stream starves when
/// enqueuing an iteration takes the CPU longer than the GPU takes to run it.
struct Trace {
    from: u64,
    last: Option<std::time::Instant>,
    /// Per CPU step: total time.
    steps: [std::time::Duration; 6],
    iters: u64,
    /// Per traced iteration: events recorded after its send list, interior, wait list and
    /// ring (the send list's time runs from the previous iteration's ring event).
    gpu: Vec<[CudaEvent; 4]>,
}

impl Trace {
    const ITERS: u64 = 200;
    const STEPS: [&'static str; 6] = [
        "run-ahead wait",
        "irecv_on + isend_on + flush",
        "interior launch",
        "wait_all_on + flush",
        "ring launch",
        "bookkeeping",
    ];
    const GPU_STEPS: [&'static str; 4] = ["credits + send list", "interior", "wait list", "ring"];

    fn new(end: u64, ordinal: i32) -> Result<Trace> {
        let gpu = (0..Self::ITERS)
            .map(|_| -> Result<[CudaEvent; 4]> {
                Ok([
                    CudaEvent::new(ordinal)?,
                    CudaEvent::new(ordinal)?,
                    CudaEvent::new(ordinal)?,
                    CudaEvent::new(ordinal)?,
                ])
            })
            .collect::<Result<_>>()?;
        Ok(Trace {
            from: end - Self::ITERS,
            last: None,
            steps: Default::default(),
            iters: 0,
            gpu,
        })
    }

    /// Step `k` of iteration `i` was just enqueued (0: the run-ahead wait ended).
    fn mark(&mut self, i: u64, k: usize, stream: &CudaStream) -> Result<()> {
        let now = std::time::Instant::now();
        if i >= self.from {
            if let Some(l) = self.last {
                self.steps[k] += now - l;
            }
            self.iters += (k == 0) as u64;
            if (1..=4).contains(&k) {
                self.gpu[(i - self.from) as usize][k - 1].record(stream)?;
            }
        }
        // The event's record is left out of every CPU step.
        self.last = Some(std::time::Instant::now());
        Ok(())
    }

    fn report(&self, rank: usize, overlap: bool) -> Result<()> {
        if !overlap {
            eprintln!("trace rank {rank}: overlap off: the sends and the waits are one list (the wait list), the kernel is `whole` (the ring), nothing runs between them");
        }
        let n = self.iters.max(1) as f64;
        let cpu = Self::STEPS
            .iter()
            .zip(&self.steps)
            .map(|(name, d)| (*name, d.as_secs_f64() * 1e6 / n));
        let head = format!("trace rank {rank}, CPU µs per iteration:");
        eprintln!("{}", steps_line(&head, cpu, "total"));
        // GPU: median per step over the traced iterations (the first has no previous ring).
        let mut per: [Vec<f64>; 4] = Default::default();
        for w in self.gpu.windows(2) {
            let (prev, cur) = (&w[0], &w[1]);
            per[0].push(cur[0].since(&prev[3])?.as_secs_f64() * 1e6);
            for k in 1..4 {
                per[k].push(cur[k].since(&cur[k - 1])?.as_secs_f64() * 1e6);
            }
        }
        let gpu = Self::GPU_STEPS.iter().zip(&mut per).map(|(name, v)| {
            v.sort_by(f64::total_cmp);
            (*name, v.get(v.len() / 2).copied().unwrap_or(0.0))
        });
        let head = format!("trace rank {rank}, GPU µs per iteration (median):");
        eprintln!("{}", steps_line(&head, gpu, "sum"));
        Ok(())
    }
}

/// What a persistent-kernel error code means.
fn kernel_error(rc: i32) -> String {
    match rc {
        code::TIMEOUT => "a device-side wait timed out (a peer stopped or never started)".into(),
        code::INVALID => "a malformed channel descriptor or argument".into(),
        code::FULL => "a channel's ring was full".into(),
        BARRIER_TIMEOUT => "a grid-wide barrier timed out (blocks not resident together?)".into(),
        SHORT_MESSAGE => "a halo message had the wrong length".into(),
        rc => match code::syndrome(rc) {
            Some(s) => format!("an error completion: {s:?}"),
            None => format!("error code {rc:#x}"),
        },
    }
}

impl Solver for GpuRank<'_> {
    fn run(&mut self, comm: &mut Comm, first: u64, count: u64) -> Result<()> {
        let end = first + count;
        if self.trace {
            // Each run counts afresh: the last one is the timed one.
            *self.clock.borrow_mut() = Some(StepClock::new());
        }
        let r = match self.trigger {
            Trigger::Stream => self.run_stream(comm, first, end).map_err(|e| {
                // Where this rank's stream sits, if it is held up by a wait.
                match self.stream.unmet_wait_report() {
                    Some(r) => e.context(r),
                    None => e,
                }
            }),
            Trigger::Kernel => self.run_kernel(first, end),
            _ => self.run_host(comm, first, end),
        };
        // Noted now: tearing down behind a stream stuck in a wait blocks (freeing memory
        // waits for the GPU), so the error might never be returned.
        if let Err(e) = &r {
            progress::failed(self.rank, e);
        }
        r
    }

    fn owned(&self, done: u64) -> Result<Vec<f64>> {
        self.stream.synchronize()?;
        let mut b = vec![0u8; 8 * self.lay.cells()];
        self.mem
            .copy_to_host(self.off.grids[(done % 2) as usize], &mut b)?;
        Ok(self.lay.owned(&grid::from_bytes(&b)))
    }
}

/// Runs this rank's part: returns the time per iteration and the final owned cells.
pub fn solve(comm: &mut Comm, lay: &Layout, cfg: &Config, k: &Kernels) -> Result<(f64, Vec<f64>)> {
    let place = cfg.placement.as_ref().context("a GPU placement")?;
    let k = k.on(place.ordinal(comm.rank()))?;
    let dev_halo = if cfg.halo == Halo::Device {
        halo_bytes(lay)
    } else {
        0
    };
    let mem = Arc::new(DeviceBuffer::alloc(
        k.ordinal,
        Offsets::new(lay).total + dev_halo,
    )?);
    let staged = match &cfg.gpu_memory {
        Some((GpuMemoryPath::Staged, _)) if lay.links().next().is_some() => {
            // The kernel trigger stages through its channels' own bounces; the host and
            // stream triggers through mp's pool: a bounce per receive posted ahead and per
            // iteration the CPU runs ahead, per side, each as large as the longest side's
            // message.
            if cfg.trigger != Trigger::Kernel {
                let links = lay.links().count();
                let longest = lay
                    .links()
                    .map(|(s, _)| 8 * lay.side_len(s))
                    .max()
                    .unwrap_or(8);
                comm.set_staging(
                    longest,
                    links * (RECVS + AHEAD + 2),
                    links * (SENDS + AHEAD + 2),
                )?;
            }
            Some(comm.register_gpu(mem.clone(), GpuMemoryPath::Staged)?)
        }
        _ => None,
    };
    let host = (cfg.halo == Halo::Host && lay.links().next().is_some())
        .then(|| PinnedBuffer::new(halo_bytes(lay)));
    if host.as_ref().is_some_and(|h| !h.gpu_mapped()) {
        bail!("--halo host: pinned host memory could not be mapped for the GPU");
    }
    let mut rank = GpuRank::new(lay, k, &mem, host.as_ref(), Some(comm), cfg.trigger, staged)?;
    // Ranks that share a GPU (threads share it; processes time-share it).
    rank.ranks_on_gpu = place.sharing(comm.rank(), cfg.ranks) as u32;
    rank.trace = cfg.trace;
    rank.overlap = cfg.overlap;
    rank.rank = comm.rank();
    let out = crate::drive(comm, &mut rank, cfg);
    // Nothing of this rank may still run when its memory goes.
    rank.stream.synchronize()?;
    if cfg.trace {
        if let Some(c) = rank.clock.borrow().as_ref() {
            eprintln!("{}", c.line(rank.rank, cfg.iters));
        }
        if cfg.trigger == Trigger::Stream {
            eprintln!("{}", rank.ops.line(rank.rank, cfg.iters));
        }
        if let Some(line) = rank
            .kernel_steps
            .as_ref()
            .and_then(|w| kernel_steps_line(rank.rank, w))
        {
            eprintln!("{line}");
        }
    }
    out
}

/// The single-rank run `--check` compares with, with the same kernels.
pub fn reference(k: &Kernels, gpu: i32, gx: usize, gy: usize, iters: u64) -> Result<Vec<f64>> {
    let k = k.on(gpu)?;
    let lay = Layout::whole(gx, gy);
    let mem = DeviceBuffer::alloc(k.ordinal, Offsets::new(&lay).total)?;
    let rank = GpuRank::new(&lay, k, &mem, None, None, Trigger::Host, None)?;
    for i in 0..iters {
        let p = (i % 2) as usize;
        rank.interior(p)?;
        rank.ring(i, false)?;
    }
    rank.owned(iters)
}

#[cfg(test)]
mod tests {
    use super::steps_line;

    #[test]
    fn a_trace_line_names_each_step_then_the_sum() {
        let line = steps_line("trace rank 1:", [("send", 1.234), ("wait", 2.0)], "total");
        assert_eq!(line, "trace rank 1: send 1.23 | wait 2.00 | total 3.23");
    }
}
