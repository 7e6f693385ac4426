//! Build-time checks only; the default build needs nothing but cargo. Sets `cfg(clang_cuda)`
//! where clang++ takes CUDA, so that the tests checking the CUDA device code with it run
//! there and are counted as ignored elsewhere, and `cfg(rdma_core)` where libibverbs and
//! libmlx5 are installed, for the mlx5 tests under the emulated driver.

#[path = "tests/common/clang_cuda.rs"]
#[allow(dead_code)]
mod clang_cuda;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=tests/common/clang_cuda.rs");
    println!("cargo:rustc-check-cfg=cfg(clang_cuda)");
    println!("cargo:rustc-check-cfg=cfg(rdma_core)");
    // Installing or removing rdma-core updates the loader cache.
    println!("cargo:rerun-if-changed=/etc/ld.so.cache");
    if rdma_core_installed() {
        println!("cargo:rustc-cfg=rdma_core");
    }
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

/// Whether the dynamic loader knows libibverbs.so.1 and libmlx5.so.1 (rdma-core's
/// `libibverbs1` and `ibverbs-providers` packages).
fn rdma_core_installed() -> bool {
    let cache = ["/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| std::process::Command::new(l).arg("-p").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    ["libibverbs.so.1", "libmlx5.so.1"]
        .iter()
        .all(|lib| cache.contains(&format!("{lib} ")))
}
