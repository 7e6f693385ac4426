//! Fuzz target `uverbs_commands`: arbitrary command streams
//! (`uverbs_emu::command_stream`) to the emulated RDMA driver's command decoder, which this
//! binary contains with coverage instrumentation (`--features uverbs`, see `build.rs`): the
//! legacy `write()` commands and the `RDMA_VERBS_IOCTL` method. Every command must come back
//! with a count or an errno.
#![no_main]

extern "C" {
    /// The devices the driver found under `SYSFS_PATH` (`c/uvemu.h`).
    fn uvemu_device_count() -> i32;
}

/// A fake sysfs with one RoCE device, in `SYSFS_PATH`. The driver reads it at its first call,
/// which may come before this runs: without the variable, the target writes the tree and
/// starts itself again with it set.
fn set_up() {
    if std::env::var_os("SYSFS_PATH").is_none() {
        use std::os::unix::process::CommandExt;
        let root = std::env::temp_dir().join(format!("uvemu-fuzz-sysfs-{}", std::process::id()));
        let devices = uverbs_emu::parse_devices("mlx5_0").expect("device spec");
        uverbs_emu::write_sysfs(&root, &devices).expect("write the fake sysfs");
        let me = std::env::current_exe().expect("this executable");
        let e = std::process::Command::new(me)
            .args(std::env::args_os().skip(1))
            .env("SYSFS_PATH", &root)
            .exec();
        panic!("restart with SYSFS_PATH set: {e}");
    }
    // SAFETY: a plain query of the driver's device table.
    let n = unsafe { uvemu_device_count() };
    assert!(n >= 1, "no emulated device under SYSFS_PATH");
}

libfuzzer_sys::fuzz_target!(init: set_up(), |data: &[u8]| {
    uverbs_emu::command_stream::run(c"/dev/infiniband/uverbs0", data)
        .expect("open the emulated device");
});
