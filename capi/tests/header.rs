//! The checked-in headers are what the Rust declarations generate (run with `GDASYNC_BLESS=1`
//! to rewrite them), and they compile as C99 and C++17 with every warning an error.

use std::path::PathBuf;
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header cbindgen writes from the crate's sources with `cbindgen.toml`.
fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn gdasync_h_is_up_to_date() {
    let path = crate_dir().join("include/gdasync.h");
    let fresh = generate();
    if std::env::var_os("GDASYNC_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "{} is stale: regenerate it with GDASYNC_BLESS=1 cargo test -p gdasync-c --test header",
        path.display()
    );
}

/// Compiles a file that includes every header (twice: the include guard) with `compiler` and
/// `flags`. A compiler that is not installed fails the test (CI installs clang).
fn compiles(compiler: &str, flags: &[&str], ext: &str) {
    assert!(
        Command::new(compiler).arg("--version").output().is_ok(),
        "{compiler} is not installed: install it (Debian: gcc, g++, clang)"
    );
    let dir =
        std::env::temp_dir().join(format!("gdasync-header-{}-{compiler}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("all.{ext}"));
    std::fs::write(&src, "#include <gdasync.h>\n#include <gdasync.h>\nint main(void) { return gdasync_version() == 0; }\n").unwrap();
    let out = Command::new(compiler)
        .args(flags)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .args(["-fsyntax-only"])
        .arg(&src)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{compiler} {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn headers_compile_as_c99_with_warnings_as_errors() {
    let strict = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"];
    compiles("cc", &strict, "c");
    compiles("clang", &strict, "c");
}

#[test]
fn headers_compile_as_cxx17_with_warnings_as_errors() {
    let strict = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"];
    compiles("c++", &strict, "cpp");
    compiles("clang++", &strict, "cpp");
}
