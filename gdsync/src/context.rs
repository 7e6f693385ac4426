//! The device as the queue layer holds it: the provider it gives commands to, the host's own
//! record of registered regions (inline sends copy from them at post time, as the verbs
//! library does), the CPU proxy that rings for GPUs, and what asynchronous events reported.

use crate::device::provider::{AsyncEvent, Provider};
use crate::handler::Proxy;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
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
    pub gpu: Option<i32>,
}

impl HostRegion {
    /// Copies `dst.len()` bytes at `addr`, which must lie inside the region.
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        let inside = addr >= self.addr
            && addr
                .checked_add(dst.len() as u64)
                .is_some_and(|end| self.addr.checked_add(self.len).is_some_and(|e| end <= e));
        // SAFETY: inside a registered region (checked above), lent for the registration's life.
        inside && unsafe { crate::mem::read_region(self.gpu, addr, dst) }
    }
}

/// One device, as every queue-layer object on it shares it.
pub(crate) struct DeviceContext {
    pub provider: Arc<dyn Provider>,
    /// Registered regions by lkey.
    pub regions: RwLock<KeyMap<HostRegion>>,
    /// The CPU proxy for QPs whose doorbells a CPU rings on the GPU's behalf.
    pub proxy: Arc<Proxy>,
    /// CQs the device reported as overrun.
    overran: Mutex<HashSet<u32>>,
    any_overrun: AtomicBool,
}

impl DeviceContext {
    pub(crate) fn new(provider: Arc<dyn Provider>) -> Self {
        Self {
            provider,
            regions: RwLock::new(KeyMap::default()),
            proxy: Default::default(),
            overran: Mutex::new(HashSet::new()),
            any_overrun: AtomicBool::new(false),
        }
    }

    /// Reads the asynchronous events the device reported (as `ibv_get_async_event`) and
    /// records what they mean for the queues.
    pub(crate) fn read_events(&self) {
        while let Some(e) = self.provider.get_async_event() {
            match e {
                AsyncEvent::CqError { cqn } => {
                    self.overran.lock().insert(cqn);
                    self.any_overrun.store(true, Ordering::Release);
                }
                AsyncEvent::QpFatal { qpn } => {
                    tracing::debug!(
                        "{}: QP {qpn:#x} is in the error state",
                        self.provider.name()
                    );
                }
                AsyncEvent::PeerLost { peer } => {
                    tracing::debug!("{}: link to device {peer:016x} lost", self.provider.name());
                }
            }
        }
    }

    /// Whether the device reported CQ `cqn` as overrun.
    pub(crate) fn cq_overran(&self, cqn: u32) -> bool {
        if self.provider.has_async_event() {
            self.read_events();
        }
        self.any_overrun.load(Ordering::Acquire) && self.overran.lock().contains(&cqn)
    }
}
