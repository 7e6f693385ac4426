//! The GPU triggers. Each rank owns one CUDA stream and one device allocation (both grids,
//! and the packed columns), registered as one memory region. Rows travel straight from and
//! into the grids; columns are packed into contiguous buffers first.
//!
//! - `host`: per iteration the CPU synchronises the stream, posts the sends, launches the
//!   interior, waits for the messages on the CPU, then launches unpack and boundary.
//! - `stream`: the CPU only enqueues: pack → `isend_on(stream)` → interior →
//!   `wait_on(stream)` → unpack → boundary → the next receives' credits, all on the stream,
//!   and at most [`AHEAD`] iterations ahead of it.
//!
//! Kernels are compiled at run time with NVRTC, with fused multiply-add off (`--fmad=false`)
//! and the update written in the same order as the CPU's, so every variant gives the same bits.

use crate::grid::{self, Layout, Side, C0, C1};
use crate::{Config, Solver, Trigger};
use anyhow::{Context, Result};
use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer, Function, Module};
use gdasync::gdsync::exec::OpBatch;
use gdasync::gdsync::{Access, MemoryRegion};
use gdasync::mp::{Comm, Request};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ops::Range;

/// How many iterations the CPU may enqueue ahead of the stream (`--trigger stream`). Each
/// holds a few dozen memory operations; a stream takes at most `cuda::MAX_QUEUED_OPS` (512).
pub const AHEAD: usize = 4;

const KERNELS: &str = r#"
typedef unsigned long long u64;

// The update, in the order the CPU evaluates it (grid::update).
__device__ __forceinline__ void upd(const double *__restrict__ cur, double *__restrict__ nxt,
                                    long i, long s, double c0, double c1) {
    double sum = (cur[i - s] + cur[i + s]) + (cur[i - 1] + cur[i + 1]);
    nxt[i] = c0 * cur[i] + c1 * sum;
}

#define FOR_EACH(k, n) \
    for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < (n); k += (long)gridDim.x * blockDim.x)

// Owned cells touching no halo: rows 2..nx-1, columns 2..ny-1.
extern "C" __global__ void interior(u64 cur, u64 nxt, int nx, int ny, double c0, double c1) {
    long w = ny - 2, h = nx - 2, s = ny + 2;
    if (w <= 0 || h <= 0) return;
    FOR_EACH(k, w * h) {
        long r = 2 + k / w, c = 2 + k % w;
        upd((const double *)cur, (double *)nxt, r * s + c, s, c0, c1);
    }
}

// The ring of owned cells next to the halo, numbered as grid::ring_cell does.
extern "C" __global__ void boundary(u64 cur, u64 nxt, int nx, int ny, double c0, double c1) {
    long s = ny + 2, top = (long)ny * min(nx, 2);
    long n = top + (long)max(nx - 2, 0) * min(ny, 2);
    FOR_EACH(k, n) {
        long r, c;
        if (k < ny) { r = 1; c = 1 + k; }
        else if (nx > 1 && k < 2L * ny) { r = nx; c = 1 + k - ny; }
        else {
            long j = k - top, rows = nx - 2;
            if (j < rows) { r = 2 + j; c = 1; } else { r = 2 + j - rows; c = ny; }
        }
        upd((const double *)cur, (double *)nxt, r * s + c, s, c0, c1);
    }
}

// Owned columns 1 and ny into the send buffers (0: no neighbour on that side).
extern "C" __global__ void pack(u64 cur, int nx, int ny, u64 west, u64 east) {
    const double *g = (const double *)cur;
    long s = ny + 2;
    FOR_EACH(k, nx) {
        if (west) ((double *)west)[k] = g[(1 + k) * s + 1];
        if (east) ((double *)east)[k] = g[(1 + k) * s + ny];
    }
}

// Received columns into halo columns 0 and ny + 1.
extern "C" __global__ void unpack(u64 cur, int nx, int ny, u64 west, u64 east) {
    double *g = (double *)cur;
    long s = ny + 2;
    FOR_EACH(k, nx) {
        if (west) g[(1 + k) * s] = ((const double *)west)[k];
        if (east) g[(1 + k) * s + ny + 1] = ((const double *)east)[k];
    }
}
"#;

/// The compiled kernels (one module, shared by the rank threads of a process).
pub struct Kernels {
    _module: Module,
    interior: Function,
    boundary: Function,
    pack: Function,
    unpack: Function,
}

impl Kernels {
    pub fn compile() -> Result<Kernels> {
        let m = Module::compile_with_options(0, KERNELS, &["--fmad=false"])
            .context("compile the stencil kernels with NVRTC")?;
        Ok(Kernels {
            interior: m.function("interior")?,
            boundary: m.function("boundary")?,
            pack: m.function("pack")?,
            unpack: m.function("unpack")?,
            _module: m,
        })
    }
}

/// A kernel argument (kept alive while the launch reads it).
enum Arg {
    U64(u64),
    I32(i32),
    F64(f64),
}

/// One neighbour's messages: byte ranges in the rank's device allocation, by iteration
/// parity (rows live in the grid read in that iteration).
struct Link {
    peer: usize,
    send: [Range<usize>; 2],
    recv: [Range<usize>; 2],
}

/// Where things are in the device allocation (byte offsets).
struct Offsets {
    grids: [usize; 2],
    /// West and east: the packed column to send, and the two it is received into.
    col_send: [Option<usize>; 2],
    col_recv: [[Option<usize>; 2]; 2],
    total: usize,
}

impl Offsets {
    fn new(l: &Layout) -> Offsets {
        let grid = 8 * l.cells();
        let mut at = 2 * grid;
        let mut col_send = [None; 2];
        let mut col_recv = [[None; 2]; 2];
        for (k, side) in [Side::West, Side::East].into_iter().enumerate() {
            if l.neighbours[side as usize].is_some() {
                let len = 8 * l.nx;
                col_send[k] = Some(at);
                col_recv[k] = [Some(at + len), Some(at + 2 * len)];
                at += 3 * len;
            }
        }
        Offsets {
            grids: [0, grid],
            col_send,
            col_recv,
            total: at,
        }
    }
}

/// One rank on the GPU (also the single-rank reference, with no links).
struct GpuRank<'m> {
    lay: Layout,
    k: &'m Kernels,
    mem: &'m DeviceBuffer,
    mr: Option<MemoryRegion<'m>>,
    off: Offsets,
    links: Vec<Link>,
    stream: CudaStream,
    trigger: Trigger,
}

impl<'m> GpuRank<'m> {
    fn new(
        lay: &Layout,
        k: &'m Kernels,
        mem: &'m DeviceBuffer,
        comm: Option<&Comm>,
        trigger: Trigger,
    ) -> Result<GpuRank<'m>> {
        let off = Offsets::new(lay);
        let init = grid::to_bytes(&lay.initial_grid());
        for g in off.grids {
            mem.copy_from_host(g, &init)?;
        }
        let mr = comm
            .map(|c| c.pd().register_device(mem, Access::ALL))
            .transpose()?;
        let s = lay.stride();
        let row = |p: usize, r: usize| {
            let at = off.grids[p] + 8 * (r * s + 1);
            at..at + 8 * lay.ny
        };
        let col = |at: Option<usize>| {
            let at = at.expect("a column buffer for every side with a neighbour");
            at..at + 8 * lay.nx
        };
        let links = lay
            .links()
            .map(|(side, peer)| {
                let (send, recv) = match side {
                    Side::North => ([row(0, 1), row(1, 1)], [row(0, 0), row(1, 0)]),
                    Side::South => (
                        [row(0, lay.nx), row(1, lay.nx)],
                        [row(0, lay.nx + 1), row(1, lay.nx + 1)],
                    ),
                    Side::West | Side::East => {
                        let k = (side == Side::East) as usize;
                        (
                            [col(off.col_send[k]), col(off.col_send[k])],
                            [col(off.col_recv[k][0]), col(off.col_recv[k][1])],
                        )
                    }
                };
                Link { peer, send, recv }
            })
            .collect();
        Ok(GpuRank {
            lay: lay.clone(),
            k,
            mem,
            mr,
            off,
            links,
            stream: CudaStream::new(0)?,
            trigger,
        })
    }

    fn addr(&self, off: Option<usize>) -> u64 {
        off.map_or(0, |o| self.mem.ptr() + o as u64)
    }

    fn sge(&self, r: &Range<usize>) -> gdasync::gdsync::Sge {
        self.mr.as_ref().expect("a registered rank").sge(r.clone())
    }

    fn launch(&self, f: &Function, threads: usize, mut args: Vec<Arg>) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let mut ptrs: Vec<*mut c_void> = args
            .iter_mut()
            .map(|a| match a {
                Arg::U64(x) => x as *mut u64 as *mut c_void,
                Arg::I32(x) => x as *mut i32 as *mut c_void,
                Arg::F64(x) => x as *mut f64 as *mut c_void,
            })
            .collect();
        const BLOCK: usize = 256;
        // The kernels loop over their cells, so the grid may be smaller than the work.
        let blocks = threads.div_ceil(BLOCK).min(1 << 16) as u32;
        // SAFETY: `args` match the kernel's parameters (KERNELS) in number and type, and the
        // device memory they point into outlives the stream, which is synchronised before
        // the allocation is dropped.
        unsafe { f.launch(&self.stream, blocks, BLOCK as u32, &mut ptrs)? };
        Ok(())
    }

    fn grid(&self, p: usize) -> u64 {
        self.addr(Some(self.off.grids[p]))
    }

    /// `interior` or `boundary` of iteration parity `p`.
    fn update(&self, f: &Function, threads: usize, p: usize) -> Result<()> {
        let (nx, ny) = (self.lay.nx as i32, self.lay.ny as i32);
        let args = vec![
            Arg::U64(self.grid(p)),
            Arg::U64(self.grid(1 - p)),
            Arg::I32(nx),
            Arg::I32(ny),
            Arg::F64(C0),
            Arg::F64(C1),
        ];
        self.launch(f, threads, args)
    }

    fn interior(&self, p: usize) -> Result<()> {
        let (nx, ny) = (self.lay.nx, self.lay.ny);
        let n = nx.saturating_sub(2) * ny.saturating_sub(2);
        self.update(&self.k.interior, n, p)
    }

    fn boundary(&self, p: usize) -> Result<()> {
        let n = grid::ring_len(self.lay.nx, self.lay.ny);
        self.update(&self.k.boundary, n, p)
    }

    /// `pack` (columns out of grid `p`) or `unpack` (received columns of parity `p` into it).
    fn columns(&self, unpack: bool, p: usize) -> Result<()> {
        if !self.lay.has_columns() {
            return Ok(());
        }
        let (f, [w, e]) = if unpack {
            let r = &self.off.col_recv;
            (&self.k.unpack, [r[0][p], r[1][p]])
        } else {
            (&self.k.pack, self.off.col_send)
        };
        let args = vec![
            Arg::U64(self.grid(p)),
            Arg::I32(self.lay.nx as i32),
            Arg::I32(self.lay.ny as i32),
            Arg::U64(self.addr(w)),
            Arg::U64(self.addr(e)),
        ];
        self.launch(f, self.lay.nx, args)
    }

    /// `--trigger host`: the CPU drives every exchange.
    fn run_host(&mut self, comm: &mut Comm, first: u64, end: u64) -> Result<()> {
        let mut recvs: Vec<[Option<Request>; 2]> = vec![[None, None]; self.links.len()];
        let post = |comm: &mut Comm, l: &Link, p: usize| comm.irecv(self.sge(&l.recv[p]), l.peer);
        for (k, l) in self.links.iter().enumerate() {
            recvs[k][(first % 2) as usize] = Some(post(comm, l, (first % 2) as usize)?);
        }
        for i in first..end {
            let p = (i % 2) as usize;
            self.columns(false, p)?;
            // The data to send (rows of the last iteration, packed columns) is in memory.
            self.stream.synchronize()?;
            let mut reqs = Vec::with_capacity(2 * self.links.len());
            for (k, l) in self.links.iter().enumerate() {
                if i + 1 < end {
                    // Iteration i - 1 is done with these buffers (synchronised above).
                    recvs[k][1 - p] = Some(post(comm, l, 1 - p)?);
                }
                reqs.push(comm.isend(self.sge(&l.send[p]), l.peer)?);
            }
            self.interior(p)?;
            reqs.extend(recvs.iter_mut().map(|r| r[p].take().expect("posted ahead")));
            comm.wait_all(&reqs)?;
            self.columns(true, p)?;
            self.boundary(p)?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// `--trigger stream`: the stream drives every exchange; the CPU enqueues, at most
    /// [`AHEAD`] iterations ahead, and never synchronises inside the loop.
    fn run_stream(&mut self, comm: &mut Comm, first: u64, end: u64) -> Result<()> {
        let batch = OpBatch::new();
        let mut recvs: Vec<[Option<Request>; 2]> = vec![[None, None]; self.links.len()];
        // Receives are posted now (the CPU writes their WQEs); their credits, which let the
        // peer send, are given by the stream once it is done with the buffer.
        let post = |comm: &mut Comm, l: &Link, p: usize, b: &OpBatch| {
            comm.irecv_on(self.sge(&l.recv[p]), l.peer, b)
        };
        for i in first..end.min(first + 2) {
            let p = (i % 2) as usize;
            for (k, l) in self.links.iter().enumerate() {
                recvs[k][p] = Some(post(comm, l, p, &batch)?);
            }
        }
        batch.flush(&self.stream)?;
        let mut in_flight: VecDeque<Vec<Request>> = VecDeque::with_capacity(AHEAD + 1);
        for i in first..end {
            let p = (i % 2) as usize;
            // Bound the run-ahead: wait (on the CPU) until iteration i - AHEAD is complete.
            // Its requests are released here too.
            while in_flight.len() >= AHEAD {
                let done = in_flight.pop_front().unwrap();
                comm.wait_all(&done)?;
            }
            self.columns(false, p)?;
            // The stream waits for each peer's credit, then rings: after the pack kernel.
            let mut reqs = Vec::with_capacity(2 * self.links.len());
            for l in &self.links {
                reqs.push(comm.isend_on(self.sge(&l.send[p]), l.peer, &batch)?);
            }
            batch.flush(&self.stream)?;
            // The interior needs no halo: it overlaps with the messages in flight.
            self.interior(p)?;
            for r in recvs.iter_mut() {
                reqs.push(r[p].take().expect("posted two iterations ahead"));
            }
            // The stream waits for every receive and send to complete (a send buffer is
            // rewritten next iteration), consuming the completions itself.
            comm.wait_all_on(&reqs, &batch)?;
            batch.flush(&self.stream)?;
            self.columns(true, p)?;
            self.boundary(p)?;
            if i + 2 < end {
                // Buffers of parity p are read: let the peers fill them for iteration i + 2.
                for (k, l) in self.links.iter().enumerate() {
                    recvs[k][p] = Some(post(comm, l, p, &batch)?);
                }
                batch.flush(&self.stream)?;
            }
            in_flight.push_back(reqs);
        }
        self.stream.synchronize()?;
        for done in in_flight {
            comm.wait_all(&done)?;
        }
        Ok(())
    }
}

impl Solver for GpuRank<'_> {
    fn run(&mut self, comm: &mut Comm, first: u64, count: u64) -> Result<()> {
        let end = first + count;
        match self.trigger {
            Trigger::Stream => self.run_stream(comm, first, end),
            _ => self.run_host(comm, first, end),
        }
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
    let mem = DeviceBuffer::alloc(0, Offsets::new(lay).total)?;
    let mut rank = GpuRank::new(lay, k, &mem, Some(comm), cfg.trigger)?;
    let out = crate::drive(comm, &mut rank, cfg);
    // Nothing of this rank may still run when its memory goes.
    rank.stream.synchronize()?;
    out
}

/// The single-rank run `--check` compares with, with the same kernels.
pub fn reference(k: &Kernels, gx: usize, gy: usize, iters: u64) -> Result<Vec<f64>> {
    let lay = Layout::whole(gx, gy);
    let mem = DeviceBuffer::alloc(0, Offsets::new(&lay).total)?;
    let rank = GpuRank::new(&lay, k, &mem, None, Trigger::Host)?;
    for i in 0..iters {
        let p = (i % 2) as usize;
        rank.interior(p)?;
        rank.boundary(p)?;
    }
    rank.owned(iters)
}
