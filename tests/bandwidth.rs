//! The bandwidth example: every operation on the CPU trigger reports consistent JSON, the
//! default sweep covers 1 B to 8 MiB, bad flags are clean errors. The GPU triggers (stream and
//! kernel, host and device memory) are ignored unless asked for (`cargo test --release --test
//! bandwidth -- --include-ignored`), and then require a GPU.

mod common;

use common::example;
use common::gpu::{gpu, NO_CUDA};
use common::json_field as field;

fn run(args: &[&str]) -> (bool, String, String) {
    example::run("bandwidth", args)
}

/// A `--json` run that must succeed: its lines.
fn json_run(args: &[&str]) -> Vec<String> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = run(&all);
    assert!(ok, "{all:?} failed:\n{out}\n{err}");
    out.lines().map(String::from).collect()
}

fn num(line: &str, key: &str) -> f64 {
    let v: f64 = field(line, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line}: {e}"));
    assert!(v.is_finite(), "{key} in {line}");
    v
}

/// One line: its labels, positive bytes, time and rates, and rates that agree with bytes,
/// messages and seconds.
fn check_line(line: &str, labels: [&str; 3], size: usize, iters: u64, window: u64) {
    assert!(
        line.starts_with('{') && line.ends_with('}'),
        "not one JSON object: {line}"
    );
    for (key, want) in ["op", "mem", "trigger"].iter().zip(labels) {
        assert_eq!(field(line, key), want, "{key}: {line}");
    }
    assert_eq!(num(line, "bytes"), size as f64, "{line}");
    assert_eq!(num(line, "iters"), iters as f64, "{line}");
    assert_eq!(num(line, "window"), window as f64, "{line}");
    assert_eq!(
        num(line, "signal_every"),
        (window / 4).max(1) as f64,
        "{line}"
    );
    let (secs, gbps, mmsgs) = (
        num(line, "seconds"),
        num(line, "gbytes_per_s"),
        num(line, "mmsg_per_s"),
    );
    assert!(secs > 0.0 && gbps > 0.0 && mmsgs > 0.0, "{line}");
    let bytes = size as f64 * iters as f64;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs();
    assert!(close(gbps, bytes / secs / 1e9), "GB/s from bytes: {line}");
    assert!(
        close(mmsgs, iters as f64 / secs / 1e6),
        "rate from iters: {line}"
    );
}

/// `--sizes` and `--iters` run for `labels` (op, mem, trigger): one good line per size.
fn check_run(labels: [&str; 3], extra: &[&str]) {
    let sizes = [1usize, 4096, 1 << 20];
    let [op, mem, trigger] = labels;
    let trigger = if trigger == "host-stream" {
        "stream"
    } else {
        trigger
    };
    let mut args = vec![
        "--op",
        op,
        "--mem",
        mem,
        "--trigger",
        trigger,
        "--sizes",
        "1,4096,1048576",
        "--iters",
        "300",
    ];
    args.extend_from_slice(extra);
    let lines = json_run(&args);
    assert_eq!(lines.len(), sizes.len(), "{args:?}: {lines:?}");
    let window = extra
        .iter()
        .position(|&a| a == "--window")
        .map_or(64, |k| extra[k + 1].parse().unwrap());
    for (line, size) in lines.iter().zip(sizes) {
        check_line(line, labels, size, 300, window);
    }
}

#[test]
fn every_op_on_the_cpu_trigger_reports_consistent_json() {
    for op in ["write", "read", "send"] {
        check_run([op, "host", "cpu"], &[]);
    }
    // A window of 1: one message in flight, each signalled.
    check_run(["send", "host", "cpu"], &["--window", "1"]);
}

/// The stream trigger's loop (chunks, a wait a window back, the progress word), run by a host
/// stream here: the same code a CUDA stream runs on the GPU machine.
#[test]
fn the_stream_loop_runs_on_a_host_stream() {
    for op in ["write", "read", "send"] {
        check_run([op, "host", "host-stream"], &["--host-stream"]);
    }
    for window in ["1", "5", "128"] {
        check_run(
            ["send", "host", "host-stream"],
            &["--host-stream", "--window", window],
        );
    }
}

#[test]
fn the_default_sweep_is_1_byte_to_8_mib() {
    // --iters keeps it short; the sizes are the default ones.
    let lines = json_run(&["--iters", "20", "--warmup", "2"]);
    let sizes: Vec<usize> = lines
        .iter()
        .map(|l| field(l, "bytes").parse().unwrap())
        .collect();
    assert_eq!(sizes, (0..=23).map(|k| 1usize << k).collect::<Vec<_>>());
    // The table: the header says what the units are, one row per size.
    let (ok, out, err) = run(&["--iters", "20", "--warmup", "2", "--op", "read"]);
    assert!(ok, "{err}");
    assert!(out.contains("GB/s = 10^9 bytes/s"), "{out}");
    assert!(
        out.contains("BW[GB/s]") && out.contains("rate[Mmsg/s]"),
        "{out}"
    );
    let rows = out.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 1 + 24, "a column header and 24 sizes:\n{out}");
}

#[test]
fn default_iterations_shrink_for_large_sizes() {
    let lines = json_run(&["--sizes", "64,8388608"]);
    let iters: Vec<f64> = lines.iter().map(|l| num(l, "iters")).collect();
    assert!(
        iters[1] < iters[0] && iters[1] >= 100.0,
        "iterations for 64 B and 8 MiB: {iters:?}"
    );
    assert!(num(&lines[1], "warmup") > 0.0, "{}", lines[1]);
}

#[test]
fn bad_flags_are_clean_errors() {
    for (args, want) in [
        (&["--sizes", "0"][..], "at least 1 byte"),
        (&["--op", "read", "--sizes", "0,8"][..], "at least 1 byte"),
        (&["--sizes", "2147483648"][..], "at most 1 GiB"),
        (&["--iters", "0"][..], "--iters"),
        (&["--window", "0"][..], "--window"),
        (&["--window", "129"][..], "--window"),
        (&["--op", "atomic"][..], "invalid value"),
        (&["--trigger", "host"][..], "invalid value"),
        (
            &["--host-stream"][..],
            "--host-stream runs --trigger stream",
        ),
    ] {
        let (ok, _, err) = run(args);
        assert!(!ok, "{args:?} must fail");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Switched off for the run, so that machines with a GPU check this too.
#[test]
fn flags_needing_a_gpu_fail_cleanly_without_cuda() {
    for args in [
        &["--trigger", "stream"][..],
        &["--trigger", "kernel"][..],
        &["--mem", "device"][..],
        &["--trigger", "kernel", "--mem", "device"][..],
    ] {
        let (ok, _, err) = example::run_env("bandwidth", args, &[NO_CUDA]);
        assert!(!ok, "{args:?} without a GPU must fail");
        assert!(err.contains("needs a CUDA GPU"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

/// Every op with the stream and kernel triggers, host and device memory, and the CPU trigger
/// with device memory.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test bandwidth -- --include-ignored"]
fn gpu_triggers_report_consistent_json() {
    let _gpu = gpu();
    for op in ["write", "read", "send"] {
        for trigger in ["stream", "kernel"] {
            for mem in ["host", "device"] {
                check_run([op, mem, trigger], &[]);
            }
        }
        check_run([op, "device", "cpu"], &[]);
        check_run([op, "host", "kernel"], &["--window", "1"]);
        check_run([op, "host", "stream"], &["--window", "5"]);
    }
}
