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
    /// Installs logging, then runs `body`, and ends the tool with its result.
    pub fn run(&self, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
        finish(
            super::log::init(self.debug).and_then(|_| body()),
            self.debug,
        )
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
