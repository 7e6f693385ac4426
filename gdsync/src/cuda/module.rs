//! Kernels compiled at run time with NVRTC (no nvcc-built artifacts are shipped).

use super::{check, failed, Cuda};
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use std::ffi::CString;
use std::sync::Arc;

/// A loaded CUDA module.
pub struct Module {
    loaded: Arc<Loaded>,
}

/// The module handle, unloaded when the module and the last of its functions are gone.
struct Loaded {
    raw: sys::CUmodule,
    ordinal: i32,
    cuda: Arc<Cuda>,
}

// SAFETY: module handles are usable from any thread with the context bound (done per call).
unsafe impl Send for Loaded {}
// SAFETY: as above; the handle is immutable.
unsafe impl Sync for Loaded {}

/// A kernel of a [`Module`] (which it keeps loaded).
#[derive(Clone)]
pub struct Function {
    raw: sys::CUfunction,
    module: Arc<Loaded>,
}

// SAFETY: as Loaded.
unsafe impl Send for Function {}
// SAFETY: as Loaded.
unsafe impl Sync for Function {}

/// Whether NVRTC (the run-time compiler) can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

impl Cuda {
    /// Compiles CUDA C++ `src` (prefixed with the gdsync header, [`crate::kernel::HEADER`])
    /// for GPU `ordinal` and loads it, with extra NVRTC options (e.g. `--fmad=false`, for
    /// results that match the CPU's bit for bit).
    pub fn compile(self: &Arc<Self>, ordinal: i32, src: &str, extra: &[&str]) -> Result<Module> {
        let gpu = self.gpu(ordinal)?;
        if !nvrtc_available() {
            return Err(Error::NoCuda(
                "NVRTC (libnvrtc.so) is not installed: kernels cannot be compiled".into(),
            ));
        }
        let full = format!("{}\n{}", crate::kernel_header::HEADER, src);
        let (maj, min) = gpu.compute_capability;
        let arch = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some(arch),
            options: std::iter::once("-std=c++17")
                .chain(extra.iter().copied())
                .map(String::from)
                .collect(),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(full, opts)
            .map_err(|e| Error::Unsupported(format!("NVRTC compile failed: {e:?}")))?;
        let text = CString::new(ptx.to_src()).map_err(|_| Error::invalid("PTX with a NUL byte"))?;
        self.bind(ordinal)?;
        // SAFETY: a NUL-terminated PTX image.
        let raw = unsafe { result::module::load_data(text.as_ptr().cast()) }
            .map_err(failed("cuModuleLoadData"))?;
        Ok(Module {
            loaded: Arc::new(Loaded {
                raw,
                ordinal,
                cuda: self.clone(),
            }),
        })
    }
}

impl Module {
    /// Compiles CUDA C++ `src` (prefixed with the gdsync header, [`crate::kernel::HEADER`])
    /// for GPU `ordinal` and loads it, with the process's default handle ([`Cuda::get`]);
    /// [`Cuda::compile`] with a handle of your own.
    pub fn compile(ordinal: i32, src: &str) -> Result<Self> {
        Self::compile_with_options(ordinal, src, &[])
    }

    /// [`compile`](Self::compile) with extra NVRTC options (e.g. `--fmad=false`, for results
    /// that match the CPU's bit for bit).
    pub fn compile_with_options(ordinal: i32, src: &str, extra: &[&str]) -> Result<Self> {
        Cuda::get()?.compile(ordinal, src, extra)
    }

    /// The kernel named `name` (declare it `extern "C"`).
    pub fn function(&self, name: &str) -> Result<Function> {
        let m = &self.loaded;
        m.cuda.bind(m.ordinal)?;
        let n = CString::new(name).map_err(|_| Error::invalid("kernel name with a NUL byte"))?;
        // SAFETY: a loaded module.
        let raw = unsafe { result::module::get_function(m.raw, n) }
            .map_err(failed("cuModuleGetFunction"))?;
        Ok(Function {
            raw,
            module: m.clone(),
        })
    }
}

impl Function {
    pub(super) fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// Makes the function's context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        self.module.cuda.bind(self.module.ordinal)
    }

    /// Loads the kernel's code onto its GPU now, where the driver would load it at its first
    /// launch (CUDA's lazy loading, the default since CUDA 12.2). A load may wait for the GPU
    /// to go idle, which never happens while a stream spins in a wait: a kernel first launched
    /// then would never start. Needs a 12.4 driver (`cuFuncLoad`); on an older one this does
    /// nothing: launch the kernel once before any stream waits instead (a new stream of ours
    /// runs the staging kernels once as it is made).
    pub fn load_now(&self) -> Result<()> {
        if self.module.cuda.driver_version < 12040 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: a function of a loaded module (kept loaded by `self`); the symbol exists
        // from driver 12.4 on, checked above.
        check(unsafe { sys::cuFuncLoad(self.raw) }, "cuFuncLoad")
    }

    /// Local memory each thread of the kernel uses (bytes; `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`):
    /// arrays indexed at run time, including kernel parameters indexed so.
    pub fn local_bytes(&self) -> Result<u32> {
        self.bind()?;
        // SAFETY: a function of a loaded module (kept loaded by `self`).
        let n = unsafe {
            result::function::get_function_attribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            )
        }
        .map_err(failed("cuFuncGetAttribute"))?;
        Ok(n.max(0) as u32)
    }

    /// How many blocks of `block` threads (no dynamic shared memory) one multiprocessor can
    /// hold at once.
    pub fn max_blocks_per_multiprocessor(&self, block: u32) -> Result<u32> {
        self.bind()?;
        // SAFETY: as local_bytes.
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(self.raw, block as i32, 0)
        }
        .map_err(failed("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(n.max(0) as u32)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if self.cuda.bind(self.ordinal).is_ok() {
            // SAFETY: our module, unloaded once, when nothing uses its functions any more
            // (errors are ignored on teardown).
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}
