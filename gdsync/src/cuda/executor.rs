//! A CUDA stream as an executor: op lists submitted to it run when the stream gets there.
//! (Here rather than in `exec/`, so the executors' room names no CUDA glue.)
//!
//! A list with copies ([`Op::Copy`]: staged payloads) runs as one kernel where it can
//! (`list_kernel.rs`), else as batches of memory operations with copies between them (a copy
//! kernel, or the copy engines: `copy_kernel.rs`), all on the stream, so a copy runs after
//! the waits before it and before the doorbell after it. A list without copies runs as the
//! kernel too while the process has streams on several GPUs (`GDSYNC_LIST_KERNEL=auto`, the
//! default), or always with `all` ([`ListKernel`](super::ListKernel)); else as one batch.

use super::{check, CudaStream};
use crate::exec::Executor;
use crate::mem::gpu_addr_in;
use crate::ops::{Op, Ops};
use crate::Result;
use cudarc::driver::sys;

impl Executor for CudaStream {
    fn submit(&self, ops: Ops) -> Result<()> {
        let copies = ops.as_slice().iter().any(Op::is_copy);
        if !copies && !self.list_kernel().copy_free_lists() {
            return self.enqueue(ops);
        }
        let Err(ops) = self.run_list_by_kernel(ops)? else {
            return Ok(());
        };
        if !copies {
            return self.enqueue(ops);
        }
        let parts = ops.split_at_copies();
        for part in parts {
            match part {
                Ok(run) => self.enqueue(run)?,
                Err(Op::Copy { dst, src, len }) => self.copy_async(
                    gpu_addr_in(ops.kept(), dst),
                    gpu_addr_in(ops.kept(), src),
                    len,
                )?,
                Err(_) => unreachable!("split_at_copies cuts at copies only"),
            }
        }
        if ops.as_slice().last().is_some_and(Op::is_copy) {
            // The memory of a trailing copy stays alive until the stream has passed it: a
            // barrier behind it holds the list until the stream marks it done.
            self.enqueue(keep_with_barrier(&ops))?;
        }
        Ok(())
    }
}

/// A list of one barrier keeping everything `ops` keeps alive.
fn keep_with_barrier(ops: &Ops) -> Ops {
    let mut b = Ops::barrier();
    for k in ops.kept() {
        b.hold(k.clone());
    }
    b
}

impl CudaStream {
    /// Enqueues a copy of `len` bytes from GPU address `src` to `dst` on the stream (unified
    /// addressing: device memory or pinned host memory mapped for the GPUs): the copy kernel
    /// where the GPU has one (see `copy_kernel.rs` for why), else the copy engines.
    fn copy_async(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        if len == 0 || self.copy_by_kernel(dst, src, len)? {
            return Ok(());
        }
        self.cuda().bind(self.ordinal())?;
        let _open = crate::quiet::enqueuing();
        // SAFETY: the list that named the copy keeps both sides alive until the stream has
        // passed it (a later list of the same submission holds them); the addresses are what
        // the GPU uses for that memory.
        let r = unsafe {
            sys::cuMemcpyAsync(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                len as usize,
                self.raw(),
            )
        };
        check(r, "cuMemcpyAsync")
    }
}
