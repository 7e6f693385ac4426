//! Devices: the NIC below the queues, behind the provider interface
//! ([`crate::provider`]) the queue layer speaks: the soft device, a software model of the mlx5 RC data path (see
//! `docs/soft-device.md`), and an mlx5 port driven by rdma-core's libmlx5 ([`mlx5`], see
//! `docs/hardware.md`).

pub mod mlx5;
mod select;
pub(crate) mod soft;
mod verbs_wr;

pub use select::{DeviceName, DeviceSelection, DEVICE_VAR};
pub use soft::{
    accept_tcp_links, host_id, lend_thread, progress, progress_mode, progress_mode_for,
    soft_engines_report, soft_writes_taken_in, ProgressMode,
};
pub use verbs_wr::VerbsCompletion;
