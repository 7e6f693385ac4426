//! Hostile load on this process's TCP listener: a peer (with the job's secret) that floods
//! requests and never reads the answers, and many connections that say nothing. The victim's
//! memory and threads stay bounded and its other links keep serving. CI runs short versions;
//! `GDSYNC_FLOOD_SECS` and `GDSYNC_IDLE_CONNS` make them longer (figures in
//! `docs/reliability.md`).

use super::soft::tcp::{Answer, Hello, ANSWER_LEN, FRAME_HDR};
use super::tcp_tests::{assert_pair_works, connect, side};
use super::*;
use std::io::{Read, Write};
use std::time::Duration;

/// A field of `/proc/self/status` (kB for sizes).
fn proc_status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A request frame for a QP that does not exist: each one earns a NAK.
fn junk_request() -> [u8; FRAME_HDR] {
    let mut b = [0u8; FRAME_HDR];
    b[..4].copy_from_slice(b"GDSF");
    b[4..7].copy_from_slice(&[1, crate::format::Opcode::RdmaWrite as u8, 3]);
    b[8..12].copy_from_slice(&0x00FF_FFFFu32.to_le_bytes());
    b
}

/// Opens a link to device `target` as device `dialer`, as a real peer would (with the job's
/// secret), and returns the socket once accepted.
fn dial_raw(addr: SocketAddr, dialer: u64, target: u64) -> TcpStream {
    let hello = Hello::new(dialer, target, host_id(), 1).to_bytes();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello).unwrap();
    let secret = crate::auth::job_secret().unwrap();
    crate::auth::dial(&mut s, &secret, b"gdsync soft-device TCP link", &hello).unwrap();
    let mut a = [0u8; ANSWER_LEN];
    s.read_exact(&mut a).unwrap();
    assert_eq!(Answer::code_of(&a), Some(Answer::Accepted as u32));
    s
}

/// A peer floods a device with requests (each answered by a NAK) and reads nothing back, for
/// `GDSYNC_FLOOD_SECS` (2 s here): the victim's resident memory grows by less than 256 MB
/// (it grew by gigabytes: answers queued without bound), and its link to another device keeps
/// carrying data meanwhile and after.
#[test]
fn a_peer_that_floods_without_reading_is_held_back() {
    let secs = env_or("GDSYNC_FLOOD_SECS", 2);
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let addr = accept_tcp_links(None).unwrap();
    let rss0 = proc_status("VmRSS:");
    let mut flood = dial_raw(addr, 0xF100_D000_0000_0001, a.dev.shared.uid);
    flood
        .set_write_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let frames: Vec<u8> = junk_request().repeat(4096);
    let stop = Instant::now() + Duration::from_secs(secs);
    let sent = std::thread::spawn(move || {
        let mut sent = 0u64;
        while Instant::now() < stop {
            // A full socket times out the write: the victim stopped reading, as it should.
            if let Ok(n) = flood.write(&frames) {
                sent += n as u64;
            }
        }
        (sent, flood)
    });
    let mut rounds = 0;
    while Instant::now() < stop {
        assert_pair_works(&mut a, &mut b);
        rounds += 1;
    }
    let (sent, flood) = sent.join().unwrap();
    let rss1 = proc_status("VmRSS:");
    println!(
        "flood of {secs} s: {} MB of requests sent, resident memory {} -> {} MB, {rounds} rounds on the other link",
        sent >> 20,
        rss0 >> 10,
        rss1 >> 10
    );
    assert!(
        rss1.saturating_sub(rss0) < 256 << 10,
        "resident memory grew from {rss0} kB to {rss1} kB"
    );
    assert!(rounds > 0);
    drop(flood);
    assert_pair_works(&mut a, &mut b);
}

/// `GDSYNC_IDLE_CONNS` connections (300 here) that never finish their handshake: the listener
/// serves at most `MAX_HANDSHAKES` at once (a thread each) and closes the rest at once; a new
/// link is set up meanwhile.
#[test]
fn idle_connections_cost_bounded_threads() {
    let n = env_or("GDSYNC_IDLE_CONNS", 300) as usize;
    let addr = accept_tcp_links(None).unwrap();
    let threads0 = proc_status("Threads:");
    let idle: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // The listener has seen them all once a connection made after them is answered.
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    assert_pair_works(&mut a, &mut b);
    let threads1 = proc_status("Threads:");
    println!(
        "{n} idle connections: threads {threads0} -> {threads1}, resident memory {} MB",
        proc_status("VmRSS:") >> 10
    );
    // Other tests of this process start threads too: the bound has room for them.
    assert!(
        threads1 < threads0 + listen::MAX_HANDSHAKES as u64 + 48,
        "threads {threads0} -> {threads1}"
    );
    drop(idle);
}
