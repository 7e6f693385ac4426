//! Kernels compiled at run time with NVRTC (no nvcc-built artifacts are shipped).

use super::{check, Cuda, CudaStream};
use crate::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};

/// A loaded CUDA module.
pub struct Module {
    raw: sys::CUmodule,
    ordinal: i32,
}

// SAFETY: module handles are usable from any thread with the context bound (done per call).
unsafe impl Send for Module {}
// SAFETY: as above; the handle is immutable.
unsafe impl Sync for Module {}

/// A kernel of a [`Module`].
#[derive(Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
    ordinal: i32,
}

// SAFETY: as Module.
unsafe impl Send for Function {}
// SAFETY: as Module.
unsafe impl Sync for Function {}

/// Whether NVRTC (the run-time compiler) can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

impl Module {
    /// Compiles CUDA C++ `src` (prefixed with the gdsync header, [`crate::kernel::HEADER`])
    /// for GPU `ordinal` and loads it.
    pub fn compile(ordinal: i32, src: &str) -> Result<Self> {
        Self::compile_with_options(ordinal, src, &[])
    }

    /// [`compile`](Self::compile) with extra NVRTC options (e.g. `--fmad=false`, for results
    /// that match the CPU's bit for bit).
    pub fn compile_with_options(ordinal: i32, src: &str, extra: &[&str]) -> Result<Self> {
        let c = Cuda::get()?;
        let gpu = c.gpu(ordinal)?;
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
        c.bind(ordinal)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image.
        check(
            unsafe { sys::cuModuleLoadData(&mut raw, text.as_ptr() as *const c_void) },
            "cuModuleLoadData",
        )?;
        Ok(Module { raw, ordinal })
    }

    /// The kernel named `name` (declare it `extern "C"`).
    pub fn function(&self, name: &str) -> Result<Function> {
        Cuda::get()?.bind(self.ordinal)?;
        let n = CString::new(name).map_err(|_| Error::invalid("kernel name with a NUL byte"))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check(
            unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, n.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        Ok(Function {
            raw,
            ordinal: self.ordinal,
        })
    }
}

impl Function {
    /// Launches the kernel on `stream` with `grid` × `block` threads.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of that
    /// parameter's type, and whatever the kernel dereferences must stay valid until it ends.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        Cuda::get()?.bind(self.ordinal)?;
        // SAFETY: the caller guarantees the parameters.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.raw,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.raw(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

impl Function {
    /// Launches the kernel with `grid` × `block` threads that all run at once
    /// (`cuLaunchCooperativeKernel`), so its blocks may wait for each other (a grid-wide
    /// barrier). Refused with an error if the grid cannot be resident on the GPU at once; it
    /// cannot account for other kernels running at the same time, so size the grid for them
    /// too.
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    pub unsafe fn launch_cooperative(
        &self,
        stream: &CudaStream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        Cuda::get()?.bind(self.ordinal)?;
        // SAFETY: the caller guarantees the parameters.
        check(
            unsafe {
                sys::cuLaunchCooperativeKernel(
                    self.raw,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.raw(),
                    params.as_mut_ptr(),
                )
            },
            "cuLaunchCooperativeKernel",
        )
    }

    /// Local memory each thread of the kernel uses (bytes; `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`):
    /// arrays indexed at run time, including kernel parameters indexed so.
    pub fn local_bytes(&self) -> Result<u32> {
        Cuda::get()?.bind(self.ordinal)?;
        let mut n = 0;
        // SAFETY: a loaded function; the result goes into a local.
        check(
            unsafe {
                sys::cuFuncGetAttribute(
                    &mut n,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                    self.raw,
                )
            },
            "cuFuncGetAttribute",
        )?;
        Ok(n.max(0) as u32)
    }

    /// How many blocks of `block` threads (no dynamic shared memory) one multiprocessor can
    /// hold at once.
    pub fn max_blocks_per_multiprocessor(&self, block: u32) -> Result<u32> {
        Cuda::get()?.bind(self.ordinal)?;
        let mut n = 0;
        // SAFETY: a loaded function; the result goes into a local.
        check(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.raw, block as i32, 0)
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(n.max(0) as u32)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if Cuda::get().and_then(|c| c.bind(self.ordinal)).is_ok() {
            // SAFETY: our module, unloaded once.
            unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}
