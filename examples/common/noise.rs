//! When a measured row cannot be trusted, and why: the rule that marks pingpong's and
//! bandwidth's rows `noisy` (a note after the table row, `"noisy": true` in the JSON).
//!
//! A row is noisy when either holds:
//! - **the timed blocks disagree**: the samples, in the order they were taken, are cut into
//!   [`BLOCKS`] blocks of equal length (only with at least [`MIN_PER_BLOCK`] samples each); the
//!   medians of the blocks differ by more than [`SPREAD_FACTOR`] times the blocks' typical
//!   spread (the median of their interquartile ranges) *and* the largest median is at least
//!   [`RATIO`] times the smallest. The first condition says the difference is not the
//!   distribution's own width; the second that it is large enough to change a conclusion.
//! - **the run was descheduled**: the process was made to wait for a CPU (involuntary context
//!   switches, from `getrusage`) at least [`MIN_SWITCHES`] times and at least once per
//!   [`ITERS_PER_SWITCH`] iterations. A polling loop that loses its core that often is measuring
//!   the scheduler, not the device.

/// Blocks the samples are cut into.
pub const BLOCKS: usize = 8;
/// Samples a block needs for its median and spread to mean something.
pub const MIN_PER_BLOCK: usize = 32;
/// How many typical spreads the block medians may differ by.
pub const SPREAD_FACTOR: f64 = 4.0;
/// How many times the smallest block median the largest may be.
pub const RATIO: f64 = 1.5;
/// Fewest involuntary context switches that count as descheduled.
pub const MIN_SWITCHES: u64 = 2;
/// Iterations per involuntary context switch below which a run counts as descheduled.
pub const ITERS_PER_SWITCH: u64 = 1000;

/// Why `samples` (in the order they were taken) are noisy by the block rule, if they are:
/// the smallest and largest block medians.
pub fn blocks_disagree(samples: &[f64]) -> Option<String> {
    let per = samples.len() / BLOCKS;
    if per < MIN_PER_BLOCK {
        return None;
    }
    let (mut medians, mut spreads) = (Vec::with_capacity(BLOCKS), Vec::with_capacity(BLOCKS));
    for block in samples.chunks_exact(per).take(BLOCKS) {
        let mut b = block.to_vec();
        b.sort_by(f64::total_cmp);
        let at = |p: f64| b[((b.len() - 1) as f64 * p).round() as usize];
        medians.push(at(0.5));
        spreads.push(at(0.75) - at(0.25));
    }
    spreads.sort_by(f64::total_cmp);
    let spread = spreads[BLOCKS / 2];
    let lo = medians.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = medians.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (hi - lo > SPREAD_FACTOR * spread && hi >= RATIO * lo)
        .then(|| format!("block medians {lo:.3}..{hi:.3} us"))
}

/// Why a run of `iters` iterations with `switches` involuntary context switches is noisy by
/// the descheduling rule, if it is.
pub fn descheduled(switches: u64, iters: u64) -> Option<String> {
    (switches >= MIN_SWITCHES && switches.saturating_mul(ITERS_PER_SWITCH) >= iters)
        .then(|| format!("descheduled {switches} times"))
}

/// Involuntary context switches of this process so far (every thread): times the kernel took
/// a CPU away from it.
pub fn involuntary_switches() -> u64 {
    // SAFETY: getrusage fills the struct we pass; all-zero bytes are a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_nivcsw.max(0) as u64
}

/// The reasons joined for a row (`None`: not noisy).
pub fn verdict(reasons: [Option<String>; 2]) -> Option<String> {
    let r: Vec<String> = reasons.into_iter().flatten().collect();
    (!r.is_empty()).then(|| r.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values spread over `lo..hi`, in a shuffled order.
    fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n)
            .map(|i| lo + (hi - lo) * ((i * 7919) % n) as f64 / n as f64)
            .collect()
    }

    #[test]
    fn steady_samples_are_not_noisy() {
        assert_eq!(blocks_disagree(&spread(10_000, 0.55, 0.65)), None);
    }

    #[test]
    fn a_wide_but_steady_distribution_is_not_noisy() {
        // Medians of every block near 50, each block's spread about 50: far apart values,
        // but the same distribution throughout.
        assert_eq!(blocks_disagree(&spread(10_000, 1.0, 100.0)), None);
    }

    #[test]
    fn a_jump_far_beyond_the_spread_is_noisy() {
        // 0.22 µs, then 50 µs: what a machine that got busy mid-run gives.
        let mut s = spread(5_000, 0.21, 0.23);
        s.extend(spread(5_000, 49.0, 51.0));
        let why = blocks_disagree(&s).expect("noisy");
        assert!(why.contains("0.2") && why.contains("50."), "{why}");
    }

    #[test]
    fn a_small_drift_with_a_tight_spread_is_not_noisy() {
        // Beyond the spread, but 10%: below RATIO.
        let mut s = spread(5_000, 0.600, 0.601);
        s.extend(spread(5_000, 0.660, 0.661));
        assert_eq!(blocks_disagree(&s), None);
    }

    #[test]
    fn a_large_ratio_within_the_spread_is_not_noisy() {
        // Block medians 50 and 100 (ratio 2), but each block's quartiles lie 50 apart.
        let mut s = spread(5_000, 0.0, 100.0);
        s.extend(spread(5_000, 50.0, 150.0));
        assert_eq!(blocks_disagree(&s), None);
    }

    #[test]
    fn too_few_samples_give_no_verdict() {
        let mut s = vec![1.0; 100];
        s.extend(vec![100.0; 100]);
        assert_eq!(blocks_disagree(&s), None);
    }

    #[test]
    fn descheduling_counts_switches_per_iteration() {
        assert_eq!(descheduled(0, 10_000), None);
        assert_eq!(descheduled(1, 100), None, "one switch is not a pattern");
        assert_eq!(descheduled(9, 10_000), None);
        assert!(descheduled(10, 10_000).is_some());
        assert!(descheduled(2, 200).is_some());
        assert!(descheduled(u64::MAX, u64::MAX).is_some());
    }

    #[test]
    fn the_verdict_joins_the_reasons() {
        assert_eq!(verdict([None, None]), None);
        assert_eq!(
            verdict([Some("a".into()), Some("b".into())]).as_deref(),
            Some("a; b")
        );
    }
}
