//! The soft device's limits and port, as `ibv_query_device` and `ibv_query_port` report
//! them: the numbers queue creation enforces.

use super::{tcp, MAX_QPS};
use crate::format::MAX_INLINE_DATA;
use crate::provider::{DeviceAttr, LinkLayer, PortAttr, PortState};
use crate::provider::{MAX_MESSAGE, MAX_SGE};
use crate::{Error, Result};

/// Most work requests in one send queue (in 64-byte WQEBBs) or receive queue.
const MAX_QP_WR: u32 = 1 << 15;
/// Most entries in one completion queue.
const MAX_CQE: u32 = 1 << 22;

/// The device's limits (`ibv_query_device`).
pub(crate) fn device_attr() -> DeviceAttr {
    DeviceAttr {
        max_qp: MAX_QPS,
        max_qp_wr: MAX_QP_WR,
        max_sge: MAX_SGE as u32,
        max_cqe: MAX_CQE,
        max_inline_data: MAX_INLINE_DATA as u32,
        phys_port_cnt: 1,
        atomics: true,
        owns_rings: false,
        // Payloads are copied (synchronously, also into GPU memory) before the CQE.
        gpu_writes_separate: false,
    }
}

/// Port `port`'s attributes (`ibv_query_port`; ports count from 1).
pub(crate) fn port_attr(port: u8) -> Result<PortAttr> {
    if port != 1 {
        return Err(Error::invalid(format!(
            "port {port}: the soft device has one port, port 1"
        )));
    }
    // The MTU a link's peers agree on (the TCP link's hello carries it).
    let mtu = tcp::Hello::new(0, 0, 0, 0).mtu;
    Ok(PortAttr {
        state: PortState::Active,
        max_mtu: mtu,
        active_mtu: mtu,
        max_msg_sz: MAX_MESSAGE,
        link_layer: LinkLayer::Soft,
    })
}
