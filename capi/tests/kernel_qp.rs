//! Handing a QP made through the C API to a kernel: bad input to the hand-over functions, and
//! `kernel_qp_host.cpp` (gdasync.h and gdsync.cuh compiled together by clang++, linked against
//! libgdasync) driving such QPs with gdsync.cuh's functions on the CPU, in a kernel's place.

mod common;
// Only clang_cuda and CUDA_SHIM are used here.
#[allow(dead_code)]
#[path = "../../tests/common/clang_cuda.rs"]
mod clang_cuda;

use common::{last, refused};
use gdasync_c::*;
use gdsync::kernel::QpDesc;
use std::ffi::c_int;
use std::path::PathBuf;
use std::ptr::{null, null_mut};

#[track_caller]
fn ok(rc: c_int) {
    assert_eq!(rc, GDASYNC_OK, "{}", last());
}

/// A soft device, a PD, and a QP whose CQs are `scq` and `rcq` (made of `entries` each;
/// `shared`: one CQ for both).
fn qp(entries: u32, shared: bool) -> (*mut gdasync_device, *mut gdasync_pd, *mut gdasync_qp) {
    let (mut dev, mut pd, mut scq, mut rcq, mut qp) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    ok(gdasync_device_open(c"soft".as_ptr(), &mut dev));
    ok(gdasync_pd_alloc(dev, &mut pd));
    ok(gdasync_cq_create(dev, entries, &mut scq));
    ok(gdasync_cq_create(dev, entries, &mut rcq));
    let r = if shared { scq } else { rcq };
    ok(gdasync_qp_create(pd, scq, r, null(), &mut qp));
    // The QP keeps its CQs alive.
    ok(gdasync_cq_destroy(scq));
    ok(gdasync_cq_destroy(rcq));
    (dev, pd, qp)
}

#[test]
fn hand_over_bad_input_is_refused_by_name() {
    let mut d = QpDesc::default();
    let mut p = gdsync::kernel::DeviceQpProgress::default();
    let mut m = 7u32;
    refused(
        gdasync_qp_to_kernel(null_mut(), &mut d),
        GDASYNC_ERR_NULL,
        "qp (gdasync_qp) is NULL",
    );
    let (dev, pd, q) = qp(256, false);
    refused(
        gdasync_qp_to_kernel(q, null_mut()),
        GDASYNC_ERR_NULL,
        "gdasync_qp_to_kernel: desc is NULL",
    );
    let misaligned = (&mut d as *mut QpDesc).cast::<u8>().wrapping_add(1);
    refused(
        gdasync_qp_to_kernel(q, misaligned.cast()),
        GDASYNC_ERR_INVALID,
        "desc",
    );
    // Of the CPU still: the kernel's functions refuse it.
    refused(
        gdasync_qp_kernel_desc(q, &mut d),
        GDASYNC_ERR_STATE,
        "driven by the CPU",
    );
    refused(
        gdasync_qp_kernel_progress(q, &mut p),
        GDASYNC_ERR_STATE,
        "driven by the CPU",
    );
    refused(
        gdasync_qp_kernel_gpu_mapped(q, &mut m),
        GDASYNC_ERR_STATE,
        "driven by the CPU",
    );
    refused(
        gdasync_qp_to_host(q),
        GDASYNC_ERR_STATE,
        "driven by the CPU already",
    );
    // Another type's handle, and NULL out-parameters.
    refused(
        gdasync_qp_to_kernel(pd.cast(), &mut d),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_qp",
    );
    ok(gdasync_qp_to_kernel(q, &mut d));
    assert!(d.qpn != 0 && d.sq != 0, "{d:?}");
    refused(
        gdasync_qp_kernel_desc(q, null_mut()),
        GDASYNC_ERR_NULL,
        "out is NULL",
    );
    refused(
        gdasync_qp_kernel_progress(q, null_mut()),
        GDASYNC_ERR_NULL,
        "out is NULL",
    );
    refused(
        gdasync_qp_kernel_gpu_mapped(q, null_mut()),
        GDASYNC_ERR_NULL,
        "out is NULL",
    );
    ok(gdasync_qp_kernel_progress(q, &mut p));
    assert_eq!(p.sends_posted, 0);
    ok(gdasync_qp_kernel_gpu_mapped(q, &mut m));
    assert!(m <= 1);
    let mut ep = [0 as std::ffi::c_char; GDASYNC_ENDPOINT_MAX];
    refused(
        gdasync_qp_endpoint(q, ep.as_mut_ptr(), ep.len()),
        GDASYNC_ERR_STATE,
        "driven by a GPU kernel",
    );
    ok(gdasync_qp_to_host(q));
    // Destroyed: every function refuses the handle.
    ok(gdasync_qp_destroy(q));
    refused(
        gdasync_qp_to_kernel(q, &mut d),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_qp",
    );
    refused(
        gdasync_qp_to_host(q),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_qp",
    );
    refused(
        gdasync_qp_kernel_desc(q, &mut d),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_qp",
    );
    ok(gdasync_pd_free(pd));
    ok(gdasync_device_close(dev));
}

/// A QP a kernel could not drive safely is refused with the reason, and left to the CPU: it
/// still posts and is destroyed as usual; a QP with a kernel is destroyed as usual too.
#[test]
fn a_refused_hand_over_leaves_the_qp_to_the_cpu() {
    let mut d = QpDesc::default();
    for (entries, shared, why) in [(256, true, "alone"), (16, false, "overrun")] {
        let (dev, pd, q) = qp(entries, shared);
        refused(gdasync_qp_to_kernel(q, &mut d), GDASYNC_ERR_INVALID, why);
        assert_eq!(d.qpn, 0, "nothing written on failure");
        ok(gdasync_qp_post_recv(q, 1, null(), 0, null_mut()));
        let mut n = 0;
        ok(gdasync_qp_num(q, &mut n));
        ok(gdasync_qp_destroy(q));
        ok(gdasync_pd_free(pd));
        ok(gdasync_device_close(dev));
    }
    let (dev, pd, q) = qp(256, false);
    ok(gdasync_qp_to_kernel(q, &mut d));
    ok(gdasync_qp_destroy(q));
    ok(gdasync_pd_free(pd));
    ok(gdasync_device_close(dev));
}

/// The folder of the library this test links (cargo builds the cdylib beside it).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

#[test]
#[cfg_attr(
    not(clangxx),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch capi/build.rs)"
)]
fn gdsync_cuh_drives_a_qp_made_through_gdasync_h() {
    let capi = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = capi.parent().unwrap();
    let lib = lib_dir();
    assert!(
        lib.join("libgdasync_c.so").exists(),
        "no libgdasync_c.so beside the test in {}",
        lib.display()
    );
    // The program finds the library by its soname, as an installed one.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kernel_qp_host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(lib.join("libgdasync_c.so"), dir.join("libgdasync.so.0")).unwrap();
    let exe = dir.join("kernel_qp_host");
    let out = std::process::Command::new("clang++")
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(capi.join("include"))
        .arg("-I")
        .arg(root.join("gdsync/include"))
        .arg("-I")
        .arg(root.join("tests/common"))
        .arg(capi.join("tests/kernel_qp_host.cpp"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .args(["-lgdasync_c", "-o"])
        .arg(&exe)
        .output()
        .expect("clang++ starts");
    assert!(
        out.status.success(),
        "kernel_qp_host.cpp does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(
        run.status.success(),
        "kernel_qp_host failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("600 sends and writes"), "{stdout}");
}

/// The GPU test's kernel (`kernels/c_api_qp.cu`) compiles as CUDA after the header as NVRTC
/// gets it, in NVRTC mode and in nvcc mode: checked with clang where no GPU is.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch capi/build.rs)"
)]
fn the_gpu_tests_kernel_compiles_as_cuda() {
    compiles_as_cuda("c_api_qp.cu", include_str!("kernels/c_api_qp.cu"));
}

/// Checks with clang that `kernel` compiles as CUDA after the header as NVRTC gets it, in
/// NVRTC mode and in nvcc mode.
fn compiles_as_cuda(name: &str, kernel: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("all.cu");
    let src = format!(
        "{}\n{}\n{kernel}",
        clang_cuda::CUDA_SHIM,
        gdsync::kernel::HEADER
    );
    std::fs::write(&file, src).unwrap();
    for mode in [&["-D__CUDACC_RTC__"][..], &[][..]] {
        let o = clang_cuda::clang_cuda(mode, &file).unwrap();
        assert!(
            o.status.success(),
            "{name} {mode:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kernel of the C example `examples/c/kernel_qp.c` (a C string there, which NVRTC
/// compiles at run time after the installed gdsync.cuh) compiles as CUDA after the header, in
/// NVRTC mode and in nvcc mode: checked with clang where no GPU is.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch capi/build.rs)"
)]
fn the_c_examples_kernel_compiles_as_cuda() {
    let c = include_str!("../../examples/c/kernel_qp.c");
    let kernel = c_string_after(c, "KERNEL_SRC =");
    assert!(kernel.contains("__global__ void drive("), "{kernel}");
    // The header comes first here, as NVRTC's include of it puts it.
    compiles_as_cuda(
        "kernel_qp.c",
        &kernel.replace("#include \"gdsync.cuh\"", ""),
    );
}

/// The text of the C string literal (adjacent literals, one per line, up to the `;`) that
/// follows `marker` in `c`.
fn c_string_after(c: &str, marker: &str) -> String {
    let at = c.find(marker).expect("the marker is in the C file") + marker.len();
    let mut text = String::new();
    for line in c[at..].lines().map(str::trim).filter(|l| !l.is_empty()) {
        let lit = line.trim_end_matches(';');
        let body = lit
            .strip_prefix('"')
            .and_then(|l| l.strip_suffix('"'))
            .unwrap_or_else(|| panic!("not a string literal line: {line}"));
        text.push_str(&body.replace("\\n", "\n").replace("\\\"", "\""));
        if line.ends_with(';') {
            return text;
        }
    }
    panic!("the string after {marker} has no end")
}
