//! Links between soft-device engines: the "wire". A link is a pair of byte rings (one per
//! direction) carrying packets, in one process (heap memory) or between processes on one
//! host (a shared-memory file). A loopback link is one ring the engine writes and reads. A
//! bridged link is a heap pair whose far half is served by transport threads instead of a
//! peer engine (the TCP link, [`super::tcp`]).
//!
//! Each ring has one producer engine and one consumer engine. Records are 64-byte aligned:
//! a 48-byte [`PktHeader`] whose first word (the stamp) is stored last with release order,
//! then the payload. Before publishing a record the producer clears the stamp of the next
//! one, so the consumer never mistakes old bytes for a record. The consumer publishes how far
//! it has read, which the producer checks only when the ring looks full.

use super::engine::WriteTargets;
use super::mr_table::MrTable;
use crate::mem::{prefetch_line as prefetch, RingMem};
use crate::shm::SharedMemory;
use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Bytes of payload in one packet (the soft device's MTU).
pub(crate) const MTU: usize = 64 * 1024;
/// Bytes of record data per ring direction.
pub(crate) const RING_BYTES: usize = 4 << 20;
/// How long `connect` waits for the peer's half of a link (its shared-memory file, its TCP
/// dial): the peer calls `connect` at about the same time, but may be slow to start.
pub(crate) const PEER_WAIT: Duration = Duration::from_secs(30);
const HDR: usize = 48;
const SEG_MAGIC: u64 = u64::from_le_bytes(*b"GDSLINK1");
const DATA_OFF: usize = 4096;
const OFF_MAGIC: usize = 0;
const OFF_CAP: usize = 8;
/// The creator's pid (u32): whoever finds the file after its creator died may remove it.
const OFF_CREATOR: usize = 12;
/// The creator's PID namespace (the inode of `/proc/self/ns/pid`, u64): its pid means
/// something only to processes of the same namespace (containers may share `/dev/shm` and
/// not their pids).
const OFF_PIDNS: usize = 16;
/// Where the files of links between processes live (in a directory of each user's own,
/// `gdsync-<uid>`, that no one else may enter), and how their names start.
const SHM_DIR: &str = "/dev/shm";
const SHM_USER_DIR: &str = "gdsync";
const SHM_PREFIX: &str = "gdsync-link-";
const OFF_CLOSED: usize = 64; // two u32, one per side
const OFF_HEAD: usize = 128; // two u64 on their own cache lines: 128 and 192

/// Bytes of ring ahead of the producer prefetched for writing (a 4 KiB record's worth).
const WARM_AHEAD: u64 = 4096 + 128;
/// Most payload bytes prefetched when a record is seen (beyond, the hardware prefetcher
/// follows the copy).
const PREFETCH_MAX: usize = 8192;

/// Packet kinds.
pub(crate) mod kind {
    pub const SKIP: u8 = 0;
    pub const REQ: u8 = 1;
    pub const RESP: u8 = 2;
}

/// Packet header: 48 bytes, native byte order (both ends are on one host); up to 16 bytes
/// of payload share its cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PktHeader {
    pub stamp: u32,
    pub kind: u8,
    /// Request: the send opcode. Response: a [`resp`](super::engine::resp) code.
    pub op: u8,
    pub flags: u8,
    pub syndrome: u8,
    pub dst_qpn: u32,
    pub src_qpn: u32,
    /// Message sequence number.
    pub psn: u32,
    pub seg_len: u32,
    pub offset: u32,
    pub msg_len: u32,
    pub imm: [u8; 4],
    pub rkey: u32,
    pub raddr: u64,
}
const _: () = assert!(std::mem::size_of::<PktHeader>() == HDR);

/// Header flags.
pub(crate) mod flag {
    pub const FIRST: u8 = 1;
    pub const LAST: u8 = 2;
    pub const SOLICITED: u8 = 4;
    /// The payload is not in the record: the record names it in the sender's registered
    /// memory ([`super::engine`]'s single-copy delivery, in-process links only).
    pub const BY_REF: u8 = 8;
}

/// The memory a link's rings live in.
struct Mapping {
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
    fn heap(len: usize) -> Self {
        // Engines read and write link rings; GPUs never do.
        let mem = RingMem::host(len);
        Self {
            ptr: mem.addr(0) as *mut u8,
            len: mem.len(),
            _mem: Backing::Heap(mem),
        }
    }
    fn shared(mem: SharedMemory) -> Self {
        Self {
            ptr: mem.as_ptr(),
            len: mem.len(),
            _mem: Backing::Shared(mem),
        }
    }
    fn u32(&self, off: usize) -> &AtomicU32 {
        assert!(crate::bounds::fits(off, 4, self.len) && off % 4 == 0);
        // SAFETY: in bounds and aligned (checked; the base is page-aligned).
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
    fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(crate::bounds::fits(off, 8, self.len) && off % 8 == 0);
        // SAFETY: in bounds and aligned (checked).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }
    fn size_for(rings: usize) -> usize {
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
    fn new(map: &Arc<Mapping>, i: usize) -> Self {
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
    fn new(map: &Arc<Mapping>, i: usize) -> Self {
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

/// How an engine learns that the other end is gone.
enum Liveness {
    /// Loopback: the peer is this engine.
    Loopback,
    /// Same process: the peer's closed flag.
    InProcess,
    /// Another process: the closed flag, and a pidfd that turns readable when it exits.
    Process { pid: u32, pidfd: Option<OwnedFd> },
    /// A transport (TCP): its threads report a failed or closed connection.
    Bridged(Arc<BridgeSignal>),
}

/// What an engine's end of a bridged link and the transport threads serving the far end
/// tell each other.
#[derive(Default)]
pub(crate) struct BridgeSignal {
    /// The transport failed or the peer closed it: the link is dead.
    down: AtomicBool,
    /// The engine dropped its end (its device is gone): the transport should close.
    engine_gone: AtomicBool,
    /// Set while the outbound thread sleeps; the engine's next record then unparks it.
    outbound_sleeping: AtomicBool,
    outbound: OnceLock<Thread>,
    /// Closes the transport (shuts the socket down), so threads blocked on it return.
    closer: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// What lives as long as the link: see [`hold`](Self::hold).
    held: OnceLock<Box<dyn Send + Sync>>,
}

impl BridgeSignal {
    /// Marks the link dead and closes the transport; either thread calls it when it stops.
    pub(crate) fn set_down(&self) {
        self.down.store(true, Ordering::Release);
        self.close_transport();
    }
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }
    pub(crate) fn engine_gone(&self) -> bool {
        self.engine_gone.load(Ordering::Acquire)
    }
    /// Keeps `guard` until the link is released: its engine end and both transport threads
    /// gone (each holds this signal). A listener's place for the link in its budget is
    /// given back then, with the link's memory and threads.
    pub(crate) fn hold(&self, guard: impl Send + Sync + 'static) {
        let _ = self.held.set(Box::new(guard));
    }
    /// Installs what closes the transport.
    pub(crate) fn set_closer(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.closer.set(Box::new(f));
    }
    fn close_transport(&self) {
        if let Some(f) = self.closer.get() {
            f();
        }
    }
    /// Registers the calling thread as the outbound thread (the one `wake_outbound` wakes).
    pub(crate) fn register_outbound(&self) {
        let _ = self.outbound.set(std::thread::current());
    }
    /// Announces that the outbound thread is about to park; it must look at the ring once
    /// more afterwards, then park (with a timeout) only if it is still empty.
    pub(crate) fn outbound_sleeps(&self, sleeping: bool) {
        self.outbound_sleeping.store(sleeping, Ordering::SeqCst);
        if sleeping {
            // Pairs with the fence in wake_outbound (store sleeping, then load the stamp).
            fence(Ordering::SeqCst);
        }
    }
    fn wake_outbound(&self) {
        fence(Ordering::SeqCst);
        if self.outbound_sleeping.load(Ordering::Relaxed) {
            self.unpark_outbound();
        }
    }
    fn unpark_outbound(&self) {
        if let Some(t) = self.outbound.get() {
            t.unpark();
        }
    }
}

/// The far half of a bridged link, for the transport threads: `outbound` reads the packets
/// the engine sends, `inbound` writes the packets the engine receives.
pub(crate) struct BridgeEnd {
    pub outbound: Consumer,
    pub inbound: Producer,
    pub signal: Arc<BridgeSignal>,
}

/// One engine's end of a link.
pub(crate) struct Link {
    pub peer: u64,
    /// Both ends of a link between two devices of this process share this id, which no
    /// other link of the process ever had or will have (0 on other links): the identity a
    /// placed write's origin is checked by, as a packet's is by the link it arrives on.
    pub pair_id: u64,
    pub tx: Producer,
    pub rx: Consumer,
    map: Arc<Mapping>,
    side: usize,
    live: Liveness,
    next_check: Instant,
    pub dead: bool,
    /// The peer device's region table, where both devices live in this process: large
    /// payloads then go by reference and are copied once, from the sender's memory.
    peer_regions: Option<Arc<MrTable>>,
    /// The peer device's QPs that take placed writes, where both devices live in this
    /// process.
    peer_targets: Option<Arc<WriteTargets>>,
}

/// What a device of this process shares with the devices it links to: its region table (for
/// payloads by reference) and the QPs that take placed writes.
#[derive(Clone)]
pub(crate) struct DeviceShare {
    pub regions: Arc<MrTable>,
    pub targets: Arc<WriteTargets>,
}

impl Link {
    /// Whether the far end is this engine itself.
    pub(crate) fn is_loopback(&self) -> bool {
        matches!(self.live, Liveness::Loopback)
    }

    /// Whether the far end is an engine of another process (shared memory or a transport),
    /// which only that process's threads drive.
    pub(crate) fn is_remote(&self) -> bool {
        matches!(self.live, Liveness::Process { .. } | Liveness::Bridged(_))
    }

    /// Whether the receive ring is filled by this process's bridge thread from a transport
    /// (TCP), not by the peer engine's core.
    pub(crate) fn is_bridged(&self) -> bool {
        matches!(self.live, Liveness::Bridged(_))
    }

    pub(crate) fn loopback(uid: u64) -> Self {
        let map = Arc::new(Mapping::heap(Mapping::size_for(1)));
        Self::new(uid, &map, 0, 0, 0, Liveness::Loopback)
    }

    /// The two ends of a link between devices `a` and `b` of this process, with what each
    /// shares (`a_share` is `a`'s).
    pub(crate) fn in_process_pair(
        (a, a_share): (u64, &DeviceShare),
        (b, b_share): (u64, &DeviceShare),
    ) -> (Self, Self) {
        // 64 bits counted up: never wraps, so an id is never used again.
        static PAIRS: AtomicU64 = AtomicU64::new(0);
        let pair_id = PAIRS.fetch_add(1, Ordering::Relaxed) + 1;
        let map = Arc::new(Mapping::heap(Mapping::size_for(2)));
        let mut ends = (
            Self::new(b, &map, 0, 0, 1, Liveness::InProcess),
            Self::new(a, &map, 1, 1, 0, Liveness::InProcess),
        );
        ends.0.pair_id = pair_id;
        ends.1.pair_id = pair_id;
        ends.0.peer_regions = Some(b_share.regions.clone());
        ends.1.peer_regions = Some(a_share.regions.clone());
        ends.0.peer_targets = Some(b_share.targets.clone());
        ends.1.peer_targets = Some(a_share.targets.clone());
        ends
    }

    /// The peer device's QPs that take placed writes, on a link within this process.
    pub(crate) fn peer_targets(&self) -> Option<&Arc<WriteTargets>> {
        self.peer_targets.as_ref()
    }

    /// The peer device's region table, on a link within this process.
    pub(crate) fn peer_regions(&self) -> Option<&Arc<MrTable>> {
        self.peer_regions.as_ref()
    }

    /// Lends the peer device's region table out of the link (moved, not cloned: no count to
    /// update for each packet) until [`return_peer_regions`](Self::return_peer_regions).
    pub(crate) fn lend_peer_regions(&mut self) -> Option<Arc<MrTable>> {
        self.peer_regions.take()
    }

    /// Takes back the table [`lend_peer_regions`](Self::lend_peer_regions) lent.
    pub(crate) fn return_peer_regions(&mut self, table: Option<Arc<MrTable>>) {
        self.peer_regions = table;
    }

    /// A link to device `peer` whose far half is served by transport threads: the engine
    /// sends on ring 0 (the threads' `outbound`) and receives on ring 1 (their `inbound`).
    pub(crate) fn bridged(peer: u64) -> (Self, BridgeEnd) {
        let map = Arc::new(Mapping::heap(Mapping::size_for(2)));
        let signal = Arc::new(BridgeSignal::default());
        let mut link = Self::new(peer, &map, 0, 0, 1, Liveness::Bridged(signal.clone()));
        link.tx.notify = Some(signal.clone());
        #[cfg(test)]
        bridges::note(peer, &signal);
        let end = BridgeEnd {
            outbound: Consumer::new(&map, 0),
            inbound: Producer::new(&map, 1),
            signal,
        };
        (link, end)
    }

    fn new(
        peer: u64,
        map: &Arc<Mapping>,
        side: usize,
        tx: usize,
        rx: usize,
        live: Liveness,
    ) -> Self {
        Self {
            peer,
            pair_id: 0,
            tx: Producer::new(map, tx),
            rx: Consumer::new(map, rx),
            map: map.clone(),
            side,
            live,
            next_check: Instant::now(),
            dead: false,
            peer_regions: None,
            peer_targets: None,
        }
    }

    /// A link to device `peer` of process `pid` on this host, through a shared-memory file.
    /// The device with the smaller uid creates the file; the other opens it (waiting for it
    /// up to 30 s) and unlinks it once mapped.
    pub(crate) fn shared_memory(me: u64, peer: u64, pid: u32) -> Result<Self> {
        let (lo, hi) = (me.min(peer), me.max(peer));
        let dir = link_dir()?;
        let path = dir.join(format!("{SHM_PREFIX}{lo:016x}-{hi:016x}"));
        let size = Mapping::size_for(2);
        let creator = me < peer;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        // SAFETY: a nonnegative return is a new fd we own.
        let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
        // While waiting for the peer's half: a peer that died during set-up ends the wait.
        let peer_gone = |what: &str| {
            process_gone(pid, pidfd.as_ref()).then(|| {
                Error::Unreachable(format!(
                    "peer device {peer:016x}: its process {pid} exited before it {what} {}",
                    path.display()
                ))
            })
        };
        let mut mem = if creator {
            // What a crashed process left is found by the next link made by any process of
            // this user (a look at a directory of this user's link files only).
            sweep_orphaned_links(&dir);
            SharedMemory::create(&path, size)?
        } else {
            let start = Instant::now();
            loop {
                if let Some(m) = SharedMemory::open(&path, size)? {
                    break m;
                }
                if let Some(e) = peer_gone("created") {
                    return Err(e);
                }
                if start.elapsed() >= PEER_WAIT {
                    return Err(Error::Unreachable(format!(
                        "peer device {peer:016x} (pid {pid}) did not create {} within {} s: did it call connect()?",
                        path.display(),
                        PEER_WAIT.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        if !creator {
            // Both ends will hold the mapping once this side checked it: the name can go
            // (after the magic check below; the creator's drop removes it otherwise).
            mem.unlink(&path);
        }
        let map = Arc::new(Mapping::shared(mem));
        if creator {
            map.u32(OFF_CAP).store(RING_BYTES as u32, Ordering::Relaxed);
            map.u32(OFF_CREATOR)
                .store(std::process::id(), Ordering::Relaxed);
            map.u64(OFF_PIDNS).store(pid_namespace(), Ordering::Relaxed);
            map.u64(OFF_MAGIC).store(SEG_MAGIC, Ordering::Release);
        } else {
            let start = Instant::now();
            while map.u64(OFF_MAGIC).load(Ordering::Acquire) != SEG_MAGIC {
                if let Some(e) = peer_gone("initialised") {
                    return Err(e);
                }
                if start.elapsed() > PEER_WAIT {
                    return Err(Error::Unreachable(format!(
                        "{} was never initialised",
                        path.display()
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if map.u32(OFF_CAP).load(Ordering::Relaxed) != RING_BYTES as u32 {
                return Err(Error::Unreachable(
                    "peer uses another link ring size (different gdsync version?)".into(),
                ));
            }
        }
        let (side, tx, rx) = if creator { (0, 0, 1) } else { (1, 1, 0) };
        Ok(Self::new(
            peer,
            &map,
            side,
            tx,
            rx,
            Liveness::Process { pid, pidfd },
        ))
    }

    /// Checks (at most every few milliseconds) whether the other end is gone.
    pub(crate) fn check_alive(&mut self, now: Instant) -> bool {
        if self.dead || now < self.next_check {
            return !self.dead;
        }
        self.next_check = now + Duration::from_millis(5);
        let closed = self.peer_closed();
        let gone = match &self.live {
            Liveness::Loopback => false,
            Liveness::InProcess => closed,
            Liveness::Process { pid, pidfd } => closed || process_gone(*pid, pidfd.as_ref()),
            Liveness::Bridged(s) => s.is_down(),
        };
        self.dead = gone;
        !gone
    }

    /// Whether the other end closed the link (its device was dropped).
    pub(crate) fn peer_closed(&self) -> bool {
        self.map
            .u32(OFF_CLOSED + 4 * (1 - self.side))
            .load(Ordering::Acquire)
            != 0
    }

    /// Why a dead link died, for the log.
    pub(crate) fn down_reason(&self) -> String {
        let closed = self.peer_closed();
        match &self.live {
            Liveness::Loopback => "loopback".into(),
            Liveness::InProcess => "the peer device was dropped".into(),
            Liveness::Process { pid, .. } if closed => {
                format!("process {pid} dropped the peer device")
            }
            Liveness::Process { pid, .. } => format!("process {pid} exited"),
            Liveness::Bridged(_) => "the TCP connection closed or failed".into(),
        }
    }
}

/// This user's directory of link files (created on first use, mode 0700).
fn link_dir() -> Result<std::path::PathBuf> {
    crate::shm::private_dir(std::path::Path::new(SHM_DIR), SHM_USER_DIR)
}

/// Removes link files whose creator died before its peer mapped them (a crash or Ctrl-C
/// early in a run): the creator's pid is in the file's header. Files still being set up
/// (no header yet) are left alone unless older than the set-up wait.
fn sweep_orphaned_links(dir: &std::path::Path) {
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(SHM_PREFIX) {
            continue;
        }
        let path = entry.path();
        if link_file_orphaned(&path) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(
                    "soft device: removed {} (its creator is gone)",
                    path.display()
                ),
                Err(e) => tracing::debug!("soft device: could not remove {}: {e}", path.display()),
            }
        }
    }
}

/// Whether a link file's creator is gone (or the file never got a header in a long time).
fn link_file_orphaned(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 24];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false; // not ours to judge (another user's, or gone already)
    };
    if f.read_exact(&mut head).is_err() || head[..8] != SEG_MAGIC.to_ne_bytes() {
        let age = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        return age.is_some_and(|a| a > 2 * PEER_WAIT);
    }
    let creator = u32::from_ne_bytes(head[12..16].try_into().unwrap_or_default());
    let namespace = u64::from_ne_bytes(head[16..24].try_into().unwrap_or_default());
    // Only pids of our own namespace can be judged from our /proc.
    let ours = pid_namespace();
    ours != 0
        && namespace == ours
        && creator != 0
        && creator != std::process::id()
        && process_gone(creator, None)
}

/// This process's PID namespace: the inode of `/proc/self/ns/pid` (0 if unknown).
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Whether process `pid` has ended or is ending. A killed process is readable on its pidfd
/// only once its exit completes, which can take seconds when the kernel tears down device
/// state (a GPU context); its `PF_EXITING` flag in `/proc/<pid>/stat` is set at the start.
fn process_gone(pid: u32, pidfd: Option<&OwnedFd>) -> bool {
    if let Some(fd) = pidfd {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r > 0 && p.revents & libc::POLLIN != 0 {
            return true;
        }
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_says_exiting(&s),
        // No such process (reaped), unless pidfds say otherwise: then trust them.
        Err(_) => pidfd.is_none(),
    }
}

/// Reads `/proc/<pid>/stat`: a zombie or dead state, or the `PF_EXITING` flag.
fn stat_says_exiting(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    // Field 9, flags: the sixth after the state.
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

impl Drop for Link {
    fn drop(&mut self) {
        self.map
            .u32(OFF_CLOSED + 4 * self.side)
            .store(1, Ordering::Release);
        if let Liveness::Bridged(s) = &self.live {
            // The device is gone: close the connection (the peer sees the link die) and let
            // the threads go.
            s.engine_gone.store(true, Ordering::Release);
            s.close_transport();
            s.unpark_outbound();
        }
    }
}

/// The bridged links made in this process, by peer (for tests: a link's signal lives as long
/// as its engine end and its transport threads).
#[cfg(test)]
pub(crate) mod bridges {
    use super::BridgeSignal;
    use parking_lot::Mutex;
    use std::sync::{Arc, Weak};

    static ALL: Mutex<Vec<(u64, Weak<BridgeSignal>)>> = Mutex::new(Vec::new());

    pub(super) fn note(peer: u64, signal: &Arc<BridgeSignal>) {
        let mut all = ALL.lock();
        all.retain(|(_, s)| s.strong_count() > 0);
        all.push((peer, Arc::downgrade(signal)));
    }

    /// Holders (the link's engine end, its two threads) of the bridged links to `peer` that
    /// are still alive.
    pub(crate) fn holders(peer: u64) -> usize {
        let all = ALL.lock();
        (all.iter())
            .filter(|(p, _)| *p == peer)
            .map(|(_, s)| s.strong_count())
            .sum()
    }
}

#[cfg(test)]
mod liveness_tests {
    use super::*;

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn connecting_to_a_peer_that_died_during_set_up_fails_at_once() {
        // The larger uid opens the file the smaller one creates: this side waits for it.
        let (me, peer) = (0xFFFF_0000_0000_0001u64 | 1, 0x0000_1111_0000_0001u64);
        let pid = dead_pid();
        let start = Instant::now();
        let err = Link::shared_memory(me, peer, pid)
            .err()
            .expect("no link to a dead peer");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("process {pid} exited")), "{msg}");
    }

    /// A dead creator's file is removed by the next link this process creates, not only by
    /// a process's first.
    #[test]
    fn every_link_file_created_sweeps_the_dead_ones() {
        let me = std::process::id();
        let first = Link::shared_memory(0x10, 0xFFFF_FFFF_FFFF_FF01, me).unwrap();
        let orphan = link_dir()
            .unwrap()
            .join(format!("{SHM_PREFIX}test-orphan-0000000000000002"));
        let mut head = SEG_MAGIC.to_ne_bytes().to_vec();
        head.extend_from_slice(&(RING_BYTES as u32).to_ne_bytes());
        head.extend_from_slice(&dead_pid().to_ne_bytes());
        head.extend_from_slice(&pid_namespace().to_ne_bytes());
        std::fs::write(&orphan, head).unwrap();
        let second = Link::shared_memory(0x11, 0xFFFF_FFFF_FFFF_FF02, me).unwrap();
        assert!(
            !orphan.exists(),
            "the second link left the dead creator's file"
        );
        drop((first, second));
    }

    /// A file another user made first under the name this device opens is refused, never
    /// mapped (it would carry this device's payloads to them).
    #[test]
    fn a_link_file_open_to_other_users_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (lo, hi) = (0x20u64, 0xFFFF_FFFF_FFFF_FF03u64);
        let path = link_dir()
            .unwrap()
            .join(format!("{SHM_PREFIX}{lo:016x}-{hi:016x}"));
        let planted = SharedMemory::create(&path, Mapping::size_for(2)).unwrap();
        // SAFETY: the mapping is ours and holds the header's first 8 bytes.
        unsafe { (planted.as_ptr() as *mut u64).write_volatile(SEG_MAGIC) };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = Link::shared_memory(hi, lo, std::process::id())
            .err()
            .expect("mapped a link file open to other users");
        assert!(err.to_string().contains("not a private file"), "{err}");
        drop(planted);
    }

    #[test]
    fn link_files_of_dead_creators_are_swept() {
        let write = |name: &str, pid: u32, namespace: u64| {
            let path = link_dir().unwrap().join(format!("{SHM_PREFIX}{name}"));
            let mut head = SEG_MAGIC.to_ne_bytes().to_vec();
            head.extend_from_slice(&(RING_BYTES as u32).to_ne_bytes());
            head.extend_from_slice(&pid.to_ne_bytes());
            head.extend_from_slice(&namespace.to_ne_bytes());
            std::fs::write(&path, head).unwrap();
            path
        };
        let ns = pid_namespace();
        let orphan = write("test-orphan-0000000000000001", dead_pid(), ns);
        let mine = write("test-live-0000000000000001", std::process::id(), ns);
        // A dead pid of another PID namespace may be a live process there.
        let foreign = write("test-foreign-0000000000000001", dead_pid(), ns ^ 1);
        sweep_orphaned_links(&link_dir().unwrap());
        assert!(!orphan.exists(), "the dead creator's file stays");
        assert!(mine.exists(), "a live creator's file was removed");
        assert!(foreign.exists(), "another namespace's file was removed");
        std::fs::remove_file(mine).unwrap();
        std::fs::remove_file(foreign).unwrap();
    }

    #[test]
    fn only_the_ends_of_an_in_process_link_name_the_peer_device_tables() {
        let share = || DeviceShare {
            regions: Arc::new(MrTable::default()),
            targets: Arc::new(WriteTargets::new(16)),
        };
        let (sa, sb) = (share(), share());
        let (a, b) = Link::in_process_pair((1, &sa), (2, &sb));
        // `a` is device 1's end: it receives device 2's packets and reads device 2's regions.
        assert_eq!(a.peer, 2);
        assert!(a
            .peer_regions()
            .is_some_and(|t| Arc::ptr_eq(t, &sb.regions)));
        assert!(b
            .peer_regions()
            .is_some_and(|t| Arc::ptr_eq(t, &sa.regions)));
        assert!(a
            .peer_targets()
            .is_some_and(|t| Arc::ptr_eq(t, &sb.targets)));
        assert!(b
            .peer_targets()
            .is_some_and(|t| Arc::ptr_eq(t, &sa.targets)));
        for far in [Link::loopback(3), Link::bridged(4).0] {
            assert!(far.peer_regions().is_none() && far.peer_targets().is_none());
        }
    }

    #[test]
    fn proc_stat_states_and_the_exiting_flag() {
        // pid (comm) state ppid pgrp session tty tpgid flags ...
        let live = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0";
        assert!(!stat_says_exiting(live));
        assert!(stat_says_exiting("42 (x) Z 1 42 42 0 -1 4194560 1 0"));
        assert!(stat_says_exiting("42 (x) R 1 42 42 0 -1 4194564 1 0"));
        assert!(!stat_says_exiting("garbage"));
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(!stat_says_exiting(&me), "{me}");
    }
}

#[cfg(test)]
#[path = "link_model_tests.rs"]
mod model_tests;
