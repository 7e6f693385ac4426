//! The registration cache: buffers registered once, found again by address.
//!
//! Registering memory is dear on a real NIC (pinning, page-table writes), so codes that send
//! from the same buffers over and over register each once. [`Comm::register_cached`] finds a
//! cached registration that covers the range or makes one; the memory kind (host, pinned,
//! GPU) is detected by the registration itself.

use crate::comm::Comm;
use gdsync::{Access, Error, MemoryRegion, Result, Sge};
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

impl Comm {
    /// The SGE for `len` bytes at `addr` (host or GPU memory), from a cached registration
    /// covering them or a new one (registered for every access, as [`Comm::register`]).
    ///
    /// # Safety
    /// The memory must stay allocated until [`Comm::deregister`] is called for it or the
    /// `Comm` is dropped: memory freed and allocated again at the same address would be
    /// found in the cache and reached through the old registration (MPI libraries intercept
    /// `free` for this; here the caller keeps the contract).
    pub unsafe fn register_cached(&mut self, addr: *const u8, len: usize) -> Result<Sge> {
        if len == 0 {
            return Err(Error::invalid("cannot register a zero-length range"));
        }
        let a = addr as u64;
        let end = a
            .checked_add(len as u64)
            .ok_or_else(|| Error::invalid("address range wraps around"))?;
        if let Some(mr) = self.regs.find(a, len as u64) {
            let off = (a - mr.addr()) as usize;
            let sge = mr.sge(off..off + len);
            self.regs.hits += 1;
            return Ok(sge);
        }
        // SAFETY: the caller keeps the memory allocated while the registration is cached.
        let mr = unsafe { self.pd().register_raw(addr as *mut u8, len, Access::ALL)? };
        debug_assert_eq!(mr.addr() + mr.len() as u64, end);
        self.regs.misses += 1;
        let sge = mr.sge(..);
        // A registration of the same start is replaced (it covered less; work in flight on
        // it may fail with a key error once it is dropped, so deregister before reuse).
        self.regs.entries.insert(a, mr);
        Ok(sge)
    }

    /// Drops every cached registration that overlaps `[addr, addr + len)`; returns how many.
    /// Call it before freeing memory registered through [`Comm::register_cached`], once no
    /// work on it is in flight.
    pub fn deregister(&mut self, addr: *const u8, len: usize) -> usize {
        let (a, e) = (addr as u64, (addr as u64).saturating_add(len as u64));
        let before = self.regs.entries.len();
        self.regs
            .entries
            .retain(|&s, mr| s + mr.len() as u64 <= a || s >= e);
        before - self.regs.entries.len()
    }

    /// Hits, misses and size of the registration cache.
    pub fn reg_cache_stats(&self) -> RegCacheStats {
        RegCacheStats {
            hits: self.regs.hits,
            misses: self.regs.misses,
            entries: self.regs.entries.len(),
        }
    }
}
