//! The soft device's memory translation table: key → region, as a ConnectX holds it in its
//! own memory. Registration inserts (the `reg_mr` command), deregistration removes and waits
//! until the engine has stopped using the region; the engine works from its own copy.

use crate::mem::Padded;
use crate::provider::{Access, MrMemory, MrSpec};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One registered region, as the device's translation table holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub pd: u32,
    /// Device memory of this GPU, moved through the CUDA driver; `None`: host memory.
    pub gpu: Option<crate::cuda::GpuCtx>,
}

/// Payloads up to this many bytes are written a word at a time ([`dma_write`]): more than any
/// message that carries a flag in every line (`GDS_LL_MAX` in gdsync.cuh, twice over).
const WORD_WRITE_MAX: usize = 4096;

/// Writes `src` at `dst` as a ConnectX's DMA writes a payload: every naturally aligned 8
/// bytes of the target that the payload covers in one store, so that a reader loading an
/// aligned word sees it old or new, never torn (what protocols with a flag in every 8-byte
/// line rely on: NCCL's LL, gdsync.cuh's `gds_block_ll_recv`). Larger payloads, and a source
/// that overlaps the target (memory of another device of this process), are copied plainly.
///
/// # Safety
/// `dst..dst + src.len()` is writable memory.
unsafe fn dma_write(dst: *mut u8, src: &[u8]) {
    let (d, n) = (dst as usize, src.len());
    let s = src.as_ptr() as usize;
    if n > WORD_WRITE_MAX || (s < d + n && d < s + n) {
        // SAFETY: the caller's contract; `copy` allows the overlap.
        unsafe { std::ptr::copy(src.as_ptr(), dst, n) };
        return;
    }
    let head = ((8 - d % 8) % 8).min(n);
    let words = (n - head) / 8;
    // SAFETY: every write below lies in dst..dst + n (the caller's contract); the words are
    // 8-aligned, so a reference to an AtomicU64 there is valid for the store.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        for w in 0..words {
            let at = head + 8 * w;
            let v = std::ptr::read_unaligned(src.as_ptr().add(at) as *const u64);
            (*(dst.add(at) as *const AtomicU64)).store(v, Ordering::Relaxed);
        }
        let done = head + 8 * words;
        std::ptr::copy_nonoverlapping(src.as_ptr().add(done), dst.add(done), n - done);
    }
}

impl MrEntry {
    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| self.addr.checked_add(self.len).is_some_and(|e| end <= e))
    }

    /// The device's DMA write: copies `src` to `addr`, which must lie inside the region.
    /// Callers hold the table (or the engine's copy of it), so the region is registered.
    #[inline(always)] // (the per-packet path: the compiler left it out of line at times)
    pub fn write(&self, addr: u64, src: &[u8]) -> bool {
        if !self.covers(addr, src.len() as u64) {
            return false;
        }
        match self.gpu {
            Some(g) => g.copy_htod(addr, src).is_ok(),
            None => {
                // SAFETY: inside a registered host region (checked above), whose owner lent it
                // to the device for the registration's lifetime.
                unsafe { dma_write(addr as *mut u8, src) };
                true
            }
        }
    }

    /// The device's DMA read from `addr` into `dst`.
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        if !self.covers(addr, dst.len() as u64) {
            return false;
        }
        // SAFETY: inside the registered region (checked above).
        unsafe { crate::cuda::read_region(self.gpu, addr, dst) }
    }

    /// An 8-byte atomic at `addr` (8-aligned, inside the region): stores `f(old)`, returns
    /// `old`. Atomic against host CPUs; on device memory it is a read and a write through
    /// the driver, not atomic against GPU kernels.
    pub fn atomic(&self, addr: u64, f: impl Fn(u64) -> u64) -> Option<u64> {
        if addr % 8 != 0 || !self.covers(addr, 8) {
            return None;
        }
        match self.gpu {
            Some(_) => {
                let mut b = [0u8; 8];
                self.read(addr, &mut b).then_some(())?;
                let old = u64::from_ne_bytes(b);
                self.write(addr, &f(old).to_ne_bytes()).then_some(old)
            }
            None => {
                // SAFETY: 8 aligned bytes inside a registered host region (checked above).
                let w = unsafe { &*(addr as *const AtomicU64) };
                let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(f(v)));
                Some(r.unwrap_or_else(|v| v))
            }
        }
    }
}

/// The device's key → region table (the model of the HCA's memory translation table).
///
/// The engine works from its own copy ([`MrCache`]) so that its hot path writes no cache
/// line that posting threads also write. Every change bumps `version`; a deregistration
/// then waits until the engine has taken a copy at least that new (`seen`), which it does
/// only between polling rounds, so it can no longer touch the removed region.
///
/// The lock has a line of its own: a peer engine of this process reads the table under it
/// for every message it takes by reference ([`super::engine`]'s single-copy delivery), and
/// its writes to the lock's word must not evict what this device's helpers read on every
/// round (`gpu_regions`).
#[derive(Default)]
pub(crate) struct MrTable {
    inner: Padded<RwLock<Slots>>,
    version: Padded<AtomicU64>,
    seen: Padded<AtomicU64>,
    engine: Mutex<Option<std::thread::Thread>>,
    /// Registered regions in GPU memory: only the engine's own thread copies to and from
    /// them (a copy binds a CUDA context to the thread that makes it).
    gpu_regions: Padded<AtomicU64>,
}

/// The engine's private copy of the table.
#[derive(Default)]
pub(crate) struct MrCache {
    version: u64,
    pub slots: Arc<Slots>,
}

impl MrCache {
    /// The table version this copy was taken at.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Refreshes the copy if the table changed; cheap (one load) when it did not.
    #[inline]
    pub fn sync(&mut self, t: &MrTable) {
        let v = t.version.0.load(Ordering::Acquire);
        if v != self.version {
            self.refresh(t, v);
        }
    }

    #[cold]
    fn refresh(&mut self, t: &MrTable, v: u64) {
        self.slots = Arc::new(t.inner.0.read().clone());
        self.version = v;
        t.seen.0.store(v, Ordering::Release);
    }
}

/// A random key byte, nonzero and other than `old`, from the OS's generator: a peer that was
/// handed some keys must not learn the next ones from them. (Drawn when a key is made, on the
/// control path; nothing of the generator lives in the table that engines copy.)
fn key_byte(old: u8) -> u8 {
    loop {
        let b = (crate::random::u64() >> 56) as u8;
        if b != 0 && b != old {
            return b;
        }
    }
}

#[derive(Default, Clone)]
pub(crate) struct Slots {
    /// (key byte, region) by index.
    slots: Vec<(u8, Option<MrEntry>)>,
    free: Vec<usize>,
}

impl Slots {
    /// The region `key` names, if it is registered.
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        let (tag, e) = self.slots.get((key >> 8) as usize)?;
        if *tag != key as u8 {
            return None;
        }
        e.as_ref()
    }
}

impl MrTable {
    /// Registers a region: its key (lkey and rkey are the same, as on mlx5).
    pub fn register(&self, s: &MrSpec) -> u32 {
        self.insert(MrEntry {
            addr: s.addr,
            len: s.len,
            access: s.access,
            pd: s.pd,
            gpu: match s.memory {
                MrMemory::Host => None,
                MrMemory::Gpu(g) => Some(g),
            },
        })
    }

    fn insert(&self, e: MrEntry) -> u32 {
        let mut t = self.inner.0.write();
        let idx = match t.free.pop() {
            Some(i) => i,
            None => {
                // Index 0 and 1 are never used, so no key is 0 or the terminator lkey 0x100.
                if t.slots.len() < 2 {
                    t.slots.resize(2, (0, None));
                }
                t.slots.push((0, None));
                t.slots.len() - 1
            }
        };
        // As mlx5 makes keys: index << 8 | a key byte, random, nonzero and new for the slot,
        // so a stale or guessed key does not name the region now at that index.
        let old = t.slots[idx].0;
        let tag = key_byte(old);
        let slot = &mut t.slots[idx];
        slot.0 = tag;
        slot.1 = Some(e);
        if e.gpu.is_some() {
            self.gpu_regions.0.fetch_add(1, Ordering::Relaxed);
        }
        let key = ((idx as u32) << 8) | slot.0 as u32;
        self.version.0.fetch_add(1, Ordering::AcqRel);
        key
    }

    /// Deregisters `key`; returns once the engine no longer uses the region.
    pub fn remove(&self, key: u32) {
        let v = {
            let mut t = self.inner.0.write();
            let idx = (key >> 8) as usize;
            if !t
                .slots
                .get(idx)
                .is_some_and(|s| s.0 == key as u8 && s.1.is_some())
            {
                return;
            }
            if t.slots[idx].1.take().is_some_and(|e| e.gpu.is_some()) {
                self.gpu_regions.0.fetch_sub(1, Ordering::Relaxed);
            }
            t.free.push(idx);
            self.version.0.fetch_add(1, Ordering::AcqRel) + 1
        };
        // Wait until the engine works from a copy without the region.
        let mut spins = 0u32;
        while self.seen.0.load(Ordering::Acquire) < v {
            let Some(engine) = self.engine.lock().clone() else {
                return;
            };
            engine.unpark();
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The table as it is now, for a reader outside the engine (a peer engine in this
    /// process copying from a region): no region leaves it while the guard is held.
    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, Slots> {
        self.inner.0.read()
    }

    /// The table's version: every change moves it on.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.0.load(Ordering::Acquire)
    }

    /// Whether a region in GPU memory is registered.
    pub fn has_gpu_regions(&self) -> bool {
        self.gpu_regions.0.load(Ordering::Relaxed) != 0
    }

    /// Called by the engine thread when it starts (`Some`) and stops (`None`): while no
    /// engine runs, deregistration has nobody to wait for.
    pub fn set_engine(&self, t: Option<std::thread::Thread>) {
        *self.engine.lock() = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dma_write_lands_every_byte_at_any_offset_and_length() {
        for (off, len) in [
            (0, 0),
            (0, 8),
            (3, 1),
            (1, 7),
            (5, 16),
            (8, 24),
            (7, 4096),
            (0, 4100),
        ] {
            let mut target = vec![0xeeu8; 4200 + 16];
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            // SAFETY: off + len lies inside `target`.
            unsafe { dma_write(target.as_mut_ptr().add(off), &src) };
            assert_eq!(&target[off..off + len], &src[..], "{len} at {off}");
            assert!(
                target[..off]
                    .iter()
                    .chain(&target[off + len..])
                    .all(|&b| b == 0xee),
                "{len} at {off}: bytes outside the range changed"
            );
        }
    }

    proptest::proptest! {
        /// The word-at-a-time path lands exactly the bytes a plain copy lands, at any offset and
        /// length on either side of its limit.
        #[test]
        fn a_dma_write_lands_what_a_plain_copy_lands(
            off in 0usize..16,
            src in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..WORD_WRITE_MAX + 64),
            fill in proptest::prelude::any::<u8>(),
        ) {
            let (mut words, mut plain) = (vec![fill; 16 + src.len()], vec![fill; 16 + src.len()]);
            // SAFETY: off + src.len() lies inside both targets, which `src` does not overlap.
            unsafe {
                dma_write(words.as_mut_ptr().add(off), &src);
                std::ptr::copy(src.as_ptr(), plain.as_mut_ptr().add(off), src.len());
            }
            proptest::prop_assert_eq!(words, plain);
        }
    }

    fn spec() -> MrSpec {
        MrSpec {
            pd: 1,
            addr: 0x1000,
            len: 64,
            access: Access::ALL,
            memory: MrMemory::Host,
        }
    }

    #[test]
    fn keys_are_an_index_and_a_key_byte_new_for_each_use_of_the_slot() {
        let t = MrTable::default();
        let first = t.register(&spec());
        let mut prev = first;
        for _ in 0..64 {
            t.remove(prev);
            let k = t.register(&spec());
            assert_eq!(k >> 8, first >> 8, "the freed slot is used again");
            assert_ne!(k & 0xFF, 0);
            assert_ne!(k & 0xFF, prev & 0xFF, "a stale key names the new region");
            assert!(t.inner.0.read().get(prev).is_none());
            assert!(t.inner.0.read().get(k).is_some());
            prev = k;
        }
    }

    /// The attack that worked on the memory keys' xorshift64 generator: from the top bytes of
    /// consecutive outputs, recover the state and predict what follows. Against the OS's
    /// generator the prediction must fail (a chance of 2^-104 that 13 bytes match by luck).
    #[test]
    fn key_bytes_do_not_follow_from_earlier_ones() {
        let t = MrTable::default();
        let keys: Vec<u8> = (0..25).map(|_| t.register(&spec()) as u8).collect();
        let predicted = xorshift_predict(&keys[..12], 13);
        assert!(
            predicted.as_deref() != Some(&keys[12..]),
            "the next 13 key bytes followed from the first 12: {keys:?}"
        );
    }

    /// A brute-force xorshift64 state recovery is 2^56 work; the attacker's shortcut is that
    /// the top byte of each output is a linear function of the state over GF(2). Solve the
    /// linear system for the 64 state bits from the first outputs' top bytes (12 bytes = 96
    /// equations), then run the generator on. `None` if the system has no solution.
    fn xorshift_predict(seen: &[u8], n: usize) -> Option<Vec<u8>> {
        // Each state bit's effect on the output sequence, by linearity: step the unit vectors.
        let step = |mut x: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // rows[k] = (mask over the 64 state bits, wanted bit) for output bit k.
        let mut rows: Vec<(u64, bool)> = Vec::new();
        let mut basis: Vec<u64> = (0..64).map(|i| 1u64 << i).collect();
        for &b in seen {
            basis.iter_mut().for_each(|v| *v = step(*v));
            for bit in 56..64 {
                let mask = (0..64).fold(0u64, |m, i| m | (((basis[i] >> bit) & 1) << i));
                rows.push((mask, (b >> (bit - 56)) & 1 == 1));
            }
        }
        // Gaussian elimination over GF(2).
        let mut pivots: Vec<(usize, u64, bool)> = Vec::new();
        for (mut m, mut v) in rows {
            for &(p, pm, pv) in &pivots {
                if (m >> p) & 1 == 1 {
                    m ^= pm;
                    v ^= pv;
                }
            }
            if m == 0 {
                if v {
                    return None; // inconsistent: not an xorshift64 sequence
                }
                continue;
            }
            let p = m.trailing_zeros() as usize;
            for q in pivots.iter_mut() {
                if (q.1 >> p) & 1 == 1 {
                    q.1 ^= m;
                    q.2 ^= v;
                }
            }
            pivots.push((p, m, v));
        }
        // Free bits as zero; pivot bits from their rows (fully reduced).
        let state = pivots
            .iter()
            .fold(0u64, |s, &(p, _, v)| s | (u64::from(v) << p));
        let mut x = state;
        for _ in seen {
            x = step(x);
        }
        Some(
            (0..n)
                .map(|_| {
                    x = step(x);
                    (x >> 56) as u8
                })
                .collect(),
        )
    }
}
