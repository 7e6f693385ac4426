//! The messaging layer: every operation with 2, 4 and 8 thread ranks, and with 2 and 4
//! processes over the TCP bootstrap on loopback (host memory; CPU and host-stream executors);
//! 2 processes also with the soft device's TCP link instead of shared memory.

use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::format::Syndrome;
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::{Device, Error, LinkPolicy, QpConfig};
use gdasync::mp::bootstrap::{
    launch_local_with, Bootstrap, JobInfo, TcpBootstrap, ThreadBootstrap,
};
use gdasync::mp::Comm;
use std::time::{Duration, Instant};

mod common;
use common::on_threads;

/// The workload every rank runs; panics (with the rank) on any mismatch.
fn workload(comm: &mut Comm) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    const MSGS: usize = 8;
    const LEN: usize = 4096;
    let pattern = |from: usize, k: usize, i: usize| (from * 31 + k * 7 + i) as u8;

    // Point to point, CPU: a ring, several messages, receives posted after the sends.
    let mut sbuf = vec![0u8; MSGS * LEN];
    let mut rbuf = vec![0u8; MSGS * LEN];
    for k in 0..MSGS {
        for i in 0..LEN {
            sbuf[k * LEN + i] = pattern(me, k, i);
        }
    }
    let smr = comm.register(&mut sbuf).unwrap();
    let rmr = comm.register(&mut rbuf).unwrap();
    let sends: Vec<_> = (0..MSGS)
        .map(|k| comm.isend(smr.sge(k * LEN..(k + 1) * LEN), right).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(5)); // sends wait for credits meanwhile
    let recvs: Vec<_> = (0..MSGS)
        .map(|k| comm.irecv(rmr.sge(k * LEN..(k + 1) * LEN), left).unwrap())
        .collect();
    let lens = comm.wait_all(&recvs).unwrap();
    assert!(
        lens.iter().all(|&l| l as usize == LEN),
        "rank {me}: lengths {lens:?}"
    );
    comm.wait_all(&sends).unwrap();
    let mut got = vec![0u8; MSGS * LEN];
    rmr.read_at(0, &mut got);
    for k in 0..MSGS {
        for i in (0..LEN).step_by(97) {
            assert_eq!(
                got[k * LEN + i],
                pattern(left, k, i),
                "rank {me}: message {k} from {left} (FIFO order)"
            );
        }
    }

    // Receives posted in one batch, with one credit for all of them: FIFO order holds.
    let batch_pattern = |from: usize, k: usize, i: usize| pattern(from, k, i) ^ 0x5A;
    for k in 0..MSGS {
        for i in 0..LEN {
            smr.write_at(k * LEN + i, &[batch_pattern(me, k, i)]);
        }
    }
    rmr.write_at(0, &vec![0u8; MSGS * LEN]);
    let dsts: Vec<_> = (0..MSGS).map(|k| rmr.sge(k * LEN..(k + 1) * LEN)).collect();
    let recvs = comm.irecv_batch(&dsts, left).unwrap();
    assert_eq!(recvs.len(), MSGS);
    let sends: Vec<_> = (0..MSGS)
        .map(|k| comm.isend(smr.sge(k * LEN..(k + 1) * LEN), right).unwrap())
        .collect();
    let lens = comm.wait_all(&recvs).unwrap();
    assert!(
        lens.iter().all(|&l| l as usize == LEN),
        "rank {me}: {lens:?}"
    );
    comm.wait_all(&sends).unwrap();
    rmr.read_at(0, &mut got);
    for k in 0..MSGS {
        for i in (0..LEN).step_by(89) {
            assert_eq!(
                got[k * LEN + i],
                batch_pattern(left, k, i),
                "rank {me}: batch message {k} from {left}"
            );
        }
    }
    for k in 0..MSGS {
        for i in 0..LEN {
            smr.write_at(k * LEN + i, &[pattern(me, k, i)]);
        }
    }

    // Point to point on an executor (host stream): credit wait, doorbell and completion wait
    // all run on the stream.
    let stream = HostStream::new().unwrap();
    let r = comm.irecv(rmr.sge(0..LEN), left).unwrap();
    let s = comm.send_on(smr.sge(LEN..2 * LEN), right, &stream).unwrap();
    comm.wait_on(r, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(comm.wait(s).unwrap(), 0);
    comm.wait(r).unwrap();
    rmr.read_at(0, &mut got[..LEN]);
    assert_eq!(got[5], pattern(left, 1, 5), "rank {me}: stream send");

    // An executor send waiting for its credit while the CPU posts to the same peers: a CPU
    // put and the receive's credit must not expose the held-back send early (the right
    // rank posts its receive only after 30 ms, past the send's RNR retry budget).
    let mut early = vec![0u8; 64];
    let emr = comm.register(&mut early).unwrap();
    let ewin = comm.window(&emr).unwrap();
    let s = comm
        .isend_on(smr.sge(2 * LEN..3 * LEN), right, &stream)
        .unwrap();
    let put = comm
        .iput(smr.sge(2 * LEN..2 * LEN + 64), &ewin, right, 0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let r = comm.irecv(rmr.sge(LEN..2 * LEN), left).unwrap();
    comm.wait_on(s, &stream).unwrap();
    assert_eq!(
        comm.wait(r).unwrap() as usize,
        LEN,
        "rank {me}: held-back send"
    );
    comm.wait(put).unwrap();
    stream.synchronize().unwrap();
    comm.wait(s).unwrap();
    rmr.read_at(LEN, &mut got[..LEN]);
    assert_eq!(
        got[LEN - 3],
        pattern(left, 2, LEN - 3),
        "rank {me}: stream send after credit"
    );
    comm.barrier().unwrap();
    let mut b = [0u8; 1];
    emr.read_at(63, &mut b);
    assert_eq!(
        b[0],
        pattern(left, 2, 63),
        "rank {me}: CPU put behind the stream send"
    );

    // The registration cache: one registration serves every range inside it.
    let mut cached = vec![me as u8; 2 * LEN];
    let base = cached.as_mut_ptr();
    // SAFETY: `cached` outlives the cache entry (deregistered below, before it is dropped).
    let (a, b2, c) = unsafe {
        (
            comm.register_cached(base, 2 * LEN).unwrap(),
            comm.register_cached(base.add(LEN), LEN).unwrap(),
            comm.register_cached(base.add(16), 100).unwrap(),
        )
    };
    assert_eq!(
        (a.len, b2.len, b2.lkey),
        (2 * LEN as u32, LEN as u32, a.lkey)
    );
    assert_eq!(b2.addr, a.addr + LEN as u64);
    assert_eq!((c.lkey, c.addr, c.len), (a.lkey, a.addr + 16, 100));
    let st = comm.reg_cache_stats();
    assert_eq!((st.hits, st.misses, st.entries), (2, 1, 1));
    let r = comm.irecv(rmr.sge(0..LEN), left).unwrap();
    let s = comm.isend(b2, right).unwrap();
    comm.wait_all(&[r, s]).unwrap();
    rmr.read_at(0, &mut got[..LEN]);
    assert!(
        got[..LEN].iter().all(|&x| x == left as u8),
        "rank {me}: send from a cached registration"
    );
    assert_eq!(comm.deregister(base, 1), 1);
    assert_eq!(comm.reg_cache_stats().entries, 0);
    drop(cached);

    // Barriers.
    comm.barrier().unwrap();
    comm.barrier_on(&stream).unwrap();
    stream.synchronize().unwrap();

    // One-sided: put to the right, get from the left, put-with-signal on the stream.
    let mut wbuf = vec![0u8; 2 * LEN + 64];
    let wmr = comm.register(&mut wbuf).unwrap();
    let win = comm.window(&wmr).unwrap();
    let p = comm.iput(smr.sge(0..LEN), &win, right, 0).unwrap();
    comm.wait(p).unwrap();
    comm.barrier().unwrap();
    wmr.read_at(0, &mut got[..LEN]);
    assert_eq!(
        got[..LEN].iter().step_by(61).copied().collect::<Vec<_>>(),
        (0..LEN)
            .step_by(61)
            .map(|i| pattern(left, 0, i))
            .collect::<Vec<_>>(),
        "rank {me}: put"
    );
    let g = comm.iget(rmr.sge(0..LEN), &win, left, 0).unwrap();
    comm.wait(g).unwrap();
    rmr.read_at(0, &mut got[..LEN]);
    assert_eq!(
        got[7],
        pattern((left + n - 1) % n, 0, 7),
        "rank {me}: get reads the left rank's window"
    );
    rmr.write_at(0, &[0u8; 8]);
    let g2 = comm
        .iget_on(rmr.sge(0..LEN), &win, left, 0, &stream)
        .unwrap();
    comm.wait_on(g2, &stream).unwrap();
    stream.synchronize().unwrap();
    comm.wait(g2).unwrap();
    rmr.read_at(0, &mut got[..LEN]);
    assert_eq!(
        got[7],
        pattern((left + n - 1) % n, 0, 7),
        "rank {me}: get on a stream"
    );
    comm.barrier().unwrap();
    // The signal (value 1) lands after the data; the receiver's stream waits for it.
    smr.write_at(LEN, &vec![me as u8 + 1; LEN]);
    let mut sig = [0u8; 8];
    sig[0] = 1;
    rmr.write_at(MSGS * LEN - 8, &sig);
    let sig_at = (2 * LEN) as u64;
    let ps = comm
        .iput_signal_on(
            smr.sge(LEN..2 * LEN),
            &win,
            right,
            LEN as u64,
            rmr.sge(MSGS * LEN - 8..MSGS * LEN),
            sig_at,
            &stream,
        )
        .unwrap();
    comm.wait_on(ps, &stream).unwrap();
    // SAFETY: wbuf outlives the stream's work (synchronised below).
    unsafe {
        comm.wait_value_on(&wmr, 2 * LEN, 1, WaitCond::Geq, &stream)
            .unwrap()
    };
    stream.synchronize().unwrap();
    comm.wait(ps).unwrap();
    wmr.read_at(LEN, &mut got[..LEN]);
    assert_eq!(
        got[LEN - 1],
        left as u8 + 1,
        "rank {me}: data before its signal"
    );
    comm.barrier().unwrap();
}

fn threads(n: usize) {
    on_threads(n, workload);
}

#[test]
fn threads_2() {
    threads(2);
}

#[test]
fn threads_4() {
    threads(4);
}

#[test]
fn threads_8() {
    threads(8);
}

/// The entry point of a launched rank (ignored, so that the test process does not count it as
/// a test; ranks run it with `--ignored`). Inert without GDSYNC_MP_TEST, and in the test
/// process itself, which sets GDSYNC_MP_TEST for a moment while it spawns ranks: only launched
/// ranks have GDSYNC_RANK.
#[test]
#[ignore = "the rank processes of the other tests in this file, not a test itself"]
fn rank_entry() {
    let Ok(mode) = std::env::var("GDSYNC_MP_TEST") else {
        return;
    };
    if std::env::var_os("GDSYNC_RANK").is_none() {
        return;
    }
    // "MODE+tcp": the rank asks for TCP links as a user would, through the environment, before
    // its first device exists (this process runs only this test).
    let mode = match mode.strip_suffix("+tcp") {
        Some(m) => {
            std::env::set_var("GDSYNC_SOFT_LINK", "tcp");
            m.to_string()
        }
        None => mode,
    };
    let dev = Device::soft().unwrap();
    if std::env::var("GDSYNC_SOFT_LINK").as_deref() == Ok("tcp") {
        // Its endpoints ask for TCP (so every peer links to it over TCP) and have an address.
        let cq = dev.create_cq(1).unwrap();
        let ep = dev
            .alloc_pd()
            .create_qp(&cq, &cq, &QpConfig::default())
            .unwrap()
            .endpoint();
        assert_eq!(ep.link, LinkPolicy::Tcp, "{ep}");
        assert!(ep.addr.is_some(), "{ep}");
    }
    let info = JobInfo::from_env().unwrap();
    let boot = TcpBootstrap::connect(&info, Duration::from_secs(30)).unwrap();
    if let Some(spec) = mode.strip_prefix("kill:") {
        return killed_rank_entry(spec, boot, &dev);
    }
    let mut comm = Comm::new(Box::new(boot), &dev).unwrap();
    match mode.as_str() {
        "workload" => {
            workload(&mut comm);
            comm.finalize().unwrap();
        }
        "dies" if comm.rank() == 1 => std::process::exit(0), // leaves without a word
        "dies" => {
            let (e, took) = failed_receive_from(&mut comm, 1);
            assert!(
                matches!(&e, Error::Unreachable(m) if m.contains("receive from rank 1 failed") && m.contains("connection to rank 1 is lost")),
                "{e}"
            );
            assert!(
                took < Duration::from_secs(2),
                "the dead peer took {took:?} to notice"
            );
            println!("DEAD-PEER-NOTICED");
        }
        _ => {}
    }
}

/// What a rank process printed, for an assertion's message.
fn shown(o: &std::process::Output) -> String {
    format!(
        "{}; its output:\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn procs(n: usize, mode: &str) -> Vec<std::process::Output> {
    // The mode reaches the children through the environment they inherit at spawn: tests
    // running in parallel must not set it for each other's children (seen on 16 cores: a
    // "dies" rank in a workload job, bootstraps waiting for ranks that never came).
    static SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = [
        "--exact",
        "rank_entry",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let children = {
        let _g = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("GDSYNC_MP_TEST", mode);
        // The ranks' output (their test harness's lines, what they print) is captured, as a
        // test's own is, and shown by the assertions that fail.
        let c = launch_local_with(n, &exe, &args, |cmd| {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
        });
        std::env::remove_var("GDSYNC_MP_TEST");
        c.unwrap()
    };
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn processes_2() {
    for (r, o) in procs(2, "workload").iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {}", shown(o));
    }
}

/// Two processes whose soft devices link over TCP (on loopback) instead of shared memory.
#[test]
fn processes_2_over_tcp_links() {
    for (r, o) in procs(2, "workload+tcp").iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {}", shown(o));
    }
}

#[test]
fn processes_4() {
    for (r, o) in procs(4, "workload").iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {}", shown(o));
    }
}

#[test]
fn dead_peer_completes_requests_with_an_error() {
    let outs = procs(2, "dies");
    assert!(outs.iter().all(|o| o.status.success()));
    let survivor = String::from_utf8_lossy(&outs[0].stdout);
    assert!(
        survivor.contains("DEAD-PEER-NOTICED"),
        "rank 0 did not report the dead peer: {}",
        shown(&outs[0])
    );
}

/// How long into the survivors' wait the victim of a `kill:` job is killed.
const KILL_AFTER: Duration = Duration::from_millis(300);

/// A rank of a `kill:WAIT:VICTIM` job: every rank but VICTIM enters WAIT (`barrier`,
/// `finalize`, or `stream`: a send to VICTIM on a host stream, waited for by the host), and the lowest survivor kills VICTIM (SIGKILL) [`KILL_AFTER`] later. Each
/// survivor's wait must end within 2 s of the kill with an error that names the victim.
fn killed_rank_entry(spec: &str, mut boot: TcpBootstrap, dev: &Device) {
    let (wait, victim) = spec.split_once(':').unwrap();
    let victim: usize = victim.parse().unwrap();
    let pids = boot.all_gather(&std::process::id().to_le_bytes()).unwrap();
    let mut comm = Comm::new(Box::new(boot), dev).unwrap();
    // Far past the 2 s bound: a wait that ends by its timeout fails the test.
    comm.set_timeout(Duration::from_secs(20));
    let me = comm.rank();
    if me == victim {
        std::thread::sleep(Duration::from_secs(60));
        panic!("rank {victim} was not killed");
    }
    let killer = usize::from(victim == 0);
    let killed = std::sync::Arc::new(std::sync::OnceLock::new());
    if me == killer {
        let pid = u32::from_le_bytes(pids[victim][..].try_into().unwrap());
        let killed = killed.clone();
        std::thread::spawn(move || {
            std::thread::sleep(KILL_AFTER);
            // SAFETY: kill takes a pid and a signal number.
            assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
            killed.set(Instant::now()).unwrap();
        });
    }
    let (stream, mut buf) = (HostStream::new().unwrap(), vec![0u8; 64]);
    let mr = comm.register(&mut buf).unwrap();
    let start = Instant::now();
    let e = match wait {
        "barrier" => comm.barrier().unwrap_err(),
        "finalize" => comm.finalize().unwrap_err(),
        // The stream waits for a credit the victim never gives; the host waits for the send.
        "stream" => {
            let r = comm.send_on(mr.sge(..), victim, &stream).unwrap();
            comm.wait(r).unwrap_err()
        }
        _ => panic!("unknown wait {wait:?}"),
    };
    let ended = Instant::now();
    let took = ended - start;
    println!("rank {me}: {wait} ended after {took:?}: {e}");
    // The killer knows when the kill was; the others started waiting about when it did.
    let bound = match killed.get() {
        Some(&at) => ended.saturating_duration_since(at),
        None => took.saturating_sub(KILL_AFTER),
    };
    assert!(
        bound < Duration::from_secs(2),
        "rank {me}: {wait} ended {bound:?} after rank {victim} was killed: {e}"
    );
    assert!(
        e.to_string().contains(&format!("rank {victim}")),
        "rank {me}: the error does not name rank {victim}: {e}"
    );
}

/// Ranks in `wait` while rank `victim` of `n` is killed: every survivor's wait ends within
/// 2 s with an error naming the victim (it waited for the timeout).
fn rank_killed_during(n: usize, wait: &str, victim: usize) {
    // A survivor's output (what it saw) comes with its failure.
    let outs = procs(n, &format!("kill:{wait}:{victim}"));
    for (r, o) in outs.iter().enumerate() {
        if r == victim {
            assert!(!o.status.success(), "rank {r} was not killed: {}", shown(o));
        } else {
            assert!(o.status.success(), "rank {r} failed: {}", shown(o));
        }
    }
}

/// Two ranks in a barrier, rank 1 killed; four ranks, rank 3 killed: rank 2 then waits
/// only for ranks that wait for rank 3, and must still end at once.
#[test]
fn a_rank_killed_during_a_barrier_is_named_at_once() {
    rank_killed_during(2, "barrier", 1);
    rank_killed_during(4, "barrier", 3);
}

/// The TCP bootstrap's root (rank 0) killed while rank 1 finalizes; rank 1 of 3 killed while
/// the others finalize (rank 2 waits on the root, which must tell it who left).
#[test]
fn a_rank_killed_during_finalize_is_named_at_once() {
    rank_killed_during(2, "finalize", 0);
    rank_killed_during(3, "finalize", 1);
}

/// A host stream waits for a credit from rank 1, and the host for the stream's send; rank 1
/// is killed.
#[test]
fn a_rank_killed_during_a_wait_for_a_stream_send_is_named_at_once() {
    rank_killed_during(2, "stream", 1);
}

/// A send larger than the receive posted for it fails on both ranks (the receiver's
/// completion says LOC_LEN_ERR, the sender's REM_INV_REQ); every later error on that
/// connection says so, on each side, instead of calling the live peer dead, and a barrier
/// ends with it at once.
#[test]
fn a_too_large_send_is_named_on_both_ranks_afterwards() {
    fn check(comm: &Comm, e: Error, says: &[&str]) {
        let m = e.to_string();
        println!("rank {}: {m}", comm.rank());
        for s in says {
            assert!(
                m.contains(s),
                "rank {}: {s:?} missing from: {m}",
                comm.rank()
            );
        }
        assert!(!m.contains("died"), "rank {}: {m}", comm.rank());
    }
    on_threads(2, |comm| {
        comm.set_timeout(Duration::from_secs(5));
        let mut buf = vec![0u8; 4096];
        let mr = comm.register(&mut buf).unwrap();
        // (peer, the first request's range and its syndrome, what later errors say)
        let (peer, first, syndrome, says): (_, _, _, &[&str]) = if comm.rank() == 0 {
            let says = &["rank 1", "4096-byte", "receive", "REM_INV_REQ"];
            (1, 0..4096, Syndrome::RemoteInvalReq, says)
        } else {
            let says = &["rank 0", "16-byte receive", "LOC_LEN_ERR"];
            (0, 0..16, Syndrome::LocalLength, says)
        };
        let post = |comm: &mut Comm, range| {
            let r = if comm.rank() == 0 {
                comm.isend(mr.sge(range), peer)
            } else {
                comm.irecv(mr.sge(range), peer)
            };
            comm.wait(r.unwrap()).unwrap_err()
        };
        let e = post(comm, first);
        assert!(
            matches!(e, Error::Completion { syndrome: s, .. } if s == syndrome),
            "{e}"
        );
        let e = post(comm, 0..8);
        check(comm, e, says);
        let start = Instant::now();
        let e = comm.barrier().unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2), "{e}");
        check(comm, e, says);
    });
}

#[test]
fn bad_arguments_are_errors() {
    let dev = Device::soft().unwrap();
    let mut group = ThreadBootstrap::group(2);
    let b1 = group.pop().unwrap();
    let b0 = group.pop().unwrap();
    let d2 = dev.clone();
    let h = std::thread::spawn(move || {
        let mut c = Comm::new(Box::new(b1), &d2).unwrap();
        let mut buf = vec![0u8; 16];
        let mr = c.register(&mut buf).unwrap();
        // A receive shorter than the message: both sides learn it.
        let r = c.irecv(mr.sge(0..16), 0).unwrap();
        let e = c.wait(r).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Completion {
                    syndrome: Syndrome::LocalLength,
                    ..
                }
            ),
            "{e}"
        );
    });
    let mut c = Comm::new(Box::new(b0), &dev).unwrap();
    let mut buf = vec![0u8; 64];
    let mr = c.register(&mut buf).unwrap();
    assert!(
        matches!(c.isend(mr.sge(0..64), 2), Err(Error::InvalidArgument(_))),
        "out-of-range rank"
    );
    assert!(
        matches!(c.isend(mr.sge(0..64), 0), Err(Error::InvalidArgument(_))),
        "send to self"
    );
    let e = c.irecv_batch(&vec![mr.sge(0..64); 100_000], 1).unwrap_err();
    assert!(
        matches!(e, Error::RingFull { .. }),
        "a batch past the ring: {e}"
    );
    let s = c.isend(mr.sge(0..64), 1).unwrap();
    let e = c.wait(s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Completion {
                syndrome: Syndrome::RemoteInvalReq,
                ..
            }
        ),
        "{e}"
    );
    h.join().unwrap();
    assert!(JobInfo::from_env().is_err() || std::env::var("GDSYNC_RANK").is_ok());
    let _: &dyn Bootstrap = &ThreadBootstrap::group(1).pop().unwrap();
}

/// More messages waited on executors than the receive ring (512) and send ring hold: the
/// executor's waits must hand the ring slots back without any CPU poll of those CQs.
#[test]
fn executor_waits_recycle_ring_slots() {
    const N: usize = 1500;
    let dev = Device::soft().unwrap();
    let hs: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                let peer = 1 - comm.rank();
                let stream = HostStream::new().unwrap();
                let mut sbuf = vec![comm.rank() as u8 + 1; 64];
                let mut rbuf = vec![0u8; 64];
                let smr = comm.register(&mut sbuf).unwrap();
                let rmr = comm.register(&mut rbuf).unwrap();
                let mut pending = std::collections::VecDeque::new();
                for _ in 0..N {
                    let r = comm.irecv(rmr.sge(..), peer).unwrap();
                    let s = comm.isend_on(smr.sge(..), peer, &stream).unwrap();
                    comm.wait_on(r, &stream).unwrap();
                    pending.push_back(s);
                    pending.push_back(r);
                    // Release what the stream finished, as a CPU thread feeding it would.
                    while pending.len() > 64 {
                        let q = pending.pop_front().unwrap();
                        comm.wait(q).unwrap();
                    }
                }
                stream.synchronize().unwrap();
                for q in pending {
                    comm.wait(q).unwrap();
                }
                let mut b = [0u8; 1];
                rmr.read_at(63, &mut b);
                assert_eq!(b[0], peer as u8 + 1);
                comm.finalize().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
}

/// An exchange driven entirely by an executor, many times longer than the send ring (1024
/// WQEBBs) and the receive ring (512): credits (`irecv_on`), sends and completion waits all
/// run on the stream, so the rings' slots must be retired by the stream's waits, with no
/// CPU poll. The CPU stays at most 4 iterations ahead and checks every message in order.
#[test]
fn executor_loop_outlives_the_rings() {
    on_threads(2, |comm| {
        let me = comm.rank();
        const ITERS: u64 = 3000;
        const SLOTS: usize = 8;
        const AHEAD: usize = 4;
        let peer = 1 - me;
        let mut sbuf = vec![0u8; 8 * SLOTS];
        let mut rbuf = vec![0u8; 8 * SLOTS];
        let smr = comm.register(&mut sbuf).unwrap();
        let rmr = comm.register(&mut rbuf).unwrap();
        let slot = |i: u64| 8 * (i as usize % SLOTS)..8 * (i as usize % SLOTS) + 8;
        let stream = HostStream::new().unwrap();
        let mut recvs = std::collections::VecDeque::new();
        for i in 0..SLOTS as u64 {
            recvs.push_back(comm.irecv_on(rmr.sge(slot(i)), peer, &stream).unwrap());
        }
        let mut in_flight = std::collections::VecDeque::new();
        let value = |rank: usize, i: u64| ((rank as u64) << 32) | i;
        for i in 0..ITERS {
            if in_flight.len() == AHEAD {
                let (j, reqs): (u64, Vec<_>) = in_flight.pop_front().unwrap();
                comm.wait_all(&reqs).unwrap();
                let mut got = [0u8; 8];
                rmr.read_at(slot(j).start, &mut got);
                assert_eq!(
                    u64::from_ne_bytes(got),
                    value(peer, j),
                    "rank {me}, message {j}"
                );
            }
            smr.write_at(slot(i).start, &value(me, i).to_ne_bytes());
            let s = comm.isend_on(smr.sge(slot(i)), peer, &stream).unwrap();
            let r = recvs.pop_front().unwrap();
            comm.wait_all_on(&[r, s], &stream).unwrap();
            // The slot the peer fills next for message i + SLOTS is free once the CPU has
            // read message i, which happens AHEAD iterations later: credit it only then.
            if i >= AHEAD as u64 && i - AHEAD as u64 + (SLOTS as u64) < ITERS {
                let j = i - AHEAD as u64 + SLOTS as u64;
                recvs.push_back(comm.irecv_on(rmr.sge(slot(j)), peer, &stream).unwrap());
            }
            in_flight.push_back((i, vec![r, s]));
        }
        stream.synchronize().unwrap();
        for (_, reqs) in in_flight {
            comm.wait_all(&reqs).unwrap();
        }
    });
}

/// CPU receives (credits on the credit QP) and executor receives (credits given by the
/// stream) while a send to the same peer waits on a stream for its credit: neither rings
/// that send early, and the CPU may wait for either kind.
#[test]
fn receives_behind_a_held_stream_send() {
    use std::sync::{Arc, Barrier};
    static GATE: std::sync::OnceLock<Arc<Barrier>> = std::sync::OnceLock::new();
    GATE.get_or_init(|| Arc::new(Barrier::new(2)));
    on_threads(2, |comm| {
        let me = comm.rank();
        let gate = GATE.get().unwrap();
        let mut buf = vec![0u8; 64];
        let mr = comm.register(&mut buf).unwrap();
        if me == 0 {
            let stream = HostStream::new().unwrap();
            // Rank 1 has posted no receive yet: the stream waits for the credit.
            let s = comm.isend_on(mr.sge(0..8), 1, &stream).unwrap();
            let r1 = comm.irecv(mr.sge(8..16), 1).unwrap();
            let r2 = comm.irecv_on(mr.sge(24..32), 1, &stream).unwrap();
            assert_eq!(comm.test(r2).unwrap(), None, "nothing sent yet");
            gate.wait();
            comm.wait_on(s, &stream).unwrap();
            comm.wait_all(&[r1, r2]).unwrap();
            stream.synchronize().unwrap();
            comm.wait(s).unwrap();
            let (mut got, mut got2) = ([0u8; 8], [0u8; 8]);
            mr.read_at(8, &mut got);
            mr.read_at(24, &mut got2);
            assert_eq!(
                (got, got2),
                ([7u8; 8], [7u8; 8]),
                "the messages rank 1 sent"
            );
            // Nothing is left to ring: CPU posts are fine again.
            let r = comm.irecv(mr.sge(8..16), 1).unwrap();
            comm.wait(r).unwrap();
        } else {
            mr.write_at(16, &[7u8; 8]);
            gate.wait();
            let r = comm.irecv(mr.sge(0..8), 0).unwrap();
            let s = comm.isend(mr.sge(16..24), 0).unwrap();
            let s2 = comm.isend(mr.sge(16..24), 0).unwrap();
            comm.wait_all(&[r, s, s2]).unwrap();
            let s = comm.isend(mr.sge(16..24), 0).unwrap();
            comm.wait(s).unwrap();
        }
    });
}

/// The stencil's stream pattern with its largest halos (32 KiB) between four thread ranks on
/// one soft device: per iteration each rank sends to two neighbours and waits for theirs on
/// a host stream, receives are credited by the stream `RECVS` iterations ahead, and the CPU
/// stays at most `AHEAD` iterations ahead. Every iteration must complete (no stall).
#[test]
fn four_ranks_large_halos_on_a_host_stream() {
    four_ranks_halo_pattern(false);
}

/// The same with a soft device for each rank (in-process links between four engines), as
/// stencil2d's thread ranks of the GPU triggers run.
#[test]
fn four_ranks_with_a_device_each_large_halos_on_a_host_stream() {
    four_ranks_halo_pattern(true);
}

/// The stencil's stream pattern between four thread ranks: on one soft device, or
/// (`device_each`) on a device each.
fn four_ranks_halo_pattern(device_each: bool) {
    use gdasync::gdsync::exec::OpBatch;
    const AHEAD: usize = 4;
    const RECVS: usize = AHEAD + 2;
    const SENDS: usize = AHEAD + 1;
    const LEN: usize = 32 << 10;
    const ITERS: u64 = 300;
    let shared = Device::soft().unwrap();
    let hs: Vec<_> = ThreadBootstrap::group(4)
        .into_iter()
        .map(|b| {
            let dev = match device_each {
                true => Device::soft().unwrap(),
                false => shared.clone(),
            };
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                let me = comm.rank();
                let peers = [(me + 1) % 4, (me + 3) % 4];
                let stream = HostStream::new().unwrap();
                let batch = OpBatch::new();
                let mut sbuf = vec![0u8; 2 * SENDS * LEN];
                let mut rbuf = vec![0u8; 2 * RECVS * LEN];
                let smr = comm.register(&mut sbuf).unwrap();
                let rmr = comm.register(&mut rbuf).unwrap();
                let send = |k: usize, i: u64| {
                    let at = (k * SENDS + (i as usize % SENDS)) * LEN;
                    smr.sge(at..at + LEN)
                };
                let recv = |k: usize, i: u64| {
                    let at = (k * RECVS + (i as usize % RECVS)) * LEN;
                    rmr.sge(at..at + LEN)
                };
                let mut recvs: Vec<Vec<Option<_>>> = vec![vec![None; RECVS]; 2];
                for i in 0..RECVS as u64 {
                    for (k, &p) in peers.iter().enumerate() {
                        recvs[k][i as usize % RECVS] =
                            Some(comm.irecv_on(recv(k, i), p, &batch).unwrap());
                    }
                }
                let mut in_flight = std::collections::VecDeque::new();
                for i in 0..ITERS {
                    while in_flight.len() >= AHEAD {
                        let done: Vec<_> = in_flight.pop_front().unwrap();
                        comm.wait_all(&done)
                            .unwrap_or_else(|e| panic!("rank {me}, iteration {i}: {e}"));
                    }
                    let mut reqs: Vec<_> = peers
                        .iter()
                        .enumerate()
                        .map(|(k, &p)| comm.isend_on(send(k, i), p, &batch).unwrap())
                        .collect();
                    batch.flush(&stream).unwrap();
                    let got: Vec<_> = (0..2)
                        .map(|k| recvs[k][i as usize % RECVS].take().unwrap())
                        .collect();
                    comm.wait_all_on(&got, &batch).unwrap();
                    batch.flush(&stream).unwrap();
                    reqs.extend(got);
                    if i + (RECVS as u64) < ITERS {
                        let j = i + RECVS as u64;
                        for (k, &p) in peers.iter().enumerate() {
                            recvs[k][j as usize % RECVS] =
                                Some(comm.irecv_on(recv(k, j), p, &batch).unwrap());
                        }
                    }
                    in_flight.push_back(reqs);
                }
                batch.flush(&stream).unwrap();
                stream.synchronize().unwrap();
                for done in in_flight {
                    comm.wait_all(&done).unwrap();
                }
                comm.barrier().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// A credit and a send to one peer, next to each other in a stream's list, are rung with one
/// doorbell: the stencil's stream pattern between four thread ranks (two neighbours each)
/// rings 2 doorbells per iteration when each peer's credit goes just before its send, and 4
/// when all credits go before all sends (the order stencil2d used to have).
#[test]
fn a_credit_next_to_its_peers_send_shares_the_doorbell() {
    // 40 iterations, two sends each; credits in iterations 1 to 34. Apart: a doorbell for
    // each credit and each send (2 + 34 * 4 + 5 * 2). Adjacent: one per send, plus one where a
    // send had to wait for its credit, which splits the pair: only in iterations 1 to 3 (from
    // iteration 4 on, the CPU has waited for a message its peer rang after the credit).
    let (adjacent, apart) = (halo_doorbells(true), halo_doorbells(false));
    assert_eq!(apart, 148);
    assert!((80..=86).contains(&adjacent), "{adjacent}");
}

/// Doorbells over 40 iterations (the most of any rank) of the stencil's stream pattern, each
/// rank on a device of its own; `adjacent`: each credit just before the send to its peer.
fn halo_doorbells(adjacent: bool) -> u64 {
    use gdasync::gdsync::exec::{Executor, OpBatch};
    use gdasync::gdsync::ops::{Op, Ops};
    const AHEAD: usize = 4;
    const RECVS: usize = AHEAD + 2;
    const SENDS: usize = AHEAD + 1;
    const LEN: usize = 256;
    const ITERS: u64 = 40;
    /// Counts the doorbells of the lists it passes on.
    struct Doorbells<'a>(&'a HostStream, std::cell::Cell<u64>);
    impl Executor for Doorbells<'_> {
        fn submit(&self, ops: Ops) -> gdasync::gdsync::Result<()> {
            let n = ops
                .as_slice()
                .iter()
                .filter(|o| matches!(o, Op::Doorbell { .. }));
            self.1.set(self.1.get() + n.count() as u64);
            self.0.submit(ops)
        }
    }
    let hs: Vec<_> = ThreadBootstrap::group(4)
        .into_iter()
        .map(|b| {
            let dev = Device::soft().unwrap();
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                let me = comm.rank();
                let peers = [(me + 1) % 4, (me + 3) % 4];
                let stream = HostStream::new().unwrap();
                let (batch, counted) = (OpBatch::new(), Doorbells(&stream, Default::default()));
                let mut sbuf = vec![0u8; 2 * SENDS * LEN];
                let mut rbuf = vec![0u8; 2 * RECVS * LEN];
                let smr = comm.register(&mut sbuf).unwrap();
                let rmr = comm.register(&mut rbuf).unwrap();
                let at = |k: usize, n: usize, i: u64| (k * n + (i as usize % n)) * LEN;
                let send = |k: usize, i: u64| smr.sge(at(k, SENDS, i)..at(k, SENDS, i) + LEN);
                let recv = |k: usize, i: u64| rmr.sge(at(k, RECVS, i)..at(k, RECVS, i) + LEN);
                let mut recvs: Vec<Vec<Option<_>>> = vec![vec![None; RECVS]; 2];
                for i in 0..RECVS as u64 {
                    for (k, &p) in peers.iter().enumerate() {
                        recvs[k][i as usize % RECVS] =
                            Some(comm.irecv_on(recv(k, i), p, &batch).unwrap());
                    }
                }
                batch.flush(&stream).unwrap();
                let mut in_flight = std::collections::VecDeque::new();
                for i in 0..ITERS {
                    while in_flight.len() >= AHEAD {
                        let done: Vec<_> = in_flight.pop_front().unwrap();
                        comm.wait_all(&done).unwrap();
                    }
                    let j = i + RECVS as u64 - 1;
                    let credit = i > 0 && j < ITERS;
                    let mut reqs = Vec::new();
                    for (k, &p) in peers.iter().enumerate() {
                        if credit && adjacent {
                            recvs[k][j as usize % RECVS] =
                                Some(comm.irecv_on(recv(k, j), p, &batch).unwrap());
                        }
                        reqs.push(comm.isend_on(send(k, i), p, &batch).unwrap());
                    }
                    let got: Vec<_> = (0..2)
                        .map(|k| recvs[k][i as usize % RECVS].take().unwrap())
                        .collect();
                    comm.wait_all_on(&got, &batch).unwrap();
                    batch.flush(&counted).unwrap();
                    reqs.extend(got);
                    if credit && !adjacent {
                        // (Given after the list, as after a kernel: the next list opens with them.)
                        for (k, &p) in peers.iter().enumerate() {
                            recvs[k][j as usize % RECVS] =
                                Some(comm.irecv_on(recv(k, j), p, &batch).unwrap());
                        }
                    }
                    in_flight.push_back(reqs);
                }
                batch.flush(&counted).unwrap();
                stream.synchronize().unwrap();
                for done in in_flight {
                    comm.wait_all(&done).unwrap();
                }
                comm.barrier().unwrap();
                counted.1.get()
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
}

/// A wait that never passes ends with a report of the connection: rank 1 posts receives
/// that rank 0 never matches. `wait_all` bounds the whole call by one timeout (four
/// requests that each waited the full timeout would take four), and the error names the
/// credits, posts and queue states of the connection.
#[test]
fn unmatched_waits_time_out_once_with_the_connections_state() {
    on_threads(2, |comm| {
        if comm.rank() == 0 {
            return;
        }
        comm.set_timeout(Duration::from_millis(300));
        let mut buf = vec![0u8; 64];
        let mr = comm.register(&mut buf).unwrap();
        let rs: Vec<_> = (0..4)
            .map(|k| comm.irecv(mr.sge(16 * k..16 * (k + 1)), 0).unwrap())
            .collect();
        let start = Instant::now();
        let e = comm.wait_all(&rs).unwrap_err();
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(900),
            "wait_all took {took:?}: each request waited its own timeout"
        );
        let Error::Timeout { what, .. } = &e else {
            panic!("expected a timeout, got {e}");
        };
        for part in [
            "Recv request with rank 0",
            "receives posted for it 4",
            "credits given by the CPU 4",
            "receive CQ",
            "completion 0 not written yet",
        ] {
            assert!(what.contains(part), "{part:?} missing from: {what}");
        }
    });
}

/// A thread rank that drops its communicator without `finalize`: the peer waiting for it
/// learns so at once (not at the 60 s timeout), and the peer's own `finalize` and barriers
/// end with an error naming the rank instead of blocking.
#[test]
fn a_thread_rank_that_leaves_without_finalize_is_noticed_at_once() {
    let dev = Device::soft().unwrap();
    let mut boots = ThreadBootstrap::group(2).into_iter();
    let (b0, b1) = (boots.next().unwrap(), boots.next().unwrap());
    let d1 = dev.clone();
    let leaver = std::thread::spawn(move || {
        let comm = Comm::new(Box::new(b1), &d1).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(comm); // leaves without a word
    });
    let mut comm = Comm::new(Box::new(b0), &dev).unwrap();
    let (e, took) = failed_receive_from(&mut comm, 1);
    assert!(took < Duration::from_secs(2), "noticed after {took:?}: {e}");
    assert!(e.to_string().contains("rank 1 left"), "{e}");
    leaver.join().unwrap();
    let start = Instant::now();
    let e = comm.barrier().unwrap_err();
    assert!(e.to_string().contains("rank 1 left"), "{e}");
    let e = comm.finalize().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2), "{e}");
    assert!(e.to_string().contains("rank 1 left"), "{e}");
}

/// Waits for a 64-byte message from `peer` that must fail: the error and how long it took.
fn failed_receive_from(comm: &mut Comm, peer: usize) -> (Error, Duration) {
    let mut buf = vec![0u8; 64];
    let mr = comm.register(&mut buf).unwrap();
    let r = comm.irecv(mr.sge(0..64), peer).unwrap();
    let start = Instant::now();
    let e = comm.wait(r).unwrap_err();
    (e, start.elapsed())
}
