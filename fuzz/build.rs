//! With the `uverbs` feature (the `uverbs_commands` target): compiles the emulated RDMA
//! driver's C part (`../test-support/uverbs-emu/c/uvemu.c`) into this crate with clang's coverage
//! instrumentation, so that libFuzzer sees which of the driver's branches an input reached.
//! Linked into the target's binary, its hooks of `open`, `write`, `ioctl` and `close` serve
//! `/dev/infiniband/uverbs0` in-process, as the preload library does for other programs.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../test-support/uverbs-emu/c/uvemu.c");
    println!("cargo:rerun-if-changed=../test-support/uverbs-emu/c/uvemu.h");
    if std::env::var_os("CARGO_FEATURE_UVERBS").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("uvemu.o");
    let cc = std::env::var("CC").unwrap_or_else(|_| "clang".into());
    run(Command::new(&cc)
        .args(["-c", "-O1", "-g", "-fPIC", "-fsanitize=fuzzer-no-link", "-o"])
        .arg(&obj)
        .arg("../test-support/uverbs-emu/c/uvemu.c"));
    run(Command::new("ar")
        .arg("rcs")
        .arg(out.join("libuvemu_fuzz.a"))
        .arg(&obj));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=uvemu_fuzz");
    println!("cargo:rustc-link-lib=dl");
    println!("cargo:rustc-link-lib=pthread");
}

fn run(c: &mut Command) {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        o.status.success(),
        "{c:?} failed (the uverbs target needs clang and the kernel's uapi headers):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
