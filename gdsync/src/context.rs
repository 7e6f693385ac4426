//! The device as the queue layer holds it: the provider it gives commands to, the host's own
//! record of registered regions (inline sends copy from them at post time, as the verbs
//! library does, each QP keeping the last one it used while no registration changes), the CPU
//! proxy that rings for GPUs, and what asynchronous events reported (CQs that overran, QPs
//! that failed: each QP's state word, which [`Qp::state`](crate::Qp::state) reads instead of
//! asking the device).

use crate::handler::Proxy;
use crate::provider::{AsyncEvent, HwQpState, Provider};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Hashes a key this library made (an lkey, a QP number) with one multiplication: an inline
/// send looks its regions up at every post, where SipHash's resistance to chosen keys buys
/// nothing (the keys are this process's own) and costs a hundred instructions.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, k: u32) {
        self.write_u64(k as u64);
    }
    fn write_u64(&mut self, k: u64) {
        // (The table takes its bucket from the low bits and a tag from the top ones: the
        // multiplication spreads the key's bits into both.)
        self.0 = (self.0 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A table keyed by lkeys or queue numbers.
pub(crate) type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// A registered region as the host library records it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostRegion {
    pub addr: u64,
    pub len: u64,
    pub pd: u32,
    /// Memory of this GPU; `None`: host memory.
    pub gpu: Option<crate::cuda::GpuCtx>,
}

impl HostRegion {
    /// Whether the `len` bytes at `addr` lie inside the region.
    #[inline]
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| self.addr.checked_add(self.len).is_some_and(|e| end <= e))
    }

    /// Copies `dst.len()` bytes at `addr`, which must lie inside the region.
    #[inline]
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        // SAFETY: inside a registered region (checked first), lent for the registration's life.
        self.contains(addr, dst.len() as u64)
            && unsafe { crate::cuda::read_region(self.gpu, addr, dst) }
    }
}

/// The registered regions by lkey, and a generation that every registration and
/// deregistration moves on: a region looked up in an earlier generation is still the one
/// registered under its lkey while the generation has not moved.
#[derive(Default)]
pub(crate) struct Regions {
    table: RwLock<KeyMap<HostRegion>>,
    /// Changed only under the table's write lock, so stable under a read lock.
    generation: AtomicU64,
}

impl Regions {
    /// The table to look regions up in. Deregistrations wait until it is dropped, so memory
    /// found in it stays registered (and lent) while it is held.
    pub(crate) fn read(&self) -> RegionsRead<'_> {
        let table = self.table.read();
        RegionsRead {
            generation: self.generation.load(Ordering::Relaxed),
            table,
        }
    }

    /// The table, to register or deregister a region: the generation moves on.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, KeyMap<HostRegion>> {
        let table = self.table.write();
        self.generation.fetch_add(1, Ordering::Relaxed);
        table
    }
}

/// The region table, read-locked ([`Regions::read`]).
pub(crate) struct RegionsRead<'a> {
    table: RwLockReadGuard<'a, KeyMap<HostRegion>>,
    generation: u64,
}

impl RegionsRead<'_> {
    /// The region registered under `lkey`: from `cache` when it holds that lkey's lookup
    /// of this generation, else from the table (and then kept in `cache`).
    #[inline]
    pub(crate) fn get(&self, cache: &mut RegionCache, lkey: u32) -> Option<HostRegion> {
        if cache.generation != self.generation || cache.lkey != lkey {
            *cache = RegionCache {
                generation: self.generation,
                lkey,
                region: self.table.get(&lkey).copied(),
            };
        }
        cache.region
    }
}

/// One lookup in the region table, with the generation it was made in: an inline send's
/// posting thread mostly copies from the same region time after time, and so skips the hash
/// lookup. (The default, "lkey 0 unregistered in generation 0", is true: the table starts
/// empty and its first registration moves the generation on.)
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RegionCache {
    generation: u64,
    lkey: u32,
    region: Option<HostRegion>,
}

/// One device, as every queue-layer object on it shares it.
pub(crate) struct DeviceContext {
    pub provider: Arc<dyn Provider>,
    /// The GPUs the queues' memory is mapped for (none: host memory only).
    pub cuda: Option<Arc<crate::cuda::Cuda>>,
    /// Registered regions by lkey.
    pub regions: Regions,
    /// The CPU proxy for QPs whose doorbells a CPU rings on the GPU's behalf.
    pub proxy: Arc<Proxy>,
    /// CQs the device reported as overrun.
    overran: Mutex<HashSet<u32>>,
    any_overrun: AtomicBool,
    /// The state word of each live QP (a [`HwQpState`] as `u8`), by QPN: events and error
    /// completions that name a QP set it to ERROR.
    qp_states: Mutex<KeyMap<Arc<AtomicU8>>>,
}

impl DeviceContext {
    pub(crate) fn new(provider: Arc<dyn Provider>, cuda: Option<Arc<crate::cuda::Cuda>>) -> Self {
        Self {
            provider,
            cuda,
            regions: Regions::default(),
            proxy: Default::default(),
            overran: Mutex::new(HashSet::new()),
            any_overrun: AtomicBool::new(false),
            qp_states: Mutex::new(KeyMap::default()),
        }
    }

    /// Reads the asynchronous events the device reported (as `ibv_get_async_event`) and
    /// records what they mean for the queues.
    pub(crate) fn read_events(&self) {
        while let Some(e) = self.provider.get_async_event() {
            match e {
                AsyncEvent::CqError { cqn } => {
                    if self.overran.lock().insert(cqn) {
                        tracing::error!(
                            "{}: CQ {cqn:#x} overran (the device reported a CQ error): its completions are lost, and its polls and waits fail from now on",
                            self.provider.name()
                        );
                    }
                    self.any_overrun.store(true, Ordering::Release);
                }
                AsyncEvent::QpFatal { qpn } => {
                    tracing::debug!(
                        "{}: QP {qpn:#x} is in the error state",
                        self.provider.name()
                    );
                    self.qp_failed(qpn);
                }
                AsyncEvent::PeerLost { peer } => {
                    tracing::debug!("{}: link to device {peer:016x} lost", self.provider.name());
                }
            }
        }
    }

    /// Reads the events that wait, if any (one load when none does).
    #[inline]
    pub(crate) fn poll_events(&self) {
        if self.provider.has_async_event() {
            self.read_events();
        }
    }

    /// Whether the device reported CQ `cqn` as overrun.
    pub(crate) fn cq_overran(&self, cqn: u32) -> bool {
        self.poll_events();
        self.any_overrun.load(Ordering::Acquire) && self.overran.lock().contains(&cqn)
    }

    /// Keeps QP `qpn`'s state word, for the events and error completions that name it.
    pub(crate) fn watch_qp(&self, qpn: u32, state: Arc<AtomicU8>) {
        self.qp_states.lock().insert(qpn, state);
    }

    /// QP `qpn` is destroyed: its number no longer names it.
    pub(crate) fn forget_qp(&self, qpn: u32) {
        self.qp_states.lock().remove(&qpn);
    }

    /// QP `qpn` is in the error state (an event or an error completion said so).
    pub(crate) fn qp_failed(&self, qpn: u32) {
        if let Some(w) = self.qp_states.lock().get(&qpn) {
            w.store(HwQpState::Error as u8, Ordering::Release);
        }
    }
}
