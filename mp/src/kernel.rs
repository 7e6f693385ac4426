//! Kernel-side messaging: per peer, a connected QP that a persistent GPU kernel drives by
//! itself, with receiver-ready credits, described by a table of `gds_peer` descriptors
//! ([`PeerDesc`]) filled once. The kernel sends and receives any number of messages with
//! `gds_peer_send`, `gds_peer_recv`, `gds_peer_wait_send` and `gds_peer_wait_recv`
//! (`gdsync.cuh`); the host prepares nothing per message (LibMP's kernel descriptors were
//! single-use, one prepared by the CPU per message).
//!
//! The credits are those of the CPU path ([`Comm::irecv`]): giving credit writes the
//! receiver's receive count into the sender's credit word for it (an inline RDMA write,
//! composed here by the kernel), and a send goes out only once its credit arrived. As
//! [`Comm::irecv_batch`] does on the CPU, a kernel may post receives with
//! `gds_peer_post_recv` and credit them all with one `gds_peer_give_credit`; and it may leave
//! sends unsignalled (`gds_peer_send_flags`), waiting for several at once with
//! `gds_peer_wait_sends` (a NOP finishes a trailing unsignalled send). A kernel that answers
//! messages prepares its next send while the peer works (`gds_peer_prepare_send`: the credit,
//! ring room and the WQE) and rings it after its wait (`gds_peer_ring_send`).
//!
//! Staged channels ([`Comm::kernel_channels_staged`], or [`Comm::kernel_channels_for`] with the
//! path [`GpuMemoryPath::choose_soft`] or [`GpuMemoryPath::choose_mlx5`] picked) add per peer
//! rings of pinned host bounces, for payloads in GPU memory the NIC cannot reach: the kernel
//! copies a payload into the next send bounce and sends it (`gds_peer_next_send_bounce` +
//! `gds_peer_send_bounce`, or `gds_peer_send_staged`), and copies a message out of its receive
//! bounce after the wait (`gds_peer_post_recv_staged`, `gds_peer_recv_bounce`, or
//! `gds_peer_wait_recv_staged`).

use crate::comm::{check_gathered, decode_setup, encode_setup, Comm};
use crate::kernel_staging::{Bounces, KernelStaging};
use gdsync::kernel::{DeviceQp, PeerDesc, PeerState};
use gdsync::{
    Access, Endpoint, Error, GpuMemoryPath, MemoryRegion, PinnedBuffer, Qp, QpConfig, RemoteBuf,
    Result,
};

/// The kernel channels of a communicator (see [`Comm::kernel_channels`]): one QP per peer,
/// handed to GPU kernels, and the credit words and state blocks they use (and, staged, the
/// bounces).
///
/// Keep it alive while kernels use its table, and drop it only after every rank's kernels
/// have ended (a barrier): peers write credits into this rank's memory until then.
pub struct KernelChannels {
    rank: usize,
    size: usize,
    peers: Vec<Option<DeviceQp>>,
    remote_credit: Vec<RemoteBuf>,
    table: PinnedBuffer,
    state: PinnedBuffer,
    bounces: Option<Bounces>,
    // Field order matters: the registration is dropped before the buffer it covers.
    _credit_mr: MemoryRegion<'static>,
    credit: PinnedBuffer,
}

impl std::fmt::Debug for KernelChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelChannels")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("staging", &self.staging())
            .finish_non_exhaustive()
    }
}

/// The bytes a rank adds to its kernel-channel record: its bounce size (0: not staged), so
/// that every rank can check that all of them stage alike.
const STAGING_BYTES: usize = 8;

impl Comm {
    /// Creates kernel channels (collective: every rank calls it): per peer, a new QP
    /// connected to that peer, handed to GPU kernels ([`gdsync::Qp::into_device`]), with
    /// room for `depth` receives in flight (and twice as many sends, for credit writes).
    /// Messages on these channels are independent of the communicator's CPU and executor
    /// send/recv. Register the kernel's buffers with [`Comm::register`] or
    /// `comm.pd().register_device(..)`; where the device cannot register GPU memory, use
    /// [`kernel_channels_staged`](Self::kernel_channels_staged) instead.
    pub fn kernel_channels(&mut self, depth: u32) -> Result<KernelChannels> {
        self.open_kernel_channels(depth, None)
    }

    /// Kernel channels (as [`kernel_channels`](Self::kernel_channels), collective) whose
    /// kernels can stage payloads through pinned host bounces: for buffers in GPU memory the
    /// device cannot reach (the soft device; an mlx5 device without dma-buf or peer memory;
    /// [`GpuMemoryPath::Staged`]). Per peer, `2 × depth` send bounces and `depth` receive
    /// bounces of `bounce` bytes (1 byte to 1 GiB, rounded up to a multiple of 64; see
    /// [`KernelStaging`]), registered with the communicator's protection domain; the kernel
    /// copies into and out of them (`gds_peer_send_staged`, `gds_peer_wait_recv_staged`, or
    /// the block-wide steps in `gdsync.cuh`), and nothing of its own needs registering. A
    /// staged message is at most `bounce` bytes: cut longer ones. Every rank passes the same
    /// `bounce` (checked: else every rank gets an error).
    pub fn kernel_channels_staged(&mut self, depth: u32, bounce: usize) -> Result<KernelChannels> {
        self.open_kernel_channels(depth, Some(bounce))
    }

    /// Kernel channels for payloads that take `path` (collective): staged with bounces of
    /// `bounce` bytes ([`kernel_channels_staged`](Self::kernel_channels_staged)) for
    /// [`GpuMemoryPath::Staged`], plain ([`kernel_channels`](Self::kernel_channels), `bounce`
    /// unused) for [`GpuMemoryPath::Direct`]. Choose the path as for
    /// [`register_gpu`](Self::register_gpu): [`GpuMemoryPath::choose_soft`] or
    /// [`GpuMemoryPath::choose_mlx5`], which follow `GDSYNC_STAGING`.
    pub fn kernel_channels_for(
        &mut self,
        depth: u32,
        path: GpuMemoryPath,
        bounce: usize,
    ) -> Result<KernelChannels> {
        match path {
            GpuMemoryPath::Direct => self.kernel_channels(depth),
            GpuMemoryPath::Staged => self.kernel_channels_staged(depth, bounce),
        }
    }

    /// Kernel channels of `depth`, staged through bounces of `bounce` bytes where given.
    fn open_kernel_channels(
        &mut self,
        depth: u32,
        bounce: Option<usize>,
    ) -> Result<KernelChannels> {
        check_depth(depth)?;
        // (After the depth check: the slot counts are multiples of it.)
        let staging = bounce.map(|b| KernelStaging::new(depth, b)).transpose()?;
        let (rank, size) = (self.rank(), self.size());
        let bounces = staging
            .map(|s| Bounces::new(self.pd(), s, rank, size))
            .transpose()?;
        let credit = PinnedBuffer::new(8 * size);
        // SAFETY: the buffer is owned by the KernelChannels and outlives the registration
        // (declared after it, so dropped after it).
        let credit_mr = unsafe {
            self.pd().register_raw(
                credit.addr() as *mut u8,
                credit.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )?
        };
        let mut qps = self.kernel_channel_qps(depth)?;
        let eps: Vec<Option<Vec<Endpoint>>> = qps
            .iter()
            .map(|q| q.as_ref().map(|q| vec![q.endpoint()]))
            .collect();
        let slot = staging.map_or(0, |s| s.slot_bytes as u64);
        let mut record = encode_setup(&eps, 1, &credit_mr.remote());
        record.extend_from_slice(&slot.to_le_bytes());
        let all = self.boot().all_gather(&record)?;
        check_gathered(&all, size)?;
        let mut remote_credit = Vec::with_capacity(size);
        for (p, rec) in all.iter().enumerate() {
            let rec = check_staging(rec, p, rank, slot)?;
            let (c, mut their_eps) = decode_setup(rec, size, 1)?;
            remote_credit.push(c);
            if let Some(qp) = qps[p].as_mut() {
                let ep = their_eps[rank].take().map(|v| v[0]).ok_or_else(|| {
                    Error::invalid(format!("rank {p} has no kernel channel for rank {rank}"))
                })?;
                qp.connect(&ep)?;
            }
        }
        let peers = qps
            .into_iter()
            .map(|q| q.map(|q| q.into_device()).transpose())
            .collect::<Result<Vec<_>>>()?;
        // Every channel is connected before any kernel sends on it.
        self.boot().barrier()?;
        Ok(KernelChannels {
            rank,
            size,
            peers,
            remote_credit,
            table: PinnedBuffer::new(std::mem::size_of::<PeerDesc>() * size),
            state: PinnedBuffer::new(PeerState::SIZE * size),
            bounces,
            _credit_mr: credit_mr,
            credit,
        })
    }

    /// Per peer (none for this rank), a new QP with CQs of its own, not yet connected.
    fn kernel_channel_qps(&self, depth: u32) -> Result<Vec<Option<Qp>>> {
        let cfg = QpConfig {
            send_wqebbs: 2 * depth,
            recv_wqes: depth,
            max_recv_sge: 1,
            ..QpConfig::default()
        };
        let sq = (2 * depth).next_power_of_two().max(16);
        (0..self.size())
            .map(|p| {
                if p == self.rank() {
                    return Ok(None);
                }
                let (scq, rcq) = (
                    self.device().create_cq(sq)?,
                    self.device().create_cq(depth)?,
                );
                Ok(Some(self.pd().create_qp(&scq, &rcq, &cfg)?))
            })
            .collect()
    }
}

fn check_depth(depth: u32) -> Result<()> {
    if depth == 0 || depth > 1 << 14 {
        return Err(Error::invalid(format!(
            "kernel channel depth {depth} out of 1..=16384"
        )));
    }
    Ok(())
}

/// Rank `p`'s kernel-channel record without its staging bytes, once they agree with this
/// rank's bounce size `slot` (0: not staged).
fn check_staging(rec: &[u8], p: usize, rank: usize, slot: u64) -> Result<&[u8]> {
    let malformed = || {
        Error::invalid(
            "bootstrap: a rank sent a malformed kernel-channel record (another gdasync version?)",
        )
    };
    let at = rec.len().checked_sub(STAGING_BYTES).ok_or_else(malformed)?;
    let (rec, tail) = rec.split_at(at);
    let theirs = u64::from_le_bytes(tail.try_into().map_err(|_| malformed())?);
    if theirs != slot {
        let say = |b: u64| match b {
            0 => "without staging".to_string(),
            b => format!("staged with {b}-byte bounces"),
        };
        return Err(Error::invalid(format!(
            "rank {p} made its kernel channels {} and rank {rank} {}: every rank calls kernel_channels_staged with the same bounce size (or every rank kernel_channels)",
            say(theirs),
            say(slot)
        )));
    }
    Ok(rec)
}

impl KernelChannels {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks (entries of the table).
    pub fn size(&self) -> usize {
        self.size
    }

    fn check_peer(&self, peer: usize) -> Result<&DeviceQp> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "rank {peer} is not a peer of rank {} (communicator of {})",
                    self.rank, self.size
                ))
            })
    }

    /// What the kernels have done with the channel to `peer` (their counters, stored
    /// through to host memory), and the first error they saw.
    pub fn progress(&self, peer: usize) -> Result<PeerState> {
        self.check_peer(peer)?;
        let mut b = [0u8; PeerState::SIZE];
        self.state.read_at(PeerState::SIZE * peer, &mut b);
        Ok(PeerState::from_bytes(&b))
    }

    /// The descriptor of the channel to `peer`, with the counters where the last kernel left
    /// them (so a new launch resumes). Take a new one for each launch, never while a kernel
    /// runs.
    pub fn desc(&self, peer: usize) -> Result<PeerDesc> {
        let qp = self.check_peer(peer)?;
        let mut d = PeerDesc {
            qp: qp.desc(),
            credit: self.credit.gpu_addr() + 8 * peer as u64,
            // A peer's address: wrapping, its device checks the access.
            remote_credit: self.remote_credit[peer].at(8 * self.rank as u64).addr,
            state: self.state.gpu_addr() + (PeerState::SIZE * peer) as u64,
            remote_credit_rkey: self.remote_credit[peer].rkey,
            rank: peer as u32,
            ..PeerDesc::default()
        };
        if let Some(b) = &self.bounces {
            b.describe(peer, &mut d);
        }
        self.progress(peer)?.apply(&mut d);
        Ok(d)
    }

    /// Every rank's descriptor, indexed by rank; this rank's own entry is zero (the device
    /// functions refuse it with `GDS_INVALID`).
    pub fn descs(&self) -> Result<Vec<PeerDesc>> {
        (0..self.size)
            .map(|p| {
                if p == self.rank {
                    Ok(PeerDesc {
                        rank: p as u32,
                        ..PeerDesc::default()
                    })
                } else {
                    self.desc(p)
                }
            })
            .collect()
    }

    /// Writes [`descs`](Self::descs) into a table in pinned host memory and returns the GPUs'
    /// address of it: pass it to a kernel as `const gds_peer *peers` (`peers[rank]`). As with
    /// `descs`, refresh it before each launch, never while a kernel runs.
    pub fn table(&self) -> Result<u64> {
        for (p, d) in self.descs()?.iter().enumerate() {
            self.table
                .write_at(std::mem::size_of::<PeerDesc>() * p, d.as_bytes());
        }
        Ok(self.table.gpu_addr())
    }

    /// Whether GPUs can reach the rings, credit words, state blocks, table and bounces
    /// (pinned and mapped); without it a kernel cannot use the channels.
    pub fn gpu_mapped(&self) -> bool {
        self.peers.iter().flatten().all(DeviceQp::gpu_mapped)
            && self.credit.gpu_mapped()
            && self.state.gpu_mapped()
            && self.table.gpu_mapped()
            && self.bounces.as_ref().is_none_or(Bounces::gpu_mapped)
    }

    /// How the channels stage payloads (bounce size and slots per peer), `None` where they
    /// do not ([`Comm::kernel_channels`]).
    pub fn staging(&self) -> Option<KernelStaging> {
        self.bounces.as_ref().map(Bounces::shape)
    }

    /// The path GPU payloads take on these channels: staged through their bounces, or direct.
    pub fn path(&self) -> GpuMemoryPath {
        match self.bounces {
            Some(_) => GpuMemoryPath::Staged,
            None => GpuMemoryPath::Direct,
        }
    }
}
