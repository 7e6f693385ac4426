//! GPU tests of the GPUs' address of host memory: registered memory is reached by streams and
//! kernels at its device pointer (`cuMemHostGetDevicePointer`), which the library asks for at
//! every registration and hands to everything a GPU executes. Each is ignored unless asked for
//! (`GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_addr -- --include-ignored`), and then
//! requires a GPU.

mod common;

use common::gpu::gpu;
use gdasync::gdsync::cuda::{Cuda, CudaStream, Module};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::PinnedBuffer;

const PUT: &str = r#"
extern "C" __global__ void put(uint64_t addr, uint32_t value) { gds_signal32(addr, value); }
"#;

/// Pinned host memory: the library's GPU address is the driver's device pointer (printed next
/// to the host address: equal on the H100/H200, where registered host pointers are device
/// pointers), and a stream write and a kernel write through it land in the host's view.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_addr -- --include-ignored"]
fn registered_memory_is_written_by_streams_and_kernels_at_its_device_pointer() {
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let b = PinnedBuffer::new(64);
    assert!(b.gpu_mapped(), "pinned memory is mapped for the GPU");
    let dptr = cuda.host_device_pointer(b.addr()).unwrap();
    println!(
        "pinned buffer: host {:#x}, device pointer {dptr:#x}",
        b.addr()
    );
    assert_eq!(
        b.gpu_addr(),
        dptr,
        "the library's GPU address is the driver's"
    );
    let caps = &cuda.gpu(0).unwrap().caps;
    if caps.unified_addressing && caps.host_pointer_for_registered_mem {
        assert_eq!(dptr, b.addr(), "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM");
    }
    // A stream write (the op list names the word by its host address; the stream runs it at
    // the device pointer).
    let s = CudaStream::new(0).unwrap();
    s.submit(b.write32(0, 0x5EED_0001)).unwrap();
    s.synchronize().unwrap();
    let mut w = [0u8; 4];
    b.read_at(0, &mut w);
    assert_eq!(u32::from_ne_bytes(w), 0x5EED_0001, "stream write");
    // A kernel write at the GPU address.
    let m = Module::compile(0, PUT).unwrap();
    let f = m.function("put").unwrap();
    let (at, v) = (b.gpu_addr() + 4, 0x5EED_0002u32);
    let mut l = f.launch_builder(&s);
    l.arg(&at).arg(&v);
    // SAFETY: two parameters matching put's signature; the buffer is pinned host memory that
    // outlives the kernel (synchronised below).
    unsafe { l.launch(1, 1).unwrap() };
    s.synchronize().unwrap();
    b.read_at(4, &mut w);
    assert_eq!(u32::from_ne_bytes(w), 0x5EED_0002, "kernel write");
}

/// Memory CUDA never registered has no device pointer: the driver refuses, and the library
/// says so (the path by which a doorbell page without a GPU address goes to the CPU proxy).
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_addr -- --include-ignored"]
fn unregistered_memory_has_no_device_pointer() {
    let _gpu = gpu();
    let plain = vec![0u64; 512];
    let e = Cuda::get()
        .unwrap()
        .host_device_pointer(plain.as_ptr() as u64)
        .unwrap_err();
    assert!(e.to_string().contains("cuMemHostGetDevicePointer"), "{e}");
}
