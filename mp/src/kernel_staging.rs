//! The pinned host bounces of staged kernel channels ([`Comm::kernel_channels_staged`]):
//! per peer, a ring of send bounces and a ring of receive bounces, registered once with the
//! channels' protection domain, that a kernel copies GPU payloads through where the NIC cannot
//! reach GPU memory. What the rings' slots mean to a kernel is in `gdsync.cuh` (`gds_peer`,
//! `gds_peer_next_send_bounce`, `gds_peer_post_recv_staged`, `gds_peer_recv_bounce`).
//!
//! [`Comm::kernel_channels_staged`]: crate::Comm::kernel_channels_staged

use gdsync::kernel::PeerDesc;
use gdsync::{Access, Error, MemoryRegion, PinnedBuffer, ProtectionDomain, Result};

/// The largest bounce of a staged kernel channel (1 GiB): a receive is at most 2 GiB - 1.
pub const MAX_KERNEL_BOUNCE: usize = 1 << 30;

/// The most pinned memory the bounces of one set of kernel channels may take (16 GiB).
const MAX_TOTAL: usize = 1 << 34;

/// Bounces are rounded up to this many bytes, so every slot starts 64-byte aligned (the
/// copies move 16 bytes at a time where both sides are aligned).
const ALIGN: usize = 64;

/// How a staged channel stages, per peer ([`KernelChannels::staging`](crate::KernelChannels::staging)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelStaging {
    /// Bytes per bounce: the longest message a staged send or receive takes.
    pub slot_bytes: u32,
    /// Send bounces (2 × depth): send `n` takes slot `n % send_slots` once the send before
    /// it in that slot completed. Credits keep at most `depth` sends unmatched at the peer,
    /// and as many more may be matched but not yet known complete (an unsignalled send
    /// completes with a later signalled work request), so a send seldom waits for its bounce.
    pub send_slots: u32,
    /// Receive bounces (depth): receive `n` takes slot `n % recv_slots`, free once the
    /// receive before it in that slot was waited for.
    pub recv_slots: u32,
}

impl KernelStaging {
    /// The staging of channels of `depth` with bounces of `bounce` bytes (rounded up to a
    /// multiple of 64), checked: a bounce of 1 byte to 1 GiB.
    pub(crate) fn new(depth: u32, bounce: usize) -> Result<Self> {
        if bounce == 0 || bounce > MAX_KERNEL_BOUNCE {
            return Err(Error::invalid(format!(
                "kernel channel bounce of {bounce} bytes out of 1..=1 GiB: choose a bounce as long as the longest staged message"
            )));
        }
        Ok(Self {
            // At most 1 GiB, so the rounded size fits a u32.
            slot_bytes: bounce.next_multiple_of(ALIGN) as u32,
            send_slots: 2 * depth,
            recv_slots: depth,
        })
    }

    /// Bytes of one peer's bounces (both rings), `None` on overflow.
    fn per_peer(&self) -> Option<usize> {
        (self.send_slots as usize)
            .checked_add(self.recv_slots as usize)?
            .checked_mul(self.slot_bytes as usize)
    }
}

/// The bounces of every peer of a set of kernel channels: peer `p`'s send ring, then its
/// receive ring, at block `p` (this rank's own block is skipped).
pub(crate) struct Bounces {
    // Field order matters: the registration is dropped before the buffer it covers.
    mr: MemoryRegion<'static>,
    buf: PinnedBuffer,
    shape: KernelStaging,
    rank: usize,
}

impl Bounces {
    /// Bounces of `shape` for the peers of `rank` in a communicator of `size`, registered in
    /// `pd`. Refused (a one-line error saying what to lower) where they would take more than
    /// 16 GiB of pinned memory.
    pub(crate) fn new(
        pd: &ProtectionDomain,
        shape: KernelStaging,
        rank: usize,
        size: usize,
    ) -> Result<Self> {
        let peers = size.saturating_sub(1).max(1);
        let total = shape
            .per_peer()
            .and_then(|b| b.checked_mul(peers))
            .filter(|&b| b <= MAX_TOTAL)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel channel bounces of {peers} peers x {} slots x {} bytes exceed 16 GiB of pinned memory: lower the depth or the bounce size",
                    shape.send_slots as u64 + shape.recv_slots as u64,
                    shape.slot_bytes
                ))
            })?;
        let buf = PinnedBuffer::new(total);
        // SAFETY: the registration is declared before the buffer in Bounces, so it is
        // dropped first; the buffer is pinned host memory of `total` bytes.
        let mr = unsafe {
            pd.register_raw(
                buf.addr() as *mut u8,
                total,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )?
        };
        Ok(Self {
            mr,
            buf,
            shape,
            rank,
        })
    }

    /// How the channels stage.
    pub(crate) fn shape(&self) -> KernelStaging {
        self.shape
    }

    /// Whether GPUs can reach the bounces (pinned and mapped).
    pub(crate) fn gpu_mapped(&self) -> bool {
        self.buf.gpu_mapped()
    }

    /// Fills the staging fields of `d`, the descriptor of `peer`.
    pub(crate) fn describe(&self, peer: usize, d: &mut PeerDesc) {
        let s = self.shape;
        let block = if peer < self.rank { peer } else { peer - 1 };
        // Within the buffer (its size is the checked product of these factors).
        let at = (block * s.per_peer().unwrap_or(0)) as u64;
        let recv_at = at + s.send_slots as u64 * s.slot_bytes as u64;
        d.send_bounce = self.buf.gpu_addr() + at;
        d.recv_bounce = self.buf.gpu_addr() + recv_at;
        d.send_bounce_nic = self.buf.addr() + at;
        d.recv_bounce_nic = self.buf.addr() + recv_at;
        d.send_bounce_lkey = self.mr.lkey();
        d.recv_bounce_lkey = self.mr.lkey();
        d.slot_bytes = s.slot_bytes;
        d.send_slots = s.send_slots;
        d.recv_slots = s.recv_slots;
    }
}

#[cfg(test)]
mod tests {
    use super::{KernelStaging, MAX_KERNEL_BOUNCE};

    #[test]
    fn bounce_sizes_are_bounded_and_rounded() {
        assert!(KernelStaging::new(8, 0).is_err());
        assert!(KernelStaging::new(8, MAX_KERNEL_BOUNCE + 1).is_err());
        let s = KernelStaging::new(8, 100).unwrap();
        assert_eq!((s.slot_bytes, s.send_slots, s.recv_slots), (128, 16, 8));
        let s = KernelStaging::new(1 << 14, MAX_KERNEL_BOUNCE).unwrap();
        assert_eq!(s.slot_bytes as usize, MAX_KERNEL_BOUNCE);
        assert_eq!(s.per_peer(), Some(3 * (1 << 14) * MAX_KERNEL_BOUNCE));
    }
}
