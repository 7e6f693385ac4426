//! One-sided communication: windows of registered memory every rank exposes, put and get
//! (RDMA write and read), put with signal, and waiting for a value on an executor.

use crate::comm::{
    check_gathered, decode_remote, encode_remote, ChunkOp, Comm, Request, REMOTE_BYTES,
};
use crate::fault::Work;
use crate::staged::GpuSlice;
use gdsync::exec::Executor;
use gdsync::ops::{Op, Ops, WaitCond};
use gdsync::{Error, MemoryRegion, RemoteBuf, Result, SendWr, Sge};

/// A window: every rank's exposed region, created collectively by [`Comm::window`].
#[derive(Clone, Debug)]
pub struct Window {
    remotes: Vec<RemoteBuf>,
}

impl Window {
    /// Number of ranks (regions) of the window.
    pub fn size(&self) -> usize {
        self.remotes.len()
    }

    /// Rank `p`'s region.
    pub fn remote(&self, p: usize) -> Result<RemoteBuf> {
        self.remotes
            .get(p)
            .copied()
            .ok_or_else(|| Error::invalid(format!("rank {p} out of range for this window")))
    }
}

/// Whether `len` bytes at `off` lie inside `total` bytes, without overflow.
fn fits(off: u64, len: u64, total: u64) -> bool {
    off.checked_add(len).is_some_and(|end| end <= total)
}

/// Rank `peer`'s region of `w`, once `len` bytes at `off` are found inside it.
fn checked_remote(w: &Window, peer: usize, off: u64, len: usize) -> Result<RemoteBuf> {
    let r = w.remote(peer)?;
    range(&r, off, len as u64, peer)?;
    Ok(r)
}

/// Rank `peer`'s region of `w` and the write of a put with signal's `signal` (one 8-byte
/// word, written from the WQE) at `sig_off`, once the signal and the put's bytes
/// (`put`: offset and length) are found inside the region.
fn signal_wr(
    w: &Window,
    peer: usize,
    (dst_off, len): (u64, u64),
    signal: Sge,
    sig_off: u64,
) -> Result<(RemoteBuf, SendWr)> {
    if signal.len != 8 || sig_off % 8 != 0 {
        return Err(Error::invalid(
            "the signal is one 8-byte word, 8-byte aligned in the window",
        ));
    }
    let r = w.remote(peer)?;
    range(&r, dst_off, len, peer)?;
    range(&r, sig_off, 8, peer)?;
    Ok((r, SendWr::write(r.at(sig_off)).sge(signal).inline()))
}

fn range(r: &RemoteBuf, off: u64, len: u64, p: usize) -> Result<()> {
    if !fits(off, len, r.len) {
        return Err(Error::invalid(format!(
            "{off}+{len} bytes is outside rank {p}'s window of {} bytes",
            r.len
        )));
    }
    Ok(())
}

impl Comm {
    /// Creates a window over `mr` (collective: every rank calls it, each with its region).
    pub fn window(&mut self, mr: &MemoryRegion<'_>) -> Result<Window> {
        let r = mr.remote();
        let mut b = Vec::with_capacity(REMOTE_BYTES);
        encode_remote(&r, &mut b);
        let all = self.boot().all_gather(&b)?;
        check_gathered(&all, self.size())?;
        let remotes = all
            .iter()
            .map(|b| {
                decode_remote(b).ok_or_else(|| Error::invalid("window exchange: malformed record"))
            })
            .collect::<Result<_>>()?;
        Ok(Window { remotes })
    }

    fn one_sided(
        &mut self,
        w: &Window,
        peer: usize,
        work: Work,
        wr: impl FnOnce(RemoteBuf) -> Result<SendWr>,
    ) -> Result<(Request, SendWr)> {
        let r = w.remote(peer)?;
        self.check_peer(peer)?;
        // Work on the connection's send queue keeps the order of the calls: a staged
        // message's chunks still to post go first.
        self.chunks_posted(peer, false)?;
        let req = self.new_one_sided(peer, work);
        let wr = wr(r)?.wr_id(req.wr_id());
        Ok((req, wr))
    }

    /// Posts `wrs` (one request, completing with the last) from the CPU.
    fn post_now(&mut self, peer: usize, req: Request, wrs: Vec<SendWr>) -> Result<Request> {
        self.post_cpu(peer, Some(req), wrs, None)?;
        Ok(req)
    }

    fn post_via(
        &mut self,
        peer: usize,
        req: Request,
        wrs: &[SendWr],
        exec: &impl Executor,
    ) -> Result<Request> {
        self.post_exec(peer, req, wrs, Ops::new(), exec)?;
        Ok(req)
    }

    fn put_wr(
        &mut self,
        src: Sge,
        w: &Window,
        peer: usize,
        dst_off: u64,
    ) -> Result<(Request, SendWr)> {
        self.one_sided(w, peer, Work::Put(src.len as u64), |r| {
            range(&r, dst_off, src.len as u64, peer)?;
            Ok(SendWr::write(r.at(dst_off)).sge(src))
        })
    }

    /// The request and work request of a get of `peer`'s window at `src_off` into `dst`.
    fn get_wr(
        &mut self,
        dst: Sge,
        w: &Window,
        peer: usize,
        src_off: u64,
    ) -> Result<(Request, SendWr)> {
        self.one_sided(w, peer, Work::Get(dst.len as u64), |r| {
            range(&r, src_off, dst.len as u64, peer)?;
            Ok(SendWr::read(r.at(src_off)).sge(dst))
        })
    }

    /// Writes `src` (`mr.sge(range)`) into rank `peer`'s window at `dst_off`.
    pub fn iput(&mut self, src: Sge, w: &Window, peer: usize, dst_off: u64) -> Result<Request> {
        let (req, wr) = self.put_wr(src, w, peer, dst_off)?;
        self.post_now(peer, req, vec![wr])
    }

    /// Reads `dst.len` bytes of rank `peer`'s window at `src_off` into `dst`.
    pub fn iget(&mut self, dst: Sge, w: &Window, peer: usize, src_off: u64) -> Result<Request> {
        let (req, wr) = self.get_wr(dst, w, peer, src_off)?;
        self.post_now(peer, req, vec![wr])
    }

    fn put_signal_wrs(
        &mut self,
        src: Sge,
        w: &Window,
        peer: usize,
        dst_off: u64,
        signal: Sge,
        sig_off: u64,
    ) -> Result<(Request, SendWr, SendWr)> {
        let (_, sig) = signal_wr(w, peer, (dst_off, src.len as u64), signal, sig_off)?;
        let (req, data) = self.one_sided(w, peer, Work::Put(src.len as u64), |r| {
            Ok(SendWr::write(r.at(dst_off)).sge(src).unsignaled())
        })?;
        let id = data.wr_id;
        Ok((req, data, sig.wr_id(id)))
    }

    /// Put with signal: writes `src` at `dst_off`, then the 8-byte `signal` at `sig_off` of
    /// rank `peer`'s window. The peer sees the signal only after the data (one connection
    /// delivers in order).
    pub fn iput_signal(
        &mut self,
        src: Sge,
        w: &Window,
        peer: usize,
        dst_off: u64,
        signal: Sge,
        sig_off: u64,
    ) -> Result<Request> {
        let (req, data, signal) = self.put_signal_wrs(src, w, peer, dst_off, signal, sig_off)?;
        self.post_now(peer, req, vec![data, signal])
    }

    /// [`iput`](Self::iput) posted by an executor (it rings when it gets there).
    pub fn iput_on(
        &mut self,
        src: Sge,
        w: &Window,
        peer: usize,
        dst_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        let (req, wr) = self.put_wr(src, w, peer, dst_off)?;
        self.post_via(peer, req, &[wr], exec)
    }

    /// [`iput`](Self::iput) from GPU memory. A staged slice goes in bounce-sized chunks
    /// (one, for a put no larger than a bounce; an empty put takes no bounce), each copied
    /// by the CPU into a send bounce as one is free (during this and later calls that make
    /// progress) and written from there at `dst_off` + its offset in the slice; the request
    /// completes with the last chunk. Staged work with `peer` on the connection's send
    /// queue (sends, puts, gets) queues behind the chunks of earlier such work, so it is
    /// posted in the order of the calls. The window itself is registered memory: a staged
    /// region cannot be one.
    pub fn iput_gpu(
        &mut self,
        src: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        dst_off: u64,
    ) -> Result<Request> {
        if let Some(sge) = src.direct_sge() {
            return self.iput(sge, w, peer, dst_off);
        }
        let remote = checked_remote(w, peer, dst_off, src.len)?;
        let op = ChunkOp::Put {
            remote,
            at: dst_off,
            signal: None,
        };
        self.chunked_start(&src, peer, op)
    }

    /// [`iput_on`](Self::iput_on) from GPU memory: a staged slice is copied into a send
    /// bounce by `exec` before the put's doorbell; one larger than a bounce goes in
    /// bounce-sized chunks, all posted now, each in a send bounce of its own (refused if the
    /// pool has too few).
    pub fn iput_gpu_on(
        &mut self,
        src: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        dst_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        if let Some(sge) = src.direct_sge() {
            return self.iput_on(sge, w, peer, dst_off, exec);
        }
        let remote = checked_remote(w, peer, dst_off, src.len)?;
        let op = ChunkOp::Put {
            remote,
            at: dst_off,
            signal: None,
        };
        self.staged_on(&src, peer, op, exec)
    }

    /// [`iget`](Self::iget) into GPU memory. A staged slice goes in bounce-sized chunks (one,
    /// for a get no larger than a bounce; an empty get takes no bounce), each read into a
    /// receive bounce of the staging pool and copied in after its completion, before the
    /// bounce takes the next chunk (from the CPU, during any call that makes progress); wait
    /// for it with [`wait`](Self::wait) or [`test`](Self::test), or
    /// [`wait_on`](Self::wait_on) once every chunk is posted. Queued in the order of the
    /// calls with staged sends and puts to `peer`, as [`iput_gpu`](Self::iput_gpu) says.
    pub fn iget_gpu(
        &mut self,
        dst: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        src_off: u64,
    ) -> Result<Request> {
        if let Some(sge) = dst.direct_sge() {
            return self.iget(sge, w, peer, src_off);
        }
        let remote = checked_remote(w, peer, src_off, dst.len)?;
        let op = ChunkOp::Get {
            remote,
            at: src_off,
        };
        self.chunked_start(&dst, peer, op)
    }

    /// [`iget_gpu`](Self::iget_gpu) posted by an executor; [`wait_on`](Self::wait_on) makes
    /// the executor wait for the read and copy it in. One larger than a bounce goes in
    /// bounce-sized chunks, all posted now, each into a receive bounce of its own (refused if
    /// the pool has too few).
    pub fn iget_gpu_on(
        &mut self,
        dst: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        src_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        if let Some(sge) = dst.direct_sge() {
            return self.iget_on(sge, w, peer, src_off, exec);
        }
        let remote = checked_remote(w, peer, src_off, dst.len)?;
        let op = ChunkOp::Get {
            remote,
            at: src_off,
        };
        self.staged_on(&dst, peer, op, exec)
    }

    /// [`iput_signal`](Self::iput_signal) from GPU memory: a staged slice is put as
    /// [`iput_gpu`](Self::iput_gpu) puts it (in bounce-sized chunks), and the signal (`signal`,
    /// one 8-byte word of registered host memory, read when the last chunk is posted) is
    /// written at `sig_off` after the last chunk, on the same connection: the peer sees it
    /// only after every byte of the put landed.
    #[allow(clippy::too_many_arguments)] // the put's four, the signal's two
    pub fn iput_signal_gpu(
        &mut self,
        src: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        dst_off: u64,
        signal: Sge,
        sig_off: u64,
    ) -> Result<Request> {
        if let Some(sge) = src.direct_sge() {
            return self.iput_signal(sge, w, peer, dst_off, signal, sig_off);
        }
        let put = (dst_off, src.len as u64);
        let (remote, sig) = signal_wr(w, peer, put, signal, sig_off)?;
        let op = ChunkOp::Put {
            remote,
            at: dst_off,
            signal: Some(sig),
        };
        self.chunked_start(&src, peer, op)
    }

    /// [`iput_signal_gpu`](Self::iput_signal_gpu) posted by an executor (the signal follows
    /// the last chunk's write on the executor too); a put larger than a bounce needs a send
    /// bounce per chunk, as [`iput_gpu_on`](Self::iput_gpu_on) does.
    #[allow(clippy::too_many_arguments)] // the put's four, the signal's two, the executor
    pub fn iput_signal_gpu_on(
        &mut self,
        src: GpuSlice<'_>,
        w: &Window,
        peer: usize,
        dst_off: u64,
        signal: Sge,
        sig_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        if let Some(sge) = src.direct_sge() {
            return self.iput_signal_on(sge, w, peer, dst_off, signal, sig_off, exec);
        }
        let put = (dst_off, src.len as u64);
        let (remote, sig) = signal_wr(w, peer, put, signal, sig_off)?;
        let op = ChunkOp::Put {
            remote,
            at: dst_off,
            signal: Some(sig),
        };
        self.staged_on(&src, peer, op, exec)
    }

    /// [`iget`](Self::iget) posted by an executor.
    pub fn iget_on(
        &mut self,
        dst: Sge,
        w: &Window,
        peer: usize,
        src_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        let (req, wr) = self.get_wr(dst, w, peer, src_off)?;
        self.post_via(peer, req, &[wr], exec)
    }

    /// [`iput_signal`](Self::iput_signal) posted by an executor.
    #[allow(clippy::too_many_arguments)] // the put's four, the signal's two, the executor
    pub fn iput_signal_on(
        &mut self,
        src: Sge,
        w: &Window,
        peer: usize,
        dst_off: u64,
        signal: Sge,
        sig_off: u64,
        exec: &impl Executor,
    ) -> Result<Request> {
        let (req, data, signal) = self.put_signal_wrs(src, w, peer, dst_off, signal, sig_off)?;
        self.post_via(peer, req, &[data, signal], exec)
    }

    /// Makes `exec` wait until the 64-bit word at `off` of `mr` satisfies `cond` against
    /// `value` (e.g. a signal a peer's put will write).
    ///
    /// The region borrows memory the library does not own, so the queued wait cannot keep it
    /// alive: hence `unsafe`. For a word in a [`PinnedBuffer`](gdsync::PinnedBuffer) (what
    /// [`ProtectionDomain::register_pinned`](gdsync::ProtectionDomain::register_pinned)
    /// registers), submit [`PinnedBuffer::wait64`](gdsync::PinnedBuffer::wait64) instead:
    /// that list keeps the buffer alive and needs no `unsafe`.
    ///
    /// # Safety
    /// The buffer behind `mr` must stay allocated until the executor has passed the wait.
    pub unsafe fn wait_value_on(
        &self,
        mr: &MemoryRegion<'_>,
        off: usize,
        value: u64,
        cond: WaitCond,
        exec: &impl Executor,
    ) -> Result<()> {
        if off % 8 != 0 || !fits(off as u64, 8, mr.len() as u64) {
            return Err(Error::invalid(
                "the word must be 8-byte aligned and inside the buffer",
            ));
        }
        let mut ops = Ops::new();
        // SAFETY: the caller keeps the buffer alive until the executor passed the wait.
        unsafe {
            ops.push_raw(Op::Wait64 {
                addr: mr.addr() + off as u64,
                value,
                cond,
            })
        };
        exec.submit(ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            (u64::MAX - 64..=u64::MAX),
            0u64..=4096,
            any::<u64>(),
        ]
    }

    proptest! {
        /// A window range is accepted exactly when it lies inside, at every edge of `u64`.
        #[test]
        fn window_ranges_never_wrap(off in edge(), len in edge(), total in edge()) {
            let r = RemoteBuf { addr: 0x1000, len: total, rkey: 1 };
            let inside = off as u128 + len as u128 <= total as u128;
            prop_assert_eq!(range(&r, off, len, 0).is_ok(), inside);
        }
    }
}
