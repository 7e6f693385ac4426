//! The soft HCA's strict checks of the send side, each provoked the way a misbehaving ringer
//! or writer would: the QP goes to the error state, its send CQ gets a LOCAL_QP_OP error
//! completion, and the device raises the async event "QP fatal".

use crate::exec::HostExecutor;
use crate::format::{doorbell_value, qp_dbrec_value, Syndrome};
use crate::ops::{ops_of, Op, Ops};
use crate::provider::AsyncEvent;
use crate::qp::batch_tests::{pair, Pair};
use crate::{Device, QpState, SendWr, WcStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);

fn write8(p: &Pair, wr_id: u64) -> SendWr {
    SendWr::write(p.dst.remote().at(0))
        .sge(p.src.sge(0..8))
        .wr_id(wr_id)
}

/// The ops of `ops` that match `pick`, run on this thread (`ops` keeps their memory alive).
fn run_only(ops: &Ops, pick: impl Fn(&Op) -> bool) {
    let part: Vec<Op> = ops.as_slice().iter().copied().filter(pick).collect();
    // SAFETY: a commit's ops, whose memory `ops` keeps alive while this runs.
    HostExecutor::default()
        .run(&unsafe { ops_of(&part) })
        .unwrap();
}

fn is_doorbell(o: &Op) -> bool {
    matches!(o, Op::Doorbell { .. })
}

/// QP `a` of `p` was refused: the device raised "QP fatal" for it within 2 s, its send CQ
/// holds a LOCAL_QP_OP error completion, and the QP is in the error state. (The events are
/// read straight from the device: the library's own state reads would consume them.)
fn expect_refused(p: &Pair) {
    let start = Instant::now();
    let qpn = p.a.qpn();
    let mut events = Vec::new();
    while !events.contains(&AsyncEvent::QpFatal { qpn }) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "no QP fatal event for {qpn:#x} within 2 s: {events:?}"
        );
        match p.a.ctx.provider.get_async_event() {
            Some(e) => events.push(e),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let c = p.send_cq.wait_one(WAIT).unwrap();
    assert_eq!(c.status, WcStatus::Error(Syndrome::LocalQpOp), "{c:?}");
    assert_eq!(p.a.state(), QpState::Error, "the QP is not refused");
}

/// Two sends rung; then the first one's doorbell again (its record left alone): the
/// doorbell goes backwards.
#[test]
fn a_doorbell_that_goes_backwards_fails_the_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let first = p.a.prepare_send(&write8(&p, 0)).unwrap();
    let (_, old) = p.a.commit(first).unwrap();
    let second = p.a.prepare_send(&write8(&p, 1)).unwrap();
    let (_, new) = p.a.commit(second).unwrap();
    HostExecutor::default().run(&new).unwrap();
    for id in [0, 1] {
        let c = p.send_cq.wait_one(WAIT).unwrap();
        assert!(c.is_ok() && c.wr_id == id, "{c:?}");
    }
    run_only(&old, is_doorbell);
    expect_refused(&p);
}

/// A doorbell rung without its doorbell record: it names a WQE past the record.
#[test]
fn a_doorbell_past_the_doorbell_record_fails_the_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let prepared = p.a.prepare_send(&write8(&p, 0)).unwrap();
    let (_, ops) = p.a.commit(prepared).unwrap();
    run_only(&ops, is_doorbell);
    expect_refused(&p);
}

/// One send rung; then the record and a doorbell claim a second WQE that was never written
/// (its slot holds no WQE of that index): the record is ahead of the WQEs.
#[test]
fn a_doorbell_record_ahead_of_the_wqes_fails_the_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    p.a.post_send(&write8(&p, 0)).unwrap();
    let c = p.send_cq.wait_one(WAIT).unwrap();
    assert!(c.is_ok(), "{c:?}");
    let s = &p.a.shared;
    // A doorbell naming WQE index 1 of one block of this QP (ctrl bytes 0..8).
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&((1u32 << 8) | 0x08).to_be_bytes());
    head[4..].copy_from_slice(&((s.qpn << 8) | 2).to_be_bytes());
    s.sq_dbrec()
        .store(qp_dbrec_value(2).native(), Ordering::Release);
    s.doorbell_half(0)
        .store(doorbell_value(head), Ordering::Release);
    p.a.ctx.provider.kick();
    expect_refused(&p);
}

/// An inline write whose ds count claims one unit more than its payload takes.
#[test]
fn an_inline_wqe_whose_ds_disagrees_with_its_payload_fails_the_qp() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let prepared = p.a.prepare_send(&write8(&p, 0).inline()).unwrap();
    let s = &p.a.shared;
    let ctrl = s.sq_off + (prepared.ticket().index as usize % s.sq_cnt as usize) * 64;
    let mut b = [0u8; 8];
    s.buf.read(ctrl, &mut b);
    // ctrl, remote address, 4 + 8 inline bytes: 3 units; one more disagrees.
    assert_eq!(b[7] & 0x3F, 3, "{b:?}");
    b[7] += 1;
    s.buf.write(ctrl, &b);
    p.a.post_prepared(prepared, &HostExecutor::default())
        .unwrap();
    expect_refused(&p);
}
