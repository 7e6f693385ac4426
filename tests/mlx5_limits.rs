//! Sizes and capabilities of gdsync's queues on libmlx5's QPs, under the emulated kernel
//! driver (real libibverbs and libmlx5): send rings up to the device's largest (32,768
//! WQEBBs), the inline payload a QP was made for, and the libmlx5 environment gdsync refuses
//! (`MLX5_QP_SIGNATURE`). Each test runs its body in a child under the driver (the preload
//! must be in a process's environment from its start); ignored where rdma-core is not
//! installed.

mod common;

use common::{poll_ok, Pair, Topo};
use gdasync::gdsync::{Access, Device, QpConfig, SendWr};
use uverbs_emu::in_child_under_emulator;

/// Send rings above 8,192 WQEBBs: libmlx5 once budgeted 4 WQEBBs per request (memory-window
/// binds among the operations), so a ring of N WQEBBs asked for N requests and was refused
/// above 32,768 / 4. Each size is created exactly, and the largest carries a write.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_send_rings_up_to_32768_wqebbs_are_created() {
    if in_child_under_emulator("mlx5_send_rings_up_to_32768_wqebbs_are_created", "mlx5_0") {
        return;
    }
    let dev = Device::open("mlx5_0").unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1 << 16).unwrap();
    for n in [256u32, 4096, 8192, 8193, 16384, 32768] {
        let cfg = QpConfig {
            send_wqebbs: n,
            ..QpConfig::default()
        };
        let qp = pd
            .create_qp(&cq, &cq, &cfg)
            .unwrap_or_else(|e| panic!("a send ring of {n} WQEBBs: {e}"));
        assert_eq!(qp.send_ring_size(), n.next_power_of_two(), "asked for {n}");
    }
    let cfg = QpConfig {
        send_wqebbs: 32768,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(Topo::Mlx5Loopback, &cfg, &cfg);
    assert_eq!(p.a.qp.send_ring_size(), 32768);
    let mut src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::ALL).unwrap();
    p.a.qp
        .post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; 4096];
    dmr.read_at(0, &mut got);
    assert!(got.iter().all(|&b| b == 7));
}

/// `MLX5_QP_SIGNATURE` makes libmlx5 build QPs with WQE signatures, which gdsync does not
/// write: opening an mlx5 device with it set is refused in one line that says what to do.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_qp_signatures_in_the_environment_are_refused() {
    if in_child_under_emulator(
        "mlx5_qp_signatures_in_the_environment_are_refused",
        "mlx5_0",
    ) {
        return;
    }
    assert!(Device::open("mlx5_0").is_ok());
    // (The emulator's child starts with no MLX5_* variable: set here, in the child.)
    std::env::set_var("MLX5_QP_SIGNATURE", "1");
    let e = Device::open("mlx5_0").unwrap_err().to_string();
    assert!(
        e.contains("MLX5_QP_SIGNATURE is set") && e.contains("unset it") && !e.contains('\n'),
        "{e}"
    );
    std::env::remove_var("MLX5_QP_SIGNATURE");
    assert!(Device::open("mlx5_0").is_ok());
}

/// The WQEs a `QpConfig` allows are checked against the device's largest when the QP is
/// made: a device whose send WQEs are at most 512 bytes (the emulated driver told so) refuses
/// `max_inline` 972 (a 1,008-byte WQE) in one line naming what to lower, and takes 400, and
/// the QP made can carry what it was made for (libmlx5's own count, at least the asked).
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_wqes_larger_than_the_device_takes_are_refused_at_creation() {
    if in_child_under_emulator(
        "mlx5_wqes_larger_than_the_device_takes_are_refused_at_creation",
        "mlx5_0",
    ) {
        return;
    }
    // (Read by the emulated driver when a device context opens.)
    std::env::set_var("UVEMU_MAX_SQ_DESC_SZ", "512");
    let dev = Device::open("mlx5_0").unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1024).unwrap();
    let inline = |n: u32| QpConfig {
        max_inline: n,
        ..QpConfig::default()
    };
    let e = pd
        .create_qp(&cq, &cq, &inline(972))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("WQEs need 1024 bytes (972 bytes inline")
            && e.contains("lower QpConfig::max_inline")
            && !e.contains('\n'),
        "{e}"
    );
    let qp = pd.create_qp(&cq, &cq, &inline(400)).unwrap();
    assert_eq!(qp.send_ring_size(), 256);
    // The raw layer reports what libmlx5 made: at least the inline payload asked for.
    let ctx = gdasync::gdsync::mlx5::Context::open("mlx5_0").unwrap();
    let raw_pd = ctx.alloc_pd().unwrap();
    let raw_cq = ctx.create_cq(64).unwrap();
    let caps = gdasync::gdsync::mlx5::QpCaps {
        max_inline_data: 400,
        send_ops: gdasync::gdsync::mlx5::GDSYNC_SEND_OPS,
        ..Default::default()
    };
    let raw = raw_pd.create_qp(&raw_cq, &raw_cq, &caps).unwrap();
    assert!(raw.max_inline_data() >= 400, "{}", raw.max_inline_data());
}

/// A device without atomics (`atomic_cap` IBV_ATOMIC_NONE, as the emulated driver is told
/// here) refuses compare-and-swap and fetch-and-add when they are posted, in one line; its
/// writes still run. (The same device with atomics runs them: the operations suite.)
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_atomics_are_refused_on_a_device_without_them() {
    if in_child_under_emulator(
        "mlx5_atomics_are_refused_on_a_device_without_them",
        "mlx5_0",
    ) {
        return;
    }
    std::env::set_var("UVEMU_ATOMIC_CAP", "0");
    let mut p = Pair::new(Topo::Mlx5Loopback);
    assert!(!p.a.dev.query().atomics);
    let mut old = [0u8; 8];
    let mut target = [0u8; 8];
    let omr = p.a.pd.register(&mut old, Access::LOCAL_WRITE).unwrap();
    let tmr = p.b.pd.register(&mut target, Access::ALL).unwrap();
    for wr in [
        SendWr::fetch_add(tmr.remote().at(0), 1),
        SendWr::compare_swap(tmr.remote().at(0), 0, 1),
    ] {
        let e =
            p.a.qp
                .post_send(&wr.sge(omr.sge(..)))
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("mlx5_0 does not execute atomics (atomic_cap is IBV_ATOMIC_NONE)")
                && !e.contains('\n'),
            "{e}"
        );
    }
    p.a.qp
        .post_send(&SendWr::write(tmr.remote().at(0)).sge(omr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&p.a.scq, 1);
}

/// The path's traffic class, service level and hop limit: from `QpConfig`, else
/// `GDSYNC_IB_TC` / `GDSYNC_IB_SL` / `GDSYNC_IB_HOP_LIMIT`; a value out of range is one line
/// at QP creation naming the variable and its range, and a good one connects.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_traffic_class_and_service_level_are_checked_and_connect() {
    if in_child_under_emulator(
        "mlx5_traffic_class_and_service_level_are_checked_and_connect",
        "mlx5_0",
    ) {
        return;
    }
    let dev = Device::open("mlx5_0").unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1024).unwrap();
    for (var, bad, range) in [
        ("GDSYNC_IB_TC", "256", "0 to 255"),
        ("GDSYNC_IB_SL", "16", "0 to 15"),
        ("GDSYNC_IB_HOP_LIMIT", "0", "1 to 255"),
    ] {
        std::env::set_var(var, bad);
        let e = pd
            .create_qp(&cq, &cq, &QpConfig::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{var}=\"{bad}\": expected a number from {range}")),
            "{e}"
        );
        std::env::remove_var(var);
    }
    let cfg = QpConfig {
        service_level: Some(16),
        ..QpConfig::default()
    };
    let e = pd.create_qp(&cq, &cq, &cfg).unwrap_err().to_string();
    assert!(
        e.contains("QpConfig::service_level 16 is out of 0..=15"),
        "{e}"
    );
    std::env::set_var("GDSYNC_IB_TC", "106");
    std::env::set_var("GDSYNC_IB_SL", "3");
    let cfg = QpConfig {
        hop_limit: Some(8),
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(Topo::Mlx5Loopback, &cfg, &cfg);
    common::assert_healthy(&mut p);
}
