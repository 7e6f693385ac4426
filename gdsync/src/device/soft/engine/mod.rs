//! The engine: one per soft device, polling doorbells and links as a ConnectX's processing
//! loop does. The steps of `docs/soft-device.md` are functions of their own, by concern:
//!
//! - [`requester`]: doorbell, parse, local checks, fence, send (requester steps 1 to 5);
//! - [`responder`]: admission and checks of a request's first packet, its payload, the
//!   receive it consumes and the answer;
//! - [`acks`]: acknowledgements owed, sent a round later and coalesced per QP;
//! - [`by_ref`]: single-copy delivery of large payloads between devices of one process;
//! - [`direct_write`]: RDMA writes the requester copies straight into the responder's
//!   memory, between devices of one process;
//! - [`admission`]: the one rule by which a responder QP takes a request, for packets and
//!   direct writes alike;
//! - [`completion`]: responses from the peer, in-order completion and CQE writes (step 6);
//! - [`errors`]: malformed WQEs, failures and the error state with its flushes;
//! - [`links`]: packets in and out of the links;
//! - [`packets`]: the headers of a message's packets, responses and NAKs;
//! - [`memory`]: key checks and copies between the wire and registered memory;
//! - [`timers`]: dead links, retry delays and the transport timeout.
//!
//! Errors put the QP in the error state: the failing WQE gets an error CQE, everything else
//! posted (send and receive) completes with WR_FLUSH.

mod acks;
mod admission;
mod by_ref;
mod completion;
mod direct_write;
mod errors;
mod links;
mod memory;
mod packets;
mod report;
mod requester;
mod responder;
pub(crate) use responder::WRITES_TAKEN_IN;
mod strict;
mod timers;

use super::link::{DeviceShare, Link};
use super::mr_table::{MrCache, MrTable};
use super::targets::WriteTargets;
use super::uar::{Bfreg, Doorbell, HALVES};
use super::watch::Watch;
use super::wire::{resp, PktHeader};
use super::{Cmd, EngineCtl};
use crate::format::*;
use crate::mem::RingMem;
use crate::provider::{Access, AsyncEvent, HwQpState, QpTimers};
use memory::Seg;

/// Called with the peer device of each link the engine releases: the device forgets it.
pub(crate) type ForgetPeer = Box<dyn Fn(u64) + Send>;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A CQ as the device knows it (its CQ context): the ring and doorbell record the host
/// placed, and the producer index and error flag, which are the device's own.
pub(crate) struct CqHw {
    pub cqn: u32,
    pub cnt: u32,
    pub ring: Arc<RingMem>,
    pub dbrec: Arc<RingMem>,
    pub dbrec_off: usize,
    /// Producer index (free-running): the device's own counter.
    pub pi: crate::mem::Padded<AtomicU64>,
    /// The consumer index last read from the doorbell record (24 bits), which is read for
    /// every CQE: the strict checks compare each read with the one before.
    pub ci_seen: AtomicU32,
    /// The CQ is in error (it overran, or its consumer index was one the device refuses):
    /// it takes no more CQEs.
    pub overrun: AtomicBool,
    /// Where the device reports a CQ error.
    pub ctl: Arc<EngineCtl>,
}

/// A QP as the device knows it (its QP context): ring addresses and sizes, the doorbell
/// record the host placed, the doorbell register page the device handed out, its CQs and
/// the transport settings of its last modify.
pub(crate) struct QpHw {
    pub qpn: u32,
    pub pd: u32,
    /// RQ at `rq_off`, SQ at `sq_off` after it (the mlx5 layout; `rq_off` is where in its
    /// first page the host placed the ring, 0 for the queue layer's own).
    pub buf: Arc<RingMem>,
    pub rq_off: usize,
    pub sq_off: usize,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub rq_stride: u32,
    /// The doorbell record (`[RQ][SQ]`, BE32) at `dbrec_off`.
    pub dbrec: Arc<RingMem>,
    pub dbrec_off: usize,
    /// The doorbell register the device handed out: both halves of a bfreg in a UAR page.
    pub bfreg: Bfreg,
    pub send_cq: Arc<CqHw>,
    pub recv_cq: Arc<CqHw>,
    pub timers: QpTimers,
    /// What CQEs carry in `srqn_uidx` (the user index the host gave the QP).
    pub user_index: u32,
    /// The remote access the QP grants its peer (the QP context's RRE, RWE and RAE bits):
    /// the responder refuses a read, write or atomic not granted, whatever the region allows.
    pub access: Access,
}

impl QpHw {
    /// Both halves of the QP's doorbell register (a CPU poster alternates between them), and
    /// those of its pair register ([`Bfreg::halves`]), as they stood at one moment
    /// ([`Bfreg::doorbell`]).
    #[inline]
    fn doorbell(&self) -> Doorbell {
        self.bfreg.doorbell()
    }
    /// Where the newest doorbell rung since `last` ends (see [`doorbell_end`]), if every half
    /// that changed names this QP and lies at most a ring ahead of `ci`: the send queue's
    /// producer index, known without reading the doorbell record (a line the poster wrote).
    fn doorbell_end(&self, db: Doorbell, last: Doorbell, ci: u16) -> Option<u16> {
        let mut end: Option<u16> = None;
        for h in 0..HALVES {
            if db[h] == last[h] {
                continue;
            }
            let e = crate::format::doorbell_end(db[h], self.qpn)?;
            let ahead = e.wrapping_sub(ci);
            if u32::from(ahead) > self.sq_cnt {
                return None;
            }
            if end.is_none_or(|x| ahead > x.wrapping_sub(ci)) {
                end = Some(e);
            }
        }
        end
    }
    /// The receive doorbell record's producer index. A QP without a receive ring (a
    /// send-only QP of libmlx5's) has none posted, whatever its record says.
    fn rq_producer(&self) -> u16 {
        if self.rq_cnt == 0 {
            return 0;
        }
        (crate::mem::load_be32(&self.dbrec, self.dbrec_off + 4 * DBREC_RQ) & 0xFFFF) as u16
    }
    /// The send doorbell record's producer index.
    fn sq_producer(&self) -> u16 {
        (crate::mem::load_be32(&self.dbrec, self.dbrec_off + 4 * DBREC_SQ) & 0xFFFF) as u16
    }
}

/// NAK codes beyond the error syndromes: retry later.
const NAK_RNR: u8 = 0xF0;
/// The responder QP exists but is not connected yet (a real responder drops such packets
/// and the requester's transport retries; here the retry is explicit).
const NAK_NOT_READY: u8 = 0xF1;

/// Most asynchronous events kept for the host.
const MAX_EVENTS: usize = 4096;
/// Most messages queued on a link before a QP stops reading its send ring.
const MAX_QUEUED: usize = 256;
/// Retry delay after a NOT_READY NAK.
const NOT_READY_DELAY: Duration = Duration::from_millis(1);

/// A WQE the requester has started and not completed.
struct OutWqe {
    psn: u32,
    idx: u16,
    sq_pos: u64,
    opcode: Opcode,
    signalled: bool,
    done: bool,
    /// Read or atomic: total length and where results land.
    len: u32,
    got: u32,
    scatter: SmallVec<[Seg; 2]>,
}

/// A message being received (after its first packet was accepted).
struct IncomingMessage {
    op: Opcode,
    len: u32,
    got: u32,
    solicited: bool,
    imm: [u8; 4],
    dest: Dest,
}

/// Where a message being received lands: memory through an rkey (RDMA writes), or the
/// segments of the receive it consumed (sends).
enum Dest {
    Memory { rkey: u32, addr: u64 },
    Recv { sges: SmallVec<[Seg; 4]> },
}

/// What a queued message sends as payload.
enum Body {
    Empty,
    Inline(SmallVec<[u8; 64]>),
    /// From local memory through the requester's lkeys.
    Gather(SmallVec<[Seg; 2]>),
    /// From local memory through an rkey (read responses).
    Memory {
        rkey: u32,
        addr: u64,
    },
    /// Left in local memory (one segment): the packets name it ([`by_ref`]).
    ByRef(Seg),
}

/// A [`Body`] borrowed: what a message being sent at once reads its payload from (the WQE
/// just read, the requester's segments), made a [`Body`] only if it must wait in the queue.
#[derive(Clone, Copy)]
enum BodyRef<'a> {
    Empty,
    Inline(&'a [u8]),
    Gather(&'a [Seg]),
    Memory { rkey: u32, addr: u64 },
    ByRef(Seg),
}

impl Body {
    fn as_ref(&self) -> BodyRef<'_> {
        match self {
            Body::Empty => BodyRef::Empty,
            Body::Inline(b) => BodyRef::Inline(b),
            Body::Gather(s) => BodyRef::Gather(s),
            Body::Memory { rkey, addr } => BodyRef::Memory {
                rkey: *rkey,
                addr: *addr,
            },
            Body::ByRef(s) => BodyRef::ByRef(*s),
        }
    }
}

impl BodyRef<'_> {
    fn to_owned(self) -> Body {
        match self {
            BodyRef::Empty => Body::Empty,
            BodyRef::Inline(b) => Body::Inline(SmallVec::from_slice(b)),
            BodyRef::Gather(s) => Body::Gather(SmallVec::from_slice(s)),
            BodyRef::Memory { rkey, addr } => Body::Memory { rkey, addr },
            BodyRef::ByRef(s) => Body::ByRef(s),
        }
    }
}

/// A message queued on a link: its header, payload, the PD its payload is read through,
/// and how many payload bytes have gone out.
struct QueuedMessage {
    hdr: PktHeader,
    body: Body,
    pd: u32,
    sent: u32,
}

/// A QP as the engine keeps it, the QP context of a ConnectX: what the host gave it
/// ([`QpHw`]), the connection, the error state, and the state of its two halves, the
/// requester (send ring, [`SqContext`]) and the responder (receive ring, [`RqContext`]).
struct QpContext {
    hw: QpHw,
    /// The link to the peer (an index in the engine's links), once connected.
    link: Option<usize>,
    /// The peer QP's number.
    rqpn: u32,
    /// Connected to the device of this uid, whose link is still being set up (links form
    /// lazily, as a ConnectX's path needs no handshake): bound to it when it comes up. Until
    /// then sends wait under the transport timeout.
    awaiting: Option<u64>,
    /// The peer closed the link in order while this QP had no work outstanding: the QP keeps
    /// its state and its posted receives (as on a ConnectX, whose QP learns nothing of a
    /// peer's exit); work posted later fails, as a request to a gone peer does.
    peer_gone: bool,
    /// In the error state: work is flushed, nothing is sent or taken.
    err: bool,
    /// A CQE of this QP was dropped because its CQ overran: the QP goes to error.
    cq_overrun: bool,
    sq: SqContext,
    rq: RqContext,
}

/// The requester's half of a QP context: the send ring's consumer index, the messages it
/// started, and the transport's retry and timeout state.
struct SqContext {
    /// The send ring's consumer index (free-running, in WQEBBs).
    ci: u64,
    /// The doorbell register's halves as last seen.
    last_db: Doorbell,
    /// Where the WQEs of the newest doorbell that named one end (the strict checks refuse a
    /// doorbell behind it).
    rung_end: u16,
    /// The ring is to be looked at again without a new doorbell (stalled, or not read to
    /// its end).
    pending: bool,
    /// The PSN of the next message sent.
    next_psn: u32,
    /// The WQEs started and not completed, in order.
    out: VecDeque<OutWqe>,
    /// RNR retries left for the message at the front.
    rnr_left: u8,
    /// A retry waits until then (an RNR delay, a NOT_READY retry).
    retry_at: Option<Instant>,
    /// When the transport timer last restarted.
    progress_at: Instant,
    /// The QP made progress (an answer came, a WQE completed, the first WQE went out) since
    /// the timers last looked: they restart its transport timer at their own clock reading,
    /// which is never earlier than the progress (so no timeout fires early) and spares each
    /// message a read of the clock.
    progressed: bool,
    /// The peer answered "not ready" and nothing else since: retries are not progress, so
    /// the QP's timeout keeps running across them.
    not_ready: bool,
    /// After entering the error state with nothing outstanding (e.g. during an RNR wait):
    /// the syndrome the next WQE of the ring completes with, instead of WR_FLUSH.
    fail_next: Option<Syndrome>,
}

/// The responder's half of a QP context: the PSN it expects, the receive ring's consumer
/// index, the message being received and the ACK owed.
struct RqContext {
    /// The PSN of the next message the QP takes.
    exp_psn: u32,
    /// The receive ring's consumer index (free-running).
    ci: u64,
    /// The message being received, after its first packet was accepted.
    inmsg: Option<IncomingMessage>,
    /// The responder owes the peer an ACK up to this PSN ([`acks`]).
    ack_owed: Option<u32>,
    /// The QP's context is published to its in-process peer for direct writes
    /// ([`direct_write`]): each PSN it expects is published too.
    published: bool,
}

impl QpContext {
    /// What admission looks at in this QP's context (the peer named by link index).
    #[inline]
    fn view(&self) -> admission::QpView<usize> {
        admission::QpView {
            peer: self.link,
            rqpn: self.rqpn,
            err: self.err,
            exp_psn: self.rq.exp_psn,
        }
    }

    /// The responder took the message at its expected PSN: it expects the next, and says so
    /// to a peer that writes directly.
    #[inline]
    fn expect_next(&mut self, targets: &WriteTargets) {
        self.rq.exp_psn = self.rq.exp_psn.wrapping_add(1);
        if self.rq.published {
            targets.expect(self.hw.qpn, self.rq.exp_psn);
        }
    }
}

/// The engine's QP contexts, by QPN (the QP table of a ConnectX).
#[derive(Default)]
struct QpTable(Vec<Option<QpContext>>);

impl QpTable {
    /// QP `qpn`'s context, if the QP exists.
    #[inline]
    fn get(&self, qpn: u32) -> Option<&QpContext> {
        self.0.get(qpn as usize)?.as_ref()
    }

    /// QP `qpn`'s context, if the QP exists.
    #[inline]
    fn get_mut(&mut self, qpn: u32) -> Option<&mut QpContext> {
        self.0.get_mut(qpn as usize)?.as_mut()
    }

    /// QP `qpn`'s context and its link (if connected and not released), borrowed together
    /// and apart from the rest of the engine: the one lookup a step needs.
    #[inline]
    fn with_link<'a>(
        &'a mut self,
        qpn: u32,
        links: &'a mut [EngineLink],
    ) -> Option<(&'a mut QpContext, Option<&'a mut EngineLink>)> {
        let q = self.get_mut(qpn)?;
        let link = q.link.and_then(|li| links.get_mut(li));
        Some((q, link))
    }

    /// A new QP's context, in its QPN's place.
    fn insert(&mut self, q: QpContext) {
        let n = q.hw.qpn as usize;
        if self.0.len() <= n {
            self.0.resize_with(n + 1, || None);
        }
        self.0[n] = Some(q);
    }

    /// Takes QP `qpn`'s context out (the QP is destroyed).
    fn remove(&mut self, qpn: u32) -> Option<QpContext> {
        self.0.get_mut(qpn as usize)?.take()
    }

    /// Drops every QP.
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// One of the engine's links, with the messages waiting for room in its send ring.
struct EngineLink {
    link: Link,
    queue: VecDeque<QueuedMessage>,
}

pub(crate) struct Engine {
    ctl: Arc<EngineCtl>,
    mrs: Arc<MrTable>,
    /// This device's QPs that take direct writes from its in-process peers ([`direct_write`]).
    targets: Arc<WriteTargets>,
    mrc: MrCache,
    qps: QpTable,
    active: Vec<u32>,
    links: Vec<EngineLink>,
    /// QPs that owe an ACK ([`acks`]).
    owed: Vec<u32>,
    /// Coarse clock for the timers, refreshed every few dozen polling rounds and on each
    /// timer tick (timeouts are milliseconds).
    now: Instant,
    /// Whether `now` may be older than the current round (threads that help read no clock
    /// for idle rounds): the first timestamp of a round's work reads it again.
    clock_stale: bool,
    /// A [`poll_round`](Self::poll_round) returned after the links: the next round is a
    /// full one.
    doorbells_due: bool,
    /// What waiting threads look at before they run a round ([`Watch`]); stale once QPs or
    /// links came or went.
    watch: Arc<Watch>,
    watch_stale: bool,
    /// Tells the device that a link was released ([`ForgetPeer`]).
    forget_peer: ForgetPeer,
}

fn psn_le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

impl Engine {
    /// QP `qpn`'s context and its link: [`QpTable::with_link`] on the engine's tables.
    #[inline]
    fn qp_and_link(&mut self, qpn: u32) -> Option<(&mut QpContext, Option<&mut EngineLink>)> {
        self.qps.with_link(qpn, &mut self.links)
    }

    pub(crate) fn new(ctl: Arc<EngineCtl>, share: DeviceShare, forget_peer: ForgetPeer) -> Self {
        let watch = ctl.watch.lock().clone();
        Self {
            ctl,
            mrs: share.regions,
            targets: share.targets,
            mrc: MrCache::default(),
            qps: QpTable::default(),
            active: Vec::new(),
            links: Vec::new(),
            owed: Vec::new(),
            now: Instant::now(),
            clock_stale: false,
            doorbells_due: false,
            watch,
            watch_stale: true,
            forget_peer,
        }
    }

    /// One polling round, as the NIC's processing loop: control commands, the region table,
    /// every QP's doorbell, every link (send, receive, send again), and on a `tick` the
    /// clock and the timers. Returns whether anything happened.
    pub(crate) fn round(&mut self, tick: bool) -> bool {
        self.doorbells_due = false;
        self.prelude(tick);
        // ACKs owed since an earlier round go at this round's end (see [`acks`]).
        let owed_before = !self.owed.is_empty();
        let work = self.poll_qps() | self.poll_links();
        self.epilogue(tick, owed_before, work)
    }

    /// A round for a thread that waits for a message to arrive (it polls a CQ or its
    /// memory): the links first, and as soon as one brought a message in, back to the
    /// caller, whose look may find what it waits for. The doorbells, timers and owed ACKs
    /// left then come first in the next round (a full one), so nothing waits longer than a
    /// round.
    pub(crate) fn poll_round(&mut self, tick: bool) -> bool {
        if tick || self.doorbells_due {
            return self.round(tick);
        }
        self.prelude(false);
        let owed_before = !self.owed.is_empty();
        if self.poll_links() {
            self.doorbells_due = true;
            self.watch.unsettle();
            return true;
        }
        let mut work = self.poll_qps();
        // What the doorbells queued goes out now, as a full round would send it.
        work |= self.pump_all();
        self.epilogue(false, owed_before, work)
    }

    /// After a round that found nothing: publishes what it saw for the waiting threads'
    /// looks ([`Watch`]), if nothing is pending (else they run rounds until it is done).
    pub(crate) fn settle_watch(&mut self) {
        if self.watch_stale {
            self.rewatch();
        }
        let pending = !self.owed.is_empty()
            || self.doorbells_due
            || self.links.iter().any(|l| !l.queue.is_empty())
            || (self.active.iter())
                .filter_map(|&n| self.qps.get(n))
                .any(|q| q.sq.pending || q.err || q.cq_overrun);
        if pending {
            self.watch.unsettle();
            return;
        }
        let qps = &self.qps;
        self.watch.settle(
            (self.active.iter())
                .filter_map(|&n| qps.get(n))
                .map(|q| q.sq.last_db),
            self.links.iter().map(|l| l.link.rx.pos()),
            self.mrc.version(),
        );
    }

    /// A new watch over the QPs and links the engine has now, handed to the waiting threads
    /// (they see the generation move and take it).
    #[cold]
    fn rewatch(&mut self) {
        let bfregs = (self.active.iter())
            .filter_map(|&n| self.qps.get(n))
            .map(|q| q.hw.bfreg.clone())
            .collect();
        let rings = self.links.iter().map(|l| l.link.rx.probe()).collect();
        self.watch.unsettle();
        self.watch = Arc::new(Watch::new(bfregs, rings, self.mrs.clone()));
        *self.ctl.watch.lock() = self.watch.clone();
        self.ctl.watch_gen.fetch_add(1, Ordering::Release);
        self.watch_stale = false;
    }

    /// What every round starts with: the control commands, the region table, the clock.
    #[inline]
    fn prelude(&mut self, tick: bool) {
        if self.ctl.has_cmds.load(Ordering::Acquire) {
            self.commands();
        }
        // Between rounds: no region from an older table copy is in use.
        self.mrc.sync(&self.mrs);
        if tick {
            self.touch_clock();
        }
    }

    /// Every link: send what the send rings produced, read the wire, send the answers.
    #[inline]
    fn poll_links(&mut self) -> bool {
        let mut work = false;
        for li in 0..self.links.len() {
            // Send what the send rings produced before looking at the wire: a peek at
            // the receive ring may wait for a cache line the peer just wrote.
            work |= self.pump(li);
            work |= self.poll_link(li);
            work |= self.pump(li);
            // On the loopback link the answers just sent are this engine's to read: take
            // them now (an acknowledgement completes its WQE in this round, not the next).
            if self.links[li].link.is_loopback() {
                work |= self.poll_link(li);
            }
        }
        work
    }

    /// Every active QP's doorbell.
    #[inline]
    fn poll_qps(&mut self) -> bool {
        let mut work = false;
        for i in 0..self.active.len() {
            work |= self.poll_qp(self.active[i]);
        }
        work
    }

    /// What every round ends with, after `work` so far: on a `tick` the timers, and the ACKs
    /// owed since an earlier round. A round that did anything clears the [`Watch`]. Returns
    /// whether it did.
    #[inline]
    fn epilogue(&mut self, tick: bool, owed_before: bool, mut work: bool) -> bool {
        if tick {
            work |= self.timers(Instant::now());
        }
        if owed_before {
            work |= self.pay_acks();
        }
        if work {
            self.watch.unsettle();
        }
        work
    }

    /// The look before a nap (after `sleeping` was announced): whether a doorbell or a
    /// command arrived meanwhile. A pending command is applied by the next round before any
    /// doorbell is served: a doorbell rung after a modify must find the QP modified.
    pub(crate) fn last_look(&mut self) -> bool {
        if self.ctl.has_cmds.load(Ordering::Acquire) {
            return true;
        }
        let again = self.poll_qps();
        if again {
            self.watch.unsettle();
        }
        // (An owed ACK needs one more round.)
        again || !self.owed.is_empty()
    }

    /// The calling thread is the engine's own: deregistrations wake it to see the new table.
    pub(crate) fn attach_thread(&self) {
        self.mrs.set_engine(Some(std::thread::current()));
    }

    /// The engine's thread ends: deregistrations have nobody to wait for.
    pub(crate) fn detach_thread(&self) {
        self.mrs.set_engine(None);
    }

    /// Drops every QP, link and queued packet (the device is gone).
    pub(crate) fn clear(&mut self) {
        self.targets.close_all();
        self.qps.clear();
        self.active.clear();
        self.links.clear();
        self.ctl.links_held.store(0, Ordering::Release);
        self.rewatch();
    }

    /// Refreshes the coarse clock (after a nap).
    pub(crate) fn touch_clock(&mut self) {
        self.now = Instant::now();
        self.clock_stale = false;
    }

    /// Marks the clock as possibly old: a thread that lends itself to the engine reads the
    /// clock only when a round has work to stamp.
    pub(crate) fn clock_may_be_stale(&mut self) {
        self.clock_stale = true;
    }

    /// The time for a stamp that starts or restarts a wait (a transport timeout, an RNR
    /// delay): never older than the work it times, so a timeout never fires early.
    fn stamp(&mut self) -> Instant {
        if self.clock_stale {
            self.touch_clock();
        }
        self.now
    }

    /// Whether the device holds regions in GPU memory (copies to them bind a CUDA context,
    /// so only the engine's own thread may run rounds).
    pub(crate) fn has_gpu_regions(&self) -> bool {
        self.mrs.has_gpu_regions()
    }

    /// Applies the control commands queued since the last round.
    fn commands(&mut self) {
        // Cleared before the take: a command pushed after it sets the flag again.
        self.ctl.has_cmds.store(false, Ordering::SeqCst);
        self.watch_stale = true;
        self.watch.unsettle();
        let cmds = std::mem::take(&mut *self.ctl.cmds.lock());
        let n = cmds.len() as u64;
        for c in cmds {
            match c {
                Cmd::AddQp(hw) => self.add_qp(*hw),
                Cmd::RemoveQp(qpn) => self.remove_qp(qpn),
                Cmd::Connect {
                    qpn,
                    peer,
                    rqpn,
                    rq_psn,
                    lazy,
                } => self.connect(qpn, peer, rqpn, rq_psn, lazy),
                Cmd::Timers { qpn, timers } => {
                    if let Some(q) = self.qps.get_mut(qpn) {
                        q.hw.timers = timers;
                        q.sq.rnr_left = timers.rnr_retry;
                        q.sq.next_psn = timers.sq_psn;
                    }
                }
                Cmd::Access { qpn, access } => self.set_access(qpn, access),
                Cmd::NoLink(peer) => self.no_link(peer),
                Cmd::AddLink(l) => {
                    self.links.push(EngineLink {
                        link: *l,
                        queue: VecDeque::new(),
                    });
                    self.ctl
                        .links_held
                        .store(self.links.len(), Ordering::Release);
                    self.bind_awaiting(self.links.len() - 1);
                }
            }
        }
        self.ctl.applied.fetch_add(n, Ordering::AcqRel);
    }

    /// A new QP, in the QP table and polled from now on.
    fn add_qp(&mut self, hw: QpHw) {
        let n = hw.qpn;
        let rnr = hw.timers.rnr_retry;
        // (A bfreg of a destroyed QP keeps what was last rung there.)
        let last_db = hw.doorbell();
        let progress_at = self.stamp();
        self.qps.insert(QpContext {
            hw,
            link: None,
            rqpn: 0,
            awaiting: None,
            peer_gone: false,
            err: false,
            cq_overrun: false,
            sq: SqContext {
                ci: 0,
                last_db,
                rung_end: 0,
                pending: false,
                next_psn: 0,
                out: VecDeque::new(),
                rnr_left: rnr,
                retry_at: None,
                progress_at,
                progressed: false,
                not_ready: false,
                fail_next: None,
            },
            rq: RqContext {
                exp_psn: 0,
                ci: 0,
                inmsg: None,
                ack_owed: None,
                published: false,
            },
        });
        self.active.push(n);
    }

    /// The remote access QP `qpn` grants from now on. A QP that no longer takes remote writes
    /// is withdrawn from its in-process peer's direct writes (they come as packets then, and
    /// are refused).
    fn set_access(&mut self, qpn: u32, access: Access) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        q.hw.access = access;
        if q.rq.published && !access.contains(Access::REMOTE_WRITE) {
            q.rq.published = false;
            self.targets.close(qpn);
        }
    }

    /// A destroyed QP: out of the table, its queued packets dropped.
    fn remove_qp(&mut self, qpn: u32) {
        self.targets.close(qpn);
        if let Some(q) = self.qps.remove(qpn) {
            if let Some(li) = q.link {
                self.links[li].queue.retain(|j| j.hdr.src_qpn != qpn);
            }
        }
        self.active.retain(|&n| n != qpn);
    }

    /// A QP connected to peer QP `rqpn` of the device at the other end of the link to `peer`
    /// (the newest link to it that is not dead). With none: if the link is being set up
    /// (`lazy`), the QP waits for it ([`bind_awaiting`](Self::bind_awaiting)); otherwise the
    /// peer went away between the connect's link set-up and this command, and the QP fails as
    /// its first send would. On a link within this process its context is published for
    /// direct writes.
    fn connect(&mut self, qpn: u32, peer: u64, rqpn: u32, rq_psn: u32, lazy: bool) {
        let li = (self.links.iter()).rposition(|l| l.link.peer == peer && !l.link.dead);
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        q.link = li;
        q.rqpn = rqpn;
        q.rq.exp_psn = rq_psn;
        q.sq.pending = true;
        q.awaiting = (li.is_none() && lazy).then_some(peer);
        q.peer_gone = false;
        if q.awaiting.is_some() {
            self.targets.close(qpn);
            return;
        }
        let Some(li) = li else {
            tracing::warn!(
                "soft device: connect of QP {qpn:#x}: the link to peer device {peer:016x} is gone: the QP fails"
            );
            self.targets.close(qpn);
            self.fail_first(qpn, Syndrome::TransportRetryExc);
            return;
        };
        self.bind(qpn, li);
    }

    /// QP `qpn`, connected, goes over link `li`: on a link within this process its context is
    /// published for direct writes (if it takes remote writes).
    fn bind(&mut self, qpn: u32, li: usize) {
        let Some(q) = self.qps.get_mut(qpn) else {
            return;
        };
        q.link = Some(li);
        q.awaiting = None;
        q.sq.pending = true;
        let link = &self.links[li].link;
        q.rq.published =
            link.peer_targets().is_some() && q.hw.access.contains(Access::REMOTE_WRITE);
        if q.rq.published {
            let (pair, rqpn, pd, psn) = (link.pair_id, q.rqpn, q.hw.pd, q.rq.exp_psn);
            self.targets.open(qpn, pair, rqpn, pd, psn);
        } else {
            self.targets.close(qpn);
        }
    }

    /// The link to `peer` will not come: the QPs that wait for it are left as a peer's clean
    /// exit leaves them (their receives stay posted; work posted fails).
    fn no_link(&mut self, peer: u64) {
        for &qpn in &self.active {
            if let Some(q) = self.qps.get_mut(qpn).filter(|q| q.awaiting == Some(peer)) {
                q.awaiting = None;
                q.peer_gone = true;
                q.sq.pending = true;
            }
        }
    }

    /// The new link `li` came up: the QPs that wait for a link to its peer go over it.
    fn bind_awaiting(&mut self, li: usize) {
        let peer = self.links[li].link.peer;
        let waiting: Vec<u32> = (self.active.iter().copied())
            .filter(|&n| self.qps.get(n).is_some_and(|q| q.awaiting == Some(peer)))
            .collect();
        for qpn in waiting {
            self.bind(qpn, li);
        }
    }

    /// Lets go of link `li`, whose peer is gone and whose QPs are in error (a QP in error
    /// sends nothing and flushes its work locally: it needs no link): its rings, mapping and
    /// transport threads go with it, and the device forgets the peer. The last link takes
    /// its place in the list (the QPs on it are told), so rounds look only at live links.
    pub(super) fn release_link(&mut self, li: usize) {
        let last = self.links.len() - 1;
        for &qpn in &self.active {
            let Some(q) = self.qps.get_mut(qpn) else {
                continue;
            };
            if q.link == Some(li) {
                debug_assert!(q.err, "a QP not in error on a released link");
                q.link = None;
            } else if q.link == Some(last) {
                q.link = Some(li);
            }
        }
        let gone = self.links.swap_remove(li);
        self.ctl
            .links_held
            .store(self.links.len(), Ordering::Release);
        // The waiting threads' watch holds the ring: a new one without it, now (in thread
        // mode no helper may settle a watch for a long time).
        self.rewatch();
        (self.forget_peer)(gone.link.peer);
        tracing::debug!(
            "soft device: released the link to peer device {:016x}",
            gone.link.peer
        );
    }
}

/// What starting one WQE came to.
enum WqeStep {
    /// The WQE was started, completed or flushed: go on with the next.
    Advanced,
    /// The WQE must wait (fence): resume later without a new doorbell.
    Stalled,
    /// The ring is malformed: stop reading it.
    Stop,
}

impl EngineCtl {
    /// The QP's state in the device's QP table (the engine moves QPs to error).
    pub(crate) fn set_state(&self, qpn: u32, st: HwQpState) {
        if let Some(s) = self.states.get(qpn as usize) {
            s.store(st as u8, Ordering::Release);
        }
    }

    /// Queues an asynchronous event for the host. The queue is bounded, as a NIC's event
    /// queue is: a host that never reads events loses the oldest.
    pub(crate) fn event(&self, e: AsyncEvent) {
        let mut q = self.events.lock();
        if q.len() >= MAX_EVENTS {
            q.pop_front();
        }
        q.push_back(e);
        drop(q);
        self.has_events.store(true, Ordering::Release);
    }
}
