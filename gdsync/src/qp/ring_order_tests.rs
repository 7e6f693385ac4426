//! Doorbells rung by several ringers of one QP: CPU executors flush every doorbell they store
//! out of the write-combining buffer, and a CPU post waits until another ringer's doorbell
//! is out (the "rung to" word), so doorbells never go backwards.

use super::batch_tests::{pair, Pair};
use crate::exec::{test_hooks, Executor, HostExecutor, HostStream};
use crate::ops::{ops_of, Op, Ops};
use crate::{Device, SendWr};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// A signalled write of the source's bytes `at..at + 8` to the same place in the destination.
pub(super) fn write8(p: &Pair, at: usize, wr_id: u64) -> SendWr {
    SendWr::write(p.dst.remote().at(at as u64))
        .sge(p.src.sge(at..at + 8))
        .wr_id(wr_id)
}

/// The address of QP `a`'s doorbell register (the half executors ring).
fn doorbell(p: &Pair) -> u64 {
    p.a.shared.doorbell.addr()
}

#[test]
fn cpu_executors_flush_every_doorbell_they_ring() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let db = doorbell(&p);
    let host = HostExecutor::default();
    for i in 0..8 {
        let before = test_hooks::flushes_after(db);
        let prepared = p.a.prepare_send(&write8(&p, 8 * i, i as u64)).unwrap();
        p.a.post_prepared(prepared, &host).unwrap();
        assert_eq!(
            test_hooks::flushes_after(db),
            before + 1,
            "the host executor flushed its doorbell {i}"
        );
        assert_eq!(p.send_cq.wait_one(WAIT).unwrap().wr_id, i as u64);
    }
    let stream = HostStream::new().unwrap();
    for i in 0..8 {
        let before = test_hooks::flushes_after(db);
        let prepared = p.a.prepare_send(&write8(&p, 8 * i, i as u64)).unwrap();
        p.a.post_prepared(prepared, &stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(
            test_hooks::flushes_after(db),
            before + 1,
            "the host stream flushed its doorbell {i}"
        );
        assert_eq!(p.send_cq.wait_one(WAIT).unwrap().wr_id, i as u64);
    }
}

/// The commit list of the next send of `p.a`, and the ops before its doorbell (the doorbell
/// record and the barrier).
fn commit_next(p: &mut Pair, i: u64) -> Ops {
    let prepared = p.a.prepare_send(&write8(p, 0, i)).unwrap();
    let (_, ops) = p.a.commit(prepared).unwrap();
    let at = ops
        .as_slice()
        .iter()
        .position(|o| matches!(o, Op::Doorbell { .. }))
        .expect("a commit rings a doorbell");
    assert!(at > 0, "{ops:?}");
    ops
}

/// Runs `ops[range]` on this thread (`ops` keeps their memory alive meanwhile).
fn run_part(ops: &Ops, range: std::ops::Range<usize>) {
    // SAFETY: the ops are a commit's, whose memory `ops` keeps alive while this runs.
    let part = unsafe { ops_of(&ops.as_slice()[range]) };
    HostExecutor::default().run(&part).unwrap();
}

#[test]
fn a_cpu_post_waits_for_the_doorbell_not_the_record() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let ops = commit_next(&mut p, 1);
    let db = ops
        .as_slice()
        .iter()
        .position(|o| matches!(o, Op::Doorbell { .. }))
        .unwrap();
    // An executor stored the doorbell record (and its barrier) but not the doorbell yet: the
    // record is there, the doorbell is not, and a CPU doorbell now would go out first.
    run_part(&ops, 0..db);
    assert!(p.a.has_unrung_commits(), "record stored, doorbell not rung");
    let e = p.a.post_send(&write8(&p, 8, 2)).unwrap_err().to_string();
    assert!(e.contains("not been rung yet"), "{e}");
    // Its doorbell rung but "rung to" not published yet: still refused.
    run_part(&ops, db..db + 1);
    assert!(p.a.has_unrung_commits(), "doorbell rung, not published");
    // Published: the CPU may ring.
    run_part(&ops, db + 1..ops.len());
    assert!(!p.a.has_unrung_commits());
    p.a.post_send(&write8(&p, 8, 2)).unwrap();
    for id in [1, 2] {
        let c = p.send_cq.wait_one(WAIT).unwrap();
        assert_eq!((c.wr_id, c.is_ok()), (id, true), "{c:?}");
    }
}

/// CPU posts interleaved with `HostStream` commits on one QP, `rounds` rounds of `per`
/// sends: every send completes, in order, without error (the soft device turns a doorbell
/// that goes backwards into a QP error).
pub(crate) fn interleave_cpu_and_stream(p: &mut Pair, rounds: u64, per: u64) {
    let stream = HostStream::new().unwrap();
    let mut next = 0u64;
    for round in 0..rounds {
        let first = next;
        for k in 0..per {
            let wr = write8(p, 8 * (k as usize % 8), next);
            if k % 2 == 0 {
                let prepared = p.a.prepare_send(&wr).unwrap();
                p.a.post_prepared(prepared, &stream).unwrap();
            } else {
                // Right after the stream was handed a commit: the CPU post races its ring.
                let start = std::time::Instant::now();
                while p.a.has_unrung_commits() {
                    assert!(start.elapsed() < WAIT, "the stream never rang");
                    std::hint::spin_loop();
                }
                p.a.post_send(&wr).unwrap();
            }
            next += 1;
        }
        stream.synchronize().unwrap();
        for id in first..next {
            let c = p.send_cq.wait_one(WAIT).unwrap_or_else(|e| {
                panic!(
                    "round {round}: send {id} did not complete: {e}; {}",
                    p.a.describe()
                )
            });
            assert!(c.is_ok(), "round {round}: {c:?}");
            assert_eq!(c.wr_id, id, "round {round}: completions in order");
        }
    }
}

#[test]
fn cpu_posts_and_host_stream_commits_interleave_on_one_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    interleave_cpu_and_stream(&mut p, 500, 8);
}

/// As [`cpu_posts_and_host_stream_commits_interleave_on_one_qp`], with the stream's
/// doorbells lingering before their store (as a store lingers in a write-combining buffer):
/// a CPU post that took the doorbell record for "rung" would ring in between, and the
/// stream's doorbell would then go backwards.
#[test]
fn cpu_posts_and_lingering_host_stream_doorbells_interleave_on_one_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    test_hooks::linger_at(doorbell(&p));
    interleave_cpu_and_stream(&mut p, 250, 8);
    test_hooks::linger_at(0);
}

/// Two executors on one QP, each ringing in commit order after the other: the doorbells
/// they ring stay in order.
#[test]
fn two_executors_ringing_in_commit_order_keep_doorbells_in_order() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let stream = HostStream::new().unwrap();
    let host = HostExecutor::default();
    for i in 0..2000u64 {
        let prepared = p.a.prepare_send(&write8(&p, 0, i)).unwrap();
        let (_, ops) = p.a.commit(prepared).unwrap();
        if i % 2 == 0 {
            stream.submit(ops).unwrap();
            stream.synchronize().unwrap();
        } else {
            host.submit(ops).unwrap();
        }
        let c = p.send_cq.wait_one(WAIT).unwrap();
        assert_eq!((c.wr_id, c.is_ok()), (i, true), "{c:?}");
    }
}
