//! Gives the shared library the name it is installed under (`libgdasync.so.0`), so programs
//! linked against the installed library find it by that name; sets `cfg(clangxx)` where
//! clang++ runs, for the test that compiles gdasync.h with gdsync.cuh (tests/kernel_qp.rs).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdasync.so.0");
    println!("cargo:rustc-check-cfg=cfg(clangxx)");
    let clangxx = std::process::Command::new("clang++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if clangxx {
        println!("cargo:rustc-cfg=clangxx");
    }
}
