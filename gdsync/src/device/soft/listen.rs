//! Where and when this process accepts soft-device TCP links: one listening socket for all its
//! devices, started only when a TCP link may be needed, on loopback unless told otherwise, and
//! its accept loop, which authenticates every connection, and holds each peer address to its
//! budget of links ([`link_budget`](super::link_budget)), before a device sees it.
//!
//! The listener starts when an endpoint is made under `GDSYNC_SOFT_LINK=tcp`, when
//! `GDSYNC_SOFT_ADDR` or `GDSYNC_SOFT_IFACE` names where to listen, or when asked
//! ([`accept_tcp_links`](crate::accept_tcp_links): mp does when its ranks span hosts). Threads
//! of one process, and processes of one host under the default policy, never listen.

use super::link_budget::{self, LinkSlot, OverBudget};
use super::tcp::{self, Hello};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `ip` or `ip:port`: where to listen, and the IP endpoints advertise.
pub(crate) const ADDR_ENV: &str = "GDSYNC_SOFT_ADDR";
/// An interface name (as `ip link` shows it): listen on its address.
pub(crate) const IFACE_ENV: &str = "GDSYNC_SOFT_IFACE";
/// Connections whose handshake is under way at once; each new one past this closes the oldest
/// (a flood of connections that say nothing would otherwise hold a thread each, up to the
/// handshake's timeout, and a legitimate dial still gets through).
pub(crate) const MAX_HANDSHAKES: usize = 64;
/// Connections the kernel queues for the accept loop. `std` asks for 128; a burst of dials
/// past that had their SYNs dropped and retried a second later, so the listener took about
/// 200 connections a second. (The kernel caps it at `net.core.somaxconn`.)
const LISTEN_BACKLOG: i32 = 4096;

/// The address peers dial, once the listener runs.
static RUNNING: Mutex<Option<SocketAddr>> = Mutex::new(None);

/// What serves a connection whose hello parsed and whose dialer proved the job's secret, with
/// its place in the budget of links (dropped if no link is made).
pub(crate) type OnDial = fn(Hello, TcpStream, LinkSlot);

/// The address this process accepts TCP links at, if its listener runs.
pub(crate) fn running() -> Option<SocketAddr> {
    *RUNNING.lock()
}

/// Whether the environment names where to listen (the user expects TCP links then).
pub(crate) fn configured() -> bool {
    [ADDR_ENV, IFACE_ENV]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Starts the listener (once per process) and returns the address peers dial. Bind address:
/// `GDSYNC_SOFT_ADDR`, else the address of `GDSYNC_SOFT_IFACE`, else `ip`, else loopback.
/// Advertised address: the bound IP, or for a wildcard the host's primary IPv4 address (else
/// loopback). A listener that runs stays where it is; one that failed may be tried again.
pub(crate) fn start(ip: Option<IpAddr>, on_dial: OnDial) -> Result<SocketAddr> {
    let mut running = RUNNING.lock();
    if let Some(a) = *running {
        if ip.is_some_and(|ip| ip != a.ip()) && !configured() {
            tracing::debug!("soft device: TCP links are accepted at {a} already (not at {ip:?})");
        }
        return Ok(a);
    }
    let bind = bind_address(ip).and_then(|b| {
        let l = TcpListener::bind(b)
            .map_err(|e| Error::os(format!("listen on {b} for soft-device TCP links"), e))?;
        Ok((b, l))
    });
    let (bind, l) = bind.inspect_err(|e| {
        tracing::warn!("soft device: no TCP listener, peers cannot dial this process: {e}")
    })?;
    // SAFETY: listen(2) on the listening socket's own fd: it only sets the queue's length.
    if unsafe { libc::listen(l.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        tracing::debug!(
            "soft device: the TCP listener keeps its queue of 128 connections: {}",
            std::io::Error::last_os_error()
        );
    }
    let port = l
        .local_addr()
        .map_err(|e| Error::os("listener address", e))?
        .port();
    let advertised = if bind.ip().is_unspecified() {
        primary_ipv4().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4)
    } else {
        bind.ip()
    };
    std::thread::Builder::new()
        .name("gdsync-tcp-listen".into())
        .spawn(move || accept_loop(l, on_dial))
        .map_err(|e| Error::os("spawn the TCP listener thread", e))?;
    let addr = SocketAddr::new(advertised, port);
    tracing::debug!("soft device: this process accepts TCP links at {addr} (bound to {bind})");
    *running = Some(addr);
    Ok(addr)
}

fn bind_address(ip: Option<IpAddr>) -> Result<SocketAddr> {
    if let Ok(v) = std::env::var(ADDR_ENV) {
        if !v.trim().is_empty() {
            return parse_soft_addr(&v);
        }
    }
    if let Ok(v) = std::env::var(IFACE_ENV) {
        if !v.trim().is_empty() {
            return interface_ip(v.trim()).map(|ip| SocketAddr::new(ip, 0));
        }
    }
    Ok(SocketAddr::new(
        ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        0,
    ))
}

/// `GDSYNC_SOFT_ADDR`: `ip` (any free port) or `ip:port` (`[v6]:port` for IPv6).
pub(crate) fn parse_soft_addr(s: &str) -> Result<SocketAddr> {
    let s = s.trim();
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| {
            Error::invalid(format!(
                "{ADDR_ENV}={s:?}: expected an IP address, optionally with :port"
            ))
        })
}

/// The source address of the default route: a UDP socket "connected" to a public address
/// picks it (no packet is sent). `None` without a route, or if it is a loopback address.
pub(crate) fn primary_ipv4() -> Option<Ipv4Addr> {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    s.connect((Ipv4Addr::new(8, 8, 8, 8), 53)).ok()?;
    match s.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

/// The address of interface `name`: its first IPv4 address, else its first IPv6 address.
fn interface_ip(name: &str) -> Result<IpAddr> {
    let all = interface_addresses()?;
    let mine = |v6: bool| {
        all.iter()
            .find(|(n, ip)| n == name && ip.is_ipv6() == v6)
            .map(|(_, ip)| *ip)
    };
    mine(false).or_else(|| mine(true)).ok_or_else(|| {
        let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        Error::invalid(format!(
            "{IFACE_ENV}={name:?}: no such interface with an IP address (interfaces: {})",
            names.join(", ")
        ))
    })
}

/// Every (interface name, IP address) of this host, in the kernel's order.
fn interface_addresses() -> Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs stores the head of a list it allocated; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::os(
            "list the network interfaces",
            std::io::Error::last_os_error(),
        ));
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list, alive until freeifaddrs; its name is a C string
        // and its address, when not null, a sockaddr of the family it names.
        unsafe {
            let ifa = &*p;
            if !ifa.ifa_addr.is_null() {
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                        out.push((name, IpAddr::V4(ip)));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push((name, IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))));
                    }
                    _ => {}
                }
            }
            p = ifa.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Connections in their handshake, oldest first, with a handle to close each.
struct Pending {
    next: u64,
    conns: VecDeque<(u64, TcpStream)>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    next: 0,
    conns: VecDeque::new(),
});

/// Files a new connection as in its handshake; past [`MAX_HANDSHAKES`], the oldest is closed
/// (its thread then ends at once). Returns the new one's id.
fn admit(stream: &TcpStream, from: SocketAddr) -> u64 {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let mut p = PENDING.lock();
    if p.conns.len() >= MAX_HANDSHAKES {
        if let Some((_, oldest)) = p.conns.pop_front() {
            let _ = oldest.shutdown(Shutdown::Both);
        }
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "soft device: {MAX_HANDSHAKES} TCP connections are in their handshake at once: closing the oldest for each new one (the latest from {from}; a connection flood?)"
            );
        }
    }
    p.next += 1;
    let id = p.next;
    if let Ok(s) = stream.try_clone() {
        p.conns.push_back((id, s));
    }
    id
}

fn finished(id: u64) {
    PENDING.lock().conns.retain(|(i, _)| *i != id);
}

/// Accepts connections for ever; each is served on a thread of its own (a silent client must
/// not hold up other dials); at most [`MAX_HANDSHAKES`] are in their handshake at once.
fn accept_loop(l: TcpListener, on_dial: OnDial) {
    loop {
        match l.accept() {
            Ok((stream, from)) => {
                let id = admit(&stream, from);
                let r = std::thread::Builder::new()
                    .name("gdsync-tcp-hello".into())
                    .spawn(move || {
                        let hello = tcp::handshake_accepted(&stream, from, tcp::HANDSHAKE_TIMEOUT);
                        finished(id);
                        if let Some(h) = hello {
                            serve(h, stream, from, on_dial);
                        }
                    });
                if let Err(e) = r {
                    finished(id);
                    tracing::warn!("soft device: cannot serve a TCP dial: {e}");
                }
            }
            Err(e) => {
                // Out of file descriptors and the like: try again shortly.
                tracing::warn!("soft device: TCP accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Hands an authenticated connection to its device if its address and the process have room
/// for another link; refuses it (answered, and logged) if not.
fn serve(hello: Hello, mut stream: TcpStream, from: SocketAddr, on_dial: OnDial) {
    match link_budget::process_budget().claim(from.ip()) {
        Ok(slot) => on_dial(hello, stream, slot),
        Err(over) => {
            warn_over_budget(&hello, from, &over);
            let _ = tcp::answer(&mut stream, tcp::Answer::TooManyLinks);
        }
    }
}

/// Logs a link refused for its budget: at once, then at most once a second with the count of
/// those refused meanwhile (a peer that dials in a loop must not flood the log).
fn warn_over_budget(hello: &Hello, from: SocketAddr, over: &OverBudget) {
    static LAST: Mutex<(Option<Instant>, u64)> = Mutex::new((None, 0));
    let mut last = LAST.lock();
    let now = Instant::now();
    if last
        .0
        .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
    {
        last.1 += 1;
        return;
    }
    let more = std::mem::take(&mut last.1);
    *last = (Some(now), 0);
    let meanwhile = if more > 0 {
        format!(" ({more} more refused since the last warning)")
    } else {
        String::new()
    };
    tracing::warn!(
        "soft device: refused a TCP link from {from} (device {:016x}, pid {} by its hello) to device {:016x}: {over}{meanwhile}",
        hello.dialer,
        hello.pid,
        hello.target
    );
}

/// The integration tests' log recorder, for the listener's own warnings.
#[cfg(test)]
#[path = "../../../tests/support/capture.rs"]
mod capture;

#[cfg(test)]
mod tests {
    use super::*;

    /// A dial from an address that has all its links already is answered "too many links"
    /// and logged at warn, naming the address, the bound and the variable that raises it;
    /// no device sees it.
    #[test]
    fn a_dial_past_its_address_budget_is_refused_and_logged() {
        use std::io::Read;
        let from: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        let budget = link_budget::process_budget();
        let held: Vec<LinkSlot> = std::iter::from_fn(|| budget.claim(from.ip()).ok()).collect();
        assert_eq!(held.len(), link_budget::DEFAULT_PER_ADDR);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (stream, _) = l.accept().unwrap();
        fn no_device_may_see_it(_: Hello, _: TcpStream, _: LinkSlot) {
            panic!("a dial past its budget reached a device")
        }
        let log = capture::Capture::default();
        tracing::dispatcher::with_default(&log.dispatch(), || {
            serve(
                Hello::new(9, 10, 11, 12),
                stream,
                from,
                no_device_may_see_it,
            )
        });
        let mut answer = [0u8; tcp::ANSWER_LEN];
        client.read_exact(&mut answer).unwrap();
        assert_eq!(
            tcp::Answer::code_of(&answer),
            Some(tcp::Answer::TooManyLinks as u32)
        );
        let warned = log.one(&["refused a TCP link from 192.0.2.7:4000"]);
        assert_eq!(warned.level, tracing::Level::WARN);
        for word in ["192.0.2.7 has 8 links", "GDSYNC_SOFT_MAX_LINKS_PER_ADDR=8"] {
            assert!(warned.text.contains(word), "{warned:?}");
        }
        drop(held);
        assert!(budget.claim(from.ip()).is_ok(), "the places came back");
    }

    #[test]
    fn soft_addr_forms() {
        assert_eq!(
            parse_soft_addr("10.0.0.5").unwrap(),
            "10.0.0.5:0".parse().unwrap()
        );
        assert_eq!(
            parse_soft_addr(" 127.0.0.1:4000 ").unwrap(),
            "127.0.0.1:4000".parse().unwrap()
        );
        assert_eq!(
            parse_soft_addr("[::1]:7").unwrap(),
            "[::1]:7".parse().unwrap()
        );
        assert_eq!(parse_soft_addr("::").unwrap(), "[::]:0".parse().unwrap());
        assert!(parse_soft_addr("host.example:4000").is_err());
        assert!(parse_soft_addr("10.0.0.5:99999").is_err());
    }

    #[test]
    fn interfaces_are_found_by_name() {
        assert_eq!(interface_ip("lo").unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = interface_ip("no-such-if0").unwrap_err().to_string();
        assert!(
            e.contains("GDSYNC_SOFT_IFACE=\"no-such-if0\"") && e.contains("lo"),
            "{e}"
        );
    }
}
