//! A kernel-driven connection to one peer with receiver-ready credits (`gds_peer` and
//! `gds_peer_send(_flags)`, `gds_peer_recv` or `gds_peer_post_recv` + `gds_peer_give_credit`,
//! `gds_peer_wait_send(s)`, `gds_peer_wait_recv` in the header): a [`QpDesc`] plus the
//! credit words. The messaging layer (`mp`) builds a table of
//! these, one per peer.
//!
//! Credits: giving credit writes this rank's receive count into the peer's credit word for
//! this rank (an inline RDMA write the kernel composes; `gds_peer_give_credit` covers every
//! receive posted since the last one, `gds_peer_recv` gives one per receive), and a send
//! waits until its own credit word counts a receive for it, so a send never meets an empty
//! receive queue.
//!
//! Sends may be unsignalled (`gds_peer_send_flags`): they complete with the next signalled
//! WQE, and `gds_peer_wait_send(s)` posts a signalled NOP when none follows. The kernel
//! signals at least one WQE per half ring by itself, so the ring never fills with WQEs that
//! no completion would free. A send may be prepared ahead (`gds_peer_prepare_send`: its
//! credit, ring room and WQE) and rung later (`gds_peer_ring_send`), once its data is ready;
//! nothing else is posted on the send queue in between.
//!
//! Puts and gets (`gds_peer_put(_flags)`, `gds_peer_get`) go on the same send ring, into or
//! out of a [`RemoteDesc`](super::RemoteDesc) (one rank's region of a window): they take no
//! credit, and count as sends for the waits, in order with them.
//!
//! Staged channels (payloads in GPU memory the NIC cannot reach) carry rings of pinned host
//! bounces: `gds_peer_next_send_bounce` + `gds_peer_send_bounce` (or `gds_peer_send_staged`,
//! or `gds_peer_put_bounce` for a put),
//! `gds_peer_post_recv_staged` and `gds_peer_recv_bounce` after `gds_peer_wait_recv` (or
//! `gds_peer_wait_recv_staged`).

use super::QpDesc;

/// One peer as a kernel sees it (`gds_peer`). The counters are the driving thread's working
/// copy, stored through to the state block ([`PeerState`]) after every call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerDesc {
    /// The QP dedicated to this peer.
    pub qp: QpDesc,
    /// Address of this rank's credit word for the peer (native u64, in pinned host memory):
    /// the receives the peer has posted for this rank, written by the peer.
    pub credit: u64,
    /// Address, at the peer, of its credit word for this rank.
    pub remote_credit: u64,
    /// Address of the state block ([`PeerState`], pinned host memory).
    pub state: u64,
    /// Sends posted, puts and gets included (they complete, and are waited for, in order
    /// with the sends).
    pub sends: u64,
    /// Send completions consumed (by waits, or while making room in the send ring).
    pub sends_done: u64,
    /// Send completions returned by `gds_peer_wait_send`.
    pub sends_waited: u64,
    /// Receives posted.
    pub recvs: u64,
    /// Receive completions returned by `gds_peer_wait_recv`.
    pub recvs_waited: u64,
    /// The last credit value read (a cache, not stored through).
    pub credits: u64,
    /// The rkey of `remote_credit`.
    pub remote_credit_rkey: u32,
    /// The peer's rank.
    pub rank: u32,
    /// The first error (`GDS_ERR_CQE | syndrome`); once set, every call returns it.
    pub error: u32,
    /// Zero.
    pub reserved: u32,
    /// Receives the last credit write announced to the peer (kernel working state, not
    /// stored through: a new descriptor starts at 0, so its first credit write may repeat a
    /// count the peer already has, which is harmless).
    pub credited: u64,
    /// The send ring's producer counter right after the latest signalled WQE (0: none yet;
    /// working state, as `credited`).
    pub signaled_pi: u64,
    /// Sends posted up to and including the latest signalled WQE: all of them are done once
    /// its completion comes (working state, as `credited`).
    pub signaled_sends: u64,
    /// Staging (all 0: none): the GPUs' address of the send bounces (`send_slots` slots of
    /// `slot_bytes`, pinned host memory), where kernels copy payloads.
    pub send_bounce: u64,
    /// The GPUs' address of the receive bounces (`recv_slots` slots of `slot_bytes`).
    pub recv_bounce: u64,
    /// The address of the send bounces that their registration covers (what WQEs name).
    pub send_bounce_nic: u64,
    /// The address of the receive bounces that their registration covers.
    pub recv_bounce_nic: u64,
    /// The lkey of the send bounces.
    pub send_bounce_lkey: u32,
    /// The lkey of the receive bounces.
    pub recv_bounce_lkey: u32,
    /// Bytes per bounce: the longest staged message.
    pub slot_bytes: u32,
    /// Send bounces: send `n` uses slot `n % send_slots`, free once the send before it in
    /// that slot completed.
    pub send_slots: u32,
    /// Receive bounces: receive `n` uses slot `n % recv_slots`, free once the receive
    /// before it in that slot was waited for.
    pub recv_slots: u32,
    /// Zero.
    pub reserved2: u32,
    /// Puts and gets among `sends` (`gds_peer_put`, `gds_peer_get`): they take no credit.
    pub one_sided: u64,
}
const _: () = assert!(std::mem::size_of::<PeerDesc>() == 400);

impl PeerDesc {
    /// The descriptor's bytes, as a kernel reads them from a table in memory.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: #[repr(C)] of integers only, with no padding (every field is aligned by the
        // ones before it; the size assertion above holds the sum), so every byte is
        // initialised; the slice borrows self.
        unsafe {
            std::slice::from_raw_parts(
                self as *const Self as *const u8,
                std::mem::size_of::<Self>(),
            )
        }
    }
}

/// The state block of a [`PeerDesc`] (`gds_peer_state`): the counters a kernel stored
/// through, where the host reads progress and the next launch resumes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerState {
    /// Sends posted.
    pub sends: u64,
    /// Send completions consumed.
    pub sends_done: u64,
    /// Send completions returned by waits.
    pub sends_waited: u64,
    /// Receives posted.
    pub recvs: u64,
    /// Receive completions returned by waits.
    pub recvs_waited: u64,
    /// The first error (`GDS_ERR_CQE | syndrome`), 0 if none.
    pub error: u32,
    /// Zero.
    pub reserved: u32,
    /// Puts and gets among the sends.
    pub one_sided: u64,
    /// Zero.
    pub reserved2: u64,
}
const _: () = assert!(std::mem::size_of::<PeerState>() == 64);

impl PeerState {
    /// Size of the block in bytes.
    pub const SIZE: usize = 64;

    /// Decodes the block from its bytes (native byte order, as the kernel stores them).
    pub fn from_bytes(b: &[u8; Self::SIZE]) -> Self {
        let u64_at = |i: usize| u64::from_ne_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
        PeerState {
            sends: u64_at(0),
            sends_done: u64_at(1),
            sends_waited: u64_at(2),
            recvs: u64_at(3),
            recvs_waited: u64_at(4),
            error: u32::from_ne_bytes(b[40..44].try_into().unwrap()),
            reserved: 0,
            one_sided: u64_at(6),
            reserved2: 0,
        }
    }

    /// Copies the counters into a descriptor (where a new launch resumes).
    pub fn apply(&self, d: &mut PeerDesc) {
        d.sends = self.sends;
        d.sends_done = self.sends_done;
        d.sends_waited = self.sends_waited;
        d.recvs = self.recvs;
        d.recvs_waited = self.recvs_waited;
        d.error = self.error;
        d.one_sided = self.one_sided;
    }
}
