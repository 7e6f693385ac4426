//! `--raw`: the NIC replaced by stores into the peer's buffer, the same loop's floor.

use super::wire::{marker, spin, Wire};
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
// SAFETY: the pointer refers to memory kept alive by `_keep`; accesses are byte-wise atomics
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
            spin(spins);
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

/// A heap buffer owned through its raw pointer (both ranks write it through `SharedBuf`, so
/// no `Box` may claim it meanwhile); freed on drop.
struct HeapBuf {
    ptr: *mut [u8],
}
// SAFETY: plain bytes, accessed through atomics and fenced copies by the ranks.
unsafe impl Send for HeapBuf {}
// SAFETY: as above.
unsafe impl Sync for HeapBuf {}
impl Drop for HeapBuf {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in heap_buf, freed once.
        drop(unsafe { Box::from_raw(self.ptr) });
    }
}

/// Two ranks' raw wires in one process, each storing into the other's heap buffer.
pub(crate) fn heap_pair(max: usize) -> [Raw; 2] {
    let (a, b) = (heap_buf(max), heap_buf(max));
    [Raw::new(a.clone(), b.clone(), max), Raw::new(b, a, max)]
}

/// A zeroed heap buffer of at least `n` bytes, for two thread ranks.
fn heap_buf(n: usize) -> SharedBuf {
    let raw = Box::into_raw(vec![0u8; n.max(64)].into_boxed_slice());
    let len = raw.len();
    SharedBuf {
        ptr: raw as *mut u8,
        len,
        _keep: Arc::new(HeapBuf { ptr: raw }),
    }
}
