//! The communicator: N ranks, one RC connection per peer, point-to-point with receiver-ready
//! credits, one-sided windows and barriers, on the CPU or on any executor (a stream).

use crate::bootstrap::Bootstrap;
use gdsync::exec::Executor;
use gdsync::ops::{Op, Ops, WaitCond};
use gdsync::{
    Access, Cq, Device, Endpoint, Error, MemoryRegion, PinnedBuffer, ProtectionDomain, Qp,
    QpConfig, QpState, RecvTicket, RecvWr, RemoteBuf, Result, SendTicket, SendWr, Sge, WcStatus,
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

struct ReqState {
    generation: u32,
    live: bool,
    peer: usize,
    side: Side,
    /// Completion number on the peer's CQ of that side, when known.
    cqe: Option<u64>,
    /// An executor waits for (and consumes) its completion.
    on_executor: bool,
    status: Status,
}

/// A CPU send that waits for the receiver's credit.
struct PendingSend {
    req: Request,
    wr: SendWr,
}

struct Peer {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    /// Sends to this peer, posted or pending (the credit each needs is its index + 1).
    sends: u64,
    /// Receives posted for this peer.
    recvs: u64,
    pending: VecDeque<PendingSend>,
    /// Requests of this peer waited on by executors and not yet known to be done.
    executor_reqs: usize,
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
    rank: usize,
    size: usize,
    peers: Vec<Option<Peer>>,
    reqs: Vec<ReqState>,
    free: Vec<u32>,
    layout: CtrlLayout,
    // Field order matters: the registrations are dropped before the buffers they cover.
    _ctrl_mr: MemoryRegion<'static>,
    scratch_mr: MemoryRegion<'static>,
    ctrl: PinnedBuffer,
    _scratch: PinnedBuffer,
    remote_ctrl: Vec<RemoteBuf>,
    barrier_epoch: u64,
    timeout: Duration,
    pd: ProtectionDomain,
    dev: Device,
    boot: Box<dyn Bootstrap>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

pub(crate) fn encode_setup(eps: &[Option<Endpoint>], ctrl: &RemoteBuf) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&ctrl.addr.to_le_bytes());
    b.extend_from_slice(&ctrl.len.to_le_bytes());
    b.extend_from_slice(&ctrl.rkey.to_le_bytes());
    for e in eps {
        match e {
            Some(e) => b.extend_from_slice(&e.to_bytes()),
            None => b.extend_from_slice(&[0u8; 32]),
        }
    }
    b
}

pub(crate) fn decode_setup(b: &[u8], size: usize) -> Result<(RemoteBuf, Vec<Option<Endpoint>>)> {
    if b.len() != 20 + 32 * size {
        return Err(Error::invalid(
            "bootstrap: a rank sent a malformed connection record",
        ));
    }
    let ctrl = RemoteBuf {
        addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
        len: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        rkey: u32::from_le_bytes(b[16..20].try_into().unwrap()),
    };
    let eps = (0..size)
        .map(|i| {
            let e = &b[20 + 32 * i..52 + 32 * i];
            if e.iter().all(|&x| x == 0) {
                Ok(None)
            } else {
                Endpoint::from_bytes(e).map(Some)
            }
        })
        .collect::<Result<_>>()?;
    Ok((ctrl, eps))
}

impl Comm {
    /// Creates the communicator on `dev`: one QP per peer (own send and receive CQs, so
    /// completions can be waited for on executors), connected through `boot`.
    pub fn new(mut boot: Box<dyn Bootstrap>, dev: &Device) -> Result<Comm> {
        let (rank, size) = (boot.rank(), boot.size());
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} out of range for size {size}"
            )));
        }
        let pd = dev.alloc_pd();
        let rounds = usize::BITS as usize - (size.max(2) - 1).leading_zeros() as usize;
        let layout = CtrlLayout { size, rounds };
        let ctrl = PinnedBuffer::new(layout.bytes());
        let scratch = PinnedBuffer::new(64);
        // SAFETY: the buffers are owned by the Comm and outlive the registrations (declared
        // after them, so dropped after them).
        let ctrl_mr = unsafe {
            pd.register_raw(
                ctrl.addr() as *mut u8,
                ctrl.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
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
        let mut peers = Vec::with_capacity(size);
        for p in 0..size {
            if p == rank {
                peers.push(None);
                continue;
            }
            let (scq, rcq) = (dev.create_cq(2048)?, dev.create_cq(1024)?);
            let qp = pd.create_qp(&scq, &rcq, &cfg)?;
            peers.push(Some(Peer {
                qp,
                scq,
                rcq,
                sends: 0,
                recvs: 0,
                pending: VecDeque::new(),
                executor_reqs: 0,
            }));
        }
        let eps: Vec<Option<Endpoint>> = peers
            .iter()
            .map(|p| p.as_ref().map(|p| p.qp.endpoint()))
            .collect();
        let all = boot.all_gather(&encode_setup(&eps, &ctrl_mr.remote()))?;
        let mut remote_ctrl = Vec::with_capacity(size);
        for (p, rec) in all.iter().enumerate() {
            let (c, their_eps) = decode_setup(rec, size)?;
            remote_ctrl.push(c);
            if p != rank {
                let ep = their_eps[rank]
                    .ok_or_else(|| Error::invalid(format!("rank {p} has no QP for rank {rank}")))?;
                peers[p].as_mut().unwrap().qp.connect(&ep)?;
            }
        }
        // Everyone is connected before anyone sends.
        boot.barrier()?;
        Ok(Comm {
            rank,
            size,
            peers,
            reqs: Vec::new(),
            free: Vec::new(),
            layout,
            _ctrl_mr: ctrl_mr,
            scratch_mr,
            ctrl,
            _scratch: scratch,
            remote_ctrl,
            barrier_epoch: 0,
            timeout: Duration::from_secs(60),
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

    fn new_req(&mut self, peer: usize, side: Side) -> Request {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.reqs.push(ReqState {
                    generation: 0,
                    live: false,
                    peer,
                    side,
                    cqe: None,
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
            cqe: None,
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
            _ => Err(Error::invalid("unknown or already completed request")),
        }
    }

    // ------------------------------------------------------------------ point to point

    /// Posts a receive into `dst` (`mr.sge(range)` of a registered buffer) from rank `peer`.
    /// Receives from one peer match that peer's sends in order (per-peer FIFO). Gives the
    /// sender a credit.
    pub fn irecv(&mut self, dst: Sge, peer: usize) -> Result<Request> {
        let (sge, len) = (dst, dst.len);
        self.peer(peer)?;
        let req = self.new_req(peer, Side::Recv);
        let p = self.peers[peer].as_mut().unwrap();
        let mut wr = RecvWr::new().wr_id(req.wr_id());
        if len > 0 {
            wr = wr.sge(sge);
        }
        let t: RecvTicket = p.qp.post_recv(&wr)?;
        p.recvs += 1;
        let credit = p.recvs;
        self.reqs[req.slot as usize].cqe = t.cqe;
        self.write_credit(peer, credit)?;
        Ok(req)
    }

    /// Writes `value` into rank `peer`'s credit word for this rank (inline RDMA write).
    fn write_credit(&mut self, peer: usize, value: u64) -> Result<()> {
        let at = self.remote_ctrl[peer].at(self.layout.ready(self.rank) as u64);
        self.scratch_mr.write_at(0, &value.to_ne_bytes());
        let sge = self.scratch_mr.sge(0..8);
        let signal = value % 64 == 0;
        let mut wr = SendWr::write(at).sge(sge).inline().wr_id(INTERNAL);
        if !signal {
            wr = wr.unsignaled();
        }
        self.post_internal(peer, &wr)
    }

    fn post_internal(&mut self, peer: usize, wr: &SendWr) -> Result<()> {
        let start = Instant::now();
        loop {
            match self.peers[peer].as_mut().unwrap().qp.post_send(wr) {
                Err(Error::RingFull { .. }) if start.elapsed() < self.timeout => {
                    self.progress()?;
                }
                r => return r.map(|_| ()),
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
    /// matching receive (its credit), during any later call.
    pub fn isend(&mut self, src: Sge, peer: usize) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peer(peer)?;
        let req = self.new_req(peer, Side::Send);
        let wr = Self::send_wr(req, (len > 0).then_some(sge));
        let p = self.peers[peer].as_mut().unwrap();
        p.sends += 1;
        p.pending.push_back(PendingSend { req, wr });
        self.progress()?;
        Ok(req)
    }

    /// Like [`isend`](Self::isend), but the send is posted by `exec` (a stream): it waits on
    /// the executor for the receiver's credit, then rings the doorbell. The CPU does not wait.
    pub fn isend_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        let (sge, len) = (src, src.len);
        self.peer(peer)?;
        if !self.peers[peer].as_ref().unwrap().pending.is_empty() {
            return Err(Error::invalid(format!(
                "CPU sends to rank {peer} still wait for credits: wait for them before sending to it on an executor (sends to one peer stay in order)"
            )));
        }
        let req = self.new_req(peer, Side::Send);
        let wr = Self::send_wr(req, (len > 0).then_some(sge));
        let credit_word = self.ctrl.addr() + self.layout.ready(peer) as u64;
        let p = self.peers[peer].as_mut().unwrap();
        p.sends += 1;
        let need = p.sends;
        let prepared = p.qp.prepare_send(&wr)?;
        let (t, commit) = p.qp.commit(prepared)?;
        let mut ops = Ops::new();
        // SAFETY: the control word lives in the Comm's pinned buffer, which the caller keeps
        // alive (with the Comm) until the executor has run these ops (documented).
        unsafe {
            ops.push_raw(Op::Wait64 {
                addr: credit_word,
                value: need,
                cond: WaitCond::Geq,
            })
        };
        ops.append(commit);
        exec.submit(ops)?;
        self.reqs[req.slot as usize].cqe = t.cqe;
        Ok(req)
    }

    /// [`isend_on`](Self::isend_on), then the executor waits for the send's completion.
    pub fn send_on(&mut self, src: Sge, peer: usize, exec: &impl Executor) -> Result<Request> {
        let r = self.isend_on(src, peer, exec)?;
        self.wait_on(r, exec)?;
        Ok(r)
    }

    /// Makes `exec` wait for request `r` (and consume its completion); the request is then
    /// complete once the executor has passed the wait ([`Comm::wait`] still reports errors).
    pub fn wait_on(&mut self, r: Request, exec: &impl Executor) -> Result<()> {
        let st = self.state(r)?;
        if st.on_executor {
            return Err(Error::invalid(
                "this request is already waited for on an executor",
            ));
        }
        let (peer, side, cqe) = (st.peer, st.side, st.cqe);
        let Some(n) = cqe else {
            return Err(Error::invalid(
                "this request was not posted on an executor (its completion number is not known)",
            ));
        };
        let p = self.peers[peer].as_mut().unwrap();
        let cq = if side == Side::Send { &p.scq } else { &p.rcq };
        exec.submit(cq.wait_ops(n))?;
        p.executor_reqs += 1;
        self.reqs[r.slot as usize].on_executor = true;
        Ok(())
    }

    /// [`wait_on`](Self::wait_on) for several requests.
    pub fn wait_all_on(&mut self, rs: &[Request], exec: &impl Executor) -> Result<()> {
        rs.iter().try_for_each(|&r| self.wait_on(r, exec))
    }

    // ------------------------------------------------------------------ progress

    /// Moves CPU work forward: posts sends whose credits arrived, polls completions.
    pub fn progress(&mut self) -> Result<()> {
        for peer in 0..self.size {
            if peer == self.rank {
                continue;
            }
            let credit = self.credit(peer);
            let p = self.peers[peer].as_mut().unwrap();
            // Sends waiting for credits go out in order.
            let first = p.sends - p.pending.len() as u64;
            let mut k = 0;
            while let Some(ps) = p.pending.front() {
                if first + k + 1 > credit {
                    break;
                }
                match p.qp.post_send(&ps.wr) {
                    Ok(t) => {
                        let ps = p.pending.pop_front().unwrap();
                        self.reqs[ps.req.slot as usize].cqe = t.cqe;
                        k += 1;
                    }
                    Err(Error::RingFull { .. }) => break,
                    Err(e) => return Err(e),
                }
            }
            let p = self.peers[peer].as_mut().unwrap();
            if p.qp.state() == QpState::Error {
                // The peer is gone or the connection failed: sends that never got a credit
                // fail too, rather than waiting forever.
                while let Some(ps) = p.pending.pop_front() {
                    self.reqs[ps.req.slot as usize].status =
                        Status::Failed(gdsync::format::Syndrome::TransportRetryExc);
                }
            }
            self.poll_peer(peer)?;
        }
        Ok(())
    }

    fn poll_peer(&mut self, peer: usize) -> Result<()> {
        let p = self.peers[peer].as_mut().unwrap();
        // Requests an executor consumes: done when the CQ's consumer index passed them.
        if p.executor_reqs > 0 {
            let (sci, rci) = (p.scq.consumer_index(), p.rcq.consumer_index());
            let (serr, rerr) = (p.scq.take_errors(), p.rcq.take_errors());
            let mut left = 0;
            for st in self.reqs.iter_mut().filter(|s| {
                s.live && s.peer == peer && s.on_executor && s.status == Status::Pending
            }) {
                let ci = if st.side == Side::Send { sci } else { rci };
                if st.cqe.is_some_and(|n| n < ci) {
                    let errs = if st.side == Side::Send { &serr } else { &rerr };
                    st.status = match errs.first() {
                        Some(e) => Status::Failed(e.syndrome),
                        None => Status::Done(0),
                    };
                } else {
                    left += 1;
                }
            }
            self.peers[peer].as_mut().unwrap().executor_reqs = left;
            // The CPU does not poll a CQ an executor is consuming.
            if left > 0 {
                return Ok(());
            }
        }
        let p = self.peers[peer].as_mut().unwrap();
        let mut cs = Vec::new();
        p.scq.poll(&mut cs, 64)?;
        p.rcq.poll(&mut cs, 64)?;
        for c in cs {
            if c.wr_id == INTERNAL {
                if let WcStatus::Error(s) = c.status {
                    tracing::debug!(peer, ?s, "internal write failed");
                }
                continue;
            }
            let (slot, generation) = ((c.wr_id & 0xFFFF_FFFF) as usize, (c.wr_id >> 32) as u32);
            if let Some(st) = self
                .reqs
                .get_mut(slot)
                .filter(|s| s.live && s.generation == generation)
            {
                st.status = match c.status {
                    WcStatus::Success => Status::Done(c.byte_len),
                    WcStatus::Error(s) => Status::Failed(s),
                };
            }
        }
        Ok(())
    }

    /// Whether `r` is complete; `Ok(Some(bytes))` releases it (bytes received, for receives).
    pub fn test(&mut self, r: Request) -> Result<Option<u32>> {
        self.state(r)?;
        self.progress()?;
        let st = self.state(r)?;
        match st.status {
            Status::Pending => Ok(None),
            Status::Done(n) => {
                st.live = false;
                self.free.push(r.slot);
                Ok(Some(n))
            }
            Status::Failed(s) => {
                let peer = st.peer;
                st.live = false;
                self.free.push(r.slot);
                Err(Error::Completion {
                    wr_id: r.wr_id(),
                    qpn: peer as u32,
                    syndrome: s,
                })
            }
        }
    }

    /// Waits for `r` on the CPU; returns the bytes received (receives) and releases it.
    pub fn wait(&mut self, r: Request) -> Result<u32> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(n) = self.test(r)? {
                return Ok(n);
            }
            if start.elapsed() > self.timeout {
                let st = self.state(r)?;
                return Err(Error::Timeout {
                    what: format!(
                        "{:?} request with rank {} (its peer never matched it?)",
                        st.side, st.peer
                    ),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            // Spin first (a yield is a system call, dearer than a short wait), then let
            // other threads run.
            spins += 1;
            if spins < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for every request; the first error is returned after all were waited for.
    pub fn wait_all(&mut self, rs: &[Request]) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(rs.len());
        let mut first = None;
        for &r in rs {
            match self.wait(r) {
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
    /// rank (me + 2^k)'s word for round k and waits for rank (me - 2^k)'s.
    fn barrier_ops(&mut self, epoch: u64) -> Result<Vec<(usize, SendWr, u64)>> {
        let mut steps = Vec::new();
        for k in 0..self.layout.rounds {
            let to = (self.rank + (1 << k)) % self.size;
            if to == self.rank {
                continue;
            }
            let at = self.remote_ctrl[to].at(self.layout.barrier(k) as u64);
            self.scratch_mr.write_at(8 + 8 * k, &epoch.to_ne_bytes());
            let wr = SendWr::write(at)
                .sge(self.scratch_mr.sge(8 + 8 * k..16 + 8 * k))
                .inline()
                .wr_id(INTERNAL)
                .unsignaled();
            steps.push((to, wr, (self.ctrl.addr() + self.layout.barrier(k) as u64)));
        }
        Ok(steps)
    }

    /// Barrier on the CPU.
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let start = Instant::now();
        for (k, (to, wr, _)) in self.barrier_ops(epoch)?.into_iter().enumerate() {
            self.post_internal(to, &wr)?;
            loop {
                let mut b = [0u8; 8];
                self.ctrl.read_at(self.layout.barrier(k), &mut b);
                if u64::from_ne_bytes(b) >= epoch {
                    break;
                }
                self.progress()?;
                if start.elapsed() > self.timeout {
                    return Err(Error::Timeout {
                        what: format!("barrier round {k} (a rank did not arrive)"),
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
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let mut ops = Ops::new();
        for (to, wr, word) in self.barrier_ops(epoch)? {
            let p = self.peers[to].as_mut().unwrap();
            let prepared = p.qp.prepare_send(&wr)?;
            let (_, commit) = p.qp.commit(prepared)?;
            ops.append(commit);
            // SAFETY: the word lives in the Comm's pinned control buffer (see isend_on).
            unsafe {
                ops.push_raw(Op::Wait64 {
                    addr: word,
                    value: epoch,
                    cond: WaitCond::Geq,
                })
            };
        }
        exec.submit(ops)
    }

    /// The bootstrap, for out-of-band exchanges (e.g. the window setup).
    pub(crate) fn boot(&mut self) -> &mut dyn Bootstrap {
        &mut *self.boot
    }

    pub(crate) fn peer_qp(&mut self, p: usize) -> Result<&mut Qp> {
        Ok(&mut self.peer(p)?.qp)
    }

    pub(crate) fn new_put(&mut self, peer: usize) -> Request {
        self.new_req(peer, Side::Send)
    }

    pub(crate) fn set_cqe(&mut self, r: Request, t: &SendTicket) {
        self.reqs[r.slot as usize].cqe = t.cqe;
    }

    pub(crate) fn post_or_progress(&mut self, peer: usize, wr: &SendWr) -> Result<SendTicket> {
        let start = Instant::now();
        loop {
            match self.peers[peer].as_mut().unwrap().qp.post_send(wr) {
                Err(Error::RingFull { .. }) if start.elapsed() < self.timeout => self.progress()?,
                r => return r,
            }
        }
    }
}

impl Comm {
    /// Leaves together: a bootstrap barrier, so no rank tears its connections down while a
    /// peer may still write to them (credits, barrier words). Dropping without it is allowed;
    /// peers then see their work to this rank fail with TRANSPORT_RETRY_EXC.
    pub fn finalize(mut self) -> Result<()> {
        self.progress()?;
        self.boot.barrier()
    }
}
