//! The TCP link: soft devices in processes that share no memory (other hosts, or any pair
//! when `GDSYNC_SOFT_LINK=tcp`) exchange packets over a TCP connection.
//!
//! Each end of the connection is a bridged [`Link`]: the engine sees the same pair of heap
//! rings as for an in-process peer, and two threads carry records between those rings and
//! the socket. The *outbound* thread drains the engine's send ring into the socket (it parks
//! when the ring is empty; the engine's next record unparks it); the *inbound* thread reads
//! frames from the socket and appends them to the engine's receive ring, waiting for room
//! when it is full (TCP then stops the peer: nothing is dropped, nothing reordered). A
//! socket error or end of stream marks the link dead; the engine then fails the work on it
//! as for a dead process. Dropping the engine's end shuts the socket down, which the peer
//! sees as the end of the stream.
//!
//! A process accepts links on one listening socket shared by its devices (`soft::listen`).
//! The device that connects first dials ([`dial`]) and names both devices in a hello; both
//! sides then prove they know the job's secret ([`crate::auth`]), and the listener hands the
//! connection to the named device. When both dial at the same moment, the
//! dial of the device with the smaller uid wins and the other is answered `Crossed`. The byte
//! layouts of the hello, its answer and the frames are in `docs/soft-device.md` (TCP link)
//! and below.

use super::bridge::BridgeSignal;
use super::link::Link;
use super::link_budget::LinkSlot;
use super::ring::{Consumer, Producer};
use super::wire::{kind, PktHeader, MTU};
use super::EngineWaker;
use crate::auth::HandshakeStream;
use crate::{Error, Result};
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// Longest wait for a TCP connection to be established.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a whole handshake may take, on either side (hello, proofs, answer): one deadline,
/// not one per read, so a peer that trickles bytes cannot hold the connection longer.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The outbound thread wakes at least this often to see whether the link closed.
const IDLE_PARK: Duration = Duration::from_millis(50);
/// The outbound thread writes up to this many bytes of frames with one system call.
const WRITE_BATCH: usize = 256 * 1024;
/// The inbound thread's read buffer.
const READ_BUF: usize = 256 * 1024;

// ---------------------------------------------------------------------------- frames

/// Bytes of a frame header.
pub(crate) const FRAME_HDR: usize = 48;
const FRAME_MAGIC: [u8; 4] = *b"GDSF";

/// The wire form of a packet header: the in-memory [`PktHeader`] with its ring stamp replaced
/// by a frame marker, every integer little-endian, the immediate verbatim. `seg_len` payload
/// bytes follow.
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | `GDSF` |
/// | 4 | kind: 1 request, 2 response |
/// | 5 | op |
/// | 6 | flags |
/// | 7 | syndrome |
/// | 8..12 | dst_qpn |
/// | 12..16 | src_qpn |
/// | 16..20 | psn |
/// | 20..24 | seg_len (≤ 65536) |
/// | 24..28 | offset |
/// | 28..32 | msg_len |
/// | 32..36 | imm |
/// | 36..40 | rkey |
/// | 40..48 | raddr |
pub(crate) fn encode_header(h: &PktHeader) -> [u8; FRAME_HDR] {
    let mut b = [0u8; FRAME_HDR];
    b[..4].copy_from_slice(&FRAME_MAGIC);
    b[4..8].copy_from_slice(&[h.kind, h.op, h.flags, h.syndrome]);
    for (i, v) in [h.dst_qpn, h.src_qpn, h.psn, h.seg_len, h.offset, h.msg_len]
        .into_iter()
        .enumerate()
    {
        b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    b[32..36].copy_from_slice(&h.imm);
    b[36..40].copy_from_slice(&h.rkey.to_le_bytes());
    b[40..48].copy_from_slice(&h.raddr.to_le_bytes());
    b
}

/// Parses a frame header; anything but a request or response of at most one MTU means the
/// stream is corrupt.
pub(crate) fn decode_header(b: &[u8; FRAME_HDR]) -> std::result::Result<PktHeader, String> {
    if b[..4] != FRAME_MAGIC {
        return Err(format!("bad frame marker {:02x?}", &b[..4]));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let h = PktHeader {
        stamp: 0,
        kind: b[4],
        op: b[5],
        flags: b[6],
        syndrome: b[7],
        dst_qpn: u32_at(8),
        src_qpn: u32_at(12),
        psn: u32_at(16),
        seg_len: u32_at(20),
        offset: u32_at(24),
        msg_len: u32_at(28),
        imm: b[32..36].try_into().unwrap(),
        rkey: u32_at(36),
        raddr: u64::from_le_bytes(b[40..48].try_into().unwrap()),
    };
    if h.kind != kind::REQ && h.kind != kind::RESP {
        return Err(format!("bad packet kind {}", h.kind));
    }
    if h.seg_len as usize > MTU {
        return Err(format!("segment of {} bytes exceeds the MTU", h.seg_len));
    }
    Ok(h)
}

/// A buffer for [`read_frame`]: room for the largest payload a frame may carry (one MTU).
pub(crate) fn payload_buffer() -> Vec<u8> {
    vec![0u8; MTU]
}

/// Reads the next frame from `rd`: its header, and its payload into the start of `payload`
/// (at least one MTU). An error for a stream that ends or is corrupt: every field the reader
/// relies on is checked ([`decode_header`]) before a byte of payload is read.
pub(crate) fn read_frame(
    rd: &mut impl Read,
    payload: &mut [u8],
) -> std::result::Result<PktHeader, String> {
    let mut hb = [0u8; FRAME_HDR];
    rd.read_exact(&mut hb)
        .map_err(|e| format!("connection closed: {e}"))?;
    let h = decode_header(&hb).map_err(|e| format!("corrupt stream: {e}"))?;
    let body = payload
        .get_mut(..h.seg_len as usize)
        .ok_or_else(|| format!("a segment of {} bytes does not fit the buffer", h.seg_len))?;
    rd.read_exact(body)
        .map_err(|e| format!("connection closed inside a frame: {e}"))?;
    Ok(h)
}

// ---------------------------------------------------------------------------- hello

const HELLO_MAGIC: [u8; 8] = *b"GDSTCP01";
pub(crate) const HELLO_LEN: usize = 48;
pub(crate) const ANSWER_LEN: usize = 16;

/// The dialer's first message: who dials whom, and what the frames will look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The dialing device's uid.
    pub dialer: u64,
    /// The device dialed.
    pub target: u64,
    /// The dialer's host id and process id (for messages).
    pub host: u64,
    pub pid: u32,
    /// The dialer's MTU and byte order (atomic operands travel in native order).
    pub mtu: u32,
    pub little_endian: bool,
}

impl Hello {
    /// A hello from this build.
    pub(crate) fn new(dialer: u64, target: u64, host: u64, pid: u32) -> Self {
        Self {
            dialer,
            target,
            host,
            pid,
            mtu: MTU as u32,
            little_endian: cfg!(target_endian = "little"),
        }
    }

    /// Whether frames from the dialer mean the same here.
    pub(crate) fn compatible(&self) -> bool {
        *self == Self::new(self.dialer, self.target, self.host, self.pid)
    }

    /// `GDSTCP01`, dialer uid, target uid, host id (u64 LE each), pid, MTU (u32 LE), byte
    /// order (1 little-endian, 2 big-endian), 7 zero bytes.
    pub(crate) fn to_bytes(self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..16].copy_from_slice(&self.dialer.to_le_bytes());
        b[16..24].copy_from_slice(&self.target.to_le_bytes());
        b[24..32].copy_from_slice(&self.host.to_le_bytes());
        b[32..36].copy_from_slice(&self.pid.to_le_bytes());
        b[36..40].copy_from_slice(&self.mtu.to_le_bytes());
        b[40] = if self.little_endian { 1 } else { 2 };
        b
    }

    pub(crate) fn from_bytes(b: &[u8; HELLO_LEN]) -> Option<Self> {
        if b[..8] != HELLO_MAGIC {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Some(Self {
            dialer: u64_at(8),
            target: u64_at(16),
            host: u64_at(24),
            pid: u32_at(32),
            mtu: u32_at(36),
            little_endian: b[40] == 1,
        })
    }
}

/// The listener's answer to a hello: `GDSTCP01`, a u32 LE code, 4 zero bytes. Frames follow
/// only an `Accepted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Accepted = 0,
    NoDevice = 1,
    AlreadyLinked = 2,
    /// The target is dialing the dialer at the same moment, and has the smaller uid: its dial
    /// wins, and the dialer waits for it. (`AlreadyLinked` is answered when the target's
    /// dial has already won; the dialer waits the same way.)
    Crossed = 3,
    Incompatible = 4,
    /// The listener has as many links from the dialer's address, or in all, as it accepts.
    TooManyLinks = 5,
}

impl Answer {
    const ALL: [Answer; 6] = [
        Answer::Accepted,
        Answer::NoDevice,
        Answer::AlreadyLinked,
        Answer::Crossed,
        Answer::Incompatible,
        Answer::TooManyLinks,
    ];

    fn to_bytes(self) -> [u8; ANSWER_LEN] {
        let mut b = [0u8; ANSWER_LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..12].copy_from_slice(&(self as u32).to_le_bytes());
        b
    }

    /// The code of an answer's bytes; `None` if they do not start with the hello marker.
    pub(crate) fn code_of(b: &[u8; ANSWER_LEN]) -> Option<u32> {
        let (magic, rest) = b.split_first_chunk::<8>()?;
        let code = rest.first_chunk::<4>()?;
        (*magic == HELLO_MAGIC).then(|| u32::from_le_bytes(*code))
    }

    pub(crate) fn describe(code: u32) -> String {
        match Self::ALL.into_iter().find(|a| *a as u32 == code) {
            Some(Answer::Accepted) => "accepted".into(),
            Some(Answer::NoDevice) => "its process has no such device (dropped?)".into(),
            Some(Answer::AlreadyLinked) => "it already has a link to this device".into(),
            Some(Answer::Crossed) => "it is dialing this device at the same moment".into(),
            Some(Answer::Incompatible) => {
                "it uses another MTU or byte order (a different gdsync build?)".into()
            }
            Some(Answer::TooManyLinks) => format!(
                "it has as many TCP links from this host, or in all, as it accepts (its log names the bound; {} and {} raise them there)",
                super::link_budget::PER_ADDR_ENV,
                super::link_budget::TOTAL_ENV
            ),
            None => format!("unknown answer code {code}"),
        }
    }
}

/// Sends the answer to a hello (within [`HANDSHAKE_TIMEOUT`]).
pub(crate) fn answer(stream: &mut TcpStream, a: Answer) -> std::io::Result<()> {
    HandshakeStream::new(stream, HANDSHAKE_TIMEOUT).write_all(&a.to_bytes())
}

/// What a dial achieved.
pub(crate) enum Dialed {
    /// A new link to the target.
    Linked(Box<Link>),
    /// The link is the one the target dialed: its dial wins (`Crossed`) or already won
    /// (`AlreadyLinked`: our listener accepted it). Wait for our listener to install it.
    TheirDial,
}

/// Connects to the listener at `addr`, asks for a link to `hello.target`, and bridges the
/// connection to a new link. Bounded: [`CONNECT_TIMEOUT`] to connect, then
/// [`HANDSHAKE_TIMEOUT`] for the whole handshake.
pub(crate) fn dial(addr: SocketAddr, hello: &Hello, engine: EngineWaker) -> Result<Dialed> {
    let target = hello.target;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Error::Unreachable(format!(
            "TCP link to device {target:016x} at {addr}: {what}: {e}"
        ))
    };
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| fail("connect", &e))?;
    // The hello and the nonce go out back to back: no waiting for an acknowledgement.
    s.set_nodelay(true)
        .map_err(|e| fail("socket options", &e))?;
    let mut hs = HandshakeStream::new(&s, HANDSHAKE_TIMEOUT);
    hs.write_all(&hello.to_bytes())
        .map_err(|e| fail("send hello", &e))?;
    authenticate_dial(&mut hs, hello).map_err(|e| fail("authentication", &e))?;
    let mut a = [0u8; ANSWER_LEN];
    hs.read_exact(&mut a).map_err(|e| fail("no answer", &e))?;
    let Some(code) = Answer::code_of(&a) else {
        return Err(fail("answer", &"not a gdsync soft-device listener"));
    };
    match code {
        code if code == Answer::Accepted as u32 => {
            bridge(s, target, engine, None).map(|l| Dialed::Linked(Box::new(l)))
        }
        code if code == Answer::Crossed as u32 || code == Answer::AlreadyLinked as u32 => {
            Ok(Dialed::TheirDial)
        }
        code => Err(fail("refused", &Answer::describe(code))),
    }
}

// ---------------------------------------------------------------------------- handshake

/// What the job-secret proofs of a link's handshake are for ([`crate::auth`]).
const AUTH_PURPOSE: &[u8] = b"gdsync soft-device TCP link";

/// The listener's side of a new connection's handshake: reads the hello, then checks that the
/// dialer knows the job's secret (and proves it in turn), all within `within`. `None`, logged
/// with the peer's address, for a connection that fails either: the caller drops it.
pub(crate) fn handshake_accepted(
    stream: &TcpStream,
    from: SocketAddr,
    within: Duration,
) -> Option<Hello> {
    let refuse = |why: String| {
        tracing::warn!("soft device: dropped a TCP connection from {from}: {why}");
        None
    };
    // The listener's nonce and proof go out without waiting for acknowledgements.
    if let Err(e) = stream.set_nodelay(true) {
        return refuse(format!("socket options: {e}"));
    }
    let mut stream = HandshakeStream::new(stream, within);
    let mut b = [0u8; HELLO_LEN];
    if let Err(e) = stream.read_exact(&mut b) {
        return refuse(format!("no hello: {e}"));
    }
    let Some(hello) = Hello::from_bytes(&b) else {
        return refuse("not a gdsync soft-device hello".into());
    };
    let secret = match crate::auth::job_secret() {
        Ok(s) => s,
        Err(e) => return refuse(e.to_string()),
    };
    if let Err(e) = crate::auth::accept(&mut stream, &secret, AUTH_PURPOSE, &b) {
        return refuse(format!(
            "authentication failed ({e}): a process of another job, or without this job's {}?",
            crate::auth::SECRET_ENV
        ));
    }
    Some(hello)
}

/// The dialer's side of the handshake, after its hello: proves the job's secret and checks
/// the listener's proof.
fn authenticate_dial(s: &mut HandshakeStream, hello: &Hello) -> std::result::Result<(), String> {
    let secret = crate::auth::job_secret().map_err(|e| e.to_string())?;
    crate::auth::dial(s, &secret, AUTH_PURPOSE, &hello.to_bytes()).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "{e}: it is not a process of this job (or its {} differs)",
            crate::auth::SECRET_ENV
        ),
        _ => format!(
            "{e}: it refused this process's proof of the job secret? (every process of a job needs the same {}; mp's launch_local sets it)",
            crate::auth::SECRET_ENV
        ),
    })
}

// ---------------------------------------------------------------------------- bridge

/// Turns an established connection (hello exchanged) into a link to device `peer`: starts
/// the outbound and inbound threads. `slot`, the link's place in the listener's budget, is
/// given back when the link is released.
pub(crate) fn bridge(
    stream: TcpStream,
    peer: u64,
    engine: EngineWaker,
    slot: Option<LinkSlot>,
) -> Result<Link> {
    let io = |e: std::io::Error| Error::os("set up the TCP link's socket", e);
    stream.set_nodelay(true).map_err(io)?;
    stream.set_read_timeout(None).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    let reader = stream.try_clone().map_err(io)?;
    let closer = stream.try_clone().map_err(io)?;
    let (link, end) = Link::bridged(peer);
    end.signal.set_closer(move || {
        let _ = closer.shutdown(Shutdown::Both);
    });
    if let Some(slot) = slot {
        end.signal.hold(slot);
    }
    let name = |dir: &str| format!("gdsync-tcp-{dir}-{:04x}", peer as u16);
    let signal = end.signal.clone();
    std::thread::Builder::new()
        .name(name("out"))
        .spawn(move || outbound(end.outbound, stream, &signal))
        .map_err(|e| Error::os("spawn a TCP link thread", e))?;
    let signal = end.signal;
    // On failure the link is dropped here, which stops the outbound thread.
    std::thread::Builder::new()
        .name(name("in"))
        .spawn(move || inbound(end.inbound, reader, &signal, &engine))
        .map_err(|e| Error::os("spawn a TCP link thread", e))?;
    Ok(link)
}

/// Engine's send ring → socket, in ring order.
fn outbound(mut ring: Consumer, mut sock: TcpStream, signal: &BridgeSignal) {
    signal.register_outbound();
    let mut buf = Vec::with_capacity(WRITE_BATCH + FRAME_HDR + MTU);
    while !signal.is_down() && !signal.engine_gone() {
        while let Some((h, payload)) = ring.peek() {
            buf.extend_from_slice(&encode_header(&h));
            buf.extend_from_slice(payload);
            ring.pop(&h);
            if buf.len() >= WRITE_BATCH {
                break;
            }
        }
        if !buf.is_empty() {
            if let Err(e) = sock.write_all(&buf) {
                tracing::debug!("soft device: TCP link closed while sending: {e}");
                break;
            }
            buf.clear();
            continue;
        }
        signal.outbound_sleeps(true);
        if ring.peek().is_none() {
            std::thread::park_timeout(IDLE_PARK);
        }
        signal.outbound_sleeps(false);
    }
    signal.set_down();
}

/// Socket → engine's receive ring, in stream order; waits for room when the ring is full.
fn inbound(mut ring: Producer, sock: TcpStream, signal: &BridgeSignal, engine: &EngineWaker) {
    let mut rd = BufReader::with_capacity(READ_BUF, sock);
    let mut payload = payload_buffer();
    let why = loop {
        let h = match read_frame(&mut rd, &mut payload) {
            Ok(h) => h,
            Err(e) => break e,
        };
        let body = &payload[..h.seg_len as usize];
        if !deliver(&mut ring, &h, body, signal, engine) {
            break "the link closed".into();
        }
        engine.wake();
    };
    tracing::debug!("soft device: TCP link down: {why}");
    signal.set_down();
}

/// Appends one packet to the engine's receive ring, waiting while it is full. False if the
/// link closed meanwhile.
fn deliver(
    ring: &mut Producer,
    h: &PktHeader,
    body: &[u8],
    signal: &BridgeSignal,
    engine: &EngineWaker,
) -> bool {
    let mut tries = 0u32;
    loop {
        if ring
            .try_push(h, body.len(), |b| b.copy_from_slice(body))
            .is_some()
        {
            return true;
        }
        if signal.engine_gone() || signal.is_down() {
            return false;
        }
        engine.wake();
        tries += 1;
        if tries < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::flag;
    use super::*;

    fn sample() -> PktHeader {
        PktHeader {
            stamp: 0x8000_0001,
            kind: kind::REQ,
            op: 0x0A,
            flags: flag::FIRST | flag::LAST,
            syndrome: 0x13,
            dst_qpn: 0x0102_0304,
            src_qpn: 0x0506_0708,
            psn: 0x090A_0B0C,
            seg_len: 0x1_0000,
            offset: 0x1112_1314,
            msg_len: 0x1516_1718,
            imm: [0xDE, 0xAD, 0xBE, 0xEF],
            rkey: 0x191A_1B1C,
            raddr: 0x2122_2324_2526_2728,
        }
    }

    /// The frame header's bytes, field by field, little-endian.
    #[test]
    fn frame_header_layout() {
        let b = encode_header(&sample());
        let want: [u8; FRAME_HDR] = [
            b'G', b'D', b'S', b'F', 1, 0x0A, 3, 0x13, // marker, kind, op, flags, syndrome
            0x04, 0x03, 0x02, 0x01, 0x08, 0x07, 0x06, 0x05, // dst_qpn, src_qpn
            0x0C, 0x0B, 0x0A, 0x09, 0x00, 0x00, 0x01, 0x00, // psn, seg_len
            0x14, 0x13, 0x12, 0x11, 0x18, 0x17, 0x16, 0x15, // offset, msg_len
            0xDE, 0xAD, 0xBE, 0xEF, 0x1C, 0x1B, 0x1A, 0x19, // imm (verbatim), rkey
            0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21, // raddr
        ];
        assert_eq!(b, want);
    }

    #[test]
    fn frame_header_round_trips_without_the_stamp() {
        let h = sample();
        let d = decode_header(&encode_header(&h)).unwrap();
        assert_eq!(d.stamp, 0, "the ring stamp does not travel");
        assert_eq!(encode_header(&d), encode_header(&h));
        let resp = PktHeader {
            kind: kind::RESP,
            seg_len: 0,
            ..h
        };
        assert_eq!(
            decode_header(&encode_header(&resp)).unwrap().kind,
            kind::RESP
        );
    }

    #[test]
    fn corrupt_frame_headers_are_rejected() {
        let good = encode_header(&sample());
        let mut b = good;
        b[0] = b'X';
        assert!(decode_header(&b).unwrap_err().contains("marker"));
        let mut b = good;
        b[4] = kind::SKIP;
        assert!(decode_header(&b).unwrap_err().contains("kind"));
        let mut b = good;
        b[20..24].copy_from_slice(&(MTU as u32 + 1).to_le_bytes());
        assert!(decode_header(&b).unwrap_err().contains("MTU"));
    }

    #[test]
    fn hello_round_trips_and_checks_compatibility() {
        let h = Hello::new(1, 2, 3, 4);
        assert!(h.compatible());
        let b = h.to_bytes();
        assert_eq!(&b[..8], b"GDSTCP01");
        assert_eq!(Hello::from_bytes(&b), Some(h));
        assert_eq!(b[36..40], (MTU as u32).to_le_bytes());
        let mut other = b;
        other[36..40].copy_from_slice(&1500u32.to_le_bytes());
        assert!(!Hello::from_bytes(&other).unwrap().compatible());
        let mut big = b;
        big[40] = 2;
        assert!(!Hello::from_bytes(&big).unwrap().compatible());
        let mut junk = b;
        junk[0] = b'H';
        assert_eq!(Hello::from_bytes(&junk), None);
    }

    #[test]
    fn answers_have_fixed_codes() {
        assert_eq!(Answer::Accepted.to_bytes()[8..12], [0, 0, 0, 0]);
        assert_eq!(Answer::Incompatible.to_bytes()[8..12], [4, 0, 0, 0]);
        assert!(Answer::describe(1).contains("no such device"));
        assert!(Answer::describe(99).contains("unknown"));
    }
}
