//! What only firmware would show, checked under the emulated kernel driver (uverbs-emu), which
//! counts the verbs commands it serves (on a ConnectX each is a firmware command) and raises
//! the events a HCA raises on its own: an `mp` run asks the device nothing once connected
//! (no QUERY_QP in its progress loop), and a CQ error (a CQ overrun on a ConnectX) fails the
//! CQ's polls and waits (CPU polls, host executors, `mp`) within 2 s, naming the CQ, where
//! they used to wait until their timeout. Each test runs its body in a child under the driver
//! (this binary again, as the other tests of `tests/mlx5.rs`). Ignored where rdma-core is not
//! installed.

use gdasync::gdsync::exec::{HostExecutor, HostStream};
use gdasync::gdsync::{Device, Error, QpConfig, QpState, RecvWr};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::Comm;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use uverbs_emu::control::{self, Command};
use uverbs_emu::in_child_under_emulator;

/// Messages rank 0 sends to rank 1.
const MESSAGES: usize = 100_000;
/// Sends (and receives) in flight at once: more than the credits, so that sends queue and
/// the progress loop pumps them.
const WINDOW: usize = 256;
/// How soon a CQ error must fail the CQ's users.
const FAULT_LIMIT: Duration = Duration::from_secs(2);
/// When a user the CQ error did not fail stops waiting.
const GIVE_UP: Duration = Duration::from_secs(5);

fn query_qps() -> u64 {
    control::command_count(Command::QueryQp).expect("under the emulated driver")
}

/// One rank of the run: connect, then (between two counts taken by rank 0 while both ranks
/// wait) `MESSAGES` 8-byte messages from rank 0 to rank 1. Returns the QUERY_QP commands
/// issued between the counts (rank 0; 0 on rank 1).
fn rank(boot: ThreadBootstrap, dev: &Device, counted: &Barrier) -> u64 {
    let mut comm = Comm::new(Box::new(boot), dev).unwrap();
    comm.barrier().unwrap();
    let me = comm.rank();
    counted.wait();
    let before = query_qps();
    counted.wait();
    let mut buf = vec![0u8; WINDOW * 8];
    let mr = comm.register(&mut buf).unwrap();
    for start in (0..MESSAGES).step_by(WINDOW) {
        let n = WINDOW.min(MESSAGES - start);
        let reqs: Vec<_> = (0..n)
            .map(|k| match me {
                0 => comm.isend(mr.sge(k * 8..k * 8 + 8), 1).unwrap(),
                _ => comm.irecv(mr.sge(k * 8..k * 8 + 8), 0).unwrap(),
            })
            .collect();
        comm.wait_all(&reqs).unwrap();
    }
    comm.barrier().unwrap();
    counted.wait();
    let after = query_qps();
    counted.wait();
    drop(mr);
    comm.finalize().unwrap();
    if me == 0 {
        after - before
    } else {
        0
    }
}

/// The `mp` progress loop used to ask the device for both QPs' states (`ibv_query_qp`, a
/// firmware QUERY_QP on a ConnectX) in every pass with queued work: 100,000 messages now
/// issue none once connected, while an explicit `Qp::query_state` still does.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_an_mp_run_issues_no_query_qp_after_connect() {
    if in_child_under_emulator(
        "firmware::mlx5_an_mp_run_issues_no_query_qp_after_connect",
        "mlx5_0",
    ) {
        return;
    }
    // The soft HCA's warnings (a QP refused to the error state) on stderr, which the parent
    // shows when the child fails.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let dev = Device::open("mlx5_0").unwrap();
    let counted = Arc::new(Barrier::new(2));
    let start = Instant::now();
    let ranks: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let (dev, counted) = (dev.clone(), counted.clone());
            std::thread::spawn(move || rank(b, &dev, &counted))
        })
        .collect();
    let issued: u64 = ranks.into_iter().map(|h| h.join().unwrap()).sum();
    println!(
        "{MESSAGES} messages in {:?}: {issued} QUERY_QP",
        start.elapsed()
    );
    assert_eq!(issued, 0, "QUERY_QP commands during the run");
    // The count works: a QP's explicit query is one QUERY_QP.
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let before = query_qps();
    assert_eq!(qp.query_state(), QpState::Init);
    assert_eq!(query_qps(), before + 1);
    assert_eq!(qp.state(), QpState::Init);
    assert_eq!(query_qps(), before + 1, "Qp::state asks the device nothing");
}

/// Raises a CQ error on `cqn` and returns when that happened.
fn raise_cq_error(cqn: u32) -> Instant {
    let at = Instant::now();
    control::cq_error(cqn).unwrap();
    at
}

/// The error a CQ's user gets, checked: an overrun of `cqn`, within 2 s of `raised`.
fn assert_fails_naming(got: Result<(), Error>, cqn: u32, raised: Instant, who: &str) {
    let took = raised.elapsed();
    let e = got.expect_err(who);
    assert!(
        matches!(e, Error::CqOverrun { cqn: c } if c == cqn),
        "{who}: {e}"
    );
    assert!(e.to_string().contains(&format!("{cqn:#x}")), "{who}: {e}");
    assert!(took < FAULT_LIMIT, "{who} failed after {took:?}");
}

/// A CQ error was logged and then hung: a blocked poll and `check` on the CQ now fail
/// within 2 s, naming it.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_a_cq_error_fails_the_cqs_polls() {
    if in_child_under_emulator("firmware::mlx5_a_cq_error_fails_the_cqs_polls", "mlx5_0") {
        return;
    }
    let dev = Device::open("mlx5_0").unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let other = dev.create_cq(16).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let mut b = pd.create_qp(&other, &other, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let cqn = cq.cqn();
    let raised = std::thread::scope(|s| {
        let poller = s.spawn(|| {
            let start = Instant::now();
            // Nothing completes here: only the error ends this loop (or, failing that, the
            // test's own limit).
            while start.elapsed() < GIVE_UP {
                match cq.poll_one() {
                    Ok(None) => std::thread::yield_now(),
                    Ok(Some(c)) => panic!("a completion nobody asked for: {c:?}"),
                    Err(e) => return (Instant::now(), Err(e)),
                }
            }
            (Instant::now(), Ok(()))
        });
        std::thread::sleep(Duration::from_millis(50));
        let raised = raise_cq_error(cqn);
        let (failed, got) = poller.join().unwrap();
        assert!(failed >= raised);
        assert_fails_naming(got, cqn, raised, "a blocked poll");
        raised
    });
    assert_fails_naming(cq.check(), cqn, raised, "check");
    // The other CQ is not affected.
    assert!(other.check().is_ok());
    assert_eq!(other.poll_one().unwrap(), None);
}

/// Host executors' waits for a completion of a CQ that fails (a `HostExecutor` on this
/// thread, a `HostStream` on its own): the error, naming the CQ, within 2 s.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_a_cq_error_fails_host_executor_waits() {
    if in_child_under_emulator(
        "firmware::mlx5_a_cq_error_fails_host_executor_waits",
        "mlx5_0",
    ) {
        return;
    }
    let dev = Device::open("mlx5_0").unwrap();
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let mut qp = pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap();
    let peer = pd.create_qp(&scq, &scq, &QpConfig::default()).unwrap();
    qp.connect(&peer.endpoint()).unwrap();
    // Receives nobody sends to: only the CQ error ends their waits.
    let stream = HostStream::with_timeout(GIVE_UP).unwrap();
    let t = qp.post_recv(&RecvWr::new()).unwrap();
    stream.enqueue(qp.recv_wait_ops(&t).unwrap());
    let t = qp.post_recv(&RecvWr::new()).unwrap();
    let ops = qp.recv_wait_ops(&t).unwrap();
    let cqn = rcq.cqn();
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        raise_cq_error(cqn)
    });
    let got = HostExecutor::with_timeout(GIVE_UP).run(&ops);
    let raised = raiser.join().unwrap();
    assert_fails_naming(got, cqn, raised, "a HostExecutor wait");
    assert_fails_naming(stream.synchronize(), cqn, raised, "a HostStream wait");
}

/// An `mp` wait for a receive whose CQ fails: the error (naming the CQ) within 2 s.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_a_cq_error_fails_an_mp_wait() {
    if in_child_under_emulator("firmware::mlx5_a_cq_error_fails_an_mp_wait", "mlx5_0") {
        return;
    }
    let dev = Device::open("mlx5_0").unwrap();
    let done = Arc::new(Barrier::new(2));
    let ranks: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let (dev, done) = (dev.clone(), done.clone());
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                comm.set_timeout(GIVE_UP);
                comm.barrier().unwrap();
                if comm.rank() == 1 {
                    wait_for_a_failing_cq(&mut comm);
                }
                done.wait();
                // (The connection lost its receive CQ: no finalize.)
            })
        })
        .collect();
    for h in ranks {
        h.join().unwrap();
    }
}

/// Rank 1: a receive from rank 0 that never comes, its CQ failed by another thread.
fn wait_for_a_failing_cq(comm: &mut Comm) {
    let line = comm.describe_peer(0);
    let cqn = line
        .split("; receive CQ 0x")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("no receive CQ in {line:?}"));
    let mut buf = vec![0u8; 64];
    let mr = comm.register(&mut buf).unwrap();
    let r = comm.irecv(mr.sge(..), 0).unwrap();
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        raise_cq_error(cqn)
    });
    let got = comm.wait(r).map(|_| ());
    let raised = raiser.join().unwrap();
    assert_fails_naming(got, cqn, raised, "an mp wait");
}

/// The commands of one control path (context, port, PD, MR, CQ, QP, and their destruction)
/// through the real libibverbs: on the ioctl ABI each the native method stands for is served
/// natively and none falls back to `INVOKE_WRITE` or `write()`; on the write ABI none is native.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libibverbs_is_served_the_native_ioctl_methods() {
    if in_child_under_emulator(
        "firmware::mlx5_libibverbs_is_served_the_native_ioctl_methods",
        "mlx5_0",
    ) {
        return;
    }
    {
        let ctx = gdsync::mlx5::Context::open("mlx5_0").unwrap();
        ctx.query_port(1).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let mut buf = vec![0u8; 4096];
        let mr = pd.reg_mr(&mut buf, gdsync::Access::ALL).unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let qp = pd.create_qp(&cq, &cq, &Default::default()).unwrap();
        drop((qp, cq, mr, pd, ctx));
    }
    let native = |c| control::native_command_count(c).expect("under the emulated driver");
    let all = |c| control::command_count(c).expect("under the emulated driver");
    let write_abi = std::env::var("UVEMU_ABI").as_deref() == Ok("write");
    use Command::*;
    for c in [
        GetContext, QueryPort, DeallocPd, DeregMr, CreateCq, DestroyCq, CreateQp, DestroyQp,
    ] {
        let (n, total) = (native(c), all(c));
        match write_abi {
            true => assert_eq!(n, 0, "{c:?} served natively under the write ABI"),
            false => assert!(n >= 1 && n == total, "{c:?}: {n} native of {total} served"),
        }
    }
    // ALLOC_PD and REG_MR have no native method libibverbs uses: INVOKE_WRITE serves them.
    assert_eq!((native(AllocPd), native(RegMr)), (0, 0));
}
