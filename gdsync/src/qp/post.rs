//! Posting: prepare a send (its WQE into the send ring), commit it (the op list that rings
//! the doorbell, for any executor) or post it from the CPU at once; post receives.

use super::doorbell::ring_ops;
use super::encode::encode;
use super::{Qp, QpShared, QpState, MAX_SGE, QP_PROXY};
use crate::format::*;
use crate::mem::slot_off;
use crate::ops::Ops;
use crate::wr::{RecvWr, SendFlags, SendWr, Sge};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A send that was prepared (its WQE is in the send ring) but not yet made visible to the
/// device. Commit it ([`Qp::commit`]) to get the op list that rings the doorbell.
///
/// Dropping it uncommitted turns its WQE into a no-op, exposed with the next commit (it then
/// completes as a no-op, with its wr_id, if it was signalled).
#[derive(Debug)]
#[must_use = "a prepared send does nothing until it is committed and its ops run"]
pub struct PreparedSend {
    qpn: u32,
    start: u64,
    end: u64,
    head: [u8; 8],
    ticket: SendTicket,
    /// Where an uncommitted drop records itself.
    abandoned: Arc<parking_lot::Mutex<Vec<u64>>>,
    committed: bool,
}

impl Drop for PreparedSend {
    fn drop(&mut self) {
        if !self.committed {
            self.abandoned.lock().push(self.start);
        }
    }
}

/// A commit refused (out of order, or another QP's send): the error and the prepared send,
/// to commit later. Converts into [`Error`] for `?`.
#[derive(Debug)]
pub struct CommitError {
    /// Why.
    pub error: Error,
    /// The send, still prepared.
    pub prepared: PreparedSend,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for CommitError {}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Error {
        let CommitError { error, prepared: _ } = e;
        error
    }
}

impl PreparedSend {
    /// The ticket the send will have.
    pub fn ticket(&self) -> SendTicket {
        self.ticket
    }
}

/// Refuses a WQE of `nbb` WQEBBs at producer counter `start` that does not fit the free part
/// of the send ring. `retired` is the retired count last read: counts only grow, so room
/// it leaves is there; only when it leaves too little are the counters read again.
#[inline]
fn check_room(
    s: &QpShared,
    retired: &mut u64,
    start: u64,
    nbb: u64,
    flags: SendFlags,
) -> Result<()> {
    let fits = |retired: u64| start - retired + nbb <= s.sq_cnt as u64;
    if !fits(*retired) {
        *retired = s.sq_retired();
        if !fits(*retired) {
            return Err(ring_full(s, start - *retired, flags));
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn ring_full(s: &QpShared, used: u64, flags: SendFlags) -> Error {
    Error::RingFull {
        ring: "send",
        qpn: s.qpn,
        used: used as u32,
        size: s.sq_cnt,
        hint: if flags.contains(SendFlags::SIGNALED) {
            ""
        } else {
            " (signal a send at least once per ring, or slots can never be freed)"
        },
    }
}

/// The `len` bytes of the send ring from producer counter `start` on, for a WQE to be written
/// in place; `None` where they run past the ring's end (the WQE continues at its start).
///
/// # Safety
/// The caller is the QP's one producer (it holds the `Qp` mutably) and has checked that the
/// slots are free ([`check_room`]): nothing else reads or writes them while the slice lives.
#[allow(clippy::mut_from_ref)] // the ring is shared memory; the slots are this producer's
#[inline]
unsafe fn sq_slots(s: &QpShared, start: u64, len: usize) -> Option<&mut [u8]> {
    let at = (start & (s.sq_cnt as u64 - 1)) as usize * WQEBB;
    if len > s.sq_cnt as usize * WQEBB - at {
        return None;
    }
    // SAFETY: inside the send ring (`at + len` is within its `sq_cnt` WQEBBs, which
    // `sq_addr` starts and QpShared::new checked lie in `buf`), memory `s` keeps allocated.
    // The slots are free and past the doorbell record, so the device does not read them, and
    // only this producer writes them (the caller's contract).
    Some(unsafe { std::slice::from_raw_parts_mut((s.sq_addr + at as u64) as *mut u8, len) })
}

/// Copies the WQE `wqe` into the send ring at producer counter `start`: up to the ring's
/// end, the rest at its start.
fn copy_to_ring(s: &QpShared, start: u64, wqe: &[u8]) {
    let slot = (start & (s.sq_cnt as u64 - 1)) as usize;
    let room = (s.sq_cnt as usize - slot) * WQEBB;
    let (first, wrapped) = wqe.split_at(wqe.len().min(room));
    s.buf.write(s.sq_off + slot * WQEBB, first);
    if !wrapped.is_empty() {
        s.buf.write(s.sq_off, wrapped);
    }
}

/// A send's WQE in the ring: the ticket and the first 8 bytes, which ring the doorbell.
pub(super) struct WrittenSend {
    pub(super) head: [u8; 8],
    pub(super) ticket: SendTicket,
}

/// Identifies a posted send: where it is in the ring and which completion it will produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendTicket {
    /// Producer counter (WQEBBs, free-running) of the WQE's first block.
    pub index: u64,
    /// Producer counter just after the WQE.
    pub end: u64,
    /// Its completion number on the send CQ, when the send is signalled and the CQ serves
    /// this QP's sends only (so completion order is known in advance).
    pub cqe: Option<u64>,
}

/// Identifies a posted receive and its completion number, as [`SendTicket`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvTicket {
    /// Receive counter (free-running).
    pub index: u64,
    /// Its completion number on the receive CQ, when that CQ serves this QP's receives only.
    pub cqe: Option<u64>,
}

impl Qp {
    /// Receives that can be posted now (free slots in the receive ring).
    pub fn recv_room(&self) -> u64 {
        (self.shared.rq_cnt as u64).saturating_sub(self.recv_used())
    }

    /// Receives posted and not yet retired.
    pub(super) fn recv_used(&self) -> u64 {
        self.rq_pi - self.shared.rq_retired()
    }

    /// Writes the WQE for `wr` into the send ring without ringing the doorbell.
    pub fn prepare_send(&mut self, wr: &SendWr) -> Result<PreparedSend> {
        let w = self.write_send(wr)?;
        self.uncommitted.push_back((w.ticket.index, w.ticket.end));
        Ok(PreparedSend {
            qpn: self.shared.qpn,
            start: w.ticket.index,
            end: w.ticket.end,
            head: w.head,
            ticket: w.ticket,
            abandoned: self.abandoned.clone(),
            committed: false,
        })
    }

    /// Encodes `wr` into the send ring at the producer index and advances it: what a
    /// prepared send and a CPU post have in common.
    pub(super) fn write_send(&mut self, wr: &SendWr) -> Result<WrittenSend> {
        self.check_connected()?;
        let s = &*self.shared;
        let start = self.sq_pi;
        let scratch = &mut self.scratch;
        let mut wraps = false;
        let w = encode(
            s,
            &self.ctx,
            &mut self.last_region,
            start,
            wr,
            &mut self.inline[..],
            |ds| {
                let nbb = wqebbs_for_ds(ds) as u64;
                check_room(s, &mut self.sq_retired_seen, start, nbb, wr.flags)?;
                // In place in the ring, unless the WQE runs past its end.
                // SAFETY: `&mut self` makes this the one producer; the room is checked.
                Ok(match unsafe { sq_slots(s, start, ds * SEG_SIZE) } {
                    Some(slots) => slots,
                    None => {
                        wraps = true;
                        &mut scratch[..]
                    }
                })
            },
        )?;
        if wraps {
            copy_to_ring(s, start, &self.scratch[..w.ds * SEG_SIZE]);
        }
        let nbb = wqebbs_for_ds(w.ds) as u64;
        let slot = (start & (s.sq_cnt as u64 - 1)) as usize;
        s.sq_wrid[slot].store(wr.wr_id, Ordering::Relaxed);
        s.sq_wqebbs[slot].store(nbb as u8, Ordering::Relaxed);
        self.sq_pi += nbb;
        let cqe = (wr.flags.contains(SendFlags::SIGNALED)
            && s.send_cq.users.load(Ordering::Acquire) == 1)
            .then(|| s.send_cq.reserved.fetch_add(1, Ordering::AcqRel));
        Ok(WrittenSend {
            head: w.head,
            ticket: SendTicket {
                index: start,
                end: self.sq_pi,
                cqe,
            },
        })
    }

    /// Refuses a send before the QP is connected. The device is asked until it reports the
    /// QP past INIT; from then on the answer cannot change (no command takes a QP back to
    /// RESET or INIT), so later sends skip the question.
    fn check_connected(&mut self) -> Result<()> {
        if !self.connected {
            if self.shared.state() == QpState::Init {
                return Err(Error::NotConnected {
                    qpn: self.shared.qpn,
                });
            }
            self.connected = true;
        }
        Ok(())
    }

    /// Commits a prepared send: returns its ticket and the op list that exposes it (and any
    /// earlier committed-in-order sends) to the device: barrier, store the doorbell record,
    /// barrier, store the 8-byte doorbell. Prepared sends must be committed in the order prepared.
    ///
    /// The returned ops must also run in commit order: running an older commit's ops after a
    /// newer one's moves the doorbell record backwards, which the device treats as a
    /// malformed ring (`LOCAL_QP_OP_ERR`, QP to error). A refused commit hands the prepared
    /// send back in the [`CommitError`].
    pub fn commit(&mut self, mut p: PreparedSend) -> Result<(SendTicket, Ops), CommitError> {
        if p.qpn != self.shared.qpn {
            return Err(CommitError {
                error: Error::invalid("prepared send belongs to another QP"),
                prepared: p,
            });
        }
        if let Err(error) = self.take_commit(&mut p) {
            return Err(CommitError { error, prepared: p });
        }
        Ok((p.ticket, ring_ops(&self.shared, p.end, p.head)))
    }

    /// The bookkeeping of a commit, shared by [`commit`](Self::commit) and
    /// [`post_send`](Self::post_send): `p` must be next in ring order (prepared sends dropped
    /// before it become no-ops); it is then committed.
    fn take_commit(&mut self, p: &mut PreparedSend) -> Result<()> {
        if !self.skip_abandoned(p.start) {
            return Err(Error::OutOfOrder {
                expected: self.committed,
                got: p.start,
            });
        }
        p.committed = true;
        self.uncommitted.pop_front();
        self.committed = p.end;
        Ok(())
    }

    /// Whether the send prepared at `start` is next, once prepared sends dropped without a
    /// commit in front of it are turned into no-ops and passed over.
    fn skip_abandoned(&mut self, start: u64) -> bool {
        self.neutralise_abandoned();
        // `uncommitted` holds the live ones in ring order: `start` is next if it is first.
        if self.uncommitted.front().map(|&(s, _)| s) == Some(start) {
            self.committed = start;
            true
        } else {
            false
        }
    }

    /// Prepared sends dropped without a commit become no-ops and leave the queue.
    fn neutralise_abandoned(&mut self) {
        let abandoned = std::mem::take(&mut *self.abandoned.lock());
        for a in abandoned {
            if let Some(i) = self.uncommitted.iter().position(|&(s, _)| s == a) {
                let (s, e) = self.uncommitted.remove(i).unwrap();
                self.neutralise(s, e);
            }
        }
    }

    /// Whether no prepared send waits for its commit (those dropped uncommitted are passed
    /// over as no-ops): a doorbell rung now exposes nothing prepared.
    pub(super) fn no_prepared_waiting(&mut self) -> bool {
        if !self.uncommitted.is_empty() {
            self.neutralise_abandoned();
        }
        self.uncommitted.is_empty()
    }

    /// Rewrites the WQE at `[start, end)` as a no-op of the same size (same completion).
    fn neutralise(&mut self, start: u64, _end: u64) {
        let s = &*self.shared;
        let off = slot_off(s.sq_off, start, s.sq_cnt, WQEBB);
        let mut b = [0u8; 16];
        s.buf.read(off, &mut b);
        b[3] = Opcode::Nop as u8;
        s.buf.write(off, &b);
    }

    /// Whether the doorbell has been rung for every send up to `end` (a
    /// [`SendTicket::end`]), whether this thread posted them or an executor, a kernel or the
    /// CPU proxy rang their commit: every ringer publishes how far it rang AFTER its doorbell
    /// (the doorbell record cannot tell: ringers store it before their doorbell). A CPU post
    /// must wait for this before it rings past sends another ringer has not rung yet (its
    /// doorbell would otherwise expose them early, and the other doorbell, still to come,
    /// would then go backwards).
    ///
    /// A completion at or beyond `end` that a wait or a poll has retired tells it too: the
    /// device executes only sends a doorbell exposed. That is how a QP of
    /// [`Ringers::Executors`](super::Ringers::Executors), whose commits store no "rung to",
    /// finds its commits rung.
    pub fn doorbell_reached(&self, end: u64) -> bool {
        reached(self.shared.sq_rung().load(Ordering::Acquire), end)
            || reached(self.shared.sq_retired(), end)
    }

    /// The send doorbell record: the low 16 bits of the producer counter (big-endian in
    /// memory) as last exposed to the device.
    pub(super) fn sq_doorbell_record(&self) -> u16 {
        let native = self.shared.sq_dbrec().load(Ordering::Acquire);
        u32::from_be(native) as u16
    }

    /// Whether sends committed for an executor ([`commit`](Self::commit)) are not rung yet
    /// (their ops have not run to the end). A CPU post now would ring past them, so they
    /// would go out before whatever the executor waits for, and the executor's own doorbell
    /// would later move backwards: [`post_send`](Self::post_send) refuses then.
    /// (A QP in error flushes all work anyway: never then.)
    #[inline]
    pub fn has_unrung_commits(&self) -> bool {
        // Rung once "rung to" has reached the last commit: the common case, one load.
        !self.doorbell_reached(self.committed) && self.unrung_beyond_record()
    }

    /// [`has_unrung_commits`](Self::has_unrung_commits) once "rung to" is short of the last
    /// commit: unless the QP is in error, or the proxy thread rings within a second.
    #[inline(never)]
    fn unrung_beyond_record(&self) -> bool {
        let c = &self.shared.ctrl;
        let rung = || self.doorbell_reached(self.committed);
        if self.shared.state() == QpState::Error {
            return false;
        }
        if self.shared.handler == crate::NicHandler::Cpu
            && c.u64(QP_PROXY).load(Ordering::Acquire) == self.committed
        {
            // The executor has asked the proxy thread to ring; it does within microseconds.
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(1) {
                if rung() {
                    return false;
                }
                std::thread::yield_now();
            }
        }
        true
    }

    /// Posts a send from the CPU: prepare, then do what the commit ops describe (store the
    /// doorbell record, order, store the doorbell) directly on this thread. Refused while
    /// sends committed for an executor are not rung yet ([`has_unrung_commits`](Self::has_unrung_commits)).
    pub fn post_send(&mut self, wr: &SendWr) -> Result<SendTicket> {
        self.refuse_unrung_commits()?;
        let (ticket, head) = if self.uncommitted.is_empty() {
            // Nothing prepared is waiting (and so nothing dropped uncommitted either): the
            // send is next in ring order, with no prepared send to track.
            let w = self.write_send(wr)?;
            self.committed = w.ticket.end;
            (w.ticket, w.head)
        } else {
            let mut p = self.prepare_send(wr)?;
            self.take_commit(&mut p)?;
            (p.ticket, p.head)
        };
        self.ring_doorbell(ticket.end, head);
        Ok(ticket)
    }

    /// Refuses a CPU doorbell while sends committed for an executor are not rung yet
    /// ([`has_unrung_commits`](Self::has_unrung_commits)).
    #[inline]
    pub(super) fn refuse_unrung_commits(&self) -> Result<()> {
        if self.has_unrung_commits() {
            return Err(self.unrung_commits_error());
        }
        Ok(())
    }

    /// The error of [`refuse_unrung_commits`](Self::refuse_unrung_commits), off the posting
    /// path.
    #[cold]
    #[inline(never)]
    fn unrung_commits_error(&self) -> Error {
        let qpn = self.shared.qpn;
        if self.shared.cfg.ringers == super::Ringers::Executors {
            return Error::invalid(format!(
                "QP {qpn}: sends committed for an executor are not known to be rung (with QpConfig::ringers Ringers::Executors commits do not publish it); a CPU post now could expose them early. Wait for a signalled send's completion at or after the last commit first, post on the executor too (prepare_send + commit), or create the QP with Ringers::Mixed"
            ));
        }
        Error::invalid(format!(
            "QP {qpn}: sends committed for an executor have not been rung yet; a CPU post now would expose them early. Post on that executor too (prepare_send + commit), or let it run first"
        ))
    }

    /// Commits a prepared send and submits its doorbell ops to `exec` (a stream: the send
    /// goes out when the stream reaches it).
    pub fn post_prepared(
        &mut self,
        p: PreparedSend,
        exec: &impl crate::exec::Executor,
    ) -> Result<SendTicket> {
        let (t, ops) = self.commit(p)?;
        exec.submit(ops)?;
        Ok(t)
    }

    /// Posts a receive: writes the scatter list into the receive ring and updates the
    /// doorbell record (receives have no doorbell register).
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<RecvTicket> {
        let s = &*self.shared;
        let max = (s.rq_stride as usize) / SEG_SIZE;
        let sges: smallvec::SmallVec<[&Sge; 4]> = wr.sges.iter().filter(|g| g.len > 0).collect();
        if sges.len() > max {
            return Err(Error::invalid(format!(
                "{} SGEs in a receive; this QP takes at most {max} (max_recv_sge)",
                sges.len()
            )));
        }
        let used = self.recv_used();
        if used >= s.rq_cnt as u64 {
            return Err(Error::RingFull {
                ring: "receive",
                qpn: s.qpn,
                used: used as u32,
                size: s.rq_cnt,
                hint: "",
            });
        }
        let segs: smallvec::SmallVec<[DataSeg; MAX_SGE]> = sges
            .iter()
            .map(|g| DataSeg::new(g.addr, g.len, g.lkey))
            .collect();
        let mut slot = [0u8; MAX_SGE * SEG_SIZE];
        let n = RecvWqe {
            segs: DataSegs::from_segs(&segs),
        }
        .write_to(&mut slot[..s.rq_stride as usize])
        .map_err(|e| Error::invalid(e.to_string()))?;
        let base = slot_off(0, self.rq_pi, s.rq_cnt, s.rq_stride as usize);
        s.buf.write(base, &slot[..n]);
        s.rq_wrid[(self.rq_pi & (s.rq_cnt as u64 - 1)) as usize].store(wr.wr_id, Ordering::Relaxed);
        let index = self.rq_pi;
        self.rq_pi += 1;
        let cqe = (s.recv_cq.users.load(Ordering::Acquire) == 1)
            .then(|| s.recv_cq.reserved.fetch_add(1, Ordering::AcqRel));
        // (Without a number the CQ serves other queues too, which `shared_ever` records.)
        if let Some(n) = cqe {
            s.note_rq_cqe(index, n);
        }
        // The segments before the counter the device reads (a release store orders them for
        // CPUs; the barrier for a device on an AArch64 host).
        crate::barrier::dma_wmb();
        s.dbrec_word(DBREC_RQ)
            .store(qp_dbrec_value(self.rq_pi).native(), Ordering::Release);
        self.ctx.provider.kick();
        Ok(RecvTicket { index, cqe })
    }
}
