//! Sends and receives of GPU memory ([`GpuRegion`]): direct where the region was registered
//! for DMA, else staged through the communicator's pool of pinned bounces. A staged send
//! copies out in its trigger's order (the CPU now, or an executor before its doorbell); a
//! staged receive lands in a bounce of its own and is copied in after its wait (by the CPU
//! in `wait`/`test`, or by the executor right after `wait_on`'s wait).

use super::chunk_op::{ChunkOp, NO_BYTES};
use super::requests::Request;
use super::Comm;
use crate::staged::{GpuMem, GpuRegion, GpuSlice, PoolShape, SlotUse, StagePool, StageRec};
use gdsync::cuda::DeviceBuffer;
use gdsync::exec::Executor;
use gdsync::ops::Ops;
use gdsync::{Access, Error, GpuMemoryPath, PinnedBuffer, Result, Sge};
use std::sync::Arc;
use std::time::Instant;

impl Comm {
    /// Registers GPU buffer `buf` for sends and receives by the path `path` (choose it with
    /// [`GpuMemoryPath::choose_soft`] or [`GpuMemoryPath::choose_mlx5`]): `Direct` registers
    /// the buffer with the device; `Staged` registers nothing, and its payloads go through
    /// the communicator's pinned bounces ([`Comm::set_staging`]).
    pub fn register_gpu(&self, buf: Arc<DeviceBuffer>, path: GpuMemoryPath) -> Result<GpuRegion> {
        let mr = match path {
            // SAFETY: the region holds `buf` and declares the registration first, so the
            // registration is dropped before the memory.
            GpuMemoryPath::Direct => Some(unsafe {
                self.pd
                    .register_raw(buf.ptr() as *mut u8, buf.len(), Access::ALL)?
            }),
            GpuMemoryPath::Staged => None,
        };
        Ok(GpuRegion {
            mr,
            mem: GpuMem::Device(buf),
            path,
        })
    }

    /// Pinned host memory standing in for GPU memory, staged as GPU memory is (copies by the
    /// CPU, also on host streams): how the staged path runs without a GPU.
    pub fn register_gpu_stand_in(&self, buf: PinnedBuffer) -> GpuRegion {
        GpuRegion {
            mr: None,
            mem: GpuMem::Host(buf),
            path: GpuMemoryPath::Staged,
        }
    }

    /// Makes the staging pool now (else the first staged send or receive makes it, with the
    /// defaults): `recvs` bounces for outstanding staged receives (and gets), `sends` for
    /// staged sends (and puts) not yet complete, `bounce` bytes each (larger messages, puts
    /// and gets go in chunks of this size). Defaults: 64 KiB, 128 and 32.
    /// Refused while a bounce is held. Pinning memory may wait for the GPU: make
    /// the pool before streams wait on other ranks.
    pub fn set_staging(&mut self, bounce: usize, recvs: usize, sends: usize) -> Result<()> {
        if recvs == 0 || sends == 0 || bounce == 0 {
            return Err(Error::invalid(
                "a staging pool needs at least one byte and one bounce each way",
            ));
        }
        self.reclaim_bounces();
        if let Some(pool) = &self.stage {
            if pool.uses.iter().any(|u| *u != SlotUse::Free) || !self.chunked.is_empty() {
                return Err(Error::invalid(
                    "the staging pool is in use (staged sends or receives outstanding): wait for them before resizing it",
                ));
            }
        }
        let shape = PoolShape {
            bounce,
            recvs,
            sends,
        };
        // The old pool goes first (its registration with it).
        self.stage = None;
        self.stage = Some(StagePool::new(&self.pd, shape)?);
        self.stage_shape = shape;
        Ok(())
    }

    /// Like [`isend`](Self::isend), from GPU memory: a staged slice goes in bounce-sized
    /// chunks (one, for a message no larger than a bounce; an empty message takes no
    /// bounce), each copied out by the CPU as a send bounce is free (during this and later
    /// calls that make progress), so staged sends queue behind each other instead of waiting
    /// for a bounce (a send of host memory waits for them to be posted).
    pub fn isend_gpu(&mut self, src: GpuSlice<'_>, peer: usize) -> Result<Request> {
        match src.direct_sge() {
            Some(sge) => self.isend(sge, peer),
            None => self.chunked_start(&src, peer, ChunkOp::Send),
        }
    }

    /// Like [`isend_on`](Self::isend_on), from GPU memory: a staged slice is copied out by
    /// `exec` before its doorbell; one larger than a bounce goes in bounce-sized chunks, all
    /// posted now, each in a send bounce of its own (refused if the pool has too few).
    pub fn isend_gpu_on(
        &mut self,
        src: GpuSlice<'_>,
        peer: usize,
        exec: &impl Executor,
    ) -> Result<Request> {
        if let Some(sge) = src.direct_sge() {
            return self.isend_on(sge, peer, exec);
        }
        if src.len == 0 {
            // No bytes to stage: no bounce.
            return self.isend_on(NO_BYTES, peer, exec);
        }
        if src.len > self.stage_shape.bounce {
            return self.chunked_on(&src, peer, ChunkOp::Send, exec);
        }
        let (rec, sge) = self.stage_start(&src, false, "send")?;
        let copy = self.stage_copy_out_ops(&rec);
        let r = self.isend_on_after(sge, peer, exec, copy);
        self.stage_bind(rec, r)
    }

    /// Ops: the copy of `rec`'s GPU bytes into its bounce (none for an empty message).
    pub(crate) fn stage_copy_out_ops(&self, rec: &StageRec) -> Ops {
        match rec.len {
            0 => Ops::new(),
            _ => self.stage.as_ref().expect("made").copy_ops(rec, true),
        }
    }

    /// Copies `rec`'s GPU bytes into its bounce with the CPU.
    pub(crate) fn stage_copy_out_now(&self, rec: &StageRec) -> Result<()> {
        let pool = self.stage.as_ref().expect("stage_start made the pool");
        pool.cpu_copy(rec, rec.len, true)
    }

    /// Like [`irecv`](Self::irecv), into GPU memory: a staged slice is received in
    /// bounce-sized chunks (one, for a message no larger than a bounce; an empty message
    /// takes no bounce): each is copied in when the message is waited for (by the CPU in
    /// `wait` or `test`, or by the executor after [`wait_on`](Self::wait_on), in its order),
    /// or earlier, by the CPU in any call that makes progress, where its bounce is wanted:
    /// for the message's next chunk, or when no receive bounce is free. Receives that find
    /// every bounce held queue and are posted as bounces free, so receives posted before
    /// their sends never block. A message larger than a bounce needs the same bounce size on
    /// both ranks, and a receive as long as the send.
    pub fn irecv_gpu(&mut self, dst: GpuSlice<'_>, peer: usize) -> Result<Request> {
        match dst.direct_sge() {
            Some(sge) => self.irecv(sge, peer),
            None => self.chunked_start(&dst, peer, ChunkOp::Recv),
        }
    }

    /// Like [`irecv_on`](Self::irecv_on), into GPU memory (see [`irecv_gpu`](Self::irecv_gpu)).
    /// One larger than a bounce is received in bounce-sized chunks, all posted now, each
    /// into a receive bounce of its own (refused if the pool has too few); `wait_on` makes
    /// the executor wait for each and copy it in.
    pub fn irecv_gpu_on(
        &mut self,
        dst: GpuSlice<'_>,
        peer: usize,
        exec: &impl Executor,
    ) -> Result<Request> {
        if let Some(sge) = dst.direct_sge() {
            return self.irecv_on(sge, peer, exec);
        }
        if dst.len == 0 {
            return self.irecv_on(NO_BYTES, peer, exec);
        }
        if dst.len > self.stage_shape.bounce {
            return self.chunked_on(&dst, peer, ChunkOp::Recv, exec);
        }
        let (rec, sge) = self.stage_start(&dst, true, "receive")?;
        let r = self.irecv_on(sge, peer, exec);
        self.stage_bind(rec, r)
    }

    /// A bounce for `slice` (one that lands in it, `recv`: a receive or a get; else a send
    /// or a put) and its SGE; refuses a slice larger than a bounce (`what` names the
    /// operation in the message).
    pub(crate) fn stage_start(
        &mut self,
        slice: &GpuSlice<'_>,
        recv: bool,
        what: &str,
    ) -> Result<(StageRec, Sge)> {
        let bounce = self.stage_shape.bounce;
        if slice.len > bounce {
            return Err(Error::invalid(format!(
                "a staged {what} of {} bytes is larger than the staging bounce of {bounce} bytes: raise it with Comm::set_staging, or {what} the bytes in pieces",
                slice.len
            )));
        }
        let slot = self.take_bounce(recv)?;
        Ok(self.stage_rec(slot, &slice.region.mem, slice.offset, slice.len, recv))
    }

    /// The record and SGE of `len` bytes at `offset` of `mem` staged in bounce `slot` (taken).
    pub(super) fn stage_rec(
        &self,
        slot: usize,
        mem: &GpuMem,
        offset: usize,
        len: usize,
        inbound: bool,
    ) -> (StageRec, Sge) {
        let rec = StageRec {
            slot,
            mem: mem.clone(),
            offset,
            len,
            by_exec: false,
            inbound,
        };
        let sge = self.stage.as_ref().expect("made").sge(slot, len);
        (rec, sge)
    }

    /// Binds `rec`'s bounce to the request `r` posted, or frees it if posting failed.
    pub(crate) fn stage_bind(&mut self, rec: StageRec, r: Result<Request>) -> Result<Request> {
        let pool = self.stage.as_mut().expect("made");
        match r {
            Ok(req) => {
                pool.uses[rec.slot] = SlotUse::Held {
                    req: (req.slot, req.generation),
                    exec: None,
                };
                self.reqs[req.slot as usize].stage = Some(rec);
                Ok(req)
            }
            Err(e) => {
                pool.uses[rec.slot] = SlotUse::Free;
                Err(e)
            }
        }
    }

    /// A free bounce of the receive (`recv`) or send side, making the pool if there is none;
    /// waits (making progress) while every one is held, up to the timeout.
    pub(super) fn take_bounce(&mut self, recv: bool) -> Result<usize> {
        if let Some(s) = self.try_take_bounce(recv)? {
            return Ok(s);
        }
        tracing::trace!(recv, "no staging bounce is free: waiting for one");
        let start = Instant::now();
        loop {
            self.progress()?;
            std::thread::yield_now();
            if let Some(s) = self.try_take_bounce(recv)? {
                return Ok(s);
            }
            if start.elapsed() > self.timeout {
                let pool = self.stage.as_ref().expect("made");
                let (n, what) = match recv {
                    true => (pool.shape.recvs, "outstanding staged receives"),
                    false => (pool.shape.sends, "staged sends not yet complete"),
                };
                return Err(Error::invalid(format!(
                    "all {n} staging bounces are held by {what} for {:?}: wait for some first, or raise the pool with Comm::set_staging",
                    self.timeout
                )));
            }
        }
    }

    /// A free bounce of the receive (`recv`) or send side now, if there is one (making the
    /// pool if there is none). Held by nobody yet: `stage_bind` names the request.
    pub(super) fn try_take_bounce(&mut self, recv: bool) -> Result<Option<usize>> {
        if self.stage.is_none() {
            self.stage = Some(StagePool::new(&self.pd, self.stage_shape)?);
        }
        self.reclaim_bounces();
        let pool = self.stage.as_mut().expect("made");
        let free = pool.free_slot(recv);
        if let Some(s) = free {
            pool.uses[s] = SlotUse::Held {
                req: (u32::MAX, 0),
                exec: None,
            };
        }
        Ok(free)
    }

    /// Frees the bounces whose requests are done with them: a send's (or put's) once it
    /// completed, a receive's (or get's) once it was copied in (released by `wait`/`test`,
    /// retired by an executor's wait after its copy, or the executor's copy marked done).
    fn reclaim_bounces(&mut self) {
        let Comm { stage, reqs, .. } = self;
        let Some(pool) = stage.as_mut() else { return };
        for s in 0..pool.uses.len() {
            let SlotUse::Held {
                req: (slot, gen),
                exec,
            } = pool.uses[s]
            else {
                continue;
            };
            let free = match exec {
                Some(u) => pool.done.load64(s) >= u,
                None if slot == u32::MAX => false,
                // A send's bounce is free once the send completed; a receive's once it was
                // copied in: by the CPU before the request is released, or by an executor
                // before the retirement that completes the request.
                None => reqs.get(slot as usize).is_none_or(|st| {
                    !st.live
                        || st.generation != gen
                        || (st.stage.as_ref().is_some_and(|r| !r.inbound || r.by_exec)
                            && st.status != super::requests::Status::Pending)
                }),
            };
            if free {
                pool.uses[s] = SlotUse::Free;
            }
        }
    }

    /// Before `wait`/`test` release staged receive (or get) `r`: copies its `n` received
    /// bytes (a get's whole length) in with the CPU (unless an executor does).
    pub(super) fn stage_cpu_copy_in(&mut self, r: Request, n: u32) -> Result<()> {
        let st = self.state(r)?;
        let Some(rec) = st.stage.clone() else {
            return Ok(());
        };
        if rec.by_exec || !rec.inbound {
            return Ok(());
        }
        let n = match st.side {
            super::requests::Side::Recv => (n as usize).min(rec.len),
            super::requests::Side::Send => rec.len,
        };
        let pool = self.stage.as_ref().expect("a staged request has a pool");
        pool.cpu_copy(&rec, n, false)
    }

    /// `ops` (an executor's wait for staged receive or get `r`, whose completion the CPU
    /// already consumed) followed by the copy in of its bounce and the mark that frees the
    /// bounce; `ops` unchanged for other requests.
    pub(super) fn stage_exec_copy_in(&mut self, r: Request, mut ops: Ops) -> Result<Ops> {
        ops.append(self.stage_exec_copy(r, true)?);
        Ok(ops)
    }

    /// The copy in of staged receive or get `r`'s bounce by an executor (none for other
    /// requests, or where an executor already copies it), which the CPU then no longer makes;
    /// with `mark`, followed by the store that frees the bounce. Without it the bounce is
    /// freed when `r` is released: the copy must run before the wait's retirement, which the
    /// CPU sees before it releases `r` ([`Qp::recv_wait_ops_then`]).
    ///
    /// [`Qp::recv_wait_ops_then`]: gdsync::Qp::recv_wait_ops_then
    pub(super) fn stage_exec_copy(&mut self, r: Request, mark: bool) -> Result<Ops> {
        let st = self.state(r)?;
        let Some(rec) = st.stage.as_mut() else {
            return Ok(Ops::new());
        };
        if !rec.inbound || rec.by_exec {
            return Ok(Ops::new());
        }
        rec.by_exec = true;
        let rec = rec.clone();
        let pool = self.stage.as_mut().expect("a staged request has a pool");
        let mut ops = Ops::new();
        if rec.len > 0 {
            ops.append(pool.copy_ops(&rec, false));
        }
        if mark {
            pool.next_use += 1;
            let u = pool.next_use;
            ops.append(pool.done.write64(rec.slot, u));
            if let SlotUse::Held { exec, .. } = &mut pool.uses[rec.slot] {
                *exec = Some(u);
            }
        }
        Ok(ops)
    }

    /// Undoes [`stage_exec_copy`](Self::stage_exec_copy) for `r` whose wait could not be
    /// submitted: the CPU copies it in again, and a mark that will never be stored no longer
    /// holds the bounce.
    pub(super) fn stage_exec_copy_undone(&mut self, r: Request) {
        let Ok(st) = self.state(r) else { return };
        let Some(rec) = st.stage.as_mut() else { return };
        rec.by_exec = false;
        let slot = rec.slot;
        if let Some(SlotUse::Held { exec, .. }) =
            self.stage.as_mut().and_then(|p| p.uses.get_mut(slot))
        {
            *exec = None;
        }
    }

    /// Whether staged receive `r`'s bytes are still to be copied in by an executor that
    /// stores a mark when it has (its completion was consumed before `wait_on`, or it is a
    /// get): its request is not complete before that.
    pub(super) fn stage_exec_copy_outstanding(&mut self, r: Request) -> bool {
        let Ok(st) = self.state(r) else { return false };
        let Some(rec) = st.stage.as_ref().filter(|rec| rec.inbound && rec.by_exec) else {
            return false;
        };
        let slot = rec.slot;
        let Some(pool) = self.stage.as_ref() else {
            return false;
        };
        match pool.uses.get(slot) {
            Some(SlotUse::Held { exec: Some(u), .. }) => pool.done.load64(slot) < *u,
            _ => false,
        }
    }
}
