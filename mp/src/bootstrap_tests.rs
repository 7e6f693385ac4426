//! The TCP bootstrap's decoding of bytes from other processes: length prefixes bounded before
//! allocation, short and malformed messages as errors, and connections that are not ranks
//! dropped while the job's ranks still meet.

use super::*;
use std::io::Cursor;

/// A local port free now (the root binds it next).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// Rank `rank` of a `size`-rank job whose root listens on local `port`.
fn job(rank: usize, size: usize, port: u16) -> JobInfo {
    JobInfo {
        rank,
        size,
        root: format!("127.0.0.1:{port}"),
        secret: secret(),
    }
}

/// A raw connection to the root on local `port`, once it listens.
fn connect_to(port: u16) -> TcpStream {
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The secret of the jobs of these tests.
fn secret() -> JobSecret {
    static S: std::sync::OnceLock<JobSecret> = std::sync::OnceLock::new();
    S.get_or_init(|| JobSecret::generate().unwrap()).clone()
}

fn framed(len: u32, body: &[u8]) -> Vec<u8> {
    let mut b = len.to_le_bytes().to_vec();
    b.extend_from_slice(body);
    b
}

#[test]
fn lengths_are_bounded_before_allocation() {
    // A 4 GiB prefix with nothing behind it: refused from the prefix alone.
    let e = get(&mut Cursor::new(framed(u32::MAX, &[])), MAX_RECORD).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("4294967295 bytes announced"), "{e}");
    // Within the bound but cut short: an error, and only what arrived was allocated.
    let e = get(&mut Cursor::new(framed(1000, &[7; 10])), MAX_RECORD).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    // A prefix cut short, and an empty stream.
    assert!(get(&mut Cursor::new(vec![1, 0]), MAX_RECORD).is_err());
    assert!(get(&mut Cursor::new(vec![]), MAX_RECORD).is_err());
    // Exactly the bound, and an empty message.
    let m = get(&mut Cursor::new(framed(4, &[1, 2, 3, 4])), 4).unwrap();
    assert_eq!(m, [1, 2, 3, 4]);
    assert!(get(&mut Cursor::new(framed(5, &[0; 5])), 4).is_err());
    assert!(get(&mut Cursor::new(framed(0, &[])), 0).unwrap().is_empty());
}

#[test]
fn hellos_are_exactly_four_bytes() {
    assert_eq!(decode_hello(&3u32.to_le_bytes()), Some(3));
    assert_eq!(decode_hello(&[1, 0, 0]), None);
    assert_eq!(decode_hello(&[1, 0, 0, 0, 0]), None);
    assert_eq!(decode_hello(&[]), None);
}

#[test]
fn packed_exchanges_must_match_the_job() {
    let packed = [framed(2, b"ab"), framed(0, &[]), framed(1, b"c")].concat();
    let all = unpack(&packed, 3).unwrap();
    assert_eq!(all, [b"ab".to_vec(), vec![], b"c".to_vec()]);
    assert_eq!(unpack(&packed, 2), None, "one contribution too many");
    assert_eq!(
        unpack(&packed[..packed.len() - 1], 3),
        None,
        "cut in a record"
    );
    assert_eq!(unpack(&packed[..3], 1), None, "cut in a prefix");
    assert_eq!(
        unpack(&framed(u32::MAX, b"x"), 1),
        None,
        "a length past the end"
    );
    assert_eq!(unpack(&[], 0), Some(vec![]));
}

/// The root's word that a rank left mid-exchange is told apart from every exchange (none
/// starts with a length of `u32::MAX`), and anything else is not read as one.
#[test]
fn an_abort_names_the_rank_that_left_and_nothing_else_reads_as_one() {
    let abort = [u32::MAX.to_le_bytes(), 3u32.to_le_bytes()].concat();
    assert_eq!(decode_abort(&abort), Some(3));
    assert_eq!(unpack(&abort, 1), None);
    let exchange = [framed(4, b"abcd")].concat();
    assert_eq!(decode_abort(&exchange), None);
    assert_eq!(decode_abort(&abort[..7]), None, "short");
    assert_eq!(
        decode_abort(&[abort.clone(), vec![0]].concat()),
        None,
        "long"
    );
}

/// A rank sees a peer's bootstrap connection close (its process ended) without reading it;
/// bytes waiting on a live connection say nothing.
#[test]
fn a_closed_connection_is_seen_without_reading() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut far = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut near, _) = l.accept().unwrap();
    assert!(!closed(&near));
    far.write_all(b"x").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!closed(&near), "data waiting");
    near.read_exact(&mut [0u8; 1]).unwrap();
    drop(far);
    let start = Instant::now();
    while !closed(&near) {
        assert!(start.elapsed() < Duration::from_secs(5), "close not seen");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A two-rank job on a fresh port whose root (rank 0, in a thread, with `root_timeout`) first
/// meets what `before` does to its port; then rank 1 joins, and both get the whole exchange.
/// Returns what `before` returned (connections to keep open until then).
fn rank_joins_after<T>(root_timeout: Duration, before: impl FnOnce(u16) -> T) -> T {
    let port = free_port();
    let root = std::thread::spawn(move || {
        let mut b = TcpBootstrap::connect(&job(0, 2, port), root_timeout)?;
        b.all_gather(b"root")
    });
    let kept = before(port);
    let mut rank1 = TcpBootstrap::connect(&job(1, 2, port), Duration::from_secs(20)).unwrap();
    let all = rank1.all_gather(b"one").unwrap();
    assert_eq!(all, [b"root".to_vec(), b"one".to_vec()]);
    assert_eq!(root.join().unwrap().unwrap(), all);
    kept
}

/// Connections that close before a hello, or announce a huge one, are dropped; the real
/// rank that connects after them still joins, and the exchange completes.
#[test]
fn the_root_drops_connections_that_are_not_ranks() {
    rank_joins_after(Duration::from_secs(20), |port| {
        // Closes at once; then a 4 GiB hello; then a hello of the wrong length.
        drop(connect_to(port));
        connect_to(port).write_all(&u32::MAX.to_le_bytes()).unwrap();
        connect_to(port).write_all(&framed(3, &[1, 0, 0])).unwrap();
    });
}

#[test]
fn oversized_contributions_are_refused_before_sending() {
    let info = job(0, 1, free_port());
    let mut b = TcpBootstrap::connect(&info, Duration::from_secs(5)).unwrap();
    let e = b.all_gather(&vec![0; MAX_RECORD + 1]).unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert_eq!(b.all_gather(b"ok").unwrap(), [b"ok".to_vec()]);
}

/// A connection that never says which rank it is gets dropped when the hello's time is up
/// (here the root's whole timeout, 2 s, which is shorter than the hello's 5 s); the rank
/// that connects after it joins meanwhile.
#[test]
fn the_root_drops_silent_connections() {
    rank_joins_after(Duration::from_secs(2), connect_to);
}

/// Connections that do not prove the job's secret are dropped, whatever they send: a rank of
/// another job (another secret), a hello with a proof of zeros, a handshake cut short in the
/// hello or in the nonce. The real rank that connects after them still joins.
#[test]
fn the_root_drops_connections_without_the_job_secret() {
    rank_joins_after(Duration::from_secs(20), |port| {
        let other_job = JobInfo {
            secret: JobSecret::generate().unwrap(),
            ..job(1, 2, port)
        };
        let e = TcpBootstrap::connect(&other_job, Duration::from_secs(20))
            .err()
            .unwrap();
        assert!(e.to_string().contains("authentication"), "{e}");
        let hello = framed(4, &1u32.to_le_bytes());
        let mut zeros = connect_to(port);
        zeros.write_all(&hello).unwrap();
        zeros.write_all(&[0; 32]).unwrap();
        let mut nonce = [0u8; 32];
        zeros.read_exact(&mut nonce).unwrap();
        zeros.write_all(&[0; 32]).unwrap();
        let mut rest = Vec::new();
        zeros.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "a proof of zeros got an answer");
        connect_to(port).write_all(&hello[..6]).unwrap();
        connect_to(port)
            .write_all(&[hello.as_slice(), &[0; 9]].concat())
            .unwrap();
    });
}

/// Connections that say nothing are handled beside the ranks, not before them: with ten of
/// them in front, the rank behind still joins, long before the silent ones' hellos time out
/// (each would have held the root for 5 s, 50 s in all, past the root's 20 s).
#[test]
fn silent_connections_do_not_hold_up_the_ranks_behind_them() {
    let silent = rank_joins_after(Duration::from_secs(20), |port| {
        (0..10).map(|_| connect_to(port)).collect::<Vec<_>>()
    });
    // The silent connections are still open: the root did not wait for them to time out.
    for mut s in silent {
        s.set_nonblocking(true).unwrap();
        let e = s.read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }
}

/// A connection that sends its hello and nonce one byte every 50 ms (each read gets a byte
/// long before a per-read timeout) is dropped when the whole handshake's time is up (600 ms
/// here), not after its last byte (2 s) or later.
#[test]
fn a_trickling_connection_is_dropped_at_the_handshake_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut client = connect_to(port);
    let (mut server, _) = l.accept().unwrap();
    let bytes = [framed(4, &1u32.to_le_bytes()), vec![7u8; 32]].concat();
    let sent = bytes.len();
    let trickler = std::thread::spawn(move || {
        for b in bytes {
            if client.write_all(&[b]).is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    });
    let t = Instant::now();
    let within = Duration::from_millis(600);
    let e = read_hello(&mut server, &job(0, 2, port), within).unwrap_err();
    let took = t.elapsed();
    drop(server);
    assert!(
        took < within + Duration::from_millis(400),
        "dropped after {took:?} ({e}); the deadline was {within:?}"
    );
    assert!(!trickler.join().unwrap(), "all {sent} bytes went out");
}
