//! Two processes on one host, linked through a shared-memory file, or over TCP on this host
//! when the child asks for it (`GDSYNC_SOFT_LINK=tcp` in its environment; its endpoint
//! carries the request, so the parent, with the default policy, links over TCP too).
//!
//! Every test runs on soft devices, and the `mlx5_` ones on `mlx5_0` of the emulated RDMA
//! driver: each process under an emulator of its own, as two hosts with a ConnectX each
//! (libmlx5's QPs, served by the soft HCA behind the driver, which links to the other
//! process's over shared memory or TCP). Those are ignored where rdma-core is not installed.
//!
//! The parent test re-executes this test binary, running only the `child` test with
//! `GDSYNC_CHILD_ROLE` set; without that variable `child` returns at once. Endpoints and the
//! child's memory region are exchanged as text lines over the child's stdin and stdout; the
//! child's lines of protocol carry [`TAG`] (libtest prints other text there too).

mod common;

use common::child::stdin_lines;
use common::*;
use gdasync::gdsync::auth;
use gdasync::gdsync::format::Syndrome;
use gdasync::gdsync::{
    Access, CompletionOp, Device, Endpoint, Error, LinkKind, LinkPolicy, QpConfig, RecvWr,
    RemoteBuf, SendWr, WcStatus,
};
use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

const ROLE: &str = "GDSYNC_CHILD_ROLE";
/// The device the child opens (`soft` or `mlx5_0`).
const DEVICE: &str = "GDSYNC_CHILD_DEVICE";
const TAG: &str = "@@gdsync ";
/// The child's remotely accessible region: its size and the seed of its initial contents.
const MEM_LEN: usize = 1 << 20;
const MEM_SEED: u64 = 0xC41D;
/// The child's receive slots.
const SLOTS: usize = 16;
const SLOT: usize = 256 * 1024;

// ---------------------------------------------------------------------------- the child

/// The child process's entry point (ignored, so that the test process does not count it as a
/// test; the parent runs it with `--ignored`); a no-op without a role.
#[test]
#[ignore = "the child process of the other tests in this file, not a test itself"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "responder" => responder(),
        "idle" => idle(),
        "connect-self" => connect_self(),
        r => panic!("unknown child role {r:?}"),
    }
}

fn say(msg: impl std::fmt::Display) {
    common::child::say(TAG, msg);
}

fn parse_buf(s: &str) -> RemoteBuf {
    let v: Vec<u64> = s
        .split_whitespace()
        .map(|x| x.parse().expect("number"))
        .collect();
    assert_eq!(v.len(), 3, "BUF line: {s:?}");
    RemoteBuf {
        addr: v[0],
        len: v[1],
        rkey: v[2] as u32,
    }
}

/// Creates the child's QP and region, prints `EP` and `BUF`, reads the parent's `EP` and
/// connects. Returns what the roles need.
struct ChildSetup {
    _dev: Device,
    pd: gdasync::gdsync::ProtectionDomain,
    qp: gdasync::gdsync::Qp,
    scq: gdasync::gdsync::Cq,
    rcq: gdasync::gdsync::Cq,
    cmds: Receiver<String>,
}

fn child_setup(mem: &gdasync::gdsync::MemoryRegion<'_>, s: &mut ChildSetup) {
    let r = mem.remote();
    say(format!("EP {}", s.qp.endpoint()));
    say(format!("BUF {} {} {}", r.addr, r.len, r.rkey));
    let line = s.cmds.recv().expect("parent's endpoint");
    let ep: Endpoint = line
        .strip_prefix("EP ")
        .expect("EP line")
        .parse()
        .expect("endpoint");
    s.qp.connect(&ep).expect("child connect");
}

fn child_new() -> ChildSetup {
    let name = std::env::var(DEVICE).unwrap_or_else(|_| "soft".into());
    let dev = Device::open(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(256).unwrap();
    let rcq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(&scq, &rcq, &QpConfig::default()).unwrap();
    ChildSetup {
        _dev: dev,
        pd,
        qp,
        scq,
        rcq,
        cmds: stdin_lines(),
    }
}

fn status_str(s: WcStatus) -> String {
    match s {
        WcStatus::Success => "ok".into(),
        WcStatus::Error(e) => format!("err:{e:?}"),
    }
}

/// Serves the parent: receives into slots (reporting each), and answers commands about its
/// memory.
fn responder() {
    let mut s = child_new();
    let mut mem = pattern(MEM_SEED, MEM_LEN);
    let mut slots = vec![0u8; SLOTS * SLOT];
    let mem_mr = s.pd.register(&mut mem, Access::ALL).unwrap();
    let slots_mr = s.pd.register(&mut slots, Access::LOCAL_WRITE).unwrap();
    child_setup(&mem_mr, &mut s);
    for i in 0..SLOTS {
        s.qp.post_recv(
            &RecvWr::new()
                .sge(slots_mr.sge(i * SLOT..(i + 1) * SLOT))
                .wr_id(i as u64),
        )
        .unwrap();
    }
    say("READY");
    loop {
        while let Some(c) = s.rcq.poll_one().unwrap() {
            let i = c.wr_id as usize;
            let mut data = vec![0u8; (c.byte_len as usize).min(SLOT)];
            if c.opcode == CompletionOp::Recv {
                slots_mr.read_at(i * SLOT, &mut data);
            }
            let imm = c.imm.map_or("-".to_string(), |v| v.to_string());
            say(format!(
                "RECV {} {} {:?} {} {} {:016x}",
                c.wr_id,
                status_str(c.status),
                c.opcode,
                c.byte_len,
                imm,
                checksum(&data)
            ));
            s.qp.post_recv(
                &RecvWr::new()
                    .sge(slots_mr.sge(i * SLOT..(i + 1) * SLOT))
                    .wr_id(i as u64),
            )
            .unwrap();
        }
        let line = match s.cmds.try_recv() {
            Ok(l) => l,
            Err(TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w[i].parse().expect("number") };
        match w[0] {
            "HASH" => {
                let mut b = vec![0u8; num(2) as usize];
                mem_mr.read_at(num(1) as usize, &mut b);
                say(format!("HASH {:016x}", checksum(&b)));
            }
            "WORD" => {
                let mut b = [0u8; 8];
                mem_mr.read_at(num(1) as usize, &mut b);
                say(format!("WORD {}", u64::from_ne_bytes(b)));
            }
            "SETWORD" => {
                mem_mr.write_at(num(1) as usize, &num(2).to_ne_bytes());
                say("OK");
            }
            "SEND" => {
                let (off, len) = (num(1) as usize, num(2) as usize);
                let wr = match w[3] {
                    "-" => SendWr::send(),
                    imm => SendWr::send_imm(imm.parse().unwrap()),
                };
                s.qp.post_send(&wr.sge(mem_mr.sge(off..off + len)).wr_id(1))
                    .unwrap();
                let c = s.scq.wait_one(TIMEOUT).unwrap();
                say(format!("SENT {}", status_str(c.status)));
            }
            "EXIT" => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

/// Connects and then does nothing (no receives posted) until stdin closes.
fn idle() {
    let mut s = child_new();
    let mut mem = pattern(MEM_SEED, MEM_LEN);
    let mem_mr = s.pd.register(&mut mem, Access::ALL).unwrap();
    child_setup(&mem_mr, &mut s);
    say("READY");
    while let Ok(line) = s.cmds.recv() {
        if line == "EXIT" {
            break;
        }
    }
}

/// Connects a QP to itself and reports the outcome (`CONNECTED` or `ERR message`).
fn connect_self() {
    let mut s = child_new();
    let ep = s.qp.endpoint();
    match s.qp.connect(&ep) {
        Ok(()) => say("CONNECTED"),
        Err(e) => say(format!("ERR {e}")),
    }
}

// ---------------------------------------------------------------------------- the parent

/// The two processes' devices, and how their devices link.
#[derive(Clone, Copy, Debug)]
struct Peers {
    /// `mlx5_0` of the emulated RDMA driver in each process, else a soft device.
    mlx5: bool,
    link: LinkKind,
}

const SHM: Peers = Peers {
    mlx5: false,
    link: LinkKind::SharedMemory,
};
const TCP: Peers = Peers {
    mlx5: false,
    link: LinkKind::Tcp,
};
const MLX5_SHM: Peers = Peers {
    mlx5: true,
    link: LinkKind::SharedMemory,
};
const MLX5_TCP: Peers = Peers {
    mlx5: true,
    link: LinkKind::Tcp,
};

impl Peers {
    fn device(self) -> &'static str {
        if self.mlx5 {
            "mlx5_0"
        } else {
            "soft"
        }
    }
}

/// Tests of the bodies above on `mlx5_0` of the emulated RDMA driver: each runs again in a
/// child under the driver (the parent process of the test), which starts the peer process
/// under an emulator of its own.
macro_rules! on_mlx5 {
    ($($(#[$m:meta])* fn $name:ident() $body:block)*) => {$(
        #[test]
        #[cfg_attr(
            not(rdma_core),
            ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
        )]
        $(#[$m])*
        fn $name() {
            if !under_emulated_driver(module_path!(), stringify!($name)) $body
        }
    )*};
}

/// A child process running one role, and the parent's connected QP to it.
struct Child {
    proc: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stash: Vec<String>,
    /// The child's region.
    buf: RemoteBuf,
    side: Side,
    /// The child's emulated driver (its fake sysfs tree and fabric node), for an mlx5 child.
    _emu: Option<uverbs_emu::Emulator>,
}

impl Child {
    /// Starts a child in `role` and connects a QP with `cfg` to it: on the devices of
    /// `peers`, over its link (`SharedMemory` or `Tcp`).
    fn spawn(role: &str, cfg: &QpConfig, peers: Peers) -> Child {
        Self::spawn_on(&Device::open(peers.device()).unwrap(), role, cfg, peers)
    }

    /// As [`Child::spawn`], the parent's QP on `dev`.
    fn spawn_on(dev: &Device, role: &str, cfg: &QpConfig, peers: Peers) -> Child {
        let exe = std::env::current_exe().unwrap();
        let emu = peers.mlx5.then(|| emulator("mlx5_0"));
        let mut cmd = match &emu {
            Some(emu) => emu.command(exe),
            None => Command::new(exe),
        };
        cmd.args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DEVICE, peers.device())
        .env_remove("UVEMU_TEST_CHILD")
        .env(
            auth::SECRET_ENV,
            auth::job_secret().expect("a job secret").to_hex(),
        );
        let link = peers.link;
        match link {
            LinkKind::SharedMemory => cmd.env_remove("GDSYNC_SOFT_LINK"),
            LinkKind::Tcp => cmd.env("GDSYNC_SOFT_LINK", "tcp"),
            other => panic!("a child process is reached by shared memory or TCP, not {other:?}"),
        };
        let mut proc = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let lines = common::child::tagged_lines(proc.stdout.take().unwrap(), TAG);
        let side = Side::new(dev, cfg);
        let mut c = Child {
            stdin: proc.stdin.take(),
            proc,
            lines,
            stash: Vec::new(),
            buf: RemoteBuf {
                addr: 0,
                len: 0,
                rkey: 0,
            },
            side,
            _emu: emu,
        };
        let ep: Endpoint = c.expect("EP ").parse().expect("child endpoint");
        if peers.mlx5 {
            // An RDMA port's QP: the soft HCAs behind the drivers choose their link.
            assert!(ep.port.is_some(), "{ep}");
        } else {
            assert_eq!(dev.link_kind(&ep).unwrap(), link, "{ep}");
            if link == LinkKind::Tcp {
                assert_eq!(ep.link, LinkPolicy::Tcp, "{ep}");
                assert!(ep.addr.is_some(), "{ep}");
            } else {
                assert!(ep.addr.is_none(), "a process of one host listens: {ep}");
            }
        }
        c.buf = parse_buf(&c.expect("BUF "));
        assert_eq!(c.buf.len, MEM_LEN as u64);
        // Send our endpoint before connecting: connect waits for the link file that the
        // device with the smaller id creates when it connects (over TCP: for its dial).
        let mine = c.side.qp.endpoint();
        c.send(&format!("EP {mine}"));
        c.side.qp.connect(&ep).expect("parent connect");
        c.expect("READY");
        c
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().unwrap();
    }

    /// The rest of the next line starting with `prefix` (earlier lines that do not match
    /// are kept for later calls).
    fn expect(&mut self, prefix: &str) -> String {
        if let Some(i) = self.stash.iter().position(|l| l.starts_with(prefix)) {
            return self.stash.remove(i)[prefix.len()..].to_string();
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l[prefix.len()..].to_string(),
                Ok(l) => self.stash.push(l),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {prefix:?} line from the child (have {:?})", self.stash)
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "child exited before a {prefix:?} line (have {:?}): {:?}",
                    self.stash,
                    self.proc.try_wait()
                ),
            }
        }
    }

    /// Asks the child for the checksum of its region's bytes `off..off+len`.
    fn hash(&mut self, off: usize, len: usize) -> u64 {
        self.send(&format!("HASH {off} {len}"));
        u64::from_str_radix(&self.expect("HASH "), 16).unwrap()
    }

    fn word(&mut self, off: usize) -> u64 {
        self.send(&format!("WORD {off}"));
        self.expect("WORD ").parse().unwrap()
    }

    /// The child's next receive report: (wr_id, status, opcode, byte_len, imm, checksum).
    fn recv_report(&mut self) -> (u64, String, String, u32, String, u64) {
        let l = self.expect("RECV ");
        let w: Vec<&str> = l.split_whitespace().collect();
        (
            w[0].parse().unwrap(),
            w[1].to_string(),
            w[2].to_string(),
            w[3].parse().unwrap(),
            w[4].to_string(),
            u64::from_str_radix(w[5], 16).unwrap(),
        )
    }

    /// Asks the child to exit and checks that it succeeded.
    fn finish(mut self) {
        self.send("EXIT");
        self.stdin = None;
        let st = self.proc.wait().unwrap();
        assert!(st.success(), "child failed: {st:?}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // On a failed test, do not leave the child behind.
        if let Ok(None) = self.proc.try_wait() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

/// Every operation against a child process, checked on both sides.
#[test]
fn every_operation_across_processes() {
    every_operation(SHM);
}

/// The same over TCP.
#[test]
fn every_operation_over_tcp() {
    every_operation(TCP);
}

fn every_operation(peers: Peers) {
    let mut ch = Child::spawn("responder", &QpConfig::default(), peers);
    let buf = ch.buf;
    // The parent's model of the child's region.
    let mut model = pattern(MEM_SEED, MEM_LEN);
    let mut local = vec![0u8; MEM_LEN];
    let mut src = pattern(101, MEM_LEN);
    let mut atom = vec![0u8; 8];
    let pd = ch.side.pd.clone();
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let smr = pd.register(&mut src, Access::empty()).unwrap();
    let amr = pd.register(&mut atom, Access::LOCAL_WRITE).unwrap();
    let srcv = pattern(101, MEM_LEN);
    let scq = ch.side.scq.clone();
    let ok1 = |ch: &mut Child, wr: SendWr, op: CompletionOp| {
        ch.side.qp.post_send(&wr).unwrap();
        let c = poll1(&scq);
        assert!(c.is_ok() && c.opcode == op, "{op:?}: {c:?}");
        c
    };

    // RDMA read of the whole region (16 packets).
    let c = ok1(
        &mut ch,
        SendWr::read(buf.at(0)).sge(lmr.sge(..)),
        CompletionOp::Read,
    );
    assert_eq!(c.byte_len as usize, MEM_LEN);
    let mut got = vec![0u8; MEM_LEN];
    lmr.read_at(0, &mut got);
    assert!(got == model, "read across processes differs");

    // Sends: small, multi-packet, with immediate.
    for (k, (off, len, imm)) in [
        (0usize, 1000usize, None),
        (5, 200 * 1024, None),
        (7, 64, Some(0xC0FF_EE11u32)),
        (0, 0, Some(5)),
    ]
    .into_iter()
    .enumerate()
    {
        let wr = match imm {
            None => SendWr::send(),
            Some(i) => SendWr::send_imm(i),
        };
        ok1(&mut ch, wr.sge(smr.sge(off..off + len)), CompletionOp::Send);
        let (wr_id, st, op, n, im, sum) = ch.recv_report();
        assert_eq!(wr_id, k as u64);
        assert_eq!(st, "ok");
        assert_eq!(op, "Recv");
        assert_eq!(n as usize, len);
        assert_eq!(im, imm.map_or("-".to_string(), |v| v.to_string()));
        assert_eq!(sum, checksum(&srcv[off..off + len]), "send {k} payload");
    }

    // Writes: one page, and 512 KiB (8 packets).
    for (off, soff, len) in [(4096usize, 3usize, 4096usize), (512 * 1024, 0, 512 * 1024)] {
        ok1(
            &mut ch,
            SendWr::write(buf.at(off as u64)).sge(smr.sge(soff..soff + len)),
            CompletionOp::Write,
        );
        model[off..off + len].copy_from_slice(&srcv[soff..soff + len]);
        assert_eq!(
            ch.hash(off, len),
            checksum(&model[off..off + len]),
            "write at {off}"
        );
    }

    // Write with immediate: consumes a receive, the data goes to the region.
    ok1(
        &mut ch,
        SendWr::write_imm(buf.at(0), 0xABCD).sge(smr.sge(100..356)),
        CompletionOp::Write,
    );
    model[..256].copy_from_slice(&srcv[100..356]);
    let (_, st, op, n, im, _) = ch.recv_report();
    assert_eq!(
        (st.as_str(), op.as_str(), n, im.as_str()),
        ("ok", "RecvWriteImm", 256, "43981")
    );
    assert_eq!(ch.hash(0, 256), checksum(&model[..256]));

    // Fetch-and-add and compare-and-swap on a word of the child.
    let woff = 8192usize;
    ch.send(&format!("SETWORD {woff} 1000"));
    ch.expect("OK");
    model[woff..woff + 8].copy_from_slice(&1000u64.to_ne_bytes());
    let old = |amr: &gdasync::gdsync::MemoryRegion<'_>| {
        let mut b = [0u8; 8];
        amr.read_at(0, &mut b);
        u64::from_ne_bytes(b)
    };
    ok1(
        &mut ch,
        SendWr::fetch_add(buf.at(woff as u64), 5).sge(amr.sge(..)),
        CompletionOp::FetchAdd,
    );
    assert_eq!(old(&amr), 1000);
    assert_eq!(ch.word(woff), 1005);
    ok1(
        &mut ch,
        SendWr::compare_swap(buf.at(woff as u64), 1005, 77).sge(amr.sge(..)),
        CompletionOp::CompareSwap,
    );
    assert_eq!(old(&amr), 1005);
    assert_eq!(ch.word(woff), 77);
    ok1(
        &mut ch,
        SendWr::compare_swap(buf.at(woff as u64), 1005, 99).sge(amr.sge(..)),
        CompletionOp::CompareSwap,
    );
    assert_eq!(old(&amr), 77, "failed compare returns the current value");
    assert_eq!(ch.word(woff), 77, "failed compare must not swap");
    model[woff..woff + 8].copy_from_slice(&77u64.to_ne_bytes());

    // The other direction: the child sends, the parent receives.
    let mut rbuf = vec![0u8; 4096];
    let rmr = pd.register(&mut rbuf, Access::LOCAL_WRITE).unwrap();
    ch.side
        .qp
        .post_recv(&RecvWr::new().sge(rmr.sge(..)).wr_id(55))
        .unwrap();
    ch.send("SEND 0 3000 7");
    assert_eq!(ch.expect("SENT "), "ok");
    let r = poll1(&ch.side.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!((r.wr_id, r.byte_len, r.imm), (55, 3000, Some(7)));
    let mut got3 = vec![0u8; 3000];
    rmr.read_at(0, &mut got3);
    assert!(got3 == model[..3000], "child's send payload");

    // Finally the whole region, both by the child's checksum and by a read.
    assert_eq!(ch.hash(0, MEM_LEN), checksum(&model));
    ok1(
        &mut ch,
        SendWr::read(buf.at(0)).sge(lmr.sge(..)),
        CompletionOp::Read,
    );
    lmr.read_at(0, &mut got);
    assert!(got == model);
    drop((lmr, smr, amr, rmr));
    ch.finish();
}

/// Kills the child with SIGKILL and returns when it did.
fn kill(ch: &mut Child) -> Instant {
    ch.proc.kill().expect("kill child");
    Instant::now()
}

/// Checks `n` completions that must all be errors from a dead peer; returns their statuses.
fn dead_peer_completions(ch: &Child, n: usize, since: Instant, first_id: u64) -> Vec<WcStatus> {
    let c = poll_n(&ch.side.scq, n);
    let elapsed = since.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "outstanding work took {elapsed:?} to fail after the kill: {c:?}"
    );
    for (i, x) in c.iter().enumerate() {
        assert_eq!(x.wr_id, first_id + i as u64, "{x:?}");
        assert!(
            matches!(
                x.status,
                WcStatus::Error(Syndrome::TransportRetryExc | Syndrome::WrFlush)
            ),
            "{x:?}"
        );
    }
    c.iter().map(|x| x.status).collect()
}

/// Sends stuck on RNR (the child posts no receives; infinite retries) and a read behind
/// them, then the child is killed: all of it completes with errors within 2 s, the first
/// with TRANSPORT_RETRY_EXC.
fn kill_during_rnr(rnr_timer: Duration, peers: Peers) {
    let cfg = QpConfig {
        rnr_retry: u8::MAX,
        rnr_timer,
        ..QpConfig::default()
    };
    let mut ch = Child::spawn("idle", &cfg, peers);
    let buf = ch.buf;
    let pd = ch.side.pd.clone();
    let mut local = vec![0u8; 64];
    let mut src = pattern(102, 64);
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let smr = pd.register(&mut src, Access::empty()).unwrap();
    // The link works: a read succeeds.
    ch.side
        .qp
        .post_send(&SendWr::read(buf.at(0)).sge(lmr.sge(..)).wr_id(0))
        .unwrap();
    poll_ok(&ch.side.scq, 1);
    for i in 1..4 {
        ch.side
            .qp
            .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(i))
            .unwrap();
    }
    ch.side
        .qp
        .post_send(&SendWr::read(buf.at(64)).sge(lmr.sge(..)).wr_id(4))
        .unwrap();
    assert_quiet(&ch.side.scq, Duration::from_millis(100));
    let t = kill(&mut ch);
    let s = dead_peer_completions(&ch, 4, t, 1);
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc), "{s:?}");
    // Receives on the failed QP are flushed.
    ch.side.qp.post_recv(&RecvWr::new().wr_id(9)).unwrap();
    let r = poll1(&ch.side.rcq);
    assert_err(&r, Syndrome::WrFlush);
    drop((lmr, smr));
}

#[test]
fn child_killed_with_sends_waiting_on_rnr() {
    kill_during_rnr(Duration::from_millis(2), SHM);
}

#[test]
fn child_killed_during_rnr_wait_reports_retry_exceeded() {
    kill_during_rnr(Duration::from_millis(100), SHM);
}

#[test]
fn tcp_child_killed_with_sends_waiting_on_rnr() {
    kill_during_rnr(Duration::from_millis(2), TCP);
}

/// Kills the child (after a good read), waits `idle`, then posts three reads. They must
/// all fail within 2 s and move no data, the first with TRANSPORT_RETRY_EXC.
fn reads_after_kill(idle: Duration, peers: Peers) {
    let mut ch = Child::spawn("idle", &QpConfig::default(), peers);
    let buf = ch.buf;
    let pd = ch.side.pd.clone();
    let mut local = vec![0u8; 4096];
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    ch.side
        .qp
        .post_send(&SendWr::read(buf.at(0)).sge(lmr.sge(..)).wr_id(0))
        .unwrap();
    poll_ok(&ch.side.scq, 1);
    let mut got = vec![0u8; 4096];
    lmr.read_at(0, &mut got);
    assert!(got[..] == pattern(MEM_SEED, 4096)[..]);
    lmr.write_at(0, &[0u8; 4096]);
    kill(&mut ch);
    if !idle.is_zero() {
        ch.proc.wait().unwrap();
        std::thread::sleep(idle);
    }
    let t = Instant::now();
    for i in 1..4 {
        ch.side
            .qp
            .post_send(&SendWr::read(buf.at(0)).sge(lmr.sge(..)).wr_id(i))
            .unwrap();
    }
    let s = dead_peer_completions(&ch, 3, t, 1);
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc), "{s:?}");
    lmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "a read from a killed process returned data"
    );
    ch.side.qp.post_recv(&RecvWr::new().wr_id(9)).unwrap();
    assert_err(&poll1(&ch.side.rcq), Syndrome::WrFlush);
    // The parent's device still serves a healthy pair.
    let dev = ch.side.dev.clone();
    assert_healthy(&mut Pair::on(
        &dev,
        &dev,
        &QpConfig::default(),
        &QpConfig::default(),
    ));
    drop(lmr);
}

/// The child is killed; reads posted right afterwards fail within 2 s.
#[test]
fn child_killed_then_reads_posted() {
    reads_after_kill(Duration::ZERO, SHM);
}

/// Reads posted once the child's death has surely been noticed: the first must report why
/// (TRANSPORT_RETRY_EXC), not only WR_FLUSH.
#[test]
fn child_killed_then_reads_posted_later_report_retry_exceeded() {
    reads_after_kill(Duration::from_millis(100), SHM);
}

#[test]
fn tcp_child_killed_then_reads_posted() {
    reads_after_kill(Duration::ZERO, TCP);
}

#[test]
fn tcp_child_killed_then_reads_posted_later_report_retry_exceeded() {
    reads_after_kill(Duration::from_millis(100), TCP);
}

/// The child exits normally (its device closes the link): later work fails promptly.
#[test]
fn child_exits_then_read_fails() {
    exit_then_read_fails(SHM);
}

#[test]
fn tcp_child_exits_then_read_fails() {
    exit_then_read_fails(TCP);
}

fn exit_then_read_fails(peers: Peers) {
    let mut ch = Child::spawn("idle", &QpConfig::default(), peers);
    let buf = ch.buf;
    let pd = ch.side.pd.clone();
    let mut local = vec![0u8; 64];
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    ch.send("EXIT");
    ch.stdin = None;
    let st = ch.proc.wait().unwrap();
    assert!(st.success(), "{st:?}");
    let t = Instant::now();
    ch.side
        .qp
        .post_send(&SendWr::read(buf.at(0)).sge(lmr.sge(..)).wr_id(1))
        .unwrap();
    let s = dead_peer_completions(&ch, 1, t, 1);
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc));
    assert_eq!(ch.side.qp.state(), gdasync::gdsync::QpState::Error);
}

/// Reads are in flight to a child that cannot answer (stopped with SIGSTOP), then the child
/// is killed: every read completes within 2 s of the kill, the first with
/// TRANSPORT_RETRY_EXC, the rest with it or WR_FLUSH.
#[test]
fn child_killed_with_reads_in_flight() {
    kill_with_reads_in_flight(SHM);
}

#[test]
fn tcp_child_killed_with_reads_in_flight() {
    kill_with_reads_in_flight(TCP);
}

fn kill_with_reads_in_flight(peers: Peers) {
    let mut ch = Child::spawn("idle", &QpConfig::default(), peers);
    let buf = ch.buf;
    let pd = ch.side.pd.clone();
    let mut local = vec![0u8; 3 * 4096];
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let pid = ch.proc.id() as libc::pid_t;
    // SAFETY: signals our own child process, which is still running (not yet waited for).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_stopped(pid as u32);
    for i in 0..3u64 {
        let at = 4096 * i as usize;
        ch.side
            .qp
            .post_send(
                &SendWr::read(buf.at(at as u64))
                    .sge(lmr.sge(at..at + 4096))
                    .wr_id(i),
            )
            .unwrap();
    }
    // Stopped, the child answers nothing (and the QP timeout is 5 s).
    assert_quiet(&ch.side.scq, Duration::from_millis(100));
    let t = kill(&mut ch);
    let s = dead_peer_completions(&ch, 3, t, 0);
    assert_eq!(s[0], WcStatus::Error(Syndrome::TransportRetryExc), "{s:?}");
    let mut got = vec![0u8; 3 * 4096];
    lmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0),
        "a read from a stopped process returned data"
    );
}

/// Waits until every thread of process `pid` is stopped (a SIGSTOP is delivered
/// asynchronously).
fn wait_stopped(pid: u32) {
    let start = Instant::now();
    loop {
        let all_stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("child's /proc entry")
            .all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the parenthesised command name.
                stat.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with(['T', 't']))
            });
        if all_stopped {
            return;
        }
        assert!(start.elapsed() < TIMEOUT, "child {pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A peer process that stops answering (SIGSTOP) without dying: outstanding work fails with
/// TRANSPORT_RETRY_EXC once `QpConfig::timeout` passes without an answer.
#[test]
fn stopped_child_times_out() {
    stopped_times_out(SHM);
}

/// Over TCP the stopped process's connection stays open: the QP timeout still applies.
#[test]
fn tcp_stopped_child_times_out() {
    stopped_times_out(TCP);
}

fn stopped_times_out(peers: Peers) {
    let timeout = Duration::from_millis(300);
    let cfg = QpConfig {
        timeout,
        ..QpConfig::default()
    };
    let mut ch = Child::spawn("idle", &cfg, peers);
    let buf = ch.buf;
    let pd = ch.side.pd.clone();
    let mut local = vec![0u8; 64];
    let lmr = pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let pid = ch.proc.id();
    // SAFETY: signals our own child process, which is still running (not yet waited for).
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    let start = Instant::now();
    for i in 0..2 {
        ch.side
            .qp
            .post_send(&SendWr::read(buf.at(0)).sge(lmr.sge(..)).wr_id(i))
            .unwrap();
    }
    let c = poll_n(&ch.side.scq, 2);
    let elapsed = start.elapsed();
    assert_err(&c[0], Syndrome::TransportRetryExc);
    assert_err(&c[1], Syndrome::WrFlush);
    assert_eq!((c[0].wr_id, c[1].wr_id), (0, 1));
    assert!(
        elapsed >= timeout,
        "failed after {elapsed:?}, before the timeout"
    );
    drop(lmr);
    // Drop kills the stopped child.
}

on_mlx5! {
    /// Every operation between two processes' libmlx5 QPs, their soft HCAs linked over
    /// shared memory.
    fn mlx5_every_operation_across_processes() {
        every_operation(MLX5_SHM);
    }

    /// The same with the soft HCAs linked over TCP.
    fn mlx5_every_operation_over_tcp() {
        every_operation(MLX5_TCP);
    }

    fn mlx5_child_killed_with_sends_waiting_on_rnr() {
        kill_during_rnr(Duration::from_millis(2), MLX5_SHM);
    }

    fn mlx5_child_killed_then_reads_posted() {
        reads_after_kill(Duration::ZERO, MLX5_SHM);
    }

    fn mlx5_child_killed_then_reads_posted_later_report_retry_exceeded() {
        reads_after_kill(Duration::from_millis(100), MLX5_SHM);
    }

    fn mlx5_tcp_child_killed_then_reads_posted() {
        reads_after_kill(Duration::ZERO, MLX5_TCP);
    }

    fn mlx5_child_exits_then_read_fails() {
        exit_then_read_fails(MLX5_SHM);
    }

    fn mlx5_child_killed_with_reads_in_flight() {
        kill_with_reads_in_flight(MLX5_SHM);
    }

    /// A peer that stopped answering fails the work after the QP's timeout (split over the
    /// tries by the RTS attributes, so at least the timeout and less than twice it).
    fn mlx5_stopped_child_times_out() {
        stopped_times_out(MLX5_SHM);
    }
}

// ---------------------------------------------------------------------------- unreachable

/// A peer "on another host" whose address is its loopback interface, or cannot be reached at
/// all, or that has no address: connect fails with `Unreachable`, naming the address,
/// within a bounded time (the TCP connect timeout is 5 s). The messages are printed for a
/// reader to judge.
#[test]
fn tcp_unreachable_peer_is_a_clear_error() {
    let dev = Device::soft().unwrap();
    let mine = Side::new(&dev, &QpConfig::default()).qp.endpoint();
    // A loopback port of "another host": refused before any dial.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let far = |addr: Option<&str>| Endpoint {
        host: mine.host ^ 1,
        pid: 1,
        // Larger than any device id here, so this side dials.
        device: u64::MAX,
        qpn: 1,
        addr: addr.map(|a| a.parse().unwrap()),
        link: LinkPolicy::Auto,
        port: None,
    };
    let refused = closed.to_string();
    for (ep, says) in [
        (far(Some(&refused)), refused.as_str()),
        // Reserved for documentation (RFC 5737): never answers, or has no route.
        (far(Some("192.0.2.1:9")), "192.0.2.1:9"),
        // Neither side listens (this process has the default policy).
        (far(None), "nor this process accepts TCP links"),
    ] {
        let mut s = Side::new(&dev, &QpConfig::default());
        let t = Instant::now();
        let e = s.qp.connect(&ep).unwrap_err();
        let took = t.elapsed();
        println!("{took:?}: {e}");
        assert!(
            matches!(&e, Error::Unreachable(m) if m.contains(says)),
            "{ep}: {e}"
        );
        assert!(
            took < Duration::from_secs(10),
            "{ep}: failed after {took:?}"
        );
        assert_eq!(s.qp.state(), gdasync::gdsync::QpState::Init, "{ep}");
    }
}

/// An invalid `GDSYNC_SOFT_LINK` makes `connect` fail with a message naming the variable and
/// the values it takes (the policy is read once per process, hence a child).
#[test]
fn invalid_link_policy_is_a_clear_error() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "connect-self")
        .env("GDSYNC_SOFT_LINK", "infiniband")
        .stdin(Stdio::null())
        .output()
        .expect("run child");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(TAG).map(|(_, m)| m.to_string()))
        .expect("a report from the child");
    assert!(
        line.starts_with("ERR invalid argument: GDSYNC_SOFT_LINK=\"infiniband\"")
            && line.contains("auto")
            && line.contains("shm")
            && line.contains("tcp"),
        "{line}"
    );
}

/// Mappings of this process's link files that name device `uid`.
fn link_mappings(uid: u64) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let name = format!("{uid:016x}");
    (maps.lines())
        .filter(|l| l.contains("gdsync-link-") && l.contains(&name))
        .count()
}

/// Child processes come and go against one long-lived device (each links through a
/// shared-memory file, takes 1 MiB of RDMA writes and exits): the device lets go of each
/// link's mapping once the child is gone, and still serves a new child.
/// (`GDSYNC_LINK_CHURN_PROCS` sets the number of children.)
#[test]
fn links_to_exited_children_are_unmapped() {
    let n = env_or("GDSYNC_LINK_CHURN_PROCS", 4) as usize;
    let dev = Device::soft().unwrap();
    let uid = dev.info().uid;
    let mut src = pattern(7, 1 << 20);
    for i in 0..n {
        let mut ch = Child::spawn_on(&dev, "responder", &QpConfig::default(), SHM);
        assert_eq!(link_mappings(uid), 1, "child {i}: its link is mapped");
        let mr = ch.side.pd.register(&mut src, Access::empty()).unwrap();
        let wr = SendWr::write(ch.buf.at(0)).sge(mr.sge(..)).wr_id(1);
        ch.side.qp.post_send(&wr).unwrap();
        assert!(poll1(&ch.side.scq).is_ok());
        drop(mr);
        assert_eq!(ch.hash(0, 1 << 20), checksum(&src), "child {i}");
        ch.finish();
        let start = Instant::now();
        while link_mappings(uid) != 0 && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            link_mappings(uid),
            0,
            "child {i} exited 2 s ago: its link file is still mapped"
        );
    }
}
