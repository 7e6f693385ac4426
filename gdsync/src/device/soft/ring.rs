//! The rings a link is made of: byte rings in one mapping (heap memory, or a shared-memory
//! file between processes), each with one producer engine and one consumer engine.
//!
//! Records are 64-byte aligned: a 48-byte [`PktHeader`] whose first word (the stamp) is
//! stored last with release order, then the payload. Before publishing a record the producer
//! clears the stamp of the next one, so the consumer never mistakes old bytes for a record.
//! The consumer publishes how far it has read, which the producer checks only when the ring
//! looks full.
//!
//! The mapping's first page ([`DATA_OFF`] bytes) holds the shared words: a shared-memory
//! file's header ([`shm_link`](super::shm_link)), the ends' closed flags
//! ([`link`](super::link)) and each ring's consumer head ([`OFF_HEAD`]); the rings follow.

use super::bridge::BridgeSignal;
use super::wire::{kind, PktHeader, HDR, MTU};
use crate::mem::{prefetch_line as prefetch, RingMem};
use crate::shm::SharedMemory;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of record data per ring direction.
pub(crate) const RING_BYTES: usize = 4 << 20;
/// Where the rings start in a link's mapping (after the page of shared words).
pub(super) const DATA_OFF: usize = 4096;
/// The consumer heads: two u64 on their own cache lines, 128 and 192.
const OFF_HEAD: usize = 128;

/// Bytes of ring ahead of the producer prefetched for writing (a 4 KiB record's worth).
const WARM_AHEAD: u64 = 4096 + 128;
/// Most payload bytes prefetched when a record is seen (beyond, the hardware prefetcher
/// follows the copy).
const PREFETCH_MAX: usize = 8192;

/// The memory a link's rings live in.
pub(super) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// Keeps the memory alive: a heap allocation, or a shared-memory file's mapping.
    _mem: Backing,
}

enum Backing {
    Heap(#[allow(dead_code)] RingMem),
    Shared(#[allow(dead_code)] SharedMemory),
}

// SAFETY: the mapping is plain memory; all shared words are accessed as atomics and record
// bodies are handed over with the stamp's release/acquire protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(super) fn heap(len: usize) -> Self {
        // Engines read and write link rings; GPUs never do.
        let mem = RingMem::host(len);
        Self {
            ptr: mem.addr(0) as *mut u8,
            len: mem.len(),
            _mem: Backing::Heap(mem),
        }
    }
    pub(super) fn shared(mem: SharedMemory) -> Self {
        Self {
            ptr: mem.as_ptr(),
            len: mem.len(),
            _mem: Backing::Shared(mem),
        }
    }
    pub(super) fn u32(&self, off: usize) -> &AtomicU32 {
        assert!(crate::bounds::fits(off, 4, self.len) && off % 4 == 0);
        // SAFETY: in bounds and aligned (checked; the base is page-aligned).
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
    pub(super) fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(crate::bounds::fits(off, 8, self.len) && off % 8 == 0);
        // SAFETY: in bounds and aligned (checked).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }
    pub(super) fn size_for(rings: usize) -> usize {
        DATA_OFF + rings * RING_BYTES
    }
}

/// Producer end of a ring.
pub(crate) struct Producer {
    base: *mut u8,
    ring: Geometry,
    pos: u64,
    cached_head: u64,
    /// How far ahead of `pos` the ring's lines were prefetched for writing.
    warmed: u64,
    head_off: usize,
    map: Arc<Mapping>,
    /// Bridged links: the thread that drains this ring, woken after each record.
    notify: Option<Arc<BridgeSignal>>,
}

/// Consumer end of a ring.
pub(crate) struct Consumer {
    base: *mut u8,
    ring: Geometry,
    pos: u64,
    head_off: usize,
    map: Arc<Mapping>,
}

// SAFETY: each end is owned by exactly one engine thread; the memory is kept alive by the Arc.
unsafe impl Send for Producer {}
// SAFETY: as above.
unsafe impl Send for Consumer {}

/// A ring's size, a power of two, so that the offset and lap of a position (taken on every
/// peek) are a mask and a shift, not divisions. Every link's rings are [`RING_BYTES`]; the
/// model tests run the same code on rings of a few records.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    cap: u64,
    shift: u32,
}

impl Geometry {
    const LINK: Geometry = Geometry::new(RING_BYTES as u64);

    const fn new(cap: u64) -> Geometry {
        assert!(cap.is_power_of_two() && cap >= 128);
        Geometry {
            cap,
            shift: cap.trailing_zeros(),
        }
    }
    /// The offset of position `pos` in the ring.
    fn off(self, pos: u64) -> u64 {
        pos & (self.cap - 1)
    }
    /// The stamp of the record at position `pos`: its lap, with the top bit set (never 0).
    fn stamp(self, pos: u64) -> u32 {
        ((pos >> self.shift) as u32 & 0x7FFF_FFFF) | 0x8000_0000
    }
}

fn ring(map: &Arc<Mapping>, i: usize) -> (*mut u8, usize) {
    // SAFETY: DATA_OFF + (i+1)*RING_BYTES <= len by construction of the mapping.
    (
        unsafe { map.ptr.add(DATA_OFF + i * RING_BYTES) },
        OFF_HEAD + 64 * i,
    )
}

impl Producer {
    /// The producer end of ring `i` of `map`.
    pub(super) fn new(map: &Arc<Mapping>, i: usize) -> Self {
        let (base, head_off) = ring(map, i);
        Self {
            base,
            ring: Geometry::LINK,
            pos: 0,
            cached_head: 0,
            warmed: 0,
            head_off,
            map: map.clone(),
            notify: None,
        }
    }

    /// Wakes the thread that drains this ring (a bridged link's outbound thread) after each
    /// record.
    pub(super) fn notify(&mut self, signal: Arc<BridgeSignal>) {
        self.notify = Some(signal);
    }

    fn stamp(&self, off: u64) -> &AtomicU32 {
        // SAFETY: off < cap and 64-aligned, so the word is in bounds and aligned.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }
    }

    fn has_room(&mut self, bytes: u64) -> bool {
        // Saturating: the head is the consumer's, in memory another process may share.
        let used = |head: u64| (self.pos + bytes).saturating_sub(head);
        if used(self.cached_head) <= self.ring.cap {
            return true;
        }
        self.cached_head = self.map.u64(self.head_off).load(Ordering::Acquire);
        used(self.cached_head) <= self.ring.cap
    }

    /// Appends a record of `hdr` and `len` payload bytes filled by `fill`, if there is room.
    pub(crate) fn try_push<R>(
        &mut self,
        hdr: &PktHeader,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        debug_assert!(len <= MTU);
        let rec = (HDR + len).next_multiple_of(64) as u64;
        let cap = self.ring.cap;
        let off = self.ring.off(self.pos);
        let skip = if off + rec > cap { cap - off } else { 0 };
        // Room for the skip, the record and the next record's cleared stamp.
        if !self.has_room(skip + rec + 64) {
            return None;
        }
        if skip > 0 {
            self.stamp(0).store(0, Ordering::Relaxed);
            let h = PktHeader {
                kind: kind::SKIP,
                ..Default::default()
            };
            self.write_header(off, &h);
            self.stamp(off)
                .store(self.ring.stamp(self.pos), Ordering::Release);
            self.pos += skip;
        }
        let off = self.ring.off(self.pos);
        self.stamp(self.ring.off(self.pos + rec))
            .store(0, Ordering::Relaxed);
        self.write_header(off, hdr);
        // SAFETY: the record [off, off+rec) lies inside the ring (no wrap, checked above) and
        // is free: the consumer has published a head past it.
        let payload =
            unsafe { std::slice::from_raw_parts_mut(self.base.add(off as usize + HDR), len) };
        let r = fill(payload);
        self.stamp(off)
            .store(self.ring.stamp(self.pos), Ordering::Release);
        self.pos += rec;
        if let Some(n) = &self.notify {
            n.wake_outbound();
        }
        self.warm_ahead();
        Some(r)
    }

    /// Asks for the lines the next records will take, for writing, while the link is idle:
    /// they were last read by the consumer a lap ago, and fetching them while a record is
    /// written would put that wait on the message's path. (The line of the next stamp, which
    /// the consumer polls, is left to the write that clears it.)
    fn warm_ahead(&mut self) {
        let end = self.pos + WARM_AHEAD;
        let mut at = self.warmed.max(self.pos + 64);
        while at < end {
            prefetch::<true>(self.base.wrapping_add(self.ring.off(at) as usize));
            at += 64;
        }
        self.warmed = at;
    }

    fn write_header(&self, off: u64, h: &PktHeader) {
        // SAFETY: PktHeader is repr(C) plain data, HDR bytes; bytes 4.. go to a free record
        // (the stamp at 0 is stored separately, atomically).
        unsafe {
            let src = (h as *const PktHeader as *const u8).add(4);
            std::ptr::copy_nonoverlapping(src, self.base.add(off as usize + 4), HDR - 4);
        }
    }
}

impl Consumer {
    /// The consumer end of ring `i` of `map`.
    pub(super) fn new(map: &Arc<Mapping>, i: usize) -> Self {
        let (base, head_off) = ring(map, i);
        Self {
            base,
            ring: Geometry::LINK,
            pos: 0,
            head_off,
            map: map.clone(),
        }
    }

    /// Whether a record (or a skip to the ring's start) has been published at the consumer's
    /// position: one load of the stamp, for the common look that finds nothing.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        let off = self.ring.off(self.pos);
        // SAFETY: off < cap, 64-aligned.
        let stamp =
            unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }.load(Ordering::Acquire);
        stamp == self.ring.stamp(self.pos)
    }

    /// Where the consumer reads next (for the engine's [`Watch`](super::watch::Watch)).
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// A look at this ring from outside the engine: whether a record waits at a position.
    pub(crate) fn probe(&self) -> RxProbe {
        RxProbe {
            base: self.base,
            ring: self.ring,
            _map: self.map.clone(),
        }
    }

    /// The next record, if one has been published: its header and payload.
    pub(crate) fn peek(&mut self) -> Option<(PktHeader, &[u8])> {
        loop {
            let off = self.ring.off(self.pos);
            // SAFETY: off < cap, 64-aligned.
            let stamp = unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }
                .load(Ordering::Acquire);
            if stamp != self.ring.stamp(self.pos) {
                return None;
            }
            // SAFETY: the stamp was published with release after the header and payload were
            // written; the producer does not touch the record until we publish our head.
            let h: PktHeader =
                unsafe { std::ptr::read(self.base.add(off as usize) as *const PktHeader) };
            if h.kind == kind::SKIP {
                self.pos += self.ring.cap - off;
                continue;
            }
            // A shared-memory ring is written by another process: a length that runs past
            // the ring's end is cut there rather than trusted.
            let room = (self.ring.cap - off) as usize - HDR;
            let len = (h.seg_len as usize).min(MTU).min(room);
            // The payload's lines are all asked for at once, so that they cross from the
            // producer's core together rather than one by one as the copy reaches them.
            let start = off as usize + 64;
            for l in (start..off as usize + HDR + len.min(PREFETCH_MAX)).step_by(64) {
                prefetch::<false>(self.base.wrapping_add(l));
            }
            // SAFETY: as above; the payload lies inside the ring (off + HDR + len <= cap).
            let payload =
                unsafe { std::slice::from_raw_parts(self.base.add(off as usize + HDR), len) };
            return Some((h, payload));
        }
    }

    /// Releases the record returned by the last `peek`.
    pub(crate) fn pop(&mut self, h: &PktHeader) {
        self.pos += (HDR + (h.seg_len as usize).min(MTU)).next_multiple_of(64) as u64;
        self.map
            .u64(self.head_off)
            .store(self.pos, Ordering::Release);
    }
}

/// A receive ring seen from outside its engine, by a thread that waits for a packet
/// ([`Watch`](super::watch::Watch)): it only reads stamps, and keeps the ring's memory alive.
pub(crate) struct RxProbe {
    base: *mut u8,
    ring: Geometry,
    _map: Arc<Mapping>,
}

// SAFETY: the probe only loads stamps atomically; the memory is kept alive by the Arc.
unsafe impl Send for RxProbe {}
// SAFETY: as above.
unsafe impl Sync for RxProbe {}

impl RxProbe {
    /// Whether a record (or a skip) has been published at position `pos`: one load. Any
    /// `pos` is safe to ask about (its offset is taken inside the ring).
    #[inline]
    pub(crate) fn ready_at(&self, pos: u64) -> bool {
        let off = self.ring.off(pos);
        // SAFETY: off < cap and 64-aligned, inside the mapping `_map` keeps alive.
        let stamp =
            unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }.load(Ordering::Acquire);
        stamp == self.ring.stamp(pos)
    }
}

#[cfg(test)]
#[path = "ring_model_tests.rs"]
mod model_tests;
