//! The mlx5 backend's control path: rdma-core (libibverbs and libmlx5) loaded at run time, in
//! three layers as the CUDA bindings are: `sys` (the FFI bindgen generated from rdma-core's
//! headers), the loaded libraries ([`Rdma`]), and safe RAII types over them — device list,
//! [`Context`] (query device, port, GID table), [`Pd`], [`Mr`], [`Cq`] and [`Qp`] created with
//! `mlx5dv_create_qp`, whose rings, doorbell records and BlueFlame register `mlx5dv_init_obj`
//! hands out, and whose state `ibv_query_qp` reports; the device's asynchronous events
//! ([`AsyncEvent`]: ports going down and up, fatal QP errors). On top, the provider that lets
//! gdsync's queues run on an mlx5 port (`Device::open("mlx5_0")`, opened by device
//! selection). It knows rdma-core and the provider interface only: libmlx5's own posting of
//! gdsync's work requests (`Qp::verbs_post_send`, against which gdsync's WQE writer is
//! checked) is glue beside it (`device/verbs_wr.rs`), and the emulated driver's HCA is the
//! soft device's (`device/soft/emulated.rs`).
//!
//! Nothing here needs rdma-core to build: without the libraries, or without a device, every
//! entry point returns an [`RdmaError`] that says what is missing and what to install.
//! Objects are destroyed in the order verbs requires (a QP before its CQs and PD, an MR before
//! its PD, everything before the context) because each holds the objects it was made from.

mod caller_rings;
mod context;
mod cq;
mod error;
mod event;
mod event_watch;
mod gid;
mod loader;
mod pd;
mod port;
mod provider;
mod qp;
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    missing_docs
)]
pub(crate) mod sys;

pub use caller_rings::CallerRings;
/// The former name of [`CallerRings`].
#[doc(hidden)]
pub use caller_rings::CallerRings as Placement;
pub use context::{devices, Context, DeviceLimits, RdmaDeviceInfo};
pub use cq::{Cq, CqRing};
pub use error::RdmaError;
pub use event::AsyncEvent;
pub use gid::{choose_gid, Gid, GidChoice, GidEntry, GidType};
pub use loader::Rdma;
pub use pd::{Mr, Pd};
pub use port::{LinkLayer, PortInfo, PortState};
pub use provider::GID_INDEX_VAR;
pub(crate) use provider::{open as open_provider, UarPages};
pub use qp::{
    Qp, QpAttr, QpCaps, QpRings, QpState, RemoteQp, RtrAttr, RtsAttr, GDSYNC_ATOMIC_OPS,
    GDSYNC_SEND_OPS,
};

/// Result of the mlx5 control path.
pub type RdmaResult<T> = std::result::Result<T, RdmaError>;

#[cfg(test)]
mod layout_tests;
