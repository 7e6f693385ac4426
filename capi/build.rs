//! Gives the shared library the name it is installed under (`libgdasync.so.0`), so programs
//! linked against the installed library find it by that name; sets `cfg(clangxx)` where
//! clang++ runs, for the test that compiles gdasync.h with gdsync.cuh (tests/kernel_qp.rs), and
//! `cfg(clang_cuda)` where it takes CUDA, for the test that checks the GPU test's kernel.

#[path = "../tests/common/clang_cuda.rs"]
mod clang_cuda;

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
    println!("cargo:rustc-check-cfg=cfg(clang_cuda)");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if clangxx && clang_cuda::clang_cuda_works(&out) {
        println!("cargo:rustc-cfg=clang_cuda");
    }
}
