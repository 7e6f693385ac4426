//! `--raw`: the NIC replaced by stores into the peer's buffer, the same loop's floor.

use super::wire::{marker, relax, Wire};
use anyhow::{bail, Result};
use std::sync::atomic::{fence, AtomicU8, Ordering};
use std::sync::Arc;

pub(crate) struct Raw {
    local: SharedBuf,
    peer: SharedBuf,
    src: Vec<u8>,
}

impl Raw {
    /// A rank that polls `local` and stores into `peer`; messages up to `max` bytes.
    pub(crate) fn new(local: SharedBuf, peer: SharedBuf, max: usize) -> Raw {
        Raw {
            local,
            peer,
            src: vec![0; max.max(64)],
        }
    }
}

/// Memory both ranks reach: a heap buffer (threads) or a shared mapping (processes).
#[derive(Clone)]
pub(crate) struct SharedBuf {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) _keep: Arc<dyn Send + Sync>,
}
// SAFETY: the pointer refers to memory kept alive by `_keep`; accesses are byte-wise volatile
// or bulk copies ordered by fences, as a NIC's DMA would be.
unsafe impl Send for SharedBuf {}

impl SharedBuf {
    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len);
        // SAFETY: in bounds; AtomicU8 has alignment 1.
        unsafe { &*(self.ptr.add(off) as *const AtomicU8) }
    }
    fn copy_in(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        // SAFETY: in bounds; the source is a private Vec.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, src.len()) }
    }
}

impl Wire for Raw {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if size == 0 || size > self.src.len().min(self.peer.len) {
            bail!(
                "--raw sends 1 to {} bytes, not {size}",
                self.src.len().min(self.peer.len)
            );
        }
        self.src[size - 1] = marker(i);
        self.peer.copy_in(&self.src[..size - 1]);
        fence(Ordering::Release);
        self.peer.byte(size - 1).store(marker(i), Ordering::Release);
        Ok(())
    }
    fn wait(&mut self, i: u64, size: usize) -> Result<()> {
        if size == 0 || size > self.local.len {
            bail!("--raw waits for 1 to {} bytes, not {size}", self.local.len);
        }
        let m = marker(i);
        let mut spins = 0u32;
        while self.local.byte(size - 1).load(Ordering::Acquire) != m {
            spins += 1;
            relax(spins);
        }
        Ok(())
    }
    fn reset(&mut self, size: usize) -> Result<()> {
        for o in 0..size {
            self.local.byte(o).store(0, Ordering::Relaxed);
        }
        Ok(())
    }
}

struct HeapBuf(#[allow(dead_code)] Box<[u8]>);

/// A zeroed heap buffer of at least `n` bytes, for two thread ranks.
pub(crate) fn heap_buf(n: usize) -> SharedBuf {
    let mut b = vec![0u8; n.max(64)].into_boxed_slice();
    let ptr = b.as_mut_ptr();
    let len = b.len();
    SharedBuf {
        ptr,
        len,
        _keep: Arc::new(std::sync::Mutex::new(HeapBuf(b))),
    }
}
