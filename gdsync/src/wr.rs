//! Work requests: builders for send-queue and receive-queue entries.

use crate::format::Opcode;
use smallvec::SmallVec;

/// A scatter/gather entry: `len` bytes at `addr` in the region with local key `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOp {
    /// Send; consumes a receive at the peer.
    Send,
    /// Send with 32-bit immediate data.
    SendImm(u32),
    /// RDMA write to the peer's memory.
    Write(RemoteAddr),
    /// RDMA write with immediate; consumes a receive at the peer.
    WriteImm(RemoteAddr, u32),
    /// RDMA read from the peer's memory into the SGEs.
    Read(RemoteAddr),
    /// 8-byte fetch-and-add on the peer's memory; the old value lands in the one SGE.
    FetchAdd {
        /// The 8-byte aligned remote word.
        remote: RemoteAddr,
        /// Value to add.
        add: u64,
    },
    /// 8-byte compare-and-swap on the peer's memory; the old value lands in the one SGE.
    CompareSwap {
        /// The 8-byte aligned remote word.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// Value stored when the word equals `compare`.
        swap: u64,
    },
    /// No operation; completes locally in order.
    Nop,
}

impl WrOp {
    /// The WQE opcode, remote address and immediate data (0 where none) the operation
    /// writes into its WQE: the one table from work requests to mlx5 opcodes.
    pub const fn wqe_fields(&self) -> (Opcode, Option<RemoteAddr>, u32) {
        match *self {
            WrOp::Send => (Opcode::Send, None, 0),
            WrOp::SendImm(i) => (Opcode::SendImm, None, i),
            WrOp::Write(r) => (Opcode::RdmaWrite, Some(r), 0),
            WrOp::WriteImm(r, i) => (Opcode::RdmaWriteImm, Some(r), i),
            WrOp::Read(r) => (Opcode::RdmaRead, Some(r), 0),
            WrOp::FetchAdd { remote, .. } => (Opcode::AtomicFa, Some(remote), 0),
            WrOp::CompareSwap { remote, .. } => (Opcode::AtomicCs, Some(remote), 0),
            WrOp::Nop => (Opcode::Nop, None, 0),
        }
    }
}

bitflags::bitflags! {
    /// Send flags (`ibv_send_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Write a completion on success (errors always complete).
        const SIGNALED = 1;
        /// Copy the payload into the WQE at post time.
        const INLINE = 2;
        /// Wait for earlier reads and atomics before starting.
        const FENCE = 4;
        /// Solicited event at the responder.
        const SOLICITED = 8;
        /// Inline when the payload fits the QP's `max_inline` and lies in host memory;
        /// otherwise the NIC gathers it. (Not a verbs flag: a CPU copy of a few bytes is
        /// cheaper than the NIC's read, a copy out of GPU memory is not.)
        const INLINE_HOST = 16;
    }
}

/// A send-queue work request. Signalled by default.
#[derive(Clone, Debug)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Gather list (scatter list for reads, the result word for atomics); at most 16.
    pub sges: SmallVec<[Sge; 2]>,
    /// Flags.
    pub flags: SendFlags,
}

impl SendWr {
    fn new(op: WrOp) -> Self {
        Self {
            wr_id: 0,
            op,
            sges: SmallVec::new(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// A send.
    pub fn send() -> Self {
        Self::new(WrOp::Send)
    }
    /// A send with immediate data.
    pub fn send_imm(imm: u32) -> Self {
        Self::new(WrOp::SendImm(imm))
    }
    /// An RDMA write to `remote`.
    pub fn write(remote: RemoteAddr) -> Self {
        Self::new(WrOp::Write(remote))
    }
    /// An RDMA write with immediate data.
    pub fn write_imm(remote: RemoteAddr, imm: u32) -> Self {
        Self::new(WrOp::WriteImm(remote, imm))
    }
    /// An RDMA read from `remote` into the SGEs.
    pub fn read(remote: RemoteAddr) -> Self {
        Self::new(WrOp::Read(remote))
    }
    /// A fetch-and-add on the 8-byte word at `remote`.
    pub fn fetch_add(remote: RemoteAddr, add: u64) -> Self {
        Self::new(WrOp::FetchAdd { remote, add })
    }
    /// A compare-and-swap on the 8-byte word at `remote`.
    pub fn compare_swap(remote: RemoteAddr, compare: u64, swap: u64) -> Self {
        Self::new(WrOp::CompareSwap {
            remote,
            compare,
            swap,
        })
    }
    /// A no-op.
    pub fn nop() -> Self {
        Self::new(WrOp::Nop)
    }
    /// Sets the id returned in the completion.
    pub fn wr_id(mut self, id: u64) -> Self {
        self.wr_id = id;
        self
    }
    /// Appends one SGE.
    pub fn sge(mut self, sge: Sge) -> Self {
        self.sges.push(sge);
        self
    }
    /// Appends SGEs.
    pub fn sges(mut self, sges: &[Sge]) -> Self {
        self.sges.extend_from_slice(sges);
        self
    }
    /// No completion on success.
    pub fn unsignaled(mut self) -> Self {
        self.flags.remove(SendFlags::SIGNALED);
        self
    }
    /// Copies the payload into the WQE (small sends and writes).
    pub fn inline(mut self) -> Self {
        self.flags.insert(SendFlags::INLINE);
        self
    }
    /// Copies the payload into the WQE when it is small and in host memory
    /// ([`SendFlags::INLINE_HOST`]). Like [`inline`](Self::inline), the bytes are taken
    /// when the request is prepared, not when the doorbell rings.
    pub fn inline_host(mut self) -> Self {
        self.flags.insert(SendFlags::INLINE_HOST);
        self
    }
    /// Waits for earlier reads and atomics first.
    pub fn fence(mut self) -> Self {
        self.flags.insert(SendFlags::FENCE);
        self
    }
    /// Marks the request solicited.
    pub fn solicited(mut self) -> Self {
        self.flags.insert(SendFlags::SOLICITED);
        self
    }
    /// Total payload length.
    pub fn len(&self) -> u64 {
        self.sges.iter().map(|s| s.len as u64).sum()
    }
    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive-queue work request: where an incoming send lands.
#[derive(Clone, Debug, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: SmallVec<[Sge; 2]>,
}

impl RecvWr {
    /// An empty receive (enough for RDMA write with immediate and zero-length sends).
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the id returned in the completion.
    pub fn wr_id(mut self, id: u64) -> Self {
        self.wr_id = id;
        self
    }
    /// Appends one SGE.
    pub fn sge(mut self, sge: Sge) -> Self {
        self.sges.push(sge);
        self
    }
}

/// Where in a peer's memory region an operation goes: address and rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// A peer's whole memory region, as exchanged between ranks: address, length and rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteBuf {
    /// The address `offset` bytes into the region. Not checked here: the peer's device
    /// checks every access against the region, and an address that wraps past `u64::MAX`
    /// fails there with a remote access error, as any out-of-bounds access does.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}
