//! GPU tests of kernel-driven QPs and kernel channels: persistent kernels (NVRTC-compiled)
//! compose WQEs, ring doorbells and poll CQs through `gdsync.cuh`, on the soft device, with
//! host and device memory. Each is ignored unless asked for (`cargo test --release --test
//! gpu_kernel_channel -- --include-ignored`), and then requires a GPU and NVRTC.
//! `tests/kernel_channel.rs` runs the same protocol in CI with a CPU thread in the kernel's
//! place.

mod common;

use common::gpu::{gpu, Buf};
use common::{kernel_channel_ranks, peer_counts, staged_channel_ranks};
// The byte pattern of `test_byte`: message `i` of `side`.
use common::kernel_qp::message;
use gdasync::gdsync::cuda::{CudaStream, LaunchArgs, Module};
use gdasync::gdsync::format::Syndrome;
use gdasync::gdsync::kernel::{code, DeviceQp, QpDesc};
use gdasync::gdsync::{Device, PinnedBuffer, ProtectionDomain, QpConfig};
use gdasync::mp::Comm;
use std::time::{Duration, Instant};

/// Round trips of the ping-pong tests.
const ITERS: u64 = 1000;
/// Largest message, and receive slots kept posted (as `TEST_MAX`, `TEST_SLOTS` below).
const MAX: usize = 128;
const SLOTS: u64 = 8;
/// Timeout of every kernel wait that should pass (ns).
const TIMEOUT_NS: u64 = 10_000_000_000;

/// The test kernels (compiled with NVRTC after the header).
const KERNELS: &str = include_str!("kernels/kernel_channel.cu");

fn test_len(i: u64) -> usize {
    1 + (i as usize * 37) % MAX
}

fn words(out: &PinnedBuffer, at: usize, n: usize) -> Vec<u64> {
    (0..n)
        .map(|k| {
            let mut b = [0u8; 8];
            out.read_at(at + 8 * k, &mut b);
            u64::from_ne_bytes(b)
        })
        .collect()
}

/// Runs one rank's kernel: once every rank has made its CUDA allocations and registrations
/// (a running kernel could block them), launches `l` as one block of `threads`, waits for it,
/// and waits for every rank's; returns the kernel's report (`test_report`: rc, bad bytes,
/// rounds, extra).
///
/// # Safety
/// `l`'s parameters match its kernel, and what they name outlives the call.
unsafe fn run_rank_kernel(
    comm: &mut Comm,
    l: &mut LaunchArgs,
    stream: &CudaStream,
    threads: u32,
    out: &PinnedBuffer,
) -> Vec<u64> {
    comm.barrier().unwrap();
    // SAFETY: the caller's contract; the stream is synchronised before returning.
    unsafe { l.launch(1, threads).unwrap() };
    stream.synchronize().unwrap();
    comm.barrier().unwrap();
    words(out, 0, 4)
}

/// Two connected QPs on one soft device, each with dedicated CQs, handed to the GPU.
fn device_pair(cfg: &QpConfig) -> (Device, ProtectionDomain, [DeviceQp; 2]) {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let mut qps: Vec<_> = (0..2)
        .map(|_| {
            let scq = dev.create_cq(cfg.send_wqebbs.max(16)).unwrap();
            let rcq = dev.create_cq(cfg.recv_wqes).unwrap();
            pd.create_qp(&scq, &rcq, cfg).unwrap()
        })
        .collect();
    let (ea, eb) = (qps[0].endpoint(), qps[1].endpoint());
    qps[0].connect(&eb).unwrap();
    qps[1].connect(&ea).unwrap();
    let b = qps.pop().unwrap().into_device().unwrap();
    let a = qps.pop().unwrap().into_device().unwrap();
    assert!(a.gpu_mapped() && b.gpu_mapped(), "rings must be GPU-mapped");
    (dev, pd, [a, b])
}

/// One kernel, two blocks, each driving one QP: 1000 ping-pongs of sends of 1..128 bytes,
/// data checked in the kernel and (the last messages) on the host; small rings (16) wrap
/// many times. With host and with device memory.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_kernel_channel -- --include-ignored"]
fn kernel_drives_qps_ping_pong() {
    let _gpu = gpu();
    let m = Module::compile(0, KERNELS).unwrap();
    let stream = CudaStream::new(0).unwrap();
    let cfg = QpConfig {
        send_wqebbs: 16,
        recv_wqes: 16,
        max_recv_sge: 1,
        ..QpConfig::default()
    };
    for device_mem in [false, true] {
        let (_dev, pd, [a, b]) = device_pair(&cfg);
        let len = MAX * (1 + SLOTS as usize);
        let (abuf, bbuf) = (Buf::new(device_mem, len), Buf::new(device_mem, len));
        let (amr, bmr) = (abuf.register(&pd), bbuf.register(&pd));
        let out = PinnedBuffer::new(64);
        let (qa, qb): (QpDesc, QpDesc) = (a.desc(), b.desc());
        let (aaddr, alkey, baddr, blkey) = (abuf.addr(), amr.lkey(), bbuf.addr(), bmr.lkey());
        let (iters, timeout, out_addr) = (ITERS, TIMEOUT_NS, out.addr());
        let f = m.function("qp_pingpong").unwrap();
        let mut l = f.launch_builder(&stream);
        l.arg(&qa).arg(&qb).arg(&aaddr).arg(&alkey).arg(&baddr);
        l.arg(&blkey).arg(&iters).arg(&timeout).arg(&out_addr);
        let start = Instant::now();
        // SAFETY: the parameters match qp_pingpong; the QPs, buffers and `out` outlive the
        // kernel (synchronised below).
        unsafe { l.launch(2, 1).unwrap() };
        stream.synchronize().unwrap();
        let took = start.elapsed();
        for (side, at) in [(0, 0), (1, 32)] {
            let w = words(&out, at, 3);
            assert_eq!(
                (w[0] as i32, w[1], w[2]),
                (code::OK, 0, ITERS),
                "side {side} (device_mem={device_mem}): rc, bad bytes, iterations"
            );
        }
        // The last SLOTS messages each side received are still in its slots.
        for (mr, me) in [(&amr, 0u8), (&bmr, 1u8)] {
            for i in ITERS - SLOTS..ITERS {
                let mut got = vec![0u8; test_len(i)];
                mr.read_at(MAX * (1 + (i % SLOTS) as usize), &mut got);
                assert_eq!(got, message(i, me ^ 1, test_len(i)), "host check {me}/{i}");
            }
        }
        let pa = a.progress();
        assert_eq!((pa.sends_posted, pa.sends_retired), (ITERS, ITERS));
        assert_eq!((pa.recvs_posted, pa.recvs_retired), (ITERS + SLOTS, ITERS));
        eprintln!(
            "kernel_drives_qps_ping_pong: device_mem={device_mem}: {ITERS} round trips in {took:?} ({:.1} us each)",
            took.as_secs_f64() * 1e6 / ITERS as f64
        );
    }
}

/// A kernel wait with nothing coming returns GDS_TIMEOUT; a failed RDMA write (bad rkey,
/// bad lkey) comes back as GDS_ERR_CQE | syndrome, and the next send on the failed QP as a
/// flush: codes, never a hang.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_kernel_channel -- --include-ignored"]
fn kernel_qp_timeouts_and_errors_are_codes() {
    let _gpu = gpu();
    let m = Module::compile(0, KERNELS).unwrap();
    let stream = CudaStream::new(0).unwrap();
    for bad_rkey in [true, false] {
        let (_dev, pd, [a, _b]) = device_pair(&QpConfig::default());
        let buf = Buf::new(true, 4096);
        let mr = buf.register(&pd);
        let out = PinnedBuffer::new(64);
        let q = a.desc();
        let (addr, raddr, out_addr) = (buf.addr(), buf.addr() + 1024, out.addr());
        let (lkey, rkey) = if bad_rkey {
            (mr.lkey(), mr.rkey() ^ 0x5555)
        } else {
            (mr.lkey() ^ 0x7777, mr.rkey())
        };
        let f = m.function("qp_errors").unwrap();
        let mut l = f.launch_builder(&stream);
        l.arg(&q)
            .arg(&addr)
            .arg(&lkey)
            .arg(&raddr)
            .arg(&rkey)
            .arg(&out_addr);
        let start = Instant::now();
        // SAFETY: the parameters match qp_errors; everything outlives the kernel.
        unsafe { l.launch(1, 1).unwrap() };
        stream.synchronize().unwrap();
        assert!(start.elapsed() < Duration::from_secs(30));
        let w = words(&out, 0, 7);
        assert_eq!(w[0] as i32, code::TIMEOUT, "the empty wait");
        assert!(w[1] >= 20_000_000, "it waited its timeout: {} ns", w[1]);
        assert_eq!(w[2] as i32, code::OK, "the post");
        let want = if bad_rkey {
            Syndrome::RemoteAccess
        } else {
            Syndrome::LocalProt
        };
        assert_eq!(code::syndrome(w[3] as i32), Some(want), "rc {:#x}", w[3]);
        assert_eq!(w[4], want as u64);
        assert_eq!(w[5] as i32, code::OK);
        assert_eq!(code::syndrome(w[6] as i32), Some(Syndrome::WrFlush));
    }
}

/// Two thread ranks, each with its own persistent kernel, ping-pong 1000 messages through
/// the mp peer table (credits, any number of messages from one descriptor; one send in three
/// signalled, so the waits for the others post NOPs), with host and with device memory; data
/// checked in the kernels and on the host, every send counted done.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_kernel_channel -- --include-ignored"]
fn kernel_channels_ping_pong_between_rank_kernels() {
    let _gpu = gpu();
    let m = Module::compile(0, KERNELS).unwrap();
    for device_mem in [false, true] {
        kernel_channel_ranks(8, |comm, ch| {
            let (me, other) = (comm.rank(), 1 - comm.rank());
            let buf = Buf::new(device_mem, 2 * MAX);
            let mr = buf.register(comm.pd());
            let out = PinnedBuffer::new(64);
            let stream = CudaStream::new(0).unwrap();
            assert!(ch.gpu_mapped());
            let (table, me32, other32) = (ch.table().unwrap(), me as u32, other as u32);
            let (addr, lkey) = (buf.addr(), mr.lkey());
            let (iters, timeout, out_addr) = (ITERS, TIMEOUT_NS, out.addr());
            let f = m.function("peer_pingpong").unwrap();
            let mut l = f.launch_builder(&stream);
            l.arg(&table).arg(&me32).arg(&other32).arg(&addr);
            l.arg(&lkey).arg(&iters).arg(&timeout).arg(&out_addr);
            // SAFETY: the parameters match peer_pingpong; the table, buffers and
            // channels outlive the call.
            let w = unsafe { run_rank_kernel(comm, &mut l, &stream, 1, &out) };
            assert_eq!(
                (w[0] as i32, w[1], w[2]),
                (code::OK, 0, ITERS),
                "rank {me} (device_mem={device_mem}): rc, bad bytes, iterations"
            );
            assert_eq!(w[3] as i32, code::INVALID, "own entry refused");
            let last = ITERS - 1;
            let mut got = vec![0u8; test_len(last)];
            mr.read_at(MAX, &mut got);
            assert_eq!(got, message(last, other as u8, test_len(last)));
            let st = ch.progress(other).unwrap();
            assert_eq!(
                (
                    st.sends,
                    st.sends_done,
                    st.sends_waited,
                    st.recvs,
                    st.recvs_waited,
                    st.error
                ),
                (ITERS, ITERS, ITERS, ITERS, ITERS, 0)
            );
        });
    }
}

/// Puts and gets from rank kernels through an mp window (`Window::for_kernels`): for 1000
/// rounds, rank 0's kernel puts a message into rank 1's window and sends a notice; rank 1's
/// checks the bytes in its window, gets a range of rank 0's window (filled by the host) and
/// checks it, then answers (`peer_put_get`), with host and with device memory. A put past
/// the window is refused with GDS_INVALID; the channel counts every put and get as a send,
/// apart (`one_sided`), and the credits still match the messages.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_kernel_channel -- --include-ignored"]
fn kernel_channels_put_and_get_between_rank_kernels() {
    let _gpu = gpu();
    let m = Module::compile(0, KERNELS).unwrap();
    for device_mem in [false, true] {
        kernel_channel_ranks(8, |comm, ch| {
            let (me, other) = (comm.rank(), 1 - comm.rank());
            let buf = Buf::new(device_mem, 3 * MAX);
            let mr = buf.register(comm.pd());
            let wbuf = Buf::new(device_mem, SLOTS as usize * MAX);
            let wmr = wbuf.register(comm.pd());
            if me == 0 {
                wmr.write_at(0, &message(77, 0, SLOTS as usize * MAX));
            }
            let window = comm.window(&wmr).unwrap();
            let kw = window.for_kernels().unwrap();
            let out = PinnedBuffer::new(64);
            let stream = CudaStream::new(0).unwrap();
            assert!(ch.gpu_mapped() && kw.gpu_mapped());
            let (table, wtable) = (ch.table().unwrap(), kw.table());
            let (me32, other32, addr, lkey) = (me as u32, other as u32, buf.addr(), mr.lkey());
            let (mywin, iters, timeout, out_addr) = (wbuf.addr(), ITERS, TIMEOUT_NS, out.addr());
            let f = m.function("peer_put_get").unwrap();
            let mut l = f.launch_builder(&stream);
            l.arg(&table)
                .arg(&wtable)
                .arg(&me32)
                .arg(&other32)
                .arg(&addr);
            l.arg(&lkey)
                .arg(&mywin)
                .arg(&iters)
                .arg(&timeout)
                .arg(&out_addr);
            // SAFETY: the parameters match peer_put_get; the tables, buffers, window and
            // channels outlive the call.
            let w = unsafe { run_rank_kernel(comm, &mut l, &stream, 1, &out) };
            assert_eq!(
                (w[0] as i32, w[1], w[2]),
                (code::OK, 0, ITERS),
                "rank {me} (device_mem={device_mem}): rc, bad bytes, rounds"
            );
            assert_eq!(w[3] as i32, code::INVALID, "a put past the window");
            let st = ch.progress(other).unwrap();
            assert_eq!(
                peer_counts(&st),
                (2 * ITERS, 2 * ITERS, 2 * ITERS, ITERS, ITERS, 0)
            );
            assert_eq!(
                st.one_sided, ITERS,
                "rank {me}: puts or gets among the sends"
            );
        });
    }
}

/// Two thread ranks, each with a persistent kernel of one block of 96 threads, ping-pong 400
/// messages through staged kernel channels (bounces of 250 bytes, rounded up to 256; 8 send
/// and 4 receive slots), with the payloads in GPU memory (cuMemAlloc) that is never registered:
/// lengths 1 to 256 at odd offsets, copied into and out of the bounces by the whole block or
/// by thread 0 alone; data checked in the kernels and (the last message) on the host, every
/// send counted done.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_kernel_channel -- --include-ignored"]
fn staged_kernel_channels_ping_pong_from_gpu_memory() {
    const STAGED_ITERS: u64 = 400;
    let _gpu = gpu();
    let m = Module::compile(0, KERNELS).unwrap();
    staged_channel_ranks(4, 250, |comm, ch| {
        let (me, other) = (comm.rank(), 1 - comm.rank());
        let slot = ch.staging().unwrap().slot_bytes as usize;
        let (sdev, rdev) = (Buf::new(true, slot + 32), Buf::new(true, slot + 32));
        let out = PinnedBuffer::new(64);
        let stream = CudaStream::new(0).unwrap();
        assert!(ch.gpu_mapped());
        let (table, me32, other32) = (ch.table().unwrap(), me as u32, other as u32);
        let (saddr, raddr) = (sdev.addr(), rdev.addr());
        let (iters, timeout, out_addr) = (STAGED_ITERS, TIMEOUT_NS, out.addr());
        let f = m.function("staged_pingpong").unwrap();
        let mut l = f.launch_builder(&stream);
        l.arg(&table).arg(&me32).arg(&other32).arg(&saddr);
        l.arg(&raddr).arg(&iters).arg(&timeout).arg(&out_addr);
        // SAFETY: the parameters match staged_pingpong; the table, buffers and channels
        // outlive the call.
        let w = unsafe { run_rank_kernel(comm, &mut l, &stream, 96, &out) };
        assert_eq!(
            (w[0] as i32, w[1], w[2], w[3] as usize),
            (code::OK, 0, STAGED_ITERS, slot),
            "rank {me}: rc, bad bytes, iterations, slot"
        );
        // The last message (399: 1 + 399 * 53 % 256 bytes at offset 399 * 3 % 19) in rdev.
        let last = STAGED_ITERS - 1;
        let (len, off) = (1 + (last as usize * 53) % slot, (last * 3 % 19) as usize);
        let Buf::Dev(d) = &rdev else { unreachable!() };
        let mut got = vec![0u8; len];
        d.copy_to_host(off, &mut got).unwrap();
        assert_eq!(got, message(last, other as u8, len));
        let n = STAGED_ITERS;
        let st = ch.progress(other).unwrap();
        assert_eq!(peer_counts(&st), (n, n, n, n, n, 0));
    });
}
