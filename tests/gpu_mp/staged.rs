//! mp's staged GPU payloads on a GPU: sends and receives of device buffers registered as
//! staged (`Comm::register_gpu(.., GpuMemoryPath::Staged)`), on CUDA streams (copy out by
//! the stream's copy engine before the doorbell, copy in after the stream's wait) and from
//! the CPU, byte-checked at odd sizes and offsets, with several receives outstanding and more
//! messages than bounces; messages larger than a bounce (in chunks, up to 1 MiB); gets
//! into staged device memory; and puts and gets larger than a bounce (in chunks). A module of tests/gpu_mp.rs; each test is ignored unless asked for
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

/// A staged device region of `len` bytes filled with `fill`.
fn region_of(comm: &Comm, len: usize, fill: u8) -> GpuRegion {
    let buf = Arc::new(DeviceBuffer::alloc(0, len).unwrap());
    buf.copy_from_host(0, &vec![fill; len]).unwrap();
    comm.register_gpu(buf, GpuMemoryPath::Staged).unwrap()
}

/// (size, offset) of messages larger and smaller than a 4 KiB bounce: 1 byte, a bounce less
/// one, exactly a bounce, a bounce and one, 5.5 bounces; odd offsets, apart from each other.
const CHUNKED: [(usize, usize); 5] = [
    (1, 1),
    (4095, 7),
    (4096, 4200),
    (4097, 8301),
    (22_528, 12_411),
];

/// Every rank sends CHUNKED to its right neighbour and receives them from its left, all
/// outstanding at once, through 4 KiB bounces: on a CUDA stream (`on_stream`; a bounce per
/// chunk, copies by the stream) or from the CPU (2 bounces each way, reused as chunks are
/// copied in); then a 1 MiB message through the default 64 KiB bounces. Every byte and the
/// bytes around each message are checked.
fn chunked_exchange(comm: &mut Comm, on_stream: bool) {
    const BIG: usize = 1 << 20;
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let stream = CudaStream::new(0).unwrap();
    let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
    let (sbig, rbig) = (region_of(comm, BIG + 8, 0), region_of(comm, BIG + 8, 0xEE));
    let pool = if on_stream { 16 } else { 2 };
    comm.set_staging(4096, pool, pool).unwrap();
    let mut cases: Vec<(usize, usize, &GpuRegion, &GpuRegion)> = CHUNKED
        .iter()
        .map(|&(len, off)| (len, off, &sreg, &rreg))
        .collect();
    for (m, &(len, off, s, _)) in cases.iter().enumerate() {
        s.write_at(
            off,
            &(0..len).map(|i| pattern(me, m, i)).collect::<Vec<_>>(),
        )
        .unwrap();
    }
    comm.barrier().unwrap();
    exchange_cases(comm, &cases, &stream, on_stream, (left, right));
    check_cases(&cases, left, me);
    // 1 MiB in 16 chunks of the default bounce. The new pool is pinned while no stream
    // waits on another rank (pinning may wait for the GPU).
    comm.barrier().unwrap();
    comm.set_staging(64 << 10, 32, 32).unwrap();
    cases = vec![(BIG, 3, &sbig, &rbig)];
    let big: Vec<u8> = (0..BIG).map(|i| pattern(me, 0, i)).collect();
    sbig.write_at(3, &big).unwrap();
    comm.barrier().unwrap();
    exchange_cases(comm, &cases, &stream, on_stream, (left, right));
    check_cases(&cases, left, me);
    comm.barrier().unwrap();
}

/// Posts every case's receive (from `left`) and send (to `right`), then waits for all.
fn exchange_cases(
    comm: &mut Comm,
    cases: &[(usize, usize, &GpuRegion, &GpuRegion)],
    stream: &CudaStream,
    on_stream: bool,
    (left, right): (usize, usize),
) {
    let (mut recvs, mut sends) = (Vec::new(), Vec::new());
    for &(len, off, s, r) in cases {
        let (r, s) = (r.slice(off..off + len), s.slice(off..off + len));
        if on_stream {
            recvs.push(comm.irecv_gpu_on(r, left, stream).unwrap());
            sends.push(comm.isend_gpu_on(s, right, stream).unwrap());
        } else {
            recvs.push(comm.irecv_gpu(r, left).unwrap());
            sends.push(comm.isend_gpu(s, right).unwrap());
        }
    }
    if on_stream {
        comm.wait_all_on(&recvs, stream).unwrap();
        stream.synchronize().unwrap();
    }
    comm.wait_all(&sends).unwrap();
    comm.wait_all(&recvs).unwrap();
}

/// Checks every case's received bytes (from rank `from`) and the bytes around them (0xEE).
fn check_cases(cases: &[(usize, usize, &GpuRegion, &GpuRegion)], from: usize, me: usize) {
    for (m, &(len, off, _, r)) in cases.iter().enumerate() {
        let mut got = vec![0u8; len + 2];
        r.read_at(off - 1, &mut got).unwrap();
        assert_eq!(got[0], 0xEE, "rank {me}: message {m}: the byte before");
        assert_eq!(got[len + 1], 0xEE, "rank {me}: message {m}: the byte after");
        for i in 0..len {
            assert_eq!(
                got[1 + i],
                pattern(from, m, i),
                "rank {me}: message {m} ({len} B) byte {i}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_chunks_staged_device_messages_larger_than_a_bounce_on_cuda_streams() {
    let _gpu = gpu();
    on_threads(2, |c| chunked_exchange(c, true));
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_chunks_staged_device_messages_larger_than_a_bounce_from_the_cpu() {
    let _gpu = gpu();
    on_threads(2, |c| chunked_exchange(c, false));
}

/// Gets into staged device memory: each rank reads CASES from its right neighbour's window
/// (device memory, registered directly) into the same offsets of a staged device region,
/// on a CUDA stream (read into a bounce, copied in by the stream after its wait) or from the
/// CPU; every byte arrives, the bytes around each stay.
fn staged_device_gets(comm: &mut Comm, on_stream: bool) {
    let (me, n) = (comm.rank(), comm.size());
    let right = (me + 1) % n;
    let stream = CudaStream::new(0).unwrap();
    let dst = region(comm, 0xEE);
    let wbuf = DeviceBuffer::alloc(0, REGION).unwrap();
    let mine: Vec<u8> = (0..REGION).map(|i| pattern(me, 0, i)).collect();
    wbuf.copy_from_host(0, &mine).unwrap();
    let wmr = comm
        .pd()
        .register_device(&wbuf, gdasync::gdsync::Access::ALL)
        .unwrap();
    let win = comm.window(&wmr).unwrap();
    comm.set_staging(64 << 10, 8, 8).unwrap();
    comm.barrier().unwrap();
    let reqs: Vec<_> = CASES
        .iter()
        .map(|&(len, off)| {
            let s = dst.slice(off..off + len);
            match on_stream {
                true => comm.iget_gpu_on(s, &win, right, off as u64, &stream),
                false => comm.iget_gpu(s, &win, right, off as u64),
            }
            .unwrap()
        })
        .collect();
    if on_stream {
        comm.wait_all_on(&reqs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    comm.wait_all(&reqs).unwrap();
    let mut got = vec![0u8; REGION];
    dst.read_at(0, &mut got).unwrap();
    for (g, &(len, off)) in CASES.iter().enumerate() {
        for i in 0..len {
            let want = pattern(right, 0, off + i);
            assert_eq!(got[off + i], want, "rank {me}: get {g} byte {i}");
        }
        if off > 0 {
            assert_eq!(got[off - 1], 0xEE, "rank {me}: get {g}: the byte before");
        }
        assert_eq!(got[off + len], 0xEE, "rank {me}: get {g}: the byte after");
    }
    comm.barrier().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_stages_gets_into_device_buffers_on_cuda_streams_and_the_cpu() {
    let _gpu = gpu();
    on_threads(2, |c| staged_device_gets(c, true));
    on_threads(2, |c| staged_device_gets(c, false));
}

/// Puts (or gets) of CHUNKED through 4 KiB bounces between staged device regions and each
/// right neighbour's window in device memory (registered directly), all outstanding at
/// once, at a window offset 5 bytes past the region's: on a CUDA stream (a bounce per
/// chunk, the copy engine copying out before each doorbell or in after each wait) or from
/// the CPU (2 bounces each way, a pipeline). Every byte and the bytes around each case are
/// checked.
fn chunked_one_sided(comm: &mut Comm, get: bool, on_stream: bool) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let stream = CudaStream::new(0).unwrap();
    let reg = region(comm, if get { 0xEE } else { 0 });
    let wbuf = DeviceBuffer::alloc(0, REGION).unwrap();
    let mine: Vec<u8> = (0..REGION).map(|i| pattern(me, 0, i)).collect();
    let fill = if get {
        mine.clone()
    } else {
        vec![0xEE; REGION]
    };
    wbuf.copy_from_host(0, &fill).unwrap();
    if !get {
        reg.write_at(0, &mine).unwrap();
    }
    let wmr = comm
        .pd()
        .register_device(&wbuf, gdasync::gdsync::Access::ALL)
        .unwrap();
    let win = comm.window(&wmr).unwrap();
    let pool = if on_stream { 16 } else { 2 };
    comm.set_staging(4096, pool, pool).unwrap();
    comm.barrier().unwrap();
    let reqs: Vec<_> = CHUNKED
        .iter()
        .map(|&(len, off)| {
            let (s, w) = (reg.slice(off..off + len), (off + 5) as u64);
            match (get, on_stream) {
                (false, true) => comm.iput_gpu_on(s, &win, right, w, &stream),
                (false, false) => comm.iput_gpu(s, &win, right, w),
                (true, true) => comm.iget_gpu_on(s, &win, right, w, &stream),
                (true, false) => comm.iget_gpu(s, &win, right, w),
            }
            .unwrap()
        })
        .collect();
    if get && on_stream {
        comm.wait_all_on(&reqs, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    comm.wait_all(&reqs).unwrap();
    comm.barrier().unwrap();
    let mut got = vec![0u8; REGION];
    match get {
        true => reg.read_at(0, &mut got).unwrap(),
        false => wbuf.copy_to_host(0, &mut got).unwrap(),
    }
    for (m, &(len, off)) in CHUNKED.iter().enumerate() {
        // A put lands at the window's offset with the left neighbour's bytes of the
        // region's; a get at the region's with the right neighbour's of the window's.
        let (to, from, who) = if get {
            (off, off + 5, right)
        } else {
            (off + 5, off, left)
        };
        for i in 0..len {
            let want = pattern(who, 0, from + i);
            assert_eq!(got[to + i], want, "rank {me}: case {m} ({len} B) byte {i}");
        }
        assert_eq!(got[to - 1], 0xEE, "rank {me}: case {m}: the byte before");
        assert_eq!(got[to + len], 0xEE, "rank {me}: case {m}: the byte after");
    }
    comm.barrier().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_chunks_staged_device_puts_larger_than_a_bounce_on_cuda_streams_and_the_cpu() {
    let _gpu = gpu();
    on_threads(2, |c| chunked_one_sided(c, false, true));
    on_threads(2, |c| chunked_one_sided(c, false, false));
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release --test gpu_mp -- --include-ignored staged"]
fn mp_chunks_staged_device_gets_larger_than_a_bounce_on_cuda_streams_and_the_cpu() {
    let _gpu = gpu();
    on_threads(2, |c| chunked_one_sided(c, true, true));
    on_threads(2, |c| chunked_one_sided(c, true, false));
}
