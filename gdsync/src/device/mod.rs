//! Devices: the NIC below the queues, behind the provider interface ([`provider`]) the
//! queue layer speaks: the soft device, a software model of the mlx5 RC data path (see
//! `docs/soft-device.md`), and an mlx5 port driven by rdma-core's libmlx5 ([`mlx5`], see
//! `docs/hardware.md`).

mod attr;
mod endpoint;
pub mod mlx5;
pub(crate) mod provider;
mod select;
pub(crate) mod soft;
mod verbs_wr;

pub(crate) use attr::{rnr_delay, transport_timeout};
pub use attr::{DeviceAttr, LinkLayer, PortAttr, PortState};
pub use endpoint::{Endpoint, LinkKind, LinkPolicy, PortAddress};
pub use provider::{Access, MAX_MESSAGE, MAX_SGE};
pub use select::{DeviceName, DeviceSelection, DEVICE_VAR};
pub use soft::{
    accept_tcp_links, host_id, progress, progress_mode, progress_mode_for, ProgressMode,
};
pub use verbs_wr::VerbsCompletion;

/// A short description of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// The unique id used in endpoints.
    pub uid: u64,
}
