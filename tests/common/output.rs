//! A command's output, with a hang guard: a tool that runs past its limit is killed and the
//! test fails with what it printed, instead of the test run stalling until CI's own limit.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one tool run in a test may take: far beyond any run the tests make (seconds),
/// short of the test harness's patience.
pub const TOOL_LIMIT: Duration = Duration::from_secs(240);

/// Runs `cmd` to its end, as [`Command::output`], or kills it after `limit` and panics with
/// its stderr's last lines.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
            let tail: Vec<&str> = err.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "{cmd:?} ran past {limit:?} and was killed; the end of its stderr:\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// [`output_within`] [`TOOL_LIMIT`] as a method of [`Command`].
pub trait GuardedOutput {
    /// The command's output; a run past [`TOOL_LIMIT`] is killed and fails the test.
    fn guarded_output(&mut self) -> Output;
}

impl GuardedOutput for Command {
    fn guarded_output(&mut self) -> Output {
        output_within(self, TOOL_LIMIT)
    }
}
