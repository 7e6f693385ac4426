//! What every example shares: the command-line vocabulary (value types, size and iteration
//! parsing), start-up (logging, errors, exit codes), output that ends quietly on a closed
//! pipe, JSON lines, run headers, the rule that marks a row noisy, progress on stderr and the
//! local process launcher, the RDMA devices rdma-core finds, queried once, and the GPUs each
//! rank runs on, and staged payloads (GPU memory or a host stand-in).
//!
//! Each example includes this module with `#[path]`; each uses a subset of it.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod cli;
pub mod device;
pub mod gpus;
pub mod header;
pub mod iters;
pub mod json;
pub mod launch;
pub mod log;
pub mod noise;
pub mod out;
pub mod payload;
pub mod progress;
pub mod rdma;
pub mod sizes;
pub mod stats;
pub mod tool;

pub use cli::{name, one_of, Mem, RanksAs, Staging, Trigger};
pub use device::DeviceArgs;
pub use gpus::GpuArgs;
pub use tool::ToolArgs;
