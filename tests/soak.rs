//! The soak (`examples/soak.rs`), short: thousands of messages of random sizes and operations
//! across 4 ranks, as threads and as processes, every byte checked; and the check itself
//! proven, by a message corrupted, lost or repeated on purpose (`--inject`) that it must name.
//! The long runs (10 million messages) are in docs/reliability.md.

mod common;

use std::process::{Command, Output};

fn soak(args: &[&str]) -> Output {
    let exe = common::example("soak").expect("the soak example");
    Command::new(exe)
        .args(["--ranks", "4", "--seed", "11", "--timeout", "20"])
        .args(args)
        .env_remove("GDSYNC_LOG")
        .output()
        .unwrap()
}

fn passes(args: &[&str]) {
    let out = soak(args);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "soak {args:?} failed:\n{o}\n{e}");
    assert!(
        o.contains("none lost, duplicated, reordered or corrupted"),
        "{o}\n{e}"
    );
}

#[test]
fn soak_threads_checks_every_message() {
    passes(&["--messages", "20000"]);
}

#[test]
fn soak_processes_checks_every_message() {
    passes(&["--messages", "20000", "--ranks-as", "procs"]);
}

#[test]
fn soak_names_a_corrupted_lost_or_repeated_message() {
    for (fault, says) in [
        ("corrupt", "corrupted: byte"),
        ("drop", "lost or reordered"),
        ("duplicate", "duplicated"),
    ] {
        let out = soak(&["--messages", "5000", "--inject", fault]);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--inject {fault} went unseen:\n{e}");
        assert!(e.contains(says), "--inject {fault}: want {says:?} in\n{e}");
        assert!(e.contains("from rank 0"), "--inject {fault}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}
