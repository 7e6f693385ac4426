//! Direct writes between two devices of one process: the data lands without the
//! responder's engine, and never ahead of an earlier message of the same QP that the
//! responder has not answered yet.

use crate::{Access, Device, QpConfig, RecvWr, SendWr};
use std::time::{Duration, Instant};

/// Two connected QPs on two devices, their CQs, and a registered buffer on each.
struct Pair {
    qa: crate::Qp,
    ca: crate::Cq,
    qb: crate::Qp,
    src: crate::MemoryRegion<'static>,
    dst: crate::MemoryRegion<'static>,
    db: Device,
    _keep: (Device, crate::Cq),
}

fn pair(cfg: &QpConfig) -> Pair {
    let (da, db) = (Device::soft().unwrap(), Device::soft().unwrap());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
    let src = pa
        .register(
            Box::leak(vec![7u8; 256].into_boxed_slice()),
            Access::empty(),
        )
        .unwrap();
    let dst = pb
        .register(Box::leak(vec![0u8; 256].into_boxed_slice()), Access::ALL)
        .unwrap();
    let mut qa = pa.create_qp(&ca, &ca, cfg).unwrap();
    let mut qb = pb.create_qp(&cb, &cb, cfg).unwrap();
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qb.connect(&ea).unwrap();
    qa.connect(&eb).unwrap();
    Pair {
        qa,
        ca,
        qb,
        src,
        dst,
        db,
        _keep: (da, cb),
    }
}

/// Waits up to 2 s for `dst[at]` to read `want`.
fn lands(dst: &crate::MemoryRegion<'_>, at: usize, want: u8) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        if dst.read_volatile_u8(at) == want {
            return true;
        }
        crate::progress();
        std::thread::yield_now();
    }
    false
}

/// With the responder's engine held (as a NIC whose host is busy), a write from a device of
/// this process still lands, inline and from memory; it completes once the engine answers.
#[test]
fn a_write_lands_while_the_responder_s_engine_is_held() {
    let mut p = pair(&QpConfig::default());
    let core = super::soft_of(&p.db).engine.core.clone();
    for (id, len, at) in [(1u64, 8usize, 0usize), (2, 200, 16)] {
        let held = core.hold();
        let mut wr = SendWr::write(p.dst.remote().at(at as u64))
            .sge(p.src.sge(..len))
            .wr_id(id);
        if len <= 8 {
            wr = wr.inline();
        }
        p.qa.post_send(&wr).unwrap();
        assert!(lands(&p.dst, at + len - 1, 7), "{len} bytes did not land");
        drop(held);
        let c =
            p.ca.wait_one(Duration::from_secs(2))
                .expect("the completion");
        assert!(c.is_ok() && c.wr_id == id, "{c:?}");
    }
}

/// A write posted behind a send that waits for its receive (RNR) lands only after the send
/// was received: directly written data never overtakes an earlier message of its QP.
#[test]
fn a_write_behind_a_send_waiting_for_its_receive_lands_after_it() {
    let cfg = QpConfig {
        rnr_retry: u8::MAX,
        rnr_timer: Duration::from_millis(1),
        ..QpConfig::default()
    };
    let mut p = pair(&cfg);
    p.qa.post_send(&SendWr::send().sge(p.src.sge(..16)).wr_id(1))
        .unwrap();
    p.qa.post_send(
        &SendWr::write(p.dst.remote().at(128))
            .sge(p.src.sge(..8))
            .inline()
            .wr_id(2),
    )
    .unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(50) {
        assert_ne!(
            p.dst.read_volatile_u8(135),
            7,
            "the write landed while the send before it waited for a receive"
        );
        crate::progress();
        std::thread::yield_now();
    }
    assert!(
        p.ca.poll_one().unwrap().is_none(),
        "nothing completes before the receive"
    );
    p.qb.post_recv(&RecvWr::new().sge(p.dst.sge(..16)).wr_id(9))
        .unwrap();
    for want in [1, 2] {
        let c = p.ca.wait_one(Duration::from_secs(2)).expect("a completion");
        assert!(c.is_ok() && c.wr_id == want, "{c:?}");
    }
    assert_eq!(p.dst.read_volatile_u8(0), 7, "the send's data");
    assert_eq!(p.dst.read_volatile_u8(135), 7, "the write's data");
}
