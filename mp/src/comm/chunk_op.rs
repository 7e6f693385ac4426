//! What one chunk of a staged message posts, by kind of message: a send or a receive of its
//! bounce, or an RDMA write from its bounce into a peer's window (a put; with signal, the
//! last chunk also writes the signal) or an RDMA read into it (a get); from the CPU or on an
//! executor. An empty message is one chunk of no bytes, which takes no bounce.

use super::requests::Request;
use super::Comm;
use crate::fault::Work;
use crate::staged::{GpuSlice, StageRec};
use gdsync::exec::Executor;
use gdsync::ops::Ops;
use gdsync::{RemoteBuf, Result, SendWr, Sge};

/// The SGE of an empty chunk: no bytes, so no memory (a send or receive of it carries none).
pub(super) const NO_BYTES: Sge = Sge {
    addr: 0,
    len: 0,
    lkey: 0,
};

/// What a staged message does with each of its chunks.
#[derive(Clone)]
pub(crate) enum ChunkOp {
    Send,
    Recv,
    /// Writes into `remote` at `at` (and the chunk's offset in the message); `signal` (a put
    /// with signal's write of its word) follows the last chunk's write.
    Put {
        remote: RemoteBuf,
        at: u64,
        signal: Option<SendWr>,
    },
    /// Reads `remote` at `at` (and the chunk's offset in the message).
    Get {
        remote: RemoteBuf,
        at: u64,
    },
}

impl ChunkOp {
    /// Whether the payload lands in the bounce (a receive or a get: receive bounces, copied
    /// in after the wait); else it is copied out into a send bounce first.
    pub(super) fn inbound(&self) -> bool {
        matches!(self, ChunkOp::Recv | ChunkOp::Get { .. })
    }

    /// Whether it is posted to the peer's receive ring (whose order matches the peer's
    /// sends); everything else goes to the connection's send queue, in one order.
    pub(super) fn recv_ring(&self) -> bool {
        matches!(self, ChunkOp::Recv)
    }

    /// The operation's name and the call that does it from the CPU, for messages.
    pub(super) fn names(&self) -> (&'static str, &'static str) {
        match self {
            ChunkOp::Send => ("send", "isend_gpu"),
            ChunkOp::Recv => ("receive", "irecv_gpu"),
            ChunkOp::Put { signal: None, .. } => ("put", "iput_gpu"),
            ChunkOp::Put { .. } => ("put with signal", "iput_signal_gpu"),
            ChunkOp::Get { .. } => ("get", "iget_gpu"),
        }
    }

    /// The work of a whole message of `n` bytes (its parent request).
    pub(super) fn work(&self, n: u64) -> Work {
        match self {
            ChunkOp::Send => Work::Send(n),
            ChunkOp::Recv => Work::Recv(n),
            ChunkOp::Put { .. } => Work::Put(n),
            ChunkOp::Get { .. } => Work::Get(n),
        }
    }

    /// The work requests of one-sided chunk `sge` at byte `off` of the message, for request
    /// `req`; `last` adds a put's signal after its write. The signal follows the data on the
    /// same QP, and an RC connection executes a QP's requests at the responder in the order
    /// posted (each chunk's write is placed before the next request is executed, as the
    /// single-buffer `iput_signal` relies on): the peer sees the signal only after every
    /// chunk landed. The data write is then unsignalled: the signal's completion completes
    /// the chunk.
    fn one_sided_wrs(&self, req: Request, sge: Sge, off: u64, last: bool) -> Vec<SendWr> {
        let with = |wr: SendWr| if sge.len > 0 { wr.sge(sge) } else { wr };
        match self {
            ChunkOp::Put { remote, at, signal } => {
                let data = with(SendWr::write(remote.at(at + off))).wr_id(req.wr_id());
                match signal.as_ref().filter(|_| last) {
                    Some(s) => vec![data.unsignaled(), s.clone().wr_id(req.wr_id())],
                    None => vec![data],
                }
            }
            ChunkOp::Get { remote, at } => {
                vec![with(SendWr::read(remote.at(at + off))).wr_id(req.wr_id())]
            }
            ChunkOp::Send | ChunkOp::Recv => unreachable!("two-sided chunks post no WRs"),
        }
    }
}

/// One chunk to post: its bounce's record and SGE (none for an empty chunk), its byte
/// offset in the message, whether it is the last.
pub(super) struct Piece {
    pub(super) rec: Option<StageRec>,
    pub(super) sge: Sge,
    pub(super) off: u64,
    pub(super) last: bool,
}

impl Comm {
    /// Posts `piece` of a message of kind `op` with `peer` from the CPU (after copying a
    /// send's or put's bytes out into its bounce), and binds its bounce to the request.
    pub(super) fn post_piece_now(
        &mut self,
        op: &ChunkOp,
        peer: usize,
        piece: Piece,
    ) -> Result<Request> {
        let Piece {
            rec,
            sge,
            off,
            last,
        } = piece;
        if let Some(rec) = rec.as_ref().filter(|r| !r.inbound) {
            if let Err(e) = self.stage_copy_out_now(rec) {
                return self.stage_bind(rec.clone(), Err(e));
            }
        }
        let r = match op {
            ChunkOp::Send => self.isend_now(sge, peer),
            ChunkOp::Recv => self.irecv_now(sge, peer),
            _ => self.post_one_sided(op, peer, (sge, off, last), |c, req, wrs| {
                c.post_cpu(peer, Some(req), wrs, None)
            }),
        };
        match rec {
            Some(rec) => self.stage_bind(rec, r),
            None => r,
        }
    }

    /// Posts `piece` on `exec`: the executor copies a send's or put's bytes out first.
    pub(super) fn post_piece_on(
        &mut self,
        op: &ChunkOp,
        peer: usize,
        piece: Piece,
        exec: &impl Executor,
    ) -> Result<Request> {
        let Piece {
            rec,
            sge,
            off,
            last,
        } = piece;
        let copy = match rec.as_ref().filter(|r| !r.inbound) {
            Some(rec) => self.stage_copy_out_ops(rec),
            None => Ops::new(),
        };
        let r = match op {
            ChunkOp::Send => self.isend_on_after(sge, peer, exec, copy),
            ChunkOp::Recv => self.irecv_on(sge, peer, exec),
            _ => self.post_one_sided(op, peer, (sge, off, last), |c, req, wrs| {
                c.post_exec(peer, req, &wrs, copy, exec)
            }),
        };
        match rec {
            Some(rec) => self.stage_bind(rec, r),
            None => r,
        }
    }

    /// A new request for one-sided chunk (`sge`, byte `off`, `last`) of `op` with `peer`,
    /// posted by `post`; released if posting fails.
    fn post_one_sided(
        &mut self,
        op: &ChunkOp,
        peer: usize,
        (sge, off, last): (Sge, u64, bool),
        post: impl FnOnce(&mut Self, Request, Vec<SendWr>) -> Result<()>,
    ) -> Result<Request> {
        let req = self.new_one_sided(peer, op.work(sge.len as u64));
        let wrs = op.one_sided_wrs(req, sge, off, last);
        match post(self, req, wrs) {
            Ok(()) => Ok(req),
            Err(e) => {
                self.release(req);
                Err(e)
            }
        }
    }
}

impl Comm {
    /// A staged message (`op`) of `s` with `peer` on `exec`: one bounce for a message that
    /// fits one (none for an empty one), else in chunks, each in a bounce of its own. Posted
    /// after the chunks the CPU still has to post on the same queue of `peer`.
    pub(crate) fn staged_on(
        &mut self,
        s: &GpuSlice<'_>,
        peer: usize,
        op: ChunkOp,
        exec: &impl Executor,
    ) -> Result<Request> {
        self.check_peer(peer)?;
        if s.len > self.stage_shape.bounce {
            return self.chunked_on(s, peer, op, exec);
        }
        self.chunks_posted(peer, op.recv_ring())?;
        let (rec, sge) = match s.len {
            0 => (None, NO_BYTES),
            _ => {
                let (rec, sge) = self.stage_start(s, op.inbound(), op.names().0)?;
                (Some(rec), sge)
            }
        };
        let piece = Piece {
            rec,
            sge,
            off: 0,
            last: true,
        };
        self.post_piece_on(&op, peer, piece, exec)
    }
}
