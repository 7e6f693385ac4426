//! Resources stay bounded over long lives: a million QPs created and destroyed reuse their
//! numbers and leave memory flat; a CQ that is only polled keeps a bounded list of errors;
//! peer devices that come and go leave a long-lived device's memory flat.
//! (`GDSYNC_CHURN_CYCLES` sets the number of QP cycles, CI runs 100,000;
//! `GDSYNC_LINK_CHURN_PEERS` the number of peer devices, CI runs 50.)
//!
//! The tests that measure this process's memory take turns ([`alone`]): each would see the
//! other's allocations.

mod common;

use common::*;
use gdasync::gdsync::{Device, QpConfig, SendWr, WcStatus, MAX_KEPT_ERRORS};

/// Resident memory of this process in KiB (from /proc/self/statm).
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field");
    pages * 4
}

/// Holds the memory-measuring tests apart.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Virtual memory of this process in KiB (from /proc/self/statm).
fn vm_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("statm's first field");
    pages * 4
}

#[test]
fn qp_numbers_are_reused_and_memory_stays_flat() {
    let _alone = alone();
    let cycles = env_or("GDSYNC_CHURN_CYCLES", 100_000);
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    // One QP stays alive throughout: the churning ones share the device with it.
    let keep = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let churn = |n: u64| {
        let mut most = 0;
        for _ in 0..n {
            let qp = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
            most = most.max(qp.qpn());
        }
        most
    };
    churn(10_000); // warm-up: allocator caches, the engine's tables
    let before = rss_kib();
    let most = churn(cycles);
    let after = rss_kib();
    eprintln!(
        "{cycles} QP create/destroy cycles: RSS {before} KiB -> {after} KiB, largest QPN {most:#x}"
    );
    // Freed numbers rest behind 1024 others before they are used again.
    assert!(
        most <= keep.qpn() + 1026,
        "QP numbers are not reused: {most:#x} after {cycles} cycles"
    );
    assert!(
        after.saturating_sub(before) < 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB over {cycles} cycles"
    );
    // The device still works.
    let mut p = Pair::on(&dev, &dev, &QpConfig::default(), &QpConfig::default());
    assert_healthy(&mut p);
}

#[test]
fn a_cq_that_is_only_polled_keeps_a_bounded_error_list() {
    let mut p = Pair::new(Topo::Loopback);
    // Put the QP in the error state: a write with a key nobody issued.
    let mut buf = vec![0u8; 64];
    let mr = p.a.pd.register(&mut buf, Default::default()).unwrap();
    let bad = gdasync::gdsync::RemoteAddr {
        addr: 0x1000,
        rkey: 0xdead_0001,
    };
    p.a.qp
        .post_send(&SendWr::write(bad).sge(mr.sge(..)))
        .unwrap();
    assert!(!poll1(&p.a.scq).is_ok());
    // Then more error completions than the CQ keeps (flushes), only polled.
    let total = MAX_KEPT_ERRORS + 200;
    let mut flushed = 0;
    while flushed < total {
        let batch = 64.min(total - flushed);
        for i in 0..batch {
            p.a.qp.post_send(&SendWr::nop().wr_id(i as u64)).unwrap();
        }
        for c in poll_n(&p.a.scq, batch) {
            assert_eq!(
                c.status,
                WcStatus::Error(gdasync::gdsync::format::Syndrome::WrFlush)
            );
        }
        flushed += batch;
    }
    let kept = p.a.scq.take_errors();
    assert_eq!(kept.len(), MAX_KEPT_ERRORS, "errors kept for take_errors");
    assert!(p.a.scq.take_errors().is_empty());
}

/// Peer devices come and go against a long-lived device: each connects a QP to a new QP of
/// it, writes 1 MiB through the link's ring (two gather segments: no single-copy delivery,
/// no placed write) and is dropped, and the long-lived device destroys its QP. Links to the
/// dropped peers must be released: resident and virtual memory stay flat (each link held
/// 8 MiB of rings, of which the write touched 1 MiB).
#[test]
fn peer_devices_that_come_and_go_leave_memory_flat() {
    let _alone = alone();
    let peers = env_or("GDSYNC_LINK_CHURN_PEERS", 50) as usize;
    let server = Device::soft().unwrap();
    let healthy = Pair::on(
        &server,
        &Device::soft().unwrap(),
        &QpConfig::default(),
        &QpConfig::default(),
    );
    let mut src = vec![0x3Cu8; 1 << 20];
    let half = src.len() / 2;
    let one = |i: usize, src: &mut Vec<u8>| {
        let peer = Device::soft().unwrap();
        let mut p = Pair::on(&peer, &server, &QpConfig::default(), &QpConfig::default());
        let mut dst = vec![0u8; 1 << 20];
        let smr = p.a.pd.register(src, Default::default()).unwrap();
        let dmr =
            p.b.pd
                .register(&mut dst, gdasync::gdsync::Access::ALL)
                .unwrap();
        let wr = SendWr::write(dmr.remote().at(0)).sges(&[smr.sge(..half), smr.sge(half..)]);
        p.a.qp.post_send(&wr).unwrap();
        assert!(poll1(&p.a.scq).is_ok(), "peer {i}");
        assert_eq!(dmr.read_volatile_u8((1 << 20) - 1), 0x3C, "peer {i}");
    };
    for i in 0..10 {
        one(i, &mut src); // warm-up: allocator caches, the engine's tables
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (rss0, vm0) = (rss_kib(), vm_kib());
    for i in 0..peers {
        one(i, &mut src);
    }
    // Links go within a few milliseconds of their peer.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (rss1, vm1) = (rss_kib(), vm_kib());
    eprintln!("{peers} peer devices came and went: RSS {rss0} KiB -> {rss1} KiB, VmSize {vm0} KiB -> {vm1} KiB");
    assert!(
        rss1.saturating_sub(rss0) < 16 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB over {peers} peers"
    );
    assert!(
        vm1.saturating_sub(vm0) < 64 * 1024,
        "VmSize grew from {vm0} KiB to {vm1} KiB over {peers} peers"
    );
    let mut healthy = healthy;
    assert_healthy(&mut healthy);
}
