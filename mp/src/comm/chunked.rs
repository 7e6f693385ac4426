//! Staged messages larger than a bounce, sent and received (put and got) in bounce-sized
//! chunks: the request the caller holds (the parent) and one sub-request per chunk, each an
//! ordinary staged send, receive, put or get of one bounce (`chunk_op`).
//!
//! From the CPU (`isend_gpu`, `irecv_gpu`, `iput_gpu`, `iget_gpu`) the chunks are a pipeline
//! driven by every progress call: the sender copies the next chunk out as a send bounce
//! comes back; the receiver copies a chunk in after its completion, and only then posts the
//! next chunk's receive into the freed bounce, whose credit lets the sender go on. So a
//! receive bounce is reused only once copied out, through the credits every receive gives.
//! A put writes chunk k from a send bounce at its offset + k bounces of the window; a get
//! reads it into a receive bounce and copies it in before the bounce takes the next chunk.
//! Every staged message from the CPU goes this way (an empty one as one chunk without a
//! bounce), so each queues behind the earlier ones of its peer and queue. On an executor
//! (`_on`) every chunk is posted at once, each in a bounce of its own (copies in the
//! executor's order), so the message must fit its side of the pool. The last chunk completes
//! the parent; an error in any chunk fails it, and the chunks still posted drain.

use super::chunk_op::{ChunkOp, Piece, NO_BYTES};
use super::requests::{Request, Status};
use super::wait::Look;
use super::Comm;
use crate::staged::{GpuMem, GpuSlice};
use gdsync::exec::Executor;
use gdsync::{Error, Result};
use std::collections::VecDeque;
use std::time::Instant;

/// A staged message larger than a bounce, in chunks.
pub(super) struct Chunked {
    /// The request the caller holds.
    parent: Request,
    peer: usize,
    /// What each chunk does.
    op: ChunkOp,
    mem: GpuMem,
    offset: usize,
    len: usize,
    /// Bytes per chunk (the bounce's when the message began).
    chunk: usize,
    /// Chunks of the message (one for an empty message).
    chunks: usize,
    /// Chunks posted so far.
    posted: usize,
    /// Chunks posted and not yet retired, in order: sub-request and its length.
    inflight: VecDeque<(Request, usize)>,
    /// Bytes received so far.
    got: usize,
    /// Posted on an executor (every chunk at once); else a pipeline the CPU drives.
    exec: bool,
    /// The first error, which the parent's wait reports.
    error: Option<Error>,
    /// The parent was released: what is still posted only drains.
    orphan: bool,
}

impl Chunked {
    /// Whether the CPU still has chunks of it to post.
    fn posting(&self) -> bool {
        !self.exec && !self.orphan && self.error.is_none() && self.posted < self.chunks
    }

    /// Whether it queues in the receive ring of `peer` (`recv`) or its send queue.
    fn in_queue(&self, peer: usize, recv: bool) -> bool {
        self.peer == peer && self.op.recv_ring() == recv
    }

    /// Byte offset in the message and length of chunk `k`.
    fn piece(&self, k: usize) -> (usize, usize) {
        let at = k * self.chunk;
        (at, self.chunk.min(self.len - at))
    }
}

impl Comm {
    /// A staged message (`op`) of `s` with `peer` from the CPU: the chunks that bounces allow
    /// are posted now (after those of earlier messages of that peer and queue), the rest as
    /// bounces free.
    pub(crate) fn chunked_start(
        &mut self,
        s: &GpuSlice<'_>,
        peer: usize,
        op: ChunkOp,
    ) -> Result<Request> {
        let parent = self.chunked_parent(s, peer, op, false)?;
        let i = self.chunked.len() - 1;
        self.advance_chunked(i, false);
        Ok(parent)
    }

    /// The same on `exec`: every chunk posted now, each in its own bounce; refused when the
    /// pool's side has fewer bounces than the message has chunks.
    pub(crate) fn chunked_on(
        &mut self,
        s: &GpuSlice<'_>,
        peer: usize,
        op: ChunkOp,
        exec: &impl Executor,
    ) -> Result<Request> {
        let shape = self.stage_shape;
        let chunks = s.len.div_ceil(shape.bounce);
        let have = if op.inbound() {
            shape.recvs
        } else {
            shape.sends
        };
        if chunks > have {
            let (what, cpu) = op.names();
            return Err(Error::invalid(format!(
                "a staged {what} of {} bytes on an executor needs {chunks} bounces of {} bytes at once, and the staging pool has {have} for its side: raise it with Comm::set_staging, or use {cpu} (from the CPU, chunks go through any pool)",
                s.len, shape.bounce
            )));
        }
        let parent = self.chunked_parent(s, peer, op, true)?;
        loop {
            let i = self.chunk_index(parent).expect("not yet released");
            if self.chunked[i].posted == self.chunked[i].chunks {
                return Ok(parent);
            }
            if let Err(e) = self.post_chunk_on(i, exec) {
                // The chunks already posted drain; the parent is never handed out.
                let i = self.chunk_index(parent).expect("not yet released");
                self.chunked[i].orphan = true;
                self.release(parent);
                return Err(e);
            }
        }
    }

    /// The parent request of a chunked message, and its record (the last in the list).
    fn chunked_parent(
        &mut self,
        s: &GpuSlice<'_>,
        peer: usize,
        op: ChunkOp,
        exec: bool,
    ) -> Result<Request> {
        self.peers.get(peer)?;
        if u32::try_from(s.len).is_err() {
            return Err(Error::invalid(format!(
                "a staged message of {} bytes is longer than a request can report (4 GiB - 1): send it in pieces",
                s.len
            )));
        }
        if exec {
            // CPU messages queue behind earlier ones (`advance_chunked`); an executor's
            // chunks are posted now, so the earlier ones must be first.
            self.chunks_posted(peer, op.recv_ring())?;
        }
        let parent = self.new_req(peer, op.work(s.len as u64));
        let chunk = self.stage_shape.bounce;
        self.chunked.push(Chunked {
            parent,
            peer,
            op,
            mem: s.region.mem.clone(),
            offset: s.offset,
            len: s.len,
            chunk,
            chunks: s.len.div_ceil(chunk).max(1),
            posted: 0,
            inflight: VecDeque::new(),
            got: 0,
            exec,
            error: None,
            orphan: false,
        });
        Ok(parent)
    }

    /// Where `parent`'s chunked message is in the list (not once released).
    pub(super) fn chunk_index(&self, parent: Request) -> Option<usize> {
        self.chunked
            .iter()
            .position(|c| c.parent == parent && !c.orphan)
    }

    /// Whether the CPU has chunks of a staged message with `peer` in its receive ring
    /// (`recv`) or its send queue still to post (later staged messages of that queue queue
    /// behind them).
    pub(super) fn chunks_pending(&self, peer: usize, recv: bool) -> bool {
        self.chunked
            .iter()
            .any(|k| k.in_queue(peer, recv) && k.posting())
    }

    /// Whether an entry before `i` with the same peer and queue still has chunks to post:
    /// `i` posts after it (receives match sends in order; work on one connection's send
    /// queue keeps the order of the calls).
    fn behind_another(&self, i: usize) -> bool {
        let c = &self.chunked[i];
        let recv = c.op.recv_ring();
        self.chunked[..i]
            .iter()
            .any(|k| k.in_queue(c.peer, recv) && k.posting())
    }

    /// Waits (making progress, up to the timeout) until the CPU has posted every chunk of
    /// the staged messages with `peer` in its receive ring (`recv`) or its send queue (sends,
    /// puts, gets): a later operation with that peer must not overtake them (receives match
    /// sends in order; work on one send queue keeps the order of the calls). A failed
    /// connection to the peer ends the wait with its error.
    pub(crate) fn chunks_posted(&mut self, peer: usize, recv: bool) -> Result<()> {
        let busy = |c: &Comm| c.chunks_pending(peer, recv);
        if !busy(self) {
            // The common case, without a clock read.
            return Ok(());
        }
        let until = Instant::now() + self.timeout;
        let mut look = Look::default();
        while busy(self) {
            if look.due() && self.failed_peer([peer]).is_some() {
                let what = "a staged message larger than a bounce";
                return Err(self.connection_error(peer, what));
            }
            if Instant::now() >= until {
                return Err(Error::invalid(format!(
                    "a staged message with rank {peer} larger than a bounce still had chunks to post after {:?}, and later work with that rank may not overtake it: wait for it first (its peer never matched it?)",
                    self.timeout
                )));
            }
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Posts the next chunk of entry `i` from the CPU if a bounce is free (and, for a
    /// receive, a slot of the receive ring); whether it did.
    fn post_chunk(&mut self, i: usize) -> Result<bool> {
        let c = &self.chunked[i];
        let (at, n) = c.piece(c.posted);
        if c.op.recv_ring() && self.peers.get(c.peer)?.qp.recv_room() == 0 {
            return Ok(false);
        }
        let slot = match n {
            // An empty chunk moves no bytes: it needs no bounce.
            0 => None,
            _ => match self.try_take_bounce(self.chunked[i].op.inbound())? {
                Some(s) => Some(s),
                None => {
                    tracing::trace!("a staged chunk waits for a free bounce");
                    return Ok(false);
                }
            },
        };
        let (op, peer, piece) = self.chunk_piece(i, slot, at, n);
        let sub = self.post_piece_now(&op, peer, piece)?;
        let c = &mut self.chunked[i];
        c.inflight.push_back((sub, n));
        c.posted += 1;
        Ok(true)
    }

    /// What entry `i` posts for its chunk of `n` bytes at byte `at`, in bounce `slot`.
    fn chunk_piece(
        &self,
        i: usize,
        slot: Option<usize>,
        at: usize,
        n: usize,
    ) -> (ChunkOp, usize, Piece) {
        let c = &self.chunked[i];
        let inbound = c.op.inbound();
        let (rec, sge) = match slot {
            Some(s) => {
                let (rec, sge) = self.stage_rec(s, &c.mem, c.offset + at, n, inbound);
                (Some(rec), sge)
            }
            None => (None, NO_BYTES),
        };
        let last = c.posted + 1 == c.chunks;
        let piece = Piece {
            rec,
            sge,
            off: at as u64,
            last,
        };
        (c.op.clone(), c.peer, piece)
    }

    /// Posts the next chunk of entry `i` on `exec` (waiting for a bounce if all are held).
    fn post_chunk_on(&mut self, i: usize, exec: &impl Executor) -> Result<()> {
        let c = &self.chunked[i];
        let parent = c.parent;
        let (at, n) = c.piece(c.posted);
        // Taking a bounce may make progress, which may drop other entries: look again.
        let slot = self.take_bounce(c.op.inbound())?;
        let i = self.chunk_index(parent).expect("not yet released");
        let (op, peer, piece) = self.chunk_piece(i, Some(slot), at, n);
        let sub = self.post_piece_on(&op, peer, piece, exec)?;
        let i = self.chunk_index(parent).expect("not yet released");
        let c = &mut self.chunked[i];
        c.inflight.push_back((sub, n));
        c.posted += 1;
        Ok(())
    }
}

impl Comm {
    /// Retires entry `i`'s chunks that are done, in order, then (from the CPU) posts the
    /// chunks that free bounces allow. A received chunk is copied in with the CPU unless an
    /// executor copies it, at the parent's own wait (`at_wait`) or earlier where
    /// [`copy_in_waits_for_parent`](Self::copy_in_waits_for_parent) allows; a receive posted
    /// on an executor is never copied in behind the executor's back. Errors are kept for the
    /// parent's wait.
    fn advance_chunked(&mut self, i: usize, at_wait: bool) {
        let parent = self.chunked[i].parent;
        if !self.chunked[i].orphan && self.state(parent).is_err() {
            // Released by a wait that gave up (a peer gone): drain.
            self.chunked[i].orphan = true;
        }
        while let Some(&(sub, n)) = self.chunked[i].inflight.front() {
            // A chunk still in flight ends the walk at once: every progress call walks every
            // outstanding message (a halo exchange or a ping-pong keeps dozens posted ahead).
            if self.state(sub).is_ok_and(|st| st.status == Status::Pending) {
                break;
            }
            if !at_wait && self.copy_in_waits_for_parent(i, sub) {
                break;
            }
            // An executor's wait learns no byte count: it copies the whole chunk.
            let whole = self.state(sub).is_ok_and(|st| st.on_executor);
            let r = self.retire_chunk(i, sub);
            let c = &mut self.chunked[i];
            match r {
                Ok(None) => break,
                Ok(Some(got)) => {
                    let got = if whole { n as u32 } else { got };
                    c.inflight.pop_front();
                    if c.op.recv_ring() && !c.orphan {
                        c.got += got as usize;
                        let more = c.posted < c.chunks || !c.inflight.is_empty();
                        if (got as usize) < n && more {
                            c.error.get_or_insert(short_chunk(c.peer, got, n, c.len));
                        }
                    }
                }
                Err(e) => {
                    c.inflight.pop_front();
                    c.error.get_or_insert(e);
                }
            }
        }
        while self.chunked[i].posting() && !self.behind_another(i) {
            match self.post_chunk(i) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    self.chunked[i].error.get_or_insert(e);
                }
            }
        }
    }

    /// Whether chunk `sub` of entry `i` is a receive whose copy in waits for its parent's
    /// wait (by the CPU, or the executor's after `wait_on`), instead of being made by the CPU
    /// as soon as a call makes progress. An executor-posted receive always waits: the CPU may
    /// not copy it in. A receive the CPU posted waits while it has no more chunks to post and
    /// a receive bounce is free: if the program then waits for it on an executor, the
    /// executor copies it in its own order (the CPU copying in a progress call would write
    /// the buffer while the stream may still read it, and wait for a synchronous copy). When
    /// bounces run out, or the message still has chunks to post, progress copies in to free
    /// the bounce, so receives queued for a bounce are posted whichever request the program
    /// waits for.
    fn copy_in_waits_for_parent(&mut self, i: usize, sub: Request) -> bool {
        let c = &self.chunked[i];
        if !c.op.inbound() || c.orphan {
            return false;
        }
        let (exec, unposted) = (c.exec, c.posted < c.chunks);
        let not_by_exec = self
            .state(sub)
            .is_ok_and(|st| st.stage.as_ref().is_some_and(|r| !r.by_exec));
        if exec {
            return not_by_exec;
        }
        not_by_exec
            && !unposted
            && self
                .stage
                .as_ref()
                .is_some_and(|p| p.free_slot(true).is_some())
    }

    /// Chunk `sub` of entry `i`, if done: its bytes (released, copied in), or its error;
    /// `None` while pending. An orphan's chunks are released without a copy.
    fn retire_chunk(&mut self, i: usize, sub: Request) -> Result<Option<u32>> {
        if !self.chunked[i].orphan {
            return self.finish(sub);
        }
        if self.state(sub).is_ok_and(|st| st.status == Status::Pending) {
            return Ok(None);
        }
        self.release(sub);
        Ok(Some(0))
    }

    /// Advances every chunked message (from `progress`), and forgets those whose parent is
    /// released and whose chunks all drained.
    pub(super) fn advance_all_chunked(&mut self) {
        if self.chunked.is_empty() {
            return;
        }
        for i in 0..self.chunked.len() {
            self.advance_chunked(i, false);
        }
        self.chunked
            .retain(|c| !(c.orphan && c.inflight.is_empty()));
    }

    /// `finish` of chunked parent `r` (entry `i`): its first error, or its bytes (received,
    /// else 0) once its last chunk is retired; either releases it. `None` while chunks are
    /// outstanding.
    pub(super) fn finish_chunked(&mut self, i: usize) -> Result<Option<u32>> {
        self.advance_chunked(i, true);
        let c = &mut self.chunked[i];
        let out = match c.error.take() {
            Some(e) => Err(e),
            None if c.posted == c.chunks && c.inflight.is_empty() => {
                Ok(Some(if c.op.recv_ring() { c.got as u32 } else { 0 }))
            }
            None => return Ok(None),
        };
        c.orphan = true;
        let parent = c.parent;
        self.release(parent);
        self.chunked
            .retain(|c| !(c.orphan && c.inflight.is_empty()));
        out
    }

    /// `wait_on` of chunked parent `r` (entry `i`): the executor waits for each chunk not
    /// yet retired, copying each received one in after its wait (the CPU copied those it
    /// retired, as they came: the peer may send as soon as a receive is posted). Refused
    /// while the CPU still has chunks of it to post (they wait for bounces).
    pub(super) fn wait_on_chunked(&mut self, i: usize, exec: &impl Executor) -> Result<()> {
        let c = &self.chunked[i];
        if c.error.is_some() {
            return Err(Error::invalid(
                "this staged message failed before all its chunks were posted: wait() reports why",
            ));
        }
        if c.posted < c.chunks {
            return Err(Error::invalid(
                "this staged message is larger than a bounce and the CPU has not posted all its chunks yet (they wait for bounces or receive-ring slots): wait for it with wait() or test(), raise the pool with Comm::set_staging, post fewer receives ahead, or post it with isend_gpu_on/irecv_gpu_on",
            ));
        }
        let subs: Vec<Request> = self.chunked[i].inflight.iter().map(|&(r, _)| r).collect();
        // All or none: a send of the CPU's still waiting for its credit has no completion
        // number an executor could wait for yet.
        if subs
            .iter()
            .any(|&r| self.state(r).is_ok_and(|st| st.cqe().is_none()))
        {
            return Err(Error::invalid(
                "some chunks of this staged message wait for the peer's credits on the CPU and have no completion to wait for yet: wait for it with wait() or test(), or post it with isend_gpu_on",
            ));
        }
        subs.into_iter().try_for_each(|r| self.wait_on(r, exec))
    }
}

/// The error of a received chunk shorter than a bounce that is not the message's last.
fn short_chunk(peer: usize, got: u32, n: usize, len: usize) -> Error {
    Error::invalid(format!(
        "a chunk of {got} bytes arrived from rank {peer} where {n} were expected, within a staged receive of {len} bytes: a message larger than a bounce goes in bounce-sized chunks, so both ranks need the same bounce size (Comm::set_staging) and receives as long as the sends"
    ))
}
