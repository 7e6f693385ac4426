//! mp's staged GPU payloads on a GPU: sends and receives of device buffers registered as
//! staged (`Comm::register_gpu(.., GpuMemoryPath::Staged)`), on CUDA streams (copy out by
//! the stream's copy engine before the doorbell, copy in after the stream's wait) and from
//! the CPU, byte-checked at odd sizes and offsets, with several receives outstanding and more
//! messages than bounces. A module of tests/gpu_mp.rs; each test is ignored unless asked for
//! (`GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged`),
//! and then requires a GPU.

use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer};
use gdasync::gdsync::GpuMemoryPath;
use gdasync::mp::{Comm, GpuRegion};
use std::sync::Arc;

use crate::common::{gpu::gpu, on_threads, staged_stream_of_messages};

const REGION: usize = 96 << 10;
/// (size, offset) of each message: odd sizes and offsets (one just under the 64 KiB
/// bounce), apart from each other by at least one untouched byte.
const CASES: [(usize, usize); 6] = [
    (1, 0),
    (3, 3),
    (4093, 13),
    (17, 4200),
    (65_533, 20_001),
    (9001, 86_000),
];

fn pattern(from: usize, m: usize, i: usize) -> u8 {
    (i.wrapping_mul(29) ^ (from * 13 + m * 7 + 1)) as u8
}

/// A staged device region of REGION bytes filled with `fill`.
fn region(comm: &Comm, fill: u8) -> GpuRegion {
    let buf = Arc::new(DeviceBuffer::alloc(0, REGION).unwrap());
    buf.copy_from_host(0, &vec![fill; REGION]).unwrap();
    let r = comm.register_gpu(buf, GpuMemoryPath::Staged).unwrap();
    assert_eq!(r.path(), GpuMemoryPath::Staged);
    r
}

/// Every rank sends CASES to its right neighbour and receives them from its left, all
/// outstanding at once (each receive in its own bounce), on a CUDA stream (`on_stream`) or
/// from the CPU; then checks every byte of every message and the bytes around each.
fn exchange(comm: &mut Comm, on_stream: bool) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let stream = CudaStream::new(0).unwrap();
    let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
    // The pool is pinned now, before any stream waits on another rank.
    comm.set_staging(64 << 10, 128, 32).unwrap();
    for (m, &(len, off)) in CASES.iter().enumerate() {
        let payload: Vec<u8> = (0..len).map(|i| pattern(me, m, i)).collect();
        sreg.write_at(off, &payload).unwrap();
    }
    comm.barrier().unwrap();
    let mut recvs = Vec::new();
    let mut sends = Vec::new();
    for &(len, off) in &CASES {
        let (r, s) = (rreg.slice(off..off + len), sreg.slice(off..off + len));
        if on_stream {
            recvs.push(comm.irecv_gpu_on(r, left, &stream).unwrap());
            sends.push(comm.isend_gpu_on(s, right, &stream).unwrap());
        } else {
            recvs.push(comm.irecv_gpu(r, left).unwrap());
            sends.push(comm.isend_gpu(s, right).unwrap());
        }
    }
    if on_stream {
        comm.wait_all_on(&recvs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    comm.wait_all(&sends).unwrap();
    comm.wait_all(&recvs).unwrap();
    let mut got = vec![0u8; REGION];
    rreg.read_at(0, &mut got).unwrap();
    for (m, &(len, off)) in CASES.iter().enumerate() {
        for i in 0..len {
            assert_eq!(
                got[off + i],
                pattern(left, m, i),
                "rank {me}: message {m} byte {i}"
            );
        }
        if off > 0 {
            assert_eq!(
                got[off - 1],
                0xEE,
                "rank {me}: message {m}: the byte before"
            );
        }
        assert_eq!(
            got[off + len],
            0xEE,
            "rank {me}: message {m}: the byte after"
        );
    }
    comm.barrier().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_stages_device_buffers_on_cuda_streams_byte_for_byte() {
    let _gpu = gpu();
    on_threads(2, |c| exchange(c, true));
    on_threads(4, |c| exchange(c, true));
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_stages_device_buffers_from_the_cpu_byte_for_byte() {
    let _gpu = gpu();
    on_threads(2, |c| exchange(c, false));
}

/// 200 messages through a pool of 2 bounces each way on CUDA streams: bounces come back as
/// sends complete and the streams' copies in pass; every message lands in its own slice.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_staged_bounces_recycle_on_cuda_streams() {
    let _gpu = gpu();
    on_threads(2, |comm| {
        const N: usize = 200;
        const LEN: usize = 300;
        comm.set_staging(LEN, 2, 2).unwrap();
        let stream = CudaStream::new(0).unwrap();
        let reg = region(comm, 0);
        let at = |m: usize| m * (LEN + 1);
        if comm.rank() == 0 {
            let all: Vec<u8> = (0..N * (LEN + 1))
                .map(|j| pattern(0, j / (LEN + 1), j % (LEN + 1)))
                .collect();
            reg.write_at(0, &all).unwrap();
        }
        comm.barrier().unwrap();
        let reqs = staged_stream_of_messages(comm, &reg, N, LEN, &stream);
        stream.synchronize().unwrap();
        comm.wait_all(&reqs).unwrap();
        if comm.rank() == 1 {
            let mut got = vec![0u8; REGION];
            reg.read_at(0, &mut got).unwrap();
            for m in 0..N {
                for i in 0..LEN {
                    assert_eq!(got[at(m) + i], pattern(0, m, i), "message {m}: byte {i}");
                }
            }
        }
        comm.barrier().unwrap();
    });
}

/// Puts from staged device memory on CUDA streams (the copy engine copies out before the
/// doorbell) into each right neighbour's window in device memory (registered directly):
/// every case arrives byte for byte.
#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_stages_puts_from_device_buffers_on_cuda_streams() {
    let _gpu = gpu();
    on_threads(2, |comm| {
        let (me, n) = (comm.rank(), comm.size());
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        let stream = CudaStream::new(0).unwrap();
        let src = region(comm, 0);
        let wbuf = DeviceBuffer::alloc(0, REGION).unwrap();
        wbuf.copy_from_host(0, &vec![0u8; REGION]).unwrap();
        let wmr = comm
            .pd()
            .register_device(&wbuf, gdasync::gdsync::Access::ALL)
            .unwrap();
        let win = comm.window(&wmr).unwrap();
        comm.set_staging(64 << 10, 8, 8).unwrap();
        for (m, &(len, off)) in CASES.iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|i| pattern(me, m, i)).collect();
            src.write_at(off, &payload).unwrap();
        }
        comm.barrier().unwrap();
        let reqs: Vec<_> = CASES
            .iter()
            .map(|&(len, off)| {
                let s = src.slice(off..off + len);
                comm.iput_gpu_on(s, &win, right, off as u64, &stream)
                    .unwrap()
            })
            .collect();
        stream.synchronize().unwrap();
        comm.wait_all(&reqs).unwrap();
        comm.barrier().unwrap();
        let mut got = vec![0u8; REGION];
        wbuf.copy_to_host(0, &mut got).unwrap();
        for (m, &(len, off)) in CASES.iter().enumerate() {
            for i in 0..len {
                assert_eq!(
                    got[off + i],
                    pattern(left, m, i),
                    "rank {me}: put {m} byte {i}"
                );
            }
        }
        comm.barrier().unwrap();
    });
}
