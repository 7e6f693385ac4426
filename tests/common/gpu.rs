//! GPU-test helpers: the gate every GPU test calls first (a usable GPU, then the GPU lock), and
//! buffers in host (pinned) or device memory.
//!
//! GPU tests are marked `#[ignore = "needs a CUDA GPU: …"]`, so on a machine without one the
//! test runner counts them as ignored; `-- --include-ignored` (or `--ignored`) runs them, and
//! then [`gpu`] fails the test unless a GPU is usable. `.ci/check-test-counts` checks both:
//! every GPU test is ignored without a GPU, and fails (rather than passing) when it is run
//! with CUDA switched off.

use gdasync::gdsync::cuda::{Cuda, DeviceBuffer};
use gdasync::gdsync::{Access, MemoryRegion, PinnedBuffer, ProtectionDomain};

/// The environment that switches CUDA off in an example, so that a test of what happens
/// without a GPU runs on machines with one too.
pub const NO_CUDA: (&str, &str) = ("GDSYNC_CUDA", "off");

/// One GPU test at a time: a persistent kernel waiting on the host blocks CUDA's implicitly
/// synchronising calls (freeing or registering memory) in every other thread of the process
/// until it ends, so concurrent tests could wait on each other forever.
static GPU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The GPU lock, once CUDA is known to be usable with at least one GPU; panics, saying why,
/// where it is not (a GPU test that runs must run on a GPU).
pub fn gpu() -> std::sync::MutexGuard<'static, ()> {
    match Cuda::get() {
        Ok(c) if !c.gpus.is_empty() => {}
        Ok(_) => panic!("this GPU test needs a CUDA GPU: the driver reports none"),
        Err(e) => panic!("this GPU test needs a CUDA GPU: {e}"),
    }
    GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer in host (pinned) or device memory, registered.
pub enum Buf {
    Host(PinnedBuffer),
    Dev(DeviceBuffer),
}

impl Buf {
    pub fn new(device: bool, len: usize) -> Buf {
        if device {
            Buf::Dev(DeviceBuffer::alloc(0, len).unwrap())
        } else {
            Buf::Host(PinnedBuffer::new(len))
        }
    }
    pub fn register<'a>(&'a self, pd: &ProtectionDomain) -> MemoryRegion<'a> {
        match self {
            Buf::Host(b) => pd.register_pinned(b, Access::ALL).unwrap(),
            Buf::Dev(b) => pd.register_device(b, Access::ALL).unwrap(),
        }
    }
    /// The address kernels use (host and device memory alike: unified addressing).
    pub fn addr(&self) -> u64 {
        match self {
            Buf::Host(b) => b.addr(),
            Buf::Dev(b) => b.ptr(),
        }
    }
}
