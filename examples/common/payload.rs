//! Where a staged rank's payloads live: GPU memory, or, on a host stream (`--host-stream`,
//! where the CPU runs the copies), pinned host memory standing in for it; and the op lists
//! that copy them through a [`Staging`] bounce.

use anyhow::Result;
use gdasync::gdsync::cuda::DeviceBuffer;
use gdasync::gdsync::ops::Ops;
use gdasync::gdsync::staging::Staging;
use gdasync::gdsync::PinnedBuffer;
use std::sync::Arc;

/// A staged payload buffer.
pub enum Payload {
    Gpu(Arc<DeviceBuffer>),
    Host(&'static PinnedBuffer),
}

impl Payload {
    /// `len` bytes on GPU `gpu`, or in pinned host memory (`host`) leaked for the life of
    /// the process (op lists on a host stream name it by address).
    pub fn new(host: bool, len: usize, gpu: i32) -> Result<Payload> {
        Ok(if host {
            Payload::Host(Box::leak(Box::new(PinnedBuffer::with_cuda(len, None))))
        } else {
            Payload::Gpu(Arc::new(DeviceBuffer::alloc(gpu, len)?))
        })
    }
    /// The address copies and markers name.
    pub fn addr(&self) -> u64 {
        match self {
            Payload::Gpu(b) => b.ptr(),
            Payload::Host(b) => b.addr(),
        }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Gpu(b) => b.len(),
            Payload::Host(b) => b.len(),
        }
    }
    /// Copies `dst.len()` bytes at `off` out (synchronously).
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            Payload::Gpu(b) => b.copy_to_host(off, dst)?,
            Payload::Host(b) => b.read_at(off, dst),
        }
        Ok(())
    }
    /// Copies `src` in at `off` (synchronously).
    pub fn write(&self, off: usize, src: &[u8]) -> Result<()> {
        match self {
            Payload::Gpu(b) => b.copy_from_host(off, src)?,
            Payload::Host(b) => b.write_at(off, src),
        }
        Ok(())
    }
    /// Ops: `len` bytes at `offset` between this payload and slot `slot` of `st`, out of it
    /// into the slot (`out`) or into it from the slot. Panics if the range is outside the
    /// payload or the slot.
    pub fn copy(&self, st: &Staging, slot: usize, offset: usize, len: usize, out: bool) -> Ops {
        match (self, out) {
            (Payload::Gpu(b), true) => st.copy_out_of_device(slot, b, offset, len),
            (Payload::Gpu(b), false) => st.copy_in_to_device(slot, b, offset, len),
            (Payload::Host(b), _) => {
                assert!(
                    offset.checked_add(len).is_some_and(|end| end <= b.len()),
                    "{len} bytes at offset {offset} are outside the payload of {} bytes",
                    b.len()
                );
                let at = b.addr() + offset as u64;
                if out {
                    // SAFETY: the host stand-in is leaked for the life of the process; the
                    // range lies inside it.
                    unsafe { st.copy_out(slot, at, len) }
                } else {
                    // SAFETY: as above.
                    unsafe { st.copy_in(slot, at, len) }
                }
            }
        }
    }
}
