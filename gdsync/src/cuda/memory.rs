//! GPU memory: allocation, pointer classification, copies and CUDA IPC.

use super::{check, failed, Cuda};
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use std::sync::Arc;

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
    /// Classifies the memory at `ptr` (a host or device address) with the process's default
    /// handle ([`Cuda::get`]); [`Cuda::memory_kind`] with a handle of your own.
    pub fn of(ptr: u64) -> MemoryKind {
        Cuda::get().map_or(MemoryKind::Host, |c| c.memory_kind(ptr))
    }
}

impl Cuda {
    /// Classifies the memory at `ptr` (a host or device address), through unified addressing:
    /// one driver call (`cuPointerGetAttributes`) for the three attributes that decide, as
    /// staged lists ask for each copy and store on their submit path.
    pub fn memory_kind(&self, ptr: u64) -> MemoryKind {
        use sys::CUpointer_attribute as A;
        if self.gpus.is_empty() || self.bind(0).is_err() {
            return MemoryKind::Host;
        }
        let mut attrs = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        // (The driver leaves each at 0, "not known", for a pointer it does not know.)
        let (mut ty, mut managed, mut ordinal) = (0u32, 0u32, 0i32);
        let mut data = [
            &mut ty as *mut u32 as *mut std::ffi::c_void,
            &mut managed as *mut u32 as *mut std::ffi::c_void,
            &mut ordinal as *mut i32 as *mut std::ffi::c_void,
        ];
        // SAFETY: three attributes, each with a pointer to a local of its type (a
        // CUmemorytype, a boolean as u32, an int); a pointer the driver does not know
        // gets default values, not an error.
        let r =
            unsafe { sys::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // (Not expected: an attribute this driver does not answer together with the
            // others. One query at a time, as before.)
            return self.memory_kind_one_by_one(ptr);
        }
        classify(ty, managed != 0, ordinal)
    }

    /// [`memory_kind`](Self::memory_kind) one attribute per driver call.
    #[cold]
    fn memory_kind_one_by_one(&self, ptr: u64) -> MemoryKind {
        use sys::CUpointer_attribute as A;
        let Some(ty) = pointer_attr::<u32>(ptr, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE) else {
            return MemoryKind::Host;
        };
        let managed = pointer_attr::<u32>(ptr, A::CU_POINTER_ATTRIBUTE_IS_MANAGED).unwrap_or(0);
        let ordinal = pointer_attr(ptr, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL).unwrap_or(0);
        classify(ty, managed != 0, ordinal)
    }
}

/// One pointer attribute (`cuPointerGetAttribute`, which `result` does not wrap), or `None`
/// for a pointer the driver does not know.
fn pointer_attr<T: Default>(ptr: u64, a: sys::CUpointer_attribute) -> Option<T> {
    let mut v = T::default();
    // SAFETY: a query into a local of the attribute's type; an unknown pointer returns an
    // error, not a fault.
    let r = unsafe { sys::cuPointerGetAttribute(&mut v as *mut T as *mut _, a, ptr) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// The kind of memory whose attributes are `ty` (a `CUmemorytype`, 0 where the driver does
/// not know the pointer), `managed` and `ordinal`.
fn classify(ty: u32, managed: bool, ordinal: i32) -> MemoryKind {
    use sys::CUmemorytype as T;
    if ty == 0 {
        return MemoryKind::Host;
    }
    if managed {
        return MemoryKind::Managed;
    }
    if ty == T::CU_MEMORYTYPE_DEVICE as u32 {
        MemoryKind::Device { ordinal }
    } else {
        MemoryKind::PinnedHost
    }
}

/// A buffer of device memory (`cuMemAlloc`), freed on drop.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    ordinal: i32,
    cuda: Arc<Cuda>,
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
    /// Allocates `len` bytes (zeroed) on GPU `ordinal`, with the process's default handle
    /// ([`Cuda::get`]); [`Cuda::alloc`] with a handle of your own.
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        Cuda::get()?.alloc(ordinal, len)
    }

    /// Opens a buffer another process exported with [`DeviceBuffer::ipc_handle`], with the
    /// process's default handle; [`Cuda::open_ipc`] with a handle of your own.
    pub fn open_ipc(ordinal: i32, handle: &IpcHandle, len: usize) -> Result<Self> {
        Cuda::get()?.open_ipc(ordinal, handle, len)
    }

    /// A handle another process can open with [`DeviceBuffer::open_ipc`].
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        self.cuda.bind(self.ordinal)?;
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
    /// The handle it was allocated with.
    pub fn cuda(&self) -> &Arc<Cuda> {
        &self.cuda
    }
    /// Copies `src` into the buffer at `offset` (synchronously).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !crate::bounds::fits(offset, src.len(), self.len) {
            return Err(Error::invalid("copy out of the device buffer"));
        }
        self.cuda
            .copy_htod(self.ordinal, self.ptr + offset as u64, src)
    }
    /// Copies from the buffer at `offset` into `dst` (synchronously).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if !crate::bounds::fits(offset, dst.len(), self.len) {
            return Err(Error::invalid("copy out of the device buffer"));
        }
        self.cuda
            .copy_dtoh(self.ordinal, dst, self.ptr + offset as u64)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // `cuMemFree` waits for the whole device: done on the release thread, so a drop never
        // waits for a stream (see `release`).
        let (ptr, ordinal, imported) = (self.ptr, self.ordinal, self.imported);
        let cuda = self.cuda.clone();
        crate::release::later(move || {
            if cuda.bind(ordinal).is_err() {
                return;
            }
            // SAFETY: our allocation (or IPC mapping), released once (errors are ignored on
            // teardown); its handle is gone.
            unsafe {
                let _ = if imported {
                    check(sys::cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")
                } else {
                    result::free_sync(ptr).map_err(failed("cuMemFree"))
                };
            }
        });
    }
}

impl Cuda {
    /// Allocates `len` bytes (zeroed) on GPU `ordinal`.
    pub fn alloc(self: &Arc<Self>, ordinal: i32, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(Error::invalid(
                "cannot allocate a zero-length device buffer",
            ));
        }
        self.bind(ordinal)?;
        // SAFETY: a new allocation, zeroed below before anyone reads it.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(failed("cuMemAlloc"))?;
        let b = DeviceBuffer {
            ptr,
            len,
            ordinal,
            cuda: self.clone(),
            imported: false,
        };
        // Zeroed on the thread's copy stream, and waited for. (`cuMemsetD8` would go to the
        // legacy default stream and return before it ran; the streams this crate uses do not
        // wait for that one, so a late memset could wipe data copied in or computed after it:
        // seen on a GPU time-shared with another process.)
        let s = super::copy::copy_stream(ordinal)?;
        // SAFETY: ptr/len is the allocation just made; the stream is this thread's.
        unsafe {
            result::memset_d8_async(ptr, 0, len, s).map_err(failed("cuMemsetD8Async"))?;
            result::stream::synchronize(s).map_err(failed("cuStreamSynchronize"))?;
        }
        Ok(b)
    }

    /// Opens a buffer another process exported with [`DeviceBuffer::ipc_handle`].
    pub fn open_ipc(
        self: &Arc<Self>,
        ordinal: i32,
        handle: &IpcHandle,
        len: usize,
    ) -> Result<DeviceBuffer> {
        self.bind(ordinal)?;
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
            cuda: self.clone(),
            imported: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{classify, MemoryKind};
    use cudarc::driver::sys::CUmemorytype as T;

    #[test]
    fn attributes_classify_as_the_driver_means_them() {
        assert_eq!(
            classify(0, false, 0),
            MemoryKind::Host,
            "a pointer the driver does not know"
        );
        assert_eq!(
            classify(T::CU_MEMORYTYPE_HOST as u32, false, 0),
            MemoryKind::PinnedHost
        );
        assert_eq!(
            classify(T::CU_MEMORYTYPE_DEVICE as u32, false, 1),
            MemoryKind::Device { ordinal: 1 }
        );
        assert_eq!(
            classify(T::CU_MEMORYTYPE_DEVICE as u32, true, 0),
            MemoryKind::Managed
        );
    }
}
