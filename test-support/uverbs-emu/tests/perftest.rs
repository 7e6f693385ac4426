//! An unmodified verbs program on the emulated HCA: Debian's `ib_write_lat` (perftest), a
//! server and a client each a process under its own emulator, through
//! `scripts/perftest-under-emulator.sh` (the runner CI and users take; it bounds the run with
//! `timeout`). Ignored where perftest is not installed (`apt-get install perftest`).

use std::path::Path;
use std::process::Command;

#[test]
#[cfg_attr(
    not(perftest),
    ignore = "needs perftest and rdma-core (apt-get install perftest ibverbs-providers)"
)]
fn ib_write_lat_pair_runs_on_the_emulated_hca() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/perftest-under-emulator.sh"))
        .args(["--tests", "ib_write_lat", "--sizes", "8", "--iters", "50"])
        .env("PERFTEST_TIMEOUT", "60")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("ok   ib_write_lat -s 8"))
        .unwrap_or_else(|| panic!("no result row:\n{text}"));
    assert!(row.contains("us typical"), "{row}");
}

/// `UVEMU_LINGER_US` (how long an empty `poll_cq` keeps lending its thread) takes a number of
/// microseconds; anything else gets a one-line error when the program opens the device, and
/// the program goes on with the default. (`ibv_devinfo` comes with ibverbs-utils, which CI
/// installs with perftest.)
#[test]
#[cfg_attr(
    not(perftest),
    ignore = "needs perftest, ibverbs-utils and rdma-core (apt-get install perftest ibverbs-utils ibverbs-providers)"
)]
fn a_bad_linger_setting_is_refused_in_one_line_and_the_program_goes_on() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (value, refused) in [
        ("0", false),
        ("60", false),
        ("abc", true),
        ("2000000", true),
    ] {
        let out = Command::new("timeout")
            .arg("30")
            .arg(root.join("scripts/with-emulated-hca"))
            .arg("ibv_devinfo")
            .env("UVEMU_LINGER_US", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "UVEMU_LINGER_US={value}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("hca_id:"),
            "UVEMU_LINGER_US={value}: no device listed; {stderr}"
        );
        let refusal = format!("UVEMU_LINGER_US={value} is not a number of microseconds");
        let lines = stderr.lines().filter(|l| l.contains(&refusal)).count();
        assert_eq!(
            lines,
            usize::from(refused),
            "UVEMU_LINGER_US={value}:\n{stderr}"
        );
    }
}
