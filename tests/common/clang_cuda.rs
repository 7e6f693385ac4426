//! clang++ as a CUDA syntax checker: the command line and stand-ins for the CUDA declarations
//! (clang without CUDA headers), and whether this machine's clang++ takes CUDA at all. Used by
//! the tests (`clang.rs`) and by build.rs, which marks the tests that need it ignored where it
//! is missing; std only for that reason.

use std::path::Path;
use std::process::{Command, Output};

/// Stand-ins for the CUDA declarations the device code uses (clang without CUDA headers).
pub const CUDA_SHIM: &str = r#"
#include <__clang_cuda_builtin_vars.h>
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
struct uint4 { unsigned x, y, z, w; };
struct ulonglong2 { unsigned long long x, y; };
__device__ uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w);
__device__ ulonglong2 __ldcv(const ulonglong2 *);
__device__ double __ldcv(const double *);
__device__ double __ldcg(const double *);
__device__ void __threadfence_system();
__device__ void __threadfence();
__device__ void __syncthreads();
__device__ int __syncthreads_or(int);
__device__ void __syncwarp(unsigned = 0xFFFFFFFFu);
__device__ int __shfl_sync(unsigned, int, int);
__device__ unsigned long long __shfl_sync(unsigned, unsigned long long, int);
__device__ unsigned __byte_perm(unsigned, unsigned, unsigned);
__device__ unsigned atomicAdd(unsigned *, unsigned);
__device__ unsigned atomicExch(unsigned *, unsigned);
__device__ unsigned atomicCAS(unsigned *, unsigned, unsigned);
__device__ int min(int, int);
__device__ int max(int, int);
"#;

/// clang++ checking `file` as CUDA device code (syntax and types only, warnings as errors),
/// with `extra` arguments.
pub fn clang_cuda(extra: &[&str], file: &Path) -> std::io::Result<Output> {
    Command::new("clang++")
        .args([
            "-x",
            "cuda",
            "--cuda-device-only",
            "-nocudainc",
            "-nocudalib",
            "--cuda-gpu-arch=sm_80",
            "-std=c++17",
            "-D__CUDACC__",
            "-fsyntax-only",
            "-Werror",
            "-Wno-pragma-once-outside-header",
        ])
        .args(extra)
        .arg(file)
        .output()
}

/// Whether clang++ is installed with its CUDA front end: it checks an empty kernel, written
/// to `dir`.
pub fn clang_cuda_works(dir: &Path) -> bool {
    let probe = dir.join("clang-cuda-probe.cu");
    let written = std::fs::write(&probe, format!("{CUDA_SHIM}\n__global__ void k() {{}}\n"));
    let works = written.is_ok() && clang_cuda(&[], &probe).is_ok_and(|o| o.status.success());
    let _ = std::fs::remove_file(&probe);
    works
}
