//! The examples' command lines: clean errors for what this machine cannot do, never a panic.

mod common;

use common::{example, run_example as run};
use gdasync::gdsync::cuda::{Cuda, CudaStream, DeviceBuffer};
use gdasync::gdsync::Error;
use std::process::Command;

#[test]
fn gpu_triggers_without_a_gpu_are_clean_errors() {
    if Cuda::available() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    for api in ["gdsync", "mp"] {
        for trig in ["host", "stream", "kernel"] {
            let Some((ok, _, err)) = run(
                "pingpong",
                &[
                    "--api",
                    api,
                    "--op",
                    "send",
                    "--trigger",
                    trig,
                    "--size",
                    "8",
                    "--iters",
                    "10",
                ],
            ) else {
                return;
            };
            assert!(!ok, "--api {api} --trigger {trig} without a GPU must fail");
            assert!(
                err.contains("needs a CUDA GPU"),
                "--api {api} --trigger {trig}: {err}"
            );
            assert!(
                !err.contains("panicked"),
                "--api {api} --trigger {trig} panicked: {err}"
            );
        }
    }
    let Some((ok, _, err)) = run("pingpong", &["--mem", "device", "--size", "8"]) else {
        return;
    };
    assert!(!ok && err.contains("--mem"), "{err}");
}

#[test]
fn cuda_calls_without_a_gpu_return_errors() {
    if Cuda::available() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    assert!(matches!(CudaStream::new(0), Err(Error::NoCuda(_))));
    assert!(matches!(DeviceBuffer::alloc(0, 64), Err(Error::NoCuda(_))));
}

#[test]
fn bad_pingpong_arguments_are_clean_errors() {
    for args in [
        &["--op", "write", "--size", "0"][..],
        &["--iters", "0", "--size", "8"][..],
        &["--ranks", "procs", "--separate-devices"][..],
        &["--size", "8", "--sizes", "16"][..],
    ] {
        let Some((ok, _, err)) = run("pingpong", args) else {
            return;
        };
        assert!(!ok, "{args:?} must fail");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
    }
}

#[test]
fn info_reports_the_soft_device_and_the_handler() {
    let Some((ok, out, err)) = run("info", &[]) else {
        return;
    };
    assert!(ok, "{err}");
    assert!(out.contains("soft") && out.contains("NIC handler"), "{out}");
    let Some((ok, json, _)) = run("info", &["--json"]) else {
        return;
    };
    assert!(
        ok && json.trim().starts_with('{') && json.contains("\"devices\":[\"soft\"]"),
        "{json}"
    );
    let out = Command::new(example("info").unwrap())
        .env("GDSYNC_NIC_HANDLER", "cpu")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Cpu (set by GDSYNC_NIC_HANDLER)"));
}

#[test]
fn launch_probe_without_a_gpu_is_a_clean_error() {
    if Cuda::available() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let Some((ok, _, err)) = run("launch_probe", &["local-big"]) else {
        return;
    };
    assert!(!ok, "launch_probe without a GPU must fail");
    assert!(err.contains("CUDA not available"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
