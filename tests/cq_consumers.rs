//! A CPU poll and executor waits on one CQ. A wait reserves the completions it consumes
//! from the moment its op list is built until it has run, so a CPU poll of them fails with
//! `CqBusy`: every completion is consumed exactly once, by one consumer, none is lost, and
//! the consumer index never moves backwards (the soft device, strict, fails the CQ if it
//! did). Thousands of random interleavings of posts, gated stream waits, gate openings and
//! CPU polls, on a host stream (always) and on a CUDA stream (ignored unless asked for:
//! `GDSYNC_TEST_CUDA=1 cargo test --release --test cq_consumers -- --include-ignored`, and
//! then requires a GPU).

mod common;

use common::gpu::gpu;
use gdasync::gdsync::cuda::CudaStream;
use gdasync::gdsync::exec::{Executor, HostStream};
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::{Cq, Device, Error, Qp, QpConfig, SendTicket, SendWr, SignalWords};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A xorshift generator: the interleavings are random and reproducible from the seed.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A sender whose sends complete on a CQ of their own (so completion numbers are known),
/// and its connected peer.
struct Sender {
    qp: Qp,
    cq: Cq,
    _peer: (Qp, Cq),
    _dev: Device,
}

fn sender() -> Sender {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let (cq, other) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let mut qp = pd.create_qp(&cq, &other, &QpConfig::default()).unwrap();
    let mut peer = pd.create_qp(&other, &other, &QpConfig::default()).unwrap();
    qp.connect(&peer.endpoint()).unwrap();
    peer.connect(&qp.endpoint()).unwrap();
    Sender {
        qp,
        cq,
        _peer: (peer, other),
        _dev: dev,
    }
}

/// What one run saw: polls refused, completions polled, waits enqueued.
#[derive(Default, Debug)]
struct Seen {
    busy: u32,
    polled: usize,
    waits: usize,
}

/// The state of one run: the stream's gate (wait `k` stands until it reads `k`) and the
/// word each wait writes its number to once it has consumed.
struct Run {
    s: Sender,
    gate: SignalWords,
    done: SignalWords,
    tickets: Vec<SendTicket>,
    /// Enqueued waits: (k, completion number).
    waits: Vec<(u32, u64)>,
    polled: BTreeSet<u64>,
    busy: u32,
    seed: u64,
}

impl Run {
    /// A wait for the newest completion behind gate `k`, then the write of `k` to `done`.
    fn enqueue_wait(&mut self, exec: &impl Executor) {
        let n = self.tickets.len() as u64 - 1;
        let k = self.waits.len() as u32 + 1;
        let mut ops = self.gate.wait32(0, k, WaitCond::Geq);
        ops.append(self.s.qp.send_wait_ops(&self.tickets[n as usize]).unwrap());
        ops.append(self.done.write32(0, k));
        exec.submit(ops).unwrap();
        self.waits.push((k, n));
    }

    /// A CPU poll of up to `max`: what it takes must be no wait's that had not run when the
    /// poll ended, and a refusal must name a wait that had not run when the poll began.
    fn poll(&mut self, max: usize, step: usize) {
        let seed = self.seed;
        let before = self.done.load32(0);
        let mut out = Vec::new();
        let r = self.s.cq.poll(&mut out, max);
        let after = self.done.load32(0);
        for c in &out {
            assert!(c.is_ok(), "seed {seed} step {step}: {c:?}");
            let i = c.cqe_index;
            assert!(self.polled.insert(i), "completion {i} polled twice");
            if let Some((_, n)) = self.waits.iter().find(|&&(k, n)| k > after && n >= i) {
                panic!("seed {seed} step {step}: the CPU polled completion {i}, which the wait for {n} (not run yet) consumes too");
            }
        }
        match r {
            Ok(_) => {}
            Err(Error::CqBusy { index, wait, .. }) => {
                self.busy += 1;
                assert!(wait >= index);
                // (Lets the stream's thread run the wait once its gate is open.)
                std::thread::yield_now();
                assert!(
                    self.waits.iter().any(|&(k, n)| n == wait && k > before),
                    "seed {seed} step {step}: refused for the wait for {wait}, which had run"
                );
            }
            Err(e) => panic!("seed {seed} step {step}: {e}"),
        }
    }
}

/// One run of `steps` random steps (post, enqueue a gated wait, open gates, poll on the
/// CPU) with `exec` running the waits, then everything drained and accounted for.
fn mixed_run<E: Executor>(exec: &E, sync: impl Fn(&E), seed: u64, steps: usize) -> Seen {
    let mut r = Run {
        s: sender(),
        gate: SignalWords::new(1),
        done: SignalWords::new(1),
        tickets: Vec::new(),
        waits: Vec::new(),
        polled: BTreeSet::new(),
        busy: 0,
        seed,
    };
    let mut rng = Rng(seed | 1);
    let mut last_ci = 0;
    for step in 0..steps {
        let ci = r.s.cq.consumer_index();
        let posted = r.tickets.len() as u64;
        let waited_to = r.waits.last().map_or(0, |w| w.1 + 1);
        match rng.below(8) {
            // Post, keeping the CQ and the send ring far from full.
            0..=2 if posted - ci.min(posted) < 24 => {
                let t = r.s.qp.post_send(&SendWr::nop().wr_id(posted)).unwrap();
                assert_eq!(t.cqe, Some(posted));
                r.tickets.push(t);
            }
            // A gated wait for the newest completion, if no wait or poll is past it.
            // (One step in 16: the CPU gets completions of its own between waits.)
            3 if posted > ci.max(waited_to) && rng.below(2) == 0 => r.enqueue_wait(exec),
            // Open the gate up to a random enqueued wait.
            4 | 5 if !r.waits.is_empty() => {
                let k = r.waits[rng
                    .below(r.waits.len() as u64 + 1)
                    .min(r.waits.len() as u64 - 1) as usize]
                    .0;
                r.gate.store32(0, k.max(r.gate.load32(0)));
            }
            _ => r.poll(1 + rng.below(4) as usize, step),
        }
        let ci = r.s.cq.consumer_index();
        assert!(
            ci >= last_ci,
            "seed {seed} step {step}: index back from {last_ci} to {ci}"
        );
        last_ci = ci;
    }
    drain(&mut r, exec, sync)
}

/// Opens every gate, lets the stream run, polls what is left; checks that every completion
/// was consumed once (polled, or consumed by a wait) and none was lost.
fn drain<E: Executor>(r: &mut Run, exec: &E, sync: impl Fn(&E)) -> Seen {
    // (Geq is wrap-aware: open with the last wait's number, not a huge one.)
    let last = r.waits.len() as u32;
    r.gate.store32(0, last);
    // A stream's waits pass once the device wrote their CQEs: lend the thread to the soft
    // engines meanwhile (where they run on shared threads), then synchronise.
    let start = Instant::now();
    while r.done.load32(0) != last {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the stream's waits never passed"
        );
        gdasync::gdsync::progress();
        std::thread::yield_now();
    }
    sync(exec);
    let posted = r.tickets.len() as u64;
    let start = Instant::now();
    while r.s.cq.consumer_index() < posted {
        r.poll(64, usize::MAX);
        assert!(start.elapsed() < Duration::from_secs(5), "completions lost");
    }
    let waited_to = r.waits.last().map_or(0, |w| w.1 + 1);
    for i in 0..posted {
        assert!(
            r.polled.contains(&i) || i < waited_to,
            "seed {}: completion {i} was consumed by nobody",
            r.seed
        );
    }
    assert_eq!(r.s.cq.consumer_index(), posted);
    assert!(r.s.cq.take_errors().is_empty());
    Seen {
        busy: r.busy,
        polled: r.polled.len(),
        waits: r.waits.len(),
    }
}

/// Runs seeds on `exec` and checks the interleavings did what they are for: polls refused
/// beside pending waits, and both consumers consumed.
fn many_runs<E: Executor>(exec: &E, sync: impl Fn(&E) + Copy, runs: u64, steps: usize) {
    let mut all = Seen::default();
    for seed in 1..=runs {
        let s = mixed_run(exec, sync, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), steps);
        all.busy += s.busy;
        all.polled += s.polled;
        all.waits += s.waits;
    }
    eprintln!("{all:?}");
    assert!(all.busy > 0 && all.polled > 0 && all.waits > 0, "{all:?}");
}

#[test]
fn cpu_polls_and_host_stream_waits_on_one_cq_consume_each_completion_once() {
    let stream = HostStream::with_timeout(Duration::from_secs(5)).unwrap();
    many_runs(&stream, |s| s.synchronize().unwrap(), 8, 1000);
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cq_consumers -- --include-ignored"]
fn cpu_polls_and_cuda_stream_waits_on_one_cq_consume_each_completion_once() {
    let _gpu = gpu();
    let stream = CudaStream::new(0).unwrap();
    many_runs(&stream, |s| s.synchronize().unwrap(), 8, 1000);
}
