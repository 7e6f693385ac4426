//! Progress of a long run on stderr, where it never mixes with the rows or `--json` on stdout:
//! on a terminal one line rewritten in place (a few times a second); otherwise, as in CI
//! logs, a line every [`LOG_EVERY`], and nothing for runs shorter than [`QUIET_FOR`].

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Runs shorter than this show no progress.
pub const QUIET_FOR: Duration = Duration::from_secs(2);
/// Where stderr is not a terminal: one line this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// On a terminal: the line is rewritten this often.
const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// A progress display.
pub struct Progress {
    tool: &'static str,
    start: Instant,
    last: Option<Instant>,
    tty: bool,
    /// Whether a line on the terminal waits to be cleared.
    drawn: bool,
}

impl Progress {
    pub fn new(tool: &'static str) -> Progress {
        Progress {
            tool,
            start: Instant::now(),
            last: None,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// Shows `what` (built only when it is shown) if it is time to.
    pub fn show(&mut self, what: impl FnOnce() -> String) {
        let now = Instant::now();
        if now.duration_since(self.start) < QUIET_FOR {
            return;
        }
        let every = if self.tty { REDRAW_EVERY } else { LOG_EVERY };
        if self.last.is_some_and(|t| now.duration_since(t) < every) {
            return;
        }
        self.last = Some(now);
        let line = format!(
            "{}: {} ({:.0} s)",
            self.tool,
            what(),
            now.duration_since(self.start).as_secs_f64()
        );
        let mut e = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not end the run.
        let _ = if self.tty {
            self.drawn = true;
            write!(e, "\r\x1b[2K{line}").and_then(|_| e.flush())
        } else {
            writeln!(e, "{line}")
        };
    }

    /// Clears the terminal line, before the result is printed.
    pub fn done(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done();
    }
}
