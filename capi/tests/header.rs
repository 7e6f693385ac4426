//! The checked-in headers are what the Rust declarations generate (run with `GDASYNC_BLESS=1`
//! to rewrite them), and they compile as C99 and C++17 with every warning an error.

use std::collections::BTreeSet;
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

/// Checks, compiled into the test program, that mp.h's constants have the library's values (a
/// negative array size where one differs).
fn constant_checks() -> String {
    use gdasync_c::*;
    use std::ffi::c_int;
    let pairs = [
        ("MP_SUCCESS", MP_SUCCESS),
        ("MP_FAILURE", MP_FAILURE),
        ("MP_API_VERSION", MP_API_VERSION),
        ("MP_PARAM_VERSION", MP_PARAM_VERSION),
        ("MP_PUT_INLINE", MP_PUT_INLINE),
        ("MP_PUT_NOWAIT", MP_PUT_NOWAIT),
        ("MP_WAIT_GEQ", MP_WAIT_GEQ),
        ("MP_WAIT_EQ", MP_WAIT_EQ),
        ("MP_WAIT_AND", MP_WAIT_AND),
        ("MP_JOB_MAX", MP_JOB_MAX as c_int),
        ("MP_DESC_QUEUE_MAX", MP_DESC_QUEUE_MAX as c_int),
        ("MP_IOV_MAX", MP_IOV_MAX),
        (
            "(MP_INIT_WQ_ON_GPU | MP_INIT_RX_CQ_ON_GPU | MP_INIT_TX_CQ_ON_GPU | MP_INIT_DBREC_ON_GPU)",
            MP_INIT_KNOWN_FLAGS,
        ),
    ];
    pairs
        .iter()
        .enumerate()
        .map(|(i, (c, v))| format!("typedef char mp_constant_{i}[({c}) == ({v}) ? 1 : -1];\n"))
        .collect()
}

/// The names of the functions the library exports whose names start with `prefix`.
fn exported(prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for f in std::fs::read_dir(crate_dir().join("src")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub extern \"C\" fn ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.starts_with(prefix) {
                    names.insert(name);
                }
            }
        }
    }
    names
}

/// The names of the functions `header` declares whose names start with `prefix`.
fn declared(header: &str, prefix: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(crate_dir().join("include").join(header)).unwrap();
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = text[at + name.len()..].trim_start();
        let starts_word =
            at == 0 || !text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        if starts_word && after.starts_with('(') && !text[..at].trim_end().ends_with("return") {
            names.insert(name);
        }
    }
    names
}

#[test]
fn mp_h_declares_exactly_the_mp_functions_the_library_exports() {
    let (lib, mut header) = (exported("mp_"), declared("mp.h", "mp_"));
    // mp_init is an inline function of the header (over mp_job_new and mp_init_job).
    assert!(header.remove("mp_init"), "mp.h defines mp_init");
    for inline in ["mp_wait_dword_geq_on_stream", "mp_wait_dword_eq_on_stream"] {
        assert!(header.remove(inline), "mp.h defines {inline}");
    }
    assert!(lib.len() >= 15, "{lib:?}");
    assert_eq!(
        header, lib,
        "mp.h's declarations against the library's mp_ exports"
    );
    assert!(
        declared("gdasync.h", "mp_").is_empty(),
        "gdasync.h declares mp.h's functions: add them to cbindgen.toml's exclude list"
    );
    assert_eq!(declared("gdasync.h", "gdasync_"), exported("gdasync_"));
}

/// Runs `check` with each of `compilers` that is installed; fails when none is (Debian: gcc,
/// g++, clang; CI installs clang).
fn with_each(compilers: &[&str], check: impl Fn(&str)) {
    let installed: Vec<&str> = compilers
        .iter()
        .copied()
        .filter(|c| Command::new(c).arg("--version").output().is_ok())
        .collect();
    assert!(!installed.is_empty(), "none of {compilers:?} is installed");
    installed.into_iter().for_each(check);
}

/// Compiles a file that includes every header (twice: the include guard) with `compiler` and
/// `flags`.
fn compiles(compiler: &str, flags: &[&str], ext: &str) {
    let dir =
        std::env::temp_dir().join(format!("gdasync-header-{}-{compiler}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("all.{ext}"));
    let body = format!(
        "#include <gdasync.h>\n#include <gdasync.h>\n#include <mp.h>\n#include <mp.h>\n{}\nint main(void) {{ return gdasync_version() == 0; }}\n",
        constant_checks()
    );
    std::fs::write(&src, body).unwrap();
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
    with_each(&["cc", "gcc", "clang"], |c| compiles(c, &strict, "c"));
}

#[test]
fn headers_compile_as_cxx17_with_warnings_as_errors() {
    let strict = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"];
    with_each(&["c++", "g++", "clang++"], |c| compiles(c, &strict, "cpp"));
}
