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

/// Whether a 16-bit record (a doorbell record's producer index) has reached free-running
/// counter `end`: at or past it, for records within 2^15 of it either way.
pub const fn reached16(record: u16, end: u64) -> bool {
    record.wrapping_sub(end as u16) as i16 >= 0
}

/// Whether free-running counter `counter` has reached `end`: at or past it, for counters
/// within 2^63 of it either way (a "rung to" word, a retired-completion counter).
pub const fn reached(counter: u64, end: u64) -> bool {
    (counter.wrapping_sub(end) as i64) >= 0
}

/// Free-running counter `cur` moved forward to the 16-bit value `to` (never backwards: a
/// `to` that is not ahead by less than 2^15 leaves it).
pub const fn advance16(cur: u64, to: u16) -> u64 {
    let d = to.wrapping_sub(cur as u16);
    if d != 0 && d < 0x8000 {
        cur.wrapping_add(d as u64)
    } else {
        cur
    }
}

/// A consumer index `ci` (free-running) caught up with a 24-bit record of it that others
/// store (executors and kernels that consume CQEs): taken when at most 2^23 ahead.
pub const fn catch_up24(ci: u64, record: u32) -> u64 {
    let ahead = (record as u64).wrapping_sub(ci) & 0xFF_FFFF;
    if ahead < 0x80_0000 {
        ci.wrapping_add(ahead)
    } else {
        ci
    }
}

/// Whether a CQ of `cnt` entries is full for producer `pi` (free-running) when its consumer
/// index record says `ci` (24 bits): the producer a whole ring ahead.
pub const fn cq_full24(pi: u64, ci: u32, cnt: u32) -> bool {
    ((pi as u32).wrapping_sub(ci) & 0xFF_FFFF) >= cnt
}

#[cfg(test)]
#[path = "index_model_tests.rs"]
mod model_tests;
