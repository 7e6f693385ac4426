//! Bootstraps: how ranks find each other before any RDMA connection exists. They only move
//! small connection records (endpoints, keys); no data goes through them afterwards.

use gdsync::auth::{self, HandshakeStream, JobSecret, SECRET_ENV};
use gdsync::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Out-of-band exchange between the ranks of a communicator.
pub trait Bootstrap: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Every rank contributes `mine`; every rank gets all contributions, by rank.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Waits until every rank got here.
    fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }
    /// What kind of bootstrap this is, for logs ("threads", "TCP via 10.0.0.1:29510", "MPI").
    fn describe(&self) -> String {
        "a custom bootstrap".into()
    }
    /// Ranks known to have left the job (their bootstrap is gone: a communicator dropped,
    /// with or without `finalize`), so that waits for them end at once instead of at the
    /// timeout. Bootstraps that cannot tell return none.
    fn departed(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The IP address this rank reaches the other ranks from, if the bootstrap knows it (the
    /// TCP bootstrap: its sockets' own address). Soft devices accept TCP links there when the
    /// ranks span hosts; without one, the host's primary IPv4 address is used.
    fn local_ip(&self) -> Option<IpAddr> {
        None
    }
}

// ---------------------------------------------------------------------------- threads

struct Round {
    generation: u64,
    slots: Vec<Option<Vec<u8>>>,
    result: Option<Arc<Vec<Vec<u8>>>>,
    taken: usize,
    /// Which ranks took this round's result.
    took: Vec<bool>,
    /// Ranks whose bootstrap was dropped.
    left: Vec<bool>,
}

impl Round {
    /// Rank `k` took the result; the last taker opens the next round.
    fn take(&mut self, k: usize, n: usize) {
        if !self.took[k] {
            self.took[k] = true;
            self.taken += 1;
        }
        if self.taken == n {
            self.result = None;
            self.generation += 1;
            self.took.iter_mut().for_each(|t| *t = false);
        }
    }
    /// A rank that left before contributing to the round being gathered.
    fn missing(&self) -> Option<usize> {
        (0..self.slots.len()).find(|&j| self.left[j] && self.slots[j].is_none())
    }
}

struct Shared {
    n: usize,
    round: Mutex<Round>,
    cv: Condvar,
}

/// Ranks that are threads of one process.
pub struct ThreadBootstrap {
    rank: usize,
    shared: Arc<Shared>,
    timeout: Duration,
}

impl ThreadBootstrap {
    /// One bootstrap per rank of an `n`-rank group; hand one to each thread.
    pub fn group(n: usize) -> Vec<ThreadBootstrap> {
        let shared = Arc::new(Shared {
            n,
            round: Mutex::new(Round {
                generation: 0,
                slots: vec![None; n],
                result: None,
                taken: 0,
                took: vec![false; n],
                left: vec![false; n],
            }),
            cv: Condvar::new(),
        });
        (0..n)
            .map(|rank| ThreadBootstrap {
                rank,
                shared: shared.clone(),
                timeout: Duration::from_secs(60),
            })
            .collect()
    }
}

impl Bootstrap for ThreadBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.n
    }
    fn describe(&self) -> String {
        "threads of this process".into()
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let s = &*self.shared;
        let deadline = Instant::now() + self.timeout;
        let mut r = s.round.lock();
        // Wait until the previous round's result has been taken by everyone.
        while r.result.is_some() {
            if s.cv.wait_until(&mut r, deadline).timed_out() {
                return Err(Error::Timeout {
                    what: "the previous bootstrap round to finish".into(),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
        }
        if let Some(j) = r.missing() {
            return Err(gone(j));
        }
        let generation = r.generation;
        r.slots[self.rank] = Some(mine.to_vec());
        if r.slots.iter().all(Option::is_some) {
            let all: Vec<Vec<u8>> = r.slots.iter_mut().map(|x| x.take().unwrap()).collect();
            r.result = Some(Arc::new(all));
            r.taken = 0;
            s.cv.notify_all();
        }
        while r.result.is_none() || r.generation != generation {
            if let Some(j) = r.missing().filter(|_| r.generation == generation) {
                // This round can never complete: take our contribution back.
                r.slots[self.rank] = None;
                return Err(gone(j));
            }
            if s.cv.wait_until(&mut r, deadline).timed_out() {
                return Err(Error::Timeout {
                    what: format!("all {} thread ranks to join the bootstrap exchange", s.n),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
        }
        let out = (**r.result.as_ref().unwrap()).clone();
        r.take(self.rank, s.n);
        s.cv.notify_all();
        Ok(out)
    }
    fn departed(&self) -> Vec<usize> {
        let r = self.shared.round.lock();
        (0..self.shared.n).filter(|&j| r.left[j]).collect()
    }
}

/// The error of a bootstrap round that a departed rank never joins.
fn gone(rank: usize) -> Error {
    Error::Unreachable(format!(
        "rank {rank} left the job (its communicator was dropped) before joining this bootstrap exchange"
    ))
}

impl Drop for ThreadBootstrap {
    fn drop(&mut self) {
        let s = &*self.shared;
        let mut r = s.round.lock();
        r.left[self.rank] = true;
        // A result this rank will never take must not hold the next round up.
        if r.result.is_some() {
            r.take(self.rank, s.n);
        }
        s.cv.notify_all();
    }
}

// ---------------------------------------------------------------------------- TCP

/// Where this process sits in a job: rank, size, the root's address, and the job's secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// The root's (rank 0's) listening address.
    pub root: String,
    /// The secret every rank proves on every TCP connection of the job (bootstrap and
    /// soft-device links), never sent on one. The same in every rank: [`launch_local`] passes
    /// its own to the ranks it starts; other launchers set `GDSYNC_JOB_SECRET`.
    pub secret: JobSecret,
}

/// Default root address when none is given.
pub const DEFAULT_ROOT: &str = "127.0.0.1:29510";

impl JobInfo {
    /// From the environment: `GDSYNC_RANK`/`GDSYNC_SIZE`/`GDSYNC_ROOT`, else the variables
    /// Open MPI (`OMPI_COMM_WORLD_RANK/SIZE`), PMI (`PMI_RANK/SIZE`) or Slurm
    /// (`SLURM_PROCID`/`SLURM_NTASKS`) set; the root defaults to [`DEFAULT_ROOT`]. The job's
    /// secret comes from `GDSYNC_JOB_SECRET` (64 hex digits, the same in every rank), which
    /// must be set.
    pub fn from_env() -> Result<JobInfo> {
        let get = |names: &[&'static str]| {
            names
                .iter()
                .find_map(|&n| std::env::var(n).ok().map(|v| (n, v)))
        };
        let rank = get(&[
            "GDSYNC_RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "SLURM_PROCID",
        ]);
        let size = get(&[
            "GDSYNC_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "SLURM_NTASKS",
        ]);
        let (Some(rank), Some(size)) = (rank, size) else {
            return Err(Error::invalid("no rank/size in the environment: set GDSYNC_RANK and GDSYNC_SIZE (or run under mpirun or srun)"));
        };
        let parse = |(name, v): &(&str, String)| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| Error::invalid(format!("{name}={v:?} is not a number")))
        };
        let (rank_var, size_var) = (rank.0, size.0);
        let (rank, size) = (parse(&rank)?, parse(&size)?);
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} ({rank_var}) out of range for {size} ranks ({size_var}): ranks count from 0 to size - 1"
            )));
        }
        let secret = JobSecret::from_env()?.ok_or_else(|| {
            Error::invalid(format!(
                "no {SECRET_ENV} in the environment: the TCP bootstrap authenticates every connection with the job's secret; set it to the same 64 hex digits in every rank (e.g. `export {SECRET_ENV}=$(openssl rand -hex 32)` before mpirun or srun; launch_local sets it)"
            ))
        })?;
        Ok(JobInfo {
            rank,
            size,
            root: std::env::var("GDSYNC_ROOT").unwrap_or_else(|_| DEFAULT_ROOT.into()),
            secret,
        })
    }
}

/// Ranks that are processes (on one host or several), meeting at rank 0's TCP address.
pub struct TcpBootstrap {
    rank: usize,
    size: usize,
    root: String,
    /// Rank 0: a stream per other rank (index rank - 1). Others: the stream to rank 0.
    streams: Vec<TcpStream>,
}

fn put(s: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    let n = u32::try_from(b.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a message of {} bytes does not fit a 4-byte length",
                b.len()
            ),
        )
    })?;
    s.write_all(&n.to_le_bytes())?;
    s.write_all(b)
}

/// Bytes of a hello: the rank, u32 LE.
const HELLO_LEN: usize = 4;
/// Longest wait for a connection to the root to say which rank it is: a connection that
/// sends nothing (a port scanner, a stray client) is dropped after this, not waited for.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest contribution of one rank to an exchange. Connection records take about 100 bytes
/// per peer (20 bytes, then two 48-byte endpoints), so 64 MiB is room for 600,000 ranks; a
/// longer length prefix comes from something that is not a rank of this job.
pub(crate) const MAX_RECORD: usize = 64 << 20;
/// Bytes allocated ahead of the data that arrives: a length prefix alone never makes a
/// reader allocate more than this; the rest grows only as the bytes actually come.
const READ_CHUNK: usize = 64 << 10;

/// The largest packed exchange rank 0 may send to a job of `size` ranks: a length prefix
/// and a record per rank.
fn max_exchange(size: usize) -> usize {
    size.saturating_mul(4 + MAX_RECORD)
}

/// Reads one length-prefixed message of at most `max` bytes.
pub(crate) fn get(s: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "a message of {n} bytes announced, at most {max} expected (not a gdasync rank?)"
            ),
        ));
    }
    let mut b = Vec::with_capacity(n.min(READ_CHUNK));
    s.take(n as u64).read_to_end(&mut b)?;
    if b.len() != n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "the connection closed {} bytes into a message of {n}",
                b.len()
            ),
        ));
    }
    Ok(b)
}

/// The rank a hello names; `None` unless it is exactly [`HELLO_LEN`] bytes.
pub(crate) fn decode_hello(hello: &[u8]) -> Option<usize> {
    let b: [u8; HELLO_LEN] = hello.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(b)).ok()
}

/// What the job-secret proofs of a bootstrap connection are for ([`gdsync::auth`]); they also
/// cover the rank's hello. (Not the root's address: ranks may name the root differently.)
const AUTH_PURPOSE: &[u8] = b"gdasync TCP bootstrap";

/// Reads a connection's hello and checks that it knows the job's secret, the whole of it
/// within [`HELLO_TIMEOUT`] (or `timeout` if shorter): one deadline, not one per read, so a
/// connection that trickles bytes is dropped as soon as one that sends nothing.
fn read_hello(
    s: &mut TcpStream,
    info: &JobInfo,
    timeout: Duration,
) -> std::result::Result<usize, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    let mut hs = HandshakeStream::new(s, timeout.min(HELLO_TIMEOUT));
    let hello = get(&mut hs, HELLO_LEN).map_err(|e| e.to_string())?;
    let rank = decode_hello(&hello).ok_or("a malformed hello")?;
    auth::accept(&mut hs, &info.secret, AUTH_PURPOSE, &hello).map_err(|e| {
        format!("authentication failed ({e}): another job's rank, or no {SECRET_ENV}?")
    })?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(None).map_err(|e| e.to_string())?;
    Ok(rank)
}

/// A rank's side of [`read_hello`]: sends the hello and proves the job's secret, within
/// `timeout` in all.
fn send_hello(s: &TcpStream, info: &JobInfo, timeout: Duration) -> Result<()> {
    let hello = (info.rank as u32).to_le_bytes();
    let mut hs = HandshakeStream::new(s, timeout);
    put(&mut hs, &hello).map_err(io("send hello"))?;
    auth::dial(&mut hs, &info.secret, AUTH_PURPOSE, &hello).map_err(|e| {
        Error::Unreachable(format!(
            "bootstrap: authentication with the root at {} failed: {e} (does every rank have the same {SECRET_ENV}?)",
            info.root
        ))
    })
}

fn io(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Unreachable(format!("bootstrap: {what}: {e}"))
}

/// Connections to the root in their handshake at once; each new one past this closes the
/// oldest (connections that say nothing cost a thread each until their hello's time is up).
const MAX_HANDSHAKES: usize = 64;

/// A connection to the root whose handshake ended: where from, the socket, and its rank or
/// why it was refused.
type Handshake = (SocketAddr, TcpStream, std::result::Result<usize, String>);

/// Rank 0: accepts the other ranks' connections until every rank is there. Each connection's
/// hello and proof are read on a thread of its own, so a silent or slow connection (a port
/// scanner, a process without the job's secret) never holds up the ranks behind it.
fn gather_ranks(l: &TcpListener, info: &JobInfo, timeout: Duration) -> Result<Vec<TcpStream>> {
    let deadline = Instant::now() + timeout;
    let (tx, done) = std::sync::mpsc::channel::<Handshake>();
    let mut pending: std::collections::VecDeque<(SocketAddr, TcpStream)> = Default::default();
    let mut by_rank: Vec<Option<TcpStream>> = (1..info.size).map(|_| None).collect();
    while by_rank.iter().any(Option::is_none) {
        let accepted = match l.accept() {
            Ok((s, from)) => {
                s.set_nodelay(true).ok();
                if pending.len() >= MAX_HANDSHAKES {
                    if let Some((_, oldest)) = pending.pop_front() {
                        let _ = oldest.shutdown(std::net::Shutdown::Both);
                    }
                }
                if let Ok(c) = s.try_clone() {
                    pending.push_back((from, c));
                }
                let (tx, info) = (tx.clone(), info.clone());
                std::thread::Builder::new()
                    .name("gdasync-boot-hello".into())
                    .spawn(move || {
                        let mut s = s;
                        let r = read_hello(&mut s, &info, timeout);
                        let _ = tx.send((from, s, r));
                    })
                    .map_err(|e| Error::os("spawn a bootstrap thread", e))?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => return Err(io("accept")(e)),
        };
        while let Ok((from, s, r)) = done.try_recv() {
            pending.retain(|(a, _)| *a != from);
            match r {
                // Not a rank of this job (or one too slow to say which): dropped; the real
                // ones are still awaited.
                Err(e) => tracing::warn!(
                    "bootstrap: dropped a connection from {from} to {}: {e} (not a gdasync rank?)",
                    info.root
                ),
                Ok(r) if r == 0 || r >= info.size || by_rank[r - 1].is_some() => {
                    return Err(Error::invalid(format!(
                        "bootstrap: a process said it is rank {r}, which is out of range for {} ranks or already here: does another job use {}? (set GDSYNC_ROOT to a free address)",
                        info.size, info.root
                    )));
                }
                Ok(r) => by_rank[r - 1] = Some(s),
            }
        }
        if Instant::now() > deadline {
            let missing: Vec<usize> = by_rank
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_none())
                .map(|(i, _)| i + 1)
                .collect();
            return Err(Error::Timeout {
                what: format!("ranks {missing:?} to connect to {}", info.root),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        if !accepted {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(by_rank.into_iter().flatten().collect())
}

impl TcpBootstrap {
    /// Joins the job `info`: rank 0 listens at `info.root`, the others connect (retrying for
    /// up to `timeout`). Every socket read is bounded by `timeout` too. Each connection proves
    /// `info.secret` both ways before anything else is exchanged (the root drops, and logs,
    /// those that fail); the secret then authenticates this process's soft-device TCP links
    /// too ([`gdsync::auth::set_job_secret`]).
    pub fn connect(info: &JobInfo, timeout: Duration) -> Result<TcpBootstrap> {
        auth::set_job_secret(info.secret.clone());
        let addr: SocketAddr = info
            .root
            .to_socket_addrs()
            .map_err(|e| {
                Error::invalid(format!(
                    "root address {:?}: {e} (GDSYNC_ROOT takes host:port)",
                    info.root
                ))
            })?
            .next()
            .ok_or_else(|| {
                Error::invalid(format!("root address {:?} resolves to nothing", info.root))
            })?;
        tracing::debug!(
            "bootstrap: rank {} of {}: {} {}",
            info.rank,
            info.size,
            if info.rank == 0 {
                "waiting for the other ranks at"
            } else {
                "connecting to rank 0 at"
            },
            info.root
        );
        let mut streams = Vec::new();
        if info.rank == 0 {
            let l = TcpListener::bind(addr).map_err(io("bind the root address"))?;
            l.set_nonblocking(true).map_err(io("listen"))?;
            streams = gather_ranks(&l, info, timeout)?;
        } else {
            let deadline = Instant::now() + timeout;
            let s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(io("connect to the root")(e)),
                }
            };
            s.set_nodelay(true).ok();
            send_hello(&s, info, timeout)?;
            // What follows the handshake: every read bounded by `timeout`, writes not.
            s.set_read_timeout(Some(timeout))
                .and_then(|_| s.set_write_timeout(None))
                .map_err(io("connect"))?;
            streams.push(s);
        }
        Ok(TcpBootstrap {
            rank: info.rank,
            size: info.size,
            root: info.root.clone(),
            streams,
        })
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn describe(&self) -> String {
        format!("TCP via rank 0 at {}", self.root)
    }
    fn local_ip(&self) -> Option<IpAddr> {
        self.streams.first()?.local_addr().ok().map(|a| a.ip())
    }
    /// Rank 0 sees every rank whose connection closed; the others see only rank 0's.
    fn departed(&self) -> Vec<usize> {
        let rank_of = |i: usize| if self.rank == 0 { i + 1 } else { 0 };
        (self.streams.iter().enumerate())
            .filter(|(_, s)| closed(s))
            .map(|(i, _)| rank_of(i))
            .collect()
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_RECORD {
            return Err(Error::invalid(format!(
                "bootstrap: a contribution of {} bytes is over the limit of {MAX_RECORD}",
                mine.len()
            )));
        }
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for i in 0..self.streams.len() {
                match get(&mut self.streams[i], MAX_RECORD) {
                    Ok(b) => all.push(b),
                    Err(e) => {
                        // The others wait for this round: they learn who held it up.
                        self.abort_round(i + 1);
                        return Err(rank_lost(i + 1, "read from", e));
                    }
                }
            }
            let mut packed = Vec::new();
            for a in &all {
                packed.extend_from_slice(&(a.len() as u32).to_le_bytes());
                packed.extend_from_slice(a);
            }
            for (i, s) in self.streams.iter_mut().enumerate() {
                put(s, &packed).map_err(|e| rank_lost(i + 1, "write to", e))?;
            }
            Ok(all)
        } else {
            let s = &mut self.streams[0];
            put(s, mine).map_err(|e| rank_lost(0, "write to", e))?;
            let packed =
                get(s, max_exchange(self.size)).map_err(|e| rank_lost(0, "read from", e))?;
            if let Some(gone) = decode_abort(&packed) {
                return Err(Error::Unreachable(format!(
                    "bootstrap: rank {gone} left the job (its connection to rank 0 closed or failed: its process ended, or it dropped its communicator)"
                )));
            }
            unpack(&packed, self.size).ok_or_else(|| {
                Error::invalid(
                    "bootstrap: rank 0 sent a malformed exchange (a rank of another gdasync version?)",
                )
            })
        }
    }
}

impl TcpBootstrap {
    /// Rank 0: tells every other rank that rank `gone` failed this round, instead of the
    /// exchange they wait for (best effort: a rank that cannot be told is gone too).
    fn abort_round(&mut self, gone: usize) {
        let mut msg = ABORT.to_le_bytes().to_vec();
        msg.extend_from_slice(&(gone as u32).to_le_bytes());
        for (i, s) in self.streams.iter_mut().enumerate() {
            if i + 1 != gone {
                let _ = put(s, &msg);
            }
        }
    }
}

/// The first word of what rank 0 sends in place of an exchange when a rank failed during
/// it (then that rank, u32 LE): no exchange starts with it, as no contribution is that long.
const ABORT: u32 = u32::MAX;
const _: () = assert!(MAX_RECORD < ABORT as usize);

/// The rank an abort message ([`ABORT`]) names; `None` for anything else.
pub(crate) fn decode_abort(b: &[u8]) -> Option<usize> {
    let b: &[u8; 8] = b.try_into().ok()?;
    let (head, gone) = b.split_at(4);
    (head == ABORT.to_le_bytes()).then(|| u32::from_le_bytes(gone.try_into().unwrap()) as usize)
}

/// The error of a bootstrap read from or write to rank `r` that failed with `e`: a closed
/// or reset connection means the rank left the job.
fn rank_lost(r: usize, what: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    let root = if r == 0 { " (the root)" } else { "" };
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => Error::Unreachable(format!(
            "bootstrap: rank {r}{root} left the job (its connection closed: its process ended, or it dropped its communicator)"
        )),
        _ => Error::Unreachable(format!("bootstrap: {what} rank {r}{root}: {e}")),
    }
}

/// Whether the other end of `s` closed it or reset it, without reading or waiting: what a
/// rank's process leaves behind when it ends. Bytes waiting to be read say nothing.
fn closed(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = 0u8;
    // SAFETY: recv writes at most one byte into `b`; the descriptor is `s`'s open socket.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    let err = std::io::Error::last_os_error().kind();
    n == 0
        || (n < 0
            && !matches!(
                err,
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ))
}

/// Splits rank 0's packed exchange (a length-prefixed contribution per rank) into `size`
/// contributions; `None` if it is not exactly that.
pub(crate) fn unpack(packed: &[u8], size: usize) -> Option<Vec<Vec<u8>>> {
    let mut all = Vec::with_capacity(size.min(packed.len() / 4));
    let mut rest = packed;
    while !rest.is_empty() {
        let (n, tail) = rest.split_first_chunk::<4>()?;
        let n = u32::from_le_bytes(*n) as usize;
        all.push(tail.get(..n)?.to_vec());
        rest = &tail[n..];
    }
    (all.len() == size).then_some(all)
}

/// Starts `n` local processes of `program` with `args`, each with `GDSYNC_RANK`,
/// `GDSYNC_SIZE`, `GDSYNC_ROOT` (a free loopback port) and `GDSYNC_JOB_SECRET` (this
/// process's [`gdsync::auth::job_secret`]) set, for [`TcpBootstrap`].
///
/// On Linux the ranks are killed if the thread that started them dies (`PR_SET_PDEATHSIG`),
/// so a launcher stopped by a signal or a timeout leaves no rank behind waiting for its peers.
/// Call it from a thread that outlives the ranks (the main thread).
pub fn launch_local(
    n: usize,
    program: &std::path::Path,
    args: &[String],
) -> Result<Vec<std::process::Child>> {
    launch_local_with(n, program, args, |_| {})
}

/// [`launch_local`], with `configure` applied to each rank's command before it starts (say,
/// `stdout(Stdio::piped())` to capture what the ranks print instead of sharing this
/// process's output).
pub fn launch_local_with(
    n: usize,
    program: &std::path::Path,
    args: &[String],
    configure: impl Fn(&mut std::process::Command),
) -> Result<Vec<std::process::Child>> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("pick a port"))?
        .port();
    let root = format!("127.0.0.1:{port}");
    let secret = auth::job_secret()?.to_hex();
    (0..n)
        .map(|rank| {
            let mut cmd = std::process::Command::new(program);
            cmd.args(args)
                .env("GDSYNC_RANK", rank.to_string())
                .env("GDSYNC_SIZE", n.to_string())
                .env("GDSYNC_ROOT", &root)
                .env(SECRET_ENV, &secret);
            configure(&mut cmd);
            die_with_parent(&mut cmd);
            let child = cmd
                .spawn()
                .map_err(|e| Error::os(format!("start rank {rank} ({})", program.display()), e))?;
            tracing::debug!(
                "launched rank {rank} of {n} as pid {} ({}), root {root}",
                child.id(),
                program.display()
            );
            Ok(child)
        })
        .collect()
}

/// Asks the kernel to kill the child when the thread that started it dies.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut std::process::Command) {}

// ---------------------------------------------------------------------------- MPI

/// Ranks of an MPI job (feature `mpi`). MPI only exchanges the connection records, as in
/// LibMP; all data moves over the connections afterwards.
#[cfg(feature = "mpi")]
pub struct MpiBootstrap {
    world: mpi::topology::SimpleCommunicator,
    rank: usize,
    size: usize,
}

// SAFETY: an MPI communicator handle is a process-wide handle; the bootstrap is used by one
// thread at a time (the Comm owning it takes &mut). MPI itself requires calls from the thread
// that initialised it unless initialised with MPI_THREAD_MULTIPLE: documented on `new`.
#[cfg(feature = "mpi")]
unsafe impl Send for MpiBootstrap {}

#[cfg(feature = "mpi")]
impl MpiBootstrap {
    /// Uses the world communicator of an initialised MPI universe (keep the universe alive
    /// for as long as the bootstrap, and use the communicator from the thread that initialised
    /// MPI unless it was initialised with `Threading::Multiple`).
    ///
    /// Every rank takes rank 0's job secret (its `GDSYNC_JOB_SECRET`, else one drawn at random),
    /// broadcast over MPI, for the soft-device TCP links between ranks on different hosts.
    pub fn new(universe: &mpi::environment::Universe) -> MpiBootstrap {
        use mpi::traits::Communicator;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        share_job_secret(&world, rank);
        MpiBootstrap { world, rank, size }
    }
}

/// Broadcasts rank 0's job secret (as hex) and makes it every rank's. A rank 0 without one
/// (a malformed `GDSYNC_JOB_SECRET`) sends zeros, and every rank keeps its own, with a warning.
#[cfg(feature = "mpi")]
fn share_job_secret(world: &mpi::topology::SimpleCommunicator, rank: usize) {
    use mpi::traits::{Communicator, Root};
    let mut hex = [0u8; 2 * auth::SECRET_LEN];
    if rank == 0 {
        match auth::job_secret() {
            Ok(s) => hex.copy_from_slice(s.to_hex().as_bytes()),
            Err(e) => tracing::warn!("rank 0 has no job secret to share: {e}"),
        }
    }
    world.process_at_rank(0).broadcast_into(&mut hex[..]);
    match std::str::from_utf8(&hex).ok().and_then(|h| h.parse().ok()) {
        Some(s) => auth::set_job_secret(s),
        None => tracing::warn!(
            "rank {rank}: rank 0 shared no job secret: TCP links between processes will be refused"
        ),
    }
}

#[cfg(feature = "mpi")]
impl Bootstrap for MpiBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn describe(&self) -> String {
        "MPI".into()
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        use mpi::datatype::PartitionMut;
        use mpi::traits::CommunicatorCollectives;
        // A leading byte keeps every contribution non-empty (MPI_Allgatherv refuses all-empty
        // buffers in Open MPI 4.1).
        let mut framed = Vec::with_capacity(mine.len() + 1);
        framed.push(1u8);
        framed.extend_from_slice(mine);
        let mine = &framed[..];
        let mut lens = vec![0i32; self.size];
        self.world
            .all_gather_into(&(mine.len() as i32), &mut lens[..]);
        let displs: Vec<i32> = lens
            .iter()
            .scan(0, |acc, &x| {
                let d = *acc;
                *acc += x;
                Some(d)
            })
            .collect();
        let total: i32 = lens.iter().sum();
        let mut buf = vec![0u8; total as usize];
        {
            let mut part = PartitionMut::new(&mut buf[..], &lens[..], &displs[..]);
            self.world.all_gather_varcount_into(mine, &mut part);
        }
        Ok((0..self.size)
            .map(|r| buf[displs[r] as usize + 1..(displs[r] + lens[r]) as usize].to_vec())
            .collect())
    }
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
