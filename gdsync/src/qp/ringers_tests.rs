//! [`Ringers`]: what a commit stores after its doorbell, and when a CPU post may ring on a
//! QP whose commits do not publish "rung to" (a completion must show them rung first).

use super::batch_tests::{pair_with, Pair};
use super::ring_order_tests::write8;
use super::{QpConfig, Ringers};
use crate::exec::{Executor, HostStream};
use crate::ops::Op;
use crate::Device;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn executors_only() -> QpConfig {
    QpConfig {
        ringers: Ringers::Executors,
        ..QpConfig::default()
    }
}

/// The kinds of a commit's ops of the next send of `p.a`, as short names.
fn commit_shape(p: &mut Pair) -> Vec<&'static str> {
    let prepared = p.a.prepare_send(&write8(p, 0, 0)).unwrap();
    let (_, ops) = p.a.commit(prepared).unwrap();
    let shape = ops.as_slice().iter().map(kind).collect();
    // Run it, so nothing is left unrung.
    HostStream::new().unwrap().submit(ops).unwrap();
    shape
}

/// An op's kind, as a short name.
fn kind(o: &Op) -> &'static str {
    match o {
        Op::Write32 { .. } => "write32",
        Op::Write64 { .. } => "write64",
        Op::Doorbell { .. } => "doorbell",
        Op::Barrier => "barrier",
        Op::Wait32 { .. } => "wait32",
        _ => "other",
    }
}

/// A send's wait stores the CQ's consumer index, then, after a barrier (a store orders
/// nothing by itself), hands the ring's slots back: a CPU that posts into them adds
/// completions the CQ must have room for.
#[test]
fn a_send_wait_stores_the_consumer_index_before_the_ring_retirement() {
    let dev = Device::soft().unwrap();
    let mut p = pair_with(&dev, &QpConfig::default());
    let prepared = p.a.prepare_send(&write8(&p, 0, 0)).unwrap();
    let (ticket, ring) = p.a.commit(prepared).unwrap();
    let wait = p.a.send_wait_ops(&ticket).unwrap();
    let shape: Vec<_> = wait.as_slice().iter().map(kind).collect();
    assert_eq!(shape, ["wait32", "write32", "barrier", "write64"]);
    let stream = HostStream::new().unwrap();
    stream.submit(ring).unwrap();
    stream.submit(wait).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(p.send_cq.consumer_index(), 1);
}

#[test]
fn only_a_mixed_qp_stores_rung_to_after_a_commits_doorbell() {
    let dev = Device::soft().unwrap();
    let mut mixed = pair_with(&dev, &QpConfig::default());
    assert_eq!(
        commit_shape(&mut mixed),
        ["barrier", "write32", "barrier", "doorbell", "barrier", "write64"]
    );
    let mut only = pair_with(&dev, &executors_only());
    assert_eq!(
        commit_shape(&mut only),
        ["barrier", "write32", "barrier", "doorbell"]
    );
}

#[test]
fn an_executors_only_qp_refuses_cpu_posts_until_a_completion_shows_commits_rung() {
    let dev = Device::soft().unwrap();
    let mut p = pair_with(&dev, &executors_only());
    // CPU posts before any commit: nothing to race.
    p.a.post_send(&write8(&p, 0, 0)).unwrap();
    assert_eq!(p.send_cq.wait_one(WAIT).unwrap().wr_id, 0);
    let stream = HostStream::new().unwrap();
    let prepared = p.a.prepare_send(&write8(&p, 8, 1)).unwrap();
    p.a.post_prepared(prepared, &stream).unwrap();
    stream.synchronize().unwrap();
    // Rung, but nothing says so: refused, and the error says what to do.
    assert!(p.a.has_unrung_commits());
    let e = p.a.post_send(&write8(&p, 16, 2)).unwrap_err().to_string();
    assert!(
        e.contains("Ringers::Mixed") && e.contains("completion"),
        "{e}"
    );
    // Its completion polled: the doorbell rang, the CPU may ring.
    assert_eq!(p.send_cq.wait_one(WAIT).unwrap().wr_id, 1);
    assert!(!p.a.has_unrung_commits());
    p.a.post_send(&write8(&p, 16, 2)).unwrap();
    let c = p.send_cq.wait_one(WAIT).unwrap();
    assert_eq!((c.wr_id, c.is_ok()), (2, true), "{c:?}");
}

/// Commits on a stream, each round ending with a wait for its last send's completion on the
/// stream (which retires it), then a CPU post as soon as the CPU sees that retirement: every
/// send completes, in order (the soft device turns a doorbell that goes backwards into a QP
/// error).
#[test]
fn executors_only_commits_and_cpu_posts_after_their_stream_wait_interleave() {
    let dev = Device::soft().unwrap();
    let mut p = pair_with(&dev, &executors_only());
    let stream = HostStream::new().unwrap();
    let mut next = 0u64;
    for round in 0..300 {
        let mut last = None;
        for k in 0..3 {
            let prepared = p.a.prepare_send(&write8(&p, 8 * k, next)).unwrap();
            last = Some(p.a.post_prepared(prepared, &stream).unwrap());
            next += 1;
        }
        p.a.wait_send(&last.unwrap(), &stream).unwrap();
        // The CPU races the stream: refused until the stream's wait has retired the sends.
        let start = std::time::Instant::now();
        while p.a.has_unrung_commits() {
            assert!(
                start.elapsed() < WAIT,
                "round {round}: the stream never waited"
            );
            std::hint::spin_loop();
        }
        p.a.post_send(&write8(&p, 24, next)).unwrap();
        next += 1;
        stream.synchronize().unwrap();
        // The stream's wait consumed the commits' completions; the CPU post's comes next.
        let c = p.send_cq.wait_one(WAIT).unwrap();
        assert_eq!(
            (c.wr_id, c.is_ok()),
            (next - 1, true),
            "round {round}: {c:?}"
        );
        assert_eq!(c.wqe_counter as u64, (next - 1) & 0xFFFF, "round {round}");
    }
}
