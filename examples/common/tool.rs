//! What every tool does around its work: the flags all share (`--debug`), logging set-up, and
//! how an error ends the run: one line `error: ...` with its causes, exit status 1, and no
//! backtrace whatever `RUST_BACKTRACE` says (`--debug` prints the error in full).

use std::process::ExitCode;

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
            ExitCode::FAILURE
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
