//! Lazy polls: completions in order, the consumer index published once when the poll is
//! dropped (read back from the CQ's doorbell record), and error completions still surface.

use crate::format::{CqeOwner, Syndrome, CQE_SIZE};
use crate::mem::slot_off;
use crate::qp::batch_tests::{pair, Pair};
use crate::wr::RemoteAddr;
use crate::{Cq, Device, SendWr, WcStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The consumer index the CQ's doorbell record holds (24 bits).
fn published(cq: &Cq) -> u32 {
    let s = &cq.shared;
    crate::mem::load_be32(&s.dbrec.mem, s.dbrec.off) & 0xFF_FFFF
}

/// Waits (lending the thread to the soft engines) until the CQ holds `n` completions.
fn wait_written(cq: &Cq, n: u64) {
    let s = &cq.shared;
    let start = Instant::now();
    loop {
        let op_own = s.ring.u8(slot_off(0, n - 1, s.cnt, CQE_SIZE) + 63);
        if CqeOwner::is_new(op_own.load(Ordering::Acquire), n - 1, s.cnt) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{n} completions never came"
        );
        crate::device::soft::progress();
        std::thread::yield_now();
    }
}

/// Posts `n` signalled 8-byte writes (wr_ids `0..n`) from a QP whose sends complete on a CQ
/// of their own, to a good rkey or a bad one, and waits until they complete. (The QPs stay:
/// a completion of a destroyed QP has no wr_id.)
fn writes(dev: &Device, n: u64, bad_rkey: bool) -> Pair {
    let mut p = pair(dev);
    let mut to = p.dst.remote().at(0);
    if bad_rkey {
        to = RemoteAddr {
            rkey: to.rkey ^ 0x5a5a00,
            ..to
        };
    }
    for i in 0..n {
        let wr = SendWr::write(to).sge(p.src.sge(0..8)).wr_id(i);
        p.a.post_send(&wr).unwrap();
    }
    wait_written(&p.send_cq, n);
    p
}

#[test]
fn a_lazy_poll_yields_in_order_and_publishes_the_index_once_when_dropped() {
    let dev = Device::soft().unwrap();
    let p = writes(&dev, 3, false);
    let cq = &p.send_cq;
    assert_eq!(published(cq), 0);
    let mut poll = cq.poll_iter().unwrap();
    for i in 0..3 {
        let c = poll.next().unwrap().unwrap();
        assert_eq!((c.wr_id, c.cqe_index), (i, i));
        assert!(c.is_ok());
        // Consumed, not yet published.
        assert_eq!(published(cq), 0);
    }
    assert!(poll.next().is_none());
    assert_eq!(published(cq), 0);
    drop(poll);
    assert_eq!(published(cq), 3);
    assert_eq!(cq.consumer_index(), 3);
    // A poll that took nothing publishes nothing new.
    assert!(cq.poll_iter().unwrap().next().is_none());
    assert_eq!(published(cq), 3);
}

#[test]
fn a_lazy_poll_dropped_part_way_publishes_what_it_took() {
    let dev = Device::soft().unwrap();
    let p = writes(&dev, 3, false);
    let cq = &p.send_cq;
    let first = cq.poll_iter().unwrap().next().unwrap().unwrap();
    assert_eq!(first.wr_id, 0);
    assert_eq!(published(cq), 1);
    let rest: Vec<u64> = cq.poll_iter().unwrap().map(|c| c.unwrap().wr_id).collect();
    assert_eq!(rest, [1, 2]);
    assert_eq!(published(cq), 3);
}

#[test]
fn error_completions_surface_through_a_lazy_poll() {
    let dev = Device::soft().unwrap();
    let p = writes(&dev, 1, true);
    let cq = &p.send_cq;
    let got: Vec<_> = cq.poll_iter().unwrap().map(|c| c.unwrap()).collect();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, WcStatus::Error(Syndrome::RemoteAccess));
    assert!(got[0].ok().is_err());
    let errors = cq.take_errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].syndrome, Syndrome::RemoteAccess);
    assert_eq!(published(cq), 1);
}
