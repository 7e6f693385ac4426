//! Endpoints (what a peer needs to reach a QP) and the choice of link between two devices.

use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

/// An identifier of this boot of this host (the [`Endpoint::host`] of its devices): processes
/// with the same one share memory.
pub fn host_id() -> u64 {
    static H: OnceLock<u64> = OnceLock::new();
    *H.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        fnv1a(boot.trim().as_bytes())
    })
}

pub(crate) fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Which links a process's soft devices may use, from `GDSYNC_SOFT_LINK` (`auto`, `shm`,
/// `tcp`). Each endpoint carries its owner's policy, so both sides of a pair see both
/// policies and choose the same link ([`LinkKind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LinkPolicy {
    /// Shared memory on one host (heap rings within a process), TCP to other hosts.
    #[default]
    Auto,
    /// No TCP: devices of other hosts are unreachable, and the process does not listen.
    Shm,
    /// TCP between any two devices, even of one host or one process (to test the TCP link
    /// on one machine). A device's link to itself stays a loopback ring.
    Tcp,
}

impl LinkPolicy {
    fn code(self) -> u8 {
        match self {
            Self::Auto => 0,
            Self::Shm => 1,
            Self::Tcp => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        [Self::Auto, Self::Shm, Self::Tcp]
            .into_iter()
            .find(|p| p.code() == c)
    }
}

impl std::fmt::Display for LinkPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Shm => "shm",
            Self::Tcp => "tcp",
        })
    }
}

impl std::str::FromStr for LinkPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "" | "auto" => Ok(Self::Auto),
            "shm" => Ok(Self::Shm),
            "tcp" => Ok(Self::Tcp),
            _ => Err(Error::invalid(format!(
                "link policy {s:?}: expected auto, shm or tcp"
            ))),
        }
    }
}

/// The link two soft devices exchange packets over (see `docs/soft-device.md`, Links).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// A device to itself: one ring.
    Loopback,
    /// Two devices of one process: two rings in heap memory.
    InProcess,
    /// Two processes of one host: two rings in a shared-memory file.
    SharedMemory,
    /// A TCP connection, bridged to two heap rings at each end.
    Tcp,
    /// An RDMA network: the peer is a port of an RDMA device (another process's or another
    /// host's), reached by its LID or GID.
    Fabric,
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Loopback => "loopback",
            Self::InProcess => "in-process",
            Self::SharedMemory => "shared memory",
            Self::Tcp => "TCP",
            Self::Fabric => "RDMA fabric",
        })
    }
}

/// How an RDMA port is reached: what a peer's connect (RTR) needs besides the QP number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortAddress {
    /// The port's link layer: RoCE (Ethernet: the GID routes) or InfiniBand (the LID routes).
    pub roce: bool,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID connections use (on RoCE, the port's RoCE v2 IPv4-mapped entry unless
    /// `GDSYNC_GID_INDEX` picks another).
    pub gid: [u8; 16],
    /// The port's active MTU in bytes (256 to 4096): a connection uses the smaller of the two.
    pub mtu: u32,
}

impl PortAddress {
    const NONE: u8 = 0;
    const IB: u8 = 1;
    const ROCE: u8 = 2;

    fn layer_code(&self) -> u8 {
        if self.roce {
            Self::ROCE
        } else {
            Self::IB
        }
    }
}

/// `roce/GID/MTU` or `ib/LID/GID/MTU` (the GID as an IPv6 address, the LID and MTU decimal).
impl std::fmt::Display for PortAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gid = Ipv6Addr::from(self.gid);
        match self.roce {
            true => write!(f, "roce/{gid}/{}", self.mtu),
            false => write!(f, "ib/{}/{gid}/{}", self.lid, self.mtu),
        }
    }
}

impl std::str::FromStr for PortAddress {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        let p: Vec<&str> = s.split('/').collect();
        let gid = |g: &str| g.parse::<Ipv6Addr>().map(|a| a.octets()).map_err(drop);
        let mtu = |m: &str| m.parse::<u32>().map_err(drop);
        match p[..] {
            ["roce", g, m] => Ok(Self {
                roce: true,
                lid: 0,
                gid: gid(g)?,
                mtu: mtu(m)?,
            }),
            ["ib", l, g, m] => Ok(Self {
                roce: false,
                lid: l.parse().map_err(drop)?,
                gid: gid(g)?,
                mtu: mtu(m)?,
            }),
            _ => Err(()),
        }
    }
}

/// What a peer needs to reach a QP: plain data, exchanged out of band (a thread channel, a
/// file, a socket, MPI). Encodes to [`Endpoint::WIRE_LEN`] bytes ([`Endpoint::to_bytes`]) or
/// a string (`Display`, `FromStr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Host (boot) identifier.
    pub host: u64,
    /// Process id of the QP's owner.
    pub pid: u32,
    /// The device's unique id.
    pub device: u64,
    /// The QP number.
    pub qpn: u32,
    /// Where the owner's process accepts TCP links; `None` if it does not listen (policy `shm`;
    /// policy `auto` unless `GDSYNC_SOFT_ADDR`, `GDSYNC_SOFT_IFACE` or
    /// [`accept_tcp_links`](crate::accept_tcp_links) made it; a listener that could not start).
    /// A peer linking to it over TCP then dials from its own side.
    pub addr: Option<SocketAddr>,
    /// The owner's link policy. Setting it to [`LinkPolicy::Tcp`] on an endpoint before
    /// handing it out asks for a TCP link to it (one of the two processes must listen).
    pub link: LinkPolicy,
    /// The RDMA port of the QP (an mlx5 device's QP); `None` for a soft device's.
    pub port: Option<PortAddress>,
}

impl Endpoint {
    /// Bytes of the wire form.
    pub const WIRE_LEN: usize = 72;
    const MAGIC: [u8; 4] = *b"GDE3";
    const NO_ADDR: u8 = 0;
    const IPV4: u8 = 4;
    const IPV6: u8 = 6;

    /// The wire form. Integers little-endian, IP address bytes in network order:
    ///
    /// | bytes | field |
    /// |---|---|
    /// | 0..4 | `GDE2` |
    /// | 4..8 | pid |
    /// | 8..16 | host |
    /// | 16..24 | device |
    /// | 24..28 | qpn |
    /// | 28 | link policy: 0 auto, 1 shm, 2 tcp |
    /// | 29 | address family: 0 none, 4 IPv4, 6 IPv6 |
    /// | 30..32 | port |
    /// | 32..48 | IP address (IPv4 in 32..36, the rest zero) |
    /// | 48 | RDMA port: 0 none (the rest zero), 1 InfiniBand, 2 RoCE |
    /// | 49 | zero |
    /// | 50..52 | LID |
    /// | 52..56 | MTU in bytes |
    /// | 56..72 | GID |
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..4].copy_from_slice(&Self::MAGIC);
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.host.to_le_bytes());
        b[16..24].copy_from_slice(&self.device.to_le_bytes());
        b[24..28].copy_from_slice(&self.qpn.to_le_bytes());
        b[28] = self.link.code();
        if let Some(a) = self.addr {
            b[30..32].copy_from_slice(&a.port().to_le_bytes());
            match a.ip() {
                IpAddr::V4(ip) => {
                    b[29] = Self::IPV4;
                    b[32..36].copy_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    b[29] = Self::IPV6;
                    b[32..48].copy_from_slice(&ip.octets());
                }
            }
        }
        if let Some(p) = &self.port {
            b[48] = p.layer_code();
            b[50..52].copy_from_slice(&p.lid.to_le_bytes());
            b[52..56].copy_from_slice(&p.mtu.to_le_bytes());
            b[56..72].copy_from_slice(&p.gid);
        }
        b
    }

    /// Parses the wire form.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != Self::WIRE_LEN || b[..4] != Self::MAGIC {
            return Err(Error::invalid(format!(
                "not a gdsync endpoint (expected {} bytes starting with GDE3)",
                Self::WIRE_LEN
            )));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let link = LinkPolicy::from_code(b[28])
            .ok_or_else(|| Error::invalid(format!("endpoint: unknown link policy {}", b[28])))?;
        let port = u16::from_le_bytes([b[30], b[31]]);
        let addr = match b[29] {
            Self::NO_ADDR => None,
            Self::IPV4 => {
                let ip: [u8; 4] = b[32..36].try_into().unwrap();
                Some(SocketAddr::new(Ipv4Addr::from(ip).into(), port))
            }
            Self::IPV6 => {
                let ip: [u8; 16] = b[32..48].try_into().unwrap();
                Some(SocketAddr::new(Ipv6Addr::from(ip).into(), port))
            }
            f => {
                return Err(Error::invalid(format!(
                    "endpoint: unknown address family {f}"
                )))
            }
        };
        let port = match b[48] {
            PortAddress::NONE if b[49..].iter().all(|&x| x == 0) => None,
            PortAddress::NONE => {
                return Err(Error::invalid(
                    "endpoint: RDMA port fields without an RDMA port",
                ))
            }
            l @ (PortAddress::IB | PortAddress::ROCE) => Some(PortAddress {
                roce: l == PortAddress::ROCE,
                lid: u16::from_le_bytes([b[50], b[51]]),
                mtu: u32_at(52),
                gid: b[56..72].try_into().unwrap(),
            }),
            l => {
                return Err(Error::invalid(format!(
                    "endpoint: unknown RDMA link layer {l}"
                )))
            }
        };
        Ok(Self {
            pid: u32_at(4),
            host: u64_at(8),
            device: u64_at(16),
            qpn: u32_at(24),
            addr,
            link,
            port,
        })
    }
}

/// `gdsync:HOST:PID:DEVICE:QPN:POLICY@ADDR[+PORT]`, hexadecimal host, device and QPN,
/// decimal pid; ADDR is a socket address (`10.0.0.5:40123`, `[::1]:40123`) or `-`; PORT the
/// RDMA port's address where there is one ([`PortAddress`]: `roce/::ffff:10.0.1.1/1024`).
impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gdsync:{:016x}:{}:{:016x}:{:x}:{}@",
            self.host, self.pid, self.device, self.qpn, self.link
        )?;
        match self.addr {
            Some(a) => write!(f, "{a}")?,
            None => f.write_str("-")?,
        }
        match &self.port {
            Some(p) => write!(f, "+{p}"),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "not an endpoint string: {s:?} (expected gdsync:HOST:PID:DEVICE:QPN:POLICY@ADDR[+PORT])"
            ))
        };
        let (ids, rest) = s.trim().split_once('@').ok_or_else(bad)?;
        let (addr, port) = match rest.split_once('+') {
            Some((a, p)) => (a, Some(p.parse().map_err(|()| bad())?)),
            None => (rest, None),
        };
        let p: Vec<&str> = ids.split(':').collect();
        if p.len() != 6 || p[0] != "gdsync" {
            return Err(bad());
        }
        Ok(Self {
            host: u64::from_str_radix(p[1], 16).map_err(|_| bad())?,
            pid: p[2].parse().map_err(|_| bad())?,
            device: u64::from_str_radix(p[3], 16).map_err(|_| bad())?,
            qpn: u32::from_str_radix(p[4], 16).map_err(|_| bad())?,
            link: p[5].parse().map_err(|_| bad())?,
            addr: match addr {
                "-" => None,
                a => Some(a.parse().map_err(|_| bad())?),
            },
            port,
        })
    }
}

/// Where a device runs and what it asks for: the local half of the link choice.
pub(crate) struct Here {
    pub host: u64,
    pub pid: u32,
    pub device: u64,
    pub link: LinkPolicy,
}

/// The link between the device `here` and the device of `remote`. Depends only on the two
/// policies (as a pair) and on whether the two share a host or a process, so both sides of a
/// pair, each seeing both, choose the same kind.
pub(crate) fn choose_link(here: &Here, remote: &Endpoint) -> Result<LinkKind> {
    let same_host = remote.host == here.host;
    let same_process = same_host && remote.pid == here.pid;
    if remote.device == here.device {
        return if same_process {
            Ok(LinkKind::Loopback)
        } else {
            Err(Error::invalid(format!(
                "{remote} names this device ({:016x}) in another process: a corrupt endpoint?",
                here.device
            )))
        };
    }
    let policies = [here.link, remote.link];
    let asks = |p: LinkPolicy| policies.contains(&p);
    if asks(LinkPolicy::Shm) && asks(LinkPolicy::Tcp) {
        return Err(Error::Unreachable(format!(
            "link policies conflict: this process has GDSYNC_SOFT_LINK={}, the peer's ({remote}) {}",
            here.link, remote.link
        )));
    }
    Ok(if asks(LinkPolicy::Tcp) {
        LinkKind::Tcp
    } else if same_process {
        LinkKind::InProcess
    } else if same_host {
        LinkKind::SharedMemory
    } else if asks(LinkPolicy::Shm) {
        return Err(Error::Unreachable(format!(
            "{remote} is on another host and GDSYNC_SOFT_LINK=shm (here: {}, there: {}) rules out TCP",
            here.link, remote.link
        )));
    } else {
        LinkKind::Tcp
    })
}

/// Why [`choose_link`] chose `kind` between `here` and `remote` (for the log).
pub(crate) fn link_reason(here: &Here, remote: &Endpoint, kind: LinkKind) -> &'static str {
    match kind {
        LinkKind::Loopback => "the peer QP is on this device",
        LinkKind::InProcess => "the peer device is in this process",
        LinkKind::SharedMemory => "the peer is another process on this host",
        LinkKind::Tcp if here.link == LinkPolicy::Tcp => "this process has GDSYNC_SOFT_LINK=tcp",
        LinkKind::Tcp if remote.link == LinkPolicy::Tcp => {
            "the peer asks for TCP (its process has GDSYNC_SOFT_LINK=tcp)"
        }
        LinkKind::Tcp => "the peer is on another host",
        LinkKind::Fabric => "the peer is a port of an RDMA device",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(addr: Option<&str>, link: LinkPolicy) -> Endpoint {
        Endpoint {
            host: 0x0123_4567_89AB_CDEF,
            pid: 4242,
            device: 0xFEDC_BA98_7654_3211,
            qpn: 0x1_0000,
            addr: addr.map(|a| a.parse().unwrap()),
            link,
            port: None,
        }
    }

    fn roce() -> PortAddress {
        PortAddress {
            roce: true,
            lid: 0,
            gid: "::ffff:10.0.1.7".parse::<Ipv6Addr>().unwrap().octets(),
            mtu: 1024,
        }
    }

    fn ib() -> PortAddress {
        PortAddress {
            roce: false,
            lid: 0x2c,
            gid: "fe80::e42:a1ff:fe07:1"
                .parse::<Ipv6Addr>()
                .unwrap()
                .octets(),
            mtu: 4096,
        }
    }

    fn on_port(port: PortAddress) -> Endpoint {
        Endpoint {
            port: Some(port),
            ..ep(None, LinkPolicy::Auto)
        }
    }

    #[test]
    fn wire_form_round_trips() {
        for e in [
            ep(None, LinkPolicy::Auto),
            ep(Some("10.1.2.3:40123"), LinkPolicy::Auto),
            ep(Some("127.0.0.1:1"), LinkPolicy::Tcp),
            ep(Some("[fe80::1:2]:65535"), LinkPolicy::Tcp),
            ep(None, LinkPolicy::Shm),
            on_port(roce()),
            on_port(ib()),
        ] {
            let b = e.to_bytes();
            assert_eq!(b.len(), Endpoint::WIRE_LEN);
            assert_eq!(Endpoint::from_bytes(&b).unwrap(), e);
            let s = e.to_string();
            assert_eq!(s.parse::<Endpoint>().unwrap(), e, "{s}");
        }
    }

    #[test]
    fn wire_form_layout() {
        let b = ep(Some("10.1.2.3:40123"), LinkPolicy::Tcp).to_bytes();
        assert_eq!(&b[..4], b"GDE3");
        assert_eq!(b[4..8], 4242u32.to_le_bytes());
        assert_eq!(b[8..16], 0x0123_4567_89AB_CDEFu64.to_le_bytes());
        assert_eq!(b[16..24], 0xFEDC_BA98_7654_3211u64.to_le_bytes());
        assert_eq!(b[24..28], [0, 0, 1, 0]);
        assert_eq!((b[28], b[29]), (2, 4));
        assert_eq!(b[30..32], 40123u16.to_le_bytes());
        assert_eq!(b[32..36], [10, 1, 2, 3]);
        assert!(b[36..].iter().all(|&x| x == 0));
        let none = ep(None, LinkPolicy::Auto).to_bytes();
        assert_eq!((none[28], none[29]), (0, 0));
        assert!(none[30..].iter().all(|&x| x == 0));
        let p = on_port(ib()).to_bytes();
        assert_eq!((p[48], p[49]), (1, 0));
        assert_eq!(p[50..52], 0x2cu16.to_le_bytes());
        assert_eq!(p[52..56], 4096u32.to_le_bytes());
        assert_eq!(p[56..58], [0xfe, 0x80]);
        assert_eq!(p[71], 1);
        assert_eq!(on_port(roce()).to_bytes()[48], 2);
    }

    #[test]
    fn strings() {
        let e = ep(Some("10.1.2.3:40123"), LinkPolicy::Auto);
        assert_eq!(
            e.to_string(),
            "gdsync:0123456789abcdef:4242:fedcba9876543211:10000:auto@10.1.2.3:40123"
        );
        assert_eq!(
            ep(None, LinkPolicy::Shm).to_string(),
            "gdsync:0123456789abcdef:4242:fedcba9876543211:10000:shm@-"
        );
        assert_eq!(
            on_port(roce()).to_string(),
            "gdsync:0123456789abcdef:4242:fedcba9876543211:10000:auto@-+roce/::ffff:10.0.1.7/1024"
        );
        assert_eq!(
            on_port(ib()).to_string(),
            "gdsync:0123456789abcdef:4242:fedcba9876543211:10000:auto@-+ib/44/fe80::e42:a1ff:fe07:1/4096"
        );
        for bad in [
            "gdsync:1:2:3:4:auto@-+",
            "gdsync:1:2:3:4:auto@-+roce/::1",
            "gdsync:1:2:3:4:auto@-+ib/x/::1/1024",
            "gdsync:1:2:3:4:auto@-+iwarp/::1/1024",
            "gdsync:1:2:3:4",
            "gdsync:1:2:3:4:auto",
            "nope:1:2:3:4:auto@-",
            "gdsync:1:2:3:4:fast@-",
            "gdsync:1:2:3:4:tcp@10.0.0.1",
            "gdsync:1:x:3:4:tcp@-",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_wire_forms_are_errors() {
        let good = ep(Some("10.1.2.3:4"), LinkPolicy::Auto).to_bytes();
        assert!(Endpoint::from_bytes(&good[..Endpoint::WIRE_LEN - 1]).is_err());
        assert!(Endpoint::from_bytes(&[0u8; Endpoint::WIRE_LEN]).is_err());
        let mut old = good;
        old[3] = b'2';
        assert!(Endpoint::from_bytes(&old).is_err(), "the GDE2 form is gone");
        let mut bad_layer = on_port(roce()).to_bytes();
        bad_layer[48] = 3;
        assert!(Endpoint::from_bytes(&bad_layer).is_err());
        let mut stray = good;
        stray[60] = 1;
        assert!(
            Endpoint::from_bytes(&stray).is_err(),
            "port bytes without a port"
        );
        let mut bad_policy = good;
        bad_policy[28] = 3;
        assert!(Endpoint::from_bytes(&bad_policy).is_err());
        let mut bad_family = good;
        bad_family[29] = 5;
        assert!(Endpoint::from_bytes(&bad_family).is_err());
    }

    #[test]
    fn policies_parse() {
        assert_eq!("".parse::<LinkPolicy>().unwrap(), LinkPolicy::Auto);
        assert_eq!("tcp".parse::<LinkPolicy>().unwrap(), LinkPolicy::Tcp);
        assert_eq!(" shm ".parse::<LinkPolicy>().unwrap(), LinkPolicy::Shm);
        assert!("TCP/IP".parse::<LinkPolicy>().is_err());
    }

    /// Every combination: the choice is the same from both sides.
    #[test]
    fn both_sides_choose_the_same_link() {
        use LinkPolicy::*;
        let pols = [Auto, Shm, Tcp];
        // (same host, same process)
        for (same_host, same_pid) in [(true, true), (true, false), (false, false)] {
            for a in pols {
                for b in pols {
                    let here_a = Here {
                        host: 1,
                        pid: 10,
                        device: 100,
                        link: a,
                    };
                    let here_b = Here {
                        host: if same_host { 1 } else { 2 },
                        pid: if same_pid { 10 } else { 20 },
                        device: 200,
                        link: b,
                    };
                    let ep_of = |h: &Here| Endpoint {
                        host: h.host,
                        pid: h.pid,
                        device: h.device,
                        qpn: 1,
                        addr: None,
                        link: h.link,
                        port: None,
                    };
                    let ab = choose_link(&here_a, &ep_of(&here_b));
                    let ba = choose_link(&here_b, &ep_of(&here_a));
                    let ctx = format!("{a}/{b} same host {same_host} same pid {same_pid}");
                    match (&ab, &ba) {
                        (Ok(x), Ok(y)) => assert_eq!(x, y, "{ctx}"),
                        (Err(Error::Unreachable(_)), Err(Error::Unreachable(_))) => {}
                        _ => panic!("{ctx}: {ab:?} vs {ba:?}"),
                    }
                    let want = match (a, b) {
                        (Shm, Tcp) | (Tcp, Shm) => None,
                        (Tcp, _) | (_, Tcp) => Some(LinkKind::Tcp),
                        _ if same_pid => Some(LinkKind::InProcess),
                        _ if same_host => Some(LinkKind::SharedMemory),
                        (Shm, _) | (_, Shm) => None,
                        _ => Some(LinkKind::Tcp),
                    };
                    assert_eq!(ab.ok(), want, "{ctx}");
                }
            }
        }
    }

    #[test]
    fn a_device_to_itself() {
        let here = Here {
            host: 1,
            pid: 10,
            device: 100,
            link: LinkPolicy::Tcp,
        };
        let mut e = Endpoint {
            host: 1,
            pid: 10,
            device: 100,
            qpn: 1,
            addr: None,
            link: LinkPolicy::Tcp,
            port: None,
        };
        assert_eq!(choose_link(&here, &e).unwrap(), LinkKind::Loopback);
        e.pid = 11;
        assert!(matches!(
            choose_link(&here, &e),
            Err(Error::InvalidArgument(_))
        ));
    }
}
