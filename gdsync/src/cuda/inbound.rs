//! Payloads a NIC writes into GPU memory, and the completion that says they are there: whether
//! a GPU that sees the completion (a stream wait, a kernel poll) is sure to see the payload,
//! must flush first (`CU_STREAM_WAIT_VALUE_FLUSH`), or cannot be made sure at all.
//!
//! On a ConnectX the payload goes NIC → GPU by PCIe peer-to-peer while the CQE (or a signal
//! word) goes NIC → host memory: two paths. A GPU whose `GPU_DIRECT_RDMA_WRITES_ORDERING` is
//! at least `OWNER` (100) orders such writes as its own work sees them; one that is not may
//! flush them before a stream wait passes (`CAN_FLUSH_REMOTE_WRITES`); one that can do neither
//! is refused GPU memory as an RDMA write target. The soft device copies a payload before it
//! writes the completion, so it never needs any of this.

use super::GpuCaps;
use crate::Error;

/// `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`: the GPU's own work sees GPUDirect RDMA writes
/// to its memory in order, without a flush.
pub const WRITES_ORDERING_OWNER: i32 = 100;

/// What a GPU must do before it consumes a payload a NIC wrote into its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboundWrites {
    /// Nothing: the payload is visible once the completion is (the NIC writes both by one
    /// path, or the GPU orders remote writes to its owner).
    InOrder,
    /// Stream waits flush remote writes (`CU_STREAM_WAIT_VALUE_FLUSH`) before they pass.
    Flush,
    /// Neither ordered nor flushable: GPU memory is refused as an RDMA write target.
    Unordered,
}

impl GpuCaps {
    /// What this GPU must do before consuming payloads from a NIC whose payload writes to GPU
    /// memory travel apart from its completions (`separate_path`, see
    /// [`DeviceAttr::gpu_writes_separate`](crate::DeviceAttr::gpu_writes_separate)).
    pub fn inbound_writes(&self, separate_path: bool) -> InboundWrites {
        if !separate_path || self.gpudirect_rdma_writes_ordering >= WRITES_ORDERING_OWNER {
            InboundWrites::InOrder
        } else if self.flush_remote_writes {
            InboundWrites::Flush
        } else {
            InboundWrites::Unordered
        }
    }

    /// One line for `info`: what this GPU does with RDMA writes into its memory (as a NIC with
    /// a separate payload path, a ConnectX, writes them).
    pub fn inbound_line(&self) -> String {
        let ord = self.gpudirect_rdma_writes_ordering;
        match self.inbound_writes(true) {
            InboundWrites::InOrder => format!("not needed: writes ordering {ord} >= {WRITES_ORDERING_OWNER} (owner), so a GPU that sees a completion sees its payload"),
            InboundWrites::Flush => format!("stream waits flush: writes ordering {ord} < {WRITES_ORDERING_OWNER} (owner); kernels cannot flush, so a kernel must not read GPU-memory payloads right after its poll"),
            InboundWrites::Unordered => format!("unordered: writes ordering {ord} < {WRITES_ORDERING_OWNER} (owner) and no flush, so GPU memory is refused as an RDMA write target on a ConnectX"),
        }
    }
}

/// The error for GPU `ordinal` memory registered as a write target of `dev`, whose payload
/// writes travel apart from its completions, where the GPU neither orders nor flushes them;
/// `None` where the registration may go ahead.
pub(crate) fn refuse_write_target(caps: &GpuCaps, ordinal: i32, dev: &str) -> Option<Error> {
    (caps.inbound_writes(true) == InboundWrites::Unordered).then(|| {
        Error::Unsupported(format!(
            "GPU {ordinal} memory as an RDMA write target of {dev}: the GPU neither orders inbound GPUDirect RDMA writes (GPU_DIRECT_RDMA_WRITES_ORDERING {} < {WRITES_ORDERING_OWNER}) nor can flush them (CAN_FLUSH_REMOTE_WRITES 0), so a stream or kernel could read the payload before it lands; receive into host memory (PinnedBuffer) and copy, or register this buffer without LOCAL_WRITE",
            caps.gpudirect_rdma_writes_ordering
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(flush: bool, ordering: i32) -> GpuCaps {
        GpuCaps {
            flush_remote_writes: flush,
            gpudirect_rdma_writes_ordering: ordering,
            ..Default::default()
        }
    }

    #[test]
    fn a_separate_payload_path_flushes_where_the_gpu_does_not_order_and_refuses_where_it_cannot() {
        use InboundWrites::*;
        // The H100/H200: ordering to the owner, no flush: nothing needed, nothing refused.
        assert_eq!(caps(false, 100).inbound_writes(true), InOrder);
        assert_eq!(caps(true, 200).inbound_writes(true), InOrder);
        assert_eq!(caps(true, 0).inbound_writes(true), Flush);
        assert_eq!(caps(false, 0).inbound_writes(true), Unordered);
        assert!(refuse_write_target(&caps(false, 100), 0, "mlx5_0").is_none());
        assert!(refuse_write_target(&caps(true, 0), 0, "mlx5_0").is_none());
        let e = refuse_write_target(&caps(false, 0), 1, "mlx5_0")
            .unwrap()
            .to_string();
        assert!(
            e.contains("GPU 1") && e.contains("mlx5_0") && e.contains("host memory"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(caps(false, 100).inbound_line().starts_with("not needed"));
        assert!(caps(false, 100).inbound_line().contains("100"));
    }

    #[test]
    fn the_soft_device_never_needs_a_flush() {
        for flush in [false, true] {
            for ordering in [0, 100, 200] {
                assert_eq!(
                    caps(flush, ordering).inbound_writes(false),
                    InboundWrites::InOrder
                );
            }
        }
        let soft = crate::Device::soft().unwrap();
        assert!(!soft.query().gpu_writes_separate);
    }
}
