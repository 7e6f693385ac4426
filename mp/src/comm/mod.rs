//! The communicator: N ranks, one RC connection per peer, point-to-point with receiver-ready
//! credits, one-sided windows and barriers, on the CPU or on any executor (a stream).

use crate::bootstrap::Bootstrap;
use crate::fault::{self, Cause, Work};
use gdsync::exec::Executor;
use gdsync::ops::{Ops, WaitCond};
use gdsync::{
    Access, Completion, Cq, Device, Endpoint, Error, MemoryRegion, PinnedBuffer, ProtectionDomain,
    Qp, QpConfig, QpState, RecvTicket, RecvWr, RemoteBuf, Result, SendTicket, SendWr, Sge,
    WcStatus,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A handle to an outstanding operation (send, receive, put, get).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    slot: u32,
    generation: u32,
}

impl Request {
    pub(crate) fn wr_id(self) -> u64 {
        ((self.generation as u64) << 32) | self.slot as u64
    }
}

/// Marks completions that belong to no request (credit and barrier writes).
const INTERNAL: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Pending,
    Done(u32),
    Failed(gdsync::format::Syndrome),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Send,
    Recv,
}

/// A posted request's place in its ring.
#[derive(Clone, Copy, Debug)]
enum Ticket {
    Send(SendTicket),
    Recv(RecvTicket),
}

struct ReqState {
    generation: u32,
    live: bool,
    peer: usize,
    side: Side,
    /// What it is, for error messages.
    work: Work,
    /// Where the work sits in its ring and which completion it gives, once posted.
    ticket: Option<Ticket>,
    /// An executor waits for (and consumes) its completion.
    on_executor: bool,
    status: Status,
}

impl ReqState {
    /// Completion number on the peer's CQ of this side, when known.
    fn cqe(&self) -> Option<u64> {
        match self.ticket? {
            Ticket::Send(t) => t.cqe,
            Ticket::Recv(t) => t.cqe,
        }
    }
}

/// Work the CPU posts to a peer, queued while it cannot go out yet: a send waiting for the
/// receiver's credit, or anything behind work an executor has not rung yet (a CPU post would
/// move the doorbell record past it). Leaves the queue in order.
struct Pending {
    /// None for internal writes (barrier).
    req: Option<Request>,
    wrs: Vec<SendWr>,
    /// Work requests already posted (a put with signal is two).
    posted: usize,
    /// Sends: the credit (receives the peer has posted) this one needs.
    credit: Option<u64>,
    last: Option<SendTicket>,
}

/// Index into [`Peer::exec_waits`].
fn side_index(s: Side) -> usize {
    match s {
        Side::Send => 0,
        Side::Recv => 1,
    }
}

struct Peer {
    /// Carries the user's traffic (sends, puts, gets) and barrier writes, posted by the CPU
    /// or by executors, in one order.
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    /// Carries credits only, always posted by the CPU: a credit must never queue behind a
    /// send that an executor holds back until the peer's credit arrives (that would
    /// deadlock two ranks sending to each other on streams).
    ctl: Qp,
    ctl_cq: Cq,
    /// Sends to this peer, posted or pending (the credit each needs is its index + 1).
    sends: u64,
    /// Receives posted for this peer.
    recvs: u64,
    /// Credits given on the credit QP.
    ctl_posted: u64,
    pending: VecDeque<Pending>,
    /// End of the last work an executor committed on `qp`, until its doorbell was seen.
    exec_end: Option<u64>,
    /// Requests an executor waits for (send side, receive side) not yet known to be done: the
    /// CPU does not poll a CQ an executor is consuming.
    exec_waits: [usize; 2],
    /// Why the connection failed, once known (the log says so once).
    fault: Option<Cause>,
}

impl Peer {
    /// Records `cause` of this connection's failure (see [`fault::record`]); the log says
    /// so the first time.
    fn note(&mut self, me: usize, peer: usize, cause: Cause) {
        let first = self.fault.is_none();
        if fault::record(&mut self.fault, cause) && first {
            tracing::warn!(
                "rank {me}: the connection to rank {peer} failed: {} (traffic QP {:#x} {:?}, credit QP {:#x} {:?}); work with rank {peer} fails from now on",
                cause.describe(peer),
                self.qp.qpn(),
                self.qp.state(),
                self.ctl.qpn(),
                self.ctl.state()
            );
        }
    }

    /// Whether one of the QPs to this peer is in the error state.
    fn in_error(&self) -> bool {
        self.qp.state() == QpState::Error || self.ctl.state() == QpState::Error
    }
}

/// Words of the control region every rank exposes to its peers.
struct CtrlLayout {
    size: usize,
    rounds: usize,
}

impl CtrlLayout {
    /// Credits: how many receives rank `p` has posted for me (written by `p`).
    fn ready(&self, p: usize) -> usize {
        8 * p
    }
    /// Barrier round `k`: the epoch my partner of that round reached (written by it).
    fn barrier(&self, k: usize) -> usize {
        8 * (self.size + k)
    }
    fn bytes(&self) -> usize {
        8 * (self.size + self.rounds)
    }
}

/// A communicator of N ranks.
pub struct Comm {
    // Dropped first: a rank that drops its communicator is known to have left before its
    // queues are torn down (peers waiting for it learn so at once, not after the teardown).
    boot: Box<dyn Bootstrap>,
    rank: usize,
    size: usize,
    peers: Vec<Option<Peer>>,
    reqs: Vec<ReqState>,
    free: Vec<u32>,
    layout: CtrlLayout,
    /// Reused by CQ polls (no allocation per poll).
    polled: Vec<Completion>,
    // Field order matters: the registrations are dropped before the buffers they cover.
    _ctrl_mr: MemoryRegion<'static>,
    scratch_mr: MemoryRegion<'static>,
    ctrl: PinnedBuffer,
    _scratch: PinnedBuffer,
    remote_ctrl: Vec<RemoteBuf>,
    barrier_epoch: u64,
    timeout: Duration,
    pub(crate) regs: crate::registry::RegCache,
    pd: ProtectionDomain,
    dev: Device,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Logs a bootstrap failure during set-up (the ranks it waits for are the likely culprits)
/// and passes the error on.
fn bootstrap_failed(rank: usize, during: &str, e: Error) -> Error {
    tracing::error!("rank {rank}: bootstrap failed while {during}: {e}");
    e
}

/// Makes this process accept soft-device TCP links when the ranks span hosts (found in one
/// bootstrap round of host ids), on the address the bootstrap reaches the other ranks from
/// (all interfaces if it cannot tell). Ranks on one host link through memory, and their
/// processes listen on no interface.
fn listen_if_ranks_span_hosts(boot: &mut dyn Bootstrap, rank: usize, size: usize) -> Result<()> {
    let mine = gdsync::host_id().to_le_bytes();
    let all = boot
        .all_gather(&mine)
        .map_err(|e| bootstrap_failed(rank, "exchanging host ids", e))?;
    check_gathered(&all, size)?;
    if all.iter().all(|h| h[..] == mine) {
        return Ok(());
    }
    let ip = boot
        .local_ip()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    let addr = gdsync::accept_tcp_links(Some(ip))?;
    tracing::debug!(
        "rank {rank}: the ranks span hosts: soft-device TCP links are accepted at {addr}"
    );
    Ok(())
}

/// Bytes of one endpoint in the connection record.
const EP_BYTES: usize = Endpoint::WIRE_LEN;

/// Bytes of a region's record: address, length (u64 LE each) and key (u32 LE).
pub(crate) const REMOTE_BYTES: usize = 20;

/// Appends `r`'s record ([`REMOTE_BYTES`] bytes).
pub(crate) fn encode_remote(r: &RemoteBuf, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.addr.to_le_bytes());
    out.extend_from_slice(&r.len.to_le_bytes());
    out.extend_from_slice(&r.rkey.to_le_bytes());
}

/// Parses a region's record; `None` unless `b` is exactly [`REMOTE_BYTES`] long.
pub(crate) fn decode_remote(b: &[u8]) -> Option<RemoteBuf> {
    let b: &[u8; REMOTE_BYTES] = b.try_into().ok()?;
    let (addr, rest) = b.split_first_chunk::<8>()?;
    let (len, rkey) = rest.split_first_chunk::<8>()?;
    Some(RemoteBuf {
        addr: u64::from_le_bytes(*addr),
        len: u64::from_le_bytes(*len),
        rkey: u32::from_le_bytes(rkey.try_into().ok()?),
    })
}

/// An error unless a bootstrap exchange returned one contribution per rank (a custom
/// [`Bootstrap`] may not).
pub(crate) fn check_gathered(all: &[Vec<u8>], size: usize) -> Result<()> {
    if all.len() != size {
        return Err(Error::invalid(format!(
            "bootstrap: an exchange returned {} contributions for {size} ranks",
            all.len()
        )));
    }
    Ok(())
}

/// A rank's connection record: its control region, then per rank `per` endpoints of the
/// QPs that connect to it (zeros for itself).
pub(crate) fn encode_setup(eps: &[Option<Vec<Endpoint>>], per: usize, ctrl: &RemoteBuf) -> Vec<u8> {
    let mut b = Vec::new();
    encode_remote(ctrl, &mut b);
    for e in eps {
        match e {
            Some(v) => {
                debug_assert_eq!(v.len(), per);
                v.iter().for_each(|e| b.extend_from_slice(&e.to_bytes()));
            }
            None => b.extend_from_slice(&vec![0u8; per * EP_BYTES]),
        }
    }
    b
}

pub(crate) type Setup = (RemoteBuf, Vec<Option<Vec<Endpoint>>>);

/// Parses [`encode_setup`]'s record of a communicator of `size` ranks.
pub(crate) fn decode_setup(b: &[u8], size: usize, per: usize) -> Result<Setup> {
    let malformed = || {
        Error::invalid(
            "bootstrap: a rank sent a malformed connection record (another gdasync version?)",
        )
    };
    let want = per
        .checked_mul(EP_BYTES)
        .and_then(|row| row.checked_mul(size))
        .and_then(|rows| rows.checked_add(REMOTE_BYTES));
    if per == 0 || want != Some(b.len()) {
        return Err(malformed());
    }
    let (ctrl, rows) = b.split_at(REMOTE_BYTES);
    let ctrl = decode_remote(ctrl).ok_or_else(malformed)?;
    let eps = rows
        .chunks(per * EP_BYTES)
        .map(|e| {
            if e.iter().all(|&x| x == 0) {
                Ok(None)
            } else {
                e.chunks(EP_BYTES)
                    .map(Endpoint::from_bytes)
                    .collect::<Result<Vec<_>>>()
                    .map(Some)
            }
        })
        .collect::<Result<_>>()?;
    Ok((ctrl, eps))
}

impl Comm {
    /// Creates the communicator on `dev`: per peer one QP for traffic (own send and receive
    /// CQs, so completions can be waited for on executors) and one for credits, connected
    /// through `boot`. Collective.
    pub fn new(mut boot: Box<dyn Bootstrap>, dev: &Device) -> Result<Comm> {
        let (rank, size) = (boot.rank(), boot.size());
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} out of range for size {size}"
            )));
        }
        let start = Instant::now();
        tracing::debug!(
            "rank {rank} of {size}: setting up a communicator on {} (bootstrap: {})",
            dev.info().name,
            boot.describe()
        );
        listen_if_ranks_span_hosts(&mut *boot, rank, size)?;
        let pd = dev.alloc_pd();
        let rounds = usize::BITS as usize - (size.max(2) - 1).leading_zeros() as usize;
        let layout = CtrlLayout { size, rounds };
        let ctrl = PinnedBuffer::new(layout.bytes());
        let scratch = PinnedBuffer::new(8 * (1 + rounds));
        // SAFETY: the buffers are owned by the Comm and outlive the registrations (declared
        // after them, so dropped after them).
        let ctrl_mr = unsafe {
            pd.register_raw(
                ctrl.addr() as *mut u8,
                ctrl.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            )?
        };
        // SAFETY: as above.
        let scratch_mr = unsafe {
            pd.register_raw(
                scratch.addr() as *mut u8,
                scratch.len(),
                Access::LOCAL_WRITE,
            )?
        };
        let cfg = QpConfig {
            send_wqebbs: 1024,
            recv_wqes: 512,
            ..QpConfig::default()
        };
        let ctl_cfg = QpConfig {
            send_wqebbs: 256,
            recv_wqes: 1,
            ..QpConfig::default()
        };
        let mut peers = Vec::with_capacity(size);
        for p in 0..size {
            if p == rank {
                peers.push(None);
                continue;
            }
            let (scq, rcq) = (dev.create_cq(2048)?, dev.create_cq(1024)?);
            let qp = pd.create_qp(&scq, &rcq, &cfg)?;
            let ctl_cq = dev.create_cq(64)?;
            let ctl = pd.create_qp(&ctl_cq, &ctl_cq, &ctl_cfg)?;
            peers.push(Some(Peer {
                qp,
                scq,
                rcq,
                ctl,
                ctl_cq,
                sends: 0,
                recvs: 0,
                ctl_posted: 0,
                pending: VecDeque::new(),
                exec_end: None,
                exec_waits: [0; 2],
                fault: None,
            }));
        }
        let eps: Vec<_> = peers
            .iter()
            .map(|p| p.as_ref().map(|p| vec![p.qp.endpoint(), p.ctl.endpoint()]))
            .collect();
        let all = boot
            .all_gather(&encode_setup(&eps, 2, &ctrl_mr.remote()))
            .map_err(|e| bootstrap_failed(rank, "exchanging connection records", e))?;
        check_gathered(&all, size)?;
        let mut remote_ctrl = Vec::with_capacity(size);
        for (p, rec) in all.iter().enumerate() {
            let (c, mut their_eps) = decode_setup(rec, size, 2)?;
            remote_ctrl.push(c);
            if p != rank {
                let eps = their_eps[rank].take().ok_or_else(|| {
                    Error::invalid(format!(
                        "bootstrap: rank {p}'s connection record has no QP for rank {rank} (do the ranks agree on the size?)"
                    ))
                })?;
                let peer = peers[p].as_mut().unwrap();
                peer.qp.connect(&eps[0])?;
                peer.ctl.connect(&eps[1])?;
                tracing::debug!(
                    "rank {rank}: connected to rank {p}: traffic QP {:#x} -> {:#x}, credit QP {:#x} -> {:#x}",
                    peer.qp.qpn(),
                    eps[0].qpn,
                    peer.ctl.qpn(),
                    eps[1].qpn
                );
            }
        }
        // Everyone is connected before anyone sends.
        boot.barrier()
            .map_err(|e| bootstrap_failed(rank, "waiting for every rank to connect", e))?;
        tracing::info!(
            "rank {rank} of {size}: communicator ready on {}, connected to {} peer{} in {:.1} ms (bootstrap: {})",
            dev.info().name,
            size - 1,
            if size == 2 { "" } else { "s" },
            start.elapsed().as_secs_f64() * 1e3,
            boot.describe()
        );
        Ok(Comm {
            rank,
            size,
            peers,
            reqs: Vec::new(),
            free: Vec::new(),
            layout,
            polled: Vec::with_capacity(64),
            _ctrl_mr: ctrl_mr,
            scratch_mr,
            ctrl,
            _scratch: scratch,
            remote_ctrl,
            barrier_epoch: 0,
            timeout: Duration::from_secs(60),
            regs: Default::default(),
            pd,
            dev: dev.clone(),
            boot,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }
    /// The protection domain buffers must be registered in ([`Comm::register`]).
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// How long `wait` and the CPU barrier wait before giving up (default 60 s).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Registers `buf` for sends, receives and one-sided access by peers.
    pub fn register<'b>(&self, buf: &'b mut [u8]) -> Result<MemoryRegion<'b>> {
        self.pd.register(buf, Access::ALL)
    }

    fn peer(&mut self, p: usize) -> Result<&mut Peer> {
        if p >= self.size {
            return Err(Error::invalid(format!(
                "rank {p} out of range (communicator of {})",
                self.size
            )));
        }
        if p == self.rank {
            return Err(Error::invalid(format!(
                "rank {p} is this rank: send to another rank"
            )));
        }
        Ok(self.peers[p].as_mut().unwrap())
    }

    fn new_req(&mut self, peer: usize, work: Work) -> Request {
        let side = match work {
            Work::Recv(_) => Side::Recv,
            _ => Side::Send,
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.reqs.push(ReqState {
                    generation: 0,
                    live: false,
                    peer,
                    side,
                    work,
                    ticket: None,
                    on_executor: false,
                    status: Status::Pending,
                });
                (self.reqs.len() - 1) as u32
            }
        };
        let r = &mut self.reqs[slot as usize];
        r.generation = r.generation.wrapping_add(1);
        *r = ReqState {
            generation: r.generation,
            live: true,
            peer,
            side,
            work,
            ticket: None,
            on_executor: false,
            status: Status::Pending,
        };
        Request {
            slot,
            generation: r.generation,
        }
    }

    fn state(&mut self, r: Request) -> Result<&mut ReqState> {
        match self.reqs.get_mut(r.slot as usize) {
            Some(s) if s.live && s.generation == r.generation => Ok(s),
            _ => Err(Error::invalid(
                "unknown request, or one already completed (wait and test release a request once they return its result)",
            )),
        }
    }

    // ------------------------------------------------------------------ point to point

    /// Posts a receive into `dst` (`mr.sge(range)` of a registered buffer) from rank `peer`.
    /// Receives from one peer match that peer's sends in order (per-peer FIFO). Gives the
    /// sender a credit at once (an RDMA fetch-and-add on the credit QP), so the sender can go
    /// ahead while this rank does other work.
    pub fn irecv(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        self.peer(peer)?;
        let req = self.post_receive(dst, peer)?;
        self.add_credit(peer, 1)?;
        Ok(req)
    }

    /// Posts one receive per entry of `dsts`, in order, from rank `peer`, and gives the
    /// sender all their credits in one fetch-and-add. A credit costs the NIC a request and a
    /// response, so code that keeps receives posted ahead (a ping-pong, a stream of
    /// messages) and tops them up in batches pays it once per batch instead of once per
    /// message. Either every receive is posted or none (a full receive ring is an `Err`).
    pub fn irecv_batch(&mut self, dsts: &[Sge], peer: usize) -> Result<Vec<Request>> {
        self.peer(peer)?;
        let p = self.peers[peer].as_ref().unwrap();
        let room = p.qp.recv_room();
        if dsts.len() as u64 > room {
            return Err(Error::RingFull {
                ring: "receive",
                qpn: p.qp.qpn(),
                used: p.qp.recv_ring_size() - room as u32,
                size: p.qp.recv_ring_size(),
                hint: "post fewer receives at once, or wait for some first",
            });
        }
        // A receive of one SGE fails to post only on a full ring, which the room check
        // excludes: every one is posted.
        let out = dsts
            .iter()
            .map(|&d| self.post_receive(d, peer))
            .collect::<Result<Vec<_>>>()?;
        if !out.is_empty() {
            self.add_credit(peer, out.len() as u64)?;
        }
        Ok(out)
    }

    /// Like [`irecv`](Self::irecv), but the sender's credit is given by `exec` when it gets
    /// there, in order with that executor's other work: the peer cannot write into `dst`
    /// before, so a stream may still read `dst` (unpack the previous message) up to this
    /// point. The receive itself is posted now; wait for it on the CPU or on an executor.
    pub fn irecv_on(&mut self, dst: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        self.peer(peer)?;
        self.no_queued_cpu_work(peer, "giving credits on an executor")?;
        // The credit is prepared first: a full send ring fails before anything is posted.
        let wr = self.credit_wr(peer, 1, false);
        let prepared = self.peers[peer].as_mut().unwrap().qp.prepare_send(&wr)?;
        let req = self.post_receive(dst, peer)?;
        let p = self.peers[peer].as_mut().unwrap();
        let (t, ops) = p.qp.commit(prepared)?;
        exec.submit(ops)?;
        p.exec_end = Some(t.end);
        Ok(req)
    }

    /// Posts the receive WQE of a new request.
    fn post_receive(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        let req = self.new_req(peer, Work::Recv(dst.len as u64));
        let p = self.peers[peer].as_mut().unwrap();
        let mut wr = RecvWr::new().wr_id(req.wr_id());
        if dst.len > 0 {
            wr = wr.sge(dst);
        }
        match p.qp.post_recv(&wr) {
            Ok(t) => {
                p.recvs += 1;
                self.reqs[req.slot as usize].ticket = Some(Ticket::Recv(t));
                Ok(req)
            }
            Err(e) => {
                self.release(req);
                Err(e)
            }
        }
    }

    /// `n` credits for rank `peer`: a fetch-and-add of `n` on its credit word for this rank.
    /// Adds commute, so credits given by the CPU (credit QP) and by executors (traffic QP)
    /// may land in any order. Unsignalled: a later signalled request retires its slot.
    fn credit_wr(&self, peer: usize, n: u64, signaled: bool) -> SendWr {
        let at = self.remote_ctrl[peer].at(self.layout.ready(self.rank) as u64);
        let wr = SendWr::fetch_add(at, n)
            .sge(self.scratch_mr.sge(0..8))
            .wr_id(INTERNAL);
        if signaled {
            wr
        } else {
            wr.unsignaled()
        }
    }

    /// Gives rank `peer` `n` credits from the CPU, on the credit QP (one in 64 signalled,
    /// so the ring's slots come back).
    fn add_credit(&mut self, peer: usize, n: u64) -> Result<()> {
        let p = self.peers[peer].as_mut().unwrap();
        p.ctl_posted += 1;
        let signal = p.ctl_posted % 64 == 0;
        let wr = self.credit_wr(peer, n, signal);
        let start = Instant::now();
        loop {
            let p = self.peers[peer].as_mut().unwrap();
            match p.ctl.post_send(&wr) {
                Err(Error::RingFull { .. }) if start.elapsed() < self.timeout => {
                    Self::drain_credit_cq(self.rank, peer, p);
                    if p.fault.is_some() {
                        // A failed connection frees no slot: the credit cannot go out.
                        return Err(self.connection_error(peer, "giving a credit"));
                    }
                    std::thread::yield_now();
                }
                r => return r.map(|_| ()),
            }
        }
    }

    /// Consumes the credit QP's completions (signalled credit writes; an error is the
    /// connection's fault, which every later wait for rank `peer` reports).
    fn drain_credit_cq(me: usize, peer: usize, p: &mut Peer) {
        while let Ok(Some(c)) = p.ctl_cq.poll_one() {
            if let WcStatus::Error(syndrome) = c.status {
                let cause = Cause::Completion {
                    syndrome,
                    work: Work::Internal,
                    qpn: c.qpn,
                };
                p.note(me, peer, cause);
            }
        }
    }

    fn credit(&self, peer: usize) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.read_at(self.layout.ready(peer), &mut b);
        u64::from_ne_bytes(b)
    }

    fn send_wr(req: Request, sge: Option<Sge>) -> SendWr {
        let mut wr = SendWr::send().wr_id(req.wr_id());
        if let Some(s) = sge {
            wr = wr.sge(s);
        }
        wr
    }

    /// Sends `src` (`mr.sge(range)`; keep the buffer registered until the send completes) to
    /// rank `peer`. Returns at once: the send goes out when the receiver has posted the
    /// matching receive (its credit), during this or any later call.
    pub fn isend(&mut self, src: Sge, peer: usize) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peer(peer)?;
        let req = self.new_req(peer, Work::Send(len as u64));
        // Posted by the CPU: a small host-memory payload is copied into the WQE now, which
        // spares the NIC a read (the buffer is reusable as soon as the send completes anyway).
        let wr = Self::send_wr(req, (len > 0).then_some(sge)).inline_host();
        let p = self.peers[peer].as_mut().unwrap();
        p.sends += 1;
        let need = p.sends;
        self.post_cpu(peer, Some(req), vec![wr], Some(need))?;
        Ok(req)
    }

    /// Queues CPU work for `peer` behind anything queued before it, then posts what can go.
    pub(crate) fn post_cpu(
        &mut self,
        peer: usize,
        req: Option<Request>,
        wrs: Vec<SendWr>,
        credit: Option<u64>,
    ) -> Result<()> {
        self.peers[peer]
            .as_mut()
            .unwrap()
            .pending
            .push_back(Pending {
                req,
                wrs,
                posted: 0,
                credit,
                last: None,
            });
        self.pump(peer)
    }

    /// Posts queued CPU work for `peer` in order, as far as credits, executors and the ring
    /// allow. Fails it all if the connection is in error (it would wait forever).
    fn pump(&mut self, peer: usize) -> Result<()> {
        let credit = self.credit(peer);
        let Comm {
            peers, reqs, rank, ..
        } = self;
        let p = peers[peer].as_mut().unwrap();
        if p.pending.is_empty() {
            return Ok(());
        }
        if p.in_error() {
            // The peer is gone or the connection failed: work that never went out is
            // flushed, as the QP flushes what did, rather than waiting forever.
            if p.fault.is_none() {
                p.note(*rank, peer, Cause::QpError);
            }
            while let Some(w) = p.pending.pop_front() {
                if let Some(r) = w.req {
                    reqs[r.slot as usize].status =
                        Status::Failed(gdsync::format::Syndrome::WrFlush);
                }
            }
            return Ok(());
        }
        if let Some(end) = p.exec_end {
            if !p.qp.doorbell_reached(end) {
                return Ok(());
            }
            p.exec_end = None;
        }
        while let Some(w) = p.pending.front_mut() {
            if w.credit.is_some_and(|need| !credit_allows(credit, need)) {
                break;
            }
            while w.posted < w.wrs.len() {
                match p.qp.post_send(&w.wrs[w.posted]) {
                    Ok(t) => {
                        w.posted += 1;
                        w.last = Some(t);
                    }
                    Err(Error::RingFull { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            let w = p.pending.pop_front().unwrap();
            if let Some(r) = w.req {
                reqs[r.slot as usize].ticket = w.last.map(Ticket::Send);
            }
        }
        Ok(())
    }

    /// Posts `peer`'s queued CPU work, then refuses (naming `before`) if any is left:
    /// executor work would overtake it, and work to one peer stays in order. Work waiting for
    /// send-ring space or for executor work ahead of it is waited for (completions drain it,
    /// up to the communicator's timeout); work waiting for the peer's credit is not, as the
    /// peer may be waiting for this very post.
    fn no_queued_cpu_work(&mut self, peer: usize, before: &str) -> Result<()> {
        let until = Instant::now() + self.timeout;
        loop {
            self.pump(peer)?;
            let credit = self.credit(peer);
            let p = self.peers[peer].as_ref().unwrap();
            let Some(front) = p.pending.front() else {
                return Ok(());
            };
            let for_credit = p.exec_end.is_none()
                && front.posted == 0
                && front
                    .credit
                    .is_some_and(|need| !credit_allows(credit, need));
            if for_credit || Instant::now() >= until {
                return Err(Error::invalid(format!(
                    "CPU work to rank {peer} is still queued ({}): wait for it before {before} (work to one peer stays in order)",
                    if for_credit {
                        "sends waiting for the peer's credits"
                    } else {
                        "the send ring stayed full"
                    }
                )));
            }
            self.poll_peer(peer)?;
            std::thread::yield_now();
        }
    }

    /// Submits `pre` (waits the executor does first) and the commit ops of `wrs` to `exec`,
    /// for request `req` of `peer`. Refused while CPU work to that peer is still queued: it
    /// would be overtaken (work to one peer stays in order).
    pub(crate) fn post_exec(
        &mut self,
        peer: usize,
        req: Request,
        wrs: &[SendWr],
        pre: Ops,
        exec: &impl Executor,
    ) -> Result<()> {
        self.no_queued_cpu_work(peer, "posting to that rank on an executor")?;
        let p = self.peers[peer].as_mut().unwrap();
        let mut ops = pre;
        let mut last = None;
        for wr in wrs {
            let prepared = p.qp.prepare_send(wr)?;
            let (t, commit) = p.qp.commit(prepared)?;
            ops.append(commit);
            last = Some(t);
        }
        let last = last.expect("at least one work request");
        exec.submit(ops)?;
        p.exec_end = Some(last.end);
        self.reqs[req.slot as usize].ticket = Some(Ticket::Send(last));
        Ok(())
    }

    /// Like [`isend`](Self::isend), but the send is posted by `exec` (a stream): it waits on
    /// the executor for the receiver's credit (unless the credit is already here), then
    /// rings the doorbell. The CPU does not wait. The queued work keeps the memory it names
    /// alive, so the `Comm` may be dropped before the executor has run it.
    pub fn isend_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peer(peer)?;
        let req = self.new_req(peer, Work::Send(len as u64));
        let wr = Self::send_wr(req, (len > 0).then_some(sge));
        let p = self.peers[peer].as_mut().unwrap();
        p.sends += 1;
        let need = p.sends;
        let mut pre = Ops::new();
        // A credit already here needs no wait (a wait costs an executor a round of polling).
        // The wait keeps the control buffer alive, so the `Comm` may go first.
        if !credit_allows(self.credit(peer), need) {
            let word = self.layout.ready(peer);
            pre.append(self.ctrl.wait64(word, need, WaitCond::Geq));
        }
        if let Err(e) = self.post_exec(peer, req, &[wr], pre, exec) {
            self.peers[peer].as_mut().unwrap().sends -= 1;
            self.release(req);
            return Err(e);
        }
        Ok(req)
    }

    fn release(&mut self, r: Request) {
        if let Ok(st) = self.state(r) {
            st.live = false;
            self.free.push(r.slot);
        }
    }

    /// [`isend_on`](Self::isend_on), then the executor waits for the send's completion.
    pub fn send_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        let r = self.isend_on(src, peer, exec)?;
        self.wait_on(r, exec)?;
        Ok(r)
    }

    /// Makes `exec` wait for request `r` (and consume its completion); the request is then
    /// complete once the executor has passed the wait ([`Comm::wait`] still reports errors
    /// and releases it).
    pub fn wait_on(&mut self, r: Request, exec: &impl Executor) -> Result<()> {
        let st = self.state(r)?;
        if st.on_executor {
            return Err(Error::invalid(
                "this request is already waited for on an executor",
            ));
        }
        let (peer, ticket) = (st.peer, st.ticket);
        let Some(n) = st.cqe() else {
            return Err(Error::invalid(
                "this request was not posted on an executor (its completion number is not known): wait for it with wait() or test()",
            ));
        };
        let p = self.peers[peer].as_mut().unwrap();
        let (cq, side) = match ticket {
            Some(Ticket::Send(_)) => (&p.scq, Side::Send),
            _ => (&p.rcq, Side::Recv),
        };
        if cq.consumer_index() > n {
            // A CPU poll already consumed it: nothing to wait for.
            return Ok(());
        }
        // The QP's wait ops also retire the ring slots, so the CPU need not poll.
        let ops = match ticket {
            Some(Ticket::Send(t)) => p.qp.send_wait_ops(&t)?,
            Some(Ticket::Recv(t)) => p.qp.recv_wait_ops(&t)?,
            None => unreachable!("a request with a completion number has a ticket"),
        };
        exec.submit(ops)?;
        p.exec_waits[side_index(side)] += 1;
        self.reqs[r.slot as usize].on_executor = true;
        Ok(())
    }

    /// [`wait_on`](Self::wait_on) for several requests.
    pub fn wait_all_on(&mut self, rs: &[Request], exec: &impl Executor) -> Result<()> {
        rs.iter().try_for_each(|&r| self.wait_on(r, exec))
    }

    // ------------------------------------------------------------------ progress

    /// Moves CPU work forward: posts queued work whose credits arrived, polls completions.
    pub fn progress(&mut self) -> Result<()> {
        for peer in 0..self.size {
            if peer != self.rank {
                self.progress_peer(peer)?;
            }
        }
        Ok(())
    }

    fn progress_peer(&mut self, peer: usize) -> Result<()> {
        self.pump(peer)?;
        self.poll_peer(peer)
    }

    fn poll_peer(&mut self, peer: usize) -> Result<()> {
        let Comm {
            peers,
            reqs,
            polled,
            rank,
            ..
        } = self;
        let me = *rank;
        let p = peers[peer].as_mut().unwrap();
        Self::drain_credit_cq(me, peer, p);
        for side in [Side::Send, Side::Recv] {
            let cq = if side == Side::Send { &p.scq } else { &p.rcq };
            let waits = &mut p.exec_waits[side_index(side)];
            if *waits > 0 {
                // An executor consumes this CQ: requests are done when the consumer index
                // passed their completions (also CPU-waited ones it stepped over). Without the
                // CQEs, an error completion fails every request resolved with it.
                let ci = cq.consumer_index();
                let errs = cq.take_errors();
                let mut left = 0;
                let mut failed = None;
                for st in reqs.iter_mut().filter(|s| {
                    s.live && s.peer == peer && s.side == side && s.status == Status::Pending
                }) {
                    if st.cqe().is_some_and(|n| n < ci) {
                        st.status = match errs.first() {
                            Some(e) => {
                                failed.get_or_insert(st.work);
                                Status::Failed(e.syndrome)
                            }
                            None => Status::Done(0),
                        };
                    } else if st.on_executor {
                        left += 1;
                    }
                }
                *waits = left;
                if let Some(e) = errs.first() {
                    let cause = Cause::Completion {
                        syndrome: e.syndrome,
                        work: failed.unwrap_or(Work::Internal),
                        qpn: e.qpn,
                    };
                    p.note(me, peer, cause);
                }
                // The CPU does not poll a CQ an executor is consuming.
                if left > 0 {
                    continue;
                }
            }
            let cq = if side == Side::Send { &p.scq } else { &p.rcq };
            polled.clear();
            cq.poll(polled, 64)?;
            for c in polled.iter() {
                let (slot, generation) = ((c.wr_id & 0xFFFF_FFFF) as usize, (c.wr_id >> 32) as u32);
                let st = (c.wr_id != INTERNAL)
                    .then(|| reqs.get_mut(slot))
                    .flatten()
                    .filter(|s| s.live && s.generation == generation);
                if let WcStatus::Error(syndrome) = c.status {
                    let work = st.as_ref().map_or(Work::Internal, |s| s.work);
                    let cause = Cause::Completion {
                        syndrome,
                        work,
                        qpn: c.qpn,
                    };
                    p.note(me, peer, cause);
                }
                if let Some(st) = st {
                    st.status = match c.status {
                        WcStatus::Success => Status::Done(c.byte_len),
                        WcStatus::Error(s) => Status::Failed(s),
                    };
                }
            }
        }
        Ok(())
    }

    /// Releases `r` if it finished: `Ok(Some(bytes))`, or its error.
    fn finish(&mut self, r: Request) -> Result<Option<u32>> {
        let st = self.state(r)?;
        match st.status {
            Status::Pending => Ok(None),
            Status::Done(n) => {
                st.live = false;
                self.free.push(r.slot);
                Ok(Some(n))
            }
            Status::Failed(s) => {
                let (peer, work) = (st.peer, st.work);
                st.live = false;
                self.free.push(r.slot);
                if matches!(
                    s,
                    gdsync::format::Syndrome::TransportRetryExc | gdsync::format::Syndrome::WrFlush
                ) {
                    // The work failed because the connection had: say why it did.
                    let me = self.rank;
                    let p = self.peers[peer].as_mut().unwrap();
                    let qpn = p.qp.qpn();
                    p.note(
                        me,
                        peer,
                        Cause::Completion {
                            syndrome: s,
                            work,
                            qpn,
                        },
                    );
                    return Err(self.connection_error(peer, &work.describe(peer)));
                }
                // The wr_id is internal (a request's slot): not one the user could match.
                Err(Error::Completion {
                    wr_id: u64::MAX,
                    qpn: self.peers[peer].as_ref().map_or(0, |p| p.qp.qpn()),
                    syndrome: s,
                })
            }
        }
    }

    /// Whether `r` is complete; `Ok(Some(bytes))` releases it (bytes received, for receives).
    pub fn test(&mut self, r: Request) -> Result<Option<u32>> {
        self.state(r)?;
        self.progress()?;
        self.finish(r)
    }

    /// Waits for `r` on the CPU; returns the bytes received (receives) and releases it.
    /// Polls `r`'s peer first, and every peer now and then (queued work to others moves on).
    pub fn wait(&mut self, r: Request) -> Result<u32> {
        self.wait_until(r, Instant::now() + self.timeout)
    }

    /// One line on the connection to rank `peer`, for error reports: credits, posts, and
    /// the state of its queues (a request that never completes is usually explained here,
    /// or by the peer's line about this rank).
    pub fn describe_peer(&self, peer: usize) -> String {
        let Some(Some(p)) = self.peers.get(peer) else {
            return format!("rank {peer}: no connection");
        };
        format!(
            "rank {peer}: credits from it {} (word at {:#x}), sends to it {}, receives posted for it {}, credits given by the CPU {}, CPU posts queued {}, executor waits (send, receive) {:?}; traffic {}; send {}; receive {}",
            self.credit(peer),
            self.ctrl.addr() + self.layout.ready(peer) as u64,
            p.sends,
            p.recvs,
            p.ctl_posted,
            p.pending.len(),
            p.exec_waits,
            p.qp.describe(),
            p.scq.describe(),
            p.rcq.describe(),
        )
    }

    /// [`wait`](Self::wait) with a deadline (shared by the requests of one `wait_all`).
    fn wait_until(&mut self, r: Request, deadline: Instant) -> Result<u32> {
        let peer = self.state(r)?.peer;
        let mut spins = 0u32;
        let mut look = Look::default();
        loop {
            if spins % 64 == 0 {
                self.progress()?;
            } else {
                self.progress_peer(peer)?;
            }
            if let Some(n) = self.finish(r)? {
                return Ok(n);
            }
            spins += 1;
            // Checks by the clock, not by a count of spins: on a loaded machine a spin may
            // take a millisecond, and a dead peer must still be noticed at once.
            let due = spins % 64 == 0 && look.due();
            if due && self.failed_peer([peer]).is_some() {
                // What the peer sent before it failed may still be on its way: a short grace.
                if let Some(n) = self.progress_within(FAULT_GRACE, |c| c.finish(r))? {
                    return Ok(n);
                }
                let work = self.state(r)?.work;
                self.release(r);
                return Err(self.connection_error(peer, &work.describe(peer)));
            }
            if due && Instant::now() > deadline {
                let side = self.state(r)?.side;
                let what = format!(
                    "{side:?} request with rank {peer} (its peer never matched it?); {}",
                    self.describe_peer(peer)
                );
                return Err(Error::Timeout {
                    what,
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            // Spin first (a yield is a system call, dearer than a short wait), then let
            // other threads run.
            if spins < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for every request; the first error is returned after all were waited for.
    /// The timeout bounds the whole call, not each request.
    pub fn wait_all(&mut self, rs: &[Request]) -> Result<Vec<u32>> {
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(rs.len());
        let mut first = None;
        for &r in rs {
            match self.wait_until(r, deadline) {
                Ok(n) => out.push(n),
                Err(e) => {
                    out.push(0);
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(out), Err)
    }

    // ------------------------------------------------------------------ barrier

    /// A dissemination barrier through RDMA writes: round k writes this rank's epoch into
    /// rank (me + 2^k)'s word for round k and waits for rank (me - 2^k)'s. Returns, per
    /// round, the partner, the write and the local word to wait on.
    fn barrier_steps(&mut self, epoch: u64) -> Vec<(usize, SendWr, usize)> {
        let mut steps = Vec::new();
        for (k, to) in self.barrier_partners() {
            let at = self.remote_ctrl[to].at(self.layout.barrier(k) as u64);
            self.scratch_mr.write_at(8 + 8 * k, &epoch.to_ne_bytes());
            let wr = SendWr::write(at)
                .sge(self.scratch_mr.sge(8 + 8 * k..16 + 8 * k))
                .inline()
                .wr_id(INTERNAL)
                .unsignaled();
            steps.push((to, wr, self.layout.barrier(k)));
        }
        steps
    }

    /// Each round and the rank it writes to (rank me + 2^k); rounds that would write to this
    /// rank (a communicator of one) are left out.
    fn barrier_partners(&self) -> Vec<(usize, usize)> {
        (0..self.layout.rounds)
            .map(|k| (k, (self.rank + (1 << k)) % self.size))
            .filter(|&(_, to)| to != self.rank)
            .collect()
    }

    /// Makes progress until `done` gives a value or `grace` passes (a departed peer's last
    /// messages may still be on their way).
    fn progress_within<T>(
        &mut self,
        grace: Duration,
        mut done: impl FnMut(&mut Self) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let until = Instant::now() + grace;
        while Instant::now() < until {
            self.progress()?;
            if let Some(v) = done(self)? {
                return Ok(Some(v));
            }
            std::thread::yield_now();
        }
        Ok(None)
    }

    fn barrier_word(&self, k: usize) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.read_at(self.layout.barrier(k), &mut b);
        u64::from_ne_bytes(b)
    }

    /// Barrier on the CPU. Its writes go in order with other work to each peer.
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let start = Instant::now();
        for (k, (to, wr, _)) in self.barrier_steps(epoch).into_iter().enumerate() {
            // The write is inline: its bytes are copied when posted, so the scratch word
            // may be reused by the next round even while this write is still queued.
            self.post_cpu(to, None, vec![wr], None)?;
            let from = (self.rank + self.size - (1 << k) % self.size) % self.size;
            let mut spins = 0u32;
            let mut look = Look::default();
            while self.barrier_word(k) < epoch {
                self.progress()?;
                spins += 1;
                // Any rank that failed holds the barrier up, directly or through the ranks
                // that wait for it.
                if spins % 64 == 0 && look.due() {
                    if let Some(failed) = self.failed_peer(0..self.size) {
                        if self
                            .progress_within(FAULT_GRACE, |c| {
                                Ok((c.barrier_word(k) >= epoch).then_some(()))
                            })?
                            .is_none()
                        {
                            let what = format!("barrier round {k} (waiting for rank {from})");
                            return Err(self.connection_error(failed, &what));
                        }
                    }
                }
                if start.elapsed() > self.timeout {
                    return Err(Error::Timeout {
                        what: format!(
                            "barrier round {k}: rank {from} did not arrive (it stopped, or does not call barrier)"
                        ),
                        timeout_ms: self.timeout.as_millis() as u64,
                    });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Barrier on an executor: the writes and waits run there, the CPU does not wait.
    pub fn barrier_on(&mut self, exec: &impl Executor) -> Result<()> {
        for (_, to) in self.barrier_partners() {
            self.no_queued_cpu_work(to, "a barrier on an executor")?;
        }
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let mut ops = Ops::new();
        for (to, wr, word) in self.barrier_steps(epoch) {
            let p = self.peers[to].as_mut().unwrap();
            let prepared = p.qp.prepare_send(&wr)?;
            let (t, commit) = p.qp.commit(prepared)?;
            p.exec_end = Some(t.end);
            ops.append(commit);
            // The wait keeps the control buffer alive, so the `Comm` may go first.
            ops.append(self.ctrl.wait64(word, epoch, WaitCond::Geq));
        }
        exec.submit(ops)
    }

    /// The bootstrap, for out-of-band exchanges (e.g. the window setup).
    pub(crate) fn boot(&mut self) -> &mut dyn Bootstrap {
        &mut *self.boot
    }

    /// Checks `p` is a peer rank.
    pub(crate) fn check_peer(&mut self, p: usize) -> Result<()> {
        self.peer(p).map(|_| ())
    }

    /// A new one-sided request (`work` is a put or a get).
    pub(crate) fn new_one_sided(&mut self, peer: usize, work: Work) -> Request {
        self.new_req(peer, work)
    }
}

/// How long a wait goes on after its peer failed or left the job: what the peer sent before
/// may still be on its way.
const FAULT_GRACE: Duration = Duration::from_millis(50);

/// When a waiting loop looks again at what it cannot learn from its queues (peers that left,
/// its deadline): every millisecond by the clock, however long a spin takes.
struct Look {
    next: Instant,
}

impl Default for Look {
    fn default() -> Self {
        Self {
            next: Instant::now(),
        }
    }
}

impl Look {
    const EVERY: Duration = Duration::from_millis(1);

    /// Whether it is time to look (and, if so, the next look is due a millisecond later).
    fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + Self::EVERY;
        true
    }
}

/// Whether the credits a peer has given (`credit`, the running total of its fetch-and-adds)
/// let send number `need` (from 1) go: the same test an executor's wait makes
/// (`WaitCond::Geq` on the credit word), so the CPU and executors agree.
pub(crate) fn credit_allows(credit: u64, need: u64) -> bool {
    WaitCond::Geq.test64(credit, need)
}

#[cfg(test)]
#[path = "credit_model_tests.rs"]
mod credit_model_tests;

impl Comm {
    /// Leaves together: a bootstrap barrier, so no rank tears its connections down while a
    /// peer may still write to them (credits, barrier words). Dropping without it is allowed;
    /// peers then see their work to this rank fail with an [`Error::Unreachable`] that names
    /// the rank (their QPs' completions say TRANSPORT_RETRY_EXC). A peer already known to
    /// have died or left ends it at once with such an error.
    pub fn finalize(mut self) -> Result<()> {
        self.progress()?;
        if let Some(gone) = self.failed_peer(0..self.size) {
            let cause = self.peers[gone].as_ref().and_then(|p| p.fault);
            if cause.is_some_and(Cause::peer_gone) {
                return Err(self.connection_error(gone, "finalize"));
            }
        }
        self.boot.barrier()
    }

    /// The one check every wait makes for what its queues cannot tell it: the first of
    /// `peers` whose connection failed (an error completion of any work with it, internal
    /// writes included; a QP to it in the error state; the bootstrap saying it left). The
    /// cause is kept for [`connection_error`](Self::connection_error).
    pub(crate) fn failed_peer(&mut self, peers: impl IntoIterator<Item = usize>) -> Option<usize> {
        let departed = self.boot.departed();
        let me = self.rank;
        for peer in peers {
            let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
                continue;
            };
            if departed.contains(&peer) {
                p.note(me, peer, Cause::Departed);
            }
            if p.fault.is_none() && p.in_error() {
                // The error completion that says why may be waiting in a CQ.
                Self::drain_credit_cq(me, peer, p);
                let _ = self.poll_peer(peer);
                let p = self.peers[peer].as_mut().unwrap();
                if p.fault.is_none() {
                    p.note(me, peer, Cause::QpError);
                }
            }
            if self.peers[peer].as_ref().is_some_and(|p| p.fault.is_some()) {
                return Some(peer);
            }
        }
        None
    }

    /// The error of `what` (one clause: "the 64-byte receive from rank 1", "finalize") failing
    /// because the connection to rank `peer` failed, with the cause kept for it.
    pub(crate) fn connection_error(&self, peer: usize, what: &str) -> Error {
        let cause = self.peers[peer].as_ref().and_then(|p| p.fault).map_or_else(
            || format!("the connection to rank {peer} failed"),
            |c| c.describe(peer),
        );
        Error::Unreachable(format!("rank {}: {what} failed: {cause}", self.rank))
    }
}
