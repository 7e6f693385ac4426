//! Kernel-driven QPs and kernel channels, without a GPU: a thread plays the kernel. It reads
//! the descriptors the host filled once (`DeviceQp::desc`, `KernelChannels::desc`) and calls
//! the device functions of `gdsync.cuh` itself, compiled for the host (`common::gds`), which
//! write the WQEs, doorbell records, doorbells, CQ consumer indices and credits; the soft
//! device must execute them as a ConnectX would. The bandwidth example's staged kernel runs
//! the same way, whole (`bw_staged` built for the host). These tests are ignored where clang++
//! was missing when they were built.

mod common;

use common::gds::{self, DescEntry, Wc};
use common::kernel_qp::{advance, connected, message, pinned, read, write};
use common::{kernel_channel_ranks, peer_counts, staged_channel_ranks};
use gdasync::gdsync::format::{
    DataSeg, DataSegs, FmCeSe, Opcode, RaddrSeg, RecvWqe, SendWqe, Syndrome, WqeData,
};
use gdasync::gdsync::kernel::{code, DescRing, DeviceQp, PeerDesc, QpDesc, SendDesc, WaitDesc};
use gdasync::gdsync::{Device, GpuMemoryPath, NicHandler, QpConfig, RecvWr, Ringers, SendWr};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::{Comm, MAX_KERNEL_BOUNCE};
use std::time::{Duration, Instant};

/// A wait that should pass promptly (seconds: a loaded 2-core machine must never trip it).
const TIMEOUT_NS: u64 = 20_000_000_000;

// ------------------------------------------------------------------ kernel-driven QPs

/// `gds_ring_fetch_n` copies several descriptor-ring entries at once, in ring order, across
/// the ring's end, and releases their slots together; it waits for the last entry (and times
/// out, releasing nothing, when the host has not filled it) and refuses a count of 0 or more
/// than `GDS_RING_FETCH_MAX` (4).
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn header_fetches_descriptor_batches_in_ring_order() {
    let (_dev, pd, mut a, _b) = connected(&QpConfig::default());
    let (_src, smr) = pinned(&pd, 64);
    let (_dst, dmr) = pinned(&pd, 64);
    let mut ring = DescRing::with_cuda(4, None);
    let desc = ring.device_desc();
    // Pushes a signalled write's commit and its completion wait; their first body words
    // (the doorbell record's address, the watched word's) as gds_desc holds them.
    let mut push_pair = |ring: &mut DescRing| -> [u64; 2] {
        let wr = SendWr::write(dmr.remote().at(0)).sge(smr.sge(..8));
        let p = a.qp.prepare_send(&wr).unwrap();
        let (t, commit) = a.qp.commit(p).unwrap();
        let wait = a.qp.send_wait_ops(&t).unwrap();
        let (s, w) = (
            SendDesc::from_ops(&commit).unwrap(),
            WaitDesc::from_ops(&wait).unwrap(),
        );
        ring.push_send(commit, Duration::from_secs(1)).unwrap();
        ring.push_wait(wait, Duration::from_secs(1)).unwrap();
        [s.dbrec, w.word]
    };
    let first = push_pair(&mut ring);
    let mut out = [DescEntry([0; 80]); 5];
    assert_eq!(
        gds::ring_fetch_n(&desc, 0, &mut out[..0], TIMEOUT_NS),
        code::INVALID
    );
    assert_eq!(
        gds::ring_fetch_n(&desc, 0, &mut out[..5], TIMEOUT_NS),
        code::INVALID
    );
    // Three entries asked for, two filled: a timeout, and nothing released.
    assert_eq!(
        gds::ring_fetch_n(&desc, 0, &mut out[..3], 2_000_000),
        code::TIMEOUT
    );
    assert_eq!(ring.consumed(), 0);
    assert_eq!(
        gds::ring_fetch_n(&desc, 0, &mut out[..2], TIMEOUT_NS),
        code::OK
    );
    assert_eq!(ring.consumed(), 2);
    let (seq, kind, body) = (0, 8, 16);
    for (k, e) in out[..2].iter().enumerate() {
        assert_eq!(e.u64_at(seq), k as u64 + 1, "entry {k}'s sequence number");
        assert_eq!(
            e.u64_at(kind) as u32,
            [1, 2][k],
            "entry {k}: a send, then a wait"
        );
        assert_eq!(e.u64_at(body), first[k], "entry {k}'s first body word");
    }
    // Entries 2..6 take slots 2, 3, 0, 1: a batch of three that wraps.
    let second = push_pair(&mut ring);
    let third = push_pair(&mut ring);
    assert_eq!(
        gds::ring_fetch_n(&desc, 2, &mut out[..3], TIMEOUT_NS),
        code::OK
    );
    assert_eq!(ring.consumed(), 5);
    let want = [(3, 1, second[0]), (4, 2, second[1]), (5, 1, third[0])];
    for (e, (s, kd, b)) in out[..3].iter().zip(want) {
        assert_eq!(
            (e.u64_at(seq), e.u64_at(kind) as u32, e.u64_at(body)),
            (s, kd, b)
        );
    }
    assert_eq!(
        gds::ring_fetch_n(&desc, 5, &mut out[..1], TIMEOUT_NS),
        code::OK
    );
    assert_eq!((out[0].u64_at(seq), out[0].u64_at(body)), (6, third[1]));
    assert_eq!(ring.consumed(), 6);
}

/// Commits run by the header's `gds_send` from their send descriptors, each followed by
/// `gds_wait` on its completion descriptor: the soft device executes every send. A QP of
/// `Ringers::Mixed` gets "rung to" stored after each doorbell; one of `Ringers::Executors`
/// gets none (its descriptors carry no address for it), and a CPU post on it is refused until
/// the completion wait has retired the send, then goes out in order.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn header_sends_commits_with_and_without_rung_to() {
    for ringers in [Ringers::Mixed, Ringers::Executors] {
        let cfg = QpConfig {
            ringers,
            ..QpConfig::default()
        };
        let (_dev, pd, mut a, b) = connected(&cfg);
        let (src, smr) = pinned(&pd, 64);
        let (dst, dmr) = pinned(&pd, 64);
        for i in 0..40u64 {
            let data = message(i, 1, 64);
            write(src.addr(), &data);
            let wr = SendWr::write(dmr.remote().at(0)).sge(smr.sge(..));
            let p = a.qp.prepare_send(&wr).unwrap();
            let (t, ops) = a.qp.commit(p).unwrap();
            let d = SendDesc::from_ops(&ops).unwrap();
            assert_eq!(d.rung != 0, ringers == Ringers::Mixed, "{ringers:?}: {d:?}");
            assert_eq!(gds::send(&d), code::OK);
            // Rung; only "rung to" or a retired completion can tell a CPU post.
            let mixed = ringers == Ringers::Mixed;
            assert_eq!(a.qp.has_unrung_commits(), !mixed, "{ringers:?} send {i}");
            if !mixed {
                let e =
                    a.qp.post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)));
                assert!(e.unwrap_err().to_string().contains("Ringers::Mixed"));
            }
            let w = a.qp.send_wait_ops(&t).unwrap();
            assert_eq!(
                gds::wait(&WaitDesc::from_ops(&w).unwrap(), TIMEOUT_NS),
                code::OK
            );
            assert!(!a.qp.has_unrung_commits(), "{ringers:?} send {i}");
            assert_eq!(read(dst.addr(), 64), data, "{ringers:?} send {i}");
            // A CPU post now goes out after it.
            a.qp.post_send(&wr.wr_id(i)).unwrap();
            let c = a.scq.wait_one(Duration::from_secs(20)).unwrap();
            assert!(
                c.is_ok() && c.wr_id == i,
                "{ringers:?}: {c:?}; {}",
                a.qp.describe()
            );
        }
        drop(b);
    }
}

/// One "kernel" per end, each driving its QP: ping-pongs of sends of varying lengths, data
/// checked on arrival. Small rings and CQs (16) wrap ~60 times, and the counters start just
/// below 2^16 so the 16-bit WQE and receive indices wrap too.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qps_ping_pong_across_ring_and_index_wrap() {
    const ITERS: u64 = 1000;
    const SLOTS: u64 = 8; // receives kept posted ahead
    const MAX: usize = 256;
    let cfg = QpConfig {
        send_wqebbs: 16,
        recv_wqes: 16,
        max_recv_sge: 1,
        ..QpConfig::default()
    };
    let (_dev, pd, mut a, mut b) = connected(&cfg);
    advance(&mut a, &mut b, 65536 - 300);
    advance(&mut b, &mut a, 65536 - 200);
    let (abuf, amr) = pinned(&pd, MAX * (SLOTS as usize + 1));
    let (bbuf, bmr) = pinned(&pd, MAX * (SLOTS as usize + 1));
    let (a, b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let start_a = a.desc();
    assert_eq!(
        start_a.sq_pi,
        65536 - 300,
        "the descriptor starts where the CPU left"
    );
    let side = |dq: &DeviceQp, base: u64, lkey: u32, me: u8, first: bool| {
        let mut qp = dq.desc();
        let slot = |i: u64| base + MAX as u64 * (1 + i % SLOTS);
        let len = |i: u64| 1 + (i as usize * 37) % MAX;
        let mut wc = Wc::default();
        for i in 0..SLOTS {
            assert_eq!(
                gds::qp_post_recv(&mut qp, slot(i), MAX as u32, lkey),
                code::OK
            );
        }
        for i in 0..ITERS {
            let send = |qp: &mut QpDesc, wc: &mut Wc| {
                let m = message(i, me, len(i));
                write(base, &m);
                assert_eq!(
                    gds::qp_post_send(
                        qp,
                        gds::OP_SEND,
                        base,
                        lkey,
                        m.len() as u32,
                        0,
                        0,
                        0,
                        gds::SIGNALED
                    ),
                    code::OK
                );
                // The source is reused next time: wait for this send.
                assert_eq!(gds::cq_wait(&mut qp.send_cq, wc, TIMEOUT_NS), code::OK);
                assert_eq!(
                    (wc.opcode, wc.wqe_opcode as u32),
                    (gds::WC_SEND_DONE, gds::OP_SEND)
                );
            };
            if first {
                send(&mut qp, &mut wc);
            }
            assert_eq!(
                gds::cq_wait(&mut qp.recv_cq, &mut wc, TIMEOUT_NS),
                code::OK,
                "{me}: receive {i}"
            );
            assert_eq!((wc.opcode, wc.byte_len as usize), (gds::WC_RECV, len(i)));
            assert_eq!(
                read(slot(i), len(i)),
                message(i, me ^ 1, len(i)),
                "{me}: data {i}"
            );
            assert_eq!(
                gds::qp_post_recv(&mut qp, slot(i + SLOTS), MAX as u32, lkey),
                code::OK
            );
            if !first {
                send(&mut qp, &mut wc);
            }
        }
        qp
    };
    let (qa, qb) = std::thread::scope(|s| {
        let ta = s.spawn(|| side(&a, abuf.addr(), amr.lkey(), 0, true));
        let tb = s.spawn(|| side(&b, bbuf.addr(), bmr.lkey(), 1, false));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    // The kernel stored its counters through: the host sees them, a new launch resumes.
    let pa = a.progress();
    assert_eq!(pa.sends_posted, 65536 - 300 + ITERS);
    assert_eq!(pa.sends_retired, pa.sends_posted);
    assert_eq!(pa.recvs_posted, 65536 - 200 + ITERS + SLOTS);
    assert_eq!(pa.recvs_retired, 65536 - 200 + ITERS);
    assert_eq!(a.desc().sq_pi, qa.sq_pi);
    assert_eq!(b.desc().recv_cq.ci, qb.recv_cq.ci);
    assert_eq!(
        b.desc(),
        qb,
        "a fresh descriptor equals the kernel's final copy"
    );
}

/// Every operation the header composes, with the completion fields checked: RDMA write,
/// write with immediate, read, send with immediate, inline send and inline write.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qp_operations_and_completion_fields() {
    // The GPU rings the doorbell itself, or asks the CPU proxy to.
    for handler in [NicHandler::Gpu, NicHandler::Cpu] {
        operations(handler);
    }
}

fn operations(handler: NicHandler) {
    let cfg = QpConfig {
        nic_handler: Some(handler),
        ..QpConfig::default()
    };
    let (_dev, pd, a, b) = connected(&cfg);
    let (abuf, amr) = pinned(&pd, 4096);
    let (bbuf, bmr) = pinned(&pd, 4096);
    let (a, b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let (mut qa, mut qb) = (a.desc(), b.desc());
    assert_eq!(
        (qa.db != 0, qa.proxy != 0),
        (handler == NicHandler::Gpu, handler == NicHandler::Cpu)
    );
    let mut wc = Wc::default();
    let data = message(1, 9, 1000);
    write(abuf.addr(), &data);

    // RDMA write: 1000 bytes into b at 2048.
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        1000,
        bbuf.addr() + 2048,
        bmr.rkey(),
        0,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.opcode, wc.wqe_opcode as u32, wc.qpn, wc.wqe_counter),
        (gds::WC_SEND_DONE, gds::OP_RDMA_WRITE, a.qpn(), 0)
    );
    assert_eq!(read(bbuf.addr() + 2048, 1000), data);

    // RDMA read back into a at 1024, 600 bytes.
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_RDMA_READ,
        abuf.addr() + 1024,
        amr.lkey(),
        600,
        bbuf.addr() + 2048,
        bmr.rkey(),
        0,
        gds::SIGNALED | gds::FENCE,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.wqe_opcode as u32, wc.byte_len, wc.wqe_counter),
        (gds::OP_RDMA_READ, 600, 1)
    );
    assert_eq!(read(abuf.addr() + 1024, 600), data[..600]);

    // Write with immediate (takes a receive, no data in it) and send with immediate.
    assert_eq!(gds::qp_post_recv(&mut qb, 0, 0, 0), code::OK);
    assert_eq!(
        gds::qp_post_recv(&mut qb, bbuf.addr(), 64, bmr.lkey()),
        code::OK
    );
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_RDMA_WRITE_IMM,
        abuf.addr(),
        amr.lkey(),
        100,
        bbuf.addr() + 3000,
        bmr.rkey(),
        0xdead_beef,
        0, // unsignalled: completes with the next signalled send
    );
    assert_eq!(rc, code::OK);
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_SEND_IMM,
        abuf.addr() + 10,
        amr.lkey(),
        50,
        0,
        0,
        0x0102_0304,
        gds::SIGNALED | gds::SOLICITED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.wqe_counter),
        (gds::WC_RECV_WRITE_IMM, 0xdead_beef, 100, 0)
    );
    assert_eq!(read(bbuf.addr() + 3000, 100), data[..100]);
    assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.qpn),
        (gds::WC_RECV_IMM, 0x0102_0304, 50, b.qpn())
    );
    assert_eq!(read(bbuf.addr(), 50), data[10..60]);
    // One completion for both sends; it frees both slots.
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.wqe_opcode as u32, wc.wqe_counter),
        (gds::OP_SEND_IMM, 3)
    );
    assert_eq!(qa.send_cq.wq_ci, 4);
    assert_eq!(gds::qp_send_room(&qa), qa.sq_wqebbs);

    // Inline: a send of 28 bytes from the "kernel's registers", and an 8-byte write.
    assert_eq!(
        gds::qp_post_recv(&mut qb, bbuf.addr() + 100, 64, bmr.lkey()),
        code::OK
    );
    let inline = message(2, 3, 28);
    assert_eq!(
        gds::qp_post_send_inline(&mut qa, gds::OP_SEND, &inline, 0, 0, 0, gds::SIGNALED),
        code::OK
    );
    assert_eq!(
        gds::qp_post_send_inline(
            &mut qa,
            gds::OP_RDMA_WRITE,
            &0x1122_3344_5566_7788u64.to_ne_bytes(),
            bbuf.addr() + 4000,
            bmr.rkey(),
            0,
            gds::SIGNALED
        ),
        code::OK
    );
    assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(wc.byte_len, 28);
    assert_eq!(read(bbuf.addr() + 100, 28), inline);
    for _ in 0..2 {
        assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    }
    assert_eq!(
        read(bbuf.addr() + 4000, 8),
        0x1122_3344_5566_7788u64.to_ne_bytes()
    );
    // Arguments the header refuses, writing nothing.
    let before = qa;
    assert_eq!(
        gds::qp_post_send_inline(&mut qa, gds::OP_SEND, &[0; 29], 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(
        gds::qp_post_send_inline(&mut qa, gds::OP_RDMA_READ, &[0; 8], 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(
        gds::qp_post_send(&mut qa, 0x11, 0, 0, 8, 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(qa, before);
}

/// A full send ring refuses a post and writes nothing; completions make room. A full
/// receive ring refuses too. Nothing outstanding is lost.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qp_full_rings_are_refused_without_overwriting() {
    let cfg = QpConfig {
        send_wqebbs: 16,
        recv_wqes: 16,
        ..QpConfig::default()
    };
    let (_dev, pd, a, b) = connected(&cfg);
    let (abuf, amr) = pinned(&pd, 4096);
    let (bbuf, bmr) = pinned(&pd, 4096);
    let (a, b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let (mut qa, mut qb) = (a.desc(), b.desc());
    for k in 0..16u64 {
        write(abuf.addr() + 8 * k, &(100 + k).to_ne_bytes());
    }
    // 16 writes fill the ring; only the last is signalled.
    for k in 0..16u64 {
        let flags = if k == 15 { gds::SIGNALED } else { 0 };
        let rc = gds::qp_post_send(
            &mut qa,
            gds::OP_RDMA_WRITE,
            abuf.addr() + 8 * k,
            amr.lkey(),
            8,
            bbuf.addr() + 8 * k,
            bmr.rkey(),
            0,
            flags,
        );
        assert_eq!(rc, code::OK, "post {k}");
    }
    assert_eq!(gds::qp_send_room(&qa), 0);
    let slot0 = read(qa.sq, 64);
    let before = qa;
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        8,
        bbuf.addr() + 1000,
        bmr.rkey(),
        0,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::FULL);
    assert_eq!(
        gds::qp_post_send_inline(&mut qa, gds::OP_SEND, &[1], 0, 0, 0, 0),
        code::FULL
    );
    assert_eq!(qa, before, "a refused post changes nothing");
    assert_eq!(read(qa.sq, 64), slot0, "the oldest WQE was not overwritten");
    let mut wc = Wc::default();
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(wc.wqe_counter, 15);
    assert_eq!(gds::qp_send_room(&qa), 16, "one completion freed all 16");
    for k in 0..16u64 {
        assert_eq!(read(bbuf.addr() + 8 * k, 8), (100 + k).to_ne_bytes());
    }
    assert_eq!(
        read(bbuf.addr() + 1000, 8),
        [0; 8],
        "the refused write never ran"
    );
    // The receive ring: 16 fit, the 17th is refused.
    for k in 0..16u64 {
        assert_eq!(
            gds::qp_post_recv(&mut qb, bbuf.addr() + 2048 + 64 * k, 64, bmr.lkey()),
            code::OK
        );
    }
    let before = qb;
    assert_eq!(
        gds::qp_post_recv(&mut qb, bbuf.addr(), 64, bmr.lkey()),
        code::FULL
    );
    assert_eq!(qb, before);
    // The posted receives all work.
    for k in 0..16u64 {
        let m = message(k, 5, 40);
        write(abuf.addr() + 1024, &m);
        assert_eq!(
            gds::qp_post_send_inline(&mut qa, gds::OP_SEND, &m[..28], 0, 0, 0, gds::SIGNALED),
            code::OK
        );
        assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
        assert_eq!(read(bbuf.addr() + 2048 + 64 * k, 28), m[..28]);
        assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    }
}

/// An error completion comes back as `CQE_ERROR | syndrome` (never a hang), later work is
/// flushed, the host's `Cq::check` reports it, and host polls stay refused meanwhile.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qp_errors_surface_as_codes_with_the_syndrome() {
    let (_dev, pd, a, b) = connected(&QpConfig::default());
    let (abuf, amr) = pinned(&pd, 4096);
    let (bbuf, bmr) = pinned(&pd, 4096);
    let ascq = a.scq.clone();
    assert!(
        ascq.poll_one().is_ok(),
        "the CPU polls while it owns the CQ"
    );
    let (a, _b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let mut qa = a.desc();
    let mut wc = Wc::default();
    let err = ascq.poll_one().unwrap_err().to_string();
    assert!(err.contains("kernel"), "{err}");
    // A kernel wait with nothing coming times out.
    let t = Instant::now();
    assert_eq!(
        gds::cq_wait(&mut qa.send_cq, &mut wc, 20_000_000),
        code::TIMEOUT
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    // Bad rkey.
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        64,
        bbuf.addr(),
        bmr.rkey() ^ 0x5555,
        0,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    let rc = gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS);
    assert_eq!(rc, code::CQE_ERROR | Syndrome::RemoteAccess as i32);
    assert_eq!(code::syndrome(rc), Some(Syndrome::RemoteAccess));
    assert_eq!(
        (wc.opcode, wc.syndrome, wc.wqe_opcode as u32),
        (gds::WC_REQ_ERR, 0x13, gds::OP_RDMA_WRITE)
    );
    // The QP is in error: the next send is flushed, not lost, not hung.
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_SEND,
        abuf.addr(),
        amr.lkey(),
        8,
        0,
        0,
        0,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(
        gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::CQE_ERROR | Syndrome::WrFlush as i32
    );
    let e = ascq.check().unwrap_err().to_string();
    assert!(e.contains("RemoteAccess"), "{e}");

    // Bad lkey, for a send and for an RDMA write (a fresh pair each): a local protection
    // error, whatever the opcode.
    for op in [gds::OP_SEND, gds::OP_RDMA_WRITE] {
        let (_dev2, pd2, c, d) = connected(&QpConfig::default());
        let (cbuf, cmr) = pinned(&pd2, 128);
        let (c, _d) = (c.qp.into_device().unwrap(), d.qp.into_device().unwrap());
        let mut qc = c.desc();
        let rc = gds::qp_post_send(
            &mut qc,
            op,
            cbuf.addr(),
            cmr.lkey() ^ 0x7777,
            64,
            cbuf.addr() + 64,
            cmr.rkey(),
            0,
            gds::SIGNALED,
        );
        assert_eq!(rc, code::OK);
        let rc = gds::cq_wait(&mut qc.send_cq, &mut wc, TIMEOUT_NS);
        assert_eq!(
            code::syndrome(rc),
            Some(Syndrome::LocalProt),
            "op {op:#x}: rc {rc:#x}"
        );
    }
}

/// The hand-over rules: a kernel needs dedicated, large-enough CQs and a quiet QP; the QP
/// comes back to the CPU only with nothing outstanding, and CPU posting then resumes.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn device_qp_hand_over_rules() {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let cfg = QpConfig::default();
    // One CQ for both sides.
    let cq = dev.create_cq(1024).unwrap();
    let shared = pd.create_qp(&cq, &cq, &cfg).unwrap();
    let e = shared.into_device().unwrap_err().to_string();
    assert!(e.contains("alone"), "{e}");
    // CQs smaller than the rings.
    let (s, r) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let small = pd.create_qp(&s, &r, &cfg).unwrap();
    let e = small.into_device().unwrap_err().to_string();
    assert!(e.contains("overrun"), "{e}");
    // Outstanding receive; prepared send never committed.
    let (_d, _pd, mut a, mut b) = connected(&cfg);
    b.qp.post_recv(&RecvWr::new()).unwrap();
    let e = b.qp.into_device().unwrap_err().to_string();
    assert!(e.contains("outstanding"), "{e}");
    let p = a.qp.prepare_send(&SendWr::send()).unwrap();
    drop(p);
    let e = a.qp.into_device().unwrap_err().to_string();
    assert!(e.contains("never committed"), "{e}");

    // A clean pair goes to the "kernel" and back.
    let (_d, pd, a, b) = connected(&cfg);
    let (abuf, amr) = pinned(&pd, 64);
    let (bbuf, bmr) = pinned(&pd, 64);
    let (ascq, brcq) = (a.scq.clone(), b.rcq.clone());
    let (a, b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let (mut qa, mut qb) = (a.desc(), b.desc());
    let mut wc = Wc::default();
    assert_eq!(
        gds::qp_post_recv(&mut qb, abuf.addr(), 64, amr.lkey()),
        code::OK
    );
    // The receive is outstanding: the QP stays with the kernel, returned in the error.
    let b = match b.into_host() {
        Ok(_) => panic!("into_host with a receive outstanding"),
        Err(e) => {
            assert!(e.to_string().contains("outstanding"), "{e}");
            *e.qp
        }
    };
    assert_eq!(
        gds::qp_post_send_inline(&mut qa, gds::OP_SEND, b"hello", 0, 0, 0, gds::SIGNALED),
        code::OK
    );
    assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    let (mut a, mut b) = (a.into_host().unwrap(), b.into_host().unwrap());
    assert_eq!(read(abuf.addr(), 5), b"hello");
    // The CPU posts and polls again, at the counters the kernel left.
    assert_eq!(ascq.consumer_index(), 1);
    b.post_recv(&RecvWr::new().sge(bmr.sge(..)).wr_id(5))
        .unwrap();
    let t = a
        .post_send(&SendWr::send().sge(amr.sge(0..5)).wr_id(6))
        .unwrap();
    assert_eq!(
        t.index, 1,
        "the send ring continues after the kernel's send"
    );
    let c = ascq
        .wait_one(Duration::from_secs(20))
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(c.wr_id, 6);
    let c = brcq
        .wait_one(Duration::from_secs(20))
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!((c.wr_id, c.byte_len), (5, 5));
    assert_eq!(read(bbuf.addr(), 5), b"hello");
}

// ------------------------------------------------------------------ mp kernel channels

/// Ranks as threads, each a "persistent kernel" driving its peer descriptors: ping-pongs of
/// messages of varying lengths through credits, data checked on arrival, in two "launches"
/// (the second resumes from the descriptors the host refreshes).
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channels_ping_pong_between_thread_ranks() {
    const ITERS: u64 = 1000;
    const MAX: usize = 512;
    let results = kernel_channel_ranks(8, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 2 * MAX);
        let len = |i: u64| 1 + (i as usize * 53) % MAX;
        let table = ch.descs().unwrap();
        assert_eq!(table.len(), 2);
        let mut own = table[me];
        assert_eq!(
            gds::peer_send(&mut own, 0, 0, 0, 1_000_000),
            code::INVALID,
            "this rank's own entry is refused"
        );
        let (send_at, recv_at) = (buf.addr(), buf.addr() + MAX as u64);
        let launch = |range: std::ops::Range<u64>| {
            let mut p: PeerDesc = ch.desc(peer).unwrap();
            for i in range {
                let mut got = 0u32;
                let recv = |p: &mut PeerDesc, got: &mut u32| {
                    // Every other wait skips the byte count (len null), the data must agree.
                    let want = i % 2 == 0;
                    assert_eq!(
                        gds::peer_wait_recv(p, want.then_some(&mut *got), TIMEOUT_NS),
                        code::OK,
                        "{me}: receive {i}"
                    );
                    assert_eq!(*got as usize, if want { len(i) } else { 0 });
                    assert_eq!(read(recv_at, len(i)), message(i, peer as u8, len(i)));
                };
                assert_eq!(
                    gds::peer_recv(&mut p, recv_at, mr.lkey(), MAX as u32, TIMEOUT_NS),
                    code::OK
                );
                if me == 1 {
                    recv(&mut p, &mut got);
                }
                write(send_at, &message(i, me as u8, len(i)));
                assert_eq!(
                    gds::peer_send(&mut p, send_at, mr.lkey(), len(i) as u32, TIMEOUT_NS),
                    code::OK,
                    "{me}: send {i}"
                );
                assert_eq!(gds::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
                if me == 0 {
                    recv(&mut p, &mut got);
                }
            }
        };
        launch(0..ITERS / 2);
        launch(ITERS / 2..ITERS);
        ch.progress(peer).unwrap()
    });
    for st in results {
        assert_eq!(
            (
                st.sends,
                st.sends_waited,
                st.recvs,
                st.recvs_waited,
                st.error
            ),
            (ITERS, ITERS, ITERS, ITERS, 0)
        );
        assert_eq!(st.sends_done, ITERS);
    }
}

/// Prepared sends (`gds_peer_prepare_send`, then `gds_peer_ring_send` once the data is in
/// place), as `pingpong --api mp --trigger kernel` answers: each rank prepares its next send
/// while the peer works and rings it after its wait; every message lands byte for byte, the
/// bytes written after the prepare included, and the counters add up. While a send is
/// prepared the channel refuses a credit, a second prepare and a wait's NOP; a ring with
/// nothing prepared is refused.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channels_ring_sends_prepared_ahead() {
    const ITERS: u64 = 600;
    const MAX: usize = 256;
    let results = kernel_channel_ranks(8, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 2 * MAX);
        let len = |i: u64| 4 + (i as usize * 37) % (MAX - 4);
        let (send_at, recv_at) = (buf.addr(), buf.addr() + MAX as u64);
        let mut p: PeerDesc = ch.desc(peer).unwrap();
        assert_eq!(
            gds::peer_ring_send(&mut p),
            code::INVALID,
            "nothing prepared"
        );
        // Receives for the first messages, one credit.
        for _ in 0..4 {
            assert_eq!(
                gds::peer_post_recv(&mut p, recv_at, mr.lkey(), MAX as u32),
                code::OK
            );
        }
        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
        let prepare = |p: &mut PeerDesc, i: u64| {
            let flags = if i % 8 == 7 || i + 1 == ITERS {
                gds::SIGNALED
            } else {
                0
            };
            let rc =
                gds::peer_prepare_send(p, send_at, mr.lkey(), len(i) as u32, flags, TIMEOUT_NS);
            assert_eq!(rc, code::OK, "{me}: prepare {i}");
        };
        prepare(&mut p, 0);
        // While prepared: no second prepare, no credit, no NOP of a wait for sends.
        assert_eq!(
            gds::peer_prepare_send(&mut p, send_at, mr.lkey(), 4, 0, TIMEOUT_NS),
            code::INVALID
        );
        assert_eq!(
            gds::peer_post_recv(&mut p, recv_at, mr.lkey(), MAX as u32),
            code::OK
        );
        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::INVALID);
        assert_eq!(gds::peer_wait_send(&mut p, TIMEOUT_NS), code::INVALID);
        let recv = |p: &mut PeerDesc, i: u64| {
            let mut got = 0u32;
            let rc = gds::peer_wait_recv(p, Some(&mut got), TIMEOUT_NS);
            assert_eq!(rc, code::OK, "{me}: receive {i}");
            assert_eq!(got as usize, len(i));
            assert_eq!(read(recv_at, len(i)), message(i, peer as u8, len(i)));
        };
        for i in 0..ITERS {
            if me == 1 {
                recv(&mut p, i);
            }
            // The data goes in after the prepare, before the ring.
            write(send_at, &message(i, me as u8, len(i)));
            assert_eq!(gds::peer_ring_send(&mut p), code::OK, "{me}: ring {i}");
            // The send just rung completes before its buffer is written again; then the
            // receive consumed is posted again, credited, and the next send prepared.
            assert_eq!(
                gds::peer_wait_send(&mut p, TIMEOUT_NS),
                code::OK,
                "{me}: send {i}"
            );
            if me == 0 {
                recv(&mut p, i);
            }
            if i + 1 < ITERS {
                if i > 0 || me == 1 {
                    let rc = gds::peer_post_recv(&mut p, recv_at, mr.lkey(), MAX as u32);
                    assert_eq!(rc, code::OK);
                }
                assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
                prepare(&mut p, i + 1);
            }
        }
        ch.progress(peer).unwrap()
    });
    for st in results {
        assert_eq!(
            (
                st.sends,
                st.sends_waited,
                st.sends_done,
                st.recvs_waited,
                st.error
            ),
            (ITERS, ITERS, ITERS, ITERS, 0)
        );
    }
}

/// What a prepared send leaves of the channel's bookkeeping: a wait for an earlier send whose
/// completion came passes while a signalled send is prepared (credit write in between);
/// refusals come at once, before any wait for credits or room (a second prepare with no
/// spare credit, a credit write, a wait that needs a NOP); a send prepared and never rung
/// when the "kernel" ends is not counted, and the next launch sends in its place.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn prepared_sends_keep_waits_and_counts_exact() {
    const LEN: usize = 64;
    let results = kernel_channel_ranks(8, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 8 * LEN);
        let (send_at, recv_at) = (buf.addr(), buf.addr() + 4 * LEN as u64);
        let key = mr.lkey();
        let mut p: PeerDesc = ch.desc(peer).unwrap();
        let post_recv = |p: &mut PeerDesc, k: u64| {
            let at = recv_at + k * LEN as u64;
            assert_eq!(gds::peer_post_recv(p, at, key, LEN as u32), code::OK);
        };
        let at_once = |what: &str, f: &mut dyn FnMut() -> i32| {
            let t = Instant::now();
            assert_eq!(f(), code::INVALID, "{me}: {what}");
            assert!(t.elapsed() < Duration::from_secs(1), "{me}: {what} waited");
        };
        for k in 0..3 {
            post_recv(&mut p, k);
        }
        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
        write(send_at, &message(0, me as u8, LEN));
        let rc = gds::peer_send_flags(&mut p, send_at, key, LEN as u32, gds::SIGNALED, TIMEOUT_NS);
        assert_eq!(rc, code::OK);
        // An unsignalled credit write after the signalled send, then a signalled send prepared.
        post_recv(&mut p, 3);
        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
        let s1 = send_at + LEN as u64;
        let rc = gds::peer_prepare_send(&mut p, s1, key, LEN as u32, gds::SIGNALED, TIMEOUT_NS);
        assert_eq!(rc, code::OK);
        assert_eq!(
            gds::peer_wait_send(&mut p, TIMEOUT_NS),
            code::OK,
            "{me}: the first send"
        );
        let short = 2_000_000_000;
        at_once("second prepare", &mut || {
            gds::peer_prepare_send(&mut p, s1, key, LEN as u32, 0, short)
        });
        // A receive to credit (with nothing to credit, a credit posts nothing at all).
        post_recv(&mut p, 3);
        at_once("credit write", &mut || gds::peer_give_credit(&mut p, short));
        at_once("wait for the prepared send", &mut || {
            gds::peer_wait_send(&mut p, short)
        });
        write(s1, &message(1, me as u8, LEN));
        assert_eq!(gds::peer_ring_send(&mut p), code::OK);
        assert_eq!(
            gds::peer_wait_send(&mut p, TIMEOUT_NS),
            code::OK,
            "{me}: the second send"
        );
        for i in 0..2u64 {
            assert_eq!(gds::peer_wait_recv(&mut p, None, TIMEOUT_NS), code::OK);
            let at = recv_at + i * LEN as u64;
            assert_eq!(
                read(at, LEN),
                message(i, peer as u8, LEN),
                "{me}: message {i}"
            );
        }
        // A send prepared and never rung: the "kernel" ends, the next launch sends instead.
        let s2 = send_at + 2 * LEN as u64;
        let rc = gds::peer_prepare_send(&mut p, s2, key, LEN as u32, 0, TIMEOUT_NS);
        assert_eq!(rc, code::OK);
        assert_eq!(
            ch.progress(peer).unwrap().sends,
            2,
            "{me}: the unrung send is not counted"
        );
        let mut p: PeerDesc = ch.desc(peer).unwrap();
        write(s2, &message(2, me as u8, LEN));
        assert_eq!(
            gds::peer_send(&mut p, s2, key, LEN as u32, TIMEOUT_NS),
            code::OK
        );
        assert_eq!(gds::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
        assert_eq!(gds::peer_wait_recv(&mut p, None, TIMEOUT_NS), code::OK);
        let at = recv_at + 2 * LEN as u64;
        assert_eq!(
            read(at, LEN),
            message(2, peer as u8, LEN),
            "{me}: message 2"
        );
        ch.progress(peer).unwrap()
    });
    for st in results {
        assert_eq!(
            (
                st.sends,
                st.sends_done,
                st.sends_waited,
                st.recvs_waited,
                st.error
            ),
            (3, 3, 3, 3, 0)
        );
    }
}

/// Kernel-channel failures come back as codes: a send with no receive posted times out
/// (nothing sent), a message longer than the receive fails both sides with their syndromes,
/// and every later call returns the channel's first error.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channel_errors_and_timeouts() {
    kernel_channel_ranks(4, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 256);
        let mut p = ch.desc(peer).unwrap();
        if me == 0 {
            // No credit yet: the send times out and posts nothing.
            let t = Instant::now();
            assert_eq!(
                gds::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert!(t.elapsed() < Duration::from_secs(10));
            assert_eq!(p.sends, 0);
            assert_eq!(gds::peer_wait_send(&mut p, 1000), code::INVALID);
        }
        comm.barrier().unwrap();
        if me == 1 {
            assert_eq!(
                gds::peer_recv(&mut p, buf.addr(), mr.lkey(), 16, TIMEOUT_NS),
                code::OK
            );
            // Without the byte count the error completion is still seen, with its syndrome.
            let rc = gds::peer_wait_recv(&mut p, None, TIMEOUT_NS);
            assert_eq!(code::syndrome(rc), Some(Syndrome::LocalLength), "{rc:#x}");
        } else {
            assert_eq!(
                gds::peer_send(&mut p, buf.addr(), mr.lkey(), 200, TIMEOUT_NS),
                code::OK
            );
            let rc = gds::peer_wait_send(&mut p, TIMEOUT_NS);
            assert_eq!(
                code::syndrome(rc),
                Some(Syndrome::RemoteInvalReq),
                "{rc:#x}"
            );
        }
        // Sticky: the channel reports its error from now on, and the host sees it.
        let first = p.error as i32;
        assert_eq!(
            gds::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 1000),
            first
        );
        assert_eq!(ch.progress(peer).unwrap().error as i32, first);
    });
}

// ------------------------------------------------------------------ staged kernel channels

/// `len` bytes of `buf` at `off` are `want` and every other byte is still `fill`.
fn landed(buf: &[u8], off: usize, want: &[u8], fill: u8, what: &str) {
    assert_eq!(&buf[off..off + want.len()], want, "{what}: bytes");
    assert!(
        buf[..off]
            .iter()
            .chain(&buf[off + want.len()..])
            .all(|&b| b == fill),
        "{what}: bytes outside the message changed"
    );
}

/// Staged kernel channels (bounces of 250 bytes, rounded up to 256; 8 send and 4 receive
/// slots): ping-pongs of lengths 0 to the whole slot, from and into host stand-ins for GPU
/// memory at odd offsets, byte for byte with nothing around them touched, in two "launches".
/// Sends alternate between the block-wide steps (the bounce taken, copied into by three
/// "threads", sent) and `gds_peer_send_staged`, one in four signalled; receives between
/// `gds_peer_wait_recv_staged` and the wait plus a copy out of `gds_peer_recv_bounce`. 400
/// messages each way reuse every slot 50 to 100 times.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn staged_kernel_channels_ping_pong_at_odd_sizes_and_offsets() {
    const ITERS: u64 = 400;
    let results = staged_channel_ranks(4, 250, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let st = ch.staging().unwrap();
        assert_eq!((st.slot_bytes, st.send_slots, st.recv_slots), (256, 8, 4));
        assert_eq!(ch.path(), GpuMemoryPath::Staged);
        let slot = st.slot_bytes as usize;
        let len = |i: u64| match i % 50 {
            7 => slot,
            13 => 0,
            _ => 1 + (i as usize * 53) % slot,
        };
        let launch = |range: std::ops::Range<u64>| {
            let mut p: PeerDesc = ch.desc(peer).unwrap();
            for i in range {
                let take = |p: &mut PeerDesc| {
                    let (off, mut got) = ((i * 3 % 19) as usize, 0u32);
                    let mut dst = vec![0xeeu8; slot + 32];
                    if i % 2 == 0 {
                        let cap = &mut dst[off..off + slot];
                        let rc = gds::peer_wait_recv_staged(p, cap, Some(&mut got), TIMEOUT_NS);
                        assert_eq!(rc, code::OK, "{me}: receive {i}");
                    } else {
                        let rc = gds::peer_wait_recv(p, Some(&mut got), TIMEOUT_NS);
                        assert_eq!(rc, code::OK, "{me}: receive {i}");
                        let bounce = read(gds::peer_recv_bounce(p), got as usize);
                        gds::copy_parts(&mut dst[off..off + got as usize], &bounce, 3);
                    }
                    assert_eq!(got as usize, len(i), "{me}: length of {i}");
                    landed(&dst, off, &message(i, peer as u8, len(i)), 0xee, "receive");
                };
                let rc = gds::peer_recv_staged(&mut p, slot as u32, TIMEOUT_NS);
                assert_eq!(rc, code::OK, "{me}: post {i}");
                if me == 1 {
                    take(&mut p);
                }
                let off = (i * 5 % 17) as usize;
                let mut src = vec![0x55u8; slot + 32];
                src[off..off + len(i)].copy_from_slice(&message(i, me as u8, len(i)));
                let msg = &src[off..off + len(i)];
                let flags = if i % 4 == 3 { gds::SIGNALED } else { 0 };
                let rc = if i % 3 == 0 {
                    let bounce = gds::peer_next_send_bounce(&mut p, TIMEOUT_NS).unwrap();
                    let mut staged = vec![0u8; msg.len()];
                    gds::copy_parts(&mut staged, msg, 3);
                    write(bounce, &staged);
                    gds::peer_send_bounce(&mut p, len(i) as u32, flags, TIMEOUT_NS)
                } else {
                    gds::peer_send_staged(&mut p, msg, flags, TIMEOUT_NS)
                };
                assert_eq!(rc, code::OK, "{me}: send {i}");
                if me == 0 {
                    take(&mut p);
                }
            }
            let n = p.sends - p.sends_waited;
            assert_eq!(gds::peer_wait_sends(&mut p, n, TIMEOUT_NS), code::OK);
        };
        launch(0..ITERS / 2);
        launch(ITERS / 2..ITERS);
        ch.progress(peer).unwrap()
    });
    for st in results {
        let n = ITERS;
        assert_eq!(peer_counts(&st), (n, n, n, n, n, 0));
    }
}

/// One way, 300 unsignalled staged sends through 16 send bounces (depth 8) while the receiver
/// keeps 8 staged receives posted and credits them 4 at a time: each bounce is reused ~19
/// times, a bounce is taken again only once the send before it is known complete (the sender
/// polls, or posts a NOP, first), sending a bounce not taken that way is refused, and a ninth
/// receive posted with eight outstanding is refused with GDS_FULL. Every message arrives
/// intact and every send is counted done.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn staged_unsignalled_sends_reuse_their_bounces() {
    const N: u64 = 300;
    let out = staged_channel_ranks(8, 100, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let st = ch.staging().unwrap();
        let slot = st.slot_bytes;
        let len = |i: u64| 1 + (i as u32 * 29) % slot;
        let mut p = ch.desc(peer).unwrap();
        let mut refused = 0;
        if me == 1 {
            for _ in 0..st.recv_slots {
                assert_eq!(gds::peer_post_recv_staged(&mut p, slot), code::OK);
            }
            assert_eq!(gds::peer_post_recv_staged(&mut p, slot), code::FULL);
            assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            for i in 0..N {
                let (mut dst, mut got) = (vec![0u8; slot as usize], 0u32);
                let rc = gds::peer_wait_recv_staged(&mut p, &mut dst, Some(&mut got), TIMEOUT_NS);
                assert_eq!(rc, code::OK, "receive {i}");
                assert_eq!(&dst[..got as usize], message(i, 0, len(i) as usize), "{i}");
                if p.recvs < N {
                    assert_eq!(gds::peer_post_recv_staged(&mut p, slot), code::OK);
                    if p.recvs - p.credited >= 4 || p.recvs == N {
                        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
                    }
                }
            }
        } else {
            for i in 0..N {
                if p.sends_done + u64::from(st.send_slots) <= p.sends {
                    let rc = gds::peer_send_bounce(&mut p, 1, 0, TIMEOUT_NS);
                    assert_eq!(
                        rc,
                        code::INVALID,
                        "a bounce whose last send is not known done"
                    );
                    refused += 1;
                }
                let sends = p.sends;
                let bounce = gds::peer_next_send_bounce(&mut p, TIMEOUT_NS).unwrap();
                assert!(p.sends_done + u64::from(st.send_slots) > sends);
                write(bounce, &message(i, 0, len(i) as usize));
                assert_eq!(
                    gds::peer_send_bounce(&mut p, len(i), 0, TIMEOUT_NS),
                    code::OK
                );
            }
            assert_eq!(gds::peer_wait_sends(&mut p, N, TIMEOUT_NS), code::OK);
        }
        (refused, ch.progress(peer).unwrap())
    });
    assert!(out[0].0 > 0, "the sender met a bounce still in use");
    let (s, r) = (out[0].1, out[1].1);
    assert_eq!(
        (s.sends, s.sends_done, s.sends_waited, s.error),
        (N, N, N, 0)
    );
    assert_eq!((r.recvs, r.recvs_waited, r.error), (N, N, 0));
}

/// What staged calls refuse without waiting or posting (a message longer than the slot, a
/// receive longer than it, this rank's own entry, a channel without bounces), then an error
/// in the middle of a stream: five messages pass, then a receive too short (8 bytes) for the
/// next (40) fails both sides with their syndromes, releasing the receiver's wait and the
/// sender's wait for its unsignalled sends; every later staged call returns that error, and
/// nothing is copied out of the failed receive.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn staged_channel_refusals_and_an_error_mid_stream() {
    staged_channel_ranks(4, 64, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let slot = ch.staging().unwrap().slot_bytes;
        assert_eq!(slot, 64);
        let mut p = ch.desc(peer).unwrap();
        let t = Instant::now();
        let long = vec![1u8; slot as usize + 1];
        assert_eq!(
            gds::peer_send_staged(&mut p, &long, gds::SIGNALED, TIMEOUT_NS),
            code::INVALID
        );
        assert_eq!(
            gds::peer_send_bounce(&mut p, slot + 1, 0, TIMEOUT_NS),
            code::INVALID
        );
        assert_eq!(gds::peer_post_recv_staged(&mut p, slot + 1), code::INVALID);
        assert_eq!(gds::peer_recv_bounce(&p), 0, "nothing received yet");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "refusals wait for nothing"
        );
        assert_eq!((p.sends, p.recvs), (0, 0));
        let mut own = ch.descs().unwrap()[me];
        assert_eq!(
            gds::peer_next_send_bounce(&mut own, 1000),
            Err(code::INVALID)
        );
        assert_eq!(gds::peer_post_recv_staged(&mut own, 8), code::INVALID);
        let mut plain = p;
        (plain.slot_bytes, plain.send_slots, plain.recv_slots) = (0, 0, 0);
        assert_eq!(
            gds::peer_next_send_bounce(&mut plain, 1000),
            Err(code::INVALID)
        );
        assert_eq!(gds::peer_post_recv_staged(&mut plain, 0), code::INVALID);
        let mut dst = vec![0xeeu8; slot as usize];
        assert_eq!(
            gds::peer_wait_recv_staged(&mut plain, &mut dst, None, 1000),
            code::INVALID
        );
        comm.barrier().unwrap();
        let len = |i: u64| if i == 5 { 40 } else { 8 + i as usize };
        let rc = if me == 1 {
            for i in 0..5 {
                assert_eq!(gds::peer_recv_staged(&mut p, slot, TIMEOUT_NS), code::OK);
                let mut got = 0;
                let rc = gds::peer_wait_recv_staged(&mut p, &mut dst, Some(&mut got), TIMEOUT_NS);
                assert_eq!(rc, code::OK);
                assert_eq!(&dst[..got as usize], message(i, 0, len(i)));
            }
            dst.fill(0xee);
            assert_eq!(gds::peer_recv_staged(&mut p, 8, TIMEOUT_NS), code::OK);
            let rc = gds::peer_wait_recv_staged(&mut p, &mut dst, None, TIMEOUT_NS);
            assert_eq!(code::syndrome(rc), Some(Syndrome::LocalLength), "{rc:#x}");
            assert!(dst.iter().all(|&b| b == 0xee), "nothing copied out");
            assert_eq!(gds::peer_post_recv_staged(&mut p, slot), rc);
            assert_eq!(gds::peer_wait_recv_staged(&mut p, &mut dst, None, 1000), rc);
            rc
        } else {
            for i in 0..6 {
                let rc = gds::peer_send_staged(&mut p, &message(i, 0, len(i)), 0, TIMEOUT_NS);
                assert_eq!(rc, code::OK, "send {i}");
            }
            let rc = gds::peer_wait_sends(&mut p, 6, TIMEOUT_NS);
            assert_eq!(
                code::syndrome(rc),
                Some(Syndrome::RemoteInvalReq),
                "{rc:#x}"
            );
            assert_eq!(gds::peer_next_send_bounce(&mut p, 1000), Err(rc));
            assert_eq!(
                gds::peer_send_staged(&mut p, &[1; 4], gds::SIGNALED, 1000),
                rc
            );
            rc
        };
        assert_eq!(ch.progress(peer).unwrap().error as i32, rc);
    });
}

/// Staged kernel channels check their sizes before anything collective (a bounce of 0 or over
/// 1 GiB, bounces over 16 GiB of pinned memory, a bad depth), and every rank must stage alike:
/// where one rank's bounces differ from another's, or one stages and the other does not,
/// every rank gets an error saying so. `kernel_channels_for` follows the path.
#[test]
fn staged_kernel_channels_check_sizes_and_agreement() {
    let dev = Device::soft().unwrap();
    let mut one = Comm::new(Box::new(ThreadBootstrap::group(1).pop().unwrap()), &dev).unwrap();
    for (depth, bounce, says) in [
        (4, 0, "out of 1..=1 GiB"),
        (4, MAX_KERNEL_BOUNCE + 1, "out of 1..=1 GiB"),
        (1 << 14, MAX_KERNEL_BOUNCE, "16 GiB"),
        (0, 64, "depth 0"),
    ] {
        let e = one.kernel_channels_staged(depth, bounce).unwrap_err();
        assert!(e.to_string().contains(says), "{depth} x {bounce}: {e}");
    }
    let direct = one
        .kernel_channels_for(4, GpuMemoryPath::Direct, 64)
        .unwrap();
    assert_eq!(
        (direct.path(), direct.staging()),
        (GpuMemoryPath::Direct, None)
    );
    drop(direct);
    let staged = one
        .kernel_channels_for(4, GpuMemoryPath::Staged, 64)
        .unwrap();
    assert_eq!(staged.path(), GpuMemoryPath::Staged);
    drop(staged);
    one.finalize().unwrap();
    for bounces in [[Some(256), Some(512)], [Some(256), None]] {
        let errs: Vec<String> = std::thread::scope(|s| {
            let ranks: Vec<_> = ThreadBootstrap::group(2)
                .into_iter()
                .zip(bounces)
                .map(|(boot, bounce)| {
                    let dev = &dev;
                    s.spawn(move || {
                        let mut comm = Comm::new(Box::new(boot), dev).unwrap();
                        let e = match bounce {
                            Some(b) => comm.kernel_channels_staged(4, b).unwrap_err(),
                            None => comm.kernel_channels(4).unwrap_err(),
                        };
                        comm.finalize().unwrap();
                        e.to_string()
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for e in errs {
            assert!(e.contains("same bounce size"), "{bounces:?}: {e}");
        }
    }
}

/// (size, iters, recv_batch, sig_every) of the `mp_pp` schedules: the defaults, one credit
/// per receive, every send signalled (the former schedule), a batch as deep as the ring with a
/// period longer than half the send ring (the header then signals on its own), odd ones.
const SCHEDULES: [(u32, u64, u32, u64); 8] = [
    (8, 300, 16, 16),
    (4096, 150, 16, 16),
    (64, 1, 16, 16),
    (8, 200, 1, 16),
    (8, 100, 1, 1),
    (8, 300, 64, 100),
    (8, 37, 5, 7),
    (101, 37, 5, 7),
];

/// The schedule of `mp_pp` (`pingpong --api mp --trigger kernel`, in
/// examples/pingpong/kernels.cu), line by line, with a thread per rank in the kernel's place:
/// 64 receives posted ahead on a channel of depth 64 with one credit and the first send
/// prepared, then per iteration (rank 1 takes the message first) the marker, the prepared send
/// rung (one in `sig_every` signalled, and the last), the wait for the sends up to the previous
/// one when it was signalled, the consumed receive posted again with a credit per
/// `recv_batch`, the next send prepared, then (rank 0) the answer; the sends left waited at
/// the end. Each rank posts exactly `iters` receives (none left
/// over), never finds a ring full, and the last message's marker is in its buffer. The GPU
/// runs the kernel itself in tests/gpu_mp.rs.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn pingpong_kernel_schedule_between_thread_ranks() {
    const AHEAD: u32 = 64;
    for (size, iters, batch, sig_every) in SCHEDULES {
        let results = kernel_channel_ranks(AHEAD, |comm, ch| {
            let (rank, peer) = (comm.rank() as u64, 1 - comm.rank());
            let (sbuf, smr) = pinned(comm.pd(), size as usize);
            let (rbuf, rmr) = pinned(comm.pd(), size as usize);
            let mut p: PeerDesc = ch.desc(peer).unwrap();
            let (mut len, mut at, mut step) = (0u32, 0u64, 0);
            let mut credits_given = 0u64;
            let mut run = || -> i32 {
                macro_rules! check {
                    ($s:expr, $x:expr) => {{
                        step = $s;
                        let r = $x;
                        if r != code::OK {
                            return r;
                        }
                    }};
                }
                macro_rules! take {
                    () => {{
                        // mp_pp reads the byte count of the last message only.
                        let last = at + 1 == iters;
                        let want = last.then_some(&mut len);
                        check!(4, gds::peer_wait_recv(&mut p, want, TIMEOUT_NS));
                        if last && len != size {
                            return 0x1000;
                        }
                    }};
                }
                while p.recvs < iters && p.recvs < AHEAD as u64 {
                    let r = gds::peer_post_recv(&mut p, rbuf.addr(), rmr.lkey(), size);
                    check!(1, r);
                }
                check!(5, gds::peer_give_credit(&mut p, TIMEOUT_NS));
                credits_given += 1;
                macro_rules! prepare {
                    ($k:expr) => {{
                        let k = $k;
                        let signaled = k % sig_every == sig_every - 1 || k + 1 == iters;
                        let flags = if signaled { gds::SIGNALED } else { 0 };
                        let (addr, key) = (sbuf.addr(), smr.lkey());
                        let r = gds::peer_prepare_send(&mut p, addr, key, size, flags, TIMEOUT_NS);
                        check!(2, r);
                    }};
                }
                if iters > 0 {
                    prepare!(0);
                }
                while at < iters {
                    let i = at;
                    if rank == 1 {
                        take!();
                    }
                    let marker = (2 * i + 1 + rank) as u32;
                    write(sbuf.addr() + size as u64 - 4, &marker.to_ne_bytes());
                    check!(2, gds::peer_ring_send(&mut p));
                    if i > 0 && (i - 1) % sig_every == sig_every - 1 {
                        let n = p.sends - 1 - p.sends_waited;
                        check!(3, gds::peer_wait_sends(&mut p, n, TIMEOUT_NS));
                    }
                    if (rank == 1 || i > 0) && p.recvs < iters {
                        let r = gds::peer_post_recv(&mut p, rbuf.addr(), rmr.lkey(), size);
                        check!(1, r);
                        if p.recvs - p.credited >= batch as u64 || p.recvs == iters {
                            check!(5, gds::peer_give_credit(&mut p, TIMEOUT_NS));
                            credits_given += 1;
                        }
                    }
                    if i + 1 < iters {
                        prepare!(i + 1);
                    }
                    if rank == 0 {
                        take!();
                    }
                    at += 1;
                }
                if p.sends > p.sends_waited {
                    let n = p.sends - p.sends_waited;
                    check!(3, gds::peer_wait_sends(&mut p, n, TIMEOUT_NS));
                }
                code::OK
            };
            let rc = run();
            let last =
                u32::from_ne_bytes(read(rbuf.addr() + size as u64 - 4, 4).try_into().unwrap());
            let cqes = p.qp.send_cq.ci;
            (
                rc,
                at,
                step,
                last,
                ch.progress(peer).unwrap(),
                credits_given,
                cqes,
            )
        });
        let what = format!("size {size}, {iters} iterations, batch {batch}, period {sig_every}");
        for (rank, (rc, at, step, last, st, credits, cqes)) in results.into_iter().enumerate() {
            assert_eq!(
                (rc, at),
                (code::OK, iters),
                "{what}: rank {rank} stopped at step {step}"
            );
            assert_eq!(
                last,
                (2 * iters - rank as u64) as u32,
                "{what}: last marker"
            );
            assert_eq!(
                (
                    st.sends,
                    st.sends_done,
                    st.sends_waited,
                    st.recvs,
                    st.recvs_waited,
                    st.error
                ),
                (iters, iters, iters, iters, iters, 0),
                "{what}: rank {rank}'s channel"
            );
            // One credit for the receives posted ahead, then one per batch posted again.
            let again = iters.saturating_sub(AHEAD as u64);
            assert!(
                credits <= 2 + again / batch as u64,
                "{what}: rank {rank} gave {credits} credits"
            );
            // Completions: at most one per signalled send (plus the forced signals of a long
            // period) and per forced credit signal, far fewer than sends when sends are batched.
            let signalled_sends = iters.div_ceil(sig_every.min(32));
            assert!(
                cqes <= signalled_sends + 1 + credits / 32,
                "{what}: rank {rank} consumed {cqes} send completions"
            );
        }
    }
}

/// The schedule of `mp_pp_staged` (`pingpong --api mp --trigger kernel --mem device`, staged),
/// line by line, with a thread per rank in the kernel's place and vectors standing in for GPU
/// memory: the receives posted ahead into their bounces, then per iteration (rank 1 first) the
/// message copied out of its bounce, the marker, the next send bounce taken and filled (in four
/// "thread" parts), sent, the bookkeeping of `mp_pp` with the receive posted again into the
/// bounce just copied out, and (rank 0) the answer copied out. Every message arrives whole
/// (payload and marker), no post is refused, and each rank's channel counts every message.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn pingpong_staged_kernel_schedule_between_thread_ranks() {
    const AHEAD: u32 = 64;
    for (size, iters, batch, sig_every) in SCHEDULES {
        let what = format!("size {size}, {iters} iterations, batch {batch}, period {sig_every}");
        let results = staged_channel_ranks(AHEAD, size as usize, |comm, ch| {
            let (rank, peer) = (comm.rank() as u64, 1 - comm.rank());
            let n = size as usize;
            let (mut sdev, mut rdev, mut bad) = (vec![0u8; n], vec![0u8; n], 0u64);
            let mut p: PeerDesc = ch.desc(peer).unwrap();
            let mut copy_in = |p: &PeerDesc, i: u64, rdev: &mut Vec<u8>| {
                gds::copy_parts(rdev, &read(gds::peer_recv_bounce(p), n), 4);
                let mut want = message(i, peer as u8, n);
                let marker = (2 * i + 1 + 1 - rank) as u32;
                want[n - 4..].copy_from_slice(&marker.to_ne_bytes());
                bad += (*rdev != want) as u64;
            };
            let mut run = || -> (i32, u64) {
                macro_rules! check {
                    ($i:expr, $x:expr) => {{
                        let r = $x;
                        if r != code::OK {
                            return (r, $i);
                        }
                    }};
                }
                while p.recvs < iters && p.recvs < AHEAD as u64 {
                    check!(0, gds::peer_post_recv_staged(&mut p, size));
                }
                check!(0, gds::peer_give_credit(&mut p, TIMEOUT_NS));
                for i in 0..iters {
                    if rank == 1 {
                        check!(i, gds::peer_wait_recv(&mut p, None, TIMEOUT_NS));
                        copy_in(&p, i, &mut rdev);
                    }
                    sdev = message(i, rank as u8, n);
                    let marker = (2 * i + 1 + rank) as u32;
                    sdev[n - 4..].copy_from_slice(&marker.to_ne_bytes());
                    let bounce = match gds::peer_next_send_bounce(&mut p, TIMEOUT_NS) {
                        Ok(b) => b,
                        Err(rc) => return (rc, i),
                    };
                    let mut staged = vec![0u8; n];
                    gds::copy_parts(&mut staged, &sdev, 4);
                    write(bounce, &staged);
                    let signaled = i % sig_every == sig_every - 1 || i + 1 == iters;
                    let flags = if signaled { gds::SIGNALED } else { 0 };
                    check!(i, gds::peer_send_bounce(&mut p, size, flags, TIMEOUT_NS));
                    if i > 0 && (i - 1) % sig_every == sig_every - 1 {
                        let k = p.sends - 1 - p.sends_waited;
                        check!(i, gds::peer_wait_sends(&mut p, k, TIMEOUT_NS));
                    }
                    if (rank == 1 || i > 0) && p.recvs < iters {
                        check!(i, gds::peer_post_recv_staged(&mut p, size));
                        if p.recvs - p.credited >= batch as u64 || p.recvs == iters {
                            check!(i, gds::peer_give_credit(&mut p, TIMEOUT_NS));
                        }
                    }
                    if rank == 0 {
                        check!(i, gds::peer_wait_recv(&mut p, None, TIMEOUT_NS));
                        copy_in(&p, i, &mut rdev);
                    }
                }
                if p.sends > p.sends_waited {
                    let k = p.sends - p.sends_waited;
                    check!(iters, gds::peer_wait_sends(&mut p, k, TIMEOUT_NS));
                }
                (code::OK, iters)
            };
            let (rc, at) = run();
            (rc, at, bad, ch.progress(peer).unwrap())
        });
        for (rank, (rc, at, bad, st)) in results.into_iter().enumerate() {
            assert_eq!((rc, at, bad), (code::OK, iters, 0), "{what}: rank {rank}");
            let n = iters;
            assert_eq!(peer_counts(&st), (n, n, n, n, n, 0), "{what}: rank {rank}");
        }
    }
}

/// Batched credits: receives posted without a credit do not let the peer send (its send
/// times out, posting nothing); one `give_credit` then covers all of them, with a single
/// credit write; a credit with nothing new to announce writes nothing.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channel_one_credit_covers_a_batch_of_receives() {
    const N: u64 = 8;
    kernel_channel_ranks(16, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 64 * (N as usize + 1));
        let mut p = ch.desc(peer).unwrap();
        if me == 1 {
            for k in 0..N {
                let at = buf.addr() + 64 * k;
                assert_eq!(gds::peer_post_recv(&mut p, at, mr.lkey(), 64), code::OK);
            }
            assert_eq!(
                (p.recvs, p.credited, p.qp.sq_pi),
                (N, 0, 0),
                "no credit yet"
            );
            assert_eq!(
                rq_counter(p.qp.dbrec),
                0,
                "the receives are not published before their credit"
            );
        }
        comm.barrier().unwrap();
        if me == 0 {
            // Receives are posted at the peer, but not credited: no send goes out.
            assert_eq!(
                gds::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert_eq!((p.sends, p.qp.sq_pi), (0, 0));
        }
        comm.barrier().unwrap();
        if me == 1 {
            assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!((p.credited, p.qp.sq_pi), (N, 1), "one credit write");
            assert_eq!(
                rq_counter(p.qp.dbrec),
                N as u32,
                "the credit write published every receive it covers"
            );
            assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!(p.qp.sq_pi, 1, "nothing new to credit: nothing written");
            for k in 0..N {
                let mut got = 0;
                assert_eq!(
                    gds::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
                    code::OK
                );
                assert_eq!(got, 8 + k as u32);
                let data = read(buf.addr() + 64 * k, got as usize);
                assert_eq!(data, message(k, 0, got as usize), "message {k}");
            }
        } else {
            for k in 0..N {
                let at = buf.addr() + 64 * (k + 1);
                write(at, &message(k, 0, 8 + k as usize));
                assert_eq!(
                    gds::peer_send(&mut p, at, mr.lkey(), 8 + k as u32, TIMEOUT_NS),
                    code::OK,
                    "send {k}: the one credit covers it"
                );
            }
            assert_eq!(p.credits, N);
            // Credit for N receives only: the next send waits (and times out).
            assert_eq!(
                gds::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert_eq!(gds::peer_wait_sends(&mut p, N, TIMEOUT_NS), code::OK);
            assert_eq!((p.sends, p.sends_done, p.sends_waited), (N, N, N));
        }
    });
}

/// The receive counter of a doorbell record (`[RQ][SQ]`, BE32 each) at `dbrec`.
fn rq_counter(dbrec: u64) -> u32 {
    u32::from_be_bytes(read(dbrec, 4).try_into().expect("4 bytes"))
}

/// Selective signalling: 100 sends with one in 16 signalled through a send ring of 16 slots
/// (it wraps 6 times), then one wait for all of them: every send is counted, no post finds
/// the ring full for good (the header signals one WQE per half ring by itself), and far
/// fewer completions are written than sends. The receiver keeps 8 receives posted and
/// credits them 4 at a time.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channel_unsignalled_sends_wrap_the_ring_and_are_counted() {
    const SENDS: u64 = 100;
    const DEPTH: u32 = 8;
    let results = kernel_channel_ranks(DEPTH, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 64 * DEPTH as usize);
        let mut p = ch.desc(peer).unwrap();
        let slot = |k: u64| buf.addr() + 64 * (k % DEPTH as u64);
        if me == 1 {
            for k in 0..DEPTH as u64 {
                assert_eq!(
                    gds::peer_post_recv(&mut p, slot(k), mr.lkey(), 64),
                    code::OK
                );
            }
            assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            for k in 0..SENDS {
                let mut got = 0;
                assert_eq!(
                    gds::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
                    code::OK
                );
                assert_eq!(read(slot(k), 8), k.to_ne_bytes(), "message {k}");
                if p.recvs < SENDS {
                    let at = slot(p.recvs);
                    assert_eq!(gds::peer_post_recv(&mut p, at, mr.lkey(), 64), code::OK);
                    if p.recvs - p.credited >= 4 || p.recvs == SENDS {
                        assert_eq!(gds::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
                    }
                }
            }
        } else {
            assert_eq!(p.qp.sq_wqebbs, 16);
            for k in 0..SENDS {
                // Each message from its own source slot, reused only once the sends of a
                // ring's worth before it are known complete (waited below).
                write(slot(k), &k.to_ne_bytes());
                let flags = if k % 16 == 15 { gds::SIGNALED } else { 0 };
                let rc = gds::peer_send_flags(&mut p, slot(k), mr.lkey(), 8, flags, TIMEOUT_NS);
                assert_eq!(rc, code::OK, "send {k}");
                assert!(p.sends_done <= p.sends);
                if k % DEPTH as u64 == DEPTH as u64 - 1 {
                    // The sources are reused next: wait for the sends so far.
                    let n = p.sends - p.sends_waited;
                    assert_eq!(gds::peer_wait_sends(&mut p, n, TIMEOUT_NS), code::OK);
                }
            }
            let n = p.sends - p.sends_waited;
            assert_eq!(gds::peer_wait_sends(&mut p, n, TIMEOUT_NS), code::OK);
            assert_eq!(
                (p.sends, p.sends_done, p.sends_waited),
                (SENDS, SENDS, SENDS)
            );
            assert_eq!(gds::peer_wait_send(&mut p, 1000), code::INVALID);
            assert!(p.qp.sq_pi > 6 * 16, "the ring wrapped");
            // Sends are signalled one in 8 at most (16 asked; half the ring forces it), and
            // the waits every 8 sends find them signalled: no NOP was needed but the last.
            assert!(
                p.qp.send_cq.ci <= SENDS / 8 + 1,
                "{} completions for {SENDS} sends",
                p.qp.send_cq.ci
            );
        }
        ch.progress(peer).unwrap()
    });
    assert_eq!(
        (results[0].sends, results[0].sends_done, results[0].error),
        (SENDS, SENDS, 0),
        "the host sees the counts"
    );
    assert_eq!((results[1].recvs_waited, results[1].error), (SENDS, 0));
}

/// Waiting for a send with no signalled WQE after it posts a signalled NOP, whose completion
/// finishes the send: the wait returns OK promptly, the NOP is the only completion, and
/// sends_done counts the sends (not the NOP). A wait covered by a signalled send posts none.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channel_wait_for_a_trailing_unsignalled_send_posts_a_nop() {
    kernel_channel_ranks(16, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 256);
        let mut p = ch.desc(peer).unwrap();
        if me == 1 {
            for _ in 0..4 {
                assert_eq!(
                    gds::peer_recv(&mut p, buf.addr(), mr.lkey(), 64, TIMEOUT_NS),
                    code::OK
                );
            }
            for _ in 0..4 {
                let mut got = 0;
                assert_eq!(
                    gds::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
                    code::OK
                );
            }
        } else {
            for _ in 0..3 {
                let rc = gds::peer_send_flags(&mut p, buf.addr(), mr.lkey(), 8, 0, TIMEOUT_NS);
                assert_eq!(rc, code::OK);
            }
            assert_eq!(
                (p.qp.sq_pi, p.signaled_pi),
                (3, 0),
                "three unsignalled sends"
            );
            let t = Instant::now();
            assert_eq!(gds::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
            assert!(t.elapsed() < Duration::from_secs(10));
            assert_eq!(p.qp.sq_pi, 4, "a NOP was posted after them");
            assert_eq!(
                (p.qp.send_cq.ci, p.qp.send_cq.wq_ci),
                (1, 4),
                "its completion"
            );
            // It finished all three; the next waits need no completion.
            assert_eq!((p.sends_done, p.sends_waited), (3, 1));
            assert_eq!(gds::peer_wait_sends(&mut p, 2, TIMEOUT_NS), code::OK);
            assert_eq!((p.qp.sq_pi, p.sends_waited), (4, 3));
            // A signalled send: its own completion ends the wait, no NOP.
            assert_eq!(
                gds::peer_send(&mut p, buf.addr(), mr.lkey(), 8, TIMEOUT_NS),
                code::OK
            );
            assert_eq!(gds::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!((p.qp.sq_pi, p.qp.send_cq.ci, p.sends_done), (5, 2, 4));
            assert_eq!(
                gds::peer_wait_sends(&mut p, 1, TIMEOUT_NS),
                code::INVALID,
                "nothing left to wait for"
            );
            let st = ch.progress(peer).unwrap();
            assert_eq!((st.sends, st.sends_done, st.sends_waited), (4, 4, 4));
        }
    });
}

/// The soft device executes a NOP WQE the kernel composes (`gds_qp_post_nop`) as a ConnectX
/// does: no data moves, and its completion (opcode NOP, its own index) comes only after the
/// unsignalled RDMA writes before it are complete (their data is at the target), freeing
/// their slots too. Unsignalled, it completes silently with the next signalled WQE.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qp_nop_completes_after_the_work_before_it() {
    const WRITES: u64 = 6;
    const LEN: usize = 64 * 1024;
    let (_dev, pd, a, b) = connected(&QpConfig::default());
    let (abuf, amr) = pinned(&pd, LEN * WRITES as usize);
    let (bbuf, bmr) = pinned(&pd, LEN * WRITES as usize);
    let (a, _b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let mut qa = a.desc();
    let mut wc = Wc::default();
    for k in 0..WRITES {
        let off = k * LEN as u64;
        write(abuf.addr() + off, &message(k, 5, LEN));
        let rc = gds::qp_post_send(
            &mut qa,
            gds::OP_RDMA_WRITE,
            abuf.addr() + off,
            amr.lkey(),
            LEN as u32,
            bbuf.addr() + off,
            bmr.rkey(),
            0,
            0,
        );
        assert_eq!(rc, code::OK);
    }
    assert_eq!(gds::qp_post_nop(&mut qa, 0), code::OK, "an unsignalled NOP");
    assert_eq!(gds::qp_post_nop(&mut qa, gds::SIGNALED), code::OK);
    assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
    assert_eq!(
        (wc.opcode, wc.wqe_opcode as u32, wc.qpn, wc.wqe_counter),
        (gds::WC_SEND_DONE, gds::OP_NOP, a.qpn(), WRITES as u16 + 1)
    );
    assert_eq!(qa.send_cq.wq_ci, WRITES + 2, "every slot before it is free");
    for k in 0..WRITES {
        let off = k * LEN as u64;
        assert_eq!(
            read(bbuf.addr() + off, LEN),
            message(k, 5, LEN),
            "write {k}"
        );
    }
    assert_eq!(
        gds::cq_poll(&mut qa.send_cq, &mut wc),
        code::EMPTY,
        "one completion only"
    );
}

/// The WQEs the header writes read back, through the soft device's own reader
/// (`format::SendWqe::parse`, `format::RecvWqe::parse`), as the requests the kernel made:
/// write, write with immediate, read, send with immediate, inline send and write, NOP, and
/// the receive the send lands in.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_qp_wqes_read_back_through_the_device_reader() {
    let (_dev, pd, a, b) = connected(&QpConfig::default());
    let (abuf, amr) = pinned(&pd, 4096);
    let (bbuf, bmr) = pinned(&pd, 4096);
    let (a, b) = (a.qp.into_device().unwrap(), b.qp.into_device().unwrap());
    let (mut qa, mut qb) = (a.desc(), b.desc());
    let segs = |addr: u64, len: u32, lkey: u32| [DataSeg::new(addr, len, lkey)];
    let (la, lb, rb) = (amr.lkey(), bmr.lkey(), bmr.rkey());
    let last_wqe = |q: &QpDesc| read(q.sq + ((q.sq_pi - 1) & (q.sq_wqebbs as u64 - 1)) * 64, 64);
    let expect = |q: &QpDesc, opcode, raddr: Option<u64>, imm: u32, data| SendWqe {
        wqe_index: (q.sq_pi - 1) as u16,
        opcode,
        qpn: a.qpn(),
        flags: FmCeSe::CQ_UPDATE,
        imm: imm.to_be_bytes(),
        raddr: raddr.map(|r| RaddrSeg::new(r, rb)),
        atomic: None,
        data,
    };
    let mut signalled = 0;

    let g = segs(abuf.addr(), 100, la);
    let ops = [
        (gds::OP_RDMA_WRITE, Opcode::RdmaWrite, 0),
        (gds::OP_RDMA_WRITE_IMM, Opcode::RdmaWriteImm, 0x0A0B_0C0D),
        (gds::OP_RDMA_READ, Opcode::RdmaRead, 0),
    ];
    for (op, opcode, imm) in ops {
        if opcode.consumes_recv() {
            assert_eq!(gds::qp_post_recv(&mut qb, 0, 0, 0), code::OK);
        }
        let rc = gds::qp_post_send(
            &mut qa,
            op,
            abuf.addr(),
            la,
            100,
            bbuf.addr() + 512,
            rb,
            imm,
            gds::SIGNALED,
        );
        assert_eq!(rc, code::OK);
        let want = expect(
            &qa,
            opcode,
            Some(bbuf.addr() + 512),
            if opcode.has_imm() { imm } else { 0 },
            WqeData::Gather(DataSegs::from_segs(&g)),
        );
        assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want), "{opcode:?}");
        signalled += 1;
    }

    // A send with immediate and the receive it lands in.
    assert_eq!(gds::qp_post_recv(&mut qb, bbuf.addr(), 256, lb), code::OK);
    let slot = read(
        qb.rq + ((qb.rq_pi - 1) & (qb.rq_wqes as u64 - 1)) * qb.rq_stride as u64,
        qb.rq_stride as usize,
    );
    let r = segs(bbuf.addr(), 256, lb);
    assert_eq!(
        RecvWqe::parse(&slot),
        Ok(RecvWqe {
            segs: DataSegs::from_segs(&r)
        })
    );
    let rc = gds::qp_post_send(
        &mut qa,
        gds::OP_SEND_IMM,
        abuf.addr(),
        la,
        100,
        0,
        0,
        7,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    let want = expect(
        &qa,
        Opcode::SendImm,
        None,
        7,
        WqeData::Gather(DataSegs::from_segs(&g)),
    );
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    signalled += 1;

    // Inline: a send, then a write.
    assert_eq!(
        gds::qp_post_recv(&mut qb, bbuf.addr() + 1024, 64, lb),
        code::OK
    );
    let inline = message(4, 1, 28);
    let rc = gds::qp_post_send_inline(&mut qa, gds::OP_SEND, &inline, 0, 0, 0, gds::SIGNALED);
    assert_eq!(rc, code::OK);
    let want = expect(&qa, Opcode::Send, None, 0, WqeData::Inline(&inline));
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    let rc = gds::qp_post_send_inline(
        &mut qa,
        gds::OP_RDMA_WRITE,
        &inline[..8],
        bbuf.addr() + 2048,
        rb,
        0,
        gds::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    let want = expect(
        &qa,
        Opcode::RdmaWrite,
        Some(bbuf.addr() + 2048),
        0,
        WqeData::Inline(&inline[..8]),
    );
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    signalled += 2;

    assert_eq!(gds::qp_post_nop(&mut qa, gds::SIGNALED), code::OK);
    let want = expect(&qa, Opcode::Nop, None, 0, WqeData::Gather(DataSegs::EMPTY));
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    signalled += 1;

    // The device executed them all, as read.
    let mut wc = Wc::default();
    for _ in 0..signalled {
        assert_eq!(gds::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS), code::OK);
        assert_eq!(wc.opcode, gds::WC_SEND_DONE, "{wc:?}");
    }
    for _ in 0..3 {
        assert_eq!(gds::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS), code::OK);
    }
    assert_eq!(read(bbuf.addr() + 1024, 28), inline);
    drop(b);
}

// ------------------------------------------------------------------ the header itself

/// A kernel calling every device function of the kernel-driven QP and peer API (staged too).
const CALLS: &str = r#"
extern "C" __global__ void all(gds_qp q0, gds_peer p0, uint64_t out) {
    gds_qp q = q0;
    gds_wc wc;
    uint64_t v = 5;
    int rc = gds_qp_post_send(&q, GDS_OP_RDMA_WRITE, 1, 2, 3, 4, 5, 0, GDS_SIGNALED);
    rc |= gds_qp_post_send_inline(&q, GDS_OP_SEND, &v, 8, 0, 0, 0, 0);
    rc |= gds_qp_post_recv(&q, 1, 2, 3);
    rc |= gds_cq_poll(&q.recv_cq, &wc);
    rc |= gds_cq_wait(&q.send_cq, &wc, 100);
    gds_peer p = p0;
    uint32_t len;
    rc |= gds_qp_post_nop(&q, GDS_SIGNALED);
    rc |= gds_peer_recv(&p, 1, 2, 3, 100);
    rc |= gds_peer_post_recv(&p, 1, 2, 3);
    rc |= gds_peer_give_credit(&p, 100);
    rc |= gds_peer_send(&p, 1, 2, 3, 100);
    rc |= gds_peer_send_flags(&p, 1, 2, 3, 0, 100);
    rc |= gds_peer_wait_send(&p, 100);
    rc |= gds_peer_wait_sends(&p, 2, 100);
    rc |= gds_peer_wait_recv(&p, &len, 100);
    uint64_t bounce;
    rc |= gds_peer_next_send_bounce(&p, &bounce, 100);
    rc |= gds_peer_send_bounce(&p, 3, 0, 100);
    rc |= gds_peer_send_staged(&p, 1, 3, GDS_SIGNALED, 100);
    rc |= gds_peer_post_recv_staged(&p, 3);
    rc |= gds_peer_recv_staged(&p, 3, 100);
    rc |= gds_peer_wait_recv_staged(&p, 1, 3, &len, 100);
    rc |= (int)gds_peer_recv_bounce(&p) | gds_peer_staged(&p);
    *(int *)out = rc;
}
"#;

/// The header's device code, the kernels of the GPU tests and the bandwidth example's kernel
/// compile as CUDA (NVRTC mode and nvcc mode), checked with clang (`common::clang::check_cuda`):
/// CI has no GPU and no NVRTC, and code that does not compile would only show on the GPU
/// machine.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn header_device_code_compiles_as_cuda() {
    let gpu_test_kernels = include_str!("kernels/kernel_channel.cu");
    // The bandwidth example's kernel is checked here too: it drives QPs the same way.
    let bandwidth_kernel = include_str!("../examples/bandwidth/bandwidth.cu");
    common::clang::check_cuda(
        "header",
        &format!("{CALLS}\n{gpu_test_kernels}\n{bandwidth_kernel}"),
    );
}

/// `bandwidth --trigger kernel`'s staged kernel (`bw_staged` of examples/bandwidth/bandwidth.cu,
/// built for the host with a block of one thread) against the soft device, with rank 1 as
/// the example runs it: each chunk copied out of its bounce as it arrives (after a pause, so
/// that a bounce refilled before its credit would show), then credited by an RDMA write into
/// rank 0's credit word. Every chunk lands byte for byte, with its sequence number as the
/// immediate, across chunk boundaries, bounce reuse within a message and from one launch to
/// the next (two launches per shape), with unaligned chunks (byte copies), and the launch
/// reports every chunk posted.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn bandwidth_staged_kernel_moves_every_chunk_byte_for_byte() {
    for (chunk, bounces, size, n) in [
        (1000usize, 2usize, 5503usize, 3u64),
        (256, 3, 1027, 4),
        (256, 4, 1, 5),
        (1024, 2, 1024, 3),
    ] {
        bandwidth_staged_shape(chunk, bounces, size, n);
    }
}

/// `bw_staged` gives up when rank 1 never credits: once both bounces are filled, the wait for
/// the first credit times out, and the launch reports the code, the wait (BWS_STEP_CREDIT)
/// and the two chunks it posted.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn bandwidth_staged_kernel_times_out_without_credits() {
    let cfg = QpConfig::default();
    let (_dev, pd, a, mut b) = connected(&cfg);
    let (out, out_mr) = pinned(&pd, 2 * 64);
    let (inb, in_mr) = pinned(&pd, 2 * 64);
    let (credit, _credit_mr) = pinned(&pd, 8);
    let (words, _words_mr) = pinned(&pd, 64);
    let src = [7u8; 192];
    let dq = a.qp.into_device().unwrap();
    for _ in 0..3 {
        b.qp.post_recv(&RecvWr::new()).unwrap();
    }
    let (o, i, w) = (out.addr(), inb.addr(), words.addr());
    let (lkey, rkey) = (out_mr.lkey(), in_mr.rkey());
    let start = Instant::now();
    // SAFETY: the parameters match bw_staged; everything it names outlives the call.
    unsafe {
        gds::bw_staged()(
            dq.desc(),
            src.as_ptr() as u64,
            192,
            1,
            64,
            64,
            2,
            0,
            o,
            o,
            lkey,
            i,
            rkey,
            credit.addr(),
            w,
            50_000_000,
        )
    };
    assert!(start.elapsed() < Duration::from_secs(5));
    let word = |i: u64| u64::from_ne_bytes(read(w + 8 * i, 8).try_into().unwrap());
    assert_eq!(
        (word(0), word(1), word(4), word(5)),
        (1, code::TIMEOUT as u64, 2, 1)
    );
}

/// Runs two launches of `n` messages of `size` bytes in `chunk`-byte chunks over `bounces`
/// bounces, rank 1 on this thread.
fn bandwidth_staged_shape(chunk: usize, bounces: usize, size: usize, n: u64) {
    let what = format!("chunk {chunk}, {bounces} bounces, {size} B");
    let cfg = QpConfig {
        send_wqebbs: 64,
        recv_wqes: 64,
        ..QpConfig::default()
    };
    let (_dev, pd, a, b) = connected(&cfg);
    let (out, out_mr) = pinned(&pd, chunk * bounces);
    let (inb, in_mr) = pinned(&pd, chunk * bounces);
    let (credit, credit_mr) = pinned(&pd, 8);
    let (credit_src, credit_src_mr) = pinned(&pd, 8);
    let src: Vec<u8> = (0..size)
        .map(|i| (i % 251) as u8 ^ (i / 251) as u8)
        .collect();
    let mut dst = vec![0u8; size];
    let dq = a.qp.into_device().unwrap();
    let mut qb = b.qp;
    let count = size.div_ceil(chunk);
    let (mut arrived, mut posted) = (0usize, 0usize);
    for launch in 0..2u64 {
        let first = launch as usize * n as usize * count;
        let (words, _words_mr) = pinned(&pd, 64);
        let w = words.addr();
        let q = dq.desc();
        let kernel = gds::bw_staged();
        let total = n as usize * count;
        std::thread::scope(|s| {
            let (o, i) = (out.addr(), inb.addr());
            let (lkey, rkey, cw) = (out_mr.lkey(), in_mr.rkey(), credit.addr());
            let (sp, len) = (src.as_ptr() as u64, size as u64);
            let (c, bn, f) = (chunk as u64, bounces as u32, first as u64);
            let k = s.spawn(move || {
                // SAFETY: the parameters match bw_staged; the QP, bounces, credit word,
                // payload and result words outlive the call (this scope waits for it).
                unsafe {
                    kernel(
                        q, sp, len, n, c, c, bn, f, o, o, lkey, i, rkey, cw, w, TIMEOUT_NS,
                    )
                }
            });
            // Rank 1: keep a receive posted per bounce ahead, copy each chunk in, credit.
            let end = first + total;
            while posted < arrived + bounces {
                qb.post_recv(&RecvWr::new()).unwrap();
                posted += 1;
            }
            while arrived < end {
                while b.scq.poll_one().unwrap().is_some() {}
                let Some(wc) = b.rcq.poll_one().unwrap() else {
                    assert!(!k.is_finished(), "{what}: the kernel ended early");
                    std::thread::yield_now();
                    continue;
                };
                let wc = wc.ok().unwrap();
                assert_eq!(wc.imm, Some(arrived as u32), "{what}: chunk order");
                let (at, j) = (arrived, arrived - first);
                let (bounce, off) = (at % bounces, (j % count) * chunk);
                let len = chunk.min(size - off);
                // The next receive before the copy, as the example posts it: only the credit
                // keeps rank 0 off this bounce until it is copied.
                arrived += 1;
                qb.post_recv(&RecvWr::new()).unwrap();
                posted += 1;
                std::thread::sleep(Duration::from_micros(200));
                let got = read(inb.addr() + (bounce * chunk) as u64, len);
                assert!(
                    got == src[off..off + len],
                    "{what}: chunk {at} at byte {off}"
                );
                dst[off..off + len].copy_from_slice(&got);
                write(credit_src.addr(), &(at as u64 + 1).to_ne_bytes());
                let wr = SendWr::write(credit_mr.remote().at(0))
                    .sge(credit_src_mr.sge(..8))
                    .inline();
                qb.post_send(&wr).unwrap();
            }
            k.join().unwrap();
        });
        // BW_DONE, BW_RC, BW_SENT (chunks posted), BWS_STEP.
        let word = |i: u64| u64::from_ne_bytes(read(w + 8 * i, 8).try_into().unwrap());
        assert_eq!(
            (word(0), word(1), word(4), word(5)),
            (1, code::OK as u64, total as u64, 0),
            "{what}: launch {launch}"
        );
        assert_eq!(dst, src, "{what}: launch {launch}");
        dst.fill(0);
    }
}

/// The pingpong example's kernels (`--api gdsync` and `--api mp` with `--trigger kernel`,
/// and the step of `--trigger host`) compile as CUDA: checked with clang where NVRTC and the
/// GPU are not (`common::clang::check_cuda`).
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn pingpong_kernels_compile_as_cuda() {
    let src = include_str!("../examples/pingpong/kernels.cu");
    common::clang::check_cuda("pingpong", src);
}

/// The step sequences `memop_cost` times in a kernel compile as CUDA (clang, where NVRTC and
/// the GPU are not).
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ with its CUDA front end when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn memop_cost_kernel_compiles_as_cuda() {
    let src = include_str!("../examples/memop_cost.cu");
    common::clang::check_cuda("memop_cost", src);
}

/// `gds_copy_part`, the per-thread share of `gds_block_copy` (how a kernel stages a payload
/// through a bounce), byte for byte: at odd sizes and offsets (16-byte and byte paths), for
/// 1, 3 and 256 threads, every byte copied once and nothing around the range touched.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn block_copy_parts_cover_the_range_byte_for_byte() {
    let total = 4096 + 64;
    let src: Vec<u8> = (0..total).map(|i| (i * 131 + 7) as u8).collect();
    for (len, off) in [
        (0, 0),
        (1, 0),
        (7, 3),
        (16, 0),
        (33, 16),
        (4095, 1),
        (4096, 0),
    ] {
        for parts in [1, 3, 256] {
            let mut dst = vec![0xeeu8; total];
            common::gds::copy_parts(&mut dst[off..off + len], &src[off..off + len], parts);
            assert_eq!(
                &dst[off..off + len],
                &src[off..off + len],
                "{len} at {off}, {parts} parts"
            );
            assert!(
                dst[..off]
                    .iter()
                    .chain(&dst[off + len..])
                    .all(|&b| b == 0xee),
                "{len} at {off}, {parts} parts: bytes outside the range changed"
            );
        }
    }
}

// ------------------------------------------------------------------ puts and gets

/// Puts and gets from a "kernel" on a staged channel, between sends that take credits. Rank 0
/// puts message `i` into rank 1's window at an odd offset (from registered memory, or every
/// third from a send bounce with `gds_peer_put_bounce`; one in four signalled), then sends
/// `i`: rank 1 finds the put's bytes in its window once that send arrived (work on one
/// connection lands in order), answers, and gets a range of rank 0's window, which it finds
/// in place once the get's wait returned. A put or get reaching past the window (or whose
/// offset would overflow) is refused with GDS_INVALID and posts nothing. Over two "launches"
/// the counters resume: puts and gets count as sends for the waits, never as credits.
#[test]
#[cfg_attr(
    not(clang_cuda),
    ignore = "needs clang++ when the tests are built (apt-get install clang, then touch build.rs)"
)]
fn kernel_channel_puts_and_gets_between_sends() {
    const ITERS: u64 = 120;
    const WIN: usize = 4096;
    const SLOT: usize = 256;
    let results = staged_channel_ranks(8, SLOT, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (wbuf, wmr) = pinned(comm.pd(), WIN);
        // Per iteration its own source (an unsignalled put may still be read) and a receive.
        let (buf, mr) = pinned(comm.pd(), SLOT * (ITERS as usize + 1));
        let pattern = message(999, 0, WIN);
        write(
            wbuf.addr(),
            &if me == 0 {
                pattern.clone()
            } else {
                vec![0xee; WIN]
            },
        );
        let w = comm.window(&wmr).unwrap();
        let kw = w.for_kernels().unwrap();
        let r = kw.desc(peer).unwrap();
        assert_eq!(kw.size(), 2);
        assert_eq!((r.len, r.rkey), (WIN as u64, w.remote(peer).unwrap().rkey));
        let len = |i: u64| 1 + (i as usize * 37) % SLOT;
        let off = |i: u64| ((i as usize * 97 + 3) % (WIN - SLOT)) as u64;
        let slot = |i: u64| buf.addr() + (SLOT * i as usize) as u64;
        let recv_at = buf.addr() + (SLOT * ITERS as usize) as u64;
        let ok = |rc: i32, what: &str, i: u64| assert_eq!(rc, code::OK, "{me}: {what} {i}");
        comm.barrier().unwrap();
        let launch = |range: std::ops::Range<u64>| {
            let mut p: PeerDesc = ch.desc(peer).unwrap();
            for i in range {
                let flags = if i % 4 == 3 { gds::SIGNALED } else { 0 };
                ok(
                    gds::peer_recv(&mut p, recv_at, mr.lkey(), 16, TIMEOUT_NS),
                    "recv",
                    i,
                );
                if me == 0 {
                    let msg = message(i, 0, len(i));
                    let rc = if i % 3 == 0 {
                        write(
                            gds::peer_next_send_bounce(&mut p, TIMEOUT_NS).unwrap(),
                            &msg,
                        );
                        gds::peer_put_bounce(&mut p, &r, off(i), len(i) as u32, flags, TIMEOUT_NS)
                    } else {
                        write(slot(i), &msg);
                        let n = len(i) as u32;
                        gds::peer_put_flags(
                            &mut p,
                            &r,
                            off(i),
                            slot(i),
                            mr.lkey(),
                            n,
                            flags,
                            TIMEOUT_NS,
                        )
                    };
                    ok(rc, "put", i);
                    let sent = p.sends;
                    for (o, n) in [(WIN as u64 - 10, 11), (u64::MAX, 1)] {
                        let rc = gds::peer_put_flags(&mut p, &r, o, slot(i), mr.lkey(), n, 0, 1000);
                        assert_eq!(rc, code::INVALID, "a put of {n} at {o} is refused");
                    }
                    assert_eq!(p.sends, sent, "a refused put posts nothing");
                    ok(
                        gds::peer_send_flags(&mut p, slot(i), mr.lkey(), 4, flags, TIMEOUT_NS),
                        "send",
                        i,
                    );
                    ok(gds::peer_wait_recv(&mut p, None, TIMEOUT_NS), "answer", i);
                } else {
                    ok(gds::peer_wait_recv(&mut p, None, TIMEOUT_NS), "message", i);
                    let at = wbuf.addr() + off(i);
                    assert_eq!(read(at, len(i)), message(i, 0, len(i)), "put {i} landed");
                    ok(
                        gds::peer_send_flags(&mut p, recv_at, mr.lkey(), 4, flags, TIMEOUT_NS),
                        "answer",
                        i,
                    );
                    let (o, n) = (off(i) + 1, len(i) as u32);
                    ok(
                        gds::peer_get(&mut p, &r, o, slot(i), mr.lkey(), n, TIMEOUT_NS),
                        "get",
                        i,
                    );
                    let rc = gds::peer_get(&mut p, &r, WIN as u64, slot(i), mr.lkey(), 1, 1000);
                    assert_eq!(rc, code::INVALID, "a get past the window is refused");
                    let n = p.sends - p.sends_waited;
                    ok(gds::peer_wait_sends(&mut p, n, TIMEOUT_NS), "get's wait", i);
                    let o = o as usize;
                    assert_eq!(read(slot(i), len(i)), pattern[o..o + len(i)], "get {i}");
                }
            }
            let n = p.sends - p.sends_waited;
            if n > 0 {
                ok(gds::peer_wait_sends(&mut p, n, TIMEOUT_NS), "last waits", 0);
            }
        };
        launch(0..ITERS / 2);
        launch(ITERS / 2..ITERS);
        comm.barrier().unwrap();
        ch.progress(peer).unwrap()
    });
    for st in results {
        let n = ITERS;
        assert_eq!(peer_counts(&st), (2 * n, 2 * n, 2 * n, n, n, 0));
        assert_eq!(st.one_sided, n, "puts or gets among the sends");
    }
}
