//! Two buffers in a shared-memory file, for `--raw --ranks-as procs`.

use super::raw::SharedBuf;
use anyhow::{bail, Result};
use std::sync::Arc;

struct ShmMap(*mut u8, usize);
// SAFETY: an mmap'd region, unmapped once on drop.
unsafe impl Send for ShmMap {}
// SAFETY: as above.
unsafe impl Sync for ShmMap {}
impl Drop for ShmMap {
    fn drop(&mut self) {
        // SAFETY: pointer and length came from mmap.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
    }
}

/// Two buffers of `n` bytes in a shared-memory file (for `--raw --ranks-as procs`).
pub(crate) fn shm_bufs(path: &str, n: usize, create: bool) -> Result<(SharedBuf, SharedBuf)> {
    use std::os::fd::AsRawFd;
    let len = 2 * n.max(64).next_multiple_of(4096);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)?;
    if create {
        f.set_len(len as u64)?;
    }
    // SAFETY: mapping a file we opened read-write with its full length.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        bail!("mmap {path}: {}", std::io::Error::last_os_error());
    }
    let keep: Arc<dyn Send + Sync> = Arc::new(ShmMap(p as *mut u8, len));
    let half = len / 2;
    let a = SharedBuf {
        ptr: p as *mut u8,
        len: half,
        _keep: keep.clone(),
    };
    // SAFETY: the second half of the mapping.
    let b = SharedBuf {
        ptr: unsafe { (p as *mut u8).add(half) },
        len: half,
        _keep: keep,
    };
    Ok((a, b))
}
