//! CUDA device code checked with clang's CUDA front end, where no GPU, CUDA toolkit or NVRTC
//! is: code that does not compile would otherwise only show on the GPU machine.

/// Stand-ins for the CUDA declarations the device code uses (clang without CUDA headers).
const CUDA_SHIM: &str = r#"
#include <__clang_cuda_builtin_vars.h>
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct uint4 { unsigned x, y, z, w; };
struct ulonglong2 { unsigned long long x, y; };
__device__ uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w);
__device__ ulonglong2 __ldcv(const ulonglong2 *);
__device__ double __ldcv(const double *);
__device__ double __ldcg(const double *);
__device__ void __threadfence_system();
__device__ void __threadfence();
__device__ void __syncthreads();
__device__ unsigned __byte_perm(unsigned, unsigned, unsigned);
__device__ unsigned atomicAdd(unsigned *, unsigned);
__device__ unsigned atomicExch(unsigned *, unsigned);
__device__ unsigned atomicCAS(unsigned *, unsigned, unsigned);
__device__ int min(int, int);
__device__ int max(int, int);
"#;

/// Checks that `src` (after the gdsync header) compiles as CUDA device code in NVRTC mode
/// and in nvcc mode; prints "skipped" where clang++ with its CUDA front end is missing.
pub fn check_cuda(what: &str, src: &str) {
    let dir = std::env::temp_dir().join(format!("gdsync-cuda-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let header = concat!(env!("CARGO_MANIFEST_DIR"), "/gdsync/include/gdsync.cuh");
    let file = dir.join("all.cu");
    std::fs::write(&file, format!("{CUDA_SHIM}\n#include \"{header}\"\n{src}")).unwrap();
    let clang = |extra: &[&str], file: &std::path::Path| {
        std::process::Command::new("clang++")
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
    };
    let probe = dir.join("probe.cu");
    std::fs::write(&probe, format!("{CUDA_SHIM}\n__global__ void k() {{}}\n")).unwrap();
    match clang(&[], &probe) {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("{what}: CUDA compile check skipped (no clang++ with CUDA)");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    }
    for mode in [&["-D__CUDACC_RTC__"][..], &[][..]] {
        let o = clang(mode, &file).unwrap();
        assert!(
            o.status.success(),
            "{what} {mode:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
