//! GPU buffers for mp's sends and receives, and the pool of pinned bounces that stages them
//! where the NIC cannot reach GPU memory ([`GpuMemoryPath::Staged`]).
//!
//! A [`GpuRegion`] is a GPU buffer registered with a communicator
//! ([`Comm::register_gpu`](crate::Comm::register_gpu)); the registration records the path
//! its payloads take. Direct: the NIC reads and writes the buffer (as [`crate::Comm::isend`]
//! with its SGE). Staged: a send copies the payload out into a bounce of the communicator's
//! [`StagePool`] in the trigger's own order, and a receive lands in a bounce and is copied in
//! after its wait. The pool is fixed: `recvs` bounces for outstanding staged receives and
//! `sends` for staged sends not yet complete, `bounce` bytes each.

use gdsync::cuda::DeviceBuffer;
use gdsync::ops::{Op, Ops};
use gdsync::{Error, GpuMemoryPath, MemoryRegion, PinnedBuffer, Result, Sge, SignalWords};
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// Where a region's bytes live.
#[derive(Clone)]
pub(crate) enum GpuMem {
    /// GPU memory.
    Device(Arc<DeviceBuffer>),
    /// Pinned host memory standing in for GPU memory (host streams, tests): staged like it,
    /// copied by the CPU.
    Host(PinnedBuffer),
}

impl GpuMem {
    pub(crate) fn addr(&self) -> u64 {
        match self {
            GpuMem::Device(b) => b.ptr(),
            GpuMem::Host(b) => b.addr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            GpuMem::Device(b) => b.len(),
            GpuMem::Host(b) => b.len(),
        }
    }
    /// Copies `dst.len()` bytes at `off` out, with the CPU (synchronously).
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            GpuMem::Device(b) => b.copy_to_host(off, dst),
            GpuMem::Host(b) => {
                b.read_at(off, dst);
                Ok(())
            }
        }
    }
    /// Copies `src` in at `off`, with the CPU (synchronously).
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> Result<()> {
        match self {
            GpuMem::Device(b) => b.copy_from_host(off, src),
            GpuMem::Host(b) => {
                b.write_at(off, src);
                Ok(())
            }
        }
    }
    /// Keeps the memory alive with `ops`.
    fn keep(&self, ops: &mut Ops) {
        match self {
            GpuMem::Device(b) => ops.keep_alive_with(b.clone()),
            GpuMem::Host(b) => b.keep_with(ops),
        }
    }
}

/// A GPU buffer registered with a communicator, and the path its payloads take.
pub struct GpuRegion {
    // Dropped before the memory it covers.
    pub(crate) mr: Option<MemoryRegion<'static>>,
    pub(crate) mem: GpuMem,
    pub(crate) path: GpuMemoryPath,
}

impl std::fmt::Debug for GpuRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRegion")
            .field("addr", &self.mem.addr())
            .field("len", &self.mem.len())
            .field("path", &self.path)
            .finish()
    }
}

/// `len` bytes at `offset` of a [`GpuRegion`]: what a GPU send or receive names.
#[derive(Clone, Copy, Debug)]
pub struct GpuSlice<'r> {
    pub(crate) region: &'r GpuRegion,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl GpuRegion {
    /// The path the region's payloads take (direct or staged).
    pub fn path(&self) -> GpuMemoryPath {
        self.path
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address (GPU memory, or the host stand-in's).
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }
    /// Copies `dst.len()` bytes at `offset` out to the host (synchronously, with the CPU).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        self.mem.read(offset, dst)
    }
    /// Copies `src` in at `offset` (synchronously, with the CPU).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        self.mem.write(offset, src)
    }
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::invalid(format!(
                "{len} bytes at offset {offset} are outside the GPU region of {} bytes",
                self.len()
            ))),
        }
    }
    /// The bytes `range` of the region; panics outside it (as slicing does).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> GpuSlice<'_> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        assert!(
            start <= end && end <= self.len(),
            "range {start}..{end} is outside the GPU region of {} bytes",
            self.len()
        );
        GpuSlice {
            region: self,
            offset: start,
            len: end - start,
        }
    }
}

impl GpuSlice<'_> {
    /// Bytes in the slice.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The SGE of a directly registered region (`None` when staged).
    pub(crate) fn direct_sge(&self) -> Option<Sge> {
        self.region
            .mr
            .as_ref()
            .map(|mr| mr.sge(self.offset..self.offset + self.len))
    }
}

/// What a staged request holds: its bounce and the GPU bytes it copies from or to.
#[derive(Clone)]
pub(crate) struct StageRec {
    pub(crate) slot: usize,
    pub(crate) mem: GpuMem,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// An executor copies it in (after its wait), so the CPU does not.
    pub(crate) by_exec: bool,
    /// The payload lands in the bounce (a receive or a get) and is copied in after the
    /// wait; else it is copied out before the doorbell (a send or a put).
    pub(crate) inbound: bool,
}

/// Who holds a bounce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotUse {
    Free,
    /// A request (its slot and generation) holds it; `exec`: an executor copies it in and
    /// marks use number `exec` done in the pool's words when it has.
    Held {
        req: (u32, u32),
        exec: Option<u64>,
    },
}

/// Bounce sizes of a pool, as [`Comm::set_staging`](crate::Comm::set_staging) sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolShape {
    pub(crate) bounce: usize,
    pub(crate) recvs: usize,
    pub(crate) sends: usize,
}

impl Default for PoolShape {
    fn default() -> Self {
        Self {
            bounce: 64 << 10,
            recvs: 128,
            sends: 32,
        }
    }
}

/// The communicator's pinned bounces, registered once: receive bounces first, then send
/// bounces.
pub(crate) struct StagePool {
    // Dropped before the buffer it covers.
    pub(crate) mr: MemoryRegion<'static>,
    pub(crate) buf: PinnedBuffer,
    pub(crate) shape: PoolShape,
    pub(crate) uses: Vec<SlotUse>,
    /// Per bounce: the last use number an executor finished copying in.
    pub(crate) done: SignalWords,
    pub(crate) next_use: u64,
}

impl StagePool {
    /// A pool of `shape`, registered in `pd`.
    pub(crate) fn new(pd: &gdsync::ProtectionDomain, shape: PoolShape) -> Result<Self> {
        let n = shape.recvs + shape.sends;
        let bytes = n
            .checked_mul(shape.bounce)
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::invalid("the staging pool's size is zero or overflows"))?;
        let buf = PinnedBuffer::new(bytes);
        if let Ok(c) = gdsync::cuda::Cuda::get() {
            gdsync::cuda::prepare_staged_copies(c);
        }
        // SAFETY: the pool declares the registration before the buffer, so it drops it first.
        let mr = unsafe { pd.register_raw(buf.addr() as *mut u8, bytes, gdsync::Access::ALL)? };
        Ok(Self {
            mr,
            buf,
            shape,
            uses: vec![SlotUse::Free; n],
            done: SignalWords::new(n),
            next_use: 0,
        })
    }
    /// A free bounce for receives (`recv`) or sends, if there is one.
    pub(crate) fn free_slot(&self, recv: bool) -> Option<usize> {
        self.range(recv).find(|&s| self.uses[s] == SlotUse::Free)
    }
    /// The range of bounces for receives (`recv`) or sends.
    pub(crate) fn range(&self, recv: bool) -> std::ops::Range<usize> {
        if recv {
            0..self.shape.recvs
        } else {
            self.shape.recvs..self.uses.len()
        }
    }
    /// The SGE of `len` bytes of bounce `slot`.
    pub(crate) fn sge(&self, slot: usize, len: usize) -> Sge {
        let off = slot * self.shape.bounce;
        self.mr.sge(off..off + len)
    }
    /// Ops: a copy between bounce `slot` and the GPU bytes of `rec`, out of them into the
    /// bounce (`out`) or in from it; the list keeps both alive.
    pub(crate) fn copy_ops(&self, rec: &StageRec, out: bool) -> Ops {
        let bounce = self.buf.addr() + (rec.slot * self.shape.bounce) as u64;
        let gpu = rec.mem.addr() + rec.offset as u64;
        let (dst, src) = if out { (bounce, gpu) } else { (gpu, bounce) };
        let mut o = Ops::new();
        // SAFETY: both ranges lie inside buffers the list keeps alive below.
        unsafe {
            o.push_raw(Op::Copy {
                dst,
                src,
                len: rec.len as u64,
            })
        };
        self.buf.keep_with(&mut o);
        rec.mem.keep(&mut o);
        o
    }
    /// Copies between bounce `rec.slot` and the GPU bytes of `rec` with the CPU, `len` bytes.
    pub(crate) fn cpu_copy(&self, rec: &StageRec, len: usize, out: bool) -> Result<()> {
        tracing::trace!(len, out, "the CPU copies a staged message");
        let mut tmp = vec![0u8; len];
        let at = rec.slot * self.shape.bounce;
        if out {
            rec.mem.read(rec.offset, &mut tmp)?;
            self.buf.write_at(at, &tmp);
        } else {
            self.buf.read_at(at, &mut tmp);
            rec.mem.write(rec.offset, &tmp)?;
        }
        Ok(())
    }
}
