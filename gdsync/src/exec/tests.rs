//! Unit tests of wait conditions and of the host executors.

use super::*;
use crate::ops::{ops_of, Op, Ops, WaitCond};
use crate::Error;
use proptest::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A timeout long enough that a wait which should pass never hits it.
const LONG: Duration = Duration::from_secs(10);
/// A timeout for waits that are meant to time out.
const SHORT: Duration = Duration::from_millis(50);

/// The address a memory operation uses for `w`.
fn addr<T>(w: &T) -> u64 {
    w as *const T as usize as u64
}

/// Polls `f` until it holds or `LONG` has passed; returns whether it held.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < LONG {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

// ---------------------------------------------------------------------------------------------
// WaitCond
// ---------------------------------------------------------------------------------------------

#[test]
fn geq32_is_wrap_aware() {
    let c = WaitCond::Geq;
    assert!(c.test32(5, 5));
    assert!(c.test32(6, 5));
    assert!(!c.test32(4, 5));
    // Just past the wrap is "after".
    assert!(c.test32(0, 0xFFFF_FFFF));
    assert!(c.test32(3, 0xFFFF_FFFE));
    assert!(!c.test32(0xFFFF_FFFF, 0));
    // Half the range ahead still counts as ahead; one more is behind.
    assert!(c.test32(0x7FFF_FFFF, 0));
    assert!(!c.test32(0x8000_0000, 0));
    assert!(c.test32(0x8000_0000, 1));
}

#[test]
fn geq64_is_wrap_aware() {
    let c = WaitCond::Geq;
    assert!(c.test64(5, 5));
    assert!(c.test64(6, 5));
    assert!(!c.test64(4, 5));
    assert!(c.test64(0, u64::MAX));
    assert!(!c.test64(u64::MAX, 0));
    assert!(c.test64(0x7FFF_FFFF_FFFF_FFFF, 0));
    assert!(!c.test64(0x8000_0000_0000_0000, 0));
    // A 64-bit wait is not a 32-bit one: 2^32 is ahead of 0xFFFF_FFFF.
    assert!(c.test64(0x1_0000_0000, 0xFFFF_FFFF));
    assert!(!c.test64(0xFFFF_FFFF, 0x1_0000_0000));
}

#[test]
fn eq_and_nor_32() {
    assert!(WaitCond::Eq.test32(7, 7));
    assert!(!WaitCond::Eq.test32(7, 8));
    assert!(!WaitCond::Eq.test32(0, 0x8000_0000));

    assert!(WaitCond::And.test32(0x0100_0000, 0x0100_0000));
    assert!(WaitCond::And.test32(0xFF00_0000, 0x0100_0000));
    assert!(!WaitCond::And.test32(0xFEFF_FFFF, 0x0100_0000));
    assert!(!WaitCond::And.test32(0xFFFF_FFFF, 0));

    // NOR: some bit clear in both.
    assert!(WaitCond::Nor.test32(0, 0));
    assert!(!WaitCond::Nor.test32(0xFFFF_FFFF, 0));
    assert!(!WaitCond::Nor.test32(0, 0xFFFF_FFFF));
    assert!(!WaitCond::Nor.test32(0xF100_0000, 0xFEFF_FFFF));
    assert!(WaitCond::Nor.test32(0x0000_0000, 0xFEFF_FFFF));
    assert!(WaitCond::Nor.test32(0xFE00_1234, 0xFEFF_FFFF));
}

#[test]
fn eq_and_nor_64() {
    assert!(WaitCond::Eq.test64(u64::MAX, u64::MAX));
    assert!(!WaitCond::Eq.test64(1 << 40, 0));

    assert!(WaitCond::And.test64(1 << 63, 1 << 63));
    assert!(!WaitCond::And.test64(1 << 62, 1 << 63));
    // The high half takes part.
    assert!(WaitCond::And.test64(0x1_0000_0000, 0x1_0000_0000));

    assert!(WaitCond::Nor.test64(0, 0));
    assert!(!WaitCond::Nor.test64(u64::MAX, 0));
    assert!(!WaitCond::Nor.test64(0xFFFF_FFFF_0000_0000, 0x0000_0000_FFFF_FFFF));
    assert!(WaitCond::Nor.test64(0x7FFF_FFFF_0000_0000, 0x0000_0000_FFFF_FFFF));
    // A 32-bit NOR would pass here (low half all clear in both); the 64-bit one must look
    // at all bits.
    assert!(WaitCond::Nor.test64(0xFFFF_FFFF_0000_0000, 0xFFFF_FFFF_0000_0001));
    assert!(!WaitCond::Nor.test64(0xFFFF_FFFF_0000_0000, 0x0000_0000_FFFF_FFFF));
}

/// Reference semantics, written differently from the library: GEQ as "the forward distance
/// from `value` to `cur` is less than half the range".
fn ref32(cond: WaitCond, cur: u32, value: u32) -> bool {
    match cond {
        WaitCond::Geq => (cur as i64 - value as i64).rem_euclid(1 << 32) < (1 << 31),
        WaitCond::Eq => cur == value,
        WaitCond::And => (0..32).any(|i| (cur >> i) & 1 == 1 && (value >> i) & 1 == 1),
        WaitCond::Nor => (0..32).any(|i| (cur >> i) & 1 == 0 && (value >> i) & 1 == 0),
    }
}

fn ref64(cond: WaitCond, cur: u64, value: u64) -> bool {
    match cond {
        WaitCond::Geq => (cur as i128 - value as i128).rem_euclid(1 << 64) < (1 << 63),
        WaitCond::Eq => cur == value,
        WaitCond::And => (0..64).any(|i| (cur >> i) & 1 == 1 && (value >> i) & 1 == 1),
        WaitCond::Nor => (0..64).any(|i| (cur >> i) & 1 == 0 && (value >> i) & 1 == 0),
    }
}

fn any_cond() -> impl Strategy<Value = WaitCond> {
    prop_oneof![
        Just(WaitCond::Geq),
        Just(WaitCond::Eq),
        Just(WaitCond::And),
        Just(WaitCond::Nor),
    ]
}

/// `(cur, value)` pairs biased to the edges of every condition: uniform random pairs almost
/// always satisfy AND and NOR, so they alone would not tell a wrong formula from a right one.
fn pair32() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        (any::<u32>(), any::<u32>()),
        any::<u32>().prop_map(|c| (c, c)),
        any::<u32>().prop_map(|c| (c, !c)),
        (any::<u32>(), 0..32u32).prop_map(|(c, i)| (c, !c ^ (1 << i))),
        (any::<u32>(), -3i32..=3).prop_map(|(c, d)| (c, c.wrapping_add(d as u32))),
        (any::<u32>(), -3i32..=3)
            .prop_map(|(c, d)| (c, c.wrapping_add(0x8000_0000).wrapping_add(d as u32))),
        (0..32u32, 0..32u32).prop_map(|(i, j)| (1 << i, 1 << j)),
        (0..32u32, 0..32u32).prop_map(|(i, j)| (!(1u32 << i), !(1u32 << j))),
    ]
}

/// As [`pair32`], for 64-bit words.
fn pair64() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        (any::<u64>(), any::<u64>()),
        any::<u64>().prop_map(|c| (c, c)),
        any::<u64>().prop_map(|c| (c, !c)),
        (any::<u64>(), 0..64u32).prop_map(|(c, i)| (c, !c ^ (1 << i))),
        (any::<u64>(), -3i64..=3).prop_map(|(c, d)| (c, c.wrapping_add(d as u64))),
        (any::<u64>(), -3i64..=3)
            .prop_map(|(c, d)| (c, c.wrapping_add(1 << 63).wrapping_add(d as u64))),
        (0..64u32, 0..64u32).prop_map(|(i, j)| (1 << i, 1 << j)),
        (0..64u32, 0..64u32).prop_map(|(i, j)| (!(1u64 << i), !(1u64 << j))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn prop_test32_matches_reference(cond in any_cond(), (cur, value) in pair32()) {
        prop_assert_eq!(cond.test32(cur, value), ref32(cond, cur, value));
    }

    #[test]
    fn prop_test64_matches_reference(cond in any_cond(), (cur, value) in pair64()) {
        prop_assert_eq!(cond.test64(cur, value), ref64(cond, cur, value));
    }
}

proptest! {

    #[test]
    fn prop_geq32_near_value(value in any::<u32>(), d in 0u32..0x8000_0000) {
        // Anything up to 2^31 - 1 ahead passes, anything 1 to 2^31 behind does not.
        prop_assert!(WaitCond::Geq.test32(value.wrapping_add(d), value));
        prop_assert!(!WaitCond::Geq.test32(value.wrapping_sub(d + 1), value));
        prop_assert!(WaitCond::Eq.test32(value, value));
    }

    #[test]
    fn prop_geq64_near_value(value in any::<u64>(), d in 0u64..0x8000_0000_0000_0000) {
        prop_assert!(WaitCond::Geq.test64(value.wrapping_add(d), value));
        prop_assert!(!WaitCond::Geq.test64(value.wrapping_sub(d + 1), value));
    }

    #[test]
    fn prop_eq_and_nor_edge_values(cur in any::<u32>()) {
        // AND with 0 and NOR with all ones never pass; NOR with 0 passes unless cur is all ones.
        prop_assert!(!WaitCond::And.test32(cur, 0));
        prop_assert!(!WaitCond::Nor.test32(cur, u32::MAX));
        prop_assert_eq!(WaitCond::Nor.test32(cur, 0), cur != u32::MAX);
        prop_assert_eq!(WaitCond::And.test32(cur, u32::MAX), cur != 0);
        prop_assert!(!WaitCond::Eq.test32(cur, cur ^ 1));
    }
}

// ---------------------------------------------------------------------------------------------
// HostExecutor
// ---------------------------------------------------------------------------------------------

#[test]
fn host_executor_runs_writes_barrier_and_waits() {
    let w32 = Box::new(AtomicU32::new(0));
    let w64 = Box::new(AtomicU64::new(0));
    let done = Box::new(AtomicU32::new(0));
    // SAFETY: the boxed words outlive the list, which is run on this thread only.
    let ops = unsafe {
        ops_of(&[
            Op::Write32 {
                addr: addr(&*w32),
                value: 0xDEAD_BEEF,
            },
            Op::Barrier,
            Op::Write64 {
                addr: addr(&*w64),
                value: 0x0123_4567_89AB_CDEF,
            },
            Op::Wait32 {
                addr: addr(&*w32),
                value: 0xDEAD_BEEF,
                cond: WaitCond::Eq,
            },
            Op::Wait64 {
                addr: addr(&*w64),
                value: 0x0123_4567_89AB_CDEF,
                cond: WaitCond::Geq,
            },
            Op::Write32 {
                addr: addr(&*done),
                value: 1,
            },
        ])
    };
    assert_eq!(ops.len(), 6);
    HostExecutor::with_timeout(LONG).run(&ops).unwrap();
    assert_eq!(w32.load(Ordering::SeqCst), 0xDEAD_BEEF);
    assert_eq!(w64.load(Ordering::SeqCst), 0x0123_4567_89AB_CDEF);
    assert_eq!(done.load(Ordering::SeqCst), 1);

    // The list can be run again; the writes overwrite.
    w32.store(0, Ordering::SeqCst);
    done.store(0, Ordering::SeqCst);
    HostExecutor::default().run(&ops).unwrap();
    assert_eq!(w32.load(Ordering::SeqCst), 0xDEAD_BEEF);
    assert_eq!(done.load(Ordering::SeqCst), 1);
}

#[test]
fn host_executor_write64_is_one_native_store() {
    // A 64-bit write of a doorbell value lays the 8 head bytes in memory.
    let w = Box::new(AtomicU64::new(0));
    let head = [0x00, 0x00, 0x05, 0x08, 0x00, 0x01, 0x23, 0x03];
    let value = crate::format::doorbell_value(head);
    // SAFETY: the boxed word outlives the list, run on this thread only.
    let ops = unsafe {
        ops_of(&[Op::Write64 {
            addr: addr(&*w),
            value,
        }])
    };
    HostExecutor::default().run(&ops).unwrap();
    #[cfg(target_endian = "little")]
    assert_eq!(w.load(Ordering::SeqCst).to_ne_bytes(), head);
    assert_eq!(w.load(Ordering::SeqCst), value);
}

#[test]
fn host_executor_empty_list_is_ok() {
    assert!(Ops::new().is_empty());
    HostExecutor::with_timeout(SHORT).run(&Ops::new()).unwrap();
}

#[test]
fn host_executor_waits_pass_for_every_condition() {
    let w32 = Box::new(AtomicU32::new(0x0100_0005));
    let w64 = Box::new(AtomicU64::new(0x1_0000_0005));
    let cases32 = [
        (WaitCond::Geq, 0x0100_0005),
        (WaitCond::Geq, 0x0000_0005),
        (WaitCond::Eq, 0x0100_0005),
        (WaitCond::And, 0x0100_0000),
        (WaitCond::Nor, 0xFEFF_FFF0),
    ];
    let cases64 = [
        (WaitCond::Geq, 0x1_0000_0000),
        (WaitCond::Eq, 0x1_0000_0005),
        (WaitCond::And, 0x1_0000_0000),
        (WaitCond::Nor, 0xFFFF_FFFE_FFFF_FFF0),
    ];
    let ex = HostExecutor::with_timeout(LONG);
    for (cond, value) in cases32 {
        assert!(cond.test32(w32.load(Ordering::SeqCst), value));
        // SAFETY: the boxed word outlives the list, run on this thread only.
        let ops = unsafe {
            ops_of(&[Op::Wait32 {
                addr: addr(&*w32),
                value,
                cond,
            }])
        };
        ex.run(&ops)
            .unwrap_or_else(|e| panic!("{cond:?} {value:#x}: {e}"));
    }
    for (cond, value) in cases64 {
        assert!(cond.test64(w64.load(Ordering::SeqCst), value));
        // SAFETY: as above.
        let ops = unsafe {
            ops_of(&[Op::Wait64 {
                addr: addr(&*w64),
                value,
                cond,
            }])
        };
        ex.run(&ops)
            .unwrap_or_else(|e| panic!("{cond:?} {value:#x}: {e}"));
    }
}

#[test]
fn host_executor_wait32_times_out_and_stops_the_list() {
    let w = Box::new(AtomicU32::new(1));
    let after = Box::new(AtomicU32::new(0));
    // SAFETY: the boxed words outlive the list, run on this thread only.
    let ops = unsafe {
        ops_of(&[
            Op::Wait32 {
                addr: addr(&*w),
                value: 2,
                cond: WaitCond::Eq,
            },
            Op::Write32 {
                addr: addr(&*after),
                value: 1,
            },
        ])
    };
    let err = HostExecutor::with_timeout(SHORT).run(&ops).unwrap_err();
    match err {
        Error::Timeout { timeout_ms, what } => {
            assert_eq!(timeout_ms, 50);
            assert!(what.contains("32-bit"), "{what}");
        }
        e => panic!("expected a timeout, got {e:?}"),
    }
    assert_eq!(
        after.load(Ordering::SeqCst),
        0,
        "op after a failed wait ran"
    );
}

#[test]
fn host_executor_wait64_times_out() {
    // GEQ on a 64-bit word that is half the range behind.
    let w = Box::new(AtomicU64::new(0));
    // SAFETY: the boxed word outlives the list, run on this thread only.
    let ops = unsafe {
        ops_of(&[Op::Wait64 {
            addr: addr(&*w),
            value: 1 << 40,
            cond: WaitCond::Geq,
        }])
    };
    let err = HostExecutor::with_timeout(SHORT).run(&ops).unwrap_err();
    assert!(
        matches!(err, Error::Timeout { timeout_ms: 50, .. }),
        "{err:?}"
    );
}

#[test]
fn host_executor_nor_wait_on_initial_cqe_word_times_out() {
    // The first-pass CQE wait on a freshly initialised entry (op_own 0xF1) must block.
    let cqe = crate::format::Cqe64::default();
    let w = Box::new(AtomicU32::new(cqe.owner_word()));
    let (cond, value) = crate::format::CqeOwner::wait_word(0, 16);
    // SAFETY: the boxed word outlives the list, run on this thread only.
    let ops = unsafe {
        ops_of(&[Op::Wait32 {
            addr: addr(&*w),
            value,
            cond,
        }])
    };
    assert!(matches!(
        HostExecutor::with_timeout(SHORT).run(&ops),
        Err(Error::Timeout { .. })
    ));
    // Once the CQE (owner 0) is written, the same wait passes.
    let mut written = cqe;
    written.set_op_own(crate::format::CqeOpcode::Req, false, 0);
    w.store(written.owner_word(), Ordering::SeqCst);
    HostExecutor::with_timeout(LONG).run(&ops).unwrap();
}

#[test]
fn host_executor_wait_released_by_another_thread() {
    let flag = Arc::new(AtomicU64::new(0));
    let out = Box::new(AtomicU32::new(0));
    // SAFETY: `flag` is kept alive by the Arc held here until after `run` returns, `out` by
    // its box; the list runs on this thread only.
    let ops = unsafe {
        ops_of(&[
            Op::Wait64 {
                addr: addr(&*flag),
                value: 3,
                cond: WaitCond::Geq,
            },
            Op::Write32 {
                addr: addr(&*out),
                value: 42,
            },
        ])
    };
    let f = flag.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        f.store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        f.store(4, Ordering::SeqCst);
    });
    HostExecutor::with_timeout(LONG).run(&ops).unwrap();
    assert_eq!(flag.load(Ordering::SeqCst), 4);
    assert_eq!(out.load(Ordering::SeqCst), 42);
    setter.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// HostStream
// ---------------------------------------------------------------------------------------------

#[test]
fn host_stream_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<HostStream>();
    check::<HostExecutor>();
    check::<Ops>();
}

#[test]
fn host_stream_new_is_idle() {
    let s = HostStream::new().unwrap();
    assert!(s.is_idle());
    s.synchronize().unwrap();
    // Empty lists are not queued.
    s.enqueue(Ops::new());
    assert!(s.is_idle());
    s.synchronize().unwrap();
}

#[test]
fn host_stream_runs_lists_in_order() {
    // Declared before the stream so that they outlive it, even when an assertion unwinds.
    let flag = Box::new(AtomicU32::new(0));
    let out = Box::new(AtomicU32::new(0));
    let s = HostStream::with_timeout(LONG).unwrap();
    // SAFETY: `flag` and `out` are declared before `s`, so they outlive the stream and every
    // list it runs.
    let (l1, l2) = unsafe {
        (
            ops_of(&[Op::Wait32 {
                addr: addr(&*flag),
                value: 1,
                cond: WaitCond::Eq,
            }]),
            ops_of(&[Op::Write32 {
                addr: addr(&*out),
                value: 7,
            }]),
        )
    };
    s.enqueue(l1);
    s.enqueue(l2);
    // Give the stream time to (wrongly) run list 2; it must stay behind list 1's wait.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        out.load(Ordering::SeqCst),
        0,
        "list 2 ran before list 1's wait passed"
    );
    assert!(!s.is_idle());

    flag.store(1, Ordering::SeqCst);
    s.synchronize().unwrap();
    assert_eq!(out.load(Ordering::SeqCst), 7);
    assert!(s.is_idle());
}

#[test]
fn host_stream_many_lists_keep_order() {
    // List i checks that the counter is i, then sets it to i + 1: any reordering makes a wait
    // time out and synchronize fail.
    let counter = Box::new(AtomicU64::new(0));
    let s = HostStream::with_timeout(LONG).unwrap();
    for i in 0..200u64 {
        // SAFETY: `counter` is declared before `s` and outlives it.
        let l = unsafe {
            ops_of(&[
                Op::Wait64 {
                    addr: addr(&*counter),
                    value: i,
                    cond: WaitCond::Eq,
                },
                Op::Barrier,
                Op::Write64 {
                    addr: addr(&*counter),
                    value: i + 1,
                },
            ])
        };
        s.enqueue(l);
    }
    s.synchronize().unwrap();
    assert_eq!(counter.load(Ordering::SeqCst), 200);
}

#[test]
fn host_stream_keeps_running_after_synchronize() {
    let out = Box::new(AtomicU32::new(0));
    let s = HostStream::with_timeout(LONG).unwrap();
    for v in 1..=3u32 {
        // SAFETY: `out` is declared before `s` and outlives it.
        s.enqueue(unsafe {
            ops_of(&[Op::Write32 {
                addr: addr(&*out),
                value: v,
            }])
        });
        s.synchronize().unwrap();
        assert_eq!(out.load(Ordering::SeqCst), v);
    }
}

#[test]
fn host_stream_timeout_is_reported_and_later_lists_are_skipped() {
    let never = Box::new(AtomicU32::new(0));
    let out = Box::new(AtomicU32::new(0));
    let s = HostStream::with_timeout(SHORT).unwrap();
    // SAFETY: `never` is declared before `s` and outlives it.
    let wait = unsafe {
        ops_of(&[Op::Wait32 {
            addr: addr(&*never),
            value: 1,
            cond: WaitCond::Eq,
        }])
    };
    let write = |v| {
        // SAFETY: `out` is declared before `s` and outlives it.
        unsafe {
            ops_of(&[Op::Write32 {
                addr: addr(&*out),
                value: v,
            }])
        }
    };
    s.enqueue(wait.clone());
    s.enqueue(write(1));
    let err = s.synchronize().unwrap_err();
    assert!(
        matches!(err, Error::Timeout { timeout_ms: 50, .. }),
        "{err:?}"
    );
    assert_eq!(
        out.load(Ordering::SeqCst),
        0,
        "list after a failed wait ran"
    );

    // After the error was reported, the stream works again.
    s.enqueue(write(2));
    s.synchronize().unwrap();
    assert_eq!(out.load(Ordering::SeqCst), 2);

    // Lists enqueued after a failure but before synchronize are skipped too.
    s.enqueue(wait);
    assert!(
        eventually(|| s.is_idle()),
        "stream did not finish the failing list"
    );
    s.enqueue(write(3));
    assert!(eventually(|| s.is_idle()), "stream did not drain");
    assert_eq!(
        out.load(Ordering::SeqCst),
        2,
        "list after an unreported error ran"
    );
    assert!(matches!(s.synchronize(), Err(Error::Timeout { .. })));
    // The error is reported once.
    s.synchronize().unwrap();
    s.enqueue(write(4));
    s.synchronize().unwrap();
    assert_eq!(out.load(Ordering::SeqCst), 4);
}

#[test]
fn host_stream_reports_only_the_first_error() {
    let never32 = Box::new(AtomicU32::new(0));
    let never64 = Box::new(AtomicU64::new(0));
    let s = HostStream::with_timeout(SHORT).unwrap();
    // SAFETY: the words are declared before `s` and outlive it.
    unsafe {
        s.enqueue(ops_of(&[Op::Wait32 {
            addr: addr(&*never32),
            value: 1,
            cond: WaitCond::And,
        }]));
        s.enqueue(ops_of(&[Op::Wait64 {
            addr: addr(&*never64),
            value: 1,
            cond: WaitCond::Eq,
        }]));
    }
    match s.synchronize() {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("32-bit"), "{what}"),
        r => panic!("expected the 32-bit wait's timeout, got {r:?}"),
    }
    s.synchronize().unwrap();
}

#[test]
fn host_stream_wait_released_by_test_thread_64() {
    let flag = Box::new(AtomicU64::new(0));
    let out = Box::new(AtomicU64::new(0));
    let s = HostStream::with_timeout(LONG).unwrap();
    // SAFETY: `flag` and `out` are declared before `s` and outlive it.
    unsafe {
        s.enqueue(ops_of(&[
            Op::Wait64 {
                addr: addr(&*flag),
                value: 0x1_0000_0000,
                cond: WaitCond::And,
            },
            Op::Write64 {
                addr: addr(&*out),
                value: u64::MAX,
            },
        ]));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(out.load(Ordering::SeqCst), 0);
    // Low bits do not satisfy the AND.
    flag.store(0xFFFF_FFFF, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(out.load(Ordering::SeqCst), 0);
    flag.store(0x1_0000_0000, Ordering::SeqCst);
    s.synchronize().unwrap();
    assert_eq!(out.load(Ordering::SeqCst), u64::MAX);
}

#[test]
fn host_stream_drop_while_blocked_returns_promptly() {
    let never = Box::new(AtomicU32::new(0));
    let out = Box::new(AtomicU32::new(0));
    // The default timeout is a minute: only the drop can end the wait in time.
    let s = HostStream::new().unwrap();
    // SAFETY: `never` and `out` are declared before `s` and outlive it; the stream is dropped
    // (its thread joined) before they are.
    unsafe {
        s.enqueue(ops_of(&[Op::Wait32 {
            addr: addr(&*never),
            value: 1,
            cond: WaitCond::Eq,
        }]));
        s.enqueue(ops_of(&[Op::Write32 {
            addr: addr(&*out),
            value: 1,
        }]));
    }
    // Let the stream take the wait and settle into its back-off.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!s.is_idle());
    let start = Instant::now();
    drop(s);
    let took = start.elapsed();
    assert!(took < LONG, "dropping a blocked stream took {took:?}");
    // The list behind the abandoned wait never ran, and nothing runs any more.
    assert_eq!(out.load(Ordering::SeqCst), 0);
    never.store(1, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(out.load(Ordering::SeqCst), 0);
}

#[test]
fn host_stream_drop_with_queued_work_and_no_wait() {
    // Dropping an idle stream, or one with finished work, is prompt as well.
    let out = Box::new(AtomicU32::new(0));
    let s = HostStream::with_timeout(LONG).unwrap();
    // SAFETY: `out` is declared before `s` and outlives it.
    s.enqueue(unsafe {
        ops_of(&[Op::Write32 {
            addr: addr(&*out),
            value: 5,
        }])
    });
    s.synchronize().unwrap();
    let start = Instant::now();
    drop(s);
    assert!(start.elapsed() < LONG);
    assert_eq!(out.load(Ordering::SeqCst), 5);
}

/// Runs `f` on its own thread and fails if it has not finished within a minute (a deadlock;
/// the stuck thread is leaked).
fn finishes_within_a_minute(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => t.join().unwrap(),
        // The thread panicked: report its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("deadlock: a HostStream drop never returned")
        }
    }
}

#[test]
fn host_stream_drop_right_after_synchronize_never_hangs() {
    // Regression: Drop used to set `stop` and notify without the state lock, so the worker
    // could check `stop`, miss the wakeup and wait forever, leaving Drop stuck in join.
    finishes_within_a_minute(|| {
        let out = Box::new(AtomicU32::new(0));
        for i in 0..10000u32 {
            let s = HostStream::with_timeout(LONG).unwrap();
            // SAFETY: `out` is declared before `s` and outlives it.
            s.enqueue(unsafe {
                ops_of(&[Op::Write32 {
                    addr: addr(&*out),
                    value: i,
                }])
            });
            s.synchronize().unwrap();
            drop(s);
            assert_eq!(out.load(Ordering::SeqCst), i);
        }
    });
}

#[test]
fn host_stream_drop_of_fresh_stream_never_hangs() {
    finishes_within_a_minute(|| {
        for _ in 0..20000 {
            drop(HostStream::with_timeout(LONG).unwrap());
        }
    });
}

#[test]
fn default_wait_timeout_is_a_minute() {
    assert_eq!(DEFAULT_WAIT_TIMEOUT, Duration::from_secs(60));
}

/// A barrier right before a write is left out on x86-64 (a release store is ordered after
/// everything before it there); before a doorbell, a wait or nothing it stays.
#[test]
fn a_barrier_before_a_write_is_left_out_only_where_the_write_orders_itself() {
    let w = Op::Write32 { addr: 8, value: 1 };
    let db = Op::Doorbell { addr: 8, value: 1 };
    let wait = Op::Wait32 {
        addr: 8,
        value: 1,
        cond: WaitCond::Geq,
    };
    assert_eq!(
        host::write_orders_itself(Some(&w)),
        cfg!(target_arch = "x86_64")
    );
    assert!(!host::write_orders_itself(Some(&db)));
    assert!(!host::write_orders_itself(Some(&wait)));
    assert!(!host::write_orders_itself(None));
}
