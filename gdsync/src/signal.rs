//! Signal words: host memory that CPUs, streams and kernels use to signal each other.

use crate::cuda::Cuda;
use crate::mem::RingMem;
use crate::ops::{KeepAlive, Op, Ops, WaitCond};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// An array of 64-bit words in pinned, GPU-mapped host memory (when given a CUDA handle), for
/// `write_value` / `wait_value` on any executor. Word `i` can be used as a 32-bit word (its
/// low half) or a 64-bit word.
#[derive(Clone)]
pub struct SignalWords {
    mem: Arc<RingMem>,
    n: usize,
}

impl std::fmt::Debug for SignalWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalWords")
            .field("n", &self.n)
            .field("addr", &format_args!("{:#x}", self.addr(0)))
            .finish()
    }
}

impl SignalWords {
    /// `n` words, all zero, mapped for the GPUs of the process's default CUDA handle
    /// ([`Cuda::get`]) where it has any; [`SignalWords::with_cuda`] takes a handle of your own.
    pub fn new(n: usize) -> Self {
        Self::with_cuda(n, Cuda::default_gpus())
    }
    /// `n` words, all zero, mapped for the GPUs of `cuda` (`None`: host memory only).
    pub fn with_cuda(n: usize, cuda: Option<&Arc<Cuda>>) -> Self {
        let n = n.max(1);
        Self {
            mem: Arc::new(RingMem::new(n * 8, cuda)),
            n,
        }
    }
    /// Number of words.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Whether there are no words (never).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Host address of word `i` (what the CPU and the NIC use; op lists name the word by it).
    pub fn addr(&self, i: usize) -> u64 {
        assert!(i < self.n, "signal word {i} of {}", self.n);
        self.mem.addr(i * 8)
    }
    /// The GPUs' address of word `i`: what to hand a kernel (`cuMemHostGetDevicePointer` of
    /// the registration; the host address where the words are not mapped for GPUs).
    pub fn gpu_addr(&self, i: usize) -> u64 {
        assert!(i < self.n, "signal word {i} of {}", self.n);
        self.mem.gpu_addr(i * 8)
    }
    /// Loads word `i` as 32 bits.
    pub fn load32(&self, i: usize) -> u32 {
        self.addr(i);
        self.mem.u32(i * 8).load(Ordering::Acquire)
    }
    /// Stores word `i` as 32 bits.
    pub fn store32(&self, i: usize, v: u32) {
        self.addr(i);
        self.mem.u32(i * 8).store(v, Ordering::Release)
    }
    /// Loads word `i`.
    pub fn load64(&self, i: usize) -> u64 {
        self.addr(i);
        self.mem.u64(i * 8).load(Ordering::Acquire)
    }
    /// Stores word `i`.
    pub fn store64(&self, i: usize, v: u64) {
        self.addr(i);
        self.mem.u64(i * 8).store(v, Ordering::Release)
    }
    /// Ops: store `v` to word `i` (32 bits).
    pub fn write32(&self, i: usize, v: u32) -> Ops {
        kept(
            &self.mem,
            Op::Write32 {
                addr: self.addr(i),
                value: v,
            },
        )
    }
    /// Ops: store `v` to word `i` (64 bits).
    pub fn write64(&self, i: usize, v: u64) -> Ops {
        kept(
            &self.mem,
            Op::Write64 {
                addr: self.addr(i),
                value: v,
            },
        )
    }
    /// Ops: wait until word `i` (32 bits) satisfies `cond` against `v`.
    pub fn wait32(&self, i: usize, v: u32, cond: WaitCond) -> Ops {
        let addr = self.addr(i);
        kept(
            &self.mem,
            Op::Wait32 {
                addr,
                value: v,
                cond,
            },
        )
    }
    /// Ops: wait until word `i` (64 bits) satisfies `cond` against `v`.
    pub fn wait64(&self, i: usize, v: u64, cond: WaitCond) -> Ops {
        let addr = self.addr(i);
        kept(
            &self.mem,
            Op::Wait64 {
                addr,
                value: v,
                cond,
            },
        )
    }
}

/// An op list of the one operation `op` on `mem`, which the list keeps allocated (and, with
/// a GPU, registered) until every executor that runs it is done with it.
fn kept(mem: &Arc<RingMem>, op: Op) -> Ops {
    let keep: KeepAlive = mem.clone();
    let mut o = Ops::new();
    o.push(op, &keep);
    o
}

/// Page-aligned host memory, pinned and mapped for GPUs when given a CUDA handle: buffers that
/// streams and kernels wait on or write (ordinary pageable memory they cannot reach).
#[derive(Clone)]
pub struct PinnedBuffer {
    mem: Arc<RingMem>,
    len: usize,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedBuffer {
    /// `len` zeroed bytes, mapped for the GPUs of the process's default CUDA handle
    /// ([`Cuda::get`]) where it has any; [`PinnedBuffer::with_cuda`] takes a handle of your own.
    pub fn new(len: usize) -> Self {
        Self::with_cuda(len, Cuda::default_gpus())
    }
    /// `len` zeroed bytes, mapped for the GPUs of `cuda` (`None`: host memory only).
    pub fn with_cuda(len: usize, cuda: Option<&Arc<Cuda>>) -> Self {
        Self {
            mem: Arc::new(RingMem::new(len, cuda)),
            len,
        }
    }
    /// Host start address (what the CPU and the NIC use; op lists name the buffer by it).
    pub fn addr(&self) -> u64 {
        self.mem.addr(0)
    }
    /// The GPUs' start address: what to hand a kernel (`cuMemHostGetDevicePointer` of the
    /// registration; the host address where the buffer is not mapped for GPUs).
    pub fn gpu_addr(&self) -> u64 {
        self.mem.gpu_addr(0)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Copies bytes at `offset` into `dst` (a GPU or the device may write concurrently: data
    /// is defined once their work is known to be done).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            crate::bounds::fits(offset, dst.len(), self.len),
            "a read of {} bytes at offset {offset} is outside the buffer of {} bytes",
            dst.len(),
            self.len
        );
        self.mem.read(offset, dst)
    }
    /// Copies `src` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) {
        assert!(
            crate::bounds::fits(offset, src.len(), self.len),
            "a write of {} bytes at offset {offset} is outside the buffer of {} bytes",
            src.len(),
            self.len
        );
        self.mem.write(offset, src)
    }
    /// Whether GPUs can reach it (made with a CUDA handle that has a GPU, and the registration
    /// succeeded).
    pub fn gpu_mapped(&self) -> bool {
        self.mem.gpu_mapped()
    }
    /// What an op list keeps to keep the buffer alive (and to find its GPUs' address).
    pub(crate) fn keep(&self) -> crate::ops::KeepAlive {
        self.mem.clone()
    }
    /// Keeps the buffer alive with `ops`, as lists of its own ops do: ops pushed with
    /// [`Ops::push_raw`](crate::ops::Ops::push_raw) that name it then reach it at its GPUs'
    /// address on a CUDA stream.
    pub fn keep_with(&self, ops: &mut crate::ops::Ops) {
        ops.keep_alive_with(self.keep());
    }
    /// Address of the `size`-byte word at byte `off`, which must be aligned and inside.
    fn word(&self, off: usize, size: usize) -> u64 {
        assert!(
            off % size == 0 && crate::bounds::fits(off, size, self.len),
            "a {size}-byte word at offset {off} is misaligned or outside the buffer of {} bytes",
            self.len
        );
        self.mem.addr(off)
    }
    /// Ops: store `v` to the 32-bit word at byte `off`. The list keeps the buffer alive, so
    /// it may outlive this handle. Panics if the word is misaligned or outside the buffer.
    pub fn write32(&self, off: usize, v: u32) -> Ops {
        kept(
            &self.mem,
            Op::Write32 {
                addr: self.word(off, 4),
                value: v,
            },
        )
    }
    /// Ops: store `v` to the 64-bit word at byte `off` (see [`write32`](Self::write32)).
    pub fn write64(&self, off: usize, v: u64) -> Ops {
        kept(
            &self.mem,
            Op::Write64 {
                addr: self.word(off, 8),
                value: v,
            },
        )
    }
    /// Ops: wait until the 32-bit word at byte `off` satisfies `cond` against `v`. The list
    /// keeps the buffer alive. Panics if the word is misaligned or outside the buffer.
    pub fn wait32(&self, off: usize, v: u32, cond: WaitCond) -> Ops {
        let addr = self.word(off, 4);
        kept(
            &self.mem,
            Op::Wait32 {
                addr,
                value: v,
                cond,
            },
        )
    }
    /// Ops: wait until the 64-bit word at byte `off` satisfies `cond` against `v` (see
    /// [`wait32`](Self::wait32)).
    pub fn wait64(&self, off: usize, v: u64, cond: WaitCond) -> Ops {
        let addr = self.word(off, 8);
        kept(
            &self.mem,
            Op::Wait64 {
                addr,
                value: v,
                cond,
            },
        )
    }
}

impl crate::ProtectionDomain {
    /// Registers a pinned buffer. The region borrows it.
    pub fn register_pinned<'buf>(
        &self,
        buf: &'buf PinnedBuffer,
        access: crate::Access,
    ) -> crate::Result<crate::MemoryRegion<'buf>> {
        // SAFETY: the borrow keeps the allocation (an Arc'd RingMem) alive for 'buf; it is
        // reached only through the region and the device meanwhile.
        unsafe { self.register_raw(buf.addr() as *mut u8, buf.len.max(1), access) }
    }
}

#[cfg(test)]
mod tests {
    use super::PinnedBuffer;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// Offsets whose end wraps past `usize::MAX` panic (the documented misuse) instead of
    /// writing before the buffer; what fits is copied.
    #[test]
    fn pinned_buffer_bounds_do_not_wrap() {
        let b = PinnedBuffer::new(64);
        for off in [usize::MAX, usize::MAX - 3, 60, 65] {
            let w = catch_unwind(AssertUnwindSafe(|| b.write_at(off, &[1, 2, 3, 4, 5])));
            assert!(w.is_err(), "write at {off}");
            let r = catch_unwind(AssertUnwindSafe(|| b.read_at(off, &mut [0; 5])));
            assert!(r.is_err(), "read at {off}");
        }
        b.write_at(59, &[9; 5]);
        b.write_at(64, &[]);
        let mut back = [0u8; 5];
        b.read_at(59, &mut back);
        assert_eq!(back, [9; 5]);
    }

    /// The buffer's op builders name the word at the byte offset, run on an executor, keep
    /// the buffer alive without the handle, and refuse misaligned or outside words.
    #[test]
    fn pinned_buffer_ops_name_the_word_and_keep_the_buffer() {
        use crate::exec::{Executor, HostExecutor};
        use crate::ops::{Op, WaitCond};
        let b = PinnedBuffer::new(64);
        let (write, wait) = (b.write64(56, 7), b.wait64(56, 7, WaitCond::Eq));
        assert_eq!(
            write.as_slice(),
            [Op::Write64 {
                addr: b.addr() + 56,
                value: 7
            }]
        );
        drop(b);
        let exec = HostExecutor::default();
        exec.submit(write).unwrap();
        exec.submit(wait).unwrap();
        let b = PinnedBuffer::new(64);
        for (off, size) in [(2, 4), (4, 8), (64, 4), (60, 8), (usize::MAX - 3, 4)] {
            let r = catch_unwind(AssertUnwindSafe(|| match size {
                4 => b.wait32(off, 0, WaitCond::Eq),
                _ => b.write64(off, 0),
            }));
            assert!(r.is_err(), "a {size}-byte word at {off}");
        }
        b.write32(60, 1);
    }
}
