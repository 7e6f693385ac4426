//! GPU tests of staging: a CUDA stream copies GPU payloads through pinned bounce slots in the
//! order of its lists (a list kernel, or copies between memory operations). Each is ignored unless
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

/// `got` holds `want`'s `len` bytes at `off`, and 0xee (what it was filled with) around them.
fn assert_range_landed(got: &[u8], want: &[u8], off: usize, len: usize, what: &str) {
    assert_eq!(
        &got[off..off + len],
        &want[off..off + len],
        "{what}: {len} bytes at {off}"
    );
    assert!(
        got[..off]
            .iter()
            .chain(&got[off + len..])
            .all(|&b| b == 0xee),
        "{what}: {len} at {off}: bytes outside the range changed"
    );
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
        assert_range_landed(&got, &want, off, len, "stream");
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
        assert_range_landed(&got, &want, off, len, "kernel block");
    }
}

/// A staged send's list run both ways a stream runs it (one list kernel, or memory
/// operations with a copy between them): nothing runs before the wait passes; then the
/// payload (odd length, odd offset, a 16-byte-aligned and a byte path) is in the bounce by
/// the time the write after the barrier is seen, and every one of 20 stores after it runs.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored"]
fn both_list_paths_copy_before_the_barrier_and_after_the_wait() {
    use gdasync::gdsync::cuda::ListKernel;
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let _made = Staging::new(64, Some(cuda));
    assert!(
        gdasync::gdsync::cuda::staged_copy_kernels(0),
        "the staging kernels did not compile (see the log): the list kernel cannot be tested"
    );
    for how in [ListKernel::Staged, ListKernel::Off] {
        let s = CudaStream::new(0).unwrap().with_list_kernel(how);
        for (len, off) in [(13usize, 3usize), (200, 0), (4096 + 5, 16), (20000, 1)] {
            let tx = Staging::new(32 << 10, Some(cuda));
            let flag = PinnedBuffer::new(64);
            let words = PinnedBuffer::new(4 * 21);
            let src = Arc::new(DeviceBuffer::alloc(0, off + len).unwrap());
            let want = pattern(off + len);
            src.copy_from_host(0, &want).unwrap();
            tx.bounce().write_at(0, &vec![0xee; len]);
            let mut ops = flag.wait32(0, 1, WaitCond::Geq);
            ops.append(tx.copy_out_of_device(0, &src, off, len));
            ops.append(gdasync::gdsync::ops::Ops::barrier());
            for k in 0..20 {
                ops.append(words.write32(4 * k, k as u32 + 1));
            }
            ops.append(words.write32(80, 7));
            s.submit(ops).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(30));
            let mut marker = [0u8; 4];
            words.read_at(80, &mut marker);
            assert_eq!(
                u32::from_ne_bytes(marker),
                0,
                "{how:?}: ran before its wait"
            );
            flag.write_at(0, &1u32.to_ne_bytes());
            let start = std::time::Instant::now();
            while {
                words.read_at(80, &mut marker);
                u32::from_ne_bytes(marker) != 7
            } {
                assert!(start.elapsed().as_secs() < 5, "{how:?}: the list never ran");
                std::hint::spin_loop();
            }
            let mut got = vec![0u8; len];
            tx.bounce().read_at(0, &mut got);
            assert!(
                got == want[off..],
                "{how:?}: {len} bytes at {off} not in the bounce when the write after the barrier was seen"
            );
            s.synchronize().unwrap();
            let mut all = [0u8; 80];
            words.read_at(0, &mut all);
            let stored: Vec<u32> = all
                .chunks(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(stored, (1..=20).collect::<Vec<u32>>(), "{how:?}");
        }
    }
}

/// LL messages (`gds_block_ll_pack`, `gds_block_ll_recv`): a payload packed from GPU memory
/// into 8-byte lines under a flag, then received from those lines into GPU memory, at odd
/// sizes and offsets, by warp 0 alone (up to 256 bytes) and by the block: every line holds
/// its 4 data bytes (zero-padded) under the flag, every byte arrives, nothing around the
/// range changes; a receive under a flag no line holds times out having written nothing.
const LL: &str = r#"
extern "C" __global__ void ll_pack(uint64_t dst, uint64_t src, uint64_t len, uint32_t flag) {
    gds_block_ll_pack(dst, src, len, flag);
}
extern "C" __global__ void ll_recv(uint64_t dst, uint64_t src, uint64_t len, uint32_t flag,
        uint64_t timeout_ns, uint64_t rc) {
    int r = gds_block_ll_recv(dst, src, len, flag, timeout_ns);
    if (threadIdx.x == 0) *(volatile uint32_t *)rc = (uint32_t)r + 1;
}
"#;

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test staging_gpu -- --include-ignored"]
fn ll_lines_carry_gpu_payloads_byte_for_byte() {
    use gdasync::gdsync::kernel::{code, ll};
    let _gpu = gpu();
    let cuda = Cuda::get().unwrap();
    let m = Module::compile(0, LL).unwrap();
    let (pack, recv) = (
        m.function("ll_pack").unwrap(),
        m.function("ll_recv").unwrap(),
    );
    let s = CudaStream::new(0).unwrap();
    let bounce = Staging::new(ll::bytes(ll::MAX), Some(cuda));
    let b = bounce.bounce().gpu_addr();
    let rc = PinnedBuffer::new(64);
    let receive = |dst: u64, len: u64, flag: u32, timeout_ns: u64| -> i32 {
        let mut l = recv.launch_builder(&s);
        let rc_at = rc.gpu_addr();
        l.arg(&dst)
            .arg(&b)
            .arg(&len)
            .arg(&flag)
            .arg(&timeout_ns)
            .arg(&rc_at);
        // SAFETY: six parameters matching ll_recv; the bounce, the buffers and the return word
        // outlive the kernel (the stream is synchronised next).
        unsafe { l.launch(1, 256).unwrap() };
        s.synchronize().unwrap();
        let mut w = [0u8; 4];
        rc.read_at(0, &mut w);
        u32::from_ne_bytes(w) as i32 - 1
    };
    let cases = [
        (1, 0),
        (3, 1),
        (8, 0),
        (13, 3),
        (256, 0),
        (257, 1),
        (1000, 5),
        (1024, 0),
    ];
    for (k, (len, off)) in cases.into_iter().enumerate() {
        let flag = k as u32 + 1;
        let total = len + off + 64;
        let src = DeviceBuffer::alloc(0, total).unwrap();
        let dst = DeviceBuffer::alloc(0, total).unwrap();
        let want = pattern(total);
        src.copy_from_host(0, &want).unwrap();
        dst.copy_from_host(0, &vec![0xee; total]).unwrap();
        let mut l = pack.launch_builder(&s);
        let (from, n) = (src.ptr() + off as u64, len as u64);
        l.arg(&b).arg(&from).arg(&n).arg(&flag);
        // SAFETY: four parameters matching ll_pack; both ranges lie in buffers that outlive
        // the kernel (the stream is synchronised before they are dropped).
        unsafe { l.launch(1, 256).unwrap() };
        s.synchronize().unwrap();
        let mut lines = vec![0u8; ll::bytes(len)];
        bounce.bounce().read_at(0, &mut lines);
        for (j, line) in lines.chunks(8).enumerate() {
            let mut data = [0u8; 4];
            let part = &want[off + 4 * j..(off + 4 * j + 4).min(off + len)];
            data[..part.len()].copy_from_slice(part);
            assert_eq!(&line[..4], &data, "{len} at {off}: line {j}'s data");
            assert_eq!(
                line[4..],
                flag.to_ne_bytes(),
                "{len} at {off}: line {j}'s flag"
            );
        }
        let late = receive(dst.ptr() + off as u64, n, flag + 100, 1_000_000);
        assert_eq!(late, code::TIMEOUT, "{len} at {off}: a flag no line holds");
        let mut got = vec![0u8; total];
        dst.copy_to_host(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == 0xee),
            "{len} at {off}: a receive that timed out wrote"
        );
        assert_eq!(
            receive(dst.ptr() + off as u64, n, flag, 1_000_000_000),
            code::OK
        );
        dst.copy_to_host(0, &mut got).unwrap();
        assert_range_landed(&got, &want, off, len, "LL");
    }
}
