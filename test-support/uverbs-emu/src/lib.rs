//! An emulated RDMA kernel driver for tests: the real libibverbs and libmlx5 run unmodified
//! against it, with no HCA and no RDMA kernel module.
//!
//! rdma-core finds devices through RDMA netlink, else through sysfs under `SYSFS_PATH`, and
//! talks to `/dev/infiniband/uverbsN`. [`Emulator`] writes a fake sysfs tree for the devices
//! asked for ([`DeviceSpec`]) and runs commands with `SYSFS_PATH` set and the preload library
//! (`c/uvemu.c`) in `LD_PRELOAD`; the library blocks RDMA netlink, fakes the character devices
//! and serves the verbs commands of the control path (see its header comment). The preload
//! must be in a process's environment when it starts: run the work in a child process. There,
//! [`control`] raises the events a HCA raises on its own (port down and up, QP fatal, CQ
//! error) and counts the commands the driver served.
//! Processes under different emulators of one host reach each other's devices through the
//! [`fabric`], each emulator being a node of it.

pub mod command_stream;
pub mod control;
pub mod fabric;
mod sysfs;

pub use sysfs::{parse_devices, write_sysfs, DeviceSpec, PortKind};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The preload library: `$UVEMU_PRELOAD` where set (a copy on another machine), else the one
/// this crate's build made; or why there is none.
pub fn preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("UVEMU_PRELOAD") {
        let p = PathBuf::from(p);
        return match p.is_file() {
            true => Ok(p),
            false => Err(format!("UVEMU_PRELOAD={}: no such file", p.display())),
        };
    }
    match (option_env!("UVEMU_BUILT"), option_env!("UVEMU_BUILD_ERROR")) {
        (Some(p), _) if Path::new(p).is_file() => Ok(p.into()),
        (Some(p), _) => Err(format!(
            "{p} is gone (rebuild uverbs-emu, or set UVEMU_PRELOAD to a copy)"
        )),
        (None, Some(why)) => Err(why.into()),
        (None, None) => Err("uverbs-emu was built without its preload library".into()),
    }
}

/// A fake sysfs tree and the environment that puts a process under the emulated driver;
/// the tree is removed on drop.
pub struct Emulator {
    root: PathBuf,
    preload: PathBuf,
    node: fabric::Node,
}

impl Emulator {
    /// An emulator serving `devices` (none: rdma-core sees no device).
    pub fn new(devices: &[DeviceSpec]) -> Result<Emulator, String> {
        let preload = preload()?;
        static N: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "uvemu-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let fabric = fabric::directory();
        let node = fabric::Node::claim(&fabric)?;
        write_sysfs(&root, devices, node.number(), &fabric)
            .map_err(|e| format!("fake sysfs at {}: {e}", root.display()))?;
        Ok(Emulator {
            root,
            preload,
            node,
        })
    }

    /// The fake sysfs root (`SYSFS_PATH`).
    pub fn sysfs(&self) -> &Path {
        &self.root
    }

    /// Its node number on the fabric (what its devices' addresses carry).
    pub fn node(&self) -> u8 {
        self.node.number()
    }

    /// The variables a process needs: `SYSFS_PATH` and `LD_PRELOAD`.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("SYSFS_PATH", self.root.clone().into_os_string()),
            ("LD_PRELOAD", self.preload.clone().into_os_string()),
        ]
    }

    /// `program` set up to run under the emulated driver.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env());
        c
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Set in the child that runs a test's body under the emulator.
const CHILD: &str = "UVEMU_TEST_CHILD";

/// For tests that need the emulated driver: in the parent, runs test `name` (of the running
/// test binary) again in a child under an emulator serving `spec` ([`parse_devices`]),
/// checks it ran and passed, and returns true. In that child: returns false (run the body).
/// libmlx5's tuning variables (`MLX5_*`) are cleared in the
/// child, so that it runs with libmlx5's defaults whatever the caller's environment says.
pub fn in_child_under_emulator(name: &str, spec: &str) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let emu = Emulator::new(&parse_devices(spec).unwrap())
        .unwrap_or_else(|e| panic!("the emulated driver is not usable: {e}"));
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
