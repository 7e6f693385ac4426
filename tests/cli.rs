//! The examples' command lines: `--help` and `--version` everywhere, bad input answered by
//! one `error:` line (never a panic or a backtrace, even with `RUST_BACKTRACE=1`), a closed
//! pipe ending a tool quietly, headers printed before the first row and rows streamed as
//! they are measured, the same JSON field names in every tool, and valid JSON from `info`.
//!
//! The paths without a GPU run everywhere: `GDSYNC_CUDA=off` hides CUDA from the examples.
//! Tests of the paths with a GPU are ignored unless asked for (`--include-ignored`).

mod common;

use common::output::GuardedOutput;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};

/// The measuring programs (package `gdasync-examples`).
const TOOLS: [&str; 10] = [
    "pingpong",
    "bandwidth",
    "stencil2d",
    "info",
    "launch_probe",
    "memop_cost",
    "stream_echo",
    "mp_mpi",
    "soak",
    "link_churn",
];

/// Example `name` as a command that sees no GPU and would print backtraces if it panicked.
fn tool(name: &str) -> Command {
    let exe = common::example(name).unwrap_or_else(|| {
        panic!("the {name} program is not built (cargo build --release --bins)")
    });
    let mut c = Command::new(exe);
    c.env("GDSYNC_CUDA", "off")
        .env("RUST_BACKTRACE", "1")
        .env_remove("GDSYNC_LOG");
    c
}

fn output(name: &str, args: &[&str]) -> Output {
    tool(name).args(args).guarded_output()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that `name args` fails with an error that says `says`, without a panic or a
/// backtrace. Errors of the tools themselves are one line; clap's argument errors add its
/// usage hint after their first line.
fn refused(name: &str, args: &[&str], says: &str) {
    let out = output(name, args);
    let err = text(&out.stderr);
    let what = format!("{name} {}", args.join(" "));
    assert!(!out.status.success(), "{what} must fail:\n{err}");
    assert_ne!(out.status.code(), Some(101), "{what} panicked:\n{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{what}:\n{err}"
    );
    let first = err.lines().next().unwrap_or("");
    assert!(first.starts_with("error: "), "{what}: {err}");
    assert!(first.contains(says), "{what}: want {says:?} in\n{err}");
    if out.status.code() == Some(1) {
        assert_eq!(err.lines().count(), 1, "{what}: more than one line:\n{err}");
    }
    assert!(out.stdout.is_empty() || !text(&out.stdout).contains("panicked"));
}

#[test]
fn every_tool_has_help_and_version() {
    for name in TOOLS {
        let help = output(name, &["--help"]);
        assert!(
            help.status.success(),
            "{name} --help: {}",
            text(&help.stderr)
        );
        let h = text(&help.stdout);
        assert!(
            h.contains("Usage:") && h.contains("--version"),
            "{name}:\n{h}"
        );
        let v = output(name, &["--version"]);
        assert!(v.status.success(), "{name} --version");
        assert_eq!(
            text(&v.stdout).trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION")),
            "{name} --version"
        );
    }
}

#[test]
fn iteration_counts_that_cannot_work_are_refused() {
    let huge = "18446744073709551615";
    refused("pingpong", &["--iters", huge], "--iters");
    refused("stencil2d", &["--iters", huge, "--n", "16"], "--iters");
    refused("bandwidth", &["--iters", huge], "--iters");
    refused("stencil2d", &["--warmup", huge], "--warmup");
    refused("pingpong", &["--iters", "0", "--size", "8"], "--iters");
    refused("bandwidth", &["--iters", "0"], "--iters");
    refused("stencil2d", &["--iters", "0"], "--iters");
    refused("stencil2d", &["--timeout", "0"], "--timeout");
}

#[test]
fn bad_pingpong_arguments_are_clean_errors() {
    for (args, says) in [
        (&["--op", "write", "--size", "0"][..], "at least 1"),
        (&["--ranks", "procs"][..], "--ranks-as procs"),
        (&["--ranks", "3"][..], "2 ranks"),
        (&["--ranks-as", "mpi"][..], "invalid value"),
        (
            &["--ranks-as", "procs", "--shared-device"][..],
            "--shared-device",
        ),
        (&["--raw", "--shared-device"][..], "--shared-device"),
        (&["--size", "8", "--sizes", "16"][..], "cannot be used with"),
        (&["--sizes", "4X"][..], "not a size"),
        (&["--size", "2G"][..], "at most 1 GiB"),
        (&["--api", "mp", "--op", "write-imm"][..], "does not apply"),
        (
            &["--api", "mp", "--op", "write"][..],
            "runs with --trigger stream or kernel, --mem host",
        ),
        (&["--api", "mp", "--raw"][..], "--raw"),
        (&["--api", "mp", "--ranks-as", "procs"][..], "threads"),
        (
            &["--trigger", "stream", "--ranks-as", "procs"][..],
            "--ranks-as procs applies to --trigger cpu",
        ),
        (&["--raw", "--op", "send"][..], "does not apply"),
        (&["--raw", "--vs-raw"][..], "give one of them"),
        (&["--relay"][..], "--relay puts a CPU thread"),
        (
            &["--raw", "--relay", "--trigger", "host"][..],
            "--relay puts a CPU thread",
        ),
        (
            &["--raw", "--relay", "--trigger", "stream", "--explain"][..],
            "--relay puts a CPU thread",
        ),
        (
            &["--raw", "--relay", "--trigger", "kernel", "--mem", "device"][..],
            "--relay puts a CPU thread",
        ),
        (&["--vs-raw", "--trigger", "stream"][..], "--vs-raw applies"),
        (&["--vs-raw", "--duration", "1"][..], "use --iters"),
        (
            &["--vs-raw", "--op", "send", "--size", "0"][..],
            "at least 1",
        ),
        (&["--recv-batch", "4"][..], "--recv-batch applies"),
        (&["--api", "mp", "--recv-batch", "65"][..], "--recv-batch"),
        (&["--host-stream"][..], "--host-stream applies"),
        (&["--stage-bounce", "4096"][..], "--stage-bounce applies"),
        (&["--proto", "ll"][..], "--proto applies"),
        (
            &["--api", "mp", "--stage-bounce", "0"][..],
            "--stage-bounce",
        ),
        (
            &["--duration", "1", "--iters", "5"][..],
            "cannot be used with",
        ),
        (&["--duration", "0"][..], "more than 0"),
        (
            &["--trigger", "stream", "--duration", "1"][..],
            "--duration applies",
        ),
        (&["--mem", "device"][..], "--mem"),
        (
            &["--raw", "--device", "soft"][..],
            "--device does not apply",
        ),
        (
            &["--device", "mlx5_0", "--shared-device"][..],
            "--shared-device applies to the soft device",
        ),
        (&["--device", "mlx5 0"][..], "not a device name"),
        (&["-d", "mlx5_0:0"][..], "not a port number"),
        (&["--ringers", "mixed"][..], "--ringers applies"),
        (
            &["--trigger", "stream", "--raw", "--ringers", "mixed"][..],
            "--ringers applies",
        ),
        (&["--explain", "--api", "mp"][..], "--explain prints"),
        (&["--explain", "--trigger", "host"][..], "--explain prints"),
        (&["--staging", "on"][..], "--staging applies"),
        (
            &[
                "--trigger",
                "stream",
                "--mem",
                "device",
                "--raw",
                "--staging",
                "off",
            ][..],
            "--staging applies",
        ),
        (
            &[
                "--api",
                "mp",
                "--trigger",
                "kernel",
                "--mem",
                "device",
                "--stage-bounce",
                "4096",
            ][..],
            "--stage-bounce applies",
        ),
        (&["--staging", "sometimes"][..], "invalid value"),
        (&["--op", "read"][..], "--op read"),
        (
            &["--op", "read", "--trigger", "stream", "--raw"][..],
            "--op read",
        ),
        (
            &["--api", "mp", "--op", "read", "--trigger", "host"][..],
            "--op read",
        ),
        (
            &["--explain", "--op", "read", "--trigger", "stream"][..],
            "--explain prints",
        ),
    ] {
        refused("pingpong", args, says);
    }
}

/// The stream loop of `pingpong --trigger stream` runs to the end on a host stream (no GPU)
/// for every op, its `--raw` floor (direct, and relayed by CPU threads: the row says which),
/// `--ringers mixed` and `--api mp`: each list begins with its wait, rank 0 has one list more
/// (the last answer's wait), and rank 1's queues outlive its stream until rank 0 has seen its
/// last message.
#[test]
fn pingpong_stream_loop_runs_on_a_host_stream() {
    for extra in [
        &["--op", "write"][..],
        &["--op", "write-imm"],
        &["--op", "send"],
        &["--raw"],
        &["--raw", "--relay"],
        &["--ringers", "mixed"],
        &["--api", "mp", "--op", "send"],
    ] {
        let mut args = vec!["--trigger", "stream", "--host-stream", "--size", "8"];
        args.extend(["--iters", "300", "--warmup", "20", "--json"]);
        args.extend(extra);
        let out = output("pingpong", &args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{args:?}: {stderr}");
        let row = stdout.lines().find(|l| l.contains("\"t_p50_us\""));
        assert!(
            row.is_some_and(|r| r.contains("\"iters\":300")),
            "{args:?}:\n{stdout}"
        );
        // The row says whether CPU threads carried the markers.
        let relayed = extra.contains(&"--relay");
        assert!(
            row.is_some_and(|r| r.contains(&format!("\"relay\":{relayed}"))),
            "{args:?}:\n{stdout}"
        );
    }
}

/// `pingpong --op read` on a host stream (no GPU), gdsync's reads and `mp`'s gets: every read
/// completes, rank 0's buffer ends with the word rank 1's holds (the run checks it and fails
/// otherwise), and the rows say a sample is a whole read.
#[test]
fn pingpong_reads_run_on_a_host_stream() {
    for api in ["gdsync", "mp"] {
        let mut args = vec!["--api", api, "--op", "read", "--trigger", "stream"];
        args.extend(["--host-stream", "--sizes", "4,8,4100", "--iters", "300"]);
        args.extend(["--warmup", "20", "--json"]);
        let out = output("pingpong", &args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{args:?}: {stderr}");
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|l| l.contains("\"t_p50_us\""))
            .collect();
        assert_eq!(rows.len(), 3, "{args:?}:\n{stdout}");
        for r in rows {
            assert!(
                r.contains("\"iters\":300") && r.contains("\"op\":\"read\""),
                "{r}"
            );
            assert!(r.contains("\"sample\":\"read\""), "{r}");
        }
    }
}

/// `bandwidth --mem device` stages its writes through a ring of bounces per rank, pipelined
/// over chunks, on the cpu and stream triggers without a GPU (`--host-stream`: pinned host
/// memory stands in for the GPU's, CPU threads run the copies): byte for byte (`--check`
/// compares the receiver's buffer with the sender's after each size) at 1 B, a chunk - 1, a
/// chunk, a chunk + 1 and 5.5 chunks, with 2 and 3 bounces. Rank 1 pauses before each copy
/// in (`--slow-copy-in`), so a sender that reused a bounce before its credit came back
/// would overwrite a chunk not yet copied and fail the check.
#[test]
fn bandwidth_staged_pipeline_is_byte_exact_on_host_stand_ins() {
    for trigger in ["cpu", "stream"] {
        for bounces in ["2", "3"] {
            let args = [
                "--trigger",
                trigger,
                "--host-stream",
                "--mem",
                "device",
                "--chunk",
                "1K",
                "--bounces",
                bounces,
                "--sizes",
                "1,1023,1024,1025,5632",
                "--iters",
                "4",
                "--warmup",
                "1",
                "--check",
                "--slow-copy-in",
                "0.0002",
            ];
            let rows = json_lines("bandwidth", &args);
            assert_eq!(rows.len(), 5, "{args:?}: {rows:?}");
            for r in &rows {
                let path = common::json_field(r, "gpu_memory");
                assert!(path.starts_with("staged"), "{args:?}: {r}");
                assert_eq!(common::json_field(r, "chunk"), "1024", "{r}");
                assert_eq!(common::json_field(r, "bounces"), bounces, "{r}");
                assert_eq!(common::json_field(r, "iters"), "4", "{r}");
            }
        }
    }
}

/// The staged stream loop of `pingpong --mem device` runs on a host stream (no GPU; pinned
/// host memory stands in for the GPU's, the CPU runs the copies) for every op, at a size
/// within a page and one past 64 KiB: each message is copied out of the payload into the send
/// bounce before its commit and into the receiver's payload after its wait (the tool checks
/// that the last marker landed there), and the JSON says the path is staged.
#[test]
fn pingpong_staged_stream_loop_runs_on_a_host_stream() {
    for op in ["write", "write-imm", "send"] {
        let mut args = vec!["--trigger", "stream", "--host-stream", "--mem", "device"];
        args.extend([
            "--op", op, "--sizes", "8,65540", "--iters", "100", "--warmup", "10",
        ]);
        args.push("--json");
        two_staged_rows(&args);
    }
    refused(
        "pingpong",
        &[
            "--trigger",
            "stream",
            "--host-stream",
            "--mem",
            "device",
            "--staging",
            "off",
        ],
        "runs staged only",
    );
}

/// `pingpong --api mp --op write` puts each message into the peer's window on a stream (a
/// host stream here: no GPU) and waits for the answer's marker in its receive buffer: it runs
/// at two sizes (the tool checks that the last marker landed in each rank's buffer) and the
/// JSON names the op and the API. Elsewhere (the CPU-driven loop, GPU memory) it is refused
/// (a kernel's puts run on the GPU machine: `gpu_mp`).
#[test]
fn pingpong_mp_puts_on_a_host_stream() {
    let args = [
        "--api",
        "mp",
        "--op",
        "write",
        "--trigger",
        "stream",
        "--host-stream",
        "--sizes",
        "8,4096",
        "--iters",
        "200",
        "--warmup",
        "10",
        "--json",
    ];
    for r in pingpong_rows(&args, 2) {
        assert!(
            r.contains("\"op\":\"write\"") && r.contains("\"api\":\"mp\""),
            "{r}"
        );
    }
    for (trigger, mem) in [("host", "host"), ("stream", "device"), ("kernel", "device")] {
        refused(
            "pingpong",
            &[
                "--api",
                "mp",
                "--op",
                "write",
                "--trigger",
                trigger,
                "--mem",
                mem,
            ],
            "runs with --trigger stream or kernel, --mem host",
        );
    }
}

/// `pingpong --api mp --mem device` stages through mp's bounce pool on a host stream (no GPU;
/// pinned host memory stands in for the GPU's): at a size within a page and one past mp's
/// default 64 KiB bounce, every message is copied out before its doorbell and in after its
/// wait (the tool checks that the last marker landed in each rank's stand-in), and the JSON
/// says the path is staged.
#[test]
fn pingpong_mp_staged_stream_loop_runs_on_a_host_stream() {
    let mut args = vec!["--api", "mp", "--op", "send", "--trigger", "stream"];
    args.extend(["--host-stream", "--mem", "device", "--staging", "on"]);
    args.extend([
        "--sizes", "8,65540", "--iters", "100", "--warmup", "10", "--json",
    ]);
    two_staged_rows(&args);
}

/// The same with `--stage-bounce 16384`: the 65,540-byte messages go in five chunks (four
/// bounces and 4 bytes), all on the host stream (copies out before the doorbells, the waits
/// and copies in after them), and the last marker lands.
#[test]
fn pingpong_mp_chunked_staged_stream_loop_runs_on_a_host_stream() {
    let mut args = vec!["--api", "mp", "--op", "send", "--trigger", "stream"];
    args.extend(["--host-stream", "--mem", "device", "--staging", "on"]);
    args.extend(["--sizes", "8,65540", "--iters", "100", "--warmup", "10"]);
    args.extend(["--json", "--stage-bounce", "16384"]);
    two_staged_rows(&args);
}

/// Runs `pingpong args` (two sizes, 100 iterations, JSON): it succeeds with two rows of 100
/// iterations whose GPU memory path is staged.
fn two_staged_rows(args: &[&str]) {
    for r in pingpong_rows(args, 2) {
        assert!(r.contains("\"iters\":100"), "{args:?}: {r}");
        let path = common::json_field(&r, "gpu_memory");
        assert!(path.starts_with("staged"), "{args:?}: {r}");
    }
}

/// Runs `pingpong args` (with `--json`): it succeeds with `n` result rows, returned.
fn pingpong_rows(args: &[&str], n: usize) -> Vec<String> {
    let out = output("pingpong", args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stderr}");
    let rows: Vec<String> = stdout
        .lines()
        .filter(|l| l.contains("\"t_p50_us\""))
        .map(str::to_owned)
        .collect();
    assert_eq!(rows.len(), n, "{args:?}:\n{stdout}");
    rows
}

/// `pingpong --explain` prints the lists the GPU loops build, without a GPU: a stream's
/// commits store "rung to" after the doorbell only with `--ringers mixed`, and a kernel's
/// send then ends with a release store; the `--raw` floor writes the marker to the peer.
#[test]
fn pingpong_explain_prints_the_gpu_loops_lists() {
    let lines = |args: &[&str]| -> String {
        let out = output("pingpong", args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let all = lines(&["--explain", "--size", "8"]);
    for want in [
        "== --trigger stream --op write --raw",
        "== --trigger kernel --op send",
        "    shape: wait w32 w64\n",
        "    shape: wait w32 w32 db w64\n",
        "    shape: wait w32 w32 db w64 wait w32 w64\n",
        "fence.sys; st dbrec; fence.sys; st doorbell\n",
        "send wait",
    ] {
        assert!(all.contains(want), "want {want:?} in\n{all}");
    }
    assert!(!all.contains("rung-to"), "{all}");
    let mixed = lines(&[
        "--explain",
        "--size",
        "8",
        "--trigger",
        "stream",
        "--ringers",
        "mixed",
    ]);
    assert!(
        mixed.contains("    shape: wait w32 w32 db w64 w64\n"),
        "{mixed}"
    );
    let kernel = lines(&[
        "--explain",
        "--size",
        "8",
        "--trigger",
        "kernel",
        "--ringers",
        "mixed",
    ]);
    assert!(
        kernel.contains("st doorbell; st.release.sys rung-to\n"),
        "{kernel}"
    );
}

#[test]
fn bad_bandwidth_and_stencil_arguments_are_clean_errors() {
    for (args, says) in [
        (&["--sizes", "0"][..], "at least 1"),
        (&["--size", "2G"][..], "at most 1 GiB"),
        (&["--trigger", "host"][..], "invalid value"),
        (
            &["--trigger", "kernel", "--duration", "1"][..],
            "--duration applies",
        ),
        (&["--window", "0"][..], "--window"),
        (&["--host-stream"][..], "--host-stream"),
        (
            &["--staging", "on"][..],
            "--staging applies to --mem device",
        ),
        (
            &["--chunk", "1K"][..],
            "--chunk, --bounces and --check apply",
        ),
        (&["--check"][..], "--chunk, --bounces and --check apply"),
    ] {
        refused("bandwidth", args, says);
    }
    // Staged GPU payloads (host memory standing in for the GPU's): what is not staged, and
    // the pipeline's bounds.
    for (args, says) in [
        (&["--staging", "off"][..], "runs staged only"),
        (&["--op", "read"][..], "staging covers --op write"),
        (&["--op", "send"][..], "staging covers --op write"),
        (
            &["--trigger", "kernel"][..],
            "the kernel trigger needs a GPU",
        ),
        (&["--bounces", "1"][..], "--bounces must be 2 to 64"),
        (&["--chunk", "128M"][..], "--chunk must be 1 to"),
        (&["--duration", "1"][..], "--duration does not apply"),
    ] {
        let mut all = vec!["--host-stream", "--mem", "device"];
        all.extend_from_slice(args);
        refused("bandwidth", &all, says);
    }
    for (args, says) in [
        (&["--halo", "host"][..], "--halo applies"),
        (&["--overlap", "on"][..], "--overlap applies"),
        (
            &["--trigger", "kernel", "--overlap", "off"][..],
            "--overlap applies",
        ),
        (&["--trace"][..], "--trace applies"),
        (&["--corrupt"][..], "--check"),
        (&["--ranks", "0"][..], "--ranks"),
        (&["--ranks", "200"][..], "at most 181 ranks"),
        (&["--ranks", "100000"][..], "at most 4096"),
    ] {
        refused("stencil2d", args, says);
    }
    refused("launch_probe", &["sideways"], "invalid value");
}

/// `--gpus` is one flag in every tool: a list of distinct GPU ordinals, refused where no GPU
/// is used, and reported (`gpus`, `null` without a GPU) in every tool's JSON.
#[test]
fn the_gpus_flag_is_checked_and_reported_alike_in_every_tool() {
    for name in ["pingpong", "bandwidth", "stencil2d"] {
        refused(name, &["--gpus", "x"], "not a GPU number");
        refused(name, &["--gpus", "0,,1"], "not a GPU number");
        refused(name, &["--gpus=-1"], "not a GPU number");
        refused(name, &["--gpus", "1,0,1"], "GPU 1 is listed twice");
        refused(name, &["--gpus", "0"], "--gpus applies");
        let out = output(name, &["--gpus", "0"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
    }
    refused(
        "stencil2d",
        &["--trigger", "stream", "--gpus", "0,1"],
        "needs a CUDA GPU",
    );
    refused("stencil2d", &["--shared-device"], "--shared-device applies");
    refused(
        "stencil2d",
        &[
            "--trigger",
            "host",
            "--ranks-as",
            "procs",
            "--shared-device",
        ],
        "--shared-device applies",
    );
    refused(
        "pingpong",
        &["--trigger", "kernel", "--gpus", "1"],
        "needs a CUDA GPU",
    );
    refused(
        "bandwidth",
        &["--mem", "device", "--gpus", "0"],
        "needs a CUDA GPU",
    );
    let pp = json_lines("pingpong", &["--sizes", "8", "--iters", "50"]);
    let bw = json_lines("bandwidth", &["--sizes", "64", "--iters", "50"]);
    let st = json_lines("stencil2d", &["--n", "16", "--iters", "2"]);
    for line in pp.iter().chain(&bw).chain(&st) {
        assert_eq!(gpus_field(line), "null", "{line}");
    }
}

/// One convention for exit statuses, clap's: 2 when the command line is wrong (clap's own
/// errors, flags that do not go together, values out of range), 1 when the run fails (a GPU
/// or a device that is not there).
#[test]
fn usage_errors_exit_2_and_failed_runs_1() {
    for (name, args) in [
        ("pingpong", &["--no-such-flag"][..]),
        ("pingpong", &["--ranks", "3"][..]),
        ("pingpong", &["--raw", "--shared-device"][..]),
        ("pingpong", &["--sizes", "0", "--op", "write"][..]),
        ("bandwidth", &["--window", "0"][..]),
        ("stencil2d", &["--corrupt"][..]),
        ("stencil2d", &["--ranks", "0"][..]),
    ] {
        let out = output(name, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
    }
    for (name, args) in [
        ("pingpong", &["--trigger", "stream"][..]),
        ("bandwidth", &["--device", "mlx5_7"][..]),
        ("stencil2d", &["--device", "nonsense"][..]),
    ] {
        let out = output(name, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {err}");
    }
}

/// A device that is not here is one line, before any output, naming the devices that are
/// (`soft` among them).
#[test]
fn a_device_that_is_not_here_names_the_devices_that_are() {
    for name in ["pingpong", "bandwidth", "stencil2d"] {
        let out = output(name, &["--device", "nonsense", "--iters", "5"]);
        let err = text(&out.stderr);
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
        assert!(
            err.starts_with("error: device nonsense: ") && err.contains("soft"),
            "{name}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
    }
}

#[test]
fn gpu_paths_without_a_gpu_are_clean_errors() {
    for api in ["gdsync", "mp"] {
        for trigger in ["host", "stream", "kernel"] {
            let args = [
                "--api",
                api,
                "--trigger",
                trigger,
                "--size",
                "8",
                "--iters",
                "10",
            ];
            refused("pingpong", &args, "needs a CUDA GPU");
        }
    }
    refused(
        "pingpong",
        &["--mem", "device", "--trigger", "kernel"],
        "needs a CUDA GPU",
    );
    for trigger in ["stream", "kernel"] {
        refused("bandwidth", &["--trigger", trigger], "needs a CUDA GPU");
    }
    refused("bandwidth", &["--mem", "device"], "needs a CUDA GPU");
    for trigger in ["host", "stream", "kernel"] {
        refused("stencil2d", &["--trigger", trigger], "needs a CUDA GPU");
    }
    refused("launch_probe", &["local-big"], "needs a CUDA GPU");
    refused("memop_cost", &[], "needs a CUDA GPU");
    refused("stream_echo", &[], "needs a CUDA GPU");
}

/// Checks in a child process that sees no CUDA (`GDSYNC_CUDA=off`) that CUDA calls return
/// `NoCuda`; on any machine, with a GPU or without.
#[test]
fn cuda_calls_without_a_gpu_return_errors() {
    use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer};
    use gdasync::gdsync::Error;
    if std::env::var("GDSYNC_CUDA").as_deref() == Ok("off") {
        assert!(matches!(CudaStream::new(0), Err(Error::NoCuda(_))));
        assert!(matches!(DeviceBuffer::alloc(0, 64), Err(Error::NoCuda(_))));
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cuda_calls_without_a_gpu_return_errors"])
        .args(["--nocapture", "--test-threads=1"])
        .env("GDSYNC_CUDA", "off")
        .guarded_output();
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success() && all.contains("1 passed"), "{all}");
}

#[test]
fn a_closed_pipe_ends_a_tool_quietly() {
    for (name, args) in [
        (
            "bandwidth",
            &["--sizes", "1,2,4,8,16,32,64", "--iters", "200"][..],
        ),
        ("pingpong", &["--sizes", "8,16,32,64", "--iters", "200"][..]),
    ] {
        let mut child = tool(name)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // The reader is gone (dropped with the line read): the next row hits a closed pipe.
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(first.starts_with("# "), "{name}: {first}");
        assert!(err.is_empty(), "{name} | head -1 printed:\n{err}");
        assert_ne!(status.code(), Some(101), "{name} panicked");
    }
}

/// Reads `cmd`'s stdout line by line: the header arrives while the run goes on, and each row
/// before the run ends (each size lasts `--duration 1`, so the tool is still running when a
/// streamed line arrives).
fn header_then_streamed_rows(name: &str, args: &[&str], header_says: &[&str]) {
    let mut child = tool(name)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert!(
        child.try_wait().unwrap().is_none(),
        "{name}: the header came only after the run ended"
    );
    for word in header_says {
        assert!(
            header.contains(word),
            "{name} header lacks {word}: {header}"
        );
    }
    let first_row = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .expect("a row");
    assert!(
        child.try_wait().unwrap().is_none(),
        "{name}: the first row came only after the run ended: {first_row}"
    );
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success(), "{name} failed");
    assert_eq!(rest.len(), 1, "{name}: one more row: {rest:?}");
}

#[test]
fn pingpong_prints_its_header_first_and_streams_rows() {
    let fields = [
        "device soft",
        "link",
        "trigger cpu",
        "mem host",
        "ranks 2",
        "cores",
    ];
    let args = ["--sizes", "8,64", "--duration", "1"];
    header_then_streamed_rows("pingpong", &args, &fields);
    let procs = ["--ranks-as", "procs", "--sizes", "8,64", "--duration", "1"];
    header_then_streamed_rows(
        "pingpong",
        &procs,
        &["link shared memory", "ranks_as procs"],
    );
}

#[test]
fn bandwidth_prints_its_header_first_and_streams_rows() {
    let args = ["--sizes", "64,128", "--duration", "1"];
    header_then_streamed_rows(
        "bandwidth",
        &args,
        &["device soft", "link in-process", "cores"],
    );
}

/// The `--json` lines of a successful run, each checked to be one valid JSON object.
fn json_lines(name: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = output(name, &all);
    assert!(
        out.status.success(),
        "{name} {all:?}: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    for line in stdout.lines() {
        json::check(line).unwrap_or_else(|e| panic!("{name}: {e} in {line}"));
        assert!(line.starts_with('{'), "{name}: not an object: {line}");
    }
    stdout.lines().map(String::from).collect()
}

#[test]
fn vs_raw_measures_the_floor_in_the_same_run() {
    for ranks_as in ["threads", "procs"] {
        let rows = json_lines(
            "pingpong",
            &[
                "--vs-raw",
                "--ranks-as",
                ranks_as,
                "--sizes",
                "8,64",
                "--iters",
                "1200",
            ],
        );
        assert_eq!(rows.len(), 2, "{rows:?}");
        for row in &rows {
            let num = |k: &str| -> f64 {
                common::json_field(row, k)
                    .parse()
                    .unwrap_or_else(|_| panic!("{k} in {row}"))
            };
            assert_eq!(common::json_field(row, "vs_raw"), "true", "{row}");
            assert_eq!(num("iters"), 1200.0, "{row}");
            let (p50, raw) = (num("t_p50_us"), num("raw_p50_us"));
            assert!(raw > 0.0 && raw <= num("raw_p99_us"), "{row}");
            // (The times are printed to 1 ns, the ratio to 0.01, from the unrounded times.)
            let ratio = p50 / raw;
            let slack = 0.006 + ratio * (0.0006 / raw + 0.0006 / p50);
            assert!((num("p50_over_raw") - ratio).abs() <= slack, "{row}");
        }
    }
}

#[test]
fn json_rows_use_the_same_names_in_every_tool() {
    let pp = json_lines("pingpong", &["--sizes", "8,64", "--iters", "100"]);
    let bw = json_lines("bandwidth", &["--sizes", "64", "--iters", "100"]);
    let st = json_lines("stencil2d", &["--n", "16", "--iters", "2"]);
    assert_eq!((pp.len(), bw.len(), st.len()), (2, 1, 1));
    for line in pp.iter().chain(&bw).chain(&st) {
        assert!(
            line.contains("\"ranks\":") && line.contains("\"ranks_as\":"),
            "{line}"
        );
        assert!(
            !line.contains("\"gbps\"") && !line.contains("\"size\""),
            "{line}"
        );
    }
    for line in pp.iter().chain(&bw) {
        assert!(
            line.contains("\"bytes\":") && line.contains("\"cores\":"),
            "{line}"
        );
    }
    for key in [
        "t_min_us",
        "t_max_us",
        "t_p50_us",
        "t_avg_us",
        "t_stdev_us",
        "t_p99_us",
        "t_p999_us",
    ] {
        assert!(pp[0].contains(&format!("\"{key}\":")), "{key}: {}", pp[0]);
    }
    let f = |line: &str, key: &str| common::json_field(line, key).parse::<f64>().unwrap();
    let (gb, gbit) = (f(&bw[0], "gbytes_per_s"), f(&bw[0], "gbits_per_s"));
    assert!(gb > 0.0 && (gbit / gb - 8.0).abs() < 1e-3, "{}", bw[0]);
    assert!(f(&bw[0], "mmsg_per_s") > 0.0, "{}", bw[0]);
}

#[test]
fn api_mp_picks_its_operation() {
    let rows = json_lines(
        "pingpong",
        &["--api", "mp", "--size", "64", "--iters", "100"],
    );
    assert_eq!(common::json_field(&rows[0], "op"), "send", "{}", rows[0]);
    assert_eq!(common::json_field(&rows[0], "api"), "mp", "{}", rows[0]);
    // A soft device per thread rank, as --api gdsync, unless asked to share one.
    assert_eq!(
        common::json_field(&rows[0], "link"),
        "in-process",
        "{}",
        rows[0]
    );
    let shared = json_lines(
        "pingpong",
        &[
            "--api",
            "mp",
            "--shared-device",
            "--size",
            "64",
            "--iters",
            "100",
        ],
    );
    assert_eq!(
        common::json_field(&shared[0], "link"),
        "loopback",
        "{}",
        shared[0]
    );
}

#[test]
fn logging_goes_to_stderr_filtered_by_gdsync_log() {
    let out = tool("pingpong")
        .args(["--size", "8", "--iters", "10", "--json"])
        .env("GDSYNC_LOG", "debug")
        .guarded_output();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(stderr.contains("DEBUG"), "no debug events:\n{stderr}");
    assert_eq!(stdout.lines().count(), 1, "logs on stdout:\n{stdout}");
    json::check(stdout.trim()).unwrap();
    let quiet = output("pingpong", &["--size", "8", "--iters", "10", "--json"]);
    assert!(
        !text(&quiet.stderr).contains("DEBUG"),
        "{}",
        text(&quiet.stderr)
    );
    let bad = tool("pingpong")
        .args(["--size", "8", "--iters", "10"])
        .env("GDSYNC_LOG", "gdsync=loudest")
        .guarded_output();
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).starts_with("error: GDSYNC_LOG="),
        "{}",
        text(&bad.stderr)
    );
}

/// `info` says how GPU payloads reach the soft device (staged: its engine cannot DMA GPU
/// memory), and follows `GDSYNC_STAGING`.
#[test]
fn info_reports_the_gpu_memory_path() {
    let out = output("info", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.contains("GPU memory path (soft device): Staged (auto: "),
        "{t}"
    );
    let j = &json_lines("info", &[])[0];
    assert!(
        j.contains("\"gpu_memory\":{\"soft\":{\"path\":\"Staged\""),
        "{j}"
    );
    let bad = tool("info")
        .env("GDSYNC_STAGING", "sometimes")
        .guarded_output();
    let t = text(&bad.stdout) + &text(&bad.stderr);
    assert!(
        t.contains("GDSYNC_STAGING=\"sometimes\": expected auto, on or off"),
        "{t}"
    );
}

#[test]
fn info_lists_the_soft_device_with_its_limits() {
    let out = output("info", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for key in [
        "hca_id: soft",
        "max_qp:",
        "max_qp_wr:",
        "max_sge:",
        "max_inline_data:",
        "max_msg_sz:",
        "active_mtu:",
        "PORT_ACTIVE",
        "link_layer:",
    ] {
        assert!(t.contains(key), "info lacks {key}:\n{t}");
    }
    assert!(
        !t.contains("NIC handler"),
        "no GPU, yet a NIC handler:\n{t}"
    );
    let json = json_lines("info", &[]);
    assert_eq!(json.len(), 1);
    let j = &json[0];
    assert!(j.contains("\"devices\":[{\"name\":\"soft\""), "{j}");
    assert!(
        j.contains("\"max_qp\":65536") && j.contains("\"nic_handler\":null"),
        "{j}"
    );
}

/// `info --json` under the emulated RDMA driver: `spec`'s devices as rdma-core shows them.
fn info_json_under_emulated_hca(spec: &str) -> String {
    let emu = common::emulator(spec);
    let out = tool_under(&emu, false, "info")
        .arg("--json")
        .guarded_output();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j = text(&out.stdout);
    json::check(j.trim()).unwrap_or_else(|e| panic!("{e} in {j}"));
    j
}

/// Example `name` as a command under the emulated RDMA driver `emu` (seeing the GPUs where
/// `gpu`).
fn tool_under(emu: &uverbs_emu::Emulator, gpu: bool, name: &str) -> Command {
    let mut c = tool(name);
    if gpu {
        c.env_remove("GDSYNC_CUDA");
    }
    c.envs(emu.env());
    c
}

/// `name args` under the emulated RDMA driver with `spec`'s devices: its output.
/// The `gpus` field of a JSON row: its string (`0,1`), or `null`.
fn gpus_field(line: &str) -> String {
    let at = line
        .find("\"gpus\":")
        .unwrap_or_else(|| panic!("no gpus in {line}"))
        + 7;
    let rest = &line[at..];
    match rest.strip_prefix('"') {
        Some(s) => s[..s.find('"').unwrap()].to_string(),
        None => rest[..rest.find([',', '}']).unwrap()].to_string(),
    }
}

/// Example `name` seeing the machine's GPUs.
fn gpu_tool(name: &str) -> Command {
    let mut c = tool(name);
    c.env_remove("GDSYNC_CUDA");
    c
}

/// `name --json args` with the GPUs: its rows (the run must succeed).
fn gpu_json(name: &str, args: &[&str]) -> Vec<String> {
    let out = gpu_tool(name).arg("--json").args(args).guarded_output();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{name} {args:?}: {err}");
    let rows: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    for r in &rows {
        json::check(r).unwrap_or_else(|e| panic!("{name}: {e} in {r}"));
    }
    rows
}

/// Ranks go round robin over the machine's GPUs unless `--gpus` says otherwise, every tool
/// reports where, and what crosses GPUs works: with two GPUs rank 0 and rank 1 run on
/// different ones (memory registered on one, streams and kernels on the other, the soft
/// device's copies through each region's own GPU), and stencil2d's result stays bit-exact.
#[test]
#[ignore = "needs a CUDA GPU (two for the placement across GPUs): GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored gpus"]
fn ranks_are_placed_round_robin_over_the_gpus() {
    let n = gdasync::gdsync::cuda::Cuda::get()
        .map(|c| c.gpus.len())
        .unwrap_or(0);
    assert!(n > 0, "no CUDA GPU");
    let rr = |ranks: usize| -> String {
        let v: Vec<String> = (0..ranks).map(|r| (r % n).to_string()).collect();
        v.join(",")
    };
    for trigger in ["host", "stream", "kernel"] {
        for halo in ["host", "device"] {
            let args = [
                "--trigger",
                trigger,
                "--halo",
                halo,
                "--ranks",
                "4",
                "--n",
                "64",
            ];
            let st = gpu_json(
                "stencil2d",
                &[&args[..], &["--iters", "20", "--check"]].concat(),
            );
            assert_eq!(gpus_field(&st[0]), rr(4), "{}", st[0]);
            assert_eq!(common::json_field(&st[0], "mismatches"), "0", "{}", st[0]);
        }
        for mem in ["host", "device"] {
            let t = ["--trigger", trigger, "--mem", mem, "--sizes", "8,65536"];
            let pp = gpu_json("pingpong", &[&t[..], &["--iters", "300"]].concat());
            assert_eq!(gpus_field(&pp[0]), rr(2), "{}", pp[0]);
            let mp = [
                "--api",
                "mp",
                "--trigger",
                trigger,
                "--mem",
                mem,
                "--iters",
                "300",
            ];
            let pp = gpu_json("pingpong", &[&mp[..], &["--sizes", "8"]].concat());
            assert_eq!(gpus_field(&pp[0]), rr(2), "mp: {}", pp[0]);
            if trigger != "host" {
                let bw = gpu_json("bandwidth", &[&t[..], &["--iters", "300"]].concat());
                assert_eq!(gpus_field(&bw[0]), rr(2), "{}", bw[0]);
            }
        }
    }
    // Every rank on the last GPU, as asked.
    let last = (n - 1).to_string();
    let st = gpu_json(
        "stencil2d",
        &[
            "--trigger",
            "stream",
            "--ranks",
            "2",
            "--n",
            "32",
            "--iters",
            "5",
            "--gpus",
            &last,
        ],
    );
    assert_eq!(gpus_field(&st[0]), format!("{last},{last}"));
    // A GPU that is not here: one line, naming those that are.
    let out = gpu_tool("stencil2d")
        .args(["--trigger", "stream", "--gpus", &n.to_string()])
        .guarded_output();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("error: --gpus: no GPU {n} on this machine")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The soft device asked for by name where an mlx5 device is present is no warning: it was
/// asked for.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn a_soft_device_asked_for_is_no_warning() {
    let args = ["--device", "soft", "--sizes", "8", "--iters", "100"];
    let out = under_emulated_hca("mlx5_0", "pingpong", &args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("WARN"), "{err}");
}

fn under_emulated_hca(spec: &str, name: &str, args: &[&str]) -> Output {
    let emu = common::emulator(spec);
    tool_under(&emu, false, name).args(args).guarded_output()
}

/// The `--json` rows of `name args` run on `mlx5_0` of the emulated driver, each checked to
/// name the device.
fn json_rows_on_emulated_mlx5(name: &str, args: &[&str]) -> Vec<String> {
    json_rows_on_emulated_mlx5_with(false, name, args)
}

fn json_rows_on_emulated_mlx5_with(gpu: bool, name: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec!["--json", "--device", "mlx5_0"];
    all.extend_from_slice(args);
    // The devices' debug lines (links, connections, the peers' processes) come with any
    // failure; who rings the doorbell is logged at debug level too.
    let emu = common::emulator("mlx5_0");
    let out = tool_under(&emu, gpu, name)
        .env(
            "GDSYNC_LOG",
            "warn,gdsync::device=debug,gdsync::handler=debug",
        )
        .args(&all)
        .guarded_output();
    let what = format!("{name} {}", all.join(" "));
    assert!(out.status.success(), "{what}: {}", text(&out.stderr));
    let err = text(&out.stderr);
    // No warning or error event: its level is the line's first or second word, after the
    // time where there is one (a message may quote a CUDA error it recovered from).
    let event = |l: &str| (l.split_whitespace().take(2)).any(|w| w == "WARN" || w == "ERROR");
    assert!(!err.lines().any(event), "{what}:\n{err}");
    // Streams and kernels ring libmlx5's doorbell themselves: the emulated doorbell page is
    // RAM, which CUDA registers as such (no CPU proxy).
    let gpu_posts = args
        .windows(2)
        .any(|w| w[0] == "--trigger" && (w[1] == "stream" || w[1] == "kernel"));
    if gpu && gpu_posts {
        assert!(
            err.contains("NIC handler: the GPU rings the doorbell"),
            "{what}:\n{err}"
        );
    }
    let rows: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert!(!rows.is_empty(), "{what}: no rows");
    for r in &rows {
        json::check(r).unwrap_or_else(|e| panic!("{what}: {e} in {r}"));
        assert!(r.contains("\"device\":\"mlx5_0\""), "{what}: {r}");
    }
    rows
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn pingpong_runs_on_emulated_mlx5_threads_processes_and_mp() {
    for extra in [
        &["--ranks-as", "threads"][..],
        &["--ranks-as", "procs"][..],
        &["--ranks-as", "procs", "--op", "send"][..],
        &["--ranks-as", "procs", "--op", "write-imm"][..],
        &["--api", "mp"][..],
    ] {
        let mut args = vec!["--sizes", "8,4096", "--iters", "300"];
        args.extend_from_slice(extra);
        let rows = json_rows_on_emulated_mlx5("pingpong", &args);
        assert_eq!(rows.len(), 2, "{extra:?}: {rows:?}");
        for (row, bytes) in rows.iter().zip([8, 4096]) {
            assert!(row.contains(&format!("\"bytes\":{bytes},")), "{row}");
            assert!(
                row.contains("\"link\":\"RDMA (the HCA's loopback)\""),
                "{row}"
            );
            assert!(!row.contains("\"progress\""), "{row}");
        }
    }
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn bandwidth_runs_on_emulated_mlx5() {
    for op in ["write", "send", "read"] {
        let rows = json_rows_on_emulated_mlx5(
            "bandwidth",
            &["--op", op, "--sizes", "64,65536", "--iters", "500"],
        );
        assert_eq!(rows.len(), 2, "{op}: {rows:?}");
        assert!(rows[1].contains("\"bytes\":65536,"), "{}", rows[1]);
    }
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn stencil2d_runs_on_emulated_mlx5_checked_bit_exact() {
    for ranks_as in ["threads", "procs"] {
        let rows = json_rows_on_emulated_mlx5(
            "stencil2d",
            &[
                "--ranks",
                "4",
                "--ranks-as",
                ranks_as,
                "--n",
                "48",
                "--iters",
                "20",
                "--check",
            ],
        );
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert!(
            rows[0].contains("\"max_diff\":0e0"),
            "{ranks_as}: {}",
            rows[0]
        );
        assert!(rows[0].contains("\"progress\":null"), "{}", rows[0]);
    }
}

/// GPU triggers on libmlx5's QPs: streams and kernels ring libmlx5's doorbell record and
/// BlueFlame register themselves (the emulated doorbell page is RAM, registered for GPUs as
/// such), GPU memory is registered as dma-bufs that the emulated HCA moves through CUDA.
#[test]
#[ignore = "needs a CUDA GPU and rdma-core: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored"]
fn mlx5_gpu_triggers_on_the_emulated_driver() {
    let rows = |name: &str, args: &[&str]| json_rows_on_emulated_mlx5_with(true, name, args);
    for trigger in ["host", "stream", "kernel"] {
        for mem in ["host", "device"] {
            let t = ["--trigger", trigger, "--mem", mem];
            let pp = rows(
                "pingpong",
                &[&t[..], &["--sizes", "8,65536", "--iters", "500"]].concat(),
            );
            assert_eq!(pp.len(), 2, "{trigger} {mem}: {pp:?}");
            // bandwidth and mp's pingpong have no host trigger.
            if trigger != "host" {
                let bw = rows(
                    "bandwidth",
                    &[&t[..], &["--sizes", "65536", "--iters", "500"]].concat(),
                );
                assert_eq!(bw.len(), 1, "{trigger} {mem}: {bw:?}");
                let mp = rows(
                    "pingpong",
                    &[&t[..], &["--api", "mp", "--sizes", "8", "--iters", "300"]].concat(),
                );
                assert_eq!(mp.len(), 1, "mp {trigger} {mem}: {mp:?}");
            }
        }
        let st = rows(
            "stencil2d",
            &[
                "--trigger",
                trigger,
                "--ranks",
                "2",
                "--n",
                "128",
                "--iters",
                "20",
                "--check",
            ],
        );
        assert!(st[0].contains("\"max_diff\":0e0"), "{trigger}: {}", st[0]);
    }
    // The CPU proxy, asked for (as where a ConnectX's doorbell page cannot be mapped): it
    // rings libmlx5's doorbell for streams and kernels just as well.
    let emu = common::emulator("mlx5_0");
    for trigger in ["stream", "kernel"] {
        let out = tool_under(&emu, true, "pingpong")
            .env("GDSYNC_NIC_HANDLER", "cpu")
            .args(["--json", "--device", "mlx5_0", "--trigger", trigger])
            .args(["--sizes", "8,4096", "--iters", "300"])
            .guarded_output();
        let err = text(&out.stderr);
        assert!(out.status.success(), "proxy, {trigger}: {err}");
        assert!(
            err.contains("a CPU proxy thread rings the doorbell")
                && err.contains("set by GDSYNC_NIC_HANDLER"),
            "proxy, {trigger}: {err}"
        );
        let rows = text(&out.stdout);
        assert_eq!(rows.lines().count(), 2, "proxy, {trigger}: {rows}");
        for r in rows.lines() {
            json::check(r).unwrap_or_else(|e| panic!("proxy, {trigger}: {e} in {r}"));
            assert!(r.contains("\"device\":\"mlx5_0\""), "proxy, {trigger}: {r}");
        }
    }
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn a_named_mlx5_device_that_is_absent_is_one_line() {
    for name in ["pingpong", "bandwidth", "stencil2d"] {
        let out = under_emulated_hca("", name, &["--device", "mlx5_0", "--iters", "5"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.starts_with("error: device mlx5_0: "), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
    }
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn info_json_lists_the_emulated_mlx5_devices() {
    let j = info_json_under_emulated_hca("mlx5_0,mlx5_1:ib:roce");
    assert!(j.contains("\"rdma\":{\"status\":\"devices\"}"), "{j}");
    for want in [
        "{\"name\":\"mlx5_0\",\"usable\":true,\"why\":\"gdsync's queues run on it: GDSYNC_DEVICE=mlx5_0\"",
        "{\"name\":\"mlx5_1\",\"usable\":true,",
        "\"fw_ver\":\"22.36.1010\"",
        "\"phys_port_cnt\":2,",
        "\"link_layer\":\"InfiniBand\",\"lid\":",
        "\"state\":\"PORT_ACTIVE\"",
        // mlx5_0's RoCE port: the RoCE v2 entry with its IPv4 address (10.0.1.N, N the
        // emulator's node number).
        "\"gid\":{\"index\":3,\"gid\":\"0000:0000:0000:0000:0000:ffff:0a00:01",
    ] {
        assert!(j.contains(want), "info --json lacks {want}:\n{j}");
    }
    assert!(
        j.contains(
            "\"default_device\":{\"name\":\"mlx5_0:1\",\"why\":\"the first active mlx5 port\""
        ),
        "{j}"
    );
    let j = info_json_under_emulated_hca("");
    assert!(j.contains("\"rdma\":{\"status\":\"no device\"}"), "{j}");
    assert!(!j.contains("\"name\":\"mlx5"), "{j}");
    assert!(
        j.contains(
            "\"default_device\":{\"name\":\"soft\",\"why\":\"no mlx5 port to use: no RDMA device"
        ),
        "{j}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test cli -- --include-ignored"]
fn info_names_the_nic_handler_where_a_gpu_exists() {
    let out = tool("info")
        .env_remove("GDSYNC_CUDA")
        .env("GDSYNC_NIC_HANDLER", "cpu")
        .guarded_output();
    let t = text(&out.stdout);
    assert!(t.contains("Cpu (set by GDSYNC_NIC_HANDLER)"), "{t}");
}

#[test]
fn stencil_json_is_one_line_on_stdout() {
    let rows = json_lines(
        "stencil2d",
        &["--n", "32", "--ranks", "4", "--iters", "5", "--check"],
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        common::json_field(&rows[0], "mismatches"),
        "0",
        "{}",
        rows[0]
    );
    assert_eq!(common::json_field(&rows[0], "halo"), "null", "{}", rows[0]);
}

/// A small JSON checker (RFC 8259 grammar), so that `--json` output is tested to parse.
mod json {
    pub fn check(s: &str) -> Result<(), String> {
        let b = s.as_bytes();
        let mut i = 0;
        value(b, &mut i)?;
        ws(b, &mut i);
        if i != b.len() {
            return Err(format!("trailing text at {i}"));
        }
        Ok(())
    }

    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b" \t\r\n".contains(&b[*i]) {
            *i += 1;
        }
    }

    fn eat(b: &[u8], i: &mut usize, c: u8) -> Result<(), String> {
        ws(b, i);
        if b.get(*i) != Some(&c) {
            return Err(format!("expected {:?} at {}", c as char, *i));
        }
        *i += 1;
        Ok(())
    }

    fn value(b: &[u8], i: &mut usize) -> Result<(), String> {
        ws(b, i);
        match b.get(*i) {
            Some(b'{') => seq(b, i, b'}', |b, i| {
                string(b, i)?;
                eat(b, i, b':')?;
                value(b, i)
            }),
            Some(b'[') => seq(b, i, b']', value),
            Some(b'"') => string(b, i),
            Some(b't') => word(b, i, "true"),
            Some(b'f') => word(b, i, "false"),
            Some(b'n') => word(b, i, "null"),
            _ => number(b, i),
        }
    }

    fn seq(
        b: &[u8],
        i: &mut usize,
        close: u8,
        item: impl Fn(&[u8], &mut usize) -> Result<(), String>,
    ) -> Result<(), String> {
        *i += 1;
        ws(b, i);
        if b.get(*i) == Some(&close) {
            *i += 1;
            return Ok(());
        }
        loop {
            item(b, i)?;
            ws(b, i);
            match b.get(*i) {
                Some(&c) if c == close => {
                    *i += 1;
                    return Ok(());
                }
                Some(b',') => *i += 1,
                _ => return Err(format!("expected , or {} at {}", close as char, *i)),
            }
        }
    }

    fn string(b: &[u8], i: &mut usize) -> Result<(), String> {
        eat(b, i, b'"')?;
        while let Some(&c) = b.get(*i) {
            *i += 1;
            match c {
                b'"' => return Ok(()),
                b'\\' => {
                    let e = *b.get(*i).ok_or("unterminated escape")?;
                    *i += if e == b'u' { 5 } else { 1 };
                    if !b"\"\\/bfnrtu".contains(&e) {
                        return Err(format!("bad escape at {}", *i));
                    }
                }
                c if c < 0x20 => return Err(format!("control character at {}", *i)),
                _ => {}
            }
        }
        Err("unterminated string".into())
    }

    fn word(b: &[u8], i: &mut usize, w: &str) -> Result<(), String> {
        if !b[*i..].starts_with(w.as_bytes()) {
            return Err(format!("bad literal at {}", *i));
        }
        *i += w.len();
        Ok(())
    }

    fn number(b: &[u8], i: &mut usize) -> Result<(), String> {
        let start = *i;
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > s
        };
        if b.get(*i) == Some(&b'-') {
            *i += 1;
        }
        if b.get(*i) == Some(&b'0') {
            *i += 1;
        } else if !digits(i) {
            return Err(format!("bad value at {start}"));
        }
        if b.get(*i) == Some(&b'.') {
            *i += 1;
            if !digits(i) {
                return Err(format!("bad fraction at {start}"));
            }
        }
        if matches!(b.get(*i), Some(b'e' | b'E')) {
            *i += 1;
            if matches!(b.get(*i), Some(b'+' | b'-')) {
                *i += 1;
            }
            if !digits(i) {
                return Err(format!("bad exponent at {start}"));
            }
        }
        Ok(())
    }

    #[test]
    fn the_checker_tells_json_from_not() {
        for ok in [r#"{"a":[1,-2.5e3,true,null,"x\"y"],"b":{}}"#, "0", "[]"] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "{",
            r#"{"a":inf}"#,
            r#"{"a":1,}"#,
            "01",
            r#"{"a" 1}"#,
            "[1] x",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}

/// `pingpong --mem device` stages GPU payloads through pinned bounces on every GPU trigger and
/// op (`--staging on`; `auto` on the soft device too) and still runs directly with `--staging
/// off`: each run ends with the last message's marker in the receiver's GPU memory (the
/// staged copy in after the wait landed, checked by the tool), and the JSON says which path
/// ran. Sizes 8 B and 64 KiB + 4 (an odd multiple of 4 past a power of 2).
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored stages_gpu"]
fn pingpong_stages_gpu_payloads_on_every_trigger() {
    for trigger in ["host", "stream", "kernel"] {
        for op in ["write", "write-imm", "send"] {
            for staging in ["on", "auto", "off"] {
                let args = [
                    "--trigger",
                    trigger,
                    "--op",
                    op,
                    "--mem",
                    "device",
                    "--staging",
                    staging,
                    "--sizes",
                    "8,65540",
                    "--iters",
                    "300",
                ];
                pingpong_gpu_path(&args, staging);
            }
        }
    }
}

/// `bandwidth --mem device` stages writes from every trigger through pinned bounces on the
/// GPU (`--staging on`, and `auto` on the soft device), byte for byte (`--check`) at 1 B,
/// 4 KiB, 1 MiB and 1 MiB + 3 B (four and five 256 KiB chunks), and at 1 MiB + 3 B in the
/// default chunks; runs directly with `--staging off`; the JSON names the path.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored bandwidth_stages"]
fn bandwidth_stages_gpu_payloads_on_every_trigger() {
    for trigger in ["cpu", "stream", "kernel"] {
        for staging in ["on", "auto"] {
            let args = [
                "--trigger",
                trigger,
                "--mem",
                "device",
                "--staging",
                staging,
                "--sizes",
                "1,4K,1M,1048579",
                "--chunk",
                "256K",
                "--iters",
                "200",
                "--check",
            ];
            let rows = gpu_json("bandwidth", &args);
            assert_eq!(rows.len(), 4, "{args:?}: {rows:?}");
            for r in &rows {
                let path = common::json_field(r, "gpu_memory");
                assert!(path.starts_with("staged"), "{args:?}: {r}");
            }
        }
    }
    for trigger in ["cpu", "stream", "kernel"] {
        let args = ["--trigger", trigger, "--mem", "device", "--staging", "on"];
        let args = [
            &args[..],
            &["--sizes", "1048579", "--iters", "100", "--check"],
        ]
        .concat();
        let rows = gpu_json("bandwidth", &args);
        assert_eq!(rows.len(), 1, "{args:?}: {rows:?}");
        assert_eq!(
            common::json_field(&rows[0], "chunk"),
            "1048576",
            "{}",
            rows[0]
        );
    }
    for trigger in ["stream", "kernel"] {
        let args = [
            "--trigger",
            trigger,
            "--mem",
            "device",
            "--staging",
            "off",
            "--sizes",
            "4K",
            "--iters",
            "200",
        ];
        let rows = gpu_json("bandwidth", &args);
        let path = common::json_field(&rows[0], "gpu_memory");
        assert!(path.starts_with("direct"), "{args:?}: {}", rows[0]);
    }
}

/// `bandwidth --trigger kernel --mem device` stages through the kernel's block copies byte
/// for byte where the reuse of a bounce is tightest (two bounces: every chunk waits for the
/// write and the credit of the chunk two back) and where chunks are not 16-byte multiples
/// (bounces at unaligned offsets, copied byte by byte), across chunk boundaries and message
/// after message, and with every message below a chunk (bounces of the largest message):
/// `--check` compares the receiver's GPU buffer after each size.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored bandwidth_kernel_stages"]
fn bandwidth_kernel_stages_tight_and_unaligned_chunks() {
    for (chunk, bounces, sizes) in [
        ("256K", "2", "1048579"),
        ("1000", "3", "1,999,1000,1001,5503"),
        ("1M", "4", "4K,64K"),
    ] {
        let args = [
            "--trigger",
            "kernel",
            "--mem",
            "device",
            "--staging",
            "on",
            "--chunk",
            chunk,
            "--bounces",
            bounces,
            "--sizes",
            sizes,
            "--iters",
            "50",
            "--check",
        ];
        let rows = gpu_json("bandwidth", &args);
        assert_eq!(rows.len(), sizes.split(',').count(), "{args:?}: {rows:?}");
        for r in &rows {
            assert!(
                common::json_field(r, "gpu_memory").starts_with("staged"),
                "{r}"
            );
            assert_eq!(common::json_field(r, "trigger"), "kernel", "{r}");
            assert_eq!(common::json_field(r, "bounces"), bounces, "{r}");
        }
    }
}

/// Runs `pingpong args` on the GPU (two sizes): two rows, whose GPU memory path is direct
/// for `--staging off`, else staged.
fn pingpong_gpu_path(args: &[&str], staging: &str) {
    let rows = gpu_json("pingpong", args);
    assert_eq!(rows.len(), 2, "{args:?}: {rows:?}");
    let path = common::json_field(&rows[0], "gpu_memory");
    let want = if staging == "off" { "direct" } else { "staged" };
    assert!(path.starts_with(want), "{args:?}: gpu_memory {path}");
}

/// `pingpong --api mp --mem device` stages GPU payloads through mp's bounce pool on the host
/// and stream triggers, and through a staged kernel channel on the kernel trigger (`--staging
/// on`, and `auto` on the soft device), and runs directly with `--staging off`: each run ends
/// with the last marker in the receiver's GPU memory (checked by the tool) and the JSON names
/// the path. Sizes 8 B and 64 KiB + 4.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored mp_stages_gpu"]
fn pingpong_mp_stages_gpu_payloads_on_every_gpu_trigger() {
    for trigger in ["host", "stream", "kernel"] {
        for staging in ["on", "auto", "off"] {
            let mut args = vec!["--api", "mp", "--op", "send", "--trigger", trigger];
            args.extend(["--mem", "device", "--staging", staging]);
            args.extend(["--sizes", "8,65540", "--iters", "300"]);
            pingpong_gpu_path(&args, staging);
        }
    }
}

/// The same through 64 KiB chunks (`--stage-bounce 65536`): 1 MiB messages go in 16 chunks
/// each way (65,540-byte ones in two), on the host and stream triggers, and the last marker
/// lands.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored mp_chunks_gpu"]
fn pingpong_mp_chunks_gpu_payloads_on_the_host_and_stream_triggers() {
    for trigger in ["host", "stream"] {
        let mut args = vec!["--api", "mp", "--op", "send", "--trigger", trigger];
        args.extend([
            "--mem",
            "device",
            "--staging",
            "on",
            "--stage-bounce",
            "65536",
        ]);
        args.extend(["--sizes", "65540,1048576", "--iters", "300"]);
        pingpong_gpu_path(&args, "on");
    }
}

/// `stencil2d --staging` applies to device halos sent by a GPU trigger only (the CPU
/// trigger has no GPU; host halos are host memory already).
#[test]
fn stencil2d_staging_applies_to_device_halos_on_the_gpu_triggers() {
    for args in [
        &["--staging", "on"][..],
        &["--trigger", "kernel", "--halo", "host", "--staging", "on"],
        &["--trigger", "stream", "--halo", "host", "--staging", "off"],
    ] {
        refused("stencil2d", args, "--staging applies");
    }
}

/// `stencil2d --halo device` through staging (mp's pool for the host and stream triggers,
/// the kernel channels' bounces for the kernel trigger; 2 and 4 ranks, `--staging on`, `auto`
/// and `off`): bit-exact against the single-rank run, and the JSON names the path.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test cli -- --include-ignored stencil2d_stages"]
fn stencil2d_stages_device_halos_bit_exact() {
    for trigger in ["host", "stream", "kernel"] {
        for staging in ["on", "auto", "off"] {
            for ranks in ["2", "4"] {
                let mut args = vec!["--trigger", trigger, "--halo", "device"];
                args.extend(["--staging", staging, "--ranks", ranks, "--n", "64"]);
                args.extend(["--iters", "50", "--check"]);
                let st = gpu_json("stencil2d", &args);
                let row = st.last().expect("a row");
                assert_eq!(
                    common::json_field(row, "mismatches"),
                    "0",
                    "{args:?}: {row}"
                );
                let path = common::json_field(row, "gpu_memory");
                let want = if staging == "off" { "direct" } else { "staged" };
                assert!(path.starts_with(want), "{args:?}: gpu_memory {path}");
            }
        }
    }
}

/// `stream_echo`'s loop on host streams (no GPU): every way of carrying the counter completes
/// its round trips and prints a positive time; bad counts are refused.
#[test]
fn stream_echo_runs_its_relays_on_host_streams() {
    for watch in ["progress", "waited"] {
        let args = [
            "--host-stream",
            "--iters",
            "20",
            "--reps",
            "1",
            "--watch",
            watch,
        ];
        let out = output("stream_echo", &args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "stream_echo {args:?} failed:\n{stdout}\n{stderr}"
        );
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("streams store") || l.starts_with("CPU thread"))
            .collect();
        assert_eq!(rows.len(), 6, "{stdout}");
        for row in rows {
            let us: f64 = row
                .split_whitespace()
                .rev()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no time in {row:?}"));
            assert!(us > 0.0 && us.is_finite(), "{row}");
        }
    }
    refused(
        "stream_echo",
        &["--host-stream", "--iters", "5"],
        "--iters must be at least 10",
    );
}
