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
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
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

/// A TCP link's hello (`docs/soft-device.md`): `dialer` (of process `pid`) asks for a link
/// to `target`.
fn hello(dialer: u64, target: u64, pid: u32) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[..8].copy_from_slice(b"GDSTCP01");
    b[8..16].copy_from_slice(&dialer.to_le_bytes());
    b[16..24].copy_from_slice(&target.to_le_bytes());
    b[24..32].copy_from_slice(&host_id().to_le_bytes());
    b[32..36].copy_from_slice(&pid.to_le_bytes());
    b[36..40].copy_from_slice(&65536u32.to_le_bytes());
    b[40] = if cfg!(target_endian = "little") { 1 } else { 2 };
    b
}

/// Opens a link to device `target` as a made-up device, as a real peer would (with the job's
/// secret), and returns the socket once accepted.
fn dial_raw(addr: SocketAddr, target: u64) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    let code = ask(&s, &hello(0xF100_D000_0000_0001, target, 1));
    assert_eq!(code, Some(ACCEPTED), "not accepted");
    s
}

/// Answer codes of the listener (`docs/soft-device.md`).
const ACCEPTED: u32 = 0;
const NO_DEVICE: u32 = 1;
const TOO_MANY_LINKS: u32 = 5;

/// Sends `hello` on a fresh connection, proves the job's secret, and returns the listener's
/// answer code; `None` if it closed the connection first.
fn ask(mut s: &TcpStream, hello: &[u8; 48]) -> Option<u32> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(hello).ok()?;
    let secret = auth::job_secret().unwrap();
    auth::dial(&mut s, &secret, b"gdsync soft-device TCP link", hello).ok()?;
    let mut answer = [0u8; 16];
    s.read_exact(&mut answer).ok()?;
    assert_eq!(&answer[..8], b"GDSTCP01");
    Some(u32::from_le_bytes(answer[8..12].try_into().unwrap()))
}

/// A TCP connection to `to` from local address `from` (another address of the loopback
/// network stands in for another host).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let sin = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else {
        panic!("the listener is on {to}, not IPv4")
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket's fd, owned by the TcpStream from here on.
    let s = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    };
    let (src, dst) = (sin(from, 0), sin(*to.ip(), to.port()));
    // SAFETY: bind and connect read `len` bytes of a sockaddr_in that lives across the call.
    unsafe {
        let at = |a: &libc::sockaddr_in| a as *const libc::sockaddr_in as *const libc::sockaddr;
        assert_eq!(libc::bind(s.as_raw_fd(), at(&src), len), 0, "bind {from}");
        assert_eq!(
            libc::connect(s.as_raw_fd(), at(&dst), len),
            0,
            "connect {to}"
        );
    }
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

/// Links the listener accepts from one source address (`GDSYNC_SOFT_MAX_LINKS_PER_ADDR`).
const PER_ADDR: u64 = 8;

/// A job member (it has the secret) that opens links to one device as fast as it can, each
/// with a fresh device uid and pid in its hello, from another address (127.0.0.2):
/// `GDSYNC_LINK_FLOOD_LINKS` of them (40 here), each then flooded with requests for
/// `GDSYNC_FLOOD_SECS` (2 s here). The listener accepts 8 from that address and refuses the
/// rest (it accepted all: 100 took the victim from 20 to 869 MB and 9 to 215 threads); the
/// victim's threads and resident memory stay within what 8 links cost, its own link
/// keeps carrying data, and a new link from this host's address gets through. Once the
/// victim's device is gone, its links' places are given back.
#[test]
fn a_member_opening_links_without_limit_is_refused_past_its_bound() {
    let _alone = alone();
    let (n, secs) = (
        env_or("GDSYNC_LINK_FLOOD_LINKS", 40),
        env_or("GDSYNC_FLOOD_SECS", 2),
    );
    let mut victim = tcp_pair();
    let addr = accept_tcp_links(None).unwrap();
    let (threads0, rss0) = (proc_status("Threads:"), proc_status("VmRSS:"));
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let target = victim.a.dev.info().uid;
    let (mut links, mut refused) = (Vec::new(), 0);
    for i in 0..n {
        let s = connect_from(attacker, addr);
        match ask(
            &s,
            &hello(0xF100_D000_0001_0000 + i, target, 1000 + i as u32),
        ) {
            Some(ACCEPTED) => links.push(s),
            Some(TOO_MANY_LINKS) => refused += 1,
            other => panic!("dial {i}: answer {other:?}"),
        }
    }
    let stop = Instant::now() + Duration::from_secs(secs);
    let flooder = std::thread::spawn(move || {
        let frames = junk_requests(4096);
        for s in &links {
            s.set_nonblocking(true).unwrap();
        }
        // Where each stream is in `frames`: a write cut short goes on from there.
        let mut at = vec![0; links.len()];
        while Instant::now() < stop {
            for (mut s, at) in links.iter().zip(&mut at) {
                // A full socket fails with WouldBlock: the victim holds the flood back.
                if let Ok(n) = s.write(&frames[*at..]) {
                    *at = (*at + n) % frames.len();
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        links
    });
    let mut rounds = 0;
    while Instant::now() < stop {
        assert_healthy(&mut victim);
        rounds += 1;
    }
    let links = flooder.join().unwrap();
    let mut newcomer = tcp_pair();
    assert_healthy(&mut newcomer);
    let (threads1, rss1) = (proc_status("Threads:"), proc_status("VmRSS:"));
    println!(
        "{n} links asked for from {attacker}: {} accepted, {refused} refused; flooded {secs} s: threads {threads0} -> {threads1}, resident memory {} -> {} MB, {rounds} rounds on the victim's own link",
        links.len(),
        rss0 >> 10,
        rss1 >> 10
    );
    // Two threads per accepted link, the new pair's engines and link threads, and room for
    // handshake threads still finishing.
    assert!(
        threads1 <= threads0 + 2 * PER_ADDR + 16,
        "threads {threads0} -> {threads1}"
    );
    assert!(
        rss1.saturating_sub(rss0) < 256 << 10,
        "resident memory grew from {rss0} kB to {rss1} kB"
    );
    assert_eq!((links.len() as u64, refused), (PER_ADDR, n - PER_ADDR));
    assert!(rounds > 0);
    assert_healthy(&mut victim);
    drop((links, victim, newcomer));
    // The released links give their places back: the address may link again.
    let mut again = tcp_pair();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = connect_from(attacker, addr);
        let code = ask(&s, &hello(0xF100_D000_0002_0000, again.a.dev.info().uid, 1));
        if code == Some(ACCEPTED) {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {code:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_healthy(&mut again);
}

/// How many connections a second the listener takes: `GDSYNC_BURST_CONNS` dials (600 here) as
/// fast as one thread makes them, saying nothing. Each past 64 makes the listener close the
/// oldest, so the last but 64 sees its end once the listener has taken them all. Prints the
/// rate (a measure, not a pass mark). With the kernel's queue of 128 connections, dials past
/// it had their SYNs dropped and retried a second later: about 200 a second.
#[test]
fn a_burst_of_dials_is_taken_at_once() {
    let _alone = alone();
    let n = env_or("GDSYNC_BURST_CONNS", 600) as usize;
    let addr = accept_tcp_links(None).unwrap();
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let s = TcpStream::connect(addr).unwrap();
            slowest = slowest.max(t.elapsed());
            s
        })
        .collect();
    let last = &mut conns[n - 65];
    last.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(
        last.read(&mut [0u8; 1]).unwrap(),
        0,
        "not closed by the listener"
    );
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} dials taken in {secs:.3} s: {:.0} connections/s; the slowest connect took {slowest:?}",
        n as f64 / secs
    );
}

/// How many authenticated handshakes a second the listener serves: `GDSYNC_ACCEPT_CONNS`
/// (500 here), one after the other, each asking for a device that does not exist. Prints the
/// rate (a measure, not a pass mark); every one must be answered.
#[test]
fn handshake_rate() {
    let _alone = alone();
    let n = env_or("GDSYNC_ACCEPT_CONNS", 500);
    let addr = accept_tcp_links(None).unwrap();
    let t = Instant::now();
    for i in 0..n {
        let s = TcpStream::connect(addr).unwrap();
        let code = ask(&s, &hello(0xACC0_0000 + i, 0xD0E5_0000_0000_0001, 1));
        assert_eq!(code, Some(NO_DEVICE));
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} handshakes one after the other in {secs:.3} s: {:.0} connections/s",
        n as f64 / secs
    );
}
