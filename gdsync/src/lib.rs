//! # gdsync: GPUDirect Async core
//!
//! A CUDA stream, a GPU kernel or a CPU thread drives an RDMA queue pair by itself: the CPU
//! prepares work requests ahead of time (mlx5 WQEs written into the send ring), and whoever
//! holds the data rings the doorbell and waits for the completion entry.
//!
//! The one idea that ties the layers: ringing a doorbell and waiting for a completion are
//! short lists of memory operations ([`ops::Ops`]), run by an executor ([`exec`]). The device
//! below ([`Device`]) is the soft device: a software model of the mlx5 RC data path that reads
//! and writes the same bytes a ConnectX does.
//!
//! ```
//! use gdsync::{Access, Device, QpConfig, SendWr};
//! # fn main() -> Result<(), gdsync::Error> {
//! let dev = Device::soft()?;
//! let pd = dev.alloc_pd();
//! let cq = dev.create_cq(64)?;
//! let mut a = pd.create_qp(&cq, &cq, &QpConfig::default())?;
//! let mut b = pd.create_qp(&cq, &cq, &QpConfig::default())?;
//! a.connect(&b.endpoint())?;
//! b.connect(&a.endpoint())?;
//!
//! let mut src = vec![7u8; 64];
//! let mut dst = vec![0u8; 64];
//! let src_mr = pd.register(&mut src, Access::empty())?;
//! let dst_mr = pd.register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! a.post_send(&SendWr::write(dst_mr.remote().at(0)).sge(src_mr.sge(..)).wr_id(1))?;
//! let c = cq.wait_one(std::time::Duration::from_secs(5))?;
//! assert!(c.is_ok() && c.wr_id == 1);
//! let mut out = [0u8; 64];
//! dst_mr.read_at(0, &mut out);
//! assert_eq!(out, [7u8; 64]);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod auth;
mod backoff;
mod barrier;
mod bounds;
mod chunk_plan;
mod context;
mod cq;
pub mod cuda;
mod device;
pub mod env;
mod error;
pub mod exec;
mod failed_rings;
pub mod format;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod handler;
mod idle;
pub mod kernel;
mod kernel_header;
mod mem;
mod memlock;
mod mr;
mod nic;
pub mod ops;
pub mod probe;
mod provider;
mod qp;
mod quiet;
mod random;
pub mod release;
mod shm;
mod signal;
pub mod staging;
mod staging_choice;
mod wr;

pub use chunk_plan::{Chunk, ChunkPlan};
pub use cq::{Completion, CompletionOp, Cq, CqError, CqPoll, WcStatus, MAX_KEPT_ERRORS};
/// The mlx5 backend: rdma-core's libibverbs and libmlx5 loaded at run time, safe types over
/// them, and (with the `emulated-hca` feature, on by default) `serve_emulated_driver`
/// (`mlx5::serve_emulated_driver`), which makes this process's soft devices the HCA of the
/// emulated kernel driver it runs under.
pub mod mlx5 {
    #[doc(inline)]
    pub use crate::device::mlx5::*;
    #[cfg(feature = "emulated-hca")]
    pub use crate::device::soft::serve_emulated_driver;
    pub use crate::device::VerbsCompletion;
}
pub use device::{
    accept_tcp_links, host_id, lend_thread, progress, progress_mode, progress_mode_for,
    soft_engines_report, soft_writes_taken_in, DeviceName, DeviceSelection, ProgressMode,
    DEVICE_VAR,
};
pub use error::{Error, Result};
pub use handler::NicHandler;
pub use memlock::{memlock_limit, MemlockLimit};
pub use mr::{MemoryRegion, ProtectionDomain};
pub use nic::Device;
pub use provider::{
    Access, DeviceAttr, DeviceInfo, Endpoint, LinkKind, LinkLayer, LinkPolicy, PortAddress,
    PortAttr, PortState,
};
pub use qp::{
    CommitError, PreparedSend, Qp, QpConfig, QpState, RecvTicket, Ringers, SendBatch, SendTicket,
    IB_HOP_LIMIT_VAR, IB_SL_VAR, IB_TC_VAR,
};
pub use shm::SharedMemory;
pub use signal::{PinnedBuffer, SignalWords};
pub use staging_choice::{peer_memory_loaded, GpuMemoryPath};
pub use wr::{RecvWr, RemoteAddr, RemoteBuf, SendFlags, SendWr, Sge, WrOp};
