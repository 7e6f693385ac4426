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
