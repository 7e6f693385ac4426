//! Staging: payloads in memory the NIC cannot reach (GPU memory where GPUDirect RDMA is
//! absent) move through pinned host bounce buffers, copied in the trigger's own order.
//!
//! A [`Staging`] owns a pinned bounce buffer of two chunks (double-buffered: one chunk is
//! copied while the NIC moves the other), or of more ([`Staging::with_slots`], for a deeper
//! pipeline cut by [`ChunkPlan`](crate::ChunkPlan)). Its op lists copy a payload chunk into a
//! slot before the send that names the slot ([`Staging::copy_out`]), and out of a slot after
//! the wait for the receive ([`Staging::copy_in`]), as [`Op::Copy`](crate::ops::Op::Copy): a
//! CUDA stream runs them in the list's order (the whole list as one kernel,
//! `cuda/list_kernel.rs`, or a copy kernel or the copy engines between its memory operations,
//! `cuda/copy_kernel.rs`), a host executor with the CPU. Register [`Staging::bounce`] with the
//! device as the send or receive buffer; [`Staging::chunks`] cuts a message into chunks and
//! slots.

use crate::cuda::{Cuda, DeviceBuffer};
use crate::ops::Ops;
use crate::PinnedBuffer;
use std::sync::Arc;

/// Bytes per chunk unless told otherwise: large enough that a copy's fixed cost is small
/// next to its bytes, small enough that two chunks overlap copy and wire on a 1 MiB message.
pub const DEFAULT_CHUNK: usize = 256 << 10;

/// A pinned bounce buffer of two (or more) slots of `chunk` bytes, and the copy lists that
/// stage payloads through it.
#[derive(Clone, Debug)]
pub struct Staging {
    bounce: PinnedBuffer,
    chunk: usize,
    slots: usize,
}

/// One piece of a staged message: bytes `offset..offset + len` of the payload go through
/// bounce slot `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in the payload.
    pub offset: usize,
    /// Bytes in this chunk (at most the chunk size; the last may be shorter).
    pub len: usize,
    /// Bounce slot (0, 1, ... in turn).
    pub slot: usize,
}

impl Staging {
    /// Two slots of `chunk` bytes (at least 1), mapped for the GPUs of `cuda` (`None`:
    /// host memory only, for CPU triggers).
    pub fn new(chunk: usize, cuda: Option<&Arc<Cuda>>) -> Self {
        Self::with_slots(chunk, 2, cuda)
    }
    /// `slots` slots (at least 2) of `chunk` bytes (at least 1), as [`new`](Self::new).
    /// Panics if the bounce's size overflows.
    pub fn with_slots(chunk: usize, slots: usize, cuda: Option<&Arc<Cuda>>) -> Self {
        let (chunk, slots) = (chunk.max(1), slots.max(2));
        let len = chunk
            .checked_mul(slots)
            .expect("the staging bounce's size overflows");
        if let Some(c) = cuda {
            crate::cuda::prepare_staged_copies(c);
        }
        Self {
            bounce: PinnedBuffer::with_cuda(len, cuda),
            chunk,
            slots,
        }
    }
    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }
    /// Bytes per slot.
    pub fn chunk(&self) -> usize {
        self.chunk
    }
    /// The bounce buffer (both slots): what to register with the device.
    pub fn bounce(&self) -> &PinnedBuffer {
        &self.bounce
    }
    /// Host address of slot `slot` (what a send or receive names).
    pub fn slot_addr(&self, slot: usize) -> u64 {
        self.bounce.addr() + self.slot_off(slot) as u64
    }
    /// Byte offset of slot `slot` in the bounce buffer.
    pub fn slot_off(&self, slot: usize) -> usize {
        assert!(
            slot < self.slots,
            "a staging buffer has slots 0 to {}, not {slot}",
            self.slots - 1
        );
        slot * self.chunk
    }
    /// The chunks of a `len`-byte message, in order, taking the slots in turn (none when
    /// `len` is 0).
    pub fn chunks(&self, len: usize) -> impl Iterator<Item = Chunk> {
        let (chunk, slots) = (self.chunk, self.slots);
        (0..len.div_ceil(chunk)).map(move |i| Chunk {
            offset: i * chunk,
            len: chunk.min(len - i * chunk),
            slot: i % slots,
        })
    }
    /// Ops: copy `len` bytes at `src` into slot `slot`, to run before the send of the slot.
    ///
    /// # Safety
    /// `src..src + len` must stay valid (device memory, or host memory the executor can read)
    /// until every executor that runs the list has passed it, as for [`Ops::push_raw`].
    pub unsafe fn copy_out(&self, slot: usize, src: u64, len: usize) -> Ops {
        let mut o = Ops::new();
        o.push_copy(
            self.slot_addr(slot),
            src,
            self.fit(len),
            &[&self.bounce.keep()],
        );
        o
    }
    /// Ops: copy `len` bytes of slot `slot` to `dst`, to run after the wait for the receive
    /// into the slot.
    ///
    /// # Safety
    /// As [`copy_out`](Self::copy_out), for `dst..dst + len` written.
    pub unsafe fn copy_in(&self, slot: usize, dst: u64, len: usize) -> Ops {
        let mut o = Ops::new();
        o.push_copy(
            dst,
            self.slot_addr(slot),
            self.fit(len),
            &[&self.bounce.keep()],
        );
        o
    }
    /// Ops: copy `len` bytes at byte `offset` of GPU buffer `buf` into slot `slot` (the list
    /// keeps the buffer alive). Panics if the range is outside the buffer or the slot.
    pub fn copy_out_of_device(
        &self,
        slot: usize,
        buf: &Arc<DeviceBuffer>,
        offset: usize,
        len: usize,
    ) -> Ops {
        let src = device_range(buf, offset, len);
        // SAFETY: the list keeps the buffer alive; the range lies inside it.
        let mut o = unsafe { self.copy_out(slot, src, len) };
        o.hold(buf.clone());
        o
    }
    /// Ops: copy `len` bytes of slot `slot` to byte `offset` of GPU buffer `buf` (see
    /// [`copy_out_of_device`](Self::copy_out_of_device)).
    pub fn copy_in_to_device(
        &self,
        slot: usize,
        buf: &Arc<DeviceBuffer>,
        offset: usize,
        len: usize,
    ) -> Ops {
        let dst = device_range(buf, offset, len);
        // SAFETY: as copy_out_of_device.
        let mut o = unsafe { self.copy_in(slot, dst, len) };
        o.hold(buf.clone());
        o
    }
    /// `len` as a copy length, checked against the slot size.
    fn fit(&self, len: usize) -> u64 {
        assert!(
            len <= self.chunk,
            "{len} bytes do not fit a staging slot of {} bytes: cut the message with chunks()",
            self.chunk
        );
        len as u64
    }
}

/// The device address of `len` bytes at `offset` of `buf`; panics outside it.
fn device_range(buf: &DeviceBuffer, offset: usize, len: usize) -> u64 {
    assert!(
        crate::bounds::fits(offset, len, buf.len()),
        "{len} bytes at offset {offset} are outside the GPU buffer of {} bytes",
        buf.len()
    );
    buf.ptr() + offset as u64
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
