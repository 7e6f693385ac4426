//! Send batches: one doorbell for every send pushed, on the CPU or as an executor's op list,
//! and a batch dropped unrung takes its sends back.

use crate::exec::{Executor, HostExecutor};
use crate::ops::Op;
use crate::{Access, Cq, Device, MemoryRegion, ProtectionDomain, Qp, QpConfig, SendWr};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// QP `a` (its own send CQ, so its signalled sends get completion numbers) connected to `b`,
/// a source region of 64 bytes `0..64` and a 64-byte zeroed destination.
pub(crate) struct Pair {
    pub a: Qp,
    _b: Qp,
    pub send_cq: Cq,
    pub src: MemoryRegion<'static>,
    pub dst: MemoryRegion<'static>,
    _pd: ProtectionDomain,
}

pub(crate) fn pair(dev: &Device) -> Pair {
    pair_with(dev, &QpConfig::default())
}

/// [`pair`], QP `a` created with `cfg`.
pub(crate) fn pair_with(dev: &Device, cfg: &QpConfig) -> Pair {
    let pd = dev.alloc_pd();
    let send_cq = dev.create_cq(64).unwrap();
    let other = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&send_cq, &other, cfg).unwrap();
    let mut b = pd.create_qp(&other, &other, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    // (Leaked: the regions live as long as the test.)
    let src = pd
        .register(Box::leak((0..64).collect()), Access::empty())
        .unwrap();
    let dst = pd
        .register(
            Box::leak(vec![0u8; 64].into_boxed_slice()),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    Pair {
        a,
        _b: b,
        send_cq,
        src,
        dst,
        _pd: pd,
    }
}

/// A write of the source's bytes `at..at + 8` to the same place in the destination.
fn write8(p: &Pair, at: usize, wr_id: u64) -> SendWr {
    SendWr::write(p.dst.remote().at(at as u64))
        .sge(p.src.sge(at..at + 8))
        .wr_id(wr_id)
}

fn dst(p: &Pair) -> Vec<u8> {
    let mut out = vec![0u8; 64];
    p.dst.read_at(0, &mut out);
    out
}

#[test]
fn a_batch_rung_on_the_cpu_exposes_all_its_sends_with_one_doorbell() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let wrs: Vec<SendWr> = (0..3).map(|i| write8(&p, 8 * i, i as u64)).collect();
    let record = p.a.sq_doorbell_record();
    let mut batch = p.a.send_batch();
    for wr in &wrs {
        batch.push(wr).unwrap();
    }
    assert_eq!(batch.wqebbs(), 3);
    batch.ring().unwrap();
    // The record moved once, past all three (nothing was exposed while they were pushed).
    assert_eq!(p.a.sq_doorbell_record(), record.wrapping_add(3));
    for i in 0..3 {
        let c = p.send_cq.wait_one(WAIT).unwrap().ok().unwrap();
        assert_eq!(c.wr_id, i);
    }
    let want: Vec<u8> = (0..24).chain(std::iter::repeat_n(0, 40)).collect();
    assert_eq!(dst(&p), want);
}

#[test]
fn a_batch_for_an_executor_is_one_doorbell_op_list() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let wrs: Vec<SendWr> = (0..2).map(|i| write8(&p, 8 * i, i as u64)).collect();
    let record = p.a.sq_doorbell_record();
    let mut batch = p.a.send_batch();
    for wr in &wrs {
        batch.push(wr).unwrap();
    }
    let ops = batch.ops();
    // A barrier, the record, a barrier, the register, a barrier, "rung to": as a commit's.
    let kinds: Vec<&Op> = ops.as_slice().iter().collect();
    assert!(
        matches!(
            kinds[..],
            [
                Op::Barrier,
                Op::Write32 { .. },
                Op::Barrier,
                Op::Doorbell { .. },
                Op::Barrier,
                Op::Write64 { .. }
            ]
        ),
        "{ops:?}"
    );
    assert_eq!(
        p.a.sq_doorbell_record(),
        record,
        "nothing rung before the ops run"
    );
    HostExecutor::default().submit(ops).unwrap();
    assert_eq!(p.a.sq_doorbell_record(), record.wrapping_add(2));
    for i in 0..2 {
        assert_eq!(p.send_cq.wait_one(WAIT).unwrap().ok().unwrap().wr_id, i);
    }
    // The QP knows the batch was committed: a CPU post after the ops ran is allowed.
    p.a.post_send(&write8(&p, 16, 9)).unwrap();
    assert_eq!(p.send_cq.wait_one(WAIT).unwrap().ok().unwrap().wr_id, 9);
}

#[test]
fn a_batch_dropped_unrung_takes_its_sends_back() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let dropped = write8(&p, 0, 1);
    let later = write8(&p, 8, 2);
    let record = p.a.sq_doorbell_record();
    let would_be = {
        let mut batch = p.a.send_batch();
        let t = batch.push(&dropped).unwrap();
        batch.push(&dropped).unwrap();
        t
    };
    assert_eq!(
        p.a.sq_doorbell_record(),
        record,
        "a dropped batch rings nothing"
    );
    let t = p.a.post_send(&later).unwrap();
    // The later send took the dropped batch's first slot and completion number.
    assert_eq!(t.index, would_be.index);
    assert_eq!(t.end, would_be.end);
    assert_eq!(t.cqe, would_be.cqe);
    assert!(t.cqe.is_some());
    let c = p.send_cq.wait_one(WAIT).unwrap().ok().unwrap();
    assert_eq!(c.wr_id, 2);
    // The peer saw only the later data; nothing else completes.
    let want: Vec<u8> = std::iter::repeat_n(0, 8)
        .chain(8..16)
        .chain(std::iter::repeat_n(0, 48))
        .collect();
    assert_eq!(dst(&p), want);
    std::thread::sleep(Duration::from_millis(50));
    assert!(p.send_cq.poll_one().unwrap().is_none());
}

#[test]
fn a_batch_refuses_to_expose_a_prepared_send() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let wr = write8(&p, 0, 1);
    let prepared = p.a.prepare_send(&wr).unwrap();
    assert!(p.a.send_batch().push(&wr).is_err());
    drop(prepared);
    // Dropped uncommitted, it is passed over (as a no-op): the batch may go.
    let mut batch = p.a.send_batch();
    batch.push(&wr).unwrap();
    batch.ring().unwrap();
}

#[test]
fn a_batch_rung_past_an_executors_unrung_commit_is_refused_and_taken_back() {
    let dev = Device::soft().unwrap();
    let mut p = pair(&dev);
    let first = write8(&p, 0, 1);
    let prepared = p.a.prepare_send(&first).unwrap();
    let (t1, ops) = p.a.commit(prepared).unwrap();
    // The commit's ops have not run: a doorbell on the CPU now would expose it early.
    let second = write8(&p, 8, 2);
    let mut batch = p.a.send_batch();
    let would_be = batch.push(&second).unwrap();
    assert!(batch.ring().is_err());
    HostExecutor::default().submit(ops).unwrap();
    assert_eq!(p.send_cq.wait_one(WAIT).unwrap().ok().unwrap().wr_id, 1);
    // The refused batch took its send back: the next one lands where it would have.
    let t = p.a.post_send(&write8(&p, 16, 3)).unwrap();
    assert_eq!((t.index, t.cqe), (would_be.index, would_be.cqe));
    assert_eq!(t.index, t1.end);
    assert_eq!(p.send_cq.wait_one(WAIT).unwrap().ok().unwrap().wr_id, 3);
    let want: Vec<u8> = (0..8)
        .chain(std::iter::repeat_n(0, 8))
        .chain(16..24)
        .chain(std::iter::repeat_n(0, 40))
        .collect();
    assert_eq!(dst(&p), want);
}
