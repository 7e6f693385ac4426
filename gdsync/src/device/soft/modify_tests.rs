//! A modify returns once the engine applied it, as a verbs modify returns once the HCA took
//! the command: work posted right after a QP's move to RTS goes out with the state that
//! move set (its first PSN), never ahead of it. Waiting for it does not make the engine one
//! of the waiting thread's own; a thread that used an engine lets it go once another thread
//! posts to or polls its queues.

use super::*;
use crate::{Access, Device, QpConfig, RecvWr, SendWr};
use std::time::Duration;

/// Commands the device's engine was sent and has not applied yet.
fn unapplied(d: &Device) -> u64 {
    let ctl = super::soft_of(d).engine.ctl().clone();
    ctl.sent.load(Ordering::Acquire) - ctl.applied.load(Ordering::Acquire)
}

/// Pairs of fresh QPs, connected and used at once: every connect leaves no command behind,
/// and a send and a write posted the moment the QPs are connected both complete (a write
/// that overtook the move to RTS would reuse the send's PSN, and the responder would drop
/// it as a duplicate).
#[test]
fn work_posted_right_after_connect_follows_the_modify() {
    let (da, db) = (Device::soft().unwrap(), Device::soft().unwrap());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
    let mut src = vec![7u8; 64];
    let mut dst = vec![0u8; 256];
    let src_mr = pa.register(&mut src, Access::empty()).unwrap();
    let dst_mr = pb.register(&mut dst, Access::ALL).unwrap();
    for round in 0..50 {
        let mut qa = pa.create_qp(&ca, &ca, &QpConfig::default()).unwrap();
        let mut qb = pb.create_qp(&cb, &cb, &QpConfig::default()).unwrap();
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        qb.post_recv(&RecvWr::new().sge(dst_mr.sge(..64)).wr_id(1))
            .unwrap();
        qb.connect(&ea).unwrap();
        assert_eq!(unapplied(&db), 0, "round {round}: connect returned early");
        qa.connect(&eb).unwrap();
        assert_eq!(unapplied(&da), 0, "round {round}: connect returned early");
        qa.post_send(&SendWr::send().sge(src_mr.sge(..)).wr_id(2))
            .unwrap();
        qa.post_send(
            &SendWr::write(dst_mr.remote().at(128))
                .sge(src_mr.sge(..))
                .wr_id(3),
        )
        .unwrap();
        for want in [2, 3] {
            let c = ca.wait_one(Duration::from_secs(2)).expect("a completion");
            assert!(c.is_ok() && c.wr_id == want, "round {round}: {c:?}");
        }
        let c = cb.wait_one(Duration::from_secs(2)).expect("the receive");
        assert!(c.is_ok() && c.wr_id == 1, "round {round}: {c:?}");
    }
}

/// A thread that connects QPs (as a launcher connects every rank's) takes none of their
/// engines for its own: it would otherwise run them on each of its later polls, against the
/// threads that use the queues.
#[test]
fn connecting_takes_no_engine_for_the_thread_s_own() {
    std::thread::spawn(|| {
        let (da, db) = (Device::soft().unwrap(), Device::soft().unwrap());
        let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
        let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
        let mut qa = pa.create_qp(&ca, &ca, &QpConfig::default()).unwrap();
        let mut qb = pb.create_qp(&cb, &cb, &QpConfig::default()).unwrap();
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        qa.connect(&eb).unwrap();
        qb.connect(&ea).unwrap();
        assert_eq!(super::super::progress::own_engines(), 0);
    })
    .join()
    .unwrap();
}

/// A thread that used an engine (posting receives ahead for another rank, say) lets it go
/// once another thread takes it over, instead of running it on each of its own polls.
#[test]
fn an_engine_another_thread_took_over_is_let_go() {
    use super::super::progress::{own_engines_after_a_poll, take_as_own};
    let d = Device::soft().unwrap();
    let core = super::soft_of(&d).engine.core.clone();
    let turn = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            take_as_own(&core);
            assert_eq!(own_engines_after_a_poll(), 1, "the engine is this thread's");
            turn.wait(); // the other thread takes it over
            turn.wait();
            assert_eq!(own_engines_after_a_poll(), 0, "the engine was let go");
        });
        s.spawn(|| {
            turn.wait();
            take_as_own(&core);
            turn.wait();
            assert_eq!(
                own_engines_after_a_poll(),
                1,
                "the engine is this thread's now"
            );
        });
    });
}
