//! Faults between "hosts": processes in two network namespaces joined by a veth pair, linked
//! by the soft device's TCP link (and meeting through mp's TCP bootstrap), while the test cuts
//! the veth link, brings it back, and kills processes with SIGKILL at random moments.
//!
//! Needs root and `ip netns` (iproute2): ignored unless asked for (`cargo test --release
//! --test netns -- --include-ignored`, as CI does), and then fails at once, saying why, where
//! it cannot create the namespaces. The namespaces are removed when a test ends, also when it
//! fails.
//!
//! The test re-executes this binary in a namespace (`ip netns exec`), running only the `child`
//! test with `GDSYNC_NETNS_ROLE` set; the child takes commands on stdin and answers on stdout
//! with lines tagged [`TAG`].

mod common;

use common::child::stdin_lines;
use gdasync::gdsync::auth;
use gdasync::gdsync::{Access, Cq, Device, Endpoint, QpConfig, RemoteBuf, SendWr, WcStatus};
use gdasync::mp::bootstrap::{JobInfo, TcpBootstrap};
use gdasync::mp::Comm;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const ROLE: &str = "GDSYNC_NETNS_ROLE";
const TAG: &str = "@@netns ";
/// Each process's remotely writable region, and the canary bytes on each side of it.
const REGION: usize = 1 << 20;
const GUARD: usize = 64 << 10;
const CANARY: u8 = 0xC5;
/// Bytes each QP writes and reads back per round.
const CHUNK: usize = 64 << 10;
/// The QPs' transport timeout: a link cut for longer fails their work.
const QP_TIMEOUT: Duration = Duration::from_millis(800);
/// The longest a survivor may take to see a fault.
const NOTICE: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(20);
/// Peers killed in one run, each at a random moment of its traffic.
const KILLS: usize = 3;

// ---------------------------------------------------------------------------- the child

/// The child processes' entry point; a no-op without a role.
#[test]
#[ignore = "the child process of the other tests in this file, not a test itself"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "peer" => peer(),
        "rank" => rank(),
        r => panic!("unknown child role {r:?}"),
    }
}

fn say(msg: impl std::fmt::Display) {
    common::child::say(TAG, msg);
}

fn status_str(s: WcStatus) -> String {
    match s {
        WcStatus::Success => "ok".into(),
        WcStatus::Error(e) => format!("{e:?}"),
    }
}

/// A process with one region (canaries around it) and QPs on command:
/// `NEWQP` → `EP i ENDPOINT` and `BUF addr len rkey`; `CONNECT i ENDPOINT addr len rkey` →
/// `CONNECTED i` (the remote slice this QP writes); `RUN i` → `PROG i n` every 20 rounds of
/// write-then-read-back, `FAIL i STATUS` at the first error; `CHECK` → `CANARY ok|bad`.
fn peer() {
    let cmds = stdin_lines();
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let mut whole = vec![CANARY; GUARD + REGION + GUARD];
    let (head, rest) = whole.split_at_mut(GUARD);
    let (mid, tail) = rest.split_at_mut(REGION);
    let mr = pd.register(mid, Access::ALL).unwrap();
    let cfg = QpConfig {
        timeout: QP_TIMEOUT,
        ..QpConfig::default()
    };
    let stop = AtomicBool::new(false);
    let mut qps = Vec::new();
    let mut targets = Vec::new();
    std::thread::scope(|s| {
        while let Ok(line) = cmds.recv() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[0] {
                "NEWQP" => {
                    let cq = dev.create_cq(64).unwrap();
                    let qp = pd.create_qp(&cq, &cq, &cfg).unwrap();
                    let i = qps.len();
                    say(format!("EP {i} {}", qp.endpoint()));
                    let r = mr.remote();
                    say(format!("BUF {} {} {}", r.addr, r.len, r.rkey));
                    qps.push(Some((qp, cq)));
                    targets.push(None);
                }
                "CONNECT" => {
                    let i: usize = w[1].parse().unwrap();
                    let ep: Endpoint = w[2].parse().unwrap();
                    let n = |k: usize| w[k].parse::<u64>().unwrap();
                    let (qp, _) = qps[i].as_mut().unwrap();
                    qp.connect(&ep).unwrap();
                    targets[i] = Some(RemoteBuf {
                        addr: n(3),
                        len: n(4),
                        rkey: n(5) as u32,
                    });
                    say(format!("CONNECTED {i}"));
                }
                "RUN" => {
                    let i: usize = w[1].parse().unwrap();
                    let (qp, cq) = qps[i].take().unwrap();
                    let to = targets[i].unwrap();
                    let (pd, stop) = (&pd, &stop);
                    s.spawn(move || traffic(i, qp, cq, to, pd, stop));
                }
                "CHECK" => {
                    let ok = head.iter().chain(tail.iter()).all(|&b| b == CANARY);
                    say(format!("CANARY {}", if ok { "ok" } else { "bad" }));
                }
                "EXIT" => break,
                other => panic!("unknown command {other:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// Writes a chunk into `to`, reads it back, checks it; again until stopped or an error.
fn traffic(
    i: usize,
    mut qp: gdasync::gdsync::Qp,
    cq: Cq,
    to: RemoteBuf,
    pd: &gdasync::gdsync::ProtectionDomain,
    stop: &AtomicBool,
) {
    let mut src = vec![0u8; CHUNK];
    let mut back = vec![0u8; CHUNK];
    let src_mr = pd.register(&mut src, Access::LOCAL_WRITE).unwrap();
    let back_mr = pd.register(&mut back, Access::LOCAL_WRITE).unwrap();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let data: Vec<u8> = (0..CHUNK)
            .map(|k| (k as u64 ^ round.wrapping_mul(0x9E37)) as u8)
            .collect();
        src_mr.write_at(0, &data);
        let write = SendWr::write(to.at(0)).sge(src_mr.sge(..)).wr_id(1);
        let read = SendWr::read(to.at(0)).sge(back_mr.sge(..)).wr_id(2);
        for wr in [write, read] {
            qp.post_send(&wr).unwrap();
            let c = cq.wait_one(WAIT).unwrap();
            if !c.is_ok() {
                eprintln!("QP {i} after {round} rounds: {}", qp.describe());
                say(format!("FAIL {i} {}", status_str(c.status)));
                return;
            }
        }
        let mut got = vec![0u8; CHUNK];
        back_mr.read_at(0, &mut got);
        if got != data {
            say(format!("FAIL {i} corrupt"));
            return;
        }
        round += 1;
        if round % 20 == 0 {
            say(format!("PROG {i} {round}"));
        }
    }
}

/// A rank of a two-rank mp job: ping-pong with the other rank, `PROG n` every 50 rounds,
/// `FAIL ms message` at the first error (ms since the last success).
fn rank() {
    let info = JobInfo::from_env().unwrap();
    let boot = TcpBootstrap::connect(&info, WAIT).unwrap();
    let dev = Device::soft().unwrap();
    let mut comm = Comm::new(Box::new(boot), &dev).unwrap();
    let mut buf = vec![0u8; 8192];
    let peer = 1 - comm.rank();
    let mr = comm.register(&mut buf).unwrap();
    let mut last_ok = Instant::now();
    for round in 1u64.. {
        let r = comm.irecv(mr.sge(0..4096), peer);
        let s = comm.isend(mr.sge(4096..8192), peer);
        let done = r.and_then(|r| s.and_then(|s| comm.wait_all(&[r, s])));
        if let Err(e) = done {
            say(format!("FAIL {} {e}", last_ok.elapsed().as_millis()));
            return;
        }
        last_ok = Instant::now();
        if round % 50 == 0 {
            say(format!("PROG {round}"));
        }
    }
}

// ---------------------------------------------------------------------------- the parent

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces joined by a veth pair, 10.213.0.1 (`a`) and 10.213.0.2 (`b`); removed on
/// drop.
struct Netns {
    ns: [String; 2],
    veth: [String; 2],
}

impl Netns {
    fn addr(i: usize) -> String {
        format!("10.213.0.{}", i + 1)
    }

    /// Creates them, or fails saying why (not root, no `ip`, no namespace support).
    fn new(tag: &str) -> Netns {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "this test needs root to create network namespaces (euid {euid}): run it as root, or leave it ignored"
        );
        let pid = std::process::id();
        let n = Netns {
            ns: [0, 1].map(|i| format!("gdsync-{pid}-{tag}{i}")),
            veth: [0, 1].map(|i| format!("gv{}{tag}{i}", pid % 100_000)),
        };
        if let Err(e) = n.set_up() {
            panic!("cannot set up network namespaces: {e}");
        }
        n
    }

    fn set_up(&self) -> Result<(), String> {
        for ns in &self.ns {
            ip(&["netns", "add", ns])?;
        }
        let [va, vb] = [&self.veth[0], &self.veth[1]];
        ip(&["link", "add", va, "type", "veth", "peer", "name", vb])?;
        for i in 0..2 {
            let (ns, v) = (&self.ns[i], &self.veth[i]);
            ip(&["link", "set", v, "netns", ns])?;
            let cidr = format!("{}/24", Self::addr(i));
            ip(&["-n", ns, "addr", "add", &cidr, "dev", v])?;
            ip(&["-n", ns, "link", "set", v, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Sets side `i`'s end of the veth pair up or down.
    fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.ns[i], "link", "set", &self.veth[i], state]).unwrap();
    }

    /// A child of this binary in namespace `i`, in `role`, its TCP links on the veth.
    fn spawn(&self, i: usize, role: &str, env: &[(&str, String)]) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[i]])
            .arg(exe)
            .args(["--exact", "child", "--ignored", "--nocapture"])
            .args(["--test-threads=1"])
            .env(ROLE, role)
            .env("GDSYNC_SOFT_LINK", "tcp")
            .env("GDSYNC_SOFT_IFACE", &self.veth[i])
            .env(auth::SECRET_ENV, auth::job_secret().unwrap().to_hex());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::start(cmd)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A child process: its stdin, and its tagged stdout lines.
struct Proc {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
    stash: Vec<String>,
}

impl Proc {
    fn start(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a child in a namespace");
        let lines = common::child::tagged_lines(child.stdout.take().unwrap(), TAG);
        Proc {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
            stash: Vec::new(),
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The rest of the next line that starts with `prefix` (other lines are kept), within
    /// `within`; `None` at the deadline.
    fn next(&mut self, prefix: &str, within: Duration) -> Option<String> {
        if let Some(k) = self.stash.iter().position(|l| l.starts_with(prefix)) {
            return Some(self.stash.remove(k)[prefix.len()..].to_string());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.to_string());
            }
            self.stash.push(line);
        }
    }

    fn expect(&mut self, prefix: &str) -> String {
        self.next(prefix, WAIT)
            .unwrap_or_else(|| panic!("no {prefix:?} line; other lines: {:?}", self.failures()))
    }

    /// The `FAIL` lines kept so far.
    fn failures(&self) -> Vec<&String> {
        self.stash
            .iter()
            .filter(|l| l.starts_with("FAIL"))
            .collect()
    }

    /// Forgets lines kept so far that start with `prefix`.
    fn forget(&mut self, prefix: &str) {
        self.stash.retain(|l| !l.starts_with(prefix));
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A new QP in `x` (index, endpoint, region) and one in `y`, connected to each other; `y`
/// writes into `x`'s region at `off`.
fn pair(x: &mut Proc, y: &mut Proc, off: u64) -> (usize, usize) {
    let new_qp = |p: &mut Proc| {
        p.send("NEWQP");
        let ep = p.expect("EP ");
        let (i, ep) = ep.split_once(' ').unwrap();
        (
            i.parse::<usize>().unwrap(),
            ep.to_string(),
            p.expect("BUF "),
        )
    };
    let (i, ep_x, buf_x) = new_qp(x);
    let (j, ep_y, buf_y) = new_qp(y);
    let at = |buf: String, off: u64| {
        let v: Vec<u64> = buf.split(' ').map(|n| n.parse().unwrap()).collect();
        format!("{} {} {}", v[0] + off, v[1] - off, v[2])
    };
    x.send(&format!("CONNECT {i} {ep_y} {buf_y}"));
    y.send(&format!("CONNECT {j} {ep_x} {}", at(buf_x, off)));
    x.expect(&format!("CONNECTED {i}"));
    y.expect(&format!("CONNECTED {j}"));
    (i, j)
}

/// Waits until QP `i` of `p` reports progress.
fn progresses(p: &mut Proc, i: usize) {
    p.forget(&format!("PROG {i} "));
    if let Some(f) = p
        .stash
        .iter()
        .find(|l| l.starts_with(&format!("FAIL {i} ")))
    {
        panic!("QP {i} failed: {f}");
    }
    p.expect(&format!("PROG {i} "));
}

/// Waits for QP `i` of `p` to fail, no later than [`NOTICE`] after `since`; returns its status.
fn fails(p: &mut Proc, i: usize, since: Instant, what: &str) -> String {
    let left = (since + NOTICE).saturating_duration_since(Instant::now());
    let status = p
        .next(&format!("FAIL {i} "), left.max(Duration::from_millis(1)))
        .unwrap_or_else(|| panic!("{what}: QP {i} did not fail within {NOTICE:?}"));
    println!(
        "{what}: QP {i} failed with {status} after {:?}",
        since.elapsed()
    );
    status
}

/// A random delay of up to `max_ms`, from the clock (the run prints it).
fn random_delay(max_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    Duration::from_millis(nanos % max_ms)
}

/// A hub in one namespace, two peers in the other, a QP pair between the hub and each, all
/// writing and reading back at once. A 100 ms cut of the veth link: every QP goes on. A cut
/// longer than the QPs' timeout: every QP fails with TRANSPORT_RETRY_EXC within 2 s; back up,
/// new QPs over the same links work. Then peers are killed (SIGKILL) at random moments, one
/// after the other: each time the hub's QP to it fails within 2 s, its QP to the other peer goes
/// on, no byte outside a region changed in the survivors, and a fresh peer links to the hub.
#[test]
#[ignore = "needs root and ip netns: cargo test --release --test netns -- --include-ignored"]
fn netns_tcp_link_cut_and_killed_peer() {
    const HUB: usize = 0;
    let net = Netns::new("l");
    let mut ps = [
        net.spawn(0, "peer", &[]),
        net.spawn(1, "peer", &[]),
        net.spawn(1, "peer", &[]),
    ];
    // QPs as (process, index): the hub's to peer 1 and to peer 2, then each peer's to the hub.
    let connect_all = |ps: &mut [Proc; 3]| -> [(usize, usize); 4] {
        let [hub, b1, b2] = ps;
        let (h1, p1) = pair(hub, b1, 0);
        let (h2, p2) = pair(hub, b2, CHUNK as u64);
        let qps = [(HUB, h1), (HUB, h2), (1, p1), (2, p2)];
        for (p, i) in qps {
            ps[p].send(&format!("RUN {i}"));
        }
        qps
    };
    let all_progress = |ps: &mut [Proc; 3], qps: &[(usize, usize)]| {
        for &(p, i) in qps {
            progresses(&mut ps[p], i);
        }
    };
    let qps = connect_all(&mut ps);
    all_progress(&mut ps, &qps);
    println!("traffic on 4 QPs");

    // A short cut: TCP retransmits (its first retransmission comes after 200 ms), nothing
    // fails.
    net.link(1, false);
    std::thread::sleep(Duration::from_millis(100));
    net.link(1, true);
    all_progress(&mut ps, &qps);
    println!("a 100 ms cut: traffic goes on");

    // A long cut: every QP times out.
    net.link(1, false);
    let cut = Instant::now();
    for (p, i) in qps {
        let s = fails(&mut ps[p], i, cut, "veth down");
        assert_eq!(s, "TransportRetryExc", "process {p} QP {i}");
    }
    net.link(1, true);
    let qps = connect_all(&mut ps);
    all_progress(&mut ps, &qps);

    // Peers killed at random moments: the first of this run's, then fresh ones.
    let mut victim = (1, qps[0].1);
    for round in 0..KILLS {
        let delay = random_delay(300);
        println!("kill {round}: a peer {delay:?} into its traffic");
        std::thread::sleep(delay);
        ps[victim.0].kill();
        let killed = Instant::now();
        let s = fails(&mut ps[HUB], victim.1, killed, "peer killed");
        assert!(s == "TransportRetryExc" || s == "WrFlush", "{s}");
        progresses(&mut ps[HUB], qps[1].1);
        progresses(&mut ps[2], qps[3].1);
        for p in [HUB, 2] {
            ps[p].send("CHECK");
            assert_eq!(ps[p].expect("CANARY "), "ok", "process {p}");
        }
        ps[1] = net.spawn(1, "peer", &[]);
        let [hub, fresh, _] = &mut ps;
        let (h, p) = pair(hub, fresh, 0);
        hub.send(&format!("RUN {h}"));
        fresh.send(&format!("RUN {p}"));
        progresses(hub, h);
        victim = (1, h);
    }
}

/// Two ranks of an mp job in two namespaces, meeting through the TCP bootstrap (rank 0's
/// address on the veth) and linked over TCP, ping-pong; rank 1 is killed (SIGKILL) at a random
/// moment, and rank 0's next wait fails within 2 s with an error that names rank 1.
#[test]
#[ignore = "needs root and ip netns: cargo test --release --test netns -- --include-ignored"]
fn netns_tcp_bootstrap_and_killed_rank() {
    let net = Netns::new("m");
    let root = format!("{}:29611", Netns::addr(0));
    let env = |r: usize| {
        [
            ("GDSYNC_RANK", r.to_string()),
            ("GDSYNC_SIZE", "2".to_string()),
            ("GDSYNC_ROOT", root.clone()),
        ]
    };
    let mut r0 = net.spawn(0, "rank", &env(0));
    let mut r1 = net.spawn(1, "rank", &env(1));
    r0.expect("PROG ");
    r1.expect("PROG ");
    let delay = random_delay(300);
    println!("killing rank 1 {delay:?} into its traffic");
    std::thread::sleep(delay);
    r1.kill();
    let killed = Instant::now();
    r0.forget("PROG ");
    let fail = r0
        .next("FAIL ", NOTICE)
        .unwrap_or_else(|| panic!("rank 0 did not notice within {NOTICE:?}"));
    println!("rank 0 noticed after {:?}: {fail}", killed.elapsed());
    // The error names the rank and says it is gone.
    let (_, msg) = fail.split_once(' ').unwrap();
    assert!(msg.contains("connection to rank 1 is lost"), "{msg}");
}
