//! The TCP link between two devices of this process (endpoints that ask for TCP), through
//! the process's own listener on this host: connecting in any order, data in both directions
//! under back-pressure, the listener's refusals, connections that fail authentication, and a
//! dropped peer device.

use super::*;
use crate::format::Syndrome;
use crate::{
    Access, Completion, Cq, Device, MemoryRegion, ProtectionDomain, Qp, QpConfig, RecvWr,
    RemoteBuf, SendWr, WcStatus,
};
use std::time::Duration;
use tcp::{Dialed, Hello, HELLO_LEN};

use super::soft_of as soft;

const WAIT: Duration = Duration::from_secs(20);

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: Cq,
    qp: Qp,
}

fn side() -> Side {
    // The endpoints of these tests ask for TCP by hand: this process must listen.
    accept_tcp_links(None).unwrap();
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    Side { dev, pd, cq, qp }
}

/// The endpoint of `s`'s QP, asking for a TCP link.
fn tcp_endpoint(s: &Side) -> Endpoint {
    Endpoint {
        link: LinkPolicy::Tcp,
        ..s.qp.endpoint()
    }
}

/// Connects two sides over TCP, both at once (lined up on a barrier, so their dials often
/// cross).
fn connect(a: &mut Side, b: &mut Side) {
    let (ea, eb) = (tcp_endpoint(a), tcp_endpoint(b));
    assert_eq!(a.dev.link_kind(&eb).unwrap(), LinkKind::Tcp);
    assert_eq!(b.dev.link_kind(&ea).unwrap(), LinkKind::Tcp);
    let go = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let (qa, qb, go2) = (&mut a.qp, &mut b.qp, &go);
        let h = s.spawn(move || {
            go2.wait();
            qa.connect(&eb)
        });
        go.wait();
        qb.connect(&ea).unwrap();
        h.join().unwrap().unwrap();
    });
}

/// A write from `a` into `b` and a send from `b` to `a` work.
fn assert_pair_works(a: &mut Side, b: &mut Side) {
    let mut src = pattern(9, 5000);
    let mut dst = vec![0u8; 5000];
    let src_mr = a.pd.register(&mut src, Access::empty()).unwrap();
    let dst_mr = b.pd.register(&mut dst, Access::ALL).unwrap();
    a.qp.post_send(
        &SendWr::write(dst_mr.remote().at(0))
            .sge(src_mr.sge(..))
            .wr_id(1),
    )
    .unwrap();
    let c = wait(&a.cq);
    assert!(c.is_ok() && c.wr_id == 1, "{c:?}");
    let mut got = vec![0u8; 5000];
    dst_mr.read_at(0, &mut got);
    assert!(got == pattern(9, 5000), "write");
    let mut rbuf = vec![0u8; 5000];
    let rmr = a.pd.register(&mut rbuf, Access::LOCAL_WRITE).unwrap();
    send_imm_across(b, &dst_mr, a, &rmr, 3);
}

/// Both sides connect from one thread, one after the other, in either order: the first
/// dials, the second finds the link.
#[test]
fn tcp_connects_in_sequence_in_either_order() {
    for first_is_smaller in [true, false] {
        let (mut a, mut b) = (side(), side());
        if (a.dev.info().uid < b.dev.info().uid) != first_is_smaller {
            std::mem::swap(&mut a, &mut b);
        }
        let (ea, eb) = (tcp_endpoint(&a), tcp_endpoint(&b));
        a.qp.connect(&eb).unwrap();
        b.qp.connect(&ea).unwrap();
        assert_pair_works(&mut a, &mut b);
    }
}

/// Fresh pairs of devices whose QPs (three pairs) all connect at the same moment from six
/// threads: dials cross, and dials of one device dedupe; one working link results. Then the
/// main pair connects at once from two threads and works both ways.
#[test]
fn tcp_simultaneous_connects() {
    for _ in 0..10 {
        let (mut a, mut b) = (side(), side());
        let qps = |s: &Side| -> Vec<Qp> {
            (0..3)
                .map(|_| s.pd.create_qp(&s.cq, &s.cq, &QpConfig::default()).unwrap())
                .collect()
        };
        let (mut qa, mut qb) = (qps(&a), qps(&b));
        let eps = |qs: &[Qp]| -> Vec<Endpoint> {
            qs.iter()
                .map(|q| Endpoint {
                    link: LinkPolicy::Tcp,
                    ..q.endpoint()
                })
                .collect()
        };
        let (ea, eb) = (eps(&qa), eps(&qb));
        let go = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            for (q, e) in qa.iter_mut().zip(&eb).chain(qb.iter_mut().zip(&ea)) {
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    q.connect(e).unwrap()
                });
            }
        });
        let mut far = pattern(4, 64);
        let far_mr = b.pd.register(&mut far, Access::ALL).unwrap();
        let mut near = vec![0u8; 64];
        let near_mr = a.pd.register(&mut near, Access::LOCAL_WRITE).unwrap();
        for (i, q) in qa.iter_mut().enumerate() {
            near_mr.write_at(0, &[0; 64]);
            q.post_send(
                &SendWr::read(far_mr.remote().at(0))
                    .sge(near_mr.sge(..))
                    .wr_id(i as u64),
            )
            .unwrap();
            let c = wait(&a.cq);
            assert!(c.is_ok() && c.wr_id == i as u64, "QP pair {i}: {c:?}");
            let mut got = [0u8; 64];
            near_mr.read_at(0, &mut got);
            assert_eq!(got[..], pattern(4, 64)[..], "QP pair {i}");
        }
        drop((far_mr, near_mr));
        connect(&mut a, &mut b);
        assert_pair_works(&mut a, &mut b);
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn wait(cq: &Cq) -> Completion {
    cq.wait_one(WAIT).expect("a completion")
}

const MIB: usize = 1 << 20;
/// More than a link ring (4 MiB) holds.
const CHUNKS: usize = 12;

/// Writes `src` into `to` a MiB at a time, all posted at once, then reads `to` back into
/// `back`; asserts every completion.
fn write_then_read_back(
    me: &mut Side,
    src: &MemoryRegion<'_>,
    back: &MemoryRegion<'_>,
    to: RemoteBuf,
) {
    for k in 0..CHUNKS {
        let wr = SendWr::write(to.at((k * MIB) as u64))
            .sge(src.sge(k * MIB..(k + 1) * MIB))
            .wr_id(k as u64);
        me.qp.post_send(&wr).unwrap();
    }
    for k in 0..CHUNKS {
        let c = wait(&me.cq);
        assert!(c.is_ok() && c.wr_id == k as u64, "write {k}: {c:?}");
    }
    me.qp
        .post_send(&SendWr::read(to.at(0)).sge(back.sge(..)).wr_id(99))
        .unwrap();
    let c = wait(&me.cq);
    assert!(c.is_ok() && c.wr_id == 99, "read back: {c:?}");
}

/// Each side writes 12 MiB into the other at the same time (both rings and both sockets
/// fill), then reads it back; a send with immediate goes each way; every byte is checked.
#[test]
fn tcp_link_carries_data_both_ways_under_back_pressure() {
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let n = CHUNKS * MIB;
    let (mut a_src, mut b_src) = (pattern(1, n), pattern(2, n));
    let (mut a_dst, mut b_dst) = (vec![0u8; n], vec![0u8; n]);
    let (mut a_back, mut b_back) = (vec![0u8; n], vec![0u8; n]);
    let a_src_mr = a.pd.register(&mut a_src, Access::empty()).unwrap();
    let b_src_mr = b.pd.register(&mut b_src, Access::empty()).unwrap();
    let a_dst_mr = a.pd.register(&mut a_dst, Access::ALL).unwrap();
    let b_dst_mr = b.pd.register(&mut b_dst, Access::ALL).unwrap();
    let a_back_mr = a.pd.register(&mut a_back, Access::LOCAL_WRITE).unwrap();
    let b_back_mr = b.pd.register(&mut b_back, Access::LOCAL_WRITE).unwrap();
    std::thread::scope(|s| {
        let (a, a_src, a_back, to_b) = (&mut a, &a_src_mr, &a_back_mr, b_dst_mr.remote());
        s.spawn(move || write_then_read_back(a, a_src, a_back, to_b));
        write_then_read_back(&mut b, &b_src_mr, &b_back_mr, a_dst_mr.remote());
    });
    let mut got = vec![0u8; n];
    for (dst, back, want) in [
        (&b_dst_mr, &a_back_mr, pattern(1, n)),
        (&a_dst_mr, &b_back_mr, pattern(2, n)),
    ] {
        dst.read_at(0, &mut got);
        assert!(got == want, "writes landed wrong");
        back.read_at(0, &mut got);
        assert!(got == want, "the read returned wrong bytes");
    }

    // A send with immediate, each way (into the start of the receiver's dst region).
    send_imm_across(&mut a, &a_src_mr, &mut b, &b_dst_mr, 7);
    send_imm_across(&mut b, &b_src_mr, &mut a, &a_dst_mr, 8);
}

/// Sends bytes 100..3100 of `from_src` with immediate `imm` into the start of `to_dst`.
fn send_imm_across(
    from: &mut Side,
    from_src: &MemoryRegion<'_>,
    to: &mut Side,
    to_dst: &MemoryRegion<'_>,
    imm: u32,
) {
    to.qp
        .post_recv(&RecvWr::new().sge(to_dst.sge(..4096)).wr_id(5))
        .unwrap();
    from.qp
        .post_send(&SendWr::send_imm(imm).sge(from_src.sge(100..3100)).wr_id(6))
        .unwrap();
    let s = wait(&from.cq);
    let r = wait(&to.cq);
    assert!(s.is_ok() && s.wr_id == 6, "{s:?}");
    assert!(r.is_ok() && r.wr_id == 5, "{r:?}");
    assert_eq!((r.byte_len, r.imm), (3000, Some(imm)));
    let mut got = vec![0u8; 3000];
    to_dst.read_at(0, &mut got);
    let mut want = vec![0u8; 3000];
    from_src.read_at(100, &mut want);
    assert!(got == want, "send payload");
}

/// The listener answers dials it cannot serve with a reason, and the dialer reports it.
#[test]
fn tcp_listener_refuses_what_it_cannot_serve() {
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let addr = accept_tcp_links(None).unwrap();
    let (lo, hi) = if a.dev.info().uid < b.dev.info().uid {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let (lo_uid, hi_uid) = (lo.dev.info().uid, hi.dev.info().uid);
    let dial = |hello: Hello| {
        let waker = soft(&lo.dev).engine.waker();
        match tcp::dial(addr, &hello, waker) {
            Err(Error::Unreachable(m)) => m,
            other => panic!("{hello:?}: {:?}", other.map(|_| "a link")),
        }
    };
    let hello = |dialer, target| Hello::new(dialer, target, host_id(), std::process::id());
    assert!(dial(hello(lo_uid, u64::MAX)).contains("no such device"));
    // Already linked: the dialer then waits for the link its listener accepted.
    let again = tcp::dial(addr, &hello(lo_uid, hi_uid), soft(&lo.dev).engine.waker());
    assert!(matches!(again, Ok(Dialed::TheirDial)));
    // A dial that crosses one from the target, which has the smaller uid, loses.
    let fake = u64::MAX;
    soft(&lo.dev).links.lock().dialing.insert(fake);
    let crossed = tcp::dial(addr, &hello(fake, lo_uid), soft(&hi.dev).engine.waker());
    soft(&lo.dev).links.lock().dialing.remove(&fake);
    assert!(matches!(crossed, Ok(Dialed::TheirDial)));
    let odd = Hello {
        mtu: 1500,
        ..hello(lo_uid, hi_uid)
    };
    assert!(dial(odd).contains("MTU"), "{odd:?}");
    // The pair still works after the refused dials.
    let mut buf = vec![0u8; 64];
    let mr = hi.pd.register(&mut buf, Access::ALL).unwrap();
    let mut mine = vec![0u8; 64];
    let lmr = lo.pd.register(&mut mine, Access::LOCAL_WRITE).unwrap();
    let lo = if a.dev.info().uid == lo_uid {
        &mut a
    } else {
        &mut b
    };
    lo.qp
        .post_send(&SendWr::read(mr.remote().at(0)).sge(lmr.sge(..)).wr_id(1))
        .unwrap();
    assert!(wait(&lo.cq).is_ok());
}

/// Dropping one device closes its connections: the other's work fails with
/// TRANSPORT_RETRY_EXC within 2 s, as for a dead process.
#[test]
fn tcp_peer_device_dropped() {
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let mut far = vec![0u8; 4096];
    let far_mr = b.pd.register(&mut far, Access::ALL).unwrap();
    let far_buf = far_mr.remote();
    let mut near = vec![0u8; 4096];
    let near_mr = a.pd.register(&mut near, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr::read(far_buf.at(0)).sge(near_mr.sge(..)).wr_id(1))
        .unwrap();
    assert!(wait(&a.cq).is_ok());
    drop(far_mr);
    drop(b);
    let t = Instant::now();
    a.qp.post_send(&SendWr::read(far_buf.at(0)).sge(near_mr.sge(..)).wr_id(2))
        .unwrap();
    let c = wait(&a.cq);
    assert_eq!(c.wr_id, 2);
    assert_eq!(
        c.status,
        WcStatus::Error(Syndrome::TransportRetryExc),
        "{c:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
}

/// Connections that do not prove the job's secret are dropped before the listener says a word
/// (no answer, no device named), whatever they send: another secret, a proof of zeros, a
/// hello cut short, a nonce cut short. A link already up and a new dial both keep working.
#[test]
fn tcp_connections_without_the_job_secret_are_dropped() {
    use crate::auth::{self, JobSecret};
    use std::io::{Read, Write};
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let addr = accept_tcp_links(None).unwrap();
    let hello = Hello::new(1, a.dev.info().uid, host_id(), 1).to_bytes();
    let open = |first: &[u8]| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(first).unwrap();
        s
    };
    // What the listener sends after the last byte the client waited for, until it closes.
    let rest = |mut s: std::net::TcpStream| {
        let mut got = Vec::new();
        s.read_to_end(&mut got).map(|_| got.len())
    };
    let other = JobSecret::generate().unwrap();
    let mut s = open(&hello);
    let e = auth::dial(&mut s, &other, b"gdsync soft-device TCP link", &hello).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    let zeros = [hello.as_slice(), &[0u8; 32]].concat();
    let mut s = open(&zeros);
    let mut nonce = [0u8; 32];
    s.read_exact(&mut nonce).unwrap();
    s.write_all(&[0u8; 32]).unwrap();
    assert_eq!(rest(s).unwrap(), 0, "a proof of zeros got an answer");
    for cut in [&hello[..20], &zeros[..HELLO_LEN + 5]] {
        let s = open(cut);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(
            rest(s).unwrap(),
            0,
            "a handshake cut after {} bytes",
            cut.len()
        );
    }
    assert_pair_works(&mut a, &mut b);
    let (mut c, mut d) = (side(), side());
    connect(&mut c, &mut d);
    assert_pair_works(&mut c, &mut d);
}

/// Sends `bytes` one at a time, `gap` apart, until they are all sent or the other side closes;
/// returns how many went out.
fn trickle(mut s: std::net::TcpStream, bytes: &[u8], gap: Duration) -> usize {
    use std::io::Write;
    for (i, b) in bytes.iter().enumerate() {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            return i;
        }
        std::thread::sleep(gap);
    }
    bytes.len()
}

/// A dialer that sends its hello and nonce one byte every 50 ms (each read of the listener
/// gets a byte long before any per-read timeout) is dropped when the whole handshake's time
/// is up (600 ms here), not after its last byte (4 s) or later.
#[test]
fn a_trickling_dialer_is_dropped_at_the_handshake_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let client = std::net::TcpStream::connect(addr).unwrap();
    let (server, from) = l.accept().unwrap();
    let hello = Hello::new(1, 2, host_id(), 1).to_bytes();
    let bytes = [hello.as_slice(), &[7u8; 32]].concat();
    let dialer = std::thread::spawn(move || trickle(client, &bytes, Duration::from_millis(50)));
    let t = std::time::Instant::now();
    let within = Duration::from_millis(600);
    assert_eq!(tcp::handshake_accepted(&server, from, within), None);
    let took = t.elapsed();
    drop(server);
    let sent = dialer.join().unwrap();
    assert!(
        took < within + Duration::from_millis(400),
        "the handshake was dropped after {took:?}, its deadline was {within:?}"
    );
    assert!(sent < HELLO_LEN + 32, "the dialer sent all {sent} bytes");
}

/// One round of the responder's engine takes every message the TCP bridge has put in the
/// link's receive ring (up to 64 packets), not one a round: a burst of small writes lands in
/// one round and is acknowledged together (one message a round cost 40 % of the message rate
/// with 8 QP pairs).
#[test]
fn tcp_one_round_takes_a_burst_of_messages() {
    let (mut a, mut b) = (side(), side());
    connect(&mut a, &mut b);
    let mut src = pattern(5, 64);
    let mut dst = vec![0u8; 64];
    let src_mr = a.pd.register(&mut src, Access::empty()).unwrap();
    let dst_mr = b.pd.register(&mut dst, Access::ALL).unwrap();
    let write = |k: usize| {
        SendWr::write(dst_mr.remote().at(8 * k as u64)).sge(src_mr.sge(8 * k..8 * k + 8))
    };
    a.qp.post_send(&write(0).wr_id(100)).unwrap();
    assert!(wait(&a.cq).is_ok(), "the first write");
    let core = soft(&b.dev).engine.core.clone();
    let mut held = core.hold();
    for k in 1..8 {
        a.qp.post_send(&write(k).wr_id(k as u64)).unwrap();
    }
    // The requester's engine and the bridge threads run meanwhile; the responder's does not.
    std::thread::sleep(Duration::from_millis(300));
    let landed = |k: usize| dst_mr.read_volatile_u8(8 * k + 7) == pattern(5, 64)[8 * k + 7];
    assert!(
        !landed(1),
        "a write landed while the responder's engine was held"
    );
    // Rounds until all seven landed; a round that finds nothing (a write not yet through the
    // bridge) does not count.
    let (mut rounds, mut n, t) = (Vec::new(), 0, std::time::Instant::now());
    while n < 7 && t.elapsed() < WAIT {
        held.round(false);
        let now = (1..8).filter(|&k| landed(k)).count();
        if now > n {
            rounds.push(now - n);
            n = now;
        }
    }
    drop(held);
    assert_eq!(
        rounds,
        [7],
        "writes taken per round that took any (7 were waiting in the ring)"
    );
    for k in 1..8 {
        let c = wait(&a.cq);
        assert!(c.is_ok() && c.wr_id == k as u64, "{c:?}");
    }
}
