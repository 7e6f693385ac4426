//! Staged copies on a stream as a small kernel rather than the copy engines.
//!
//! A stream's copy ([`Op::Copy`](crate::ops::Op::Copy): a staged payload between GPU memory
//! and a pinned bounce) that does not run inside a list kernel (`list_kernel.rs`) runs as a
//! small kernel on the stream (`gdsync_staged_copy`, `staging_kernels.rs`): cheaper than a
//! copy-engine launch for the sizes messages have (on an H200 machine, a staged ping-pong on
//! a stream took 16.3 µs at 8 B with the kernel against 22.2 µs with `cuMemcpyAsync`, and 226
//! against 248 µs at 1 MiB), and it runs on the stream's own hardware queue, where its waits
//! already are, instead of a copy-engine queue the driver may share between streams (CUDA
//! does not see a memory wait's dependency, so a copy parked behind one stream's wait could
//! hold up another stream's).

use super::staging_kernels::staging_kernels;
use super::{CudaStream, MemoryKind};
use crate::Result;

/// Threads per block, and bytes each thread moves per grid step.
const BLOCK: u32 = 256;
const BYTES_PER_THREAD: u64 = 16;
/// Most blocks a copy launches: enough 16-byte requests in flight to fill PCIe, few enough to
/// leave the GPU to other work.
const MAX_GRID: u64 = 128;

/// The grid for `len` bytes.
fn grid(len: u64) -> u32 {
    len.div_ceil(u64::from(BLOCK) * BYTES_PER_THREAD)
        .clamp(1, MAX_GRID) as u32
}

impl CudaStream {
    /// Enqueues the copy of `len` bytes from GPU address `src` to `dst` as the copy kernel,
    /// if [`prepare_staged_copies`] made one for this GPU; `Ok(false)` if not (the caller
    /// uses the copy engines). Never compiles here: the stream's GPU may be blocked in a wait.
    pub(super) fn copy_by_kernel(&self, dst: u64, src: u64, len: u64) -> Result<bool> {
        let Some(system) = self.kernel_copy_fence(dst, src) else {
            return Ok(false);
        };
        let Some(k) = staging_kernels(self.ordinal()) else {
            return Ok(false);
        };
        let mut args = k.copy.launch_builder(self);
        args.arg(&dst).arg(&src).arg(&len).arg(&system);
        // SAFETY: four parameters of the kernel's types (two pointers as 64-bit GPU
        // addresses, a length, a flag); the list that named the copy keeps both ranges alive
        // until the stream has passed it.
        unsafe { args.launch(grid(len), BLOCK) }?;
        Ok(true)
    }

    /// For a kernel's copy from GPU address `src` to `dst`: `None` where a kernel on this
    /// stream's GPU cannot reach both, else the fence that ends it: 1, system-wide, into memory
    /// the NIC reads (a bounce); 0, GPU-wide, into this GPU's own memory, which the NIC never
    /// reads on the staged path (see the kernels' source).
    pub(super) fn kernel_copy_fence(&self, dst: u64, src: u64) -> Option<u32> {
        let into = self.cuda().memory_kind(dst);
        let reach = self.kernel_reaches(into) && self.kernel_reaches(self.cuda().memory_kind(src));
        reach.then(|| u32::from(!matches!(into, MemoryKind::Device { .. })))
    }

    /// Whether a kernel on this stream's GPU may dereference memory of `kind`: pinned host memory
    /// mapped for the GPUs, managed memory, or this GPU's own memory. Anything else (pageable
    /// host memory, another GPU's memory) goes to the copy engines, which reach it where a
    /// kernel would fault and poison the context.
    pub(super) fn kernel_reaches(&self, kind: MemoryKind) -> bool {
        match kind {
            MemoryKind::PinnedHost | MemoryKind::Managed => true,
            MemoryKind::Device { ordinal } => ordinal == self.ordinal(),
            MemoryKind::Host => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_grows_with_the_copy_and_stops_at_its_bound() {
        assert_eq!(grid(1), 1);
        assert_eq!(grid(4096), 1);
        assert_eq!(grid(4097), 2);
        assert_eq!(grid(1 << 30), MAX_GRID as u32);
    }
}
