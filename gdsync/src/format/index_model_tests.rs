//! The ring-index arithmetic checked exhaustively against counters that do not wrap: for every
//! true distance the protocol allows between producer and consumer (or record and counter),
//! at every position of a window around each wrap of the 16-bit, 24-bit and 32-bit fields
//! and of `u64` itself, and for every power-of-two ring size, the wrapped computation gives
//! the answer the unwrapped counters give.

use super::*;
use crate::format::{CqeOwner, CQE_INIT_OP_OWN};

/// Free-running counter values around each place a field wraps (and around 0).
fn around_wraps(half_window: u64) -> Vec<u64> {
    let mut v = Vec::new();
    for edge in [1u64 << 16, 1 << 24, 1 << 32, 3 << 40] {
        v.extend(edge - half_window..edge + half_window);
    }
    v.extend(0..half_window);
    v.extend(u64::MAX - 2 * half_window..u64::MAX - half_window);
    v
}

#[test]
fn a_doorbell_record_reaches_a_counter_exactly_when_it_is_at_or_past_it() {
    for end in around_wraps(64) {
        for d in -(1i64 << 15) + 1..(1i64 << 15) {
            let record = end.wrapping_add(d as u64);
            assert_eq!(
                reached16(idx16(record), end),
                d >= 0,
                "end {end}, record {record}"
            );
        }
    }
}

#[test]
fn a_counter_reaches_another_exactly_when_it_is_at_or_past_it() {
    for end in around_wraps(64) {
        for d in [
            i64::MIN + 1,
            -(1 << 40),
            -65536,
            -2,
            -1,
            0,
            1,
            2,
            65536,
            1 << 40,
            i64::MAX,
        ] {
            let counter = end.wrapping_add(d as u64);
            assert_eq!(
                reached(counter, end),
                d >= 0,
                "end {end}, counter {counter}"
            );
        }
    }
}

#[test]
fn a_counter_advances_to_a_16_bit_value_ahead_and_never_back() {
    for cur in around_wraps(64) {
        for d in -(1i64 << 15)..(1i64 << 15) {
            let to = cur.wrapping_add(d as u64);
            let want = if d > 0 { to } else { cur };
            assert_eq!(advance16(cur, idx16(to)), want, "cur {cur}, to {to}");
        }
    }
}

#[test]
fn a_consumer_index_catches_up_with_a_24_bit_record_ahead_of_it() {
    for ci in around_wraps(16) {
        // Others consume at most 2^23 - 1 ahead; a record behind (a stale store) is ignored.
        for d in (-(1i64 << 23)..(1i64 << 23)).step_by(61).chain(-70..70) {
            let rec = ci.wrapping_add(d as u64);
            let want = if d >= 0 { rec } else { ci };
            assert_eq!(
                catch_up24(ci, rec as u32 & 0xFF_FFFF),
                want,
                "ci {ci}, d {d}"
            );
        }
    }
}

#[test]
fn a_cq_is_full_exactly_when_the_producer_is_a_ring_ahead() {
    for shift in 0..=22u32 {
        let cnt = 1u32 << shift;
        for pi in around_wraps(8) {
            // The consumer is never ahead of the producer nor more than a ring behind.
            let behind = [0, 1, cnt / 2, cnt.saturating_sub(1), cnt];
            for d in behind.into_iter().filter(|&d| u64::from(d) <= pi) {
                let ci = pi - u64::from(d);
                assert_eq!(
                    cq_full24(pi, ci as u32 & 0xFF_FFFF, cnt),
                    d >= cnt,
                    "cnt {cnt}, pi {pi}, ci {ci}"
                );
            }
        }
    }
}

#[test]
fn a_cqe_is_new_exactly_when_it_is_the_one_the_consumer_expects() {
    let op_own = |n: u64, cnt: u32| 0x20 | CqeOwner::expected(n, cnt);
    for shift in 0..=22u32 {
        let cnt = 1u32 << shift;
        for n in around_wraps(8) {
            // The slot of CQE n holds CQE n (written) or CQE n - cnt (the last pass).
            assert!(CqeOwner::is_new(op_own(n, cnt), n, cnt), "cnt {cnt}, n {n}");
            if let Some(old) = n.checked_sub(u64::from(cnt)) {
                assert!(
                    !CqeOwner::is_new(op_own(old, cnt), n, cnt),
                    "cnt {cnt}, n {n}"
                );
            }
            // Before the first pass the entry is as the ring was initialised.
            if n < u64::from(cnt) {
                assert!(
                    !CqeOwner::is_new(CQE_INIT_OP_OWN, n, cnt),
                    "cnt {cnt}, n {n}"
                );
            }
        }
    }
}
