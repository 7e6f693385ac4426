//! # mp: LibMP-style messaging on gdsync
//!
//! A communicator ([`Comm`]) of N ranks with one RC connection per peer, over any
//! [`bootstrap::Bootstrap`] (threads of one process, TCP between processes). Point-to-point
//! sends and receives match per peer in order (FIFO, no tags); receives give the sender a
//! credit (an RDMA write into its control word), and sends go out only against a credit, so
//! a send never meets an empty receive queue. Every operation has a CPU form and an "on
//! executor" form (a CUDA stream, or a host stream): the executor waits for the credit, rings
//! the doorbell and waits for the completion, with no CPU in the loop. One-sided windows give
//! put, get and put-with-signal; barriers run on the CPU or on an executor. Kernel channels
//! ([`Comm::kernel_channels`]) give a persistent GPU kernel its own connection per peer, on
//! which it sends and receives any number of messages by itself (`gds_peer_send`, ...), and
//! puts into and gets from windows ([`Window::for_kernels`], `gds_peer_put`, `gds_peer_get`).
//!
//! ```
//! use mp::{bootstrap::ThreadBootstrap, Comm};
//! use gdsync::Device;
//! # fn main() -> gdsync::Result<()> {
//! let dev = Device::soft()?;
//! let handles: Vec<_> = ThreadBootstrap::group(2)
//!     .into_iter()
//!     .map(|b| {
//!         let dev = dev.clone();
//!         std::thread::spawn(move || -> gdsync::Result<u8> {
//!             let mut comm = Comm::new(Box::new(b), &dev)?;
//!             let mut buf = vec![comm.rank() as u8 + 40; 64];
//!             let mr = comm.register(&mut buf)?;
//!             let peer = 1 - comm.rank();
//!             let r = if comm.rank() == 0 { comm.isend(mr.sge(..), peer)? } else { comm.irecv(mr.sge(..), peer)? };
//!             comm.wait(r)?;
//!             let mut b = [0u8; 1];
//!             mr.read_at(0, &mut b);
//!             Ok(b[0])
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap()?, 40);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod bootstrap;
#[cfg(feature = "mpi")]
pub use mpi as mpi_crate;
mod comm;
mod fault;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod kernel;
mod kernel_staging;
mod kernel_window;
mod registry;
mod staged;
mod window;

pub use comm::{Comm, Request};
pub use gdsync::kernel::{PeerDesc, PeerState};
pub use kernel::KernelChannels;
pub use kernel_staging::{KernelStaging, MAX_KERNEL_BOUNCE};
pub use kernel_window::KernelWindow;
pub use registry::RegCacheStats;
pub use staged::{GpuRegion, GpuSlice};
pub use window::Window;
