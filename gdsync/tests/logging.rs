//! The library logs what a user needs through `tracing`: the soft device it creates and why,
//! the link to each peer and why that one, each QP connection, and error completions with
//! their syndrome (once each, whether a CPU poll or an executor consumed them).
//!
//! One test only: the first device and the first link of each kind in a process are logged
//! at info level, later ones at debug level, so the test must be the first to create them.

#[path = "support/capture.rs"]
mod capture;

use capture::Capture;
use gdsync::exec::HostExecutor;
use gdsync::{Access, Cq, Device, ProtectionDomain, Qp, QpConfig, RemoteAddr, SendWr, WcStatus};
use std::time::Duration;
use tracing::Level;

const WAIT: Duration = Duration::from_secs(20);

/// A QP in `pd` with its own send and receive CQs (so an executor can wait for its sends),
/// and its send CQ.
fn qp(dev: &Device, pd: &ProtectionDomain) -> (Qp, Cq) {
    let scq = dev.create_cq(64).unwrap();
    let rcq = dev.create_cq(64).unwrap();
    (pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap(), scq)
}

#[test]
fn device_link_connect_and_error_completions_are_logged() {
    let log = Capture::default();
    tracing::dispatcher::with_default(&log.dispatch(), || {
        let (d1, d2) = (Device::soft().unwrap(), Device::soft().unwrap());
        let (n1, n2) = (d1.info().name, d2.info().name);
        let created = log.one(&[&n1, "soft device"]);
        assert!(created.level <= Level::INFO, "{created:?}");
        assert!(
            ["rdma-core", "RDMA device", "drives no RDMA hardware"]
                .iter()
                .any(|why| created.text.contains(why)),
            "the first device says why it is a soft device: {created:?}"
        );
        assert_eq!(log.one(&[&n2, "soft device"]).level, Level::DEBUG);

        let (pd1, pd2) = (d1.alloc_pd(), d2.alloc_pd());
        let (mut a, scq) = qp(&d1, &pd1);
        let (mut b, _) = qp(&d2, &pd2);
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        let link = log.one(&[&n1, "in-process link to"]);
        assert_eq!(link.level, Level::INFO, "the first in-process link");
        assert!(
            link.text.contains("the peer device is in this process"),
            "{link:?}"
        );
        assert!(
            link.text.contains(&format!("{:016x}", d2.info().uid)),
            "{link:?}"
        );
        assert_eq!(log.one(&[&n2, "in-process link to"]).level, Level::DEBUG);
        let connect = log.one(&[
            &n1,
            &format!("QP {:#x} connected to QP {:#x}", a.qpn(), b.qpn()),
        ]);
        assert_eq!(connect.level, Level::DEBUG);
        assert!(connect.text.contains("in-process link"), "{connect:?}");

        // A write with a key the peer never issued: REM_ACCESS_ERR, polled by the CPU.
        let mut src = vec![1u8; 64];
        let src_mr = pd1.register(&mut src, Access::empty()).unwrap();
        let bad = RemoteAddr {
            addr: 0x1000,
            rkey: 0xdead,
        };
        a.post_send(&SendWr::write(bad).sge(src_mr.sge(..)).wr_id(7))
            .unwrap();
        let c = scq.wait_one(WAIT).unwrap();
        assert!(matches!(c.status, WcStatus::Error(_)), "{c:?}");
        let polled = log.one(&["work request 7", "RemoteAccess"]);
        assert_eq!(polled.level, Level::ERROR);
        assert!(polled.text.contains("IBV_WC_REM_ACCESS_ERR"), "{polled:?}");
        assert!(
            polled.text.contains(&format!("QP {:#x}", a.qpn())),
            "{polled:?}"
        );
        // Handing the same error out again does not log it twice.
        assert_eq!(scq.take_errors().len(), 1);
        assert_eq!(log.with(&["RemoteAccess"]).len(), 1);

        // The same failure consumed by an executor's wait: logged when taken.
        let (mut x, xcq) = qp(&d1, &pd1);
        let (mut y, _) = qp(&d2, &pd2);
        x.connect(&y.endpoint()).unwrap();
        y.connect(&x.endpoint()).unwrap();
        let exec = HostExecutor::with_timeout(WAIT);
        let p = x
            .prepare_send(&SendWr::write(bad).sge(src_mr.sge(..)).wr_id(8))
            .unwrap();
        let t = x.post_prepared(p, &exec).unwrap();
        x.wait_send(&t, &exec).unwrap();
        let taken = xcq.take_errors();
        assert_eq!(taken.len(), 1, "{taken:?}");
        let logged = log.one(&[&format!("on QP {:#x}", x.qpn()), "RemoteAccess"]);
        assert_eq!(logged.level, Level::ERROR);
        assert!(logged.text.contains("IBV_WC_REM_ACCESS_ERR"), "{logged:?}");
    });
}
