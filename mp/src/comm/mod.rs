//! The communicator: N ranks, one RC connection per peer, point-to-point with receiver-ready
//! credits, one-sided windows and barriers, on the CPU or on any executor (a stream).
//!
//! The rooms: `setup` connects the ranks (the records they exchange are in `wire`), `peers`
//! holds what this rank keeps per peer, `requests` the request slots, `p2p` the CPU's sends,
//! receives and credits, `on_stream` the work executors post and wait for, `progress` and
//! `wait` the CPU's polling and waiting, `barrier` the barriers, `finalize` leaving and the
//! fault checks every wait makes.

use crate::bootstrap::Bootstrap;
use crate::fault::Work;
use crate::registry::{RegCache, RegCacheStats};
use gdsync::ops::WaitCond;
use gdsync::{
    Access, Completion, Device, MemoryRegion, PinnedBuffer, ProtectionDomain, RemoteBuf, Result,
    Sge,
};
use std::time::Duration;

mod barrier;
mod chunk_op;
mod chunked;
mod finalize;
mod on_stream;
mod p2p;
mod peers;
mod progress;
mod requests;
mod setup;
mod staged;
mod wait;
mod wire;

pub(crate) use chunk_op::ChunkOp;
use peers::Peers;
use requests::ReqState;
pub use requests::Request;
pub(crate) use wire::{
    check_gathered, decode_remote, decode_setup, encode_remote, encode_setup, REMOTE_BYTES,
};

/// Marks completions that belong to no request (credit and barrier writes).
const INTERNAL: u64 = u64::MAX;

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
    peers: Peers,
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
    regs: RegCache,
    /// Pinned bounces of staged GPU payloads, made at the first staged send or receive
    /// (before `pd`: its registration goes first).
    stage: Option<crate::staged::StagePool>,
    stage_shape: crate::staged::PoolShape,
    /// Staged messages larger than a bounce, in chunks (see `chunked`).
    chunked: Vec<chunked::Chunked>,
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

impl Comm {
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

    /// The SGE for `len` bytes at `addr` (host or GPU memory), from a cached registration
    /// covering them or a new one (registered for every access, as [`Comm::register`]).
    /// Registering memory is dear on a real NIC (pinning, page-table writes), so codes that
    /// send from the same buffers over and over register each once; the memory kind (host,
    /// pinned, GPU) is detected by the registration itself.
    ///
    /// # Safety
    /// The memory must stay allocated until [`Comm::deregister`] is called for it or the
    /// `Comm` is dropped: memory freed and allocated again at the same address would be
    /// found in the cache and reached through the old registration (MPI libraries intercept
    /// `free` for this; here the caller keeps the contract).
    pub unsafe fn register_cached(&mut self, addr: *const u8, len: usize) -> Result<Sge> {
        // SAFETY: the caller keeps the memory allocated while the registration is cached.
        unsafe { self.regs.register(&self.pd, addr, len) }
    }

    /// Drops every cached registration that overlaps `[addr, addr + len)`; returns how many.
    /// Call it before freeing memory registered through [`Comm::register_cached`], once no
    /// work on it is in flight.
    pub fn deregister(&mut self, addr: *const u8, len: usize) -> usize {
        self.regs.deregister(addr, len)
    }

    /// Hits, misses and size of the registration cache.
    pub fn reg_cache_stats(&self) -> RegCacheStats {
        self.regs.stats()
    }

    /// The bootstrap, for out-of-band exchanges (e.g. the window setup).
    pub(crate) fn boot(&mut self) -> &mut dyn Bootstrap {
        &mut *self.boot
    }

    /// Checks `p` is a peer rank.
    pub(crate) fn check_peer(&mut self, p: usize) -> Result<()> {
        self.peers.get(p).map(|_| ())
    }

    /// A new one-sided request (`work` is a put or a get).
    pub(crate) fn new_one_sided(&mut self, peer: usize, work: Work) -> Request {
        self.new_req(peer, work)
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
