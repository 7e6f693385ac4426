//! CUDA device code checked where no GPU, CUDA toolkit or NVRTC is: with clang's CUDA front
//! end (code that does not compile would otherwise only show on the GPU machine). The tests
//! that call [`check_cuda`] are ignored where clang++ with CUDA was missing when they were
//! built (`cfg(clang_cuda)`, set by build.rs).

use super::clang_cuda::{clang_cuda, clang_cuda_works, CUDA_SHIM};
use gdasync::gdsync::cuda::{nvrtc_available, Cuda, Module};
use gdasync::gdsync::kernel::HEADER;

/// Checks that `src` (after the gdsync header) compiles as CUDA device code: with clang++ in
/// NVRTC mode and in nvcc mode; where clang++ is missing (a GPU machine running the ignored
/// tests too), with NVRTC for the GPU; panics where neither can compile it.
pub fn check_cuda(what: &str, src: &str) {
    let dir = std::env::temp_dir().join(format!("gdsync-cuda-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if clang_cuda_works(&dir) {
        check_with_clang(what, src, &dir);
    } else if Cuda::available() && nvrtc_available() {
        let _gpu = super::gpu::gpu();
        if let Err(e) = Module::compile(0, src) {
            panic!("{what} does not compile with NVRTC: {e}");
        }
    } else {
        panic!(
            "{what}: compiling CUDA code needs clang++ with its CUDA front end (apt-get install \
             clang) or a CUDA GPU with NVRTC; this machine has neither"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn check_with_clang(what: &str, src: &str, dir: &std::path::Path) {
    // The header as NVRTC gets it (`Module::compile` puts this text before the source): the
    // generated gdsync_format.h, then gdsync.cuh, in a folder where no include resolves.
    let file = dir.join("all.cu");
    std::fs::write(&file, format!("{CUDA_SHIM}\n{HEADER}\n{src}")).unwrap();
    for mode in [&["-D__CUDACC_RTC__"][..], &[][..]] {
        let o = clang_cuda(mode, &file).unwrap();
        assert!(
            o.status.success(),
            "{what} {mode:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
