//! The registration cache: buffers registered once, found again by address.
//!
//! Registering memory is dear on a real NIC (pinning, page-table writes), so codes that send
//! from the same buffers over and over register each once. The cache finds a registration
//! that covers a range or makes one; the communicator owns one (`Comm::register_cached`).

use gdsync::{Access, Error, MemoryRegion, ProtectionDomain, Result, Sge};
use std::collections::BTreeMap;

/// Registrations by start address.
#[derive(Default)]
pub(crate) struct RegCache {
    entries: BTreeMap<u64, MemoryRegion<'static>>,
    hits: u64,
    misses: u64,
}

/// Counters of a registration cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegCacheStats {
    /// Lookups a cached registration covered.
    pub hits: u64,
    /// Lookups that registered memory.
    pub misses: u64,
    /// Registrations held.
    pub entries: usize,
}

impl RegCache {
    /// The cached registration that covers `[addr, addr + len)`, if any.
    fn find(&self, addr: u64, len: u64) -> Option<&MemoryRegion<'static>> {
        // Registrations may overlap; the one starting closest below `addr` is the likeliest
        // to cover it, but a longer one starting further below may too.
        self.entries
            .range(..=addr)
            .rev()
            .map(|(_, mr)| mr)
            .find(|mr| {
                let region_end = mr.addr().checked_add(mr.len() as u64);
                addr.checked_add(len)
                    .is_some_and(|end| region_end.is_some_and(|r| end <= r))
            })
    }
}

impl RegCache {
    /// The SGE for `len` bytes at `addr`, from a cached registration covering them or a new
    /// one in `pd` (registered for every access).
    ///
    /// # Safety
    /// The memory must stay allocated until [`RegCache::deregister`] is called for it or the
    /// cache is dropped (see `Comm::register_cached`).
    pub(crate) unsafe fn register(
        &mut self,
        pd: &ProtectionDomain,
        addr: *const u8,
        len: usize,
    ) -> Result<Sge> {
        if len == 0 {
            return Err(Error::invalid("cannot register a zero-length range"));
        }
        let a = addr as u64;
        let end = a
            .checked_add(len as u64)
            .ok_or_else(|| Error::invalid("address range wraps around"))?;
        if let Some(mr) = self.find(a, len as u64) {
            let off = (a - mr.addr()) as usize;
            let sge = mr.sge(off..off + len);
            self.hits += 1;
            return Ok(sge);
        }
        // SAFETY: the caller keeps the memory allocated while the registration is cached.
        let mr = unsafe { pd.register_raw(addr as *mut u8, len, Access::ALL)? };
        debug_assert_eq!(mr.addr() + mr.len() as u64, end);
        self.misses += 1;
        let sge = mr.sge(..);
        // A registration of the same start is replaced (it covered less; work in flight on
        // it may fail with a key error once it is dropped, so deregister before reuse).
        self.entries.insert(a, mr);
        Ok(sge)
    }

    /// Drops every cached registration that overlaps `[addr, addr + len)`; returns how many.
    pub(crate) fn deregister(&mut self, addr: *const u8, len: usize) -> usize {
        let (a, e) = (addr as u64, (addr as u64).saturating_add(len as u64));
        let before = self.entries.len();
        self.entries
            .retain(|&s, mr| s + mr.len() as u64 <= a || s >= e);
        before - self.entries.len()
    }

    /// Hits, misses and size of the cache.
    pub(crate) fn stats(&self) -> RegCacheStats {
        RegCacheStats {
            hits: self.hits,
            misses: self.misses,
            entries: self.entries.len(),
        }
    }
}
