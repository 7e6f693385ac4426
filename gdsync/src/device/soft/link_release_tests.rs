//! Links to peers that are gone are released: a long-lived device that many short-lived peer
//! devices linked to (in this process, and over TCP) ends up holding links to its live peers
//! only, with their rings, and over TCP their threads, gone; its QPs that were connected to
//! a dropped peer are in error; its healthy pair keeps working. (`GDSYNC_LINK_CHURN_PEERS`
//! sets the number of peers; the default is quick, for CI.)

use super::soft_of as soft;
use super::*;
use crate::{Access, Cq, Device, ProtectionDomain, Qp, QpConfig, SendWr};
use std::time::{Duration, Instant};

/// Peer devices per test (1,000 with `GDSYNC_LINK_CHURN_PEERS=1000`).
fn peer_count(default: usize) -> usize {
    std::env::var("GDSYNC_LINK_CHURN_PEERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits (up to 2 s, driving the engines) until `done` holds.
fn within_2s(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if done() {
            return true;
        }
        crate::progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    done()
}

/// How endpoints ask to be linked: in this process, or over TCP.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Via {
    Memory,
    Tcp,
}

/// A QP on a device, with its PD and CQ.
struct End {
    pd: ProtectionDomain,
    cq: Cq,
    qp: Qp,
}

impl End {
    fn on(dev: &Device) -> End {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
        End { pd, cq, qp }
    }

    fn endpoint(&self, via: Via) -> Endpoint {
        match via {
            Via::Memory => self.qp.endpoint(),
            Via::Tcp => Endpoint {
                link: LinkPolicy::Tcp,
                ..self.qp.endpoint()
            },
        }
    }
}

/// Connects `a` and `b` (from two threads: over TCP the first to dial may wait for the
/// other's connect).
fn connect(a: &mut End, b: &mut End, via: Via) {
    let (ea, eb) = (a.endpoint(via), b.endpoint(via));
    std::thread::scope(|s| {
        let qb = &mut b.qp;
        let h = s.spawn(move || qb.connect(&ea));
        a.qp.connect(&eb).unwrap();
        h.join().unwrap().unwrap();
    });
}

/// Writes `len` bytes of `fill` from `a` into `b` and checks they landed.
fn write(a: &mut End, b: &End, len: usize, fill: u8) {
    let mut src = vec![fill; len];
    let mut dst = vec![0u8; len];
    let src_mr = a.pd.register(&mut src, Access::empty()).unwrap();
    let dst_mr = b.pd.register(&mut dst, Access::ALL).unwrap();
    a.qp.post_send(&SendWr::write(dst_mr.remote().at(0)).sge(src_mr.sge(..)))
        .unwrap();
    let c = a.cq.wait_one(Duration::from_secs(10)).unwrap();
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(dst_mr.read_volatile_u8(len - 1), fill);
}

/// `n` short-lived peer devices each connect a QP to a new QP of a long-lived server, write
/// 64 KiB into it and are dropped. Half the server's QPs are destroyed first; the others
/// outlive their peer (they must end in error). Afterwards the server holds only the link of
/// its healthy pair, which still works.
fn churn(via: Via, n: usize) {
    if via == Via::Tcp {
        accept_tcp_links(None).unwrap();
    }
    let server = Device::soft().unwrap();
    let other = Device::soft().unwrap();
    let (mut ha, mut hb) = (End::on(&server), End::on(&other));
    connect(&mut ha, &mut hb, via);
    let mut kept = Vec::new();
    let mut gone = Vec::new();
    for i in 0..n {
        let mut s = End::on(&server);
        let peer = Device::soft().unwrap();
        gone.push(peer.info().uid);
        let mut p = End::on(&peer);
        connect(&mut p, &mut s, via);
        write(&mut p, &s, 64 << 10, i as u8 | 1);
        drop((p, peer));
        if i % 2 == 1 {
            kept.push(s.qp);
        }
    }
    let srv = soft(&server);
    let released = within_2s(|| srv.links_now() == (1, 1));
    assert!(
        released,
        "{via:?}: after {n} peers came and went the server holds (links, peers) {:?}, not (1, 1)",
        srv.links_now()
    );
    for qp in &kept {
        let st = srv.query_qp(qp.qpn()).state;
        assert_eq!(
            st,
            HwQpState::Error,
            "{via:?}: QP {:#x} of a dropped peer",
            qp.qpn()
        );
    }
    if via == Via::Tcp {
        // The link's engine end and both its threads hold its signal.
        let left: usize = gone
            .iter()
            .map(|&p| super::super::bridge::bridges::holders(p))
            .sum();
        assert!(
            within_2s(|| gone
                .iter()
                .map(|&p| super::super::bridge::bridges::holders(p))
                .sum::<usize>()
                == 0),
            "{via:?}: {left} link end(s) and thread(s) to dropped peers remain"
        );
    }
    write(&mut ha, &hb, 4096, 0x5A);
    write(&mut hb, &ha, 4096, 0xA5);
}

#[test]
fn links_to_dropped_in_process_peers_are_released() {
    churn(Via::Memory, peer_count(40));
}

#[test]
fn tcp_links_to_dropped_peers_are_released_with_their_threads() {
    churn(Via::Tcp, peer_count(20));
}

/// Peers come and go one after the other: each finds a fresh link, and leaves none behind.
#[test]
fn connecting_after_the_link_was_released_finds_a_fresh_link() {
    let server = Device::soft().unwrap();
    for round in 0..3u8 {
        let peer = Device::soft().unwrap();
        let (mut s, mut p) = (End::on(&server), End::on(&peer));
        connect(&mut s, &mut p, Via::Memory);
        write(&mut s, &p, 1024, round + 1);
        drop((p, peer));
        let srv = soft(&server);
        assert!(
            within_2s(|| srv.links_now() == (0, 0)),
            "{:?}",
            srv.links_now()
        );
    }
}
