//! The strict checks on a CQ's consumer index: an index that moves backwards, one ahead of
//! the CQEs written and an overrun each put the CQ in error, with one log line and the
//! asynchronous event naming the CQ; the QP whose CQE was dropped goes to error.

use super::ci_fault;
use crate::qp::batch_tests::{pair, Pair};
use crate::{Device, Error, SendWr};
use std::time::{Duration, Instant};

#[test]
fn ci_fault_names_each_case_and_passes_good_indexes() {
    // Good: nothing consumed, some consumed, all consumed, across the 24-bit wrap.
    assert_eq!(ci_fault(0, 0, 0, 4, true), None);
    assert_eq!(ci_fault(3, 0, 2, 4, true), None);
    assert_eq!(ci_fault(3, 2, 3, 4, true), None);
    assert_eq!(ci_fault((1 << 24) + 2, 0xFF_FFFF, 1, 4, true), None);
    let back = ci_fault(3, 2, 1, 4, true).unwrap();
    assert!(back.contains("backwards, from 2 to 1"), "{back}");
    let back_wrap = ci_fault((1 << 24) + 2, 1, 0xFF_FFFF, 4, true).unwrap();
    assert!(back_wrap.contains("backwards"), "{back_wrap}");
    let ahead = ci_fault(3, 2, 4, 4, true).unwrap();
    assert!(ahead.contains("ahead of the 3 CQEs"), "{ahead}");
    let over = ci_fault(6, 2, 2, 4, true).unwrap();
    assert!(over.contains("overrun"), "{over}");
    // A full ring with no CQE waiting (a timer tick's look) is no overrun.
}

/// Posts a signalled write from `p.a` (its completion goes to `p.send_cq`).
fn write(p: &mut Pair, wr_id: u64) {
    let wr = SendWr::write(p.dst.remote().at(0))
        .sge(p.src.sge(0..8))
        .wr_id(wr_id);
    p.a.post_send(&wr).unwrap();
}

/// Waits until the device has put the send CQ in error (at a CQE it found no room for, or at
/// the timer tick that reads the consumer index), within 2 s.
fn wait_error(p: &Pair) {
    let start = Instant::now();
    let cq = &p.send_cq;
    while !cq.shared.ctx().cq_overran(cq.cqn()) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "CQ {:#x} not in error (QP {:?})",
            cq.cqn(),
            p.a.state()
        );
        crate::device::soft::progress();
        std::thread::yield_now();
    }
}

/// The CQ is in error: the device raised the event naming it, and a poll that finds nothing
/// more says so.
fn assert_cq_error(p: &Pair) {
    let cq = &p.send_cq;
    assert!(
        cq.shared.ctx().cq_overran(cq.cqn()),
        "no CQ error event for CQ {:#x}",
        cq.cqn()
    );
    let mut got = Vec::new();
    let err = loop {
        match cq.poll(&mut got, 16) {
            Ok(0) => panic!("an empty poll of a CQ in error must fail"),
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::CqOverrun { cqn } if cqn == cq.cqn()),
        "{err}"
    );
}

#[test]
fn a_consumer_index_that_moves_backwards_is_a_cq_error() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    for i in 0..2 {
        write(&mut p, i);
        p.send_cq.wait_one(Duration::from_secs(2)).unwrap();
    }
    assert_eq!(p.send_cq.consumer_index(), 2);
    // Timer ticks pass, so the device reads the record (2) before the index goes back.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        crate::device::soft::progress();
        std::thread::yield_now();
    }
    p.send_cq.shared.store_ci(1);
    write(&mut p, 2);
    wait_error(&p);
    assert_cq_error(&p);
}

#[test]
fn a_consumer_index_ahead_of_the_cqes_written_is_a_cq_error() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    // Nothing written yet, and the record says 5 consumed.
    p.send_cq.shared.store_ci(5);
    write(&mut p, 0);
    wait_error(&p);
    assert_cq_error(&p);
}

/// A ring that holds as many CQEs as it has entries is full, not overrun: timer ticks that
/// read the consumer index meanwhile leave the CQ working, and every CQE is polled.
#[test]
fn a_full_ring_is_no_overrun_while_no_cqe_waits() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let cnt = u64::from(p.send_cq.entries());
    for i in 0..cnt {
        write(&mut p, i);
    }
    // Timer ticks pass with the ring full and nothing consumed.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        crate::device::soft::progress();
        std::thread::yield_now();
    }
    let cq = &p.send_cq;
    assert!(
        !cq.shared.ctx().cq_overran(cq.cqn()),
        "a full ring is no overrun"
    );
    let mut got = Vec::new();
    while (got.len() as u64) < cnt {
        if let Err(e) = cq.poll(&mut got, 16) {
            panic!("{e} after {} completions", got.len());
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{got:?}");
    }
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..cnt).collect::<Vec<_>>());
}

#[test]
fn an_overrun_is_a_cq_error_with_its_event() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let cnt = u64::from(p.send_cq.entries());
    // One more completion than the ring holds, none consumed.
    for i in 0..=cnt {
        write(&mut p, i);
    }
    wait_error(&p);
    assert_cq_error(&p);
}
