//! Which GPUs this process's streams are on: what [`ListKernel::Auto`](super::ListKernel)
//! decides by.
//!
//! On a two-H200 host, a stream's stores (each with the fence a stream write makes) cost about
//! 3 µs each while streams of the process on both GPUs run them, against about 0.9 µs with
//! every stream on one GPU, and a list kernel's stores do not pay that (docs/benchmarks.md,
//! "pingpong across two GPUs"). So with `GDSYNC_LIST_KERNEL=auto` (the default), while streams
//! live on more than one GPU, lists without copies run as list kernels too. Streams of other
//! processes count as well (stencil2d, two processes on two H200s: 8% faster with list kernels),
//! but a process cannot see them: the job says so ([`set_job_spans_gpus`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Live streams per GPU ordinal.
static LIVE: Mutex<BTreeMap<i32, usize>> = Mutex::new(BTreeMap::new());
/// Whether `LIVE` names more than one GPU (read on every submit, so kept apart).
static SPANS: AtomicBool = AtomicBool::new(false);
/// Whether the job's ranks on this host, other processes' included, run streams on more than
/// one GPU ([`set_job_spans_gpus`]).
static JOB_SPANS: AtomicBool = AtomicBool::new(false);

/// Tells gdsync that the job's ranks on this host run streams on more than one GPU, those of
/// other processes included (one process per GPU, as under `mpirun`), or no longer do. With
/// `GDSYNC_LIST_KERNEL=auto` (the default) streams then run lists without copies as list
/// kernels, as they do while this process's own streams span GPUs: on a two-H200 host a
/// stream's stores cost about 3 µs each while streams on both GPUs run them, whichever
/// processes those streams belong to. Call it before the process makes its first stream (the
/// list kernel is loaded then).
pub fn set_job_spans_gpus(spans: bool) {
    JOB_SPANS.store(spans, Ordering::Relaxed);
}

/// Whether the job said its ranks on this host span GPUs ([`set_job_spans_gpus`]).
pub(super) fn job_spans_gpus() -> bool {
    JOB_SPANS.load(Ordering::Relaxed)
}

/// Counts a new stream on GPU `ordinal`.
pub(super) fn opened(ordinal: i32) {
    update(|live| *live.entry(ordinal).or_insert(0) += 1);
}

/// Counts a stream on GPU `ordinal` gone.
pub(super) fn closed(ordinal: i32) {
    update(|live| {
        if let Some(n) = live.get_mut(&ordinal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                live.remove(&ordinal);
            }
        }
    });
}

/// Whether this process has live streams on more than one GPU, or the job said its ranks on
/// this host do.
pub(super) fn spans_gpus() -> bool {
    SPANS.load(Ordering::Relaxed) || job_spans_gpus()
}

fn update(f: impl FnOnce(&mut BTreeMap<i32, usize>)) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut live);
    SPANS.store(spans(&live), Ordering::Relaxed);
}

fn spans(live: &BTreeMap<i32, usize>) -> bool {
    live.len() > 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_span_gpus_while_two_gpus_have_live_ones() {
        let mut live = BTreeMap::new();
        assert!(!spans(&live));
        *live.entry(0).or_insert(0) += 2;
        assert!(!spans(&live), "two streams on one GPU");
        *live.entry(1).or_insert(0) += 1;
        assert!(spans(&live), "streams on GPUs 0 and 1");
        live.remove(&1);
        assert!(!spans(&live), "GPU 1's stream gone");
    }

    #[test]
    fn the_job_saying_its_ranks_span_gpus_counts_too() {
        assert!(!job_spans_gpus());
        set_job_spans_gpus(true);
        let said = spans_gpus();
        set_job_spans_gpus(false);
        assert!(
            said,
            "the job's word counts where this process's streams do not span GPUs"
        );
    }

    #[test]
    fn opening_and_closing_keeps_counts_per_gpu() {
        // Ordinals no other test's streams use (the counts are the process's).
        opened(1000);
        opened(1000);
        closed(1000);
        assert_eq!(LIVE.lock().unwrap().get(&1000), Some(&1));
        closed(1000);
        closed(1000);
        assert_eq!(LIVE.lock().unwrap().get(&1000), None, "never below zero");
    }
}
