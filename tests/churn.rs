//! Resources stay bounded over long lives: a million QPs created and destroyed reuse their
//! numbers and leave memory flat; a CQ that is only polled keeps a bounded list of errors.
//! (`GDSYNC_CHURN_CYCLES` sets the number of QP cycles; CI runs 100,000.)

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

#[test]
fn qp_numbers_are_reused_and_memory_stays_flat() {
    let cycles: u64 = std::env::var("GDSYNC_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
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
