//! The mlx5 control path through gdsync's safe layer, against the real libibverbs and libmlx5
//! under the emulated kernel driver (uverbs-emu): device list, query device and port, GID
//! choice, PD, MRs, CQ ring, mlx5dv QP rings, INIT/RTR/RTS and the driver's refusals,
//! `ibv_query_qp`, the async events (port down and up, QP fatal), the device selection
//! (`Device::open`, `GDSYNC_DEVICE`, `Device::default`); and what is reported without a device;
//! in [`firmware`], the commands a run issues once connected and what a CQ error fails. The preload must be in a process's environment from its
//! start, so each test runs its body in a child (this test binary again, with the emulator's
//! environment). Ignored where rdma-core is not installed.

use gdsync::mlx5::{
    devices, AsyncEvent, Context, GidType, LinkLayer, PortState, QpState, RdmaError, RemoteQp,
    RtrAttr, RtsAttr,
};
use gdsync::{Access, Device, DeviceSelection, DEVICE_VAR};
use std::sync::Arc;
use std::time::Duration;
use uverbs_emu::control;

use uverbs_emu::in_child_under_emulator;

#[path = "mlx5/firmware.rs"]
mod firmware;

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_control_path_on_a_roce_port() {
    if in_child_under_emulator("mlx5_control_path_on_a_roce_port", "mlx5_0") {
        return;
    }
    let list = devices().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (list[0].name.as_str(), list[0].uverbs.as_str()),
        ("mlx5_0", "uverbs0")
    );
    assert!(list[0].mlx5);

    let ctx = Context::open("mlx5_0").unwrap();
    let dev = ctx.query_device().unwrap();
    assert_eq!(
        (dev.vendor_id, dev.vendor_part_id, dev.phys_port_cnt),
        (0x02c9, 4125, 1)
    );
    assert_eq!(dev.fw_ver, "22.36.1010");
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!((port.active_mtu, port.max_mtu), (2048, 4096));
    assert!(ctx.query_port(2).is_err(), "the device has one port");

    // The RoCE v2 entry with the port's IPv4 address, read from the (fake) sysfs GID table.
    let table = ctx.gid_table(1).unwrap();
    assert_eq!(table.len(), 4, "{table:?}");
    let gid = ctx.choose_gid(1, None).unwrap();
    assert_eq!(gid.entry.index, 3);
    assert_eq!(gid.entry.kind, GidType::RoceV2);
    // 10.device.port.node: the emulator's node number on the fabric is not known here.
    let ip = gid.entry.gid.ipv4().unwrap().octets();
    assert_eq!((&ip[..3], ip[3] >= 1), (&[10, 0, 1][..], true), "{ip:?}");
    assert_eq!(ctx.choose_gid(1, Some(1)).unwrap().entry.index, 1);
    assert!(ctx.choose_gid(1, Some(7)).is_err(), "entry 7 is empty");

    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mr = pd.reg_mr(&mut buf, Access::ALL).unwrap();
    assert_ne!(mr.lkey(), 0);
    assert_eq!(mr.len(), 1 << 16);
    let bad = pd.reg_mr(&mut [0u8; 64], Access::REMOTE_WRITE).err();
    assert!(
        matches!(
            bad,
            Some(RdmaError::Verbs {
                call: "ibv_reg_mr",
                errno: libc::EINVAL
            })
        ),
        "remote write without local write is refused: {bad:?}"
    );

    // ibv_reg_dmabuf_mr is ioctl-only: the driver's one ioctl method. Any descriptor stands
    // in for the dma-buf a GPU export would give.
    let dmabuf = std::fs::File::open("/dev/null").unwrap();
    let dm = pd
        .reg_dmabuf_mr(
            std::os::fd::AsFd::as_fd(&dmabuf),
            0,
            4096,
            0,
            Access::LOCAL_WRITE,
        )
        .unwrap();
    assert_ne!(dm.lkey(), mr.lkey());
    assert_eq!(dm.len(), 4096);

    let cq = ctx.create_cq(100).unwrap();
    let ring = cq.ring();
    assert_eq!((ring.cqe_cnt, ring.cqe_size), (128, 64));
    for i in 0..ring.cqe_cnt as usize {
        // SAFETY: the ring is cqe_cnt entries of 64 bytes, alive while `cq` is.
        let op_own = unsafe { *((ring.buf + i * 64 + 63) as *const u8) };
        assert_eq!(op_own, 0xff, "CQE {i} is not marked unwritten");
    }

    let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
    let r = qp.rings();
    assert_eq!(r.qpn, qp.qpn());
    assert_eq!(r.sq_stride, 64);
    assert!(r.sq_wqe_cnt.is_power_of_two() && r.rq_wqe_cnt >= 64);
    assert_eq!(
        r.sq_buf,
        r.rq_buf + (r.rq_wqe_cnt * r.rq_stride) as usize,
        "RQ first, SQ after"
    );
    assert_eq!(
        (r.bf_reg % 4096) & !0x3ff,
        0x800,
        "BlueFlame registers are at +0x800 of a UAR page"
    );
    assert_eq!(r.bf_size, 256);

    // Out of order: RTS before INIT is refused by the driver, with the call and errno.
    let early = qp.to_rts(&RtsAttr::default()).unwrap_err();
    assert!(
        matches!(
            early,
            RdmaError::Verbs {
                errno: libc::EINVAL,
                ..
            }
        ),
        "{early:?}"
    );
    assert!(
        early.to_string().starts_with("ibv_modify_qp(RTS) failed"),
        "{early}"
    );

    // Connect to itself (loopback), as a RoCE v2 connection.
    qp.to_init(1, Access::ALL).unwrap();
    let me = RemoteQp {
        qpn: qp.qpn(),
        psn: 0x123,
        lid: 0,
        gid: Some(gid.entry.gid),
    };
    let rtr = RtrAttr {
        sgid_index: gid.entry.index as u8,
        ..RtrAttr::new(me, 1, port.active_mtu)
    };
    assert!(
        qp.to_rtr(&RtrAttr { mtu: 1500, ..rtr }).is_err(),
        "not an IB MTU"
    );
    qp.to_rtr(&rtr).unwrap();
    qp.to_rts(&RtsAttr {
        sq_psn: 0x123,
        ..Default::default()
    })
    .unwrap();
    assert!(qp
        .to_rts(&RtsAttr {
            retry_cnt: 8,
            ..Default::default()
        })
        .is_err());
    qp.to_error().unwrap();

    // Destroyed in verbs order by ownership: the QP, then the CQ, the MR, the PD, the context.
    drop(qp);
    drop((cq, mr, dm));
    assert_eq!(Arc::strong_count(&pd), 1);
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_several_devices_and_infiniband_ports() {
    if in_child_under_emulator(
        "mlx5_several_devices_and_infiniband_ports",
        "mlx5_0,mlx5_1:roce:ib",
    ) {
        return;
    }
    let names: Vec<String> = devices().unwrap().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    let e = Context::open("mlx5_9").unwrap_err();
    assert!(e.to_string().contains("present: mlx5_0, mlx5_1"), "{e}");

    let ctx = Context::open("mlx5_1").unwrap();
    assert_eq!(ctx.query_device().unwrap().phys_port_cnt, 2);
    let ib = ctx.query_port(2).unwrap();
    assert_eq!(ib.link_layer, LinkLayer::InfiniBand);
    assert_ne!(ib.lid, 0);
    assert_eq!(ctx.choose_gid(2, None).unwrap().entry.index, 0);
    // 10.device.port.node: the emulator's node number on the fabric varies.
    let ip = ctx.choose_gid(1, None).unwrap().entry.gid.ipv4().unwrap();
    assert_eq!(ip.octets()[..3], [10, 1, 1], "{ip}");

    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let remote = |gid| RemoteQp {
        qpn: 0x999,
        psn: 0,
        lid: ib.lid,
        gid,
    };
    // InfiniBand: addressed by LID, no global header.
    let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
    qp.to_init(2, Access::ALL).unwrap();
    qp.to_rtr(&RtrAttr::new(remote(None), 2, ib.active_mtu))
        .unwrap();
    qp.to_rts(&RtsAttr::default()).unwrap();
    // RoCE without a GID: the driver refuses (a RoCE path needs a global header).
    let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
    qp.to_init(1, Access::ALL).unwrap();
    let e = qp.to_rtr(&RtrAttr::new(remote(None), 1, 1024)).unwrap_err();
    assert!(
        matches!(
            e,
            RdmaError::Verbs {
                errno: libc::EINVAL,
                ..
            }
        ),
        "{e:?}"
    );

    // Two contexts of two devices at once; a CQ of one cannot serve a QP of the other.
    let other = Context::open("mlx5_0").unwrap();
    let other_cq = other.create_cq(16).unwrap();
    assert!(pd.create_qp(&other_cq, &cq, &Default::default()).is_err());
    assert_ne!(
        other.query_device().unwrap().node_guid,
        ctx.query_device().unwrap().node_guid
    );
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_without_a_device_says_so() {
    if in_child_under_emulator("mlx5_without_a_device_says_so", "") {
        return;
    }
    // rdma-core loads and finds nothing: an empty list, and a reason where a device is needed.
    assert_eq!(devices().unwrap(), vec![]);
    let e = Context::open_first_active().unwrap_err();
    assert!(matches!(e, RdmaError::NoDevice(_)), "{e:?}");
    assert_eq!(e.to_string(), "no RDMA device: no mlx5 device found");
    let e = Context::open("mlx5_0").unwrap_err();
    assert!(e.to_string().contains("present: none"), "{e}");
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_query_qp_follows_the_connection() {
    if in_child_under_emulator("mlx5_query_qp_follows_the_connection", "mlx5_0") {
        return;
    }
    let ctx = Context::open("mlx5_0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
    assert_eq!(qp.query().unwrap().state, QpState::Reset);
    qp.to_init(1, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(
        (a.state, a.port, a.access),
        (QpState::Init, 1, Access::LOCAL_WRITE | Access::REMOTE_READ)
    );
    let gid = ctx.choose_gid(1, None).unwrap().entry;
    let peer = RemoteQp {
        qpn: 0xabc,
        psn: 0x4242,
        lid: 0,
        gid: Some(gid.gid),
    };
    qp.to_rtr(&RtrAttr {
        sgid_index: gid.index as u8,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 7,
        ..RtrAttr::new(peer, 1, 1024)
    })
    .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state, QpState::Rtr);
    assert_eq!(
        (a.remote, a.mtu, a.sgid_index),
        (peer, 1024, gid.index as u8)
    );
    assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (4, 7));
    qp.to_rts(&RtsAttr {
        sq_psn: 0x777,
        timeout: 18,
        retry_cnt: 5,
        rnr_retry: 6,
        max_rd_atomic: 2,
        // An optional attribute of RTR -> RTS: replaces the 7 given at RTR.
        min_rnr_timer: Some(14),
    })
    .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state, QpState::Rts);
    assert_eq!(
        (
            a.sq_psn,
            a.timeout,
            a.retry_cnt,
            a.rnr_retry,
            a.max_rd_atomic,
            a.min_rnr_timer
        ),
        (0x777, 18, 5, 6, 2, 14)
    );
    qp.to_error().unwrap();
    assert_eq!(qp.query().unwrap().state, QpState::Error);
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_async_events_port_down_and_up_and_qp_fatal() {
    if in_child_under_emulator(
        "mlx5_async_events_port_down_and_up_and_qp_fatal",
        "mlx5_0,mlx5_1:ib:roce",
    ) {
        return;
    }
    let wait = Duration::from_secs(10);
    let ctx = Context::open("mlx5_1").unwrap();
    let other = Context::open("mlx5_1").unwrap();
    let elsewhere = Context::open("mlx5_0").unwrap();
    assert_eq!(ctx.next_async_event(Duration::ZERO).unwrap(), None);
    assert_eq!(
        ctx.next_async_event(Duration::from_millis(20)).unwrap(),
        None,
        "nothing happened"
    );

    // The link of port 2 goes down: every context of the device hears it, the port says so.
    control::set_port_state("mlx5_1", 2, false).unwrap();
    for c in [&ctx, &other] {
        assert_eq!(
            c.next_async_event(wait).unwrap(),
            Some(AsyncEvent::PortError { port: 2 })
        );
    }
    assert_eq!(ctx.query_port(2).unwrap().state, PortState::Down);
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
    assert_eq!(elsewhere.next_async_event(Duration::ZERO).unwrap(), None);
    let (_, port) = Context::open_first_active().unwrap();
    assert_eq!(port, 1, "mlx5_0's port is still active");
    control::set_port_state("mlx5_1", 2, true).unwrap();
    for c in [&ctx, &other] {
        let up = c.next_async_event(wait).unwrap().unwrap();
        assert_eq!(up, AsyncEvent::PortActive { port: 2 });
        assert_eq!(up.to_string(), "port 2: active");
    }
    assert_eq!(ctx.query_port(2).unwrap().state, PortState::Active);
    assert!(control::set_port_state("mlx5_1", 3, false).is_err());

    // A fatal QP error: the event names the QP, which is now in error; it is acknowledged,
    // so the QP can be destroyed.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
    qp.to_init(1, Access::ALL).unwrap();
    control::qp_fatal(qp.qpn()).unwrap();
    let fatal = ctx.next_async_event(wait).unwrap().unwrap();
    assert_eq!(fatal, AsyncEvent::QpFatal { qpn: qp.qpn() });
    assert!(fatal.to_string().contains("fatal error"), "{fatal}");
    assert_eq!(qp.query().unwrap().state, QpState::Error);
    drop(qp);
    assert!(control::qp_fatal(0xffffff).is_err(), "no such QP");
    assert_eq!(
        other.next_async_event(Duration::ZERO).unwrap(),
        None,
        "a QP's event goes to its own context only"
    );
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_device_selection_by_name_and_environment() {
    if in_child_under_emulator(
        "mlx5_device_selection_by_name_and_environment",
        "mlx5_0,mlx5_1:ib:roce",
    ) {
        return;
    }
    // Named, an mlx5 port opens as a device (its name and port checked first); a bad name
    // or port is a clear error.
    let d = Device::open("mlx5_0").unwrap();
    assert_eq!(d.info().name, "mlx5_0");
    assert_eq!(
        d.query_port(1).unwrap().link_layer,
        gdsync::LinkLayer::Ethernet
    );
    let d = Device::open("mlx5_1:1").unwrap();
    assert_eq!(
        d.query_port(1).unwrap().link_layer,
        gdsync::LinkLayer::InfiniBand
    );
    let e = Device::open("mlx5_9").unwrap_err().to_string();
    assert!(
        e.contains("no RDMA device named \"mlx5_9\" (present: mlx5_0, mlx5_1)"),
        "{e}"
    );
    let e = Device::open("mlx5_1:3").unwrap_err().to_string();
    assert!(e.contains("mlx5_1 has 2 port(s), not 3"), "{e}");
    control::set_port_state("mlx5_1", 2, false).unwrap();
    let e = Device::open("mlx5_1:2").unwrap_err().to_string();
    assert!(
        e.contains("mlx5_1: no active port (port 2 is PORT_DOWN (1))"),
        "{e}"
    );
    assert!(Device::open("soft").is_ok());

    // Chosen automatically: the first active mlx5 port, saying why.
    std::env::remove_var(DEVICE_VAR);
    let s = DeviceSelection::for_process().unwrap();
    assert_eq!(
        (s.device.to_string(), s.why.as_str()),
        ("mlx5_0:1".into(), "the first active mlx5 port")
    );
    assert_eq!(Device::default().unwrap().info().name, "mlx5_0");
    std::env::set_var(DEVICE_VAR, "mlx5_1:1");
    let s = DeviceSelection::for_process().unwrap();
    assert_eq!(
        (s.device.to_string(), s.why.as_str()),
        ("mlx5_1:1".into(), "GDSYNC_DEVICE=mlx5_1:1")
    );
    assert_eq!(Device::default().unwrap().info().name, "mlx5_1");
    std::env::set_var(DEVICE_VAR, "mlx5_1:x");
    let e = Device::default().unwrap_err().to_string();
    assert!(e.contains("GDSYNC_DEVICE=\"mlx5_1:x\": port \"x\""), "{e}");
    std::env::set_var(DEVICE_VAR, "soft");
    assert!(Device::default().is_ok());
}
