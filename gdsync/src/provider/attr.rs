//! What a device can do, in the shape of `ibv_query_device` and `ibv_query_port`: the limits
//! its queues enforce and the state of its port. The numbers are the ones the soft device and
//! [`QpConfig`](crate::QpConfig) validation check, so a configuration within them is accepted.
//! Beside them, the IB encodings of a QP's timers (the tables both providers read).

use std::time::Duration;

/// Device-wide limits (as `ibv_device_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Most queue pairs on the device (`max_qp`).
    pub max_qp: u32,
    /// Most work requests in a send queue (counted in 64-byte WQEBBs) or a receive queue
    /// (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Most scatter/gather entries in one work request (`max_sge`).
    pub max_sge: u32,
    /// Most entries in one completion queue (`max_cqe`).
    pub max_cqe: u32,
    /// Most bytes of inline payload in one send; each QP sets its own up to this
    /// (`QpConfig::max_inline`; in verbs a QP capability, `max_inline_data`).
    pub max_inline_data: u32,
    /// Number of ports (`phys_port_cnt`).
    pub phys_port_cnt: u8,
    /// The device executes atomics (compare-and-swap, fetch-and-add): verbs' `atomic_cap`
    /// is not `IBV_ATOMIC_NONE`. Without them, atomic work requests are refused.
    pub atomics: bool,
    /// The device allocates its queues' rings and doorbell records itself (libmlx5 does):
    /// creating a queue hands it no ring memory, and the queue uses the device's. Otherwise
    /// (the soft device) the queue layer allocates them and hands them over.
    pub owns_rings: bool,
    /// Payloads the device writes into GPU memory travel a different path from its
    /// completions (a ConnectX: PCIe peer-to-peer writes to the GPU, CQEs to host memory), so
    /// a GPU that sees a completion may not see the payload yet unless it orders or flushes
    /// such writes (see [`GpuCaps::inbound_writes`](crate::cuda::GpuCaps::inbound_writes)).
    /// False where the device copies a payload before it writes the completion (the soft
    /// device).
    pub gpu_writes_separate: bool,
}

/// A port's state (as `ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Up: the soft device's port is active as long as the device exists.
    Active,
    /// Not active (an RDMA port whose link is down or not yet configured).
    Down,
}

/// How a port's packets travel (as `ibv_port_attr::link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// The soft device's links: heap rings within a process, shared-memory rings between
    /// processes of a host, TCP between hosts (`GDSYNC_SOFT_LINK` chooses).
    Soft,
    /// InfiniBand: peers are addressed by LID.
    InfiniBand,
    /// Ethernet (RoCE v2): peers are addressed by GID.
    Ethernet,
}

/// A port's attributes (as `ibv_port_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Whether the port is up (`state`).
    pub state: PortState,
    /// Largest packet payload, in bytes (`max_mtu`).
    pub max_mtu: u32,
    /// Packet payload in use, in bytes (`active_mtu`).
    pub active_mtu: u32,
    /// Largest message, in bytes (`max_msg_sz`).
    pub max_msg_sz: u64,
    /// How packets travel (`link_layer`).
    pub link_layer: LinkLayer,
}

/// The IB transport timeout `4.096 us * 2^t`; 0 means none, served as an hour.
pub(crate) fn transport_timeout(t: u8) -> Duration {
    match t {
        0 => Duration::from_secs(3600),
        t => Duration::from_nanos(4096u64 << t.min(31)),
    }
}

/// The IB RNR NAK timer encoding (`min_rnr_timer`), in microseconds: 0 is 655.36 ms, then
/// 0.01 ms up to 491.52 ms.
pub(crate) fn rnr_delay(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(US[code as usize % 32].into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_timer_encodings() {
        assert_eq!(transport_timeout(14), Duration::from_nanos(4096 << 14));
        assert_eq!(transport_timeout(0), Duration::from_secs(3600));
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
    }
}
