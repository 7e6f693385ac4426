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
//! `gds_peer_wait_sends` (a NOP finishes a trailing unsignalled send).

use crate::comm::{check_gathered, decode_setup, encode_setup, Comm};
use gdsync::kernel::{DeviceQp, PeerDesc, PeerState};
use gdsync::{Access, Endpoint, Error, MemoryRegion, PinnedBuffer, QpConfig, RemoteBuf, Result};

/// The kernel channels of a communicator (see [`Comm::kernel_channels`]): one QP per peer,
/// handed to GPU kernels, and the credit words and state blocks they use.
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
    // Field order matters: the registration is dropped before the buffer it covers.
    _credit_mr: MemoryRegion<'static>,
    credit: PinnedBuffer,
}

impl std::fmt::Debug for KernelChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelChannels")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Comm {
    /// Creates kernel channels (collective: every rank calls it): per peer, a new QP
    /// connected to that peer, handed to GPU kernels ([`gdsync::Qp::into_device`]), with
    /// room for `depth` receives in flight (and twice as many sends, for credit writes).
    /// Messages on these channels are independent of the communicator's CPU and executor
    /// send/recv. Register the kernel's buffers with [`Comm::register`] or
    /// `comm.pd().register_device(..)`.
    pub fn kernel_channels(&mut self, depth: u32) -> Result<KernelChannels> {
        if depth == 0 || depth > 1 << 14 {
            return Err(Error::invalid(format!(
                "kernel channel depth {depth} out of 1..=16384"
            )));
        }
        let (rank, size) = (self.rank(), self.size());
        let cfg = QpConfig {
            send_wqebbs: 2 * depth,
            recv_wqes: depth,
            max_recv_sge: 1,
            ..QpConfig::default()
        };
        let sq = (2 * depth).next_power_of_two().max(16);
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
        let mut qps = Vec::with_capacity(size);
        for p in 0..size {
            if p == rank {
                qps.push(None);
                continue;
            }
            let (scq, rcq) = (
                self.device().create_cq(sq)?,
                self.device().create_cq(depth)?,
            );
            qps.push(Some(self.pd().create_qp(&scq, &rcq, &cfg)?));
        }
        let eps: Vec<Option<Vec<Endpoint>>> = qps
            .iter()
            .map(|q| q.as_ref().map(|q| vec![q.endpoint()]))
            .collect();
        let all = self
            .boot()
            .all_gather(&encode_setup(&eps, 1, &credit_mr.remote()))?;
        check_gathered(&all, size)?;
        let mut remote_credit = Vec::with_capacity(size);
        for (p, rec) in all.iter().enumerate() {
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
            _credit_mr: credit_mr,
            credit,
        })
    }
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

    /// Whether GPUs can reach the rings, credit words, state blocks and table (pinned and
    /// mapped); without it a kernel cannot use the channels.
    pub fn gpu_mapped(&self) -> bool {
        self.peers.iter().flatten().all(DeviceQp::gpu_mapped)
            && self.credit.gpu_mapped()
            && self.state.gpu_mapped()
            && self.table.gpu_mapped()
    }
}
