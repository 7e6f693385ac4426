//! The one rule for gdasync's environment variables (`GDSYNC_*`): unset or empty means the
//! default; any other value must be one the variable takes, or it is a one-line error that
//! names the values it takes (never a warning, never a silent default).
//!
//! | variable | values |
//! |---|---|
//! | `GDSYNC_SOFT_PROGRESS` | `auto`, `thread`, `shared` |
//! | `GDSYNC_SOFT_LINK` | `auto`, `shm`, `tcp` |
//! | `GDSYNC_NIC_HANDLER` | `auto`, `gpu`, `cpu` |
//! | `GDSYNC_STAGING` | `auto`, `on`, `off` (GPU payloads through pinned host bounce buffers) |
//! | `GDSYNC_STAGING_COPY` | `kernel`, `engine` (how a CUDA stream copies staged payloads) |
//! | `GDSYNC_CUDA` | `on`, `off`, `1`, `0` (checked where the driver loads, `cuda/load.rs`) |
//! | `GDSYNC_DEVICE` | `soft`, an RDMA device (`mlx5_0`, `mlx5_0:1`) |
//! | `GDSYNC_IB_TC` | a RoCE traffic class, `0` to `255` |
//! | `GDSYNC_IB_SL` | an InfiniBand service level, `0` to `15` |
//! | `GDSYNC_IB_HOP_LIMIT` | a hop limit, `1` to `255` |
//! | `GDSYNC_LOG` (the examples) | levels (`off`, `error`, `warn`, `info`, `debug`, `trace`) and `TARGET=LEVEL` directives |

use crate::error::{Error, Result};

/// The levels a log directive may name.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `choices` as a sentence: `a, b or c`.
pub fn one_of(choices: &[&str]) -> String {
    match choices {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The error for value `value` of variable `var`, which takes `expected`.
pub fn invalid(var: &str, value: &str, expected: &str) -> Error {
    Error::invalid(format!("{var}={value:?}: expected {expected}"))
}

/// `value` (variable `var`'s, `None` when unset) among `choices`: `None` when unset or empty
/// (the default), the choice when it is one of them, else an error naming them.
pub fn choice_of(
    var: &str,
    value: Option<&str>,
    choices: &[&'static str],
) -> Result<Option<&'static str>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match choices.iter().find(|c| **c == v) {
        Some(c) => Ok(Some(*c)),
        None => Err(invalid(var, v, &one_of(choices))),
    }
}

/// Variable `var` read from the environment, by [`choice_of`] (a value that is not Unicode is
/// an error too).
pub fn choice(var: &str, choices: &[&'static str]) -> Result<Option<&'static str>> {
    choice_of(var, read(var)?.as_deref(), choices)
}

/// `value` (variable `var`'s, `None` when unset) as a number in `range`: `None` when unset or
/// empty (the default), else the number, or an error naming the range.
pub fn number_of(
    var: &str,
    value: Option<&str>,
    range: std::ops::RangeInclusive<u32>,
) -> Result<Option<u32>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.parse::<u32>() {
        Ok(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(invalid(
            var,
            v,
            &format!("a number from {} to {}", range.start(), range.end()),
        )),
    }
}

/// Variable `var` read from the environment, by [`number_of`].
pub fn number(var: &str, range: std::ops::RangeInclusive<u32>) -> Result<Option<u32>> {
    number_of(var, read(var)?.as_deref(), range)
}

/// Variable `var`'s value; `None` when unset.
fn read(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(invalid(var, &v.to_string_lossy(), "text")),
    }
}

/// Checks a log filter (`GDSYNC_LOG`, the directives of tracing-subscriber's `Targets`): each
/// comma-separated directive is a level, or `TARGET=LEVEL`, or a target of gdasync's crates
/// (`gdsync`, `mp`, `gdasync`, with any `::module` path) for every level. Anything else, such
/// as a misspelt level (`wran`, which the filter would take as a target and so hide every
/// warning), is an error naming the levels.
pub fn check_log_filter(var: &str, value: &str) -> Result<()> {
    let expected = || {
        format!(
            "comma-separated levels ({}) or TARGET=LEVEL directives",
            one_of(&LOG_LEVELS)
        )
    };
    for d in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = match d.split_once('=') {
            Some((target, level)) if !target.is_empty() => level,
            Some(_) => return Err(invalid(var, value, &expected())),
            None if ours(d) => continue,
            None => d,
        };
        if !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(invalid(var, value, &expected()));
        }
    }
    Ok(())
}

/// Whether `target` names one of gdasync's crates or a module in one.
fn ours(target: &str) -> bool {
    let krate = target.split("::").next().unwrap_or("");
    ["gdsync", "mp", "gdasync"].contains(&krate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_is_the_default_and_a_choice_is_itself() {
        let c = ["auto", "thread", "shared"];
        assert_eq!(choice_of("V", None, &c).unwrap(), None);
        assert_eq!(choice_of("V", Some(""), &c).unwrap(), None);
        assert_eq!(choice_of("V", Some(" "), &c).unwrap(), None);
        assert_eq!(choice_of("V", Some("thread"), &c).unwrap(), Some("thread"));
    }

    #[test]
    fn anything_else_is_one_line_naming_the_choices() {
        let e = choice_of(
            "GDSYNC_SOFT_PROGRESS",
            Some("threads"),
            &["auto", "thread", "shared"],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "invalid argument: GDSYNC_SOFT_PROGRESS=\"threads\": expected auto, thread or shared"
        );
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b"]), "a or b");
    }

    #[test]
    fn numbers_are_in_their_range_or_one_line_naming_it() {
        assert_eq!(number_of("V", None, 0..=15).unwrap(), None);
        assert_eq!(number_of("V", Some(" "), 0..=15).unwrap(), None);
        assert_eq!(number_of("V", Some("15"), 0..=15).unwrap(), Some(15));
        assert_eq!(number_of("V", Some(" 3 "), 0..=15).unwrap(), Some(3));
        for bad in ["16", "-1", "3.0", "x", "0x3"] {
            let e = number_of("GDSYNC_IB_SL", Some(bad), 0..=15)
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!("invalid argument: GDSYNC_IB_SL={bad:?}: expected a number from 0 to 15")
            );
        }
    }

    #[test]
    fn log_filters_take_levels_directives_and_our_targets() {
        for ok in [
            "debug",
            "WARN",
            "warn,gdsync::device=debug",
            "gdsync",
            "mp::comm",
            "gdsync::device::soft=trace,info",
            "",
        ] {
            assert!(check_log_filter("GDSYNC_LOG", ok).is_ok(), "{ok:?}");
        }
        for bad in ["wran", "warn,dbug", "gdsync=loud", "=debug", "tokio"] {
            let e = check_log_filter("GDSYNC_LOG", bad).unwrap_err().to_string();
            assert!(
                e.contains(
                    "expected comma-separated levels (off, error, warn, info, debug or trace)"
                ),
                "{bad:?}: {e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
