//! GPU tests of staging: a CUDA stream copies GPU payloads through pinned bounce slots with
//! its copy engine, between its memory operations and in their order. Each is ignored unless
//! asked for (`GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored`),
//! and then requires a GPU.

mod common;

use common::gpu::gpu;
use gdasync::gdsync::cuda::Cuda;
use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer, Module};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::ops::{Op, WaitCond};
use gdasync::gdsync::staging::Staging;
use gdasync::gdsync::PinnedBuffer;
use std::sync::Arc;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 7) as u8).collect()
}

/// Device to device through two staging buffers (the wire between them a copy of slot to
/// slot) at odd sizes and offsets across chunk boundaries: every byte arrives, nothing
/// around the range changes.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored"]
fn a_stream_stages_gpu_payloads_byte_for_byte() {
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let s = CudaStream::new(0).unwrap();
    let (tx, rx) = (
        Staging::new(4096, Some(cuda)),
        Staging::new(4096, Some(cuda)),
    );
    for (len, off) in [(1, 0), (7, 3), (4095, 1), (4097, 5), (3 * 4096 + 17, 11)] {
        let total = len + 2 * off + 8;
        let src = Arc::new(DeviceBuffer::alloc(0, total).unwrap());
        let dst = Arc::new(DeviceBuffer::alloc(0, total).unwrap());
        let want = pattern(total);
        src.copy_from_host(0, &want).unwrap();
        dst.copy_from_host(0, &vec![0xee; total]).unwrap();
        for c in tx.chunks(len) {
            let mut ops = tx.copy_out_of_device(c.slot, &src, off + c.offset, c.len);
            let wire = Op::Copy {
                dst: rx.slot_addr(c.slot),
                src: tx.slot_addr(c.slot),
                len: c.len as u64,
            };
            // SAFETY: both slots lie in the staging buffers, which the list keeps alive
            // (appended below).
            unsafe { ops.push_raw(wire) };
            ops.append(rx.copy_in_to_device(c.slot, &dst, off + c.offset, c.len));
            s.submit(ops).unwrap();
        }
        s.synchronize().unwrap();
        let mut got = vec![0u8; total];
        dst.copy_to_host(0, &mut got).unwrap();
        assert_eq!(
            &got[off..off + len],
            &want[off..off + len],
            "{len} bytes at {off}"
        );
        assert!(
            got[..off]
                .iter()
                .chain(&got[off + len..])
                .all(|&b| b == 0xee),
            "{len} at {off}"
        );
    }
}

/// The receive side copies in only after its wait: a copy queued behind a wait on a flag
/// has not run while the flag is unset, and has once the CPU sets it.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored"]
fn a_stream_copies_in_after_its_wait() {
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let s = CudaStream::new(0).unwrap();
    let rx = Staging::new(64, Some(cuda));
    let flag = PinnedBuffer::new(64);
    let dst = Arc::new(DeviceBuffer::alloc(0, 64).unwrap());
    dst.copy_from_host(0, &[0u8; 64]).unwrap();
    rx.bounce().write_at(0, &pattern(64));
    let mut ops = flag.wait32(0, 1, WaitCond::Geq);
    ops.append(rx.copy_in_to_device(0, &dst, 0, 64));
    s.submit(ops).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut got = [0u8; 64];
    dst.copy_to_host(0, &mut got).unwrap();
    assert_eq!(got, [0u8; 64], "copied before the wait passed");
    flag.write_at(0, &1u32.to_ne_bytes());
    s.synchronize().unwrap();
    dst.copy_to_host(0, &mut got).unwrap();
    assert_eq!(got.to_vec(), pattern(64));
}

/// A kernel's block copy through `gds_block_copy` (what `pingpong --trigger kernel` stages
/// with): 256 threads copy a GPU payload into a pinned bounce and from the bounce into another
/// GPU buffer, at odd sizes and offsets (the 16-byte and the byte path); the bounce and the
/// destination hold every byte, and nothing around the range changes.
const BLOCK_COPY: &str = r#"
extern "C" __global__ void block_copy(uint64_t dst, uint64_t src, uint64_t len) {
    gds_block_copy(dst, src, len);
}
"#;

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored"]
fn a_kernel_block_stages_gpu_payloads_byte_for_byte() {
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let f = Module::compile(0, BLOCK_COPY)
        .unwrap()
        .function("block_copy")
        .unwrap();
    let s = CudaStream::new(0).unwrap();
    let bounce = Staging::new(8192, Some(cuda));
    let copy = |dst: u64, src: u64, len: u64| {
        let mut l = f.launch_builder(&s);
        l.arg(&dst).arg(&src).arg(&len);
        // SAFETY: three parameters matching block_copy; both ranges lie in buffers that
        // outlive the kernel (the stream is synchronised before they are dropped).
        unsafe { l.launch(1, 256).unwrap() };
    };
    for (len, off) in [(1, 0), (7, 3), (16, 0), (4095, 1), (4096, 16), (8192, 0)] {
        let total = len + off + 64;
        let src = DeviceBuffer::alloc(0, total).unwrap();
        let dst = DeviceBuffer::alloc(0, total).unwrap();
        let want = pattern(total);
        src.copy_from_host(0, &want).unwrap();
        dst.copy_from_host(0, &vec![0xee; total]).unwrap();
        bounce.bounce().write_at(0, &vec![0xee; 2 * 8192]);
        let b = bounce.bounce().gpu_addr();
        copy(b, src.ptr() + off as u64, len as u64);
        copy(dst.ptr() + off as u64, b, len as u64);
        s.synchronize().unwrap();
        let mut staged = vec![0u8; len + 1];
        bounce.bounce().read_at(0, &mut staged);
        assert_eq!(
            &staged[..len],
            &want[off..off + len],
            "bounce: {len} at {off}"
        );
        assert_eq!(staged[len], 0xee, "bounce: the byte past {len}");
        let mut got = vec![0u8; total];
        dst.copy_to_host(0, &mut got).unwrap();
        assert_eq!(
            &got[off..off + len],
            &want[off..off + len],
            "{len} at {off}"
        );
        assert!(
            got[..off]
                .iter()
                .chain(&got[off + len..])
                .all(|&b| b == 0xee),
            "{len} at {off}: bytes outside the range changed"
        );
    }
}
