//! What every tool does around its work: the flags all share (`--debug`), logging set-up, and
//! how an error ends the run: one line `error: ...` with its causes and no backtrace whatever
//! `RUST_BACKTRACE` says (`--debug` prints the error in full).
//!
//! Exit status, as clap has it: 0 the run succeeded; 2 the command line is wrong (clap's own
//! errors, and flags or values that do not go together: a [`Usage`] error); 1 the run failed
//! (a device or GPU that is not there, an error while measuring).

use std::process::ExitCode;

/// A command line that cannot run as given (flags that do not go together, a value out of
/// range): the tool exits with status 2, as clap does for the errors it finds itself.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `e` (an error, or a message) as a [`Usage`] error.
pub fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::Error::new(Usage(format!("{e:#}")))
}

/// The exit status of error `e`: 2 for a [`Usage`] error, else 1.
pub fn status_of(e: &anyhow::Error) -> ExitCode {
    if e.downcast_ref::<Usage>().is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

/// Flags every tool has.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ToolArgs {
    /// Log at debug level (unless GDSYNC_LOG sets the filter) and print errors in full.
    #[arg(long)]
    pub debug: bool,
}

impl ToolArgs {
    /// Chooses the CUDA driver's hardware queues ([`cuda_queues`]), installs logging, then
    /// runs `body`, and ends the tool with its result.
    pub fn run(&self, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
        cuda_queues();
        finish(
            super::log::init(self.debug).and_then(|_| body()),
            self.debug,
        )
    }
}

/// Sets `CUDA_DEVICE_MAX_CONNECTIONS` to 32 (the driver's maximum; 8 by default) unless the
/// environment sets it: the tools run several streams per GPU (four ranks' streams and their
/// copy streams are eight), and streams that share a hardware queue wait for each other's
/// memory waits. Called first thing in `main`, before any thread exists (setting the
/// environment is not safe once other threads may read it), and before the driver starts.
fn cuda_queues() {
    use gdasync::gdsync::cuda::{MAX_CONNECTIONS, MAX_CONNECTIONS_VAR};
    if std::env::var_os(MAX_CONNECTIONS_VAR).is_none() {
        std::env::set_var(MAX_CONNECTIONS_VAR, MAX_CONNECTIONS.to_string());
    }
}

/// The exit status for `r`, after printing its error.
pub fn finish(r: anyhow::Result<()>, debug: bool) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, debug);
            status_of(&e)
        }
    }
}

/// Prints `e` as the tools do: `error: ` and its chain of causes on one line (`--debug`:
/// anyhow's full report, with a backtrace if one was captured).
pub fn report(e: &anyhow::Error, debug: bool) {
    if debug {
        eprintln!("error: {e:?}");
    } else {
        eprintln!("error: {e:#}");
    }
}

/// Ends the process with `e` at once, without dropping anything: a stream or kernel may still
/// wait on memory that drops would free, and CUDA's frees would wait for it (a hang).
pub fn exit_now(e: anyhow::Error) -> ! {
    report(&e, false);
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_and_other_errors_1() {
        let u = usage("--ranks must be at least 1");
        assert_eq!(u.to_string(), "--ranks must be at least 1");
        assert_eq!(status_of(&u), ExitCode::from(2));
        assert_eq!(status_of(&u.context("while starting")), ExitCode::from(2));
        let chained = usage(anyhow::anyhow!("root cause").context("flag"));
        assert_eq!(chained.to_string(), "flag: root cause");
        assert_eq!(status_of(&anyhow::anyhow!("no GPU")), ExitCode::FAILURE);
    }
}
