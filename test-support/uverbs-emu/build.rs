//! Builds the preload library (`c/uvemu.c`, C because libc's variadic entry points — `open`,
//! `ioctl` — are hooked) into `$OUT_DIR/libuvemu.so` with the system C compiler (`$CC`, else
//! `cc`); it needs only libc and the kernel's uapi headers (linux-libc-dev), not rdma-core.
//! Where it cannot be built the crate still builds, and says why at run time. Sets
//! `cfg(perftest)` where Debian's perftest is installed, so that the test running it under the
//! emulator runs there and is counted as ignored elsewhere.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=c/uvemu.c");
    println!("cargo:rerun-if-changed=c/uvemu.h");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rustc-check-cfg=cfg(uvemu_built)");
    perftest_cfg();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libuvemu.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args([
            "-O2",
            "-g",
            "-Wall",
            "-shared",
            "-fPIC",
            "-DUVEMU_PRELOAD",
            "-o",
        ])
        .arg(&so)
        .arg("c/uvemu.c")
        .args(["-ldl", "-lpthread"])
        .output();
    match built {
        Ok(o) if o.status.success() => {
            println!("cargo:rustc-env=UVEMU_BUILT={}", so.display());
            // The crate's own tests of the driver run where it was built.
            println!("cargo:rustc-cfg=uvemu_built");
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let first = err
                .lines()
                .find(|l| l.contains("error"))
                .unwrap_or("failed");
            fail(&format!("{cc} could not build c/uvemu.c: {first}"));
        }
        Err(e) => fail(&format!("no C compiler ({cc}: {e}): install gcc or set CC")),
    }
}

fn fail(why: &str) {
    println!("cargo:warning=the emulated RDMA driver is not built: {why}");
    println!("cargo:rustc-env=UVEMU_BUILD_ERROR={why}");
}

/// `cfg(perftest)` where perftest's `ib_write_lat` is on PATH (checked again when /usr/bin
/// changes, as installing the package changes it).
fn perftest_cfg() {
    println!("cargo:rustc-check-cfg=cfg(perftest)");
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("ib_write_lat"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => {
            println!("cargo:rerun-if-changed={}", p.display());
            println!("cargo:rustc-cfg=perftest");
        }
        None => println!("cargo:rerun-if-changed=/usr/bin"),
    }
}
