//! Build-time checks only; the default build needs nothing but cargo. Sets `cfg(clang_cuda)`
//! where clang++ takes CUDA, so that the tests checking the CUDA device code with it run
//! there and are counted as ignored elsewhere.

#[path = "tests/common/clang_cuda.rs"]
#[allow(dead_code)]
mod clang_cuda;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=tests/common/clang_cuda.rs");
    println!("cargo:rustc-check-cfg=cfg(clang_cuda)");
    // The probe runs again when the clang++ found changes or goes (not when one is installed
    // later: watching PATH would rebuild the package whenever a shell's PATH differs).
    if let Some(clang) = on_path("clang++") {
        println!("cargo:rerun-if-changed={}", clang.display());
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if clang_cuda::clang_cuda_works(&out) {
        println!("cargo:rustc-cfg=clang_cuda");
    }
}

/// The first `name` in PATH.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
