//! Running a test's body under the emulated RDMA driver (uverbs-emu): its preload must be in a
//! process's environment from the start, so the test runs itself again in a child with the
//! emulator's environment, and the parent checks that the child ran and passed.

use uverbs_emu::{parse_devices, Emulator};

/// Set in the child that runs a test's body under the emulator.
const CHILD: &str = "GDASYNC_MLX5_TEST_CHILD";

/// In the parent: runs test `name` again in a child under the emulator serving `spec` (see
/// `uverbs_emu::parse_devices`), checks it ran and passed, and returns true. In that child:
/// returns false (run the body). libmlx5's tuning variables (`MLX5_*`) are cleared in the
/// child, so that it runs with libmlx5's defaults whatever the caller's environment says.
pub fn in_child_under_emulator(name: &str, spec: &str) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let emu = Emulator::new(&parse_devices(spec).unwrap()).unwrap_or_else(|e| {
        panic!("rdma-core is installed but the emulated driver is not usable: {e}")
    });
    let mut cmd = emu.command(std::env::current_exe().unwrap());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MLX5_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} under the emulator failed:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "{name} did not run in the child:\n{text}"
    );
    true
}
