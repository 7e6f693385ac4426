//! GPU memory: allocation, pointer classification, copies and CUDA IPC.

use super::{check, Cuda};
use crate::{Error, Result};
use cudarc::driver::sys;

/// Where a pointer's memory lives, detected through unified addressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary (pageable) host memory, or no CUDA on this machine.
    Host,
    /// Host memory pinned and mapped for the GPU (`cudaMallocHost`, `cuMemHostRegister`).
    PinnedHost,
    /// Device memory of GPU `ordinal`.
    Device {
        /// The GPU.
        ordinal: i32,
    },
    /// Managed (unified) memory.
    Managed,
}

impl MemoryKind {
    /// Classifies the memory at `ptr` (a host or device address).
    pub fn of(ptr: u64) -> MemoryKind {
        let Ok(c) = Cuda::get() else {
            return MemoryKind::Host;
        };
        if c.gpus.is_empty() || c.bind(0).is_err() {
            return MemoryKind::Host;
        }
        let mut ty: u32 = 0;
        // SAFETY: queries into locals; an unknown pointer returns an error, not a fault.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut ty as *mut u32 as *mut _,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return MemoryKind::Host;
        }
        let mut managed: u32 = 0;
        // SAFETY: as above.
        unsafe {
            sys::cuPointerGetAttribute(
                &mut managed as *mut u32 as *mut _,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                ptr,
            )
        };
        if managed != 0 {
            return MemoryKind::Managed;
        }
        if ty == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            let mut ordinal: i32 = 0;
            // SAFETY: as above.
            unsafe {
                sys::cuPointerGetAttribute(
                    &mut ordinal as *mut i32 as *mut _,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    ptr,
                )
            };
            MemoryKind::Device { ordinal }
        } else {
            MemoryKind::PinnedHost
        }
    }
}

/// A buffer of device memory (`cuMemAlloc`), freed on drop.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    ordinal: i32,
    /// Imported through CUDA IPC: closed, not freed.
    imported: bool,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

/// A CUDA IPC handle: 64 opaque bytes another process on the host can open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl DeviceBuffer {
    /// Allocates `len` bytes (zeroed) on GPU `ordinal`.
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(
                "cannot allocate a zero-length device buffer",
            ));
        }
        let c = Cuda::get()?;
        c.bind(ordinal)?;
        let mut ptr = 0;
        // SAFETY: allocation into a local.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len) }, "cuMemAlloc")?;
        let b = DeviceBuffer {
            ptr,
            len,
            ordinal,
            imported: false,
        };
        // Zeroed on the thread's copy stream, and waited for. (`cuMemsetD8` would go to the
        // legacy default stream and return before it ran; the streams this crate uses do not
        // wait for that one, so a late memset could wipe data copied in or computed after it:
        // seen on a GPU time-shared with another process.)
        let s = copy_stream(ordinal)?;
        // SAFETY: ptr/len is the allocation just made; the stream is this thread's.
        unsafe {
            check(sys::cuMemsetD8Async(ptr, 0, len, s), "cuMemsetD8Async")?;
            check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")?;
        }
        Ok(b)
    }

    /// Opens a buffer another process exported with [`DeviceBuffer::ipc_handle`].
    pub fn open_ipc(ordinal: i32, handle: &IpcHandle, len: usize) -> Result<Self> {
        let c = Cuda::get()?;
        c.bind(ordinal)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle.0) {
            *d = s as std::ffi::c_char;
        }
        let mut ptr = 0;
        // SAFETY: the handle is plain data; the driver validates it.
        check(
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            },
            "cuIpcOpenMemHandle",
        )?;
        Ok(DeviceBuffer {
            ptr,
            len,
            ordinal,
            imported: true,
        })
    }

    /// A handle another process can open with [`DeviceBuffer::open_ipc`].
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        Cuda::get()?.bind(self.ordinal)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: ptr is a live allocation of ours.
        check(
            unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) },
            "cuIpcGetMemHandle",
        )?;
        let mut out = [0u8; 64];
        for (d, s) in out.iter_mut().zip(h.reserved) {
            *d = s as u8;
        }
        Ok(IpcHandle(out))
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The GPU it lives on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
    /// Copies `src` into the buffer at `offset` (synchronously).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !crate::bounds::fits(offset, src.len(), self.len) {
            return Err(Error::invalid("copy out of the device buffer"));
        }
        copy_htod(self.ordinal, self.ptr + offset as u64, src)
    }
    /// Copies from the buffer at `offset` into `dst` (synchronously).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if !crate::bounds::fits(offset, dst.len(), self.len) {
            return Err(Error::invalid("copy out of the device buffer"));
        }
        copy_dtoh(self.ordinal, dst, self.ptr + offset as u64)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // `cuMemFree` waits for the whole device: done on the release thread, so a drop never
        // waits for a stream (see `release`).
        let (ptr, ordinal, imported) = (self.ptr, self.ordinal, self.imported);
        crate::release::later(move || {
            let Ok(c) = Cuda::get() else { return };
            if c.bind(ordinal).is_ok() {
                // SAFETY: our allocation (or IPC mapping), released once; its handle is gone.
                unsafe {
                    if imported {
                        sys::cuIpcCloseMemHandle(ptr);
                    } else {
                        sys::cuMemFree_v2(ptr);
                    }
                }
            }
        });
    }
}

/// The calling thread's own stream on GPU `ordinal`, for the soft device's data moves: the
/// engine copies on a non-blocking stream of its own, not the legacy default stream.
fn copy_stream(ordinal: i32) -> Result<sys::CUstream> {
    thread_local!(static STREAMS: std::cell::RefCell<Vec<(i32, usize)>> = const { std::cell::RefCell::new(Vec::new()) });
    if let Some(s) = STREAMS.with(|v| {
        v.borrow()
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, s)| *s)
    }) {
        return Ok(s as sys::CUstream);
    }
    // Never destroyed: it lives as long as the thread, and the driver reclaims it at exit.
    let raw = super::new_stream(ordinal)?;
    STREAMS.with(|v| v.borrow_mut().push((ordinal, raw as usize)));
    Ok(raw)
}

/// Copies host bytes to device address `dst` of GPU `ordinal` (on the thread's copy stream,
/// waiting for the copy).
pub(crate) fn copy_htod(ordinal: i32, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    Cuda::get()?.bind(ordinal)?;
    let s = copy_stream(ordinal)?;
    // SAFETY: the caller checked that dst..dst+len lies in a live device region; src is a
    // slice that outlives the copy (we synchronise before returning).
    unsafe {
        check(
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const _, src.len(), s),
            "cuMemcpyHtoDAsync",
        )?;
        check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")
    }
}

/// Copies from device address `src` of GPU `ordinal` into host bytes (on the thread's copy
/// stream, waiting for the copy).
pub(crate) fn copy_dtoh(ordinal: i32, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    Cuda::get()?.bind(ordinal)?;
    let s = copy_stream(ordinal)?;
    // SAFETY: as copy_htod.
    unsafe {
        check(
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut _, src, dst.len(), s),
            "cuMemcpyDtoHAsync",
        )?;
        check(sys::cuStreamSynchronize(s), "cuStreamSynchronize")
    }
}
