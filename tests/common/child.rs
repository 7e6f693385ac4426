//! How a test and its child process talk: the child's tagged lines on stdout (the
//! parent skips the test harness's own output by the tag) and stdin's lines on a channel.

use std::io::{BufRead, Write};
use std::sync::mpsc::{self, Receiver};

/// Writes `tag` + `msg` as one line on stdout, flushed at once.
pub fn say(tag: &str, msg: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{tag}{msg}").unwrap();
    out.flush().unwrap();
}

/// Lines of stdin, read on a thread; disconnected at EOF.
pub fn stdin_lines() -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The parent's side: the child's stdout lines that carry `tag`, with the tag and what came
/// before it cut off (libtest may print "test child ... " without a newline before the first
/// one), read on a thread; disconnected at EOF.
pub fn tagged_lines(stdout: std::process::ChildStdout, tag: &'static str) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(i) = line.find(tag) {
                if tx.send(line[i + tag.len()..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}
