//! Standard output, one line at a time and flushed at once (rows stream as they are
//! measured), ending the process quietly when the reader has gone (`tool | head -1`), as
//! Unix tools do.

use std::io::Write;

/// Prints a line to stdout through [`line`].
macro_rules! outln {
    () => {
        $crate::common::out::line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::common::out::line(format_args!($($t)*))
    };
}
pub(crate) use outln;

/// Writes `args` and a newline to stdout and flushes. A closed pipe ends the process as
/// SIGPIPE ends other tools: silently. Any other write error ends it with one line.
pub fn line(args: std::fmt::Arguments) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = writeln!(o, "{args}").and_then(|_| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            reader_gone();
        }
        eprintln!("error: writing the output: {e}");
        std::process::exit(1);
    }
}

/// Ends the process as a write to a closed pipe ends tools that keep SIGPIPE's default
/// action (Rust programs ignore it): killed by SIGPIPE, without a message.
pub fn reader_gone() -> ! {
    // SAFETY: plain libc calls with constant arguments: restore SIGPIPE's default action and
    // raise it, which ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}
