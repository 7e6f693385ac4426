//! The handshake between two ends of a socket pair: the same secret passes both ways; a wrong
//! secret, a replayed proof and a handshake cut short are refused, each on the side that can
//! tell.

use super::*;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::thread;

const PURPOSE: &[u8] = b"test";

fn secret(b: u8) -> JobSecret {
    JobSecret([b; SECRET_LEN])
}

/// Runs `accept` with `acceptor`'s secret on one end of a fresh pair and `dialer` on the other.
fn run_pair(
    acceptor: JobSecret,
    dialer: impl FnOnce(&mut UnixStream) -> std::io::Result<()> + Send + 'static,
) -> (std::io::Result<()>, std::io::Result<()>) {
    let (mut a, mut d) = UnixStream::pair().unwrap();
    let h = thread::spawn(move || {
        let r = dialer(&mut d);
        drop(d);
        r
    });
    let accepted = accept(&mut a, &acceptor, PURPOSE, b"hello");
    drop(a); // as a listener drops a connection that failed
    (accepted, h.join().unwrap())
}

#[test]
fn the_same_secret_passes_both_ways() {
    let (acc, dia) = run_pair(secret(1), |s| dial(s, &secret(1), PURPOSE, b"hello"));
    acc.unwrap();
    dia.unwrap();
}

#[test]
fn a_wrong_secret_is_refused_and_the_dialer_learns_nothing() {
    let (acc, dia) = run_pair(secret(1), |s| dial(s, &secret(2), PURPOSE, b"hello"));
    assert_eq!(acc.unwrap_err().kind(), ErrorKind::PermissionDenied);
    // The acceptor closed without its proof.
    assert_eq!(dia.unwrap_err().kind(), ErrorKind::UnexpectedEof);
}

#[test]
fn another_purpose_or_context_is_refused() {
    let (acc, _) = run_pair(secret(1), |s| dial(s, &secret(1), b"other", b"hello"));
    assert_eq!(acc.unwrap_err().kind(), ErrorKind::PermissionDenied);
    let (acc, _) = run_pair(secret(1), |s| dial(s, &secret(1), PURPOSE, b"hellO"));
    assert_eq!(acc.unwrap_err().kind(), ErrorKind::PermissionDenied);
}

/// A dialer checks the acceptor too: an acceptor with another secret is refused.
#[test]
fn the_dialer_refuses_an_acceptor_with_another_secret() {
    let (mut a, mut d) = UnixStream::pair().unwrap();
    // An impostor that answers with its own secret's proof, skipping the check of the dialer's.
    let h = thread::spawn(move || {
        let mut theirs = [0u8; NONCE_LEN];
        a.read_exact(&mut theirs).unwrap();
        let mine = [9u8; NONCE_LEN];
        a.write_all(&mine).unwrap();
        let mut proof = [0u8; PROOF_LEN];
        a.read_exact(&mut proof).unwrap();
        let nonces = [theirs, mine].concat();
        let fake = secret(3).proof(ACCEPTOR, PURPOSE, b"hello", &nonces);
        a.write_all(&fake.finalize().into_bytes()).unwrap();
    });
    let e = dial(&mut d, &secret(1), PURPOSE, b"hello").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    h.join().unwrap();
}

/// What a dialer sent on one connection (its nonce and proof) does not pass on the next: the
/// acceptor's nonce is fresh each time.
#[test]
fn a_replayed_proof_is_refused() {
    let (mut a, mut d) = UnixStream::pair().unwrap();
    let h = thread::spawn(move || accept(&mut a, &secret(1), PURPOSE, b"hello"));
    // A recording relay: the dialer's bytes are kept as they pass.
    let mut nonce = [0u8; NONCE_LEN];
    let mut proof = [0u8; PROOF_LEN];
    let (mut x, mut y) = UnixStream::pair().unwrap();
    let dialer = thread::spawn(move || dial(&mut y, &secret(1), PURPOSE, b"hello"));
    x.read_exact(&mut nonce).unwrap();
    d.write_all(&nonce).unwrap();
    let mut theirs = [0u8; NONCE_LEN];
    d.read_exact(&mut theirs).unwrap();
    x.write_all(&theirs).unwrap();
    x.read_exact(&mut proof).unwrap();
    d.write_all(&proof).unwrap();
    let mut answer = [0u8; PROOF_LEN];
    d.read_exact(&mut answer).unwrap();
    x.write_all(&answer).unwrap();
    h.join().unwrap().unwrap();
    dialer.join().unwrap().unwrap();
    // The replay.
    let (acc, dia) = run_pair(secret(1), move |s| {
        s.write_all(&nonce)?;
        let mut theirs = [0u8; NONCE_LEN];
        s.read_exact(&mut theirs)?;
        s.write_all(&proof)
    });
    assert_eq!(acc.unwrap_err().kind(), ErrorKind::PermissionDenied);
    dia.unwrap();
}

#[test]
fn a_handshake_cut_short_is_an_error() {
    for sent in [0, 5, NONCE_LEN, NONCE_LEN + 7] {
        let (acc, _) = run_pair(secret(1), move |s| {
            let mut theirs = [0u8; NONCE_LEN];
            s.write_all(&vec![0u8; sent.min(NONCE_LEN)])?;
            if sent >= NONCE_LEN {
                s.read_exact(&mut theirs)?;
                s.write_all(&vec![0u8; sent - NONCE_LEN])?;
            }
            Ok(())
        });
        assert_eq!(acc.unwrap_err().kind(), ErrorKind::UnexpectedEof, "{sent}");
    }
}

#[test]
fn secrets_parse_from_hex_and_hide_in_debug() {
    let s = secret(0xAB);
    assert_eq!(s.to_hex(), "ab".repeat(SECRET_LEN));
    assert_eq!(s.to_hex().parse::<JobSecret>().unwrap(), s);
    assert_eq!(
        format!(" {} ", s.to_hex().to_uppercase())
            .parse::<JobSecret>()
            .unwrap(),
        s
    );
    assert_eq!(format!("{s:?}"), "JobSecret(..)");
    for bad in [
        "",
        "ab",
        &"zz".repeat(SECRET_LEN),
        &"ab".repeat(SECRET_LEN + 1),
        &"é".repeat(32),
    ] {
        assert!(bad.parse::<JobSecret>().is_err(), "{bad}");
    }
    assert_ne!(
        JobSecret::generate().unwrap(),
        JobSecret::generate().unwrap()
    );
}
