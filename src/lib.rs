//! gdasync: GPUDirect Async in Rust.
//!
//! This facade re-exports the crates of the workspace:
//! - [`gdsync`]: formats, devices (the soft device), queues, memory regions and executors.
//! - [`mp`]: the messaging layer (communicator, bootstraps, point-to-point, one-sided).
pub use gdsync;
pub use mp;

/// The README's code blocks, compiled and run as doc-tests (`cargo test --doc`) so that the
/// first example a user copies keeps working. Not part of the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
