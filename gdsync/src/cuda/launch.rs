//! Typed kernel launches, as cudarc's `LaunchArgs`: the arguments are pushed by reference in
//! the kernel's parameter order and borrowed until the launch, and ordinary and cooperative
//! grids go through one call.

use super::{failed, CudaStream, Function};
use crate::Result;
use cudarc::driver::result;
use std::ffi::c_void;
use std::marker::PhantomData;

/// A value a kernel may take as a parameter: plain data that the GPU reads, byte for byte, as
/// the parameter's type.
///
/// # Safety
/// The type is a primitive or `#[repr(C)]` plain data with the layout of the kernel
/// parameter it is passed as.
pub unsafe trait KernelArg: Copy {}

macro_rules! kernel_args {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive, laid out as the CUDA C++ type of its size.
        unsafe impl KernelArg for $t {}
    )* };
}
kernel_args!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, bool, usize, isize);

/// The arguments of one launch of a [`Function`] on a stream
/// ([`Function::launch_builder`]).
pub struct LaunchArgs<'a> {
    func: &'a Function,
    stream: &'a CudaStream,
    /// Pointers to the pushed values (the driver copies them at launch).
    args: Vec<*mut c_void>,
    _values: PhantomData<&'a ()>,
}

impl Function {
    /// A launch of this kernel on `stream`: push its arguments with [`LaunchArgs::arg`], in
    /// the kernel's parameter order, then [`LaunchArgs::launch`] (or
    /// [`LaunchArgs::launch_cooperative`]).
    pub fn launch_builder<'a>(&'a self, stream: &'a CudaStream) -> LaunchArgs<'a> {
        LaunchArgs::new(self, stream)
    }
}

impl<'a> LaunchArgs<'a> {
    pub(super) fn new(func: &'a Function, stream: &'a CudaStream) -> Self {
        Self {
            func,
            stream,
            args: Vec::new(),
            _values: PhantomData,
        }
    }

    /// Pushes the next parameter's value.
    pub fn arg<T: KernelArg>(&mut self, value: &'a T) -> &mut Self {
        // The driver only reads through the pointer (it copies the value at launch).
        self.args.push(value as *const T as *mut c_void);
        self
    }

    /// Launches the kernel with `grid` × `block` threads.
    ///
    /// # Safety
    /// The pushed values match the kernel's parameters in number and type, and whatever the
    /// kernel dereferences stays valid until it ends.
    pub unsafe fn launch(&mut self, grid: u32, block: u32) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.go(grid, block, false) }
    }

    /// Launches the kernel with `grid` × `block` threads that all run at once
    /// (`cuLaunchCooperativeKernel`), so its blocks may wait for each other (a grid-wide
    /// barrier). Refused with an error if the grid cannot be resident on the GPU at once; it
    /// cannot account for other kernels running at the same time, so size the grid for them
    /// too.
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    pub unsafe fn launch_cooperative(&mut self, grid: u32, block: u32) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.go(grid, block, true) }
    }

    /// # Safety
    /// As [`launch`](Self::launch).
    unsafe fn go(&mut self, grid: u32, block: u32, cooperative: bool) -> Result<()> {
        self.func.bind()?;
        let (f, s, args) = (self.func.raw(), self.stream.raw(), &mut self.args[..]);
        let (grid, block) = ((grid, 1, 1), (block, 1, 1));
        let _open = crate::quiet::enqueuing();
        // SAFETY: a function of a loaded module and a live stream of its GPU; the caller
        // guarantees the arguments.
        unsafe {
            if cooperative {
                result::launch_cooperative_kernel(f, grid, block, 0, s, args)
                    .map_err(failed("cuLaunchCooperativeKernel"))
            } else {
                result::launch_kernel(f, grid, block, 0, s, args).map_err(failed("cuLaunchKernel"))
            }
        }
    }
}
