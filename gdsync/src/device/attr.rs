//! What a device can do, in the shape of `ibv_query_device` and `ibv_query_port`: the limits
//! its queues enforce and the state of its port. The numbers are the ones the soft device and
//! [`QpConfig`](crate::QpConfig) validation check, so a configuration within them is accepted.

use super::{soft, Device};
use crate::format::{MAX_WQE_DS, SEG_SIZE};
use crate::qp::{MAX_MESSAGE, MAX_SGE};
use crate::{Error, Result};

/// Most work requests in one send queue (in 64-byte WQEBBs) or receive queue.
const MAX_QP_WR: u32 = 1 << 15;
/// Most entries in one completion queue.
const MAX_CQE: u32 = 1 << 22;

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
}

/// A port's state (as `ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Up: the soft device's port is active as long as the device exists.
    Active,
}

/// How a port's packets travel (as `ibv_port_attr::link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// The soft device's links: heap rings within a process, shared-memory rings between
    /// processes of a host, TCP between hosts (`GDSYNC_SOFT_LINK` chooses).
    Soft,
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

impl Device {
    /// The device's limits (`ibv_query_device`).
    pub fn query(&self) -> DeviceAttr {
        DeviceAttr {
            max_qp: soft::MAX_QPS,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE as u32,
            max_cqe: MAX_CQE,
            // A control segment, a remote-address segment and the inline header (4 bytes)
            // share a WQE's data segments with the payload.
            max_inline_data: (MAX_WQE_DS * SEG_SIZE - 2 * SEG_SIZE - 4) as u32,
            phys_port_cnt: 1,
        }
    }

    /// Port `port`'s attributes (`ibv_query_port`; ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::invalid(format!(
                "port {port}: the soft device has one port, port 1"
            )));
        }
        // The MTU a link's peers agree on (the TCP link's hello carries it).
        let mtu = soft::tcp::Hello::new(0, 0, 0, 0).mtu;
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: mtu,
            active_mtu: mtu,
            max_msg_sz: MAX_MESSAGE,
            link_layer: LinkLayer::Soft,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QpConfig;

    #[test]
    fn the_limits_are_the_ones_queue_creation_enforces() {
        let dev = Device::soft().unwrap();
        let a = dev.query();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let qp = |cfg: QpConfig| pd.create_qp(&cq, &cq, &cfg);
        let at_limit = QpConfig {
            send_wqebbs: a.max_qp_wr,
            recv_wqes: a.max_qp_wr,
            max_recv_sge: a.max_sge,
            max_inline: a.max_inline_data,
            ..QpConfig::default()
        };
        assert!(qp(at_limit.clone()).is_ok());
        for over in [
            QpConfig {
                send_wqebbs: a.max_qp_wr + 1,
                ..at_limit.clone()
            },
            QpConfig {
                recv_wqes: a.max_qp_wr + 1,
                ..at_limit.clone()
            },
            QpConfig {
                max_recv_sge: a.max_sge + 1,
                ..at_limit.clone()
            },
            QpConfig {
                max_inline: a.max_inline_data + 1,
                ..at_limit.clone()
            },
        ] {
            assert!(qp(over.clone()).is_err(), "{over:?}");
        }
        assert!(dev.create_cq(a.max_cqe + 1).is_err());
        assert_eq!(a.max_qp, soft::MAX_QPS);
    }

    #[test]
    fn one_active_port() {
        let dev = Device::soft().unwrap();
        let p = dev.query_port(1).unwrap();
        assert_eq!(p.state, PortState::Active);
        assert!(p.active_mtu > 0 && p.active_mtu == p.max_mtu);
        assert_eq!(p.max_msg_sz, MAX_MESSAGE);
        assert!(dev.query_port(0).is_err() && dev.query_port(2).is_err());
    }
}
