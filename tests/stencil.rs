//! The stencil2d example: every decomposition gives the single-rank result bit for bit
//! (`--check`), with ranks as threads and as processes; bad arguments are clean errors.
//! The GPU variants (`host`, `stream`, `kernel`) are ignored unless asked for (`cargo test
//! --release --test stencil -- --include-ignored`), and then require a GPU.

mod common;

use common::gpu::gpu;
use common::json_field as field;

fn run(args: &[&str]) -> (bool, String, String) {
    common::example::run("stencil2d", args)
}

/// A `--check --json` run that must succeed bit-exactly.
fn bit_exact(args: &[&str], decomposition: &str) {
    let mut all = vec!["--check", "--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = run(&all);
    assert!(ok, "{all:?} failed:\n{out}\n{err}");
    let line = out.lines().last().unwrap_or("");
    assert_eq!(field(line, "mismatches"), "0", "{all:?}: {line}");
    assert_eq!(
        field(line, "max_diff").parse::<f64>().unwrap(),
        0.0,
        "{line}"
    );
    assert_eq!(field(line, "decomposition"), decomposition, "{line}");
    if let Some(k) = args.iter().position(|a| *a == "--trigger") {
        assert_eq!(field(line, "trigger"), args[k + 1], "{line}");
    }
    // The run really used the overlap asked for.
    if let Some(k) = args.iter().position(|a| *a == "--overlap") {
        let want = match args[k + 1] {
            "on" => "true",
            "off" => "false",
            _ => field(line, "overlap"),
        };
        assert_eq!(field(line, "overlap"), want, "{line}");
    }
    assert!(
        field(line, "us_per_iter").parse::<f64>().unwrap() > 0.0,
        "{line}"
    );
}

fn cpu_check(ranks_as: &str) {
    // 37 rows and columns: blocks of unequal size.
    for (ranks, dec) in [("1", "1x1"), ("2", "2x1"), ("4", "2x2")] {
        bit_exact(
            &[
                "--trigger",
                "cpu",
                "--n",
                "37",
                "--iters",
                "12",
                "--warmup",
                "3",
                "--ranks",
                ranks,
                "--ranks-as",
                ranks_as,
            ],
            dec,
        );
    }
}

#[test]
fn cpu_threads_are_bit_exact() {
    cpu_check("threads");
}

#[test]
fn cpu_processes_are_bit_exact() {
    cpu_check("procs");
}

/// Many more iterations than the send and receive rings hold (1024 and 512 entries per
/// peer): the host stream's completion waits must free the ring slots.
#[test]
fn cpu_long_run_reuses_the_rings() {
    bit_exact(
        &[
            "--n", "12", "--ranks", "2", "--iters", "1500", "--warmup", "0",
        ],
        "2x1",
    );
}

#[test]
fn check_catches_a_one_bit_difference() {
    let (ok, out, _) = run(&[
        "--n",
        "20",
        "--ranks",
        "4",
        "--iters",
        "4",
        "--check",
        "--json",
        "--corrupt",
    ]);
    assert!(!ok, "a corrupted result must fail the check: {out}");
    let line = out.lines().last().unwrap_or("");
    assert_eq!(field(line, "mismatches"), "1", "{line}");
    assert!(field(line, "max_diff").parse::<f64>().unwrap() > 0.0);
}

#[test]
fn bad_arguments_are_clean_errors() {
    for (args, says) in [
        (&["--halo", "disk"][..], "invalid value"),
        (&["--overlap", "sometimes"][..], "invalid value"),
        (&["--ranks", "0"][..], "--ranks"),
        (&["--iters", "0"][..], "--iters"),
        (&["--n", "3", "--ranks", "16"][..], "cannot give each"),
        (&["--n", "8", "--sub", "4"][..], "cannot be used with"),
    ] {
        let (ok, _, err) = run(args);
        assert!(!ok, "{args:?} must fail");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

/// The GPU triggers where CUDA is not usable (switched off for the run, so that machines with
/// a GPU check this too).
#[test]
fn triggers_needing_a_gpu_fail_cleanly_without_cuda() {
    for trigger in ["host", "stream", "kernel"] {
        let (ok, _, err) = common::example::run_env(
            "stencil2d",
            &["--trigger", trigger],
            &[common::gpu::NO_CUDA],
        );
        assert!(!ok && err.contains("needs a CUDA GPU"), "{trigger}: {err}");
        assert!(!err.contains("panicked"), "{trigger} panicked: {err}");
    }
}

// ---------------------------------------------------------------------------- GPU

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_triggers_are_bit_exact() {
    let _g = gpu();
    // The persistent kernel has no interior kernel to overlap; the others run both ways.
    let runs = [
        ("host", "on"),
        ("host", "off"),
        ("stream", "on"),
        ("stream", "off"),
        ("kernel", "auto"),
    ];
    for (trigger, overlap) in runs {
        for halo in ["device", "host"] {
            for (ranks, dec) in [("2", "2x1"), ("4", "2x2")] {
                bit_exact(
                    &[
                        "--trigger",
                        trigger,
                        "--overlap",
                        overlap,
                        "--halo",
                        halo,
                        "--n",
                        "203",
                        "--iters",
                        "50",
                        "--warmup",
                        "5",
                        "--ranks",
                        ranks,
                    ],
                    dec,
                );
            }
        }
    }
}

/// Thread ranks on one shared soft device (`--shared-device`, one engine for every rank) as
/// well as with a device each (the default of the GPU triggers), with `--trace`: bit-exact
/// either way, and the trace accounts for the run on stderr (threads, steps, and the stream's
/// memory operations per iteration).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_devices_per_rank_or_shared_are_bit_exact_and_traced() {
    let _g = gpu();
    for trigger in ["host", "stream", "kernel"] {
        for shared in [false, true] {
            let mut all = vec!["--check", "--json", "--trace", "--trigger", trigger];
            all.extend([
                "--ranks", "4", "--n", "64", "--iters", "300", "--warmup", "5",
            ]);
            if shared {
                all.push("--shared-device");
            }
            let (ok, out, err) = run(&all);
            assert!(ok, "{all:?} failed:\n{out}\n{err}");
            let line = out.lines().last().unwrap_or("");
            assert_eq!(field(line, "mismatches"), "0", "{all:?}: {line}");
            let devices = if shared {
                "one for all ranks"
            } else {
                "one per rank"
            };
            assert_eq!(field(line, "devices"), devices, "{line}");
            let engines = if shared {
                "1 soft-device engine"
            } else {
                "4 soft-device engine"
            };
            assert!(err.contains("trace process: 4 rank thread(s)"), "{err}");
            assert!(err.contains(engines), "{err}");
            assert!(err.contains("busy over the timed run"), "{err}");
            assert!(
                err.contains("trace rank 3, CPU µs per iteration by step"),
                "{err}"
            );
            if trigger == "stream" {
                // Two neighbours: per ring a doorbell record and a doorbell (a credit and the
                // send to the same peer share one, unless the send waited for its credit:
                // 2 to 4 rings), a wait and a consumer index per halo. The barriers before
                // each record and doorbell are the stream's own (its writes fence), not
                // operations.
                let line = err
                    .lines()
                    .find(|l| l.starts_with("trace rank 0, stream work per iteration"))
                    .unwrap_or_else(|| panic!("{err}"));
                let num = |before: &str| -> f64 {
                    let head = &line[..line.find(before).unwrap_or_else(|| panic!("{line}"))];
                    head.rsplit([' ', '(']).next().unwrap().parse().unwrap()
                };
                let (ops, writes, waits) = (num(" operations ("), num(" writes"), num(" waits"));
                let (barriers, doorbells) = (num(" barriers"), num(" doorbells"));
                assert!((2.0..2.01).contains(&waits), "{line}");
                assert_eq!(barriers, 0.0, "{line}");
                assert!((2.0..4.1).contains(&doorbells), "{line}");
                assert!((writes - doorbells - 2.0).abs() < 0.02, "{line}");
                assert!((ops - writes - waits - doorbells).abs() < 0.02, "{line}");
            }
        }
    }
}

/// The persistent kernel over many iterations and several launches (warm-up, then timed),
/// each launch resuming the channels where the last one left them.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_kernel_long_run_is_bit_exact() {
    let _g = gpu();
    for halo in ["device", "host"] {
        long_run("kernel", ["--halo", halo], "7");
    }
}

/// 3000 iterations of `trigger` with 4 ranks on a 64 × 64 grid, bit-exact.
fn long_run(trigger: &str, option: [&str; 2], warmup: &str) {
    let args = ["--trigger", trigger, option[0], option[1], "--n", "64"];
    let more = ["--ranks", "4", "--iters", "3000", "--warmup", warmup];
    bit_exact(&[&args[..], &more[..]].concat(), "2x2");
}

/// The stream variant many times around the rings, with the CPU never synchronising, with
/// one list of memory operations per iteration and with two.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_stream_long_run_is_bit_exact() {
    let _g = gpu();
    for overlap in ["off", "on"] {
        long_run("stream", ["--overlap", overlap], "0");
    }
}

/// Ranks as processes (each with its own CUDA context on the same GPU).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_stream_processes_are_bit_exact() {
    let _g = gpu();
    for halo in ["host", "device"] {
        bit_exact(
            &[
                "--trigger",
                "stream",
                "--halo",
                halo,
                "--n",
                "96",
                "--ranks",
                "2",
                "--iters",
                "50",
                "--ranks-as",
                "procs",
            ],
            "2x1",
        );
    }
}

/// The stencil's kernels (host, stream and the persistent kernel) compile as CUDA: checked
/// with clang where NVRTC and the GPU are not (`common::clang::check_cuda`).
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernels_compile_as_cuda() {
    let src = include_str!("../examples/stencil2d/kernels.cu");
    common::clang::check_cuda("stencil2d", src);
}

/// Ranks stay bit-exact while another process computes on the same GPU. The two processes'
/// contexts are time-sliced, so each one's work runs late: device buffers were once zeroed on
/// the legacy default stream, which the crate's streams do not wait for, and the late memset
/// wiped the grids copied in after it (every value wrong, in threads and processes alike).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test stencil -- --include-ignored"]
fn gpu_bit_exact_beside_another_gpu_process() {
    let _g = gpu();
    let exe = common::example::path("stencil2d");
    let mut other = std::process::Command::new(exe)
        .args(["--trigger", "host", "--ranks", "1", "--sub", "512"])
        .args(["--iters", "100000000", "--warmup", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the other GPU process");
    // Let it compile its kernels and start computing.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let busy = other.try_wait().expect("poll the other process").is_none();
    let runs = std::panic::catch_unwind(|| {
        for trigger in ["host", "stream"] {
            bit_exact(
                &[
                    "--trigger",
                    trigger,
                    "--n",
                    "96",
                    "--ranks",
                    "1",
                    "--iters",
                    "50",
                ],
                "1x1",
            );
            bit_exact(
                &[
                    "--trigger",
                    trigger,
                    "--halo",
                    "host",
                    "--n",
                    "96",
                    "--ranks",
                    "2",
                ],
                "2x1",
            );
        }
        bit_exact(
            &[
                "--trigger",
                "host",
                "--n",
                "96",
                "--ranks",
                "2",
                "--ranks-as",
                "procs",
            ],
            "2x1",
        );
    });
    let _ = other.kill();
    let _ = other.wait();
    assert!(busy, "the other GPU process ended early");
    if let Err(e) = runs {
        std::panic::resume_unwind(e);
    }
}
