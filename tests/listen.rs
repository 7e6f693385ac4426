//! When a process listens for soft-device TCP links: not for ranks that share a host, and on
//! the bootstrap's address once the ranks of a communicator span hosts. (A file of its own: the
//! listener is one per process, and no other test here may start it first.)

use gdasync::gdsync::{Device, QpConfig};
use gdasync::mp::bootstrap::{Bootstrap, ThreadBootstrap};
use gdasync::mp::Comm;
use std::net::{IpAddr, Ipv4Addr};

/// A thread rank that reports another host in its first exchange (the host ids), as a rank on
/// another machine would.
struct Elsewhere {
    inner: ThreadBootstrap,
    first: bool,
}

impl Bootstrap for Elsewhere {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_gather(&mut self, mine: &[u8]) -> gdasync::gdsync::Result<Vec<Vec<u8>>> {
        if std::mem::take(&mut self.first) {
            let other = (gdasync::gdsync::host_id() ^ 1).to_le_bytes();
            return self.inner.all_gather(&other);
        }
        self.inner.all_gather(mine)
    }
    fn local_ip(&self) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

fn endpoint_addr(dev: &Device) -> Option<std::net::SocketAddr> {
    let cq = dev.create_cq(1).unwrap();
    let qp = dev
        .alloc_pd()
        .create_qp(&cq, &cq, &QpConfig::default())
        .unwrap();
    qp.endpoint().addr
}

#[test]
fn a_communicator_listens_only_when_its_ranks_span_hosts() {
    let dev = Device::soft().unwrap();
    let run = |boots: Vec<Box<dyn Bootstrap>>| {
        std::thread::scope(|s| {
            let hs: Vec<_> = boots
                .into_iter()
                .map(|b| s.spawn(|| Comm::new(b, &dev).unwrap().finalize().unwrap()))
                .collect();
            hs.into_iter().for_each(|h| h.join().unwrap());
        })
    };
    // Thread ranks of one host: no listener, endpoints without an address.
    run(ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| Box::new(b) as Box<dyn Bootstrap>)
        .collect());
    assert_eq!(endpoint_addr(&dev), None);
    // Rank 1 "on another host": every rank listens, on the address its bootstrap reaches the
    // others from (a loopback address here is not taken: all interfaces instead, advertised
    // by the host's primary address).
    let mut boots = ThreadBootstrap::group(2).into_iter();
    let first = boots.next().unwrap();
    let second = Elsewhere {
        inner: boots.next().unwrap(),
        first: true,
    };
    run(vec![Box::new(first), Box::new(second)]);
    let addr = endpoint_addr(&dev).expect("an address once the ranks span hosts");
    assert_ne!(addr.port(), 0, "{addr}");
}
