//! Where each rank of this process is, for a report instead of a silent hang and for the
//! progress shown on stderr: the triggers note every step of their loops here (one relaxed
//! store), and the launcher ends the run with the table when no rank of the process has moved
//! for longer than mp's timeout plus [`STALL_MARGIN`] while one is inside such a loop (a
//! stream wait that nothing satisfies blocks the CPU in `cuStreamSynchronize`, or in a launch
//! once the GPU's queue is full, where no library timeout reaches it).

use crate::common::progress::Progress;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How much longer than mp's timeout (`--timeout`) every rank may stay at the same step
/// before the run is called stalled. The slowest step measured (a 4096² kernel with four
/// ranks on one GPU) takes under a millisecond; a CPU wait for a peer ends with mp's own,
/// more specific timeout error first, so only waits no library timeout reaches get here.
pub const STALL_MARGIN: Duration = Duration::from_secs(15);

/// Ranks of one process that are tracked (threads); others are not.
const TRACKED: usize = 64;

/// Per rank: iteration << 8 | step + 1 (0: not started).
static AT: [AtomicU64; TRACKED] = [const { AtomicU64::new(0) }; TRACKED];

/// The steps of the GPU triggers' loops.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub enum Step {
    /// The CPU waits for an earlier iteration's requests (run-ahead bound).
    RunAheadWait,
    /// `isend_on` / `isend`: posting the sends.
    Send,
    /// Handing a list of memory operations to the stream.
    Flush,
    /// Launching the interior kernel.
    Interior,
    /// `wait_all_on`: enqueuing the waits for the halos.
    WaitOn,
    /// Launching the ring (or whole) kernel.
    Ring,
    /// `irecv_on` / `irecv`: posting the next receives.
    Recv,
    /// `cuStreamSynchronize` of the rank's stream.
    Synchronize,
    /// The CPU waits for the messages (host trigger).
    WaitAll,
    /// The persistent kernel runs (its own waits time out on the GPU: not watched).
    Kernel,
    /// Out of the loop (done, checking, or tearing down: not watched).
    Out,
    /// The CPU trigger's loop: computing, and exchanging through its host stream.
    Cpu,
}

impl Step {
    /// How many steps there are.
    pub const COUNT: usize = NAMES.len();

    /// Step number `k`'s short name (`--trace`'s tables).
    pub fn short(k: usize) -> &'static str {
        SHORT.get(k).copied().unwrap_or("?")
    }
}

/// Short names of the steps, in order.
const SHORT: [&str; 12] = [
    "run-ahead wait",
    "send",
    "flush",
    "interior launch",
    "wait_on",
    "ring launch",
    "recv",
    "synchronize",
    "wait for halos",
    "kernel",
    "out",
    "cpu",
];

const NAMES: [&str; 12] = [
    "run-ahead wait (CPU waits for an earlier iteration's requests)",
    "posting sends",
    "handing a list of memory operations to the stream",
    "launching the interior kernel",
    "enqueuing the stream's waits for the halos",
    "launching the ring kernel",
    "posting receives",
    "cuStreamSynchronize",
    "waiting on the CPU for the messages",
    "the persistent kernel",
    "out of the loop",
    "the CPU loop (computing, exchanging on the host stream)",
];

/// Ranks of this process whose communicator is connected.
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// A rank of this process finished its start-up (its communicator is connected).
pub fn started() {
    STARTED.fetch_add(1, Ordering::Relaxed);
}

/// How many ranks of this process finished their start-up.
pub fn started_ranks() -> usize {
    STARTED.load(Ordering::Relaxed)
}

/// Per rank: the error its GPU loop failed with, if any.
static FAILED: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());

/// Rank `rank`'s GPU loop failed with `e` (reported with the table: a rank whose stream
/// is stuck may never get to return its error).
pub fn failed(rank: usize, e: &anyhow::Error) {
    if let Ok(mut f) = FAILED.lock() {
        f.push((rank, format!("{e:#}")));
    }
}

/// Rank `rank` is at `step` of iteration `i`.
pub fn at(rank: usize, i: u64, step: Step) {
    if let Some(a) = AT.get(rank) {
        a.store(i << 8 | (step as u64 + 1), Ordering::Relaxed);
    }
}

/// Every tracked rank's position (0: not started).
pub fn snapshot(ranks: usize) -> Vec<u64> {
    AT.iter()
        .take(ranks)
        .map(|a| a.load(Ordering::Relaxed))
        .collect()
}

/// Whether the ranks at `now` are in a watched step (a GPU loop's CPU side).
pub fn watched(now: &[u64]) -> bool {
    let unwatched = [0, Step::Kernel as u64 + 1, Step::Out as u64 + 1];
    now.iter().any(|v| !unwatched.contains(&(v & 0xFF)))
}

/// The table of where each rank stopped, and the errors ranks failed with.
pub fn report(ranks: usize) -> String {
    let failed = FAILED.lock().map(|f| f.clone()).unwrap_or_default();
    snapshot(ranks)
        .iter()
        .enumerate()
        .map(|(r, &v)| match v & 0xFF {
            0 => format!("rank {r}: not in a GPU loop"),
            s => format!("rank {r}: iteration {}, {}", v >> 8, NAMES[s as usize - 1]),
        })
        .chain(
            failed
                .iter()
                .filter(|(r, _)| *r < ranks)
                .map(|(r, e)| format!("rank {r} failed: {e}")),
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// The slowest rank's iteration, shown on stderr (common's [`Progress`]).
pub struct Display {
    shown: Progress,
    total: u64,
}

impl Display {
    /// For runs of `total` iterations (warm-up included).
    pub fn new(total: u64) -> Display {
        Display {
            shown: Progress::new("stencil2d"),
            total,
        }
    }
    /// Shows where the first `ranks` ranks of this process are, when it is time to.
    pub fn tick(&mut self, ranks: usize) {
        let now = snapshot(ranks);
        let total = self.total;
        self.shown.show(|| match now.iter().min() {
            Some(0) | None => "starting up".to_string(),
            Some(v) => format!("iteration {} of {total}", (v >> 8).min(total)),
        });
    }
}

/// A thread that shows rank 0's progress until dropped (a process that runs only rank 0).
pub struct Shown {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Shown {
    pub fn start(total: u64) -> Shown {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut d = Display::new(total);
            while !s.load(Ordering::Relaxed) {
                d.tick(1);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Shown {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_where_each_rank_is_and_which_steps_are_watched() {
        // Ranks 40.. of the table: no other test of this binary notes them.
        at(41, 7, Step::Synchronize);
        at(42, 3, Step::Out);
        let now = snapshot(43);
        assert!(
            watched(&now[41..]),
            "a rank in cuStreamSynchronize is watched"
        );
        assert!(!watched(&now[42..]), "a rank out of its loop is not");
        at(41, 9, Step::Kernel);
        assert!(
            !watched(&snapshot(43)[40..]),
            "nor one in the persistent kernel"
        );
        let r = report(43);
        assert!(r.contains("rank 40: not in a GPU loop"), "{r}");
        assert!(
            r.contains("rank 41: iteration 9, the persistent kernel"),
            "{r}"
        );
        assert!(r.contains("rank 42: iteration 3, out of the loop"), "{r}");
    }
}
