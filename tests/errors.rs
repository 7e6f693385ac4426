//! Error completions with their syndromes, the QP error state and flushing, API misuse, and
//! a dropped peer device. After each error the same device(s) must still serve a healthy QP
//! pair. The bodies in `both!` also run on the emulated RDMA driver's mlx5 devices.

#[macro_use]
mod common;

use common::*;
use gdasync::gdsync::exec::HostExecutor;
use gdasync::gdsync::format::Syndrome;
use gdasync::gdsync::{
    Access, CompletionOp, CqError, Device, Endpoint, Error, LinkKind, MemoryRegion, QpConfig,
    QpState, RecvWr, RemoteAddr, SendWr, Sge, WcStatus,
};
use std::time::{Duration, Instant};

both!(
    bad_rkey,
    out_of_bounds_write,
    write_without_remote_write,
    read_without_remote_read,
    atomic_without_remote_atomic,
    rkey_of_another_pd,
    rnr_retry_exceeded,
    rnr_then_receive_posted,
    message_longer_than_receive,
    receive_without_local_write,
    bad_local_sge,
    read_into_region_without_local_write,
    error_completion_releases_stream_wait,
    executors_free_cq_slots_without_the_host,
    executor_consumed_error_is_found_in_the_ring,
    stale_doorbell_is_local_qp_op,
    stale_doorbell_then_new_work_flushed_once,
);

// The QP's first error read back from the device after its CQE was overwritten: verbs has
// no query for it (`ibv_query_qp` gives the state only), so an mlx5 device cannot say.
soft_only!(executor_consumed_error_is_found_after_it_was_overwritten);

// What a stalled program's report says of the soft engines (a ConnectX has its firmware dump).
soft_only!(the_engine_report_shows_sends_held_by_a_missing_receive);

// Between two devices of one process, a large payload is read from the source when it is
// delivered; the soft device is where that can be watched.
soft_only!(source_deregistered_while_a_large_write_is_in_flight);

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// After the requester's error CQE: the QP is in error, and a write and a receive posted
/// now complete with WR_FLUSH (with their own wr_ids).
fn assert_flushes_new_work(side: &mut Side, sge: Sge, remote: RemoteAddr) {
    assert_eq!(side.qp.state(), QpState::Error);
    side.qp
        .post_send(&SendWr::write(remote).sge(sge).wr_id(0xF1))
        .expect("posting to a QP in error is allowed; the work is flushed");
    let c = poll1(&side.scq);
    assert_err(&c, Syndrome::WrFlush);
    assert_eq!(c.wr_id, 0xF1);
    // Unsignalled work is flushed with a completion as well.
    side.qp
        .post_send(&SendWr::write(remote).sge(sge).wr_id(0xF2).unsignaled())
        .unwrap();
    let c = poll1(&side.scq);
    assert_err(&c, Syndrome::WrFlush);
    assert_eq!(c.wr_id, 0xF2);
    side.qp.post_recv(&RecvWr::new().wr_id(0xF3)).unwrap();
    let r = poll1(&side.rcq);
    assert_err(&r, Syndrome::WrFlush);
    assert_eq!(r.wr_id, 0xF3);
}

/// A remote-side protection error on a write: `RemoteAccess` for it, `WrFlush` for the write
/// posted right behind it, the target untouched, new work flushed, and a second pair on the
/// same devices (created before the error) still works.
fn expect_remote_access_on_write(
    p: &mut Pair,
    src: &gdasync::gdsync::MemoryRegion<'_>,
    target: RemoteAddr,
    good: RemoteAddr,
    len: usize,
) {
    p.a.qp
        .post_send(&SendWr::write(target).sge(src.sge(..len)).wr_id(1))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::write(good).sge(src.sge(..8)).wr_id(2))
        .unwrap();
    let c = poll_n(&p.a.scq, 2);
    assert_err(&c[0], Syndrome::RemoteAccess);
    assert_eq!((c[0].wr_id, c[0].opcode), (1, CompletionOp::Write));
    assert_eq!(c[0].byte_len, 0);
    assert_err(&c[1], Syndrome::WrFlush);
    assert_eq!(c[1].wr_id, 2);
    assert_flushes_new_work(&mut p.a, src.sge(..8), good);
}

fn bad_rkey(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = pattern(1, 256);
    let mut dst = vec![0u8; 256];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let r = dmr.remote();
    // Unknown index, and a known index with a stale tag.
    let bad = RemoteAddr {
        addr: r.addr,
        rkey: r.rkey.wrapping_add(0x10_0000),
    };
    expect_remote_access_on_write(&mut p, &smr, bad, r.at(8), 64);
    let mut got = vec![0u8; 256];
    dmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "memory written despite a bad rkey"
    );
    assert_healthy(&mut healthy);

    let mut p = p.another();
    let stale = RemoteAddr {
        addr: r.addr,
        rkey: r.rkey ^ 0x80,
    };
    expect_remote_access_on_write(&mut p, &smr, stale, r.at(8), 64);
    assert_healthy(&mut healthy);
    assert_healthy(&mut p.another());
}

fn out_of_bounds_write(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = pattern(2, 64);
    let mut dst = vec![0u8; 256];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let r = dmr.remote();
    // Runs 12 bytes past the end.
    expect_remote_access_on_write(&mut p, &smr, r.at(256 - 4), r.at(0), 16);
    // Starts 8 bytes before the region.
    let mut p2 = p.another();
    let before = RemoteAddr {
        addr: r.addr - 8,
        rkey: r.rkey,
    };
    expect_remote_access_on_write(&mut p2, &smr, before, r.at(0), 16);
    let mut got = vec![0u8; 256];
    dmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "out-of-bounds write touched the region"
    );
    assert_healthy(&mut healthy);
}

fn write_without_remote_write(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = pattern(3, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr =
        p.b.pd
            .register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let r = dmr.remote();
    expect_remote_access_on_write(&mut p, &smr, r.at(0), r.at(0), 64);
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "write landed without REMOTE_WRITE"
    );
    assert_healthy(&mut healthy);
}

fn read_without_remote_read(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut remote = pattern(4, 64);
    let mut local = vec![0u8; 64];
    let rmr = p.b.pd.register(&mut remote, RW).unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&SendWr::read(rmr.remote().at(0)).sge(lmr.sge(..)).wr_id(7))
        .unwrap();
    let c = poll1(&p.a.scq);
    assert_err(&c, Syndrome::RemoteAccess);
    assert_eq!((c.wr_id, c.opcode), (7, CompletionOp::Read));
    let mut got = vec![0u8; 64];
    lmr.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0), "data read without REMOTE_READ");
    assert_flushes_new_work(&mut p.a, lmr.sge(..8), rmr.remote().at(0));
    assert_healthy(&mut healthy);
}

fn atomic_without_remote_atomic(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut remote = vec![0u8; 8];
    let mut local = vec![0u8; 8];
    let rmr =
        p.b.pd
            .register(&mut remote, RW | Access::REMOTE_READ)
            .unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    rmr.write_at(0, &5u64.to_ne_bytes());
    p.a.qp
        .post_send(
            &SendWr::fetch_add(rmr.remote().at(0), 1)
                .sge(lmr.sge(..))
                .wr_id(8),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert_err(&c, Syndrome::RemoteAccess);
    assert_eq!((c.wr_id, c.opcode), (8, CompletionOp::FetchAdd));
    let mut w = [0u8; 8];
    rmr.read_at(0, &mut w);
    assert_eq!(
        u64::from_ne_bytes(w),
        5,
        "atomic executed without REMOTE_ATOMIC"
    );

    let mut p = p.another();
    p.a.qp
        .post_send(
            &SendWr::compare_swap(rmr.remote().at(0), 5, 6)
                .sge(lmr.sge(..))
                .wr_id(9),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert_err(&c, Syndrome::RemoteAccess);
    assert_eq!((c.wr_id, c.opcode), (9, CompletionOp::CompareSwap));
    rmr.read_at(0, &mut w);
    assert_eq!(u64::from_ne_bytes(w), 5);
    assert_healthy(&mut healthy);
}

/// An rkey of a region in another PD of the responder's device is refused.
fn rkey_of_another_pd(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let other_pd = p.b.dev.alloc_pd();
    let mut src = pattern(5, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = other_pd.register(&mut dst, Access::ALL).unwrap();
    let r = dmr.remote();
    expect_remote_access_on_write(&mut p, &smr, r.at(0), r.at(0), 64);
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "write crossed protection domains"
    );
    assert_healthy(&mut healthy);
}

fn rnr_retry_exceeded(t: Topo) {
    let timer = Duration::from_millis(20);
    let cfg = QpConfig {
        rnr_retry: 3,
        rnr_timer: timer,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &cfg, &QpConfig::default());
    let mut healthy = p.another();
    let mut src = pattern(6, 64);
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let start = Instant::now();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(10))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send_imm(1).sge(smr.sge(..)).wr_id(11))
        .unwrap();
    let c = poll_n(&p.a.scq, 2);
    let elapsed = start.elapsed();
    assert_err(&c[0], Syndrome::RnrRetryExc);
    assert_eq!((c[0].wr_id, c[0].opcode), (10, CompletionOp::Send));
    assert_err(&c[1], Syndrome::WrFlush);
    assert_eq!(c[1].wr_id, 11);
    // Three retries, each after the RNR timer: it did wait before giving up.
    assert!(
        elapsed >= timer * 3,
        "gave up after {elapsed:?}, before 3 RNR timers"
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    // The responder saw nothing and is not in error.
    assert_quiet(&p.b.rcq, Duration::ZERO);
    assert_ne!(p.b.qp.state(), QpState::Error);
    assert_flushes_new_work(&mut p.a, smr.sge(..8), RemoteAddr { addr: 0, rkey: 0 });
    assert_healthy(&mut healthy);
}

/// With retries left, a send waits for a receive and then completes normally.
fn rnr_then_receive_posted(t: Topo) {
    let cfg = QpConfig {
        rnr_retry: u8::MAX,
        rnr_timer: Duration::from_millis(2),
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &cfg, &QpConfig::default());
    let mut src = pattern(7, 100);
    let mut dst = vec![0u8; 100];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        p.a.qp
            .post_send(&SendWr::send_imm(i).sge(smr.sge(..)).wr_id(i as u64))
            .unwrap();
    }
    assert_quiet(&p.a.scq, Duration::from_millis(50));
    for i in 0..3 {
        p.b.qp
            .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(100 + i))
            .unwrap();
    }
    let s = poll_ok(&p.a.scq, 3);
    assert_eq!(s.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    let r = poll_ok(&p.b.rcq, 3);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>(),
        [(100, Some(0)), (101, Some(1)), (102, Some(2))]
    );
    let mut got = vec![0u8; 100];
    dmr.read_at(0, &mut got);
    assert_eq!(got, pattern(7, 100));
}

fn message_longer_than_receive(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = pattern(8, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(..16)).wr_id(20))
        .unwrap();
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(21))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(22))
        .unwrap();
    let r = poll_n(&p.b.rcq, 2);
    assert_err(&r[0], Syndrome::LocalLength);
    assert_eq!(r[0].wr_id, 20);
    // The receive behind it is flushed: the responder QP is in error too.
    assert_err(&r[1], Syndrome::WrFlush);
    assert_eq!(r[1].wr_id, 21);
    assert_eq!(p.b.qp.state(), QpState::Error);
    let s = poll1(&p.a.scq);
    assert_err(&s, Syndrome::RemoteInvalReq);
    assert_eq!((s.wr_id, s.opcode), (22, CompletionOp::Send));
    assert_eq!(p.a.qp.state(), QpState::Error);
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert!(
        got[16..].iter().all(|&x| x == 0),
        "wrote past the receive buffer"
    );
    assert_flushes_new_work(&mut p.a, smr.sge(..8), dmr.remote().at(0));
    assert_flushes_new_work(&mut p.b, dmr.sge(..8), dmr.remote().at(0));
    assert_healthy(&mut healthy);
}

/// A receive buffer without LOCAL_WRITE: the responder's receive fails with LocalProt and
/// the requester gets RemoteOp.
fn receive_without_local_write(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = pattern(9, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::REMOTE_READ).unwrap();
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(30))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(31))
        .unwrap();
    let r = poll1(&p.b.rcq);
    assert_err(&r, Syndrome::LocalProt);
    assert_eq!(r.wr_id, 30);
    let s = poll1(&p.a.scq);
    assert_err(&s, Syndrome::RemoteOp);
    assert_eq!(s.wr_id, 31);
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0));
    assert_healthy(&mut healthy);
}

/// A local SGE the device cannot use: unknown lkey, out of its region, or a region of
/// another PD. Each fails with LocalProt and moves nothing.
fn bad_local_sge(t: Topo) {
    let p0 = Pair::new(t);
    let mut healthy = p0.another();
    let other_pd = p0.a.dev.alloc_pd();
    let mut src = pattern(10, 64);
    let mut foreign = pattern(11, 64);
    let mut dst = vec![0u8; 64];
    let smr = p0.a.pd.register(&mut src, Access::empty()).unwrap();
    let fmr = other_pd.register(&mut foreign, Access::empty()).unwrap();
    let dmr = p0.b.pd.register(&mut dst, RW).unwrap();
    let good = smr.sge(..);
    let cases = [
        (
            "unknown lkey",
            Sge {
                lkey: good.lkey.wrapping_add(0x10_0000),
                ..good
            },
        ),
        (
            "stale tag",
            Sge {
                lkey: good.lkey ^ 0x80,
                ..good
            },
        ),
        (
            "past the region",
            Sge {
                addr: good.addr + 32,
                ..good
            },
        ),
        ("region of another PD", fmr.sge(..)),
    ];
    for (what, sge) in cases {
        let mut p = p0.another();
        p.a.qp
            .post_send(&SendWr::write(dmr.remote().at(0)).sge(sge).wr_id(40))
            .unwrap();
        p.a.qp
            .post_send(&SendWr::write(dmr.remote().at(0)).sge(good).wr_id(41))
            .unwrap();
        let c = poll_n(&p.a.scq, 2);
        assert_eq!(
            c[0].status,
            WcStatus::Error(Syndrome::LocalProt),
            "{what}: {:?}",
            c[0]
        );
        assert_eq!(c[0].wr_id, 40, "{what}");
        assert_err(&c[1], Syndrome::WrFlush);
        assert_eq!(c[1].wr_id, 41);
        let mut got = vec![0u8; 64];
        dmr.read_at(0, &mut got);
        assert!(got.iter().all(|&x| x == 0), "{what}: data moved");
        assert_flushes_new_work(&mut p.a, good, dmr.remote().at(0));
        // The responder saw nothing wrong.
        assert_ne!(p.b.qp.state(), QpState::Error, "{what}");
    }
    assert_healthy(&mut healthy);
}

fn read_into_region_without_local_write(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut remote = pattern(12, 64);
    let mut local = vec![0u8; 64];
    let rmr = p.b.pd.register(&mut remote, Access::REMOTE_READ).unwrap();
    let lmr = p.a.pd.register(&mut local, Access::empty()).unwrap();
    p.a.qp
        .post_send(&SendWr::read(rmr.remote().at(0)).sge(lmr.sge(..)).wr_id(50))
        .unwrap();
    let c = poll1(&p.a.scq);
    assert_err(&c, Syndrome::LocalProt);
    assert_eq!(c.wr_id, 50);
    let mut got = vec![0u8; 64];
    lmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "read wrote a region without LOCAL_WRITE"
    );
    assert_healthy(&mut healthy);
}

/// An error CQE releases an executor's wait like a good one (the wait looks at the owner bit).
fn error_completion_releases_stream_wait(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(13, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap(); // no REMOTE_WRITE
    let stream = host_stream();
    let pr =
        p.a.qp
            .prepare_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(60))
            .unwrap();
    let (t1, ops) = p.a.qp.commit(pr).unwrap();
    stream.enqueue(ops);
    stream.enqueue(p.a.qp.send_wait_ops(&t1).unwrap());
    stream.synchronize().unwrap();
    assert_eq!(p.a.scq.consumer_index(), 1);
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(p.a.scq.poll_one().unwrap(), None);
}

/// A pair whose `a` completes its sends on a CQ of `entries` entries.
fn pair_with_small_send_cq(t: Topo, entries: u32) -> Pair {
    let (dev_a, dev_b) = t.devices();
    let pd = dev_a.alloc_pd();
    let scq = dev_a.create_cq(entries).unwrap();
    let rcq = dev_a.create_cq(entries).unwrap();
    let qp = pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap();
    let mut a = Side {
        dev: dev_a,
        pd,
        qp,
        scq,
        rcq,
    };
    let mut b = Side::new(&dev_b, &QpConfig::default());
    a.qp.connect(&b.qp.endpoint()).unwrap();
    b.qp.connect(&a.qp.endpoint()).unwrap();
    Pair { a, b }
}

/// Posts `n` signalled no-ops on `a`, each consumed by an executor's wait (the host never
/// polls the send CQ).
fn nops_consumed_by_an_executor(p: &mut Pair, n: u64) {
    let exec = HostExecutor::default();
    for i in 0..n {
        let t = p.a.qp.post_send(&SendWr::nop().wr_id(i)).unwrap();
        exec.run(&p.a.qp.send_wait_ops(&t).unwrap()).unwrap();
    }
}

/// Executors' waits hand consumed CQ slots back to the device through the CQ's doorbell
/// record: many rings' worth of completions pass through a small CQ with no CPU poll and
/// no overrun.
fn executors_free_cq_slots_without_the_host(t: Topo) {
    let mut p = pair_with_small_send_cq(t, 8);
    nops_consumed_by_an_executor(&mut p, 200);
    assert_eq!(p.a.scq.consumer_index(), 200);
    assert_eq!(p.a.qp.state(), QpState::Rts);
    p.a.scq.check().expect("no error, no overrun");
    assert_eq!(p.a.scq.poll_one().unwrap(), None);
}

/// A write to a region without REMOTE_WRITE, run and waited for by an executor: the QP is
/// in error and its error CQE (send ring index 0) consumed.
fn failed_write_consumed_by_an_executor(p: &mut Pair) -> CqError {
    let mut src = pattern(17, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    let exec = HostExecutor::default();
    let pr =
        p.a.qp
            .prepare_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)))
            .unwrap();
    let (t1, ops) = p.a.qp.commit(pr).unwrap();
    exec.run(&ops).unwrap();
    exec.run(&p.a.qp.send_wait_ops(&t1).unwrap()).unwrap();
    assert_eq!(p.a.qp.state(), QpState::Error);
    CqError {
        qpn: p.a.qp.qpn(),
        wqe_counter: 0,
        syndrome: Syndrome::RemoteAccess,
        responder: false,
    }
}

/// `take_errors` decodes an error CQE an executor consumed while the ring still holds it.
fn executor_consumed_error_is_found_in_the_ring(t: Topo) {
    let mut p = pair_with_small_send_cq(t, 8);
    let want = failed_write_consumed_by_an_executor(&mut p);
    // Two flushes behind it, consumed as well: a ring's worth of CQEs is still there.
    nops_consumed_by_an_executor(&mut p, 2);
    let errs = p.a.scq.take_errors();
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert_eq!(errs[0], want);
    for e in &errs[1..] {
        assert_eq!(e.syndrome, Syndrome::WrFlush, "{e:?}");
    }
    assert!(p.a.scq.take_errors().is_empty(), "reported twice");
}

/// Executors consume more than a ring of completions after an error CQE before anyone asks:
/// the device has written over it, and `take_errors` still reports the QP's first error (the
/// device keeps it in the QP's context), once.
fn executor_consumed_error_is_found_after_it_was_overwritten(t: Topo) {
    let mut p = pair_with_small_send_cq(t, 8);
    let want = failed_write_consumed_by_an_executor(&mut p);
    nops_consumed_by_an_executor(&mut p, 30);
    let errs = p.a.scq.take_errors();
    let firsts: Vec<_> = errs
        .iter()
        .filter(|e| e.syndrome != Syndrome::WrFlush)
        .collect();
    assert_eq!(firsts, [&want], "{errs:?}");
    assert!(p.a.scq.take_errors().is_empty(), "reported twice");
    let e = p.a.scq.check();
    assert!(e.is_ok(), "{e:?}");
}

/// Runs two writes, then an older commit's doorbell ops after the newer one's: the doorbell
/// record moves backwards. Returns the pair (`a` now in error), the source and target.
fn ring_stale_doorbell(p: &mut Pair, smr: &MemoryRegion<'_>, dmr: &MemoryRegion<'_>) {
    let mut ops = Vec::new();
    for i in 0..2u64 {
        let pr =
            p.a.qp
                .prepare_send(
                    &SendWr::write(dmr.remote().at(8 * i))
                        .sge(smr.sge(..))
                        .wr_id(i),
                )
                .unwrap();
        ops.push(p.a.qp.commit(pr).unwrap().1);
    }
    let exec = HostExecutor::default();
    exec.run(&ops[1]).unwrap();
    let c = poll_ok(&p.a.scq, 2);
    assert_eq!((c[0].wr_id, c[1].wr_id), (0, 1));
    exec.run(&ops[0]).unwrap();
}

/// Running an older commit's doorbell ops after a newer one's moves the doorbell record
/// backwards: the device reads it as more WQEs than the ring holds and fails the QP with
/// LOCAL_QP_OP (the one way to reach a malformed-WQE error through the safe API).
fn stale_doorbell_is_local_qp_op(t: Topo) {
    let mut p = Pair::new(t);
    let mut healthy = p.another();
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    ring_stale_doorbell(&mut p, &smr, &dmr);
    let c = poll1(&p.a.scq);
    assert_err(&c, Syndrome::LocalQpOp);
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_quiet(&p.a.scq, Duration::from_millis(20));
    assert_healthy(&mut healthy);
}

/// After the LOCAL_QP_OP of a stale doorbell, new work is flushed once, with its own wr_id;
/// WQEs that completed before are not completed again.
fn stale_doorbell_then_new_work_flushed_once(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    ring_stale_doorbell(&mut p, &smr, &dmr);
    assert_err(&poll1(&p.a.scq), Syndrome::LocalQpOp);
    assert_flushes_new_work(&mut p.a, smr.sge(..), dmr.remote().at(0));
    assert_quiet(&p.a.scq, Duration::from_millis(20));
}

// ---------------------------------------------------------------------------- API misuse

fn one_device_pair() -> Pair {
    Pair::new(Topo::Loopback)
}

#[test]
fn post_to_unconnected_qp() {
    let dev = Device::soft().unwrap();
    let mut s = Side::new(&dev, &QpConfig::default());
    let qpn = s.qp.qpn();
    assert_eq!(s.qp.state(), QpState::Init);
    let e = s.qp.post_send(&SendWr::nop()).unwrap_err();
    assert!(
        matches!(e, Error::NotConnected { qpn: n } if n == qpn),
        "{e}"
    );
    let e = s.qp.prepare_send(&SendWr::nop()).unwrap_err();
    assert!(matches!(e, Error::NotConnected { .. }), "{e}");
    // Receives may be posted before connecting.
    s.qp.post_recv(&RecvWr::new()).unwrap();
    assert_quiet(&s.rcq, Duration::from_millis(10));
}

#[test]
fn send_ring_full() {
    let cfg = QpConfig {
        send_wqebbs: 16,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(Topo::TwoDevices, &cfg, &QpConfig::default());
    assert_eq!(p.a.qp.send_ring_size(), 16);
    let mut src = vec![1u8; 8];
    let mut dst = vec![0u8; 8];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let wr = SendWr::write(dmr.remote().at(0))
        .sge(smr.sge(..))
        .unsignaled();
    for i in 0..16 {
        p.a.qp
            .post_send(&wr)
            .unwrap_or_else(|e| panic!("post {i}: {e}"));
    }
    for w in [wr.clone(), wr.clone().wr_id(1), SendWr::nop()] {
        let e = p.a.qp.post_send(&w).unwrap_err();
        assert!(
            matches!(
                e,
                Error::RingFull {
                    ring: "send",
                    used: 16,
                    size: 16,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Unsignalled work still ran; nothing completed.
    assert_quiet(&p.a.scq, Duration::from_millis(10));
    let mut b = [0u8; 8];
    dmr.read_at(0, &mut b);
    assert_eq!(b, [1u8; 8]);
}

#[test]
fn recv_ring_full() {
    let cfg = QpConfig {
        recv_wqes: 4,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(Topo::TwoDevices, &QpConfig::default(), &cfg);
    assert_eq!(p.b.qp.recv_ring_size(), 4);
    for i in 0..4 {
        p.b.qp.post_recv(&RecvWr::new().wr_id(i)).unwrap();
    }
    let e = p.b.qp.post_recv(&RecvWr::new()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RingFull {
                ring: "receive",
                used: 4,
                size: 4,
                ..
            }
        ),
        "{e}"
    );
    // Consuming one (a zero-length send) and polling it frees a slot.
    p.a.qp.post_send(&SendWr::send().wr_id(9)).unwrap();
    poll_ok(&p.a.scq, 1);
    let r = poll_ok(&p.b.rcq, 1);
    assert_eq!(r[0].wr_id, 0);
    p.b.qp.post_recv(&RecvWr::new()).unwrap();
    assert!(p.b.qp.post_recv(&RecvWr::new()).is_err());
}

#[test]
fn commit_out_of_order() {
    let mut p = one_device_pair();
    let mut q = p.another();
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 8];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let wr = |id| SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(id);
    let p0 = p.a.qp.prepare_send(&wr(0)).unwrap();
    let p1 = p.a.qp.prepare_send(&wr(1)).unwrap();
    let (i0, i1) = (p0.ticket().index, p1.ticket().index);
    let e = p.a.qp.commit(p1).unwrap_err();
    assert!(
        matches!(e.error, Error::OutOfOrder { expected, got } if expected == i0 && got == i1),
        "{e}"
    );
    // A prepared send of another QP is refused too.
    let other = q.a.qp.prepare_send(&SendWr::nop()).unwrap();
    assert!(p.a.qp.commit(other).is_err());
    // The first one still commits and runs.
    let (t0, ops) = p.a.qp.commit(p0).unwrap();
    HostExecutor::default().run(&ops).unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.wr_id == 0 && t0.index == i0, "{c:?}");
}

#[test]
fn invalid_arguments() {
    let mut p = one_device_pair();
    let mut empty: [u8; 0] = [];
    assert!(matches!(
        p.a.pd.register(&mut empty, Access::LOCAL_WRITE),
        Err(Error::InvalidArgument(_))
    ));
    let mut buf = vec![0u8; 4096];
    assert!(
        p.a.pd.register(&mut buf, Access::REMOTE_WRITE).is_err(),
        "REMOTE_WRITE without LOCAL_WRITE"
    );
    assert!(
        p.a.pd.register(&mut buf, Access::REMOTE_ATOMIC).is_err(),
        "REMOTE_ATOMIC without LOCAL_WRITE"
    );
    let mr = p.a.pd.register(&mut buf, Access::ALL).unwrap();
    let remote = mr.remote();
    let invalid = |r: gdasync::gdsync::Result<gdasync::gdsync::SendTicket>, what: &str| match r {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    let qp = &mut p.a.qp;
    // Inline longer than max_inline (220 by default).
    invalid(
        qp.post_send(&SendWr::send().sge(mr.sge(..221)).inline()),
        "inline too long",
    );
    invalid(
        qp.post_send(&SendWr::write(remote.at(0)).sge(mr.sge(..1000)).inline()),
        "inline write too long",
    );
    // Inline from unregistered memory.
    let stray = [0u8; 16];
    invalid(
        qp.post_send(
            &SendWr::send()
                .sge(Sge {
                    addr: stray.as_ptr() as u64,
                    len: 16,
                    lkey: mr.lkey(),
                })
                .inline(),
        ),
        "inline from outside the region",
    );
    // Reads and atomics cannot be inline.
    invalid(
        qp.post_send(&SendWr::read(remote.at(0)).sge(mr.sge(..8)).inline()),
        "inline read",
    );
    // Atomics: aligned remote, exactly one 8-byte SGE.
    invalid(
        qp.post_send(&SendWr::fetch_add(remote.at(4), 1).sge(mr.sge(..8))),
        "misaligned fetch-add",
    );
    invalid(
        qp.post_send(&SendWr::compare_swap(remote.at(12), 0, 1).sge(mr.sge(..8))),
        "misaligned compare-swap",
    );
    invalid(
        qp.post_send(&SendWr::fetch_add(remote.at(0), 1).sge(mr.sge(..4))),
        "4-byte atomic result",
    );
    invalid(
        qp.post_send(&SendWr::fetch_add(remote.at(0), 1)),
        "atomic without a result SGE",
    );
    invalid(
        qp.post_send(
            &SendWr::fetch_add(remote.at(0), 1)
                .sge(mr.sge(..8))
                .sge(mr.sge(8..16)),
        ),
        "atomic with two SGEs",
    );
    // More than 16 SGEs.
    let sges: Vec<Sge> = (0..17).map(|i| mr.sge(i * 8..i * 8 + 8)).collect();
    invalid(qp.post_send(&SendWr::send().sges(&sges)), "17 SGEs");
    // More receive SGEs than max_recv_sge (4 by default).
    let mut rwr = RecvWr::new();
    for i in 0..5 {
        rwr = rwr.sge(mr.sge(i * 8..i * 8 + 8));
    }
    assert!(matches!(qp.post_recv(&rwr), Err(Error::InvalidArgument(_))));
    // None of this reached the device.
    assert_quiet(&p.a.scq, Duration::from_millis(10));
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_healthy(&mut p);

    // Connecting twice, and a QP with a CQ of another device.
    let ep = p.b.qp.endpoint();
    assert!(p.a.qp.connect(&ep).is_err());
    let other = Device::soft().unwrap();
    let foreign_cq = other.create_cq(16).unwrap();
    assert!(p
        .a
        .pd
        .create_qp(&foreign_cq, &p.a.rcq, &QpConfig::default())
        .is_err());
    for bad in [
        QpConfig {
            send_wqebbs: 0,
            ..QpConfig::default()
        },
        QpConfig {
            recv_wqes: 1 << 16,
            ..QpConfig::default()
        },
        QpConfig {
            max_recv_sge: 17,
            ..QpConfig::default()
        },
        QpConfig {
            max_inline: 4096,
            ..QpConfig::default()
        },
        QpConfig {
            retry_count: 8,
            ..QpConfig::default()
        },
        QpConfig {
            timeout: Duration::ZERO,
            ..QpConfig::default()
        },
    ] {
        assert!(
            p.a.pd.create_qp(&p.a.scq, &p.a.rcq, &bad).is_err(),
            "{bad:?}"
        );
    }
    assert!(other.create_cq(0).is_err());
}

#[test]
fn wait_ops_need_a_predictable_completion() {
    let mut p = one_device_pair();
    let t = p.a.qp.post_send(&SendWr::nop().unsignaled()).unwrap();
    assert_eq!(t.cqe, None);
    assert!(matches!(
        p.a.qp.send_wait_ops(&t),
        Err(Error::NotWaitable(_))
    ));
    // A CQ shared by two queues cannot predict completion numbers.
    let dev = p.a.dev.clone();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let mut q = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let mut r = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    q.connect(&r.endpoint()).unwrap();
    r.connect(&q.endpoint()).unwrap();
    let t = q.post_send(&SendWr::nop()).unwrap();
    assert_eq!(t.cqe, None);
    assert!(matches!(q.send_wait_ops(&t), Err(Error::NotWaitable(_))));
    let rt = q.post_recv(&RecvWr::new()).unwrap();
    assert!(matches!(q.recv_wait_ops(&rt), Err(Error::NotWaitable(_))));
    let c = poll1(&cq);
    assert!(c.is_ok() && c.opcode == CompletionOp::Nop, "{c:?}");
}

#[test]
fn endpoint_encoding() {
    let dev = Device::soft().unwrap();
    let s = Side::new(&dev, &QpConfig::default());
    let ep = s.qp.endpoint();
    assert_eq!(ep.qpn, s.qp.qpn());
    assert_eq!(ep.pid, std::process::id());
    assert_eq!(ep.device, dev.info().uid);
    assert_eq!(Endpoint::from_bytes(&ep.to_bytes()).unwrap(), ep);
    assert_eq!(ep.to_string().parse::<Endpoint>().unwrap(), ep);
    assert!(Endpoint::from_bytes(&[0u8; Endpoint::WIRE_LEN]).is_err());
    assert!(Endpoint::from_bytes(&ep.to_bytes()[..Endpoint::WIRE_LEN - 1]).is_err());
    assert!("gdsync:1:2:3".parse::<Endpoint>().is_err());
    assert!("nope:1:2:3:4:auto@-".parse::<Endpoint>().is_err());
    // Another host is reached over TCP: not when neither side listens. (The larger device id so
    // that this side dials.) A dropped device cannot be reached either.
    let mut t = Side::new(&dev, &QpConfig::default());
    let far = Endpoint {
        host: ep.host ^ 1,
        device: u64::MAX,
        addr: None,
        ..ep
    };
    assert_eq!(dev.link_kind(&far).unwrap(), LinkKind::Tcp);
    let e = t.qp.connect(&far).unwrap_err();
    assert!(
        matches!(&e, Error::Unreachable(m) if m.contains("nor this process accepts TCP links")),
        "{e}"
    );
    // An endpoint naming this device in another process is corrupt.
    let twin = Endpoint {
        host: ep.host ^ 1,
        ..ep
    };
    assert!(matches!(
        t.qp.connect(&twin),
        Err(Error::InvalidArgument(_))
    ));
    let gone = {
        let d = Device::soft().unwrap();
        let g = Side::new(&d, &QpConfig::default());
        g.qp.endpoint()
    };
    assert!(t.qp.connect(&gone).is_err());
    let no_qp = Endpoint { qpn: 0xFFFF, ..ep };
    assert!(t.qp.connect(&no_qp).is_err());
}

// ---------------------------------------------------------------------------- peer dropped

/// Drops every handle of `b` (its device goes away with it).
fn drop_side(b: Side) {
    drop(b);
}

/// A peer device dropped while sends wait on RNR (infinite retries, `rnr_timer` between
/// tries) and a read and an unsignalled write wait behind them. Returns the statuses of the
/// five completions, checking that they all arrive within 2 s of the drop, in order, and
/// that afterwards the QP is in error, receives are flushed, and the surviving device serves
/// new pairs.
fn drop_peer_during_rnr(rnr_timer: Duration) -> Vec<WcStatus> {
    let cfg = QpConfig {
        rnr_retry: u8::MAX,
        rnr_timer,
        ..QpConfig::default()
    };
    let Pair { mut a, b } = Pair::with_config(Topo::TwoDevices, &cfg, &QpConfig::default());
    let mut src = pattern(20, 64);
    let mut local = vec![0u8; 64];
    let smr = a.pd.register(&mut src, Access::empty()).unwrap();
    let lmr = a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let mut remote = pattern(21, 64);
    let rmr = b.pd.register(&mut remote, Access::ALL).unwrap();
    let rbuf = rmr.remote();
    for i in 0..3 {
        a.qp.post_send(&SendWr::send().sge(smr.sge(..)).wr_id(i))
            .unwrap();
    }
    a.qp.post_send(&SendWr::read(rbuf.at(0)).sge(lmr.sge(..)).wr_id(3))
        .unwrap();
    a.qp.post_send(
        &SendWr::write(rbuf.at(0))
            .sge(smr.sge(..))
            .wr_id(4)
            .unsignaled(),
    )
    .unwrap();
    // Infinite RNR retries: nothing completes while the peer lives.
    assert_quiet(&a.scq, Duration::from_millis(100));
    drop(rmr);
    let dropped = Instant::now();
    drop_side(b);
    let c = poll_n(&a.scq, 5);
    let elapsed = dropped.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "took {elapsed:?} after the drop"
    );
    for (i, x) in c.iter().enumerate() {
        assert_eq!(x.wr_id, i as u64, "{x:?}");
        assert!(
            matches!(
                x.status,
                WcStatus::Error(Syndrome::WrFlush | Syndrome::TransportRetryExc)
            ),
            "{x:?}"
        );
    }
    assert_eq!(a.qp.state(), QpState::Error);
    a.qp.post_recv(&RecvWr::new().sge(lmr.sge(..)).wr_id(7))
        .unwrap();
    let r = poll1(&a.rcq);
    assert_err(&r, Syndrome::WrFlush);
    assert_eq!(r.wr_id, 7);
    let mut got = vec![0u8; 64];
    lmr.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0));

    // The surviving device serves a loopback pair and a pair with a new device.
    let dev = a.dev.clone();
    assert_healthy(&mut Pair::on(
        &dev,
        &dev,
        &QpConfig::default(),
        &QpConfig::default(),
    ));
    let other = Device::soft().unwrap();
    assert_healthy(&mut Pair::on(
        &dev,
        &other,
        &QpConfig::default(),
        &QpConfig::default(),
    ));
    c.iter().map(|x| x.status).collect()
}

/// A peer device dropped with work outstanding: all of it completes with an error within
/// 2 s (no hang), receives are flushed, the surviving device works.
#[test]
fn peer_device_dropped_with_outstanding_work() {
    let s = drop_peer_during_rnr(Duration::from_millis(2));
    assert_eq!(
        s[0],
        WcStatus::Error(Syndrome::TransportRetryExc),
        "all statuses: {s:?}"
    );
}

/// As above, and the work the requester was retrying gets TRANSPORT_RETRY_EXC (not only
/// WR_FLUSH: the user must learn why). A long RNR timer makes the requester sit between
/// retries when the drop is noticed.
#[test]
fn peer_device_dropped_during_rnr_wait_reports_retry_exceeded() {
    let s = drop_peer_during_rnr(Duration::from_millis(100));
    assert_eq!(
        s[0],
        WcStatus::Error(Syndrome::TransportRetryExc),
        "all statuses: {s:?}"
    );
}

/// Drops the peer device of a working pair, waits `idle`, then posts three reads. Checks
/// that they all fail within 2 s and move no data, and that receives are flushed; returns
/// the reads' statuses.
fn reads_after_peer_device_dropped(idle: Duration) -> Vec<WcStatus> {
    let Pair { mut a, b } = Pair::new(Topo::TwoDevices);
    let mut local = vec![0u8; 64];
    let lmr = a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let mut remote = pattern(22, 64);
    let rmr = b.pd.register(&mut remote, Access::ALL).unwrap();
    let rbuf = rmr.remote();
    // One good read first: the link works.
    a.qp.post_send(&SendWr::read(rbuf.at(0)).sge(lmr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&a.scq, 1);
    drop(rmr);
    drop_side(b);
    std::thread::sleep(idle);
    let posted = Instant::now();
    lmr.write_at(0, &[0u8; 64]);
    for i in 0..3 {
        a.qp.post_send(&SendWr::read(rbuf.at(0)).sge(lmr.sge(..)).wr_id(10 + i))
            .unwrap();
    }
    let c = poll_n(&a.scq, 3);
    let elapsed = posted.elapsed();
    for (i, x) in c.iter().enumerate() {
        assert!(
            matches!(
                x.status,
                WcStatus::Error(Syndrome::WrFlush | Syndrome::TransportRetryExc)
            ),
            "{x:?}"
        );
        assert_eq!(x.wr_id, 10 + i as u64);
    }
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    let mut got = vec![0u8; 64];
    lmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "a read from a dead peer returned data"
    );
    a.qp.post_recv(&RecvWr::new().wr_id(5)).unwrap();
    assert_err(&poll1(&a.rcq), Syndrome::WrFlush);
    c.iter().map(|x| x.status).collect()
}

/// Work posted right after the peer device is dropped fails within 2 s.
#[test]
fn work_posted_after_peer_device_dropped() {
    let s = reads_after_peer_device_dropped(Duration::ZERO);
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc), "{s:?}");
}

/// Work posted once the link's death has surely been noticed: the first WQE must report
/// why (TRANSPORT_RETRY_EXC), not only WR_FLUSH.
#[test]
fn work_posted_after_peer_device_dropped_and_noticed() {
    let s = reads_after_peer_device_dropped(Duration::from_millis(100));
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc), "{s:?}");
}

/// The peer QP (not its device) is destroyed: outstanding work completes with
/// TRANSPORT_RETRY_EXC promptly rather than hanging, and the peer device still serves others.
#[test]
fn peer_qp_destroyed() {
    let Pair { mut a, b } = Pair::new(Topo::TwoDevices);
    let mut local = vec![0u8; 64];
    let lmr = a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let mut remote = pattern(23, 64);
    let rmr = b.pd.register(&mut remote, Access::ALL).unwrap();
    let rbuf = rmr.remote();
    let Side {
        qp: b_qp,
        dev: b_dev,
        ..
    } = b;
    drop(b_qp);
    let start = Instant::now();
    a.qp.post_send(&SendWr::read(rbuf.at(0)).sge(lmr.sge(..)).wr_id(1))
        .unwrap();
    let c = poll1(&a.scq);
    assert_err(&c, Syndrome::TransportRetryExc);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(rmr);
    assert_healthy(&mut Pair::on(
        &a.dev,
        &b_dev,
        &QpConfig::default(),
        &QpConfig::default(),
    ));
}

/// After a refused out-of-order commit the QP can still be used: the refused send comes back
/// in the error and can be committed in its turn; a prepared send dropped without a commit
/// becomes a no-op that completes (with its wr_id) when a later commit passes over it.
#[test]
fn post_after_out_of_order_commit() {
    let mut p = one_device_pair();
    let p0 = p.a.qp.prepare_send(&SendWr::nop().wr_id(0)).unwrap();
    let p1 = p.a.qp.prepare_send(&SendWr::nop().wr_id(1)).unwrap();
    let refused = match p.a.qp.commit(p1) {
        Err(e) if matches!(e.error, Error::OutOfOrder { .. }) => e.prepared,
        other => panic!("expected OutOfOrder, got {other:?}"),
    };
    let (_, ops) = p.a.qp.commit(p0).unwrap();
    HostExecutor::default().run(&ops).unwrap();
    let (_, ops) = p.a.qp.commit(refused).unwrap();
    HostExecutor::default().run(&ops).unwrap();
    for id in [0, 1] {
        let c = poll1(&p.a.scq);
        assert!(c.is_ok() && c.wr_id == id, "{c:?}");
    }
    // Dropped uncommitted: the next post passes over it.
    let bogus = gdasync::gdsync::RemoteAddr {
        addr: 0x1000,
        rkey: 0xdead00,
    };
    let dropped = p.a.qp.prepare_send(&SendWr::write(bogus).wr_id(3)).unwrap();
    drop(dropped);
    let r = p.a.qp.post_send(&SendWr::nop().wr_id(4));
    assert!(r.is_ok(), "the QP is stuck: {r:?}");
    for id in [3, 4] {
        let c = poll1(&p.a.scq);
        assert!(
            c.is_ok() && c.wr_id == id,
            "the dropped write must complete as a no-op: {c:?}"
        );
    }
}

/// More completions than the CQ holds: the extra ones are dropped, the QP goes to the error
/// state, and the CQ reports `CqOverrun` once the valid ones are polled.
#[test]
fn cq_overrun_is_reported() {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let small = dev.create_cq(4).unwrap();
    let other = dev.create_cq(16).unwrap();
    let mut q = pd.create_qp(&small, &other, &QpConfig::default()).unwrap();
    let mut r = pd.create_qp(&other, &other, &QpConfig::default()).unwrap();
    q.connect(&r.endpoint()).unwrap();
    r.connect(&q.endpoint()).unwrap();
    for i in 0..4 {
        q.post_send(&SendWr::nop().wr_id(i)).unwrap();
    }
    // A send behind the no-ops: once it has arrived, the device has completed all of them
    // (in order), without anyone polling the small CQ, which is now full. Unsignalled: it
    // writes no completion.
    r.post_recv(&RecvWr::new().wr_id(100)).unwrap();
    q.post_send(&SendWr::send().wr_id(8).unsignaled()).unwrap();
    let c = poll1(&other);
    assert!(c.is_ok() && c.wr_id == 100, "{c:?}");
    // Four more: the first finds the CQ full. As on a ConnectX, the CQ overruns (no more
    // completions are written to it) and the QP whose completion was dropped goes to the
    // error state.
    for i in 4..8 {
        q.post_send(&SendWr::nop().wr_id(i)).unwrap();
    }
    let start = Instant::now();
    while q.state() != QpState::Error {
        assert!(start.elapsed() < TIMEOUT, "QP still {:?}", q.state());
        std::thread::yield_now();
    }
    let mut got = Vec::new();
    let n = small.poll(&mut got, 16).unwrap();
    assert_eq!(n, 4, "a 4-entry CQ holds 4 completions: {got:?}");
    for (i, c) in got.iter().enumerate() {
        assert!(c.is_ok() && c.wr_id == i as u64, "{c:?}");
    }
    let err = small.poll(&mut got, 16).unwrap_err();
    assert!(matches!(err, Error::CqOverrun { .. }), "{err}");
}

/// A peer QP that exists but never connects: the requester retries until its `timeout`
/// and then fails the work with TRANSPORT_RETRY_EXC (it does not retry forever).
#[test]
fn peer_never_connects_times_out() {
    let timeout = Duration::from_millis(300);
    let cfg = QpConfig {
        timeout,
        ..QpConfig::default()
    };
    let dev_a = Device::soft().unwrap();
    let dev_b = Device::soft().unwrap();
    let mut a = Side::new(&dev_a, &cfg);
    let b = Side::new(&dev_b, &QpConfig::default());
    a.qp.connect(&b.qp.endpoint()).unwrap();
    let start = Instant::now();
    a.qp.post_send(&SendWr::nop().wr_id(1)).unwrap();
    a.qp.post_send(&SendWr::send().wr_id(2)).unwrap();
    let c = poll_n_within(&a.scq, 2, Duration::from_secs(5));
    let elapsed = start.elapsed();
    assert!(c[0].is_ok() && c[0].wr_id == 1, "{:?}", c[0]);
    assert_err(&c[1], Syndrome::TransportRetryExc);
    assert_eq!(c[1].wr_id, 2);
    assert!(
        elapsed >= timeout,
        "gave up after {elapsed:?}, before the timeout"
    );
    assert_quiet(&b.rcq, Duration::ZERO);
}

/// A send posted before the peer connects is retried and lands once the peer connects.
#[test]
fn send_before_peer_connects() {
    let dev_a = Device::soft().unwrap();
    let dev_b = Device::soft().unwrap();
    let mut a = Side::new(&dev_a, &QpConfig::default());
    let mut b = Side::new(&dev_b, &QpConfig::default());
    b.qp.post_recv(&RecvWr::new().wr_id(7)).unwrap();
    a.qp.connect(&b.qp.endpoint()).unwrap();
    a.qp.post_send(&SendWr::send_imm(9).wr_id(8)).unwrap();
    assert_quiet(&a.scq, Duration::from_millis(50));
    b.qp.connect(&a.qp.endpoint()).unwrap();
    let s = poll1(&a.scq);
    assert!(s.is_ok() && s.wr_id == 8, "{s:?}");
    let r = poll1(&b.rcq);
    assert!(r.is_ok() && r.wr_id == 7 && r.imm == Some(9), "{r:?}");
}

/// A CPU post while a send committed for an executor has not been rung would ring past it
/// (it would go out before whatever the executor waits for): refused, and accepted again
/// once the executor has run the commit's ops.
#[test]
fn cpu_post_before_executor_commit_runs_is_refused() {
    let mut p = one_device_pair();
    let prepared = p.a.qp.prepare_send(&SendWr::nop().wr_id(1)).unwrap();
    let (_, ops) = p.a.qp.commit(prepared).unwrap();
    assert!(p.a.qp.has_unrung_commits());
    let e = p.a.qp.post_send(&SendWr::nop().wr_id(2)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("not been rung")),
        "{e}"
    );
    assert_quiet(&p.a.scq, Duration::from_millis(10));
    HostExecutor::default().run(&ops).unwrap();
    assert!(!p.a.qp.has_unrung_commits());
    p.a.qp.post_send(&SendWr::nop().wr_id(3)).unwrap();
    for id in [1, 3] {
        let c = poll1(&p.a.scq);
        assert!(c.is_ok() && c.wr_id == id, "{c:?}");
    }
}

/// The source of a large write deregistered right after posting: the write arrives whole,
/// or fails with LocalProt (the device found the lkey gone before it had read everything),
/// within 2 s, and the responder stays healthy. Never a hang, never a partial write reported
/// as a success.
fn source_deregistered_while_a_large_write_is_in_flight(t: Topo) {
    const LEN: usize = 1 << 20;
    let p0 = Pair::new(t);
    let want = pattern(21, LEN);
    let mut failed = 0;
    for round in 0..16 {
        let mut p = p0.another();
        let mut src = want.clone();
        let mut dst = vec![0u8; LEN];
        let dmr = p.b.pd.register(&mut dst, RW).unwrap();
        let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
        p.a.qp
            .post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(60))
            .unwrap();
        drop(smr);
        let c = poll_n_within(&p.a.scq, 1, Duration::from_secs(2));
        assert_eq!(c.len(), 1, "round {round}: no completion within 2 s");
        assert_eq!(c[0].wr_id, 60);
        match c[0].status {
            WcStatus::Success => {
                let mut got = vec![0u8; LEN];
                dmr.read_at(0, &mut got);
                assert!(got == want, "round {round}: a success with the wrong bytes");
            }
            WcStatus::Error(Syndrome::LocalProt) => failed += 1,
            other => panic!("round {round}: {other:?}"),
        }
        assert_ne!(
            p.b.qp.state(),
            QpState::Error,
            "round {round}: responder in error"
        );
        assert_healthy(&mut p.another());
    }
    eprintln!("{failed} of 16 writes failed with LocalProt");
}

/// Sends waiting for a receive the peer never posted (RNR) show in the engines' report as
/// posted and not completed, on the QP connected to the peer, with the peer's receive ring
/// empty: what a stalled program's report is for.
fn the_engine_report_shows_sends_held_by_a_missing_receive(t: Topo) {
    let cfg = QpConfig {
        rnr_retry: u8::MAX,
        rnr_timer: Duration::from_millis(200),
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &cfg, &QpConfig::default());
    let mut src = pattern(9, 100);
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    for i in 0..3 {
        p.a.qp
            .post_send(&SendWr::send_imm(i).sge(smr.sge(..)).wr_id(i as u64))
            .unwrap();
    }
    assert_quiet(&p.a.scq, Duration::from_millis(50));
    let (a, b) = (p.a.qp.qpn(), p.b.qp.qpn());
    let report = gdasync::gdsync::soft_engines_report().join("\n");
    let mine = |qp: u32, peer: u32, what: &str| {
        report
            .split("; ")
            .any(|l| l.contains(&format!("QP {qp:#x} -> {peer:#x}: ")) && l.contains(what))
    };
    assert!(
        mine(a, b, "/3 (consumed/posted)"),
        "no line for QP {a:#x} with 3 sends posted: {report}"
    );
    assert!(
        mine(b, a, "receive ring 0/0"),
        "no line for QP {b:#x} with no receive posted: {report}"
    );
}
