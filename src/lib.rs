//! gdasync: GPUDirect Async in Rust.
//!
//! This facade re-exports the crates of the workspace:
//! - [`gdsync`]: formats, devices (the soft device), queues, memory regions and executors.
//! - [`mp`]: the messaging layer (communicator, bootstraps, point-to-point, one-sided).
pub use gdsync;
pub use mp;
