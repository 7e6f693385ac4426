//! GPU-test helpers: the skip-unless-`GDSYNC_TEST_CUDA=1` gate with its lock, and buffers in
//! host (pinned) or device memory.

use gdasync::gdsync::cuda::{Cuda, DeviceBuffer};
use gdasync::gdsync::{Access, MemoryRegion, PinnedBuffer, ProtectionDomain};

/// One GPU test at a time: a persistent kernel waiting on the host blocks CUDA's implicitly
/// synchronising calls (freeing or registering memory) in every other thread of the process
/// until it ends, so concurrent tests could wait on each other forever.
static GPU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `None` (the test prints "skipped") unless `GDSYNC_TEST_CUDA=1`; then the GPU lock. With
/// the variable set, a machine without a usable GPU fails the test.
pub fn gpu(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if std::env::var("GDSYNC_TEST_CUDA").as_deref() != Ok("1") {
        eprintln!("{test}: skipped (set GDSYNC_TEST_CUDA=1 to run GPU tests)");
        return None;
    }
    let c = Cuda::get().expect("GDSYNC_TEST_CUDA=1 but CUDA is not usable");
    assert!(!c.gpus.is_empty(), "GDSYNC_TEST_CUDA=1 but no GPU");
    Some(GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner()))
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
