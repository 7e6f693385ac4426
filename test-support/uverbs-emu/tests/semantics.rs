//! The emulated HCA behaves as a ConnectX does where a verbs program looks, checked through
//! plain libibverbs calls: `tests/verbs_semantics.c`, built here with the system C compiler
//! and run under `scripts/with-emulated-hca` (each process under its own emulator, with the
//! soft HCA every verbs program gets). Faithful queries; QP access flags enforced by the
//! responder; rings at a sub-page offset; RTR that never waits for the peer (links form
//! lazily); and a peer's clean exit that leaves the survivor's receives posted. Ignored where
//! libibverbs' headers are not installed (`apt-get install libibverbs-dev`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::OnceLock;
use std::time::Duration;

/// `ibv_wc_status` values.
const WC_SUCCESS: i32 = 0;
const WC_RETRY_EXC_ERR: i32 = 12;
/// `ibv_qp_state` RTS.
const QPS_RTS: i32 = 3;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The emulator's runner (built once, with the soft HCA library beside it, by
/// `scripts/with-emulated-hca`) and the checks program (built once with `cc`). On a machine
/// without cargo or a C compiler, prebuilt copies are named by `UVEMU_EMULATOR` and
/// `UVEMU_SEMANTICS_PROGRAM` (both must be set).
fn tools() -> &'static (PathBuf, PathBuf) {
    static T: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    T.get_or_init(|| {
        let prebuilt = (
            std::env::var_os("UVEMU_EMULATOR"),
            std::env::var_os("UVEMU_SEMANTICS_PROGRAM"),
        );
        if let (Some(emu), Some(exe)) = prebuilt {
            return (PathBuf::from(emu), PathBuf::from(exe));
        }
        let built = Command::new(root().join("scripts/with-emulated-hca"))
            .arg("true")
            .status()
            .unwrap();
        assert!(built.success(), "scripts/with-emulated-hca could not build");
        let meta = Command::new("cargo")
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(root())
            .output()
            .unwrap();
        let meta = String::from_utf8(meta.stdout).unwrap();
        let key = "\"target_directory\":\"";
        let at = meta
            .find(key)
            .expect("cargo metadata names the target directory")
            + key.len();
        let target = PathBuf::from(&meta[at..at + meta[at..].find('"').unwrap()]);
        let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs_semantics");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/verbs_semantics.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(cc)
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "building {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        (target.join("release/with-emulated-hca"), exe)
    })
}

/// Runs `verbs_semantics MODE` under its own emulator: its output, having checked it passed.
fn check(mode: &str) -> String {
    let (emu, exe) = tools();
    let out = Command::new(emu).arg(exe).arg(mode).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "verbs_semantics {mode}:\n{text}");
    assert!(!text.contains("FAIL"), "verbs_semantics {mode}:\n{text}");
    text
}

#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn queries_agree_with_sysfs_and_the_capabilities() {
    check("query");
}

/// Two emulators at once (two nodes of the fabric): two node GUIDs.
#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn node_guids_are_unique_across_emulators() {
    let (mut a, mut b) = (Peer::start(), Peer::start());
    let (ga, gb) = (a.ask("guid", PROMPT), b.ask("guid", PROMPT));
    assert!(ga.starts_with("guid "), "{ga}");
    assert_ne!(ga, gb, "two emulators gave one node GUID");
    Peer::exit_both(a, b);
}

#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn a_responder_refuses_what_its_qp_access_flags_do_not_grant() {
    check("access");
}

#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn a_qp_ring_at_a_sub_page_offset_moves_data() {
    check("offset");
}

#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn qps_of_thread_domains_ring_their_dedicated_uar_registers() {
    check("td");
}

/// One `verbs_semantics peer` process under its own emulator, driven line by line.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Its QP number and GID, as `peer` takes them.
    addr: String,
}

impl Peer {
    fn start() -> Peer {
        let (emu, exe) = tools();
        let mut child = Command::new(emu)
            .arg(exe)
            .arg("peer")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut p = Peer {
            child,
            stdin,
            lines,
            addr: String::new(),
        };
        let first = p.answer(Duration::from_secs(30));
        p.addr = first
            .strip_prefix("addr ")
            .unwrap_or_else(|| panic!("the peer said {first:?}"))
            .to_string();
        p
    }

    fn answer(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no answer within {within:?}"))
    }

    /// Sends `cmd`, returns the answer (which must come `within`).
    fn ask(&mut self, cmd: &str, within: Duration) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        let a = self.answer(within);
        assert!(!a.starts_with("FAIL"), "{cmd}: {a}");
        a
    }

    fn exit_both(a: Peer, b: Peer) {
        a.exit();
        b.exit();
    }

    fn exit(mut self) {
        writeln!(self.stdin, "exit").unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the peer exited with {st}");
    }
}

const PROMPT: Duration = Duration::from_secs(5);

/// Two peers that know each other's address.
fn introduced() -> (Peer, Peer) {
    let (mut a, mut b) = (Peer::start(), Peer::start());
    let (aa, ba) = (a.addr.clone(), b.addr.clone());
    a.ask(&format!("peer {ba}"), PROMPT);
    b.ask(&format!("peer {aa}"), PROMPT);
    (a, b)
}

/// `first` goes to RTR and RTS and posts a send while `second` is still in INIT: its RTR
/// returns at once (a ConnectX's does; it used to wait up to 30 s for the peer's link when
/// its device's id was the larger), and the send completes once `second` is ready.
fn rtr_before_the_peer(first: &mut Peer, second: &mut Peer) {
    let took = first.ask("rtr", PROMPT);
    let ms: f64 = took.strip_prefix("rtr ").unwrap().parse().unwrap();
    assert!(ms < 1000.0, "RTR took {ms} ms, waiting for the peer");
    first.ask("rts", PROMPT);
    first.ask("post", PROMPT);
    second.ask("rtr", PROMPT);
    second.ask("rts", PROMPT);
    let sent = first.ask("wait", Duration::from_secs(15));
    assert_eq!(sent, format!("send {WC_SUCCESS}"));
    let got = second.ask("recv", Duration::from_secs(10));
    assert_eq!(got, format!("recv {WC_SUCCESS}"));
}

/// Both orders, twice: which of two devices used to wait depends on their random ids.
#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn rtr_never_waits_for_the_peer() {
    for round in 0..4 {
        let (mut a, mut b) = introduced();
        match round % 2 {
            0 => rtr_before_the_peer(&mut a, &mut b),
            _ => rtr_before_the_peer(&mut b, &mut a),
        }
        Peer::exit_both(a, b);
    }
}

/// After a send between them, the peer exits cleanly: the survivor's receives stay posted
/// (no completion, the QP still in RTS), and only a send it posts then fails, with transport
/// retries exceeded.
#[test]
#[cfg_attr(
    not(verbs_dev),
    ignore = "needs libibverbs-dev and rdma-core's providers"
)]
fn a_peers_clean_exit_leaves_the_survivors_receives_posted() {
    let (mut a, mut b) = introduced();
    for p in [&mut a, &mut b] {
        p.ask("rtr", PROMPT);
    }
    for p in [&mut a, &mut b] {
        p.ask("rts", PROMPT);
    }
    a.ask("post", PROMPT);
    assert_eq!(a.ask("wait", PROMPT), format!("send {WC_SUCCESS}"));
    assert_eq!(b.ask("recv", PROMPT), format!("recv {WC_SUCCESS}"));
    b.exit();
    assert_eq!(
        a.ask("quiet 500", PROMPT),
        format!("quiet 0 {QPS_RTS}"),
        "receive completions and the QP state after the peer's exit"
    );
    a.ask("post", PROMPT);
    assert_eq!(
        a.ask("wait", Duration::from_secs(15)),
        format!("send {WC_RETRY_EXC_ERR}")
    );
    a.exit();
}
