//! soak: many messages of random sizes and operations across ranks, every payload checked.
//!
//! Each round, picked by a seeded generator every rank runs in step, is a batch of two-sided
//! messages (`isend`/`irecv`), a one-sided put into the target's window, or a get from the
//! source's window, from each rank to the rank `shift` places on. Sizes run from 0 bytes to
//! `--max-size`, most of them small (the exponent is uniform). A message's bytes are a
//! function of the seed, its sender, its receiver and its sequence number on that pair, and
//! its first 8 bytes carry the sequence number: the receiver rebuilds what it should have got
//! and compares every byte, so a message lost, duplicated or reordered within a connection,
//! or corrupted, is seen and named. The run ends with the ranks' counts and resident memory
//! (after set-up and at the end) gathered on rank 0.
//!
//! ```sh
//! cargo run --release --bin soak -- --ranks 4 --messages 1000000
//! cargo run --release --bin soak -- --ranks 4 --ranks-as procs --messages 1000000
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::header::{cores, Header};
use common::json::Value;
use common::progress::Progress;
use common::{iters, name, one_of, RanksAs, ToolArgs};
use gdasync::gdsync::Device;
use gdasync::mp::bootstrap::{Bootstrap, JobInfo, TcpBootstrap, ThreadBootstrap};
use gdasync::mp::Comm;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Most messages one run may ask for (at a microsecond each, a few days).
const MAX_MESSAGES: u64 = 100_000_000_000;
/// Most messages a rank sends to its target in one round of two-sided messages.
const MAX_BATCH: usize = 32;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "soak",
    version,
    about = "Many messages of random sizes and operations across ranks, every payload checked"
)]
struct Args {
    /// Number of ranks.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=16))]
    ranks: u64,
    /// How the ranks run.
    #[arg(long, default_value = "threads", value_parser = one_of(&[RanksAs::Threads, RanksAs::Procs]))]
    ranks_as: RanksAs,
    /// Messages to send in all (the ranks send about as many each).
    #[arg(long, default_value_t = 100_000, value_parser = iters::count(1, MAX_MESSAGES))]
    messages: u64,
    /// Largest message, in bytes.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(8..=(1 << 20)))]
    max_size: u64,
    /// Seed of the schedule, sizes and payloads (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long a rank waits for any one step before it gives up, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// One JSON line with the result instead of text.
    #[arg(long)]
    json: bool,
    /// Makes one message of rank 0 wrong on purpose, to show that the check sees it.
    #[arg(long, value_enum, hide = true)]
    inject: Option<Fault>,
    /// Run as one rank of a `--ranks-as procs` job (set by the launcher).
    #[arg(long, hide = true)]
    child: bool,
    #[command(flatten)]
    tool: ToolArgs,
}

/// What `--inject` does to rank 0's 50th message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    /// A byte flipped.
    Corrupt,
    /// The message of the next sequence number sent instead (this one is lost).
    Drop,
    /// The previous message sent again.
    Duplicate,
}

/// The generator every rank runs in step (splitmix64).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A hash of a message's coordinates, the start of its bytes.
fn mix(seed: u64, from: usize, to: usize, seq: u64) -> u64 {
    Rng(seed ^ (from as u64) << 48 ^ (to as u64) << 40 ^ seq.wrapping_mul(0x2545_F491_4F6C_DD1D))
        .next()
}

/// The size of message `seq` from `from` to `to`: the exponent is uniform, so most are small.
fn size_of(seed: u64, from: usize, to: usize, seq: u64, max: usize) -> usize {
    let mut r = Rng(mix(seed, from, to, seq) ^ 0x5151);
    let bits = r.below(max.ilog2() as u64 + 2) as u32;
    if bits == 0 {
        return 0;
    }
    (r.below(1 << (bits - 1)) as usize + (1 << (bits - 1)) - 1).min(max)
}

/// Fills `out` with message `seq` from `from` to `to`: its sequence number in the first 8
/// bytes (as many as fit), then bytes that depend on all of the coordinates.
fn fill(seed: u64, from: usize, to: usize, seq: u64, out: &mut [u8]) {
    let head = seq.to_le_bytes();
    let n = out.len().min(8);
    out[..n].copy_from_slice(&head[..n]);
    let mut r = Rng(mix(seed, from, to, seq));
    for chunk in out[n..].chunks_mut(8) {
        let w = r.next().to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// What one rank knows: its place, the generator and the sequence numbers of its pairs.
struct Ledger {
    seed: u64,
    rank: usize,
    max: usize,
    /// Next sequence number to send to each rank / expected from each rank.
    sent: Vec<u64>,
    expected: Vec<u64>,
    /// Messages and bytes received and checked.
    received: u64,
    bytes: u64,
    inject: Option<Fault>,
    /// Messages this rank has sent (to find the 50th for `--inject`).
    sent_total: u64,
}

impl Ledger {
    /// The next message to `to`: its sequence number and bytes (in `buf`).
    fn next_to(&mut self, to: usize, buf: &mut [u8]) -> usize {
        let seq = self.sent[to];
        self.sent[to] += 1;
        self.sent_total += 1;
        let fault = (self.rank == 0 && self.sent_total == 50)
            .then_some(self.inject)
            .flatten();
        let shown = match fault {
            Some(Fault::Drop) => seq + 1,
            Some(Fault::Duplicate) if seq > 0 => seq - 1,
            _ => seq,
        };
        let len = size_of(self.seed, self.rank, to, seq, self.max);
        // (A lost or repeated message keeps this one's size, so that the receive fits.)
        fill(self.seed, self.rank, to, shown, &mut buf[..len]);
        if fault == Some(Fault::Corrupt) && len > 0 {
            buf[len - 1] ^= 0x40;
        }
        len
    }

    /// The size of the next message expected from `from`.
    fn expected_len(&self, from: usize) -> usize {
        size_of(self.seed, from, self.rank, self.expected[from], self.max)
    }

    /// Checks `got` (with `len` bytes, as the completion said) against the next message
    /// expected from `from`.
    fn check(&mut self, from: usize, got: &[u8], len: usize, how: &str) -> Result<()> {
        let seq = self.expected[from];
        let want_len = size_of(self.seed, from, self.rank, seq, self.max);
        let what = || format!("{how} message {seq} from rank {from}");
        if len != want_len {
            bail!("{}: {len} bytes arrived, {want_len} were sent", what());
        }
        let mut want = vec![0u8; len];
        fill(self.seed, from, self.rank, seq, &mut want);
        if got[..len] != want[..] {
            if len >= 8 {
                let carried = u64::from_le_bytes(got[..8].try_into().unwrap());
                if carried != seq {
                    let kind = if carried < seq {
                        "duplicated (an earlier message arrived again)"
                    } else {
                        "lost or reordered (a later message arrived in its place)"
                    };
                    bail!("{}: {kind}: got message {carried}", what());
                }
            }
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            bail!(
                "{}: corrupted: byte {at} of {len} is {:#04x}, sent {:#04x}",
                what(),
                got[at],
                want[at]
            );
        }
        self.expected[from] += 1;
        self.received += 1;
        self.bytes += len as u64;
        Ok(())
    }
}

/// Resident memory of this process, in MB (from /proc/self/statm).
fn rss_mb() -> f64 {
    let pages: u64 = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    (pages * page) as f64 / 1e6
}

/// Bytes of a tally on the wire.
const TALLY: usize = 40;

/// One rank's result, as rank 0 gathers it.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    received: u64,
    bytes: u64,
    /// Resident memory after set-up and at the end, in MB (the whole process: in a run
    /// with thread ranks every rank reports the same process).
    rss_start_mb: f64,
    /// After a tenth of the messages.
    rss_warm_mb: f64,
    rss_end_mb: f64,
}

impl Tally {
    fn to_bytes(self) -> [u8; TALLY] {
        let mut b = [0u8; TALLY];
        b[..8].copy_from_slice(&self.received.to_le_bytes());
        b[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.rss_start_mb.to_le_bytes());
        b[24..32].copy_from_slice(&self.rss_warm_mb.to_le_bytes());
        b[32..].copy_from_slice(&self.rss_end_mb.to_le_bytes());
        b
    }
    fn from_bytes(b: &[u8]) -> Tally {
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Tally {
            received: w(0),
            bytes: w(8),
            rss_start_mb: f64::from_bits(w(16)),
            rss_warm_mb: f64::from_bits(w(24)),
            rss_end_mb: f64::from_bits(w(32)),
        }
    }
}

/// The run's settings, the same on every rank.
#[derive(Clone, Debug)]
struct Config {
    ranks: usize,
    ranks_as: RanksAs,
    messages: u64,
    max: usize,
    seed: u64,
    timeout: Duration,
    json: bool,
    inject: Option<Fault>,
}

impl Config {
    fn new(a: &Args) -> Config {
        // Processes get the seed their parent chose (its arguments, with --seed added).
        let seed = a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        Config {
            ranks: a.ranks as usize,
            ranks_as: a.ranks_as,
            messages: a.messages,
            max: a.max_size as usize,
            seed,
            timeout: Duration::from_secs(a.timeout),
            json: a.json,
            inject: a.inject,
        }
    }

    fn header(&self) -> Header {
        Header::new("soak")
            .field("device", "soft")
            .field("ranks", self.ranks)
            .field("ranks_as", name(self.ranks_as))
            .field("cores", cores())
            .field("messages", self.messages)
            .field("max_size", self.max)
            .field("seed", self.seed)
    }
}

/// One rank: the rounds, then the tallies on rank 0 (its summary, or the first error).
fn rank_main(cfg: &Config, boot: Box<dyn Bootstrap>, dev: &Device) -> Result<Option<Summary>> {
    let mut comm = Comm::new(boot, dev)?;
    comm.set_timeout(cfg.timeout);
    let (rank, n) = (comm.rank(), comm.size());
    // Written once now, so that their pages count in the resident memory after set-up.
    let mut sbuf = vec![1u8; MAX_BATCH * cfg.max];
    let mut rbuf = vec![1u8; MAX_BATCH * cfg.max];
    let mut wbuf = vec![1u8; cfg.max];
    let smr = comm.register(&mut sbuf)?;
    let rmr = comm.register(&mut rbuf)?;
    let wmr = comm.register(&mut wbuf)?;
    let win = comm.window(&wmr)?;
    let mut led = Ledger {
        seed: cfg.seed,
        rank,
        max: cfg.max,
        sent: vec![0; n],
        expected: vec![0; n],
        received: 0,
        bytes: 0,
        inject: cfg.inject,
        sent_total: 0,
    };
    // Resident memory once everything is set up: what the rounds add to it is what leaks.
    let rss_start = rss_mb();
    let mut rss_warm = None;
    let mut sched = Rng(cfg.seed);
    let mut progress = (rank == 0).then(|| Progress::new("soak"));
    let start = Instant::now();
    let mut done = 0u64;
    let mut round = 0u64;
    let mut scratch = vec![0u8; cfg.max];
    while done < cfg.messages {
        let shift = 1 + sched.below(n as u64 - 1) as usize;
        let (to, from) = ((rank + shift) % n, (rank + n - shift) % n);
        let op = sched.below(8);
        let ctx = || format!("round {round}");
        match op {
            // Two-sided messages, a batch each way (most rounds: they are the cheap ones).
            0..=5 => {
                let k = 1 + sched.below(MAX_BATCH as u64) as usize;
                let slot = |j: usize| j * cfg.max..(j + 1) * cfg.max;
                let recvs = (0..k)
                    .map(|j| comm.irecv(rmr.sge(slot(j)), from))
                    .collect::<gdasync::gdsync::Result<Vec<_>>>()?;
                let mut sends = Vec::with_capacity(k);
                for j in 0..k {
                    let len = led.next_to(to, &mut scratch);
                    let at = slot(j).start;
                    smr.write_at(at, &scratch[..len]);
                    sends.push(comm.isend(smr.sge(at..at + len), to)?);
                }
                let got = comm.wait_all(&recvs).with_context(ctx)?;
                comm.wait_all(&sends).with_context(ctx)?;
                for (j, &len) in got.iter().enumerate() {
                    let len = (len as usize).min(cfg.max);
                    rmr.read_at(slot(j).start, &mut scratch[..len]);
                    led.check(from, &scratch, len, "sent").with_context(ctx)?;
                }
                done += (k * n) as u64;
            }
            // A put into the target's window.
            6 => {
                let len = led.next_to(to, &mut scratch);
                smr.write_at(0, &scratch[..len]);
                if len > 0 {
                    let r = comm.iput(smr.sge(0..len), &win, to, 0)?;
                    comm.wait(r).with_context(ctx)?;
                }
                comm.barrier().with_context(ctx)?;
                let want = led.expected_len(from);
                wmr.read_at(0, &mut scratch[..want]);
                led.check(from, &scratch, want, "put").with_context(ctx)?;
                comm.barrier().with_context(ctx)?;
                done += n as u64;
            }
            // A get from the source's window.
            _ => {
                let len = led.next_to(to, &mut scratch);
                wmr.write_at(0, &scratch[..len]);
                comm.barrier().with_context(ctx)?;
                let want = led.expected_len(from);
                if want > 0 {
                    let r = comm.iget(rmr.sge(0..want), &win, from, 0)?;
                    comm.wait(r).with_context(ctx)?;
                }
                rmr.read_at(0, &mut scratch[..want]);
                led.check(from, &scratch, want, "read").with_context(ctx)?;
                comm.barrier().with_context(ctx)?;
                done += n as u64;
            }
        }
        round += 1;
        if rss_warm.is_none() && done >= cfg.messages / 10 {
            // The link rings' pages are all in use after their first lap: from here on,
            // resident memory should not grow.
            rss_warm = Some(rss_mb());
        }
        if let Some(p) = progress.as_mut() {
            p.show(|| format!("{done} of {} messages", cfg.messages));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mine = Tally {
        received: led.received,
        bytes: led.bytes,
        rss_start_mb: rss_start,
        rss_warm_mb: rss_warm.unwrap_or(rss_start),
        rss_end_mb: rss_mb(),
    };
    drop(progress);
    let all = gather(&mut comm, mine)?;
    comm.finalize()?;
    Ok(all.map(|tallies| Summary {
        messages: done,
        rounds: round,
        secs,
        tallies,
    }))
}

/// Every rank's tally, on rank 0 (others get `None`).
fn gather(comm: &mut Comm, mine: Tally) -> Result<Option<Vec<Tally>>> {
    let (rank, n) = (comm.rank(), comm.size());
    let mut buf = vec![0u8; TALLY * n];
    let mr = comm.register(&mut buf)?;
    if rank != 0 {
        mr.write_at(0, &mine.to_bytes());
        let s = comm.isend(mr.sge(0..TALLY), 0)?;
        comm.wait(s)?;
        return Ok(None);
    }
    let recvs = (1..n)
        .map(|p| comm.irecv(mr.sge(TALLY * p..TALLY * (p + 1)), p))
        .collect::<gdasync::gdsync::Result<Vec<_>>>()?;
    comm.wait_all(&recvs)?;
    let mut all = vec![mine];
    let mut b = [0u8; TALLY];
    for p in 1..n {
        mr.read_at(TALLY * p, &mut b);
        all.push(Tally::from_bytes(&b));
    }
    Ok(Some(all))
}

/// What rank 0 reports.
struct Summary {
    messages: u64,
    rounds: u64,
    secs: f64,
    tallies: Vec<Tally>,
}

impl Summary {
    fn print(&self, cfg: &Config) {
        let received: u64 = self.tallies.iter().map(|t| t.received).sum();
        let bytes: u64 = self.tallies.iter().map(|t| t.bytes).sum();
        let max = |f: fn(&Tally) -> f64| self.tallies.iter().map(f).fold(0.0, f64::max);
        let (rss0, rss_w, rss1) = (
            max(|t| t.rss_start_mb),
            max(|t| t.rss_warm_mb),
            max(|t| t.rss_end_mb),
        );
        let rate = received as f64 / self.secs;
        if cfg.json {
            let row = cfg
                .header()
                .json()
                .clone()
                .set("received", received)
                .set("bytes", bytes)
                .set("rounds", self.rounds)
                .set("seconds", Value::Fixed(self.secs, 3))
                .set("messages_per_s", Value::Sig(rate))
                .set("rss_start_mb", Value::Fixed(rss0, 1))
                .set("rss_warm_mb", Value::Fixed(rss_w, 1))
                .set("rss_end_mb", Value::Fixed(rss1, 1))
                .set("ok", true);
            common::out::line(format_args!("{row}"));
        } else {
            common::out::line(format_args!(
                "soak: {received} messages ({:.1} MB) checked in {:.1} s ({rate:.0}/s), {} rounds: none lost, duplicated, reordered or corrupted; resident memory (largest rank) {rss0:.1} MB after set-up, {rss_w:.1} MB after a tenth of the messages, {rss1:.1} MB at the end",
                bytes as f64 / 1e6,
                self.secs,
                self.rounds
            ));
        }
        debug_assert!(self.messages >= received);
    }
}

fn threads(cfg: &Config) -> Result<()> {
    let dev = Device::soft()?;
    let handles: Vec<_> = ThreadBootstrap::group(cfg.ranks)
        .into_iter()
        .map(|b| {
            let (cfg, dev) = (cfg.clone(), dev.clone());
            std::thread::spawn(move || rank_main(&cfg, Box::new(b), &dev))
        })
        .collect();
    // The first rank to fail names the cause (a check that failed); the others then fail
    // because it left.
    let mut handles: Vec<Option<_>> = handles.into_iter().map(Some).collect();
    let (mut summary, mut first_err, mut others) = (None, None, 0);
    while handles.iter().any(Option::is_some) {
        for (r, slot) in handles.iter_mut().enumerate() {
            if !slot.as_ref().is_some_and(|h| h.is_finished()) {
                continue;
            }
            match slot.take().unwrap().join() {
                Ok(Ok(s)) => summary = summary.or(s),
                Ok(Err(e)) if first_err.is_none() => {
                    first_err = Some(e.context(format!("rank {r}")))
                }
                Err(_) if first_err.is_none() => {
                    first_err = Some(anyhow::anyhow!("rank {r} panicked"));
                }
                _ => others += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if let Some(e) = first_err {
        return Err(match others {
            0 => e,
            n => anyhow::anyhow!("{e:#} ({n} other ranks failed after it)"),
        });
    }
    summary.context("rank 0 reported nothing")?.print(cfg);
    Ok(())
}

/// One process of `--ranks-as procs`.
fn child(cfg: &Config) -> Result<()> {
    let info = JobInfo::from_env().context("--child is for the processes soak starts")?;
    let rank = info.rank;
    let boot = TcpBootstrap::connect(&info, cfg.timeout)
        .with_context(|| format!("rank {rank}: start-up"))?;
    let s =
        rank_main(cfg, Box::new(boot), &Device::soft()?).with_context(|| format!("rank {rank}"))?;
    if let Some(s) = s {
        s.print(cfg);
    }
    Ok(())
}

fn run(args: &Args) -> Result<()> {
    let cfg = Config::new(args);
    if args.child {
        return child(&cfg);
    }
    if !cfg.json {
        common::out::line(format_args!("{}", cfg.header().text()));
    }
    match cfg.ranks_as {
        RanksAs::Threads => threads(&cfg),
        // The children must run the same schedule: they get this process's seed.
        _ => {
            if args.seed.is_none() {
                std::env::set_var("GDSYNC_SOAK_SEED", cfg.seed.to_string());
            }
            common::launch::run_local(cfg.ranks)
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    let tool = args.tool.clone();
    tool.run(|| {
        if args.seed.is_none() {
            args.seed = seed_from_env()?;
        }
        run(&args)
    })
}

/// `GDSYNC_SOAK_SEED`: unset or empty, none; a number, that seed; anything else an error.
fn seed_from_env() -> Result<Option<u64>> {
    const VAR: &str = "GDSYNC_SOAK_SEED";
    match std::env::var(VAR).ok().filter(|s| !s.trim().is_empty()) {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            gdasync::gdsync::env::invalid(VAR, &s, "a seed (a number from 0 to 2^64 - 1)").into()
        }),
    }
}
