//! Two processes, each under its own emulated driver (a node of the emulators' fabric) with
//! real libmlx5 QPs, linked to each other: they exchange QPN, GID and buffer out of band
//! (through the test process, on their stdin and stdout), connect with `ibv_modify_qp`, and
//! then a send, an RDMA write, a read and atomics posted with libmlx5's `ibv_post_send` run
//! between them, completions read with `ibv_poll_cq` and the data checked on both sides. When
//! the peer's process is killed, the survivor's work completes in error, promptly.
//!
//! The test process starts the same test twice as children (roles `a` and `b`); ignored where
//! rdma-core is not installed.

mod common;

use common::child::{say, stdin_lines, tagged_lines};
use gdsync::mlx5::{
    serve_emulated_driver, Context, Cq, Gid, LinkLayer, Mr, Qp, QpCaps, RemoteQp, RtrAttr, RtsAttr,
    VerbsCompletion,
};
use gdsync::{Access, RecvWr, RemoteAddr, SendWr};
use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uverbs_emu::Emulator;

/// Which side a child plays (`a` posts, `b` is the target); unset in the test process.
const ROLE: &str = "GDASYNC_MLX5_PROCS_ROLE";
/// What starts the children's lines meant for the test process.
const TAG: &str = "mlx5-procs: ";
const BUF_LEN: usize = 1 << 16;
/// `ibv_wc_opcode` and `ibv_wc_status` values.
const WC_SEND: u32 = 0;
const WC_RDMA_WRITE: u32 = 1;
const WC_RDMA_READ: u32 = 2;
const WC_COMP_SWAP: u32 = 3;
const WC_FETCH_ADD: u32 = 4;
const WC_RECV: u32 = 128;
const WC_SUCCESS: u32 = 0;
/// A hang guard for the steps that should take milliseconds, not a measure.
const PATIENCE: Duration = Duration::from_secs(30);
/// How soon the survivor's work must fail once its peer's process is gone.
const PEER_LOSS_LIMIT: Duration = Duration::from_secs(2);

fn pattern(seed: u8, off: usize) -> u8 {
    (off as u8).wrapping_mul(31).wrapping_add(seed)
}

/// A child's QP, CQ and registered buffer (filled with its role's pattern).
struct Side {
    qp: Qp,
    cq: Arc<Cq>,
    mr: Mr<'static>,
    /// The peer's buffer.
    remote: RemoteAddr,
}

impl Side {
    fn peek(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= BUF_LEN);
        // SAFETY: inside the leaked, registered buffer; the HCA wrote it before the
        // completion that was polled.
        unsafe { std::slice::from_raw_parts((self.mr.addr() as usize + off) as *const u8, len) }
            .to_vec()
    }

    fn post(&self, wr: SendWr) {
        // SAFETY: every SGE lies in the leaked, registered buffer; remote addresses in the
        // peer's.
        unsafe { self.qp.verbs_post_send(&[wr]) }.unwrap();
    }

    /// The peer's buffer at `off`.
    fn there(&self, off: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.remote.addr + off,
            ..self.remote
        }
    }

    /// The next completion, or `None` after `limit`.
    fn next_within(&self, limit: Duration) -> Option<VerbsCompletion> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(c) = self.cq.verbs_poll(1).unwrap().pop() {
                return Some(c);
            }
            std::thread::yield_now();
        }
        None
    }

    #[track_caller]
    fn expect(&self, wr_id: u64, opcode: u32, byte_len: Option<u32>) {
        let c = self.next_within(PATIENCE).expect("a completion");
        assert_eq!(
            (c.status, c.wr_id, c.opcode),
            (WC_SUCCESS, wr_id, opcode),
            "{c:?}"
        );
        if let Some(len) = byte_len {
            assert_eq!(c.byte_len, len, "{c:?}");
        }
    }
}

/// A GID as 32 hex digits; `-` for none.
fn gid_hex(g: Option<Gid>) -> String {
    match g {
        Some(g) => g.0.iter().map(|b| format!("{b:02x}")).collect(),
        None => "-".into(),
    }
}

fn parse_gid(s: &str) -> Option<Gid> {
    if s == "-" {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    Some(Gid(g))
}

/// In a child: a QP on `mlx5_0` of its emulator, its address told to the test process (the
/// GID on RoCE, the LID alone on InfiniBand), then connected to the peer's address the test
/// process relays on stdin.
fn connect(seed: u8, input: &Receiver<String>) -> Side {
    // The soft HCAs' warnings (a link down, a refused RTR) on stderr, which the test shows;
    // colour only on a terminal (not in a CI log).
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    serve_emulated_driver().unwrap();
    let ctx = Context::open("mlx5_0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let port = ctx.query_port(1).unwrap();
    let gid = ctx.choose_gid(1, None).unwrap().entry;
    let global = port.link_layer != LinkLayer::InfiniBand;
    let cq = ctx.create_cq(64).unwrap();
    let caps = QpCaps {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..QpCaps::default()
    };
    let qp = pd.create_qp(&cq, &cq, &caps).unwrap();
    let buf: &'static mut [u8] = Vec::leak((0..BUF_LEN).map(|i| pattern(seed, i)).collect());
    let mr = pd.reg_mr(buf, Access::ALL).unwrap();
    qp.to_init(1, Access::ALL).unwrap();
    say(
        TAG,
        format_args!(
            "qp {} {} {} {} {}",
            qp.qpn(),
            gid_hex(global.then_some(gid.gid)),
            port.lid,
            mr.addr(),
            mr.rkey()
        ),
    );
    let line = input.recv_timeout(PATIENCE).expect("the peer's address");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f.len(), f[0]), (6, "qp"), "{line}");
    let remote = RemoteQp {
        qpn: f[1].parse().unwrap(),
        psn: 0,
        lid: f[3].parse().unwrap(),
        gid: parse_gid(f[2]),
    };
    qp.to_rtr(&RtrAttr {
        sgid_index: gid.index as u8,
        ..RtrAttr::new(remote, 1, port.active_mtu)
    })
    .unwrap();
    qp.to_rts(&RtsAttr::default()).unwrap();
    let remote = RemoteAddr {
        addr: f[4].parse().unwrap(),
        rkey: f[5].parse().unwrap(),
    };
    Side { qp, cq, mr, remote }
}

/// Waits for line `want` from the test process.
fn wait_for(input: &Receiver<String>, want: &str) {
    let got = input.recv_timeout(PATIENCE).unwrap();
    assert_eq!(got, want);
}

/// A child of the test process: the test binary running test `name` in role `role`, under
/// an emulator of its own.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    _emu: Emulator,
}

impl Peer {
    /// Starts it under an emulator of `how.devices` ([`uverbs_emu::parse_devices`]), with
    /// `GDSYNC_SOFT_LINK=how.link` (the soft devices' link policy) and the job secret both
    /// children share (a TCP link proves it).
    fn start(name: &str, role: &str, how: How) -> Peer {
        let emu = common::emulator(how.devices);
        let mut child = emu
            .command(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("GDSYNC_SOFT_LINK", how.link)
            .env(gdsync::auth::SECRET_ENV, "5a".repeat(32))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = tagged_lines(child.stdout.take().unwrap(), TAG);
        Peer {
            child,
            stdin,
            lines,
            _emu: emu,
        }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .expect("a line from the child (did it fail? its stderr is above)")
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the child to say it passed (printing what it says before) and to exit.
    fn passed(mut self) {
        loop {
            match self.line().as_str() {
                "passed" => break,
                other => eprintln!("child: {other}"),
            }
        }
        assert!(self.child.wait().unwrap().success());
    }
}

/// How the children run: their emulated device and their link policy.
#[derive(Clone, Copy)]
struct How {
    devices: &'static str,
    link: &'static str,
}

/// `mlx5_0` with a RoCE port; the soft devices link through shared memory.
const ROCE: How = How {
    devices: "mlx5_0",
    link: "auto",
};

/// In the test process: starts roles `a` and `b` of test `name` and relays their addresses.
/// In a child: its role, as the error.
fn pair(name: &str, how: How) -> Result<(Peer, Peer), String> {
    if let Ok(role) = std::env::var(ROLE) {
        return Err(role);
    }
    let (mut a, mut b) = (Peer::start(name, "a", how), Peer::start(name, "b", how));
    let (from_a, from_b) = (a.line(), b.line());
    a.tell(&from_b);
    b.tell(&from_a);
    Ok((a, b))
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_two_processes_under_emulated_drivers_exchange_work() {
    exchange(
        "mlx5_two_processes_under_emulated_drivers_exchange_work",
        ROCE,
    );
}

/// As above, on InfiniBand ports, the peer named by its LID alone (no global header).
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_two_processes_under_emulated_drivers_exchange_work_by_lid() {
    let ib = How {
        devices: "mlx5_0:ib",
        ..ROCE
    };
    exchange(
        "mlx5_two_processes_under_emulated_drivers_exchange_work_by_lid",
        ib,
    );
}

/// As above, the soft HCAs linked over TCP (as between hosts) instead of shared memory.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_two_processes_under_emulated_drivers_exchange_work_over_tcp() {
    exchange(
        "mlx5_two_processes_under_emulated_drivers_exchange_work_over_tcp",
        How {
            link: "tcp",
            ..ROCE
        },
    );
}

/// Test `name`: a send, a write, a read and two atomics from `a` to `b`.
fn exchange(name: &str, how: How) {
    let role = match pair(name, how) {
        Ok((mut a, mut b)) => {
            // b posted its receive and set its atomic word: a may start.
            assert_eq!(b.line(), "ready");
            a.tell("go");
            assert_eq!(a.line(), "done");
            b.tell("check");
            a.passed();
            b.passed();
            return;
        }
        Err(role) => role,
    };
    let input = stdin_lines();
    let word = 16384usize;
    if role == "b" {
        let s = connect(2, &input);
        // SAFETY: the receive's SGEs lie in the leaked, registered buffer.
        unsafe {
            s.qp.verbs_post_recv(&[RecvWr::new()
                .wr_id(100)
                .sge(s.mr.sge(0, 30))
                .sge(s.mr.sge(100, 70))])
        }
        .unwrap();
        let at = (s.mr.addr() as usize + word) as *mut u64;
        // SAFETY: an aligned word of the buffer, which no work touches yet.
        unsafe { at.write(10) };
        say(TAG, "ready");
        s.expect(100, WC_RECV, Some(60));
        wait_for(&input, "check");
        let a_bytes = |off: usize, len: usize| (off..off + len).map(|i| pattern(1, i));
        let sent: Vec<u8> = a_bytes(0, 20).chain(a_bytes(50, 40)).collect();
        assert_eq!([s.peek(0, 30), s.peek(100, 30)].concat(), sent, "the send");
        assert_eq!(s.peek(4096, 100), a_bytes(0, 100).collect::<Vec<_>>());
        assert_eq!(s.peek(word, 8), 99u64.to_ne_bytes(), "the atomics");
    } else {
        let s = connect(1, &input);
        wait_for(&input, "go");
        let sges = [s.mr.sge(0, 20), s.mr.sge(50, 40)];
        s.post(SendWr::send().wr_id(1).sge(sges[0]).sge(sges[1]));
        s.expect(1, WC_SEND, None);
        s.post(SendWr::write(s.there(4096)).wr_id(2).sge(s.mr.sge(0, 100)));
        s.expect(2, WC_RDMA_WRITE, None);
        s.post(
            SendWr::read(s.there(12288))
                .wr_id(3)
                .sge(s.mr.sge(20000, 200)),
        );
        s.expect(3, WC_RDMA_READ, Some(200));
        let b_bytes: Vec<u8> = (12288..12288 + 200).map(|i| pattern(2, i)).collect();
        assert_eq!(s.peek(20000, 200), b_bytes, "the read");
        let target = s.there(word as u64);
        s.post(
            SendWr::fetch_add(target, 5)
                .wr_id(4)
                .sge(s.mr.sge(30000, 8)),
        );
        s.expect(4, WC_FETCH_ADD, Some(8));
        s.post(
            SendWr::compare_swap(target, 15, 99)
                .wr_id(5)
                .sge(s.mr.sge(30008, 8)),
        );
        s.expect(5, WC_COMP_SWAP, Some(8));
        assert_eq!(s.peek(30000, 8), 10u64.to_ne_bytes(), "fetched by the add");
        assert_eq!(s.peek(30008, 8), 15u64.to_ne_bytes(), "fetched by the swap");
        say(TAG, "done");
    }
    say(TAG, "passed");
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_a_killed_peer_process_fails_the_survivors_work() {
    let role = match pair("mlx5_a_killed_peer_process_fails_the_survivors_work", ROCE) {
        Ok((mut a, mut b)) => {
            // Both linked (the second to connect maps what the first set up): b may go.
            assert_eq!(
                (a.line(), b.line()),
                ("connected".into(), "connected".into())
            );
            b.child.kill().unwrap();
            b.child.wait().unwrap();
            a.tell("killed");
            a.passed();
            return;
        }
        Err(role) => role,
    };
    let input = stdin_lines();
    let s = connect(if role == "a" { 1 } else { 2 }, &input);
    say(TAG, "connected");
    if role == "b" {
        // Killed here by the test process.
        std::thread::sleep(PATIENCE);
        panic!("b was not killed");
    }
    wait_for(&input, "killed");
    let start = Instant::now();
    s.post(SendWr::write(s.there(0)).wr_id(7).sge(s.mr.sge(0, 64)));
    let c = s
        .next_within(PEER_LOSS_LIMIT)
        .unwrap_or_else(|| panic!("no completion {PEER_LOSS_LIMIT:?} after the peer died"));
    assert_eq!(c.wr_id, 7, "{c:?}");
    assert_ne!(c.status, WC_SUCCESS, "a write to a dead peer: {c:?}");
    say(TAG, format_args!("failed in {:?}: {c:?}", start.elapsed()));
    say(TAG, "passed");
}
