//! The doctor (examples/doctor): its steps come in order, one line each, with the status a
//! machine without a GPU must give (GPU steps SKIP, never OK); it runs clean on the soft
//! device and under the emulated RDMA driver, fails with exit status 1 when a step fails, and
//! its kernel compiles as CUDA. On the GPU machine (`--include-ignored`) every loopback runs.

mod common;

use common::output::GuardedOutput;
use std::process::{Command, Output};

/// The steps before the loopbacks, in order (the device and port, and the doorbell steps,
/// repeat per port).
const MACHINE_STEPS: [&str; 7] = [
    "rdma-core",
    "device and port",
    "ulimit -l (RLIMIT_MEMLOCK)",
    "GPU and driver",
    "GPU memory registration",
    "GPU mapping of the doorbell (UAR)",
    "inbound write flush and ordering",
];

/// The loopback steps of each port, in order, then its verdict.
const PORT_STEPS: [&str; 7] = [
    "loopback cpu write -> host memory",
    "loopback cpu write -> GPU memory",
    "loopback stream write -> host memory",
    "loopback stream write -> GPU memory",
    "loopback kernel write -> host memory",
    "loopback kernel write -> GPU memory",
    "verdict",
];

fn doctor(gpu: bool) -> Command {
    let exe = common::example("doctor").expect("the doctor is built");
    let mut c = Command::new(exe);
    c.env_remove("GDSYNC_LOG").env("RUST_BACKTRACE", "1");
    if !gpu {
        c.env(common::gpu::NO_CUDA.0, common::gpu::NO_CUDA.1);
    }
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The step lines of a text report: (status, step, about, the rest).
fn steps(out: &Output) -> Vec<(String, String, String, String)> {
    text(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (status, rest) = l.split_once("  ")?;
            if !["OK", "WARN", "FAIL", "SKIP"].contains(&status.trim()) {
                return None;
            }
            let (name, rest) = rest.split_once(" [")?;
            let (about, value) = rest.split_once("] ")?;
            Some((
                status.trim().into(),
                name.trim().into(),
                about.into(),
                value.into(),
            ))
        })
        .collect()
}

/// Checks the report `out` of a run without a GPU on `ports`: exit 0, every step present in
/// order, the GPU steps skipped, the CPU loopback OK on every port.
fn clean_without_gpu(out: &Output, ports: &[&str]) -> Vec<(String, String, String, String)> {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}\n{e}");
    let s = steps(out);
    assert!(
        o.lines().nth(1).is_some_and(|l| l.contains("rdma-core")),
        "{o}"
    );
    let mut want: Vec<&str> = MACHINE_STEPS.to_vec();
    want.retain(|n| *n != "device and port" && *n != "GPU mapping of the doorbell (UAR)");
    let names: Vec<&str> = s.iter().map(|x| x.1.as_str()).collect();
    let mut at = 0;
    for w in want.iter().chain(PORT_STEPS.iter()) {
        let found = names[at..].iter().position(|n| n == w);
        at += found.unwrap_or_else(|| panic!("no {w:?} step in order:\n{o}")) + 1;
    }
    for (status, name, about, value) in &s {
        assert_ne!(status, "FAIL", "{name} [{about}] {value}\n{o}");
        let gpu = name.contains("GPU")
            || name.contains("stream")
            || name.contains("kernel")
            || name.contains("flush")
            || name.contains("doorbell");
        if gpu && name != "verdict" {
            assert_eq!(status, "SKIP", "{name} without a GPU:\n{o}");
        }
    }
    for p in ports {
        let cpu = s
            .iter()
            .find(|x| x.1 == PORT_STEPS[0] && x.2 == *p)
            .unwrap_or_else(|| panic!("no CPU loopback on {p}:\n{o}"));
        assert_eq!(cpu.0, "OK", "{o}");
        assert!(
            cpu.3.contains("4096 B checked") && cpu.3.contains("p50"),
            "{o}"
        );
        assert!(
            s.iter()
                .any(|x| x.1 == "verdict" && x.2 == *p && x.0 == "OK"),
            "{o}"
        );
    }
    assert!(
        o.lines()
            .last()
            .is_some_and(|l| l.starts_with("doctor: 0 FAIL")),
        "{o}"
    );
    s
}

#[test]
fn clean_on_the_soft_device_without_a_gpu() {
    let out = doctor(false).args(["--writes", "300"]).guarded_output();
    clean_without_gpu(&out, &["soft"]);
    let json = doctor(false)
        .args(["--json", "--writes", "100"])
        .guarded_output();
    assert!(json.status.success());
    let j = text(&json.stdout);
    assert_eq!(j.lines().count(), 1, "{j}");
    assert!(
        j.starts_with("{\"version\":") && j.contains("\"fail\":0"),
        "{j}"
    );
    assert!(
        j.contains(
            "{\"step\":\"loopback cpu write -> host memory\",\"about\":\"soft\",\"status\":\"OK\""
        ),
        "{j}"
    );
}

/// `--help` says what the exit status means; a wrong flag is clap's error and status 2.
#[test]
fn help_version_and_a_wrong_flag() {
    let help = doctor(false).arg("--help").guarded_output();
    assert!(help.status.success());
    // (Words compared, not lines: clap wraps help to the terminal's width.)
    let words = text(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(words.contains("exit status 1 when a step fails"), "{words}");
    let v = doctor(false).arg("--version").guarded_output();
    assert!(v.status.success() && text(&v.stdout).starts_with("doctor "));
    let bad = doctor(false).args(["--writes", "3"]).guarded_output();
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
}

/// A step that fails makes the run fail (exit status 1, one `error:` line), the others still
/// run: here every queue pair is refused (an invalid GDSYNC_NIC_HANDLER).
#[test]
fn a_failed_step_fails_the_run_with_status_1() {
    let out = doctor(false)
        .env("GDSYNC_NIC_HANDLER", "sideways")
        .args(["--writes", "100"])
        .guarded_output();
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{o}\n{e}");
    let s = steps(&out);
    let cpu = s
        .iter()
        .find(|x| x.1 == PORT_STEPS[0])
        .expect("the CPU loopback");
    assert_eq!(cpu.0, "FAIL", "{o}");
    assert!(cpu.3.contains("GDSYNC_NIC_HANDLER"), "{o}");
    assert!(o.contains(" -- fix: "), "{o}");
    assert!(s.iter().any(|x| x.1 == "verdict" && x.0 == "FAIL"), "{o}");
    assert!(e.starts_with("error: ") && e.lines().count() == 1, "{e}");
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn clean_under_the_emulated_driver_on_each_port() {
    let emu = common::emulator("mlx5_0,mlx5_1:ib");
    let out = doctor(false)
        .envs(emu.env())
        .args(["--writes", "200"])
        .guarded_output();
    let s = clean_without_gpu(&out, &["mlx5_0:1", "mlx5_1:1"]);
    let o = text(&out.stdout);
    let port = |p: &str| {
        s.iter()
            .find(|x| x.1 == "device and port" && x.2 == p)
            .cloned()
    };
    assert!(
        port("mlx5_0:1").is_some_and(|x| x.0 == "OK" && x.3.contains("Ethernet")),
        "{o}"
    );
    assert!(
        port("mlx5_1:1").is_some_and(|x| x.0 == "OK" && x.3.contains("InfiniBand")),
        "{o}"
    );
    for p in ["mlx5_0:1", "mlx5_1:1"] {
        assert!(
            s.iter().any(|x| x.1 == "GPU mapping of the doorbell (UAR)"
                && x.2 == p
                && x.3.contains("ordinary memory: emulated driver")),
            "{o}"
        );
    }
}

/// Every loopback step of the doctor run `cmd` on a GPU went OK; its output, printed for
/// docs/hardware.md (`--show-output`).
fn every_loopback_ok(what: &str, cmd: &mut Command) -> Vec<(String, String, String, String)> {
    let out = cmd.guarded_output();
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    println!("---- the doctor {what}:\n{o}");
    assert!(out.status.success(), "{o}\n{e}");
    let s = steps(&out);
    for w in PORT_STEPS {
        let x = s
            .iter()
            .find(|x| x.1 == w)
            .unwrap_or_else(|| panic!("{w}:\n{o}"));
        assert_eq!(x.0, "OK", "{w}:\n{o}");
    }
    let gpu = s
        .iter()
        .find(|x| x.1 == "GPU and driver")
        .expect("the GPU step");
    assert_ne!(gpu.0, "SKIP", "{o}");
    s
}

/// On the GPU machine, on the soft device and under the emulated driver: every loopback
/// (CPU, stream, kernel; host and GPU memory) runs and checks out, and the GPU rings the
/// emulated doorbell page itself.
#[test]
#[ignore = "needs a CUDA GPU and rdma-core: GDSYNC_TEST_CUDA=1 cargo test --release --test doctor -- --include-ignored --show-output"]
fn every_step_runs_on_a_gpu() {
    let _gpu = common::gpu::gpu();
    every_loopback_ok("on this machine", &mut doctor(true));
    let emu = common::emulator("mlx5_0");
    let s = every_loopback_ok("under the emulated driver", doctor(true).envs(emu.env()));
    let uar = s
        .iter()
        .find(|x| x.1 == MACHINE_STEPS[5])
        .expect("the doorbell step");
    let (a, b) = ("ordinary memory: emulated driver", "the GPU rings");
    assert!(uar.3.contains(a) && uar.3.contains(b), "{uar:?}");
}

/// The doctor's kernel compiles as CUDA (`common::clang::check_cuda`): CI has no GPU and no
/// NVRTC.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn the_doctors_kernel_compiles_as_cuda() {
    common::clang::check_cuda("doctor", include_str!("../examples/doctor/loopback.cu"));
}
