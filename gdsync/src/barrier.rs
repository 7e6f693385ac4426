//! Barriers between the CPU and a device (a HCA reading the rings over PCIe, its
//! write-combining doorbell page), per architecture, with the meanings rdma-core gives them
//! (`util/udma_barrier.h`):
//!
//! - [`dma_wmb`]: stores to memory a device reads (WQEs, doorbell records) are visible to it
//!   before any later store (`udma_to_device_barrier`);
//! - [`dma_rmb`]: loads after one that saw a device's write (a CQE's owner bit) see what the
//!   device wrote before it (`udma_from_device_barrier`);
//! - [`mmio_flush_writes`]: a store to a write-combining page leaves the CPU now, and stores
//!   before it are ordered before those after it (`mmio_flush_writes`, `mmio_wc_start`).
//!
//! x86-64 keeps what gdsync always did: compiler barriers where its stores and acquire loads
//! are already ordered for devices (total store order), `sfence` for write combining. AArch64
//! (Grace-Hopper) needs the outer-shareable barriers (`dmb oshst`, `dmb oshld`), which order
//! accesses as a device sees them, and `dsb st` for write combining: the inner-shareable
//! barriers of Rust's atomics order them for other CPUs only. Elsewhere a full fence stands in.

use std::sync::atomic::{compiler_fence, Ordering};

/// The instruction each barrier is on this architecture (`""`: none, a compiler barrier).
#[cfg(target_arch = "x86_64")]
macro_rules! insn {
    (dma_wmb) => {
        ""
    };
    (dma_rmb) => {
        ""
    };
    (mmio_flush_writes) => {
        "sfence"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! insn {
    (dma_wmb) => {
        "dmb oshst"
    };
    (dma_rmb) => {
        "dmb oshld"
    };
    (mmio_flush_writes) => {
        "dsb st"
    };
}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
macro_rules! insn {
    ($name:ident) => {
        "full fence"
    };
}

/// Emits the barrier `$name` of this architecture.
macro_rules! barrier {
    ($name:ident) => {{
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if insn!($name).is_empty() {
            compiler_fence(Ordering::SeqCst);
        } else {
            // SAFETY: a barrier instruction: no operands, no memory access of its own, no
            // effect on registers, flags or the stack.
            unsafe { std::arch::asm!(insn!($name), options(nostack, preserves_flags)) };
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        std::sync::atomic::fence(Ordering::SeqCst);
    }};
}

/// Stores before this reach a device before stores after it (place it after writing WQEs,
/// before the doorbell record or register that exposes them).
#[inline(always)]
pub(crate) fn dma_wmb() {
    barrier!(dma_wmb);
}

/// Loads after this see what a device wrote before the write an earlier load saw (place it
/// after a CQE's owner bit says the entry is new, before reading the entry).
#[inline(always)]
pub(crate) fn dma_rmb() {
    barrier!(dma_rmb);
}

/// Pushes a store to a write-combining page (a doorbell register) out of the CPU, ordered
/// after the stores before it; before such a store, keeps it behind them.
#[inline(always)]
pub(crate) fn mmio_flush_writes() {
    barrier!(mmio_flush_writes);
}

/// The instructions [`dma_wmb`], [`dma_rmb`] and [`mmio_flush_writes`] are here, in that
/// order (`""`: a compiler barrier only).
#[cfg(test)]
const fn instructions() -> [&'static str; 3] {
    [insn!(dma_wmb), insn!(dma_rmb), insn!(mmio_flush_writes)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_architecture_has_the_barriers_rdma_core_uses() {
        let want: [&str; 3] = if cfg!(target_arch = "x86_64") {
            ["", "", "sfence"]
        } else if cfg!(target_arch = "aarch64") {
            // Outer-shareable: ordered as a PCIe device sees them, not only other CPUs.
            ["dmb oshst", "dmb oshld", "dsb st"]
        } else {
            ["full fence"; 3]
        };
        assert_eq!(instructions(), want);
        // They run (the asm is well formed for this target).
        dma_wmb();
        dma_rmb();
        mmio_flush_writes();
    }
}
