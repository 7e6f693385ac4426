//! Job secrets, and the challenge–response that authenticates every TCP connection between the
//! processes of a job (soft-device links, the TCP bootstrap of `mp`).
//!
//! A job shares one 32-byte secret. The process that starts the job makes it
//! ([`JobSecret::generate`]) and hands it to the processes it starts through their environment
//! ([`SECRET_ENV`], 64 hex digits: `mp::bootstrap::launch_local` does this); a job started by
//! another launcher (mpirun, srun, ssh) sets the variable to the same value in every process.
//! The secret never travels on a connection: each side proves it knows it by an HMAC-SHA256 over
//! both sides' fresh random nonces and what the connection is for ([`dial`], [`accept`]), and
//! checks the other's proof in constant time. A recorded proof is worth nothing on a later
//! connection (the other side's nonce differs), and a dialer's proof cannot pass for an
//! acceptor's (each names its role).
//!
//! Without a secret from the environment or [`set_job_secret`], a process uses one of its own,
//! drawn at random: TCP links between its own devices work, and any other process is refused.

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;
use std::io::{Error as IoError, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The environment variable that carries the job secret: 64 hexadecimal digits.
pub const SECRET_ENV: &str = "GDSYNC_JOB_SECRET";
/// Bytes of a job secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of each side's nonce, and of each side's proof.
const NONCE_LEN: usize = 32;
const PROOF_LEN: usize = 32;

/// A job's shared secret. Its `Debug` form hides the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

impl JobSecret {
    /// A new secret from the operating system's random source.
    pub fn generate() -> crate::Result<Self> {
        let mut b = [0u8; SECRET_LEN];
        random(&mut b)?;
        Ok(Self(b))
    }

    /// The secret of [`SECRET_ENV`], if it is set; an error if it is set but not 64 hex digits.
    pub fn from_env() -> crate::Result<Option<Self>> {
        match std::env::var(SECRET_ENV) {
            Ok(v) => v
                .parse()
                .map(Some)
                .map_err(|_| crate::Error::invalid(format!("{SECRET_ENV}: expected 64 hexadecimal digits (for example the output of `openssl rand -hex 32`)"))),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(crate::Error::invalid(format!(
                "{SECRET_ENV}: expected 64 hexadecimal digits"
            ))),
        }
    }

    /// The form [`SECRET_ENV`] takes: 64 lower-case hex digits. Handle it as a password.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn proof(&self, role: &[u8], purpose: &[u8], context: &[u8], nonces: &[u8]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        // Length-prefixed fields: no two different inputs share a byte string.
        for field in [b"gdsync-auth-v1".as_slice(), role, purpose, context, nonces] {
            m.update(&(field.len() as u32).to_le_bytes());
            m.update(field);
        }
        m
    }
}

impl std::str::FromStr for JobSecret {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        let s = s.trim();
        let bad = || crate::Error::invalid("a job secret is 64 hexadecimal digits");
        if s.len() != 2 * SECRET_LEN || !s.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(b))
    }
}

fn random(b: &mut [u8]) -> crate::Result<()> {
    crate::random::fill(b).map_err(|e| crate::Error::os("draw random bytes for authentication", e))
}

/// The process's secret: set by [`set_job_secret`], else read from [`SECRET_ENV`], else drawn
/// at random on first use.
static SECRET: Mutex<Option<JobSecret>> = Mutex::new(None);

/// Makes `secret` the one this process proves and expects on TCP connections from now on (mp's
/// TCP bootstrap sets the job's).
pub fn set_job_secret(secret: JobSecret) {
    *SECRET.lock() = Some(secret);
}

/// This process's job secret (see [`set_job_secret`]). A launcher passes it to the processes it
/// starts as [`SECRET_ENV`] (`job_secret()?.to_hex()`). An error if [`SECRET_ENV`] is malformed
/// or no random bytes could be drawn.
pub fn job_secret() -> crate::Result<JobSecret> {
    let mut s = SECRET.lock();
    if let Some(s) = &*s {
        return Ok(s.clone());
    }
    let fresh = match JobSecret::from_env()? {
        Some(s) => s,
        None => {
            tracing::debug!(
                "no {SECRET_ENV}: this process uses a random job secret of its own (TCP links to other processes are refused)"
            );
            JobSecret::generate()?
        }
    };
    *s = Some(fresh.clone());
    Ok(fresh)
}

const DIALER: &[u8] = b"dialer";
const ACCEPTOR: &[u8] = b"acceptor";

fn denied(what: &str) -> IoError {
    IoError::new(ErrorKind::PermissionDenied, what.to_string())
}

fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    crate::random::fill(&mut n)?;
    Ok(n)
}

/// The dialing side of the handshake on a fresh connection: sends a nonce, reads the
/// acceptor's, proves the secret, then checks the acceptor's proof. `purpose` names the kind
/// of connection and `context` what both sides already exchanged (a hello): both go into the
/// proofs, so a proof for one connection is worth nothing on another.
/// An error of kind `PermissionDenied` if the acceptor's proof is wrong; an I/O error if the
/// connection ends or times out first (an acceptor that finds the dialer's proof wrong closes
/// the connection without a word).
pub fn dial(
    stream: &mut (impl Read + Write),
    secret: &JobSecret,
    purpose: &[u8],
    context: &[u8],
) -> std::io::Result<()> {
    let mine = nonce()?;
    stream.write_all(&mine)?;
    let mut theirs = [0u8; NONCE_LEN];
    stream.read_exact(&mut theirs)?;
    let nonces = [mine, theirs].concat();
    let proof = secret.proof(DIALER, purpose, context, &nonces);
    stream.write_all(&proof.finalize().into_bytes())?;
    let mut answer = [0u8; PROOF_LEN];
    stream.read_exact(&mut answer)?;
    secret
        .proof(ACCEPTOR, purpose, context, &nonces)
        .verify_slice(&answer)
        .map_err(|_| denied("the other side does not know this job's secret"))
}

/// The accepting side of [`dial`]: reads the dialer's nonce, sends one, checks the dialer's
/// proof (constant time), then proves the secret in turn. Nothing is revealed to a dialer
/// whose proof is wrong: the caller drops the connection on any error.
pub fn accept(
    stream: &mut (impl Read + Write),
    secret: &JobSecret,
    purpose: &[u8],
    context: &[u8],
) -> std::io::Result<()> {
    let mut theirs = [0u8; NONCE_LEN];
    stream.read_exact(&mut theirs)?;
    let mine = nonce()?;
    stream.write_all(&mine)?;
    let nonces = [theirs, mine].concat();
    let mut proof = [0u8; PROOF_LEN];
    stream.read_exact(&mut proof)?;
    secret
        .proof(DIALER, purpose, context, &nonces)
        .verify_slice(&proof)
        .map_err(|_| denied("wrong proof of the job secret"))?;
    let answer = secret.proof(ACCEPTOR, purpose, context, &nonces);
    stream.write_all(&answer.finalize().into_bytes())
}

/// A TCP stream whose reads and writes all end by one deadline: a connection's whole handshake
/// (hello, [`dial`] or [`accept`], answer) gets one time limit, not each read its own. A peer
/// that sends one byte at a time, each well within a per-read timeout, would otherwise hold
/// the connection (and whatever serves it) for minutes. The socket's timeouts are left set;
/// the caller sets those it wants for what follows the handshake.
pub struct HandshakeStream<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
    within: Duration,
}

impl<'a> HandshakeStream<'a> {
    /// Reads and writes on `stream` that all end within `within` from now.
    pub fn new(stream: &'a TcpStream, within: Duration) -> Self {
        Self {
            stream,
            deadline: Instant::now() + within,
            within,
        }
    }

    /// The time left, or a `TimedOut` error once it is spent.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(IoError::new(
                ErrorKind::TimedOut,
                format!(
                    "the handshake did not finish within {} ms",
                    self.within.as_millis()
                ),
            ));
        }
        Ok(left)
    }

    /// A timeout of the socket is the deadline's: say so.
    fn timed_out(&self, e: IoError) -> IoError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.left().err().unwrap_or(e),
            _ => e,
        }
    }
}

impl Read for HandshakeStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        s.read(buf).map_err(|e| self.timed_out(e))
    }
}

impl Write for HandshakeStream<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        s.write(buf).map_err(|e| self.timed_out(e))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
