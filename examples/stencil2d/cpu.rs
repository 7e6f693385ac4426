//! `--trigger cpu`: the CPU computes; the exchange is posted on a host stream (a CPU thread
//! that runs op lists in order, as a CUDA stream would): the stream waits for the peer's
//! credit, rings the doorbell and waits for the completions; the rank's thread computes the
//! interior meanwhile and synchronises with the stream before it needs the halo.

use crate::grid::{self, Layout};
use crate::progress::{self, Step};
use crate::{Config, Solver};
use anyhow::Result;
use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::MemoryRegion;
use gdasync::mp::{Comm, Request};
use std::ops::Range;

/// The owned cells that touch no halo.
pub fn interior(l: &Layout, cur: &[f64], nxt: &mut [f64]) {
    let s = l.stride();
    for r in 2..l.nx {
        for c in 2..l.ny {
            grid::update(cur, nxt, r * s + c, s);
        }
    }
}

/// The owned cells next to the halo (the ring the GPU's boundary kernel computes).
pub fn boundary(l: &Layout, cur: &[f64], nxt: &mut [f64]) {
    let s = l.stride();
    for k in 0..grid::ring_len(l.nx, l.ny) {
        let (r, c) = grid::ring_cell(l.nx, l.ny, k);
        grid::update(cur, nxt, r * s + c, s);
    }
}

/// The single-rank run `--check` compares with: owned cells after `iters` iterations.
pub fn reference(gx: usize, gy: usize, iters: u64) -> Vec<f64> {
    let l = Layout::whole(gx, gy);
    let mut g = [l.initial_grid(), l.initial_grid()];
    for i in 0..iters {
        let (a, b) = g.split_at_mut(1);
        let (cur, nxt) = if i % 2 == 0 {
            (&a[0], &mut b[0])
        } else {
            (&b[0], &mut a[0])
        };
        interior(&l, cur, nxt);
        boundary(&l, cur, nxt);
    }
    l.owned(&g[(iters % 2) as usize])
}

/// One neighbour's messages: byte ranges in the registered halo buffer.
struct Link {
    side: grid::Side,
    peer: usize,
    send: Range<usize>,
    /// By iteration parity: a receive is posted two iterations ahead.
    recv: [Range<usize>; 2],
}

struct CpuRank<'m> {
    lay: Layout,
    grids: [Vec<f64>; 2],
    mr: MemoryRegion<'m>,
    links: Vec<Link>,
    stream: HostStream,
}

/// Runs this rank's part: returns the time per iteration and the final owned cells.
pub fn solve(comm: &mut Comm, lay: &Layout, cfg: &Config) -> Result<(f64, Vec<f64>)> {
    // Per neighbour: a send buffer and two receive buffers, packed one after the other.
    let mut links = Vec::new();
    let mut at = 0;
    for (side, peer) in lay.links() {
        let len = 8 * lay.side_len(side);
        links.push(Link {
            side,
            peer,
            send: at..at + len,
            recv: [at + len..at + 2 * len, at + 2 * len..at + 3 * len],
        });
        at += 3 * len;
    }
    let mut halo = vec![0u8; at.max(8)];
    let mr = comm.register(&mut halo)?;
    let mut rank = CpuRank {
        lay: lay.clone(),
        grids: [lay.initial_grid(), lay.initial_grid()],
        mr,
        links,
        stream: HostStream::new()?,
    };
    crate::drive(comm, &mut rank, cfg)
}

impl Solver for CpuRank<'_> {
    fn run(&mut self, comm: &mut Comm, first: u64, count: u64) -> Result<()> {
        let CpuRank {
            lay,
            grids,
            mr,
            links,
            stream,
        } = self;
        // Receives are posted two iterations ahead; their credits go through the stream (in
        // order with its sends), and it consumes their completions.
        let post = |comm: &mut Comm, l: &Link, p: usize| -> Result<Request> {
            Ok(comm.irecv_on(mr.sge(l.recv[p].clone()), l.peer, &*stream)?)
        };
        let end = first + count;
        let mut recvs: Vec<[Option<Request>; 2]> = vec![[None, None]; links.len()];
        for i in first..end.min(first + 2) {
            for (k, l) in links.iter().enumerate() {
                recvs[k][(i % 2) as usize] = Some(post(comm, l, (i % 2) as usize)?);
            }
        }
        let rank = comm.rank();
        for i in first..end {
            progress::at(rank, i, Step::Cpu);
            let p = (i % 2) as usize;
            let (a, b) = grids.split_at_mut(1);
            let (cur, nxt) = if p == 0 {
                (&mut a[0], &mut b[0])
            } else {
                (&mut b[0], &mut a[0])
            };
            // Pack every side next to a neighbour and hand the sends to the stream.
            let mut reqs = Vec::with_capacity(2 * links.len());
            for l in links.iter() {
                let v: Vec<f64> = lay.side_cells(l.side, false).map(|j| cur[j]).collect();
                mr.write_at(l.send.start, &grid::to_bytes(&v));
                reqs.push(comm.isend_on(mr.sge(l.send.clone()), l.peer, &*stream)?);
            }
            interior(lay, cur, nxt);
            for r in recvs.iter_mut() {
                let r = r[p].take().expect("receive posted two iterations ahead");
                comm.wait_on(r, &*stream)?;
                reqs.push(r);
            }
            for &s in &reqs[..links.len()] {
                comm.wait_on(s, &*stream)?;
            }
            stream.synchronize()?;
            comm.wait_all(&reqs)?;
            for (k, l) in links.iter().enumerate() {
                let mut b = vec![0u8; l.recv[p].len()];
                mr.read_at(l.recv[p].start, &mut b);
                for (j, x) in lay.side_cells(l.side, true).zip(grid::from_bytes(&b)) {
                    cur[j] = x;
                }
                // The buffer is read: the neighbour may fill it for iteration i + 2.
                if i + 2 < end {
                    recvs[k][p] = Some(post(comm, l, p)?);
                }
            }
            boundary(lay, cur, nxt);
        }
        progress::at(rank, end, Step::Out);
        Ok(())
    }

    fn owned(&self, done: u64) -> Result<Vec<f64>> {
        Ok(self.lay.owned(&self.grids[(done % 2) as usize]))
    }
}
