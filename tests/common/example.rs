//! The measuring programs' binaries (package `gdasync-examples`) for the tests that run them:
//! found where device-pack staged them, or built by cargo for the running test binary's profile;
//! run under the tests' hang guard.

use super::output::GuardedOutput;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Program `name`'s binary: device-pack's staged copy where the tests were staged with it,
/// otherwise built by cargo for this test binary's profile and target directory (the programs
/// are another package's binaries, which cargo does not build for this package's tests, and a
/// binary left in the target directory may be stale). Built once per test
/// process; panics with cargo's error where it cannot be built.
pub fn path(name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, Result<PathBuf, String>>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let found = built
        .entry(name.to_string())
        .or_insert_with(|| find_or_build(name))
        .clone();
    found.unwrap_or_else(|e| panic!("{e}"))
}

fn find_or_build(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the test binary's path: {e}"))?;
    // Test binaries live in <target>/[<triple>/]<profile>/deps; device-pack stages them in
    // .device/tests and the examples in .device/bin.
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("no profile directory above {}", exe.display()))?;
    let staged = profile_dir.join("bin").join(name);
    if staged.is_file() {
        return Ok(staged);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        "gdasync-examples",
        "--bin",
        name,
        "--manifest-path",
    ])
    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    match profile_dir.file_name().and_then(|p| p.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
        None => return Err(format!("no profile in {}", profile_dir.display())),
    }
    let mut target_dir = profile_dir.parent().unwrap_or(Path::new("/"));
    // Cargo tags the root of a target directory; below it, a directory per target triple
    // when one was given.
    if !target_dir.join("CACHEDIR.TAG").exists() {
        if let (Some(triple), Some(above)) = (target_dir.file_name(), target_dir.parent()) {
            cmd.arg("--target").arg(triple);
            target_dir = above;
        }
    }
    cmd.arg("--target-dir").arg(target_dir);
    let out = cmd
        .output()
        .map_err(|e| format!("example {name}: cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "example {name} did not build ({cmd:?}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let built = profile_dir.join(name);
    if built.is_file() {
        Ok(built)
    } else {
        Err(format!("{cmd:?} succeeded but left no {}", built.display()))
    }
}

/// Runs program `name` (see [`path`]) with `args`: (success, stdout, stderr).
pub fn run(name: &str, args: &[&str]) -> (bool, String, String) {
    run_env(name, args, &[])
}

/// [`run`] with extra environment variables.
pub fn run_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(path(name))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .guarded_output();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
