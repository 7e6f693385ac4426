//! Two buffers in a shared-memory file, for `--raw --ranks-as procs`.

use super::raw::SharedBuf;
use anyhow::{Context, Result};
use gdasync::gdsync::SharedMemory;
use std::sync::Arc;

/// Two buffers of `n` bytes in a shared-memory file: rank 0 creates it, rank 1 maps it.
pub(crate) fn shm_bufs(path: &str, n: usize, create: bool) -> Result<(SharedBuf, SharedBuf)> {
    let len = n
        .max(64)
        .checked_next_multiple_of(4096)
        .and_then(|half| half.checked_mul(2))
        .with_context(|| format!("two buffers of {n} bytes do not fit in memory"))?;
    let mem = if create {
        SharedMemory::create(path, len)?
    } else {
        SharedMemory::open(path, len)?
            .with_context(|| format!("{path} is missing or not {len} bytes"))?
    };
    let p = mem.as_ptr();
    let keep: Arc<dyn Send + Sync> = Arc::new(mem);
    let half = len / 2;
    let a = SharedBuf {
        ptr: p,
        len: half,
        _keep: keep.clone(),
    };
    // SAFETY: the second half of the mapping.
    let b = SharedBuf {
        ptr: unsafe { p.add(half) },
        len: half,
        _keep: keep,
    };
    Ok((a, b))
}
