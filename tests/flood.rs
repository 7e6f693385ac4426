//! Hostile load on this process's listener for soft-device TCP links: a peer (with the job's
//! secret) that floods requests and never reads the answers, and many connections that say
//! nothing. The victim's memory and threads stay bounded and its other links keep serving. CI
//! runs short versions; `GDSYNC_FLOOD_SECS` and `GDSYNC_IDLE_CONNS` make them longer (figures
//! in `docs/reliability.md`). A file of its own: the measures are of the whole process, and the
//! listener is one per process.

mod common;

use common::*;
use gdasync::gdsync::{accept_tcp_links, auth, host_id, Device, Endpoint, LinkPolicy, QpConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests here measure the process and load its one listener: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

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

/// Two devices of this process linked over TCP (through this process's listener).
fn tcp_pair() -> Pair {
    accept_tcp_links(None).unwrap();
    let cfg = QpConfig::default();
    let mut a = Side::new(&Device::soft().unwrap(), &cfg);
    let mut b = Side::new(&Device::soft().unwrap(), &cfg);
    let tcp = |s: &Side| Endpoint {
        link: LinkPolicy::Tcp,
        ..s.qp.endpoint()
    };
    let (ea, eb) = (tcp(&a), tcp(&b));
    a.qp.connect(&eb).unwrap();
    b.qp.connect(&ea).unwrap();
    Pair { a, b }
}

/// A TCP link's hello (`docs/soft-device.md`): `dialer` asks for a link to `target`.
fn hello(dialer: u64, target: u64) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[..8].copy_from_slice(b"GDSTCP01");
    b[8..16].copy_from_slice(&dialer.to_le_bytes());
    b[16..24].copy_from_slice(&target.to_le_bytes());
    b[24..32].copy_from_slice(&host_id().to_le_bytes());
    b[32..36].copy_from_slice(&1u32.to_le_bytes());
    b[36..40].copy_from_slice(&65536u32.to_le_bytes());
    b[40] = if cfg!(target_endian = "little") { 1 } else { 2 };
    b
}

/// Opens a link to device `target` as a made-up device, as a real peer would (with the job's
/// secret), and returns the socket once accepted.
fn dial_raw(addr: SocketAddr, target: u64) -> TcpStream {
    let hello = hello(0xF100_D000_0000_0001, target);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello).unwrap();
    let secret = auth::job_secret().unwrap();
    auth::dial(&mut s, &secret, b"gdsync soft-device TCP link", &hello).unwrap();
    let mut answer = [0u8; 16];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[..12], b"GDSTCP01\0\0\0\0", "not accepted");
    s
}

/// Frames of RDMA-write requests for a QP that does not exist: each one earns a NAK.
fn junk_requests(n: usize) -> Vec<u8> {
    let mut f = [0u8; 48];
    f[..4].copy_from_slice(b"GDSF");
    f[4..7].copy_from_slice(&[1, 0x08, 3]); // request, RDMA write, first and last
    f[8..12].copy_from_slice(&0x00FF_FFFFu32.to_le_bytes());
    f.repeat(n)
}

/// A peer floods a device with requests and reads nothing back, for `GDSYNC_FLOOD_SECS` (2 s
/// here): the victim's resident memory grows by less than 256 MB (it grew by gigabytes:
/// answers queued without bound), and its link to another device keeps carrying data
/// meanwhile and after.
#[test]
fn a_peer_that_floods_without_reading_is_held_back() {
    let _alone = alone();
    let secs = env_or("GDSYNC_FLOOD_SECS", 2);
    let mut victim = tcp_pair();
    let addr = accept_tcp_links(None).unwrap();
    let rss0 = proc_status("VmRSS:");
    let mut flood = dial_raw(addr, victim.a.dev.info().uid);
    flood
        .set_write_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let frames = junk_requests(4096);
    let stop = Instant::now() + Duration::from_secs(secs);
    let flooder = std::thread::spawn(move || {
        let mut sent = 0u64;
        while Instant::now() < stop {
            // A full socket times the write out: the victim stopped reading, as it should.
            if let Ok(n) = flood.write(&frames) {
                sent += n as u64;
            }
        }
        (sent, flood)
    });
    let mut rounds = 0;
    while Instant::now() < stop {
        assert_healthy(&mut victim);
        rounds += 1;
    }
    let (sent, flood) = flooder.join().unwrap();
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
    assert_healthy(&mut victim);
}

/// `GDSYNC_IDLE_CONNS` connections (300 here) that never finish their handshake: the listener
/// serves at most 64 at once (a thread each), closing the oldest for each new one; a new link
/// is set up meanwhile.
#[test]
fn idle_connections_cost_bounded_threads() {
    let _alone = alone();
    let n = env_or("GDSYNC_IDLE_CONNS", 300) as usize;
    let addr = accept_tcp_links(None).unwrap();
    let threads0 = proc_status("Threads:");
    let idle: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut p = tcp_pair();
    assert_healthy(&mut p);
    let threads1 = proc_status("Threads:");
    println!(
        "{n} idle connections: threads {threads0} -> {threads1}, resident memory {} MB",
        proc_status("VmRSS:") >> 10
    );
    // 64 handshakes, the new pair's engines and link threads, and room for the test harness.
    assert!(
        threads1 < threads0 + 64 + 16,
        "threads {threads0} -> {threads1}"
    );
    drop(idle);
}

/// Completes the listener's handshake as a job member would and returns the answer's code
/// (0 accepted, 1 no such device, 5 too many links; `docs/soft-device.md`), or `None` if the
/// listener closed the connection first.
fn hello_answer(addr: SocketAddr, dialer: u64, target: u64) -> Option<u32> {
    let hello = hello(dialer, target);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello).ok()?;
    let secret = auth::job_secret().unwrap();
    auth::dial(&mut s, &secret, b"gdsync soft-device TCP link", &hello).ok()?;
    let mut answer = [0u8; 16];
    s.read_exact(&mut answer).ok()?;
    Some(u32::from_le_bytes(answer[8..12].try_into().unwrap()))
}

/// How many connections a second the listener serves: `GDSYNC_ACCEPT_CONNS` (500 here) full
/// handshakes, one after the other, each asking for a device that does not exist. Prints the
/// rate (a measure, not a pass mark); every connection must be answered.
#[test]
fn accept_rate() {
    let _alone = alone();
    let n = env_or("GDSYNC_ACCEPT_CONNS", 500);
    let addr = accept_tcp_links(None).unwrap();
    let t = Instant::now();
    for i in 0..n {
        assert_eq!(
            hello_answer(addr, 0xACC0_0000 + i, 0xD0E5_0000_0000_0001),
            Some(1)
        );
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} handshakes one after the other in {:.3} s: {:.0} connections/s",
        secs,
        n as f64 / secs
    );
}

#[test]
fn tmp_idle_accept_rate() {
    let _alone = alone();
    let n = env_or("GDSYNC_IDLE_CONNS", 900) as usize;
    let addr = accept_tcp_links(None).unwrap();
    let t = Instant::now();
    let mut slow = Vec::new();
    let mut idle: Vec<TcpStream> = (0..n)
        .map(|i| {
            let t = Instant::now();
            let s = TcpStream::connect(addr).unwrap();
            if t.elapsed() > Duration::from_millis(100) {
                slow.push((i, t.elapsed()));
            }
            s
        })
        .collect();
    println!("slow connects: {slow:?}");
    let t_conn = t.elapsed();
    // The listener closes the oldest for each one past 64: the (n-65)th sees EOF once all are accepted.
    let mut b = [0u8; 1];
    let last = &mut idle[n - 65];
    last.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let r = last.read(&mut b);
    println!(
        "{n} idle: connects {:?}, accepted all by {:?} ({:?}): {:.0}/s",
        t_conn,
        t.elapsed(),
        r.map_err(|e| e.kind()),
        n as f64 / t.elapsed().as_secs_f64()
    );
}
