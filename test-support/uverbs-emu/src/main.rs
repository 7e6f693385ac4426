//! `with-emulated-hca [--devices SPEC] [--abi write|ioctl] CMD ARGS...`: runs CMD under the emulated RDMA driver
//! (fake sysfs + preload), so that the real libibverbs and libmlx5 in it see the devices of
//! SPEC (default `mlx5_0`, one RoCE port; `$UVEMU_DEVICES` sets it too, e.g.
//! `mlx5_0,mlx5_1:ib:ib`). Exits with CMD's status. `UVEMU_LOG=1` traces the commands served.
//! Every process of CMD that opens an emulated device gets a soft HCA behind it: the driver
//! loads `$UVEMU_HCA` (default: `libgdasync_emulated_hca.so` beside this program, which
//! `scripts/with-emulated-hca` builds; `UVEMU_HCA=` turns it off) at that first open.
//! `--abi` (or `$UVEMU_ABI`) picks the kernel ABI the driver speaks: `ioctl` (default, as a
//! current kernel: write commands carried by `RDMA_VERBS_IOCTL`) or `write` (legacy only).

use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("with-emulated-hca: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut spec = std::env::var("UVEMU_DEVICES").unwrap_or_else(|_| "mlx5_0".into());
    if args.first().map(String::as_str) == Some("--devices") {
        if args.len() < 2 {
            return Err("--devices needs a value, e.g. mlx5_0,mlx5_1:ib".into());
        }
        spec = args.remove(1);
        args.remove(0);
    }
    let mut abi = std::env::var("UVEMU_ABI").unwrap_or_else(|_| "ioctl".into());
    if args.first().map(String::as_str) == Some("--abi") {
        if args.len() < 2 {
            return Err("--abi needs a value: write or ioctl".into());
        }
        abi = args.remove(1);
        args.remove(0);
    }
    if abi != "write" && abi != "ioctl" {
        return Err(format!("--abi {abi}: expected write or ioctl"));
    }
    if args.first().map(String::as_str) == Some("--") {
        args.remove(0);
    }
    let Some(program) = args.first().cloned() else {
        return Err(
            "usage: with-emulated-hca [--devices SPEC] [--abi write|ioctl] CMD ARGS...".into(),
        );
    };
    let devices = uverbs_emu::parse_devices(&spec)?;
    let emu = uverbs_emu::Emulator::new(&devices)?;
    let mut cmd = emu.command(&program);
    cmd.env("UVEMU_ABI", abi);
    if let Some(hca) = soft_hca() {
        cmd.env("UVEMU_HCA", hca);
    }
    let status = cmd
        .args(&args[1..])
        .status()
        .map_err(|e| format!("{program}: {e}"))?;
    // The tree is removed when `emu` drops, after the command ended.
    Ok(match status.code() {
        Some(c) => ExitCode::from(c.clamp(0, 255) as u8),
        None => ExitCode::from(128 + 9),
    })
}

/// The soft HCA library every process gets: `$UVEMU_HCA` as given (empty: none), else the one
/// built beside this program, if any. Without one, only programs that serve the emulated
/// driver themselves (gdasync's) move data: any other verbs program would wait for
/// completions forever, so that is said up front.
fn soft_hca() -> Option<std::path::PathBuf> {
    if let Some(v) = std::env::var_os("UVEMU_HCA") {
        return Some(v.into());
    }
    let lib = std::env::current_exe()
        .ok()?
        .with_file_name("libgdasync_emulated_hca.so");
    if !lib.is_file() {
        eprintln!(
            "with-emulated-hca: warning: no soft HCA library at {}: only programs that serve the emulated driver themselves (gdasync's) will move data; build it with `cargo build --release -p gdasync-emulated-hca` (scripts/with-emulated-hca does)",
            lib.display()
        );
        return None;
    }
    Some(lib)
}
