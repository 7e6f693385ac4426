//! Latency figures of one measurement, as perftest reports them: minimum, maximum, median
//! (perftest's "typical"), mean, standard deviation, 99th and 99.9th percentiles of the half
//! round trips; the CPU time spent per iteration; and whether the row is noisy
//! ([`super::noise`]).

use super::noise;

/// The figures of one size, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub bytes: usize,
    pub iters: usize,
    pub min: f64,
    pub max: f64,
    pub p50: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
    pub cpu_us_per_iter: f64,
    /// Why the figures cannot be trusted, if they cannot ([`super::noise`]).
    pub noisy: Option<String>,
}

impl Stats {
    /// From the half round trips of `bytes`-byte messages (µs), in the order they were
    /// taken; `cpu` µs of CPU time per iteration. No samples give NaNs (printed as `null` in
    /// JSON).
    pub fn new(bytes: usize, mut half_rtts: Vec<f64>, cpu: f64) -> Stats {
        let noisy = noise::blocks_disagree(&half_rtts);
        half_rtts.sort_by(f64::total_cmp);
        let n = half_rtts.len();
        let pct = |p: f64| match n {
            0 => f64::NAN,
            _ => half_rtts[((n - 1) as f64 * p).round() as usize],
        };
        let avg = half_rtts.iter().sum::<f64>() / n as f64;
        let var = half_rtts.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n as f64;
        Stats {
            bytes,
            iters: n,
            min: pct(0.0),
            max: pct(1.0),
            p50: pct(0.5),
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
            cpu_us_per_iter: cpu,
            noisy,
        }
    }

    /// These figures, marked noisy if the process was descheduled `switches` times while
    /// they were taken ([`noise::descheduled`]).
    pub fn with_switches(mut self, switches: u64) -> Stats {
        let why = noise::descheduled(switches, self.iters as u64);
        self.noisy = noise::verdict([self.noisy.take(), why]);
        self
    }
}

/// CPU time (user and system) this process has used, in µs.
pub fn cpu_time_us() -> f64 {
    // SAFETY: getrusage fills the struct we pass; all-zero bytes are a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_spread() {
        let s = Stats::new(8, (1..=1000).rev().map(f64::from).collect(), 0.5);
        assert_eq!((s.iters, s.min, s.max), (1000, 1.0, 1000.0));
        assert_eq!((s.p50, s.p99, s.p999), (501.0, 990.0, 999.0));
        assert_eq!(s.avg, 500.5);
        assert!((s.stdev - 288.6749).abs() < 1e-3, "{}", s.stdev);
        assert!(Stats::new(8, vec![], 0.0).p50.is_nan());
    }
}
