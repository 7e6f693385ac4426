//! Ring-index arithmetic. Producer and consumer counters are free-running; the hardware sees
//! them modulo 2^16 (SQ/RQ) or 2^24 (CQ), and slots are counters modulo the ring size.

use super::{SEG_SIZE, WQEBB};

/// Number of WQEBBs a WQE of `ds` 16-byte units takes: `ceil(ds*16/64)`.
pub const fn wqebbs_for_ds(ds: usize) -> usize {
    (ds * SEG_SIZE).div_ceil(WQEBB)
}

/// A free-running counter reduced to the 16 bits the hardware carries.
pub const fn idx16(counter: u64) -> u16 {
    counter as u16
}

/// `a - b` in 16-bit wrapping arithmetic: how far counter `a` is ahead of `b`.
pub const fn idx16_diff(a: u16, b: u16) -> u16 {
    a.wrapping_sub(b)
}
