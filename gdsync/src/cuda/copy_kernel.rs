//! Staged copies on a stream as a small kernel rather than the copy engines.
//!
//! A stream's copy ([`Op::Copy`](crate::ops::Op::Copy): a staged payload between GPU memory
//! and a pinned bounce) runs as a small kernel on the stream: cheaper than a copy-engine
//! launch for the sizes messages have (on an H200 machine, a staged ping-pong on a stream took
//! 16.3 µs at 8 B with the kernel against 22.2 µs with `cuMemcpyAsync`, and 226 against
//! 248 µs at 1 MiB), and it runs on the stream's own hardware queue, where its waits already
//! are, instead of a copy-engine queue the driver may share between streams (CUDA does not
//! see a memory wait's dependency, so a copy parked behind one stream's wait could hold up
//! another stream's). The kernel is compiled where bounces are made
//! ([`prepare_staged_copies`]), never at a copy: loading a module may wait for the GPU to go
//! idle, which a stream blocked in a wait never does. `GDSYNC_STAGING_COPY=engine` goes back
//! to `cuMemcpyAsync`, and without NVRTC the copy engines are used (the log says so).

use super::{Cuda, CudaStream, Function, MemoryKind};
use crate::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernel: 16-byte loads and stores where source and destination share their alignment
/// mod 16, bytes otherwise. Loads bypass the caches (`__ldcv`): a bounce is rewritten by the
/// NIC between copies, which the GPU's caches do not see. A copy into a bounce (`system`)
/// ends with a system-wide fence, which makes the stores visible to the NIC before the
/// stream's next operation (a doorbell) runs; a copy into this GPU's memory, which the NIC
/// never reads on the staged path, fences at GPU scope (the system-wide fence would wait for
/// a PCIe round trip on the message's path).
const SOURCE: &str = r#"
extern "C" __global__ void gdsync_staged_copy(unsigned char *dst, const unsigned char *src,
                                              unsigned long long len, unsigned int system) {
    unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long d = (unsigned long long)dst, s = (unsigned long long)src;
    unsigned long long head = len, words = 0;
    if (((d ^ s) & 15) == 0) {
        head = (16 - (d & 15)) & 15;
        if (head > len) head = len;
        words = (len - head) / 16;
    }
    for (unsigned long long i = t; i < head; i += step) dst[i] = __ldcv(src + i);
    uint4 *d4 = (uint4 *)(dst + head);
    const uint4 *s4 = (const uint4 *)(src + head);
    for (unsigned long long i = t; i < words; i += step) d4[i] = __ldcv(s4 + i);
    for (unsigned long long i = head + words * 16 + t; i < len; i += step) dst[i] = __ldcv(src + i);
    if (system) __threadfence_system();
    else __threadfence();
}
"#;

/// Threads per block, and bytes each thread moves per grid step.
const BLOCK: u32 = 256;
const BYTES_PER_THREAD: u64 = 16;
/// Most blocks a copy launches: enough 16-byte requests in flight to fill PCIe, few enough to
/// leave the GPU to other work.
const MAX_GRID: u64 = 128;

/// Which copier staged copies use (`GDSYNC_STAGING_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagingCopy {
    /// A kernel on the stream (the default where NVRTC is installed).
    Kernel,
    /// `cuMemcpyAsync` (the copy engines).
    Engine,
}

impl StagingCopy {
    /// `GDSYNC_STAGING_COPY` (`kernel` | `engine`); unset: the kernel.
    pub fn from_env() -> Result<StagingCopy> {
        Ok(
            match crate::env::choice("GDSYNC_STAGING_COPY", &["kernel", "engine"])? {
                Some("engine") => StagingCopy::Engine,
                _ => StagingCopy::Kernel,
            },
        )
    }
}

/// The copy kernel of each GPU that [`prepare_staged_copies`] compiled; `None` where it
/// could not (no NVRTC, a compile error: logged) or where the copy engines were asked for.
fn kernels() -> &'static Mutex<HashMap<i32, Option<Function>>> {
    static KERNELS: OnceLock<Mutex<HashMap<i32, Option<Function>>>> = OnceLock::new();
    KERNELS.get_or_init(Default::default)
}

/// Compiles and loads the staged-copy kernel on every GPU of `cuda` that has none yet.
/// Call it where staging bounces are made, before any stream waits: loading a module may
/// wait for the GPU to go idle, which a stream blocked in a memory wait never does.
pub fn prepare_staged_copies(cuda: &Arc<Cuda>) {
    for ordinal in 0..cuda.gpus.len() as i32 {
        let known = kernels().lock().map_or(true, |k| k.contains_key(&ordinal));
        if known {
            continue;
        }
        // Compiled outside the lock: a copy on another thread never waits for a compile.
        let f = compile(cuda, ordinal);
        if let Ok(mut k) = kernels().lock() {
            k.entry(ordinal).or_insert(f);
        }
    }
}

fn compile(cuda: &Arc<Cuda>, ordinal: i32) -> Option<Function> {
    match StagingCopy::from_env() {
        Ok(StagingCopy::Engine) => return None,
        Ok(StagingCopy::Kernel) => {}
        Err(e) => {
            tracing::warn!("{e}; staged copies use the copy engines");
            return None;
        }
    }
    let made = cuda
        .compile(ordinal, SOURCE, &[])
        .and_then(|m| m.function("gdsync_staged_copy"));
    match made {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!("GPU {ordinal}: staged copies use the copy engines, whose queues streams may share (a copy behind one stream's wait can then hold up another's): {e}");
            None
        }
    }
}

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
        let into = self.cuda().memory_kind(dst);
        if !self.kernel_reaches(into) || !self.kernel_reaches(self.cuda().memory_kind(src)) {
            return Ok(false);
        }
        // Into this GPU's own memory: no system-wide fence (see SOURCE).
        let system = u32::from(!matches!(into, MemoryKind::Device { .. }));
        let f = kernels()
            .lock()
            .ok()
            .and_then(|k| k.get(&self.ordinal()).cloned().flatten());
        let Some(f) = f else {
            return Ok(false);
        };
        let mut args = f.launch_builder(self);
        args.arg(&dst).arg(&src).arg(&len).arg(&system);
        // SAFETY: four parameters of the kernel's types (two pointers as 64-bit GPU
        // addresses, a length, a flag); the list that named the copy keeps both ranges alive
        // until the stream has passed it.
        unsafe { args.launch(grid(len), BLOCK) }?;
        Ok(true)
    }

    /// Whether a kernel on this stream's GPU may dereference memory of `kind`: pinned host memory
    /// mapped for the GPUs, managed memory, or this GPU's own memory. Anything else (pageable
    /// host memory, another GPU's memory) goes to the copy engines, which reach it where a
    /// kernel would fault and poison the context.
    fn kernel_reaches(&self, kind: MemoryKind) -> bool {
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

    #[test]
    fn the_variable_takes_kernel_or_engine() {
        let v = |s| crate::env::choice_of("GDSYNC_STAGING_COPY", Some(s), &["kernel", "engine"]);
        assert_eq!(v("engine").unwrap(), Some("engine"));
        let e = v("dma").unwrap_err().to_string();
        assert!(
            e.contains("GDSYNC_STAGING_COPY") && e.contains("kernel or engine"),
            "{e}"
        );
    }
}
