//! How long a measurement runs: a count of iterations (bounded, so that sample buffers and
//! counters cannot overflow and a typo does not run for centuries) or a duration.

use clap::builder::TypedValueParser;
use std::time::Duration;

/// Most iterations any tool runs per measurement (at a microsecond each, a quarter of an
/// hour).
pub const MAX_ITERS: u64 = 1_000_000_000;
/// Longest `--duration`: a day.
pub const MAX_DURATION_S: f64 = 86_400.0;

/// A parser for an iteration count in `min..=max`.
pub fn count(min: u64, max: u64) -> impl TypedValueParser<Value = u64> {
    clap::value_parser!(u64).range(min..=max)
}

/// `--duration S`: seconds (fractions allowed), more than 0 and at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= MAX_DURATION_S) {
        return Err(format!(
            "{s} s: a duration must be more than 0 and at most {MAX_DURATION_S} s"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_positive_seconds() {
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        for bad in ["0", "-1", "nan", "inf", "1e9", "x"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
