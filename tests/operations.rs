//! Every operation between two QPs of one process, on one device (loopback) and on two
//! devices: results, completion fields and the bytes that land. Each body runs on the soft
//! device and on the emulated RDMA driver's `mlx5_0` (and `mlx5_1`), on libmlx5's QPs
//! (`both!`; ignored where rdma-core is not installed).

#[macro_use]
mod common;

use common::*;
use gdasync::gdsync::exec::{HostExecutor, HostStream};
use gdasync::gdsync::{Access, CompletionOp, MemoryRegion, QpConfig, RecvWr, SendWr, Sge};
use std::time::Duration;

both!(
    send,
    send_imm,
    write,
    write_imm,
    read,
    fetch_add,
    compare_swap,
    inline,
    inline_send_at_configured_maximum,
    inline_write_at_configured_maximum,
    inline_host_copies_small_host_payloads_only,
    multi_sge_gather,
    multi_sge_scatter,
    zero_length,
    unsignaled_then_signaled,
    fence_write_after_read,
    fence_write_after_atomic,
    large_write_and_read,
    prepare_commit_host_executor,
    adjacent_doorbells_of_one_queue_merge,
    host_stream_waits_for_send,
    wait_for_a_send_never_rung_does_not_pass,
    host_stream_waits_for_recv,
    host_stream_recv_waits_retire_by_completion_count,
    ops_between_a_recv_wait_and_its_retirement_run_before_the_cpu_sees_it_done,
    host_stream_wraps_rings,
    writes_to_one_location_last_wins,
    sends_arrive_in_order,
    send_ring_is_the_size_asked_for_so_a_kernel_can_take_it,
    cpu_posts_interleave_with_host_stream_commits,
);

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const QUIET: Duration = Duration::from_millis(30);

/// The native-order 8-byte word at `off` of a region.
fn word(mr: &MemoryRegion<'_>, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read_at(off, &mut b);
    u64::from_ne_bytes(b)
}

fn send(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(1, 3000);
    let mut dst = vec![0u8; 4096];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(77))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(5))
        .unwrap();
    let s = poll1(&p.a.scq);
    assert!(s.is_ok(), "{s:?}");
    assert_eq!(
        (s.wr_id, s.opcode, s.qpn),
        (5, CompletionOp::Send, p.a.qp.qpn())
    );
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(r.wr_id, 77);
    assert_eq!(r.opcode, CompletionOp::Recv);
    assert_eq!(r.byte_len, 3000);
    assert_eq!(r.imm, None);
    assert_eq!(r.qpn, p.b.qp.qpn());
    assert_eq!(r.src_qpn, p.a.qp.qpn());
    let mut got = vec![0u8; 4096];
    dmr.read_at(0, &mut got);
    assert!(got[..3000] == pattern(1, 3000)[..], "payload differs");
    assert!(
        got[3000..].iter().all(|&x| x == 0),
        "bytes past the message written"
    );
    assert_quiet(&p.a.scq, QUIET);
    assert_quiet(&p.b.rcq, Duration::ZERO);
}

fn send_imm(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(2, 100);
    let mut dst = vec![0u8; 128];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    for (i, imm) in [0xDEAD_BEEFu32, 0, 0x0102_0304].into_iter().enumerate() {
        p.b.qp
            .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(i as u64))
            .unwrap();
        p.a.qp
            .post_send(&SendWr::send_imm(imm).sge(smr.sge(..)).wr_id(10 + i as u64))
            .unwrap();
        let s = poll1(&p.a.scq);
        assert!(s.is_ok() && s.wr_id == 10 + i as u64, "{s:?}");
        assert_eq!(s.opcode, CompletionOp::Send);
        let r = poll1(&p.b.rcq);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(r.wr_id, i as u64);
        assert_eq!(r.opcode, CompletionOp::Recv);
        assert_eq!(r.imm, Some(imm), "immediate value");
        assert_eq!(r.byte_len, 100);
        let mut got = vec![0u8; 100];
        dmr.read_at(0, &mut got);
        assert_eq!(got, pattern(2, 100));
    }
}

fn write(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(3, 5000);
    let mut dst = vec![0u8; 8192];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    // A posted receive must not be consumed by a plain write.
    p.b.qp.post_recv(&RecvWr::new().wr_id(1)).unwrap();
    p.a.qp
        .post_send(
            &SendWr::write(dmr.remote().at(100))
                .sge(smr.sge(..))
                .wr_id(9),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!((c.wr_id, c.opcode), (9, CompletionOp::Write));
    let mut got = vec![0u8; 8192];
    dmr.read_at(0, &mut got);
    assert!(
        got[..100].iter().all(|&x| x == 0),
        "bytes before the target written"
    );
    assert!(got[100..5100] == pattern(3, 5000)[..], "payload differs");
    assert!(
        got[5100..].iter().all(|&x| x == 0),
        "bytes after the target written"
    );
    assert_quiet(&p.b.rcq, QUIET);
}

fn write_imm(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(4, 2000);
    let mut dst = vec![0u8; 4096];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    // The receive needs no buffer: the data goes where the write says.
    p.b.qp.post_recv(&RecvWr::new().wr_id(33)).unwrap();
    p.a.qp
        .post_send(
            &SendWr::write_imm(dmr.remote().at(1000), 0x1234_5678)
                .sge(smr.sge(..))
                .wr_id(34),
        )
        .unwrap();
    let s = poll1(&p.a.scq);
    assert!(s.is_ok(), "{s:?}");
    assert_eq!((s.wr_id, s.opcode), (34, CompletionOp::Write));
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(r.wr_id, 33);
    assert_eq!(r.opcode, CompletionOp::RecvWriteImm);
    assert_eq!(r.imm, Some(0x1234_5678));
    assert_eq!(r.byte_len, 2000);
    assert_eq!(r.src_qpn, p.a.qp.qpn());
    let mut got = vec![0u8; 4096];
    dmr.read_at(0, &mut got);
    assert!(got[1000..3000] == pattern(4, 2000)[..]);
    assert!(got[..1000].iter().chain(&got[3000..]).all(|&x| x == 0));

    // A second one consumes the next receive.
    p.b.qp.post_recv(&RecvWr::new().wr_id(35)).unwrap();
    p.a.qp
        .post_send(
            &SendWr::write_imm(dmr.remote().at(0), 7)
                .sge(smr.sge(..10))
                .wr_id(36),
        )
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let r = poll1(&p.b.rcq);
    assert!(
        r.is_ok() && r.wr_id == 35 && r.imm == Some(7) && r.byte_len == 10,
        "{r:?}"
    );
}

fn read(t: Topo) {
    let mut p = Pair::new(t);
    let mut remote = pattern(5, 20_000);
    let mut local = vec![0xEEu8; 12_000];
    let rmr = p.b.pd.register(&mut remote, Access::REMOTE_READ).unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(
            &SendWr::read(rmr.remote().at(50))
                .sge(lmr.sge(10..10_010))
                .wr_id(3),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (3, CompletionOp::Read, 10_000)
    );
    let mut got = vec![0u8; 12_000];
    lmr.read_at(0, &mut got);
    assert!(
        got[10..10_010] == pattern(5, 20_000)[50..10_050],
        "read data differs"
    );
    assert!(got[..10].iter().chain(&got[10_010..]).all(|&x| x == 0xEE));
    assert_quiet(&p.b.rcq, Duration::ZERO);
}

fn fetch_add(t: Topo) {
    let mut p = Pair::new(t);
    let mut remote = vec![0u8; 64];
    let mut result = vec![0xFFu8; 16];
    let rmr =
        p.b.pd
            .register(&mut remote, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .unwrap();
    let lmr = p.a.pd.register(&mut result, Access::LOCAL_WRITE).unwrap();
    let init = 0x0102_0304_0506_0708u64;
    rmr.write_at(8, &init.to_ne_bytes());

    p.a.qp
        .post_send(
            &SendWr::fetch_add(rmr.remote().at(8), 0x1111)
                .sge(lmr.sge(8..16))
                .wr_id(1),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (1, CompletionOp::FetchAdd, 8)
    );
    assert_eq!(word(&lmr, 8), init, "old value (host order)");
    assert_eq!(word(&rmr, 8), init + 0x1111, "remote word (host order)");
    assert_eq!(word(&lmr, 0), u64::MAX, "result buffer outside the SGE");
    assert_eq!(word(&rmr, 0), 0);
    assert_eq!(word(&rmr, 16), 0);

    // Adding u64::MAX wraps: it subtracts one.
    p.a.qp
        .post_send(
            &SendWr::fetch_add(rmr.remote().at(8), u64::MAX)
                .sge(lmr.sge(0..8))
                .wr_id(2),
        )
        .unwrap();
    poll_ok(&p.a.scq, 1);
    assert_eq!(word(&lmr, 0), init + 0x1111);
    assert_eq!(word(&rmr, 8), init + 0x1110);

    // A burst of fetch-adds: each sees the previous result.
    let base = word(&rmr, 8);
    let mut olds = vec![0u8; 8 * 32];
    let omr = p.a.pd.register(&mut olds, Access::LOCAL_WRITE).unwrap();
    for i in 0..32 {
        p.a.qp
            .post_send(
                &SendWr::fetch_add(rmr.remote().at(8), 3)
                    .sge(omr.sge(i * 8..i * 8 + 8))
                    .wr_id(100 + i as u64),
            )
            .unwrap();
    }
    for (i, c) in poll_ok(&p.a.scq, 32).iter().enumerate() {
        assert_eq!(c.wr_id, 100 + i as u64);
    }
    for i in 0..32 {
        assert_eq!(word(&omr, i * 8), base + 3 * i as u64, "fetch-add {i}");
    }
    assert_eq!(word(&rmr, 8), base + 96);
}

fn compare_swap(t: Topo) {
    let mut p = Pair::new(t);
    let mut remote = vec![0u8; 32];
    let mut result = vec![0u8; 8];
    let rmr =
        p.b.pd
            .register(&mut remote, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .unwrap();
    let lmr = p.a.pd.register(&mut result, Access::LOCAL_WRITE).unwrap();
    let big = 0xA5A5_0000_0000_002Au64;
    rmr.write_at(16, &big.to_ne_bytes());

    // Matching compare: swapped.
    p.a.qp
        .post_send(
            &SendWr::compare_swap(rmr.remote().at(16), big, 0x1000)
                .sge(lmr.sge(..))
                .wr_id(1),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (1, CompletionOp::CompareSwap, 8)
    );
    assert_eq!(word(&lmr, 0), big, "old value");
    assert_eq!(word(&rmr, 16), 0x1000, "swapped");

    // Wrong compare: memory unchanged, the current value returned.
    p.a.qp
        .post_send(
            &SendWr::compare_swap(rmr.remote().at(16), big, 0x7777)
                .sge(lmr.sge(..))
                .wr_id(2),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.wr_id == 2, "{c:?}");
    assert_eq!(word(&lmr, 0), 0x1000, "current value returned");
    assert_eq!(word(&rmr, 16), 0x1000, "memory must be unchanged");
    assert_eq!(word(&rmr, 8), 0);
    assert_eq!(word(&rmr, 24), 0);
}

fn inline(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(6, 200);
    let mut dst = vec![0u8; 1024];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let orig = pattern(6, 200);

    // Inline send: the payload is copied at post time, so clobbering the source right after
    // posting must not change what arrives.
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(0..256)).wr_id(1))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).inline().wr_id(2))
        .unwrap();
    smr.write_at(0, &[0u8; 200]);
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok() && r.byte_len == 200, "{r:?}");
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; 200];
    dmr.read_at(0, &mut got);
    assert_eq!(got, orig, "inline send payload");

    // Inline write, two SGEs.
    smr.write_at(0, &orig);
    p.a.qp
        .post_send(
            &SendWr::write(dmr.remote().at(300))
                .sge(smr.sge(100..200))
                .sge(smr.sge(0..50))
                .inline()
                .wr_id(3),
        )
        .unwrap();
    smr.write_at(0, &[0u8; 200]);
    let c = poll1(&p.a.scq);
    assert!(
        c.is_ok() && c.wr_id == 3 && c.opcode == CompletionOp::Write,
        "{c:?}"
    );
    let mut got = vec![0u8; 150];
    dmr.read_at(300, &mut got);
    assert_eq!(&got[..100], &orig[100..200]);
    assert_eq!(&got[100..], &orig[..50]);

    // Inline write with immediate, and inline send with immediate.
    smr.write_at(0, &orig);
    p.b.qp.post_recv(&RecvWr::new().wr_id(4)).unwrap();
    p.a.qp
        .post_send(
            &SendWr::write_imm(dmr.remote().at(600), 0xF00D)
                .sge(smr.sge(..64))
                .inline()
                .wr_id(5),
        )
        .unwrap();
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!((r.wr_id, r.imm, r.byte_len), (4, Some(0xF00D), 64));
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; 64];
    dmr.read_at(600, &mut got);
    assert_eq!(got, orig[..64]);

    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(700..800)).wr_id(6))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send_imm(99).sge(smr.sge(..1)).inline().wr_id(7))
        .unwrap();
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!((r.wr_id, r.imm, r.byte_len), (6, Some(99), 1));
    assert_eq!(dmr.read_volatile_u8(700), orig[0]);
    poll_ok(&p.a.scq, 1);
}

/// The largest `max_inline` that `create_qp` accepts.
fn max_inline_accepted() -> u32 {
    let dev = gdasync::gdsync::Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4).unwrap();
    let max = (0..=1024u32)
        .rev()
        .find(|&m| {
            let cfg = QpConfig {
                max_inline: m,
                ..QpConfig::default()
            };
            pd.create_qp(&cq, &cq, &cfg).is_ok()
        })
        .unwrap();
    assert!(max >= 220, "max_inline accepted: {max}");
    max
}

/// An inline send as long as the largest `max_inline` a QP accepts.
fn inline_send_at_configured_maximum(t: Topo) {
    let max = max_inline_accepted();
    let cfg = QpConfig {
        max_inline: max,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &cfg, &QpConfig::default());
    let n = max as usize;
    let mut src = pattern(60, n);
    let mut dst = vec![0u8; n + 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(1))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).inline().wr_id(2))
        .unwrap_or_else(|e| panic!("inline send of max_inline = {n} bytes: {e}"));
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok() && r.byte_len == max, "{r:?}");
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; n];
    dmr.read_at(0, &mut got);
    assert!(got == pattern(60, n));
}

/// An inline RDMA write as long as the largest `max_inline` a QP accepts.
fn inline_write_at_configured_maximum(t: Topo) {
    let max = max_inline_accepted();
    let cfg = QpConfig {
        max_inline: max,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &cfg, &QpConfig::default());
    let n = max as usize;
    let mut src = pattern(61, n);
    let mut dst = vec![0u8; n];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    p.a.qp
        .post_send(
            &SendWr::write(dmr.remote().at(0))
                .sge(smr.sge(..))
                .inline()
                .wr_id(3),
        )
        .unwrap_or_else(|e| panic!("inline write of max_inline = {n} bytes: {e}"));
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; n];
    dmr.read_at(0, &mut got);
    assert!(got == pattern(61, n));
}

/// 16 SGEs of different lengths gathered into one write, one send, and scattered by a read.
fn multi_sge_gather(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(7, 64 * 1024);
    let mut src2 = pattern(8, 4096);
    let mut dst = vec![0u8; 64 * 1024];
    let smr = p.a.pd.register(&mut src, Access::LOCAL_WRITE).unwrap();
    let smr2 = p.a.pd.register(&mut src2, Access::LOCAL_WRITE).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW | Access::REMOTE_READ).unwrap();
    let src_copy = pattern(7, 64 * 1024);
    let src2_copy = pattern(8, 4096);
    // SGE i: odd offsets and lengths, every third from the second region.
    let mut sges: Vec<Sge> = Vec::new();
    let mut expect = Vec::new();
    for i in 0..16usize {
        let (off, len) = (i * 3001 + i, 100 + i * 37);
        if i % 3 == 2 {
            let off = (i / 3) * 700;
            sges.push(smr2.sge(off..off + len));
            expect.extend_from_slice(&src2_copy[off..off + len]);
        } else {
            sges.push(smr.sge(off..off + len));
            expect.extend_from_slice(&src_copy[off..off + len]);
        }
    }
    let total = expect.len();

    p.a.qp
        .post_send(&SendWr::write(dmr.remote().at(0)).sges(&sges).wr_id(1))
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; total + 16];
    dmr.read_at(0, &mut got);
    assert!(got[..total] == expect[..], "gathered write differs");
    assert!(got[total..].iter().all(|&x| x == 0));

    // The same gather list as a send.
    p.b.qp
        .post_recv(&RecvWr::new().sge(dmr.sge(20_000..40_000)).wr_id(2))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::send().sges(&sges).wr_id(3))
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok() && r.byte_len as usize == total, "{r:?}");
    let mut got = vec![0u8; total];
    dmr.read_at(20_000, &mut got);
    assert!(got == expect, "gathered send differs");

    // A read scattering into the same 16 SGEs: they receive consecutive pieces of the remote
    // range.
    let remote = pattern(9, total);
    dmr.write_at(0, &remote);
    p.a.qp
        .post_send(&SendWr::read(dmr.remote().at(0)).sges(&sges).wr_id(4))
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.byte_len as usize == total, "{c:?}");
    let mut pos = 0;
    for s in &sges {
        let (mr, base) = if s.lkey == smr.lkey() {
            (&smr, smr.addr())
        } else {
            (&smr2, smr2.addr())
        };
        let mut piece = vec![0u8; s.len as usize];
        mr.read_at((s.addr - base) as usize, &mut piece);
        assert!(
            piece[..] == remote[pos..pos + s.len as usize],
            "read piece at {pos}"
        );
        pos += s.len as usize;
    }
}

/// A receive with up to 16 SGEs: the message fills them in order.
fn multi_sge_scatter(t: Topo) {
    let cfg_b = QpConfig {
        max_recv_sge: 16,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &QpConfig::default(), &cfg_b);
    let mut r1 = vec![0u8; 32 * 1024];
    let mut r2 = vec![0u8; 8 * 1024];
    let m1 = p.b.pd.register(&mut r1, Access::LOCAL_WRITE).unwrap();
    let m2 = p.b.pd.register(&mut r2, Access::LOCAL_WRITE).unwrap();
    let mut ranges = Vec::new();
    let mut wr = RecvWr::new().wr_id(11);
    let mut cap = 0;
    for i in 0..16usize {
        let (which, off, len) = if i % 4 == 3 {
            (2, i * 400, 100 + i)
        } else {
            (1, i * 2000 + 1, 500 + 13 * i)
        };
        wr = wr.sge(if which == 1 {
            m1.sge(off..off + len)
        } else {
            m2.sge(off..off + len)
        });
        ranges.push((which, off, len));
        cap += len;
    }
    p.b.qp.post_recv(&wr).unwrap();
    let msg_len = cap - 10; // the last SGE is filled only partly
    let mut src = pattern(10, msg_len);
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    p.a.qp
        .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(12))
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let r = poll1(&p.b.rcq);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!((r.wr_id, r.byte_len as usize), (11, msg_len));
    let msg = pattern(10, msg_len);
    let mut pos = 0;
    for (i, &(which, off, len)) in ranges.iter().enumerate() {
        let mr = if which == 1 { &m1 } else { &m2 };
        let mut piece = vec![0u8; len];
        mr.read_at(off, &mut piece);
        let n = len.min(msg_len - pos);
        assert!(piece[..n] == msg[pos..pos + n], "SGE {i} content");
        assert!(
            piece[n..].iter().all(|&x| x == 0),
            "SGE {i} written past the message"
        );
        pos += n;
    }
    assert_eq!(pos, msg_len);
}

fn zero_length(t: Topo) {
    let mut p = Pair::new(t);
    let mut buf = vec![0x5Au8; 64];
    let mut local = vec![0x5Au8; 64];
    let bmr = p.b.pd.register(&mut buf, RW | Access::REMOTE_READ).unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    // A receive with a buffer and one without; both take a zero-length send.
    p.b.qp
        .post_recv(&RecvWr::new().sge(bmr.sge(..)).wr_id(1))
        .unwrap();
    p.b.qp.post_recv(&RecvWr::new().wr_id(2)).unwrap();
    p.b.qp.post_recv(&RecvWr::new().wr_id(3)).unwrap();
    p.a.qp.post_send(&SendWr::send().wr_id(10)).unwrap();
    p.a.qp.post_send(&SendWr::send().wr_id(11)).unwrap();
    p.a.qp
        .post_send(&SendWr::send_imm(0xABCD).wr_id(12))
        .unwrap();
    // Zero-length write and read (no SGE).
    p.a.qp
        .post_send(&SendWr::write(bmr.remote().at(0)).wr_id(13))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::read(bmr.remote().at(0)).wr_id(14))
        .unwrap();
    let s = poll_ok(&p.a.scq, 5);
    let ids: Vec<u64> = s.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [10, 11, 12, 13, 14]);
    assert_eq!(s[4].opcode, CompletionOp::Read);
    assert_eq!(s[4].byte_len, 0);
    let r = poll_ok(&p.b.rcq, 3);
    assert_eq!(
        r.iter()
            .map(|c| (c.wr_id, c.byte_len, c.imm))
            .collect::<Vec<_>>(),
        [(1, 0, None), (2, 0, None), (3, 0, Some(0xABCD))]
    );
    let mut got = vec![0u8; 64];
    bmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0x5A),
        "zero-length operations wrote data"
    );
    lmr.read_at(0, &mut got);
    assert!(
        got.iter().all(|&x| x == 0x5A),
        "zero-length read wrote data"
    );
}

/// Unsignalled WQEs followed by a signalled one: one CQE, every write landed, and the one
/// CQE frees the ring slots of the unsignalled ones (the rounds add up to more than the ring).
fn unsignaled_then_signaled(t: Topo) {
    let mut p = Pair::new(t);
    let ring = p.a.qp.send_ring_size() as usize;
    let per_round = 200.min(ring - 1);
    let rounds = (3 * ring) / per_round + 1;
    let mut src = vec![0u8; 8 * per_round];
    let mut dst = vec![0u8; 8 * per_round];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    for round in 0..rounds as u64 {
        for i in 0..per_round {
            smr.write_at(i * 8, &(round << 32 | i as u64).to_ne_bytes());
        }
        for i in 0..per_round {
            let mut wr = SendWr::write(dmr.remote().at(8 * i as u64))
                .sge(smr.sge(i * 8..i * 8 + 8))
                .wr_id(round * 1000 + i as u64);
            if i + 1 < per_round {
                wr = wr.unsignaled();
            }
            p.a.qp
                .post_send(&wr)
                .unwrap_or_else(|e| panic!("round {round} post {i}: {e}"));
        }
        let c = poll1(&p.a.scq);
        assert!(c.is_ok(), "{c:?}");
        assert_eq!(c.wr_id, round * 1000 + per_round as u64 - 1);
        assert_quiet(&p.a.scq, Duration::from_millis(5));
        for i in 0..per_round {
            let mut b = [0u8; 8];
            dmr.read_at(i * 8, &mut b);
            assert_eq!(
                u64::from_ne_bytes(b),
                round << 32 | i as u64,
                "round {round} write {i}"
            );
        }
    }
}

/// A write fenced behind a read sends what the read brought (its source is the read's
/// destination).
fn fence_write_after_read(t: Topo) {
    const N: usize = 256 * 1024; // several packets
    let mut p = Pair::new(t);
    let mut remote = vec![0u8; 2 * N];
    let mut local = pattern(99, N);
    let rmr =
        p.b.pd
            .register(&mut remote, RW | Access::REMOTE_READ)
            .unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    let x = pattern(11, N);
    let zeros = vec![0u8; N];
    rmr.write_at(0, &x);
    for round in 0..3u64 {
        p.a.qp
            .post_send(
                &SendWr::read(rmr.remote().at(0))
                    .sge(lmr.sge(..))
                    .wr_id(round * 2),
            )
            .unwrap();
        p.a.qp
            .post_send(
                &SendWr::write(rmr.remote().at(N as u64))
                    .sge(lmr.sge(..))
                    .fence()
                    .wr_id(round * 2 + 1),
            )
            .unwrap();
        let c = poll_ok(&p.a.scq, 2);
        assert_eq!((c[0].wr_id, c[0].opcode), (round * 2, CompletionOp::Read));
        assert_eq!(
            (c[1].wr_id, c[1].opcode),
            (round * 2 + 1, CompletionOp::Write)
        );
        let mut got = vec![0u8; N];
        rmr.read_at(N, &mut got);
        assert!(
            got == x,
            "round {round}: the fenced write did not carry the read data"
        );
        // Next round: new remote data, stale local data.
        lmr.write_at(0, &pattern(100 + round, N));
        rmr.write_at(N, &zeros);
    }
}

/// A write fenced behind a fetch-add sends the old value the atomic returned.
fn fence_write_after_atomic(t: Topo) {
    let mut p = Pair::new(t);
    let mut remote = vec![0u8; 16];
    let mut local = vec![0xFFu8; 8];
    let rmr = p.b.pd.register(&mut remote, Access::ALL).unwrap();
    let lmr = p.a.pd.register(&mut local, Access::LOCAL_WRITE).unwrap();
    rmr.write_at(0, &41u64.to_ne_bytes());
    p.a.qp
        .post_send(
            &SendWr::fetch_add(rmr.remote().at(0), 1)
                .sge(lmr.sge(..))
                .unsignaled(),
        )
        .unwrap();
    p.a.qp
        .post_send(
            &SendWr::write(rmr.remote().at(8))
                .sge(lmr.sge(..))
                .fence()
                .wr_id(2),
        )
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.wr_id == 2, "{c:?}");
    let mut b = [0u8; 16];
    rmr.read_at(0, &mut b);
    assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 42);
    assert_eq!(u64::from_ne_bytes(b[8..].try_into().unwrap()), 41);
}

/// A 4 MiB write and a 4 MiB read (64 packets each, as large as a link ring).
fn large_write_and_read(t: Topo) {
    const N: usize = 4 << 20;
    let mut p = Pair::new(t);
    let mut src = pattern(12, N);
    let mut dst = vec![0u8; N];
    let mut back = vec![0u8; N];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW | Access::REMOTE_READ).unwrap();
    let bmr = p.a.pd.register(&mut back, Access::LOCAL_WRITE).unwrap();
    let expect = pattern(12, N);
    p.a.qp
        .post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&p.a.scq, 1);
    let mut got = vec![0u8; N];
    dmr.read_at(0, &mut got);
    assert!(got == expect, "4 MiB write differs");
    dmr.write_at(0, &pattern(13, N));
    p.a.qp
        .post_send(&SendWr::read(dmr.remote().at(0)).sge(bmr.sge(..)).wr_id(2))
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.byte_len as usize == N, "{c:?}");
    bmr.read_at(0, &mut got);
    assert!(got == pattern(13, N), "4 MiB read differs");
    // Write and read back-to-back, both in flight together.
    p.a.qp
        .post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(3))
        .unwrap();
    p.a.qp
        .post_send(&SendWr::read(dmr.remote().at(0)).sge(bmr.sge(..)).wr_id(4))
        .unwrap();
    let c = poll_ok(&p.a.scq, 2);
    assert_eq!((c[0].wr_id, c[1].wr_id), (3, 4));
    bmr.read_at(0, &mut got);
    assert!(
        got == expect,
        "read after write (same QP, RC order) differs"
    );
}

/// Prepare → commit → run the doorbell ops on a host executor. Nothing runs before the
/// doorbell; a later doorbell exposes every committed send before it.
/// `inline_host`: a small host payload is copied when the WQE is written (clobbering the
/// source before the doorbell changes nothing); one larger than `max_inline` is gathered by
/// the NIC when the doorbell rings (the clobbered bytes arrive).
fn inline_host_copies_small_host_payloads_only(t: Topo) {
    let mut p = Pair::new(t);
    let max = QpConfig::default().max_inline;
    let big = max as usize + 1;
    let mut src = pattern(7, big);
    let mut dst = vec![0u8; 2 * big];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let exec = HostExecutor::default();
    for (len, inlined) in [(8usize, true), (max as usize, true), (big, false)] {
        smr.write_at(0, &pattern(7, big));
        p.b.qp
            .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(1))
            .unwrap();
        let wr = SendWr::send().sge(smr.sge(..len)).inline_host().wr_id(2);
        let prepared = p.a.qp.prepare_send(&wr).unwrap();
        smr.write_at(0, &vec![0xEE; big]);
        p.a.qp.post_prepared(prepared, &exec).unwrap();
        let r = poll1(&p.b.rcq);
        assert!(r.is_ok() && r.byte_len as usize == len, "{r:?}");
        poll_ok(&p.a.scq, 1);
        let mut got = vec![0u8; len];
        dmr.read_at(0, &mut got);
        let want = if inlined {
            pattern(7, big)[..len].to_vec()
        } else {
            vec![0xEE; len]
        };
        assert_eq!(got, want, "{len} bytes: inlined should be {inlined}");
    }
}

fn prepare_commit_host_executor(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = vec![0u8; 24];
    let mut dst = vec![0u8; 24];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    for i in 0..3u64 {
        smr.write_at(8 * i as usize, &(i + 1).to_ne_bytes());
    }
    let mut prepared = Vec::new();
    for i in 0..3u64 {
        let wr = SendWr::write(dmr.remote().at(8 * i))
            .sge(smr.sge(8 * i as usize..8 * i as usize + 8))
            .wr_id(i + 1);
        prepared.push(p.a.qp.prepare_send(&wr).unwrap());
    }
    let tickets: Vec<_> = prepared.iter().map(|p| p.ticket()).collect();
    assert_eq!(tickets[0].index, 0);
    assert_eq!(tickets[1].index, tickets[0].end);
    assert_eq!(tickets[2].index, tickets[1].end);
    assert_eq!(
        tickets.iter().map(|t| t.cqe).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(2)]
    );
    // Prepared only: the device must not have started anything.
    assert_quiet(&p.a.scq, QUIET);
    let slot = |i: usize| word(&dmr, 8 * i);
    assert_eq!(
        (slot(0), slot(1), slot(2)),
        (0, 0, 0),
        "ran before the doorbell"
    );

    let mut ops = Vec::new();
    for (i, pr) in prepared.into_iter().enumerate() {
        let (ticket, o) = p.a.qp.commit(pr).unwrap();
        assert_eq!(ticket, tickets[i]);
        assert!(!o.is_empty());
        ops.push(o);
    }
    assert_quiet(&p.a.scq, QUIET);
    assert_eq!(slot(0), 0, "committed but not rung: must not run");

    let exec = HostExecutor::default();
    exec.run(&ops[0]).unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.wr_id == 1, "{c:?}");
    assert_eq!(slot(0), 1);
    assert_quiet(&p.a.scq, QUIET);
    assert_eq!(slot(1), 0, "the second write ran without its doorbell");

    // Ringing only the third doorbell exposes the second as well.
    exec.run(&ops[2]).unwrap();
    let c = poll_ok(&p.a.scq, 2);
    assert_eq!((c[0].wr_id, c[1].wr_id), (2, 3));
    assert_eq!((slot(1), slot(2)), (2, 3));
}

/// Two commits of one QP appended back to back ring once (the later doorbell exposes both
/// requests); a commit of another QP in between keeps all three doorbells.
fn adjacent_doorbells_of_one_queue_merge(t: Topo) {
    let mut p = Pair::new(t);
    let mut q = p.another();
    let mut src = vec![0u8; 24];
    let mut dst = vec![0u8; 24];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    for i in 0..3u64 {
        smr.write_at(8 * i as usize, &(i + 1).to_ne_bytes());
    }
    let wr = |i: u64| {
        SendWr::write(dmr.remote().at(8 * i))
            .sge(smr.sge(8 * i as usize..8 * i as usize + 8))
            .wr_id(i + 1)
    };
    let commit = |qp: &mut gdasync::gdsync::Qp, w: SendWr| {
        let prepared = qp.prepare_send(&w).unwrap();
        qp.commit(prepared).unwrap().1
    };
    let mut ops = commit(&mut p.a.qp, wr(0));
    let one = ops.len();
    ops.append(commit(&mut p.a.qp, wr(1)));
    assert_eq!(ops.len(), one, "the first doorbell is superseded: {ops:?}");
    let exec = HostExecutor::default();
    exec.run(&ops).unwrap();
    let c = poll_ok(&p.a.scq, 2);
    assert_eq!((c[0].wr_id, c[1].wr_id), (1, 2));
    assert_eq!((word(&dmr, 0), word(&dmr, 8)), (1, 2));

    // Another queue's doorbell in between: nothing merges.
    let mut ops = commit(&mut p.a.qp, wr(2));
    ops.append(commit(&mut q.a.qp, SendWr::nop().wr_id(9)));
    ops.append(commit(&mut p.a.qp, wr(2)));
    assert_eq!(ops.len(), 3 * one, "{ops:?}");
    exec.run(&ops).unwrap();
    let c = poll_ok(&p.a.scq, 2);
    assert_eq!((c[0].wr_id, c[1].wr_id), (3, 3));
    assert_eq!(poll1(&q.a.scq).wr_id, 9);
}

/// A stream's wait for a send whose doorbell was never rung does not pass: every CQE starts
/// unwritten, with an owner bit a first-pass wait does not take (libmlx5 leaves its CQEs
/// with the owner bit a first pass would take: the device marks them).
fn wait_for_a_send_never_rung_does_not_pass(t: Topo) {
    let mut p = Pair::new(t);
    let prepared = p.a.qp.prepare_send(&SendWr::nop().wr_id(1)).unwrap();
    let (ticket, _doorbell_ops_not_run) = p.a.qp.commit(prepared).unwrap();
    let stream = gdasync::gdsync::exec::HostStream::with_timeout(QUIET).unwrap();
    stream.enqueue(p.a.qp.send_wait_ops(&ticket).unwrap());
    let e = stream.synchronize().unwrap_err();
    assert!(matches!(e, gdasync::gdsync::Error::Timeout { .. }), "{e}");
    assert_eq!(p.a.scq.poll_one().unwrap(), None);
}

/// A host stream waits for a send's completion and retires it: the consumer index moves
/// without any host poll, and the stream really blocks until the completion exists.
fn host_stream_waits_for_send(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(14, 4096);
    let mut dst = vec![0u8; 4096];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let stream = host_stream();

    // Doorbell and wait both on the stream.
    let pr =
        p.a.qp
            .prepare_send(
                &SendWr::write(dmr.remote().at(0))
                    .sge(smr.sge(..2048))
                    .wr_id(1),
            )
            .unwrap();
    let (t1, ops) = p.a.qp.commit(pr).unwrap();
    assert_eq!(t1.cqe, Some(0));
    stream.enqueue(ops);
    stream.enqueue(p.a.qp.send_wait_ops(&t1).unwrap());
    stream.synchronize().unwrap();
    assert_eq!(
        p.a.scq.consumer_index(),
        1,
        "the stream's wait did not retire the CQE"
    );
    assert_eq!(
        p.a.scq.poll_one().unwrap(),
        None,
        "a retired CQE was polled again"
    );
    let mut got = vec![0u8; 2048];
    dmr.read_at(0, &mut got);
    assert!(got == pattern(14, 4096)[..2048]);

    // The wait is queued first, the doorbell rung later from this thread: the stream blocks
    // until the completion exists.
    let pr =
        p.a.qp
            .prepare_send(
                &SendWr::write(dmr.remote().at(2048))
                    .sge(smr.sge(2048..))
                    .wr_id(2),
            )
            .unwrap();
    let (t2, ops) = p.a.qp.commit(pr).unwrap();
    stream.enqueue(p.a.qp.send_wait_ops(&t2).unwrap());
    std::thread::sleep(QUIET);
    assert!(
        !stream.is_idle(),
        "the stream passed a wait for a completion that does not exist"
    );
    assert_eq!(p.a.scq.consumer_index(), 1);
    HostExecutor::default().run(&ops).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(p.a.scq.consumer_index(), 2);
    assert_eq!(p.a.scq.poll_one().unwrap(), None);
    dmr.read_at(2048, &mut got);
    assert!(got == pattern(14, 4096)[2048..]);

    // Host posts and stream waits mix: a host-polled completion keeps the numbering.
    p.a.qp
        .post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..8)).wr_id(3))
        .unwrap();
    let c = poll1(&p.a.scq);
    assert!(c.is_ok() && c.wr_id == 3 && c.cqe_index == 2, "{c:?}");
    let t4 =
        p.a.qp
            .post_send(&SendWr::write(dmr.remote().at(8)).sge(smr.sge(..8)).wr_id(4))
            .unwrap();
    assert_eq!(t4.cqe, Some(3));
    stream.enqueue(p.a.qp.send_wait_ops(&t4).unwrap());
    stream.synchronize().unwrap();
    assert_eq!(p.a.scq.consumer_index(), 4);
    assert_eq!(p.a.scq.poll_one().unwrap(), None);
}

/// A host stream waits for a receive's completion.
fn host_stream_waits_for_recv(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(15, 512);
    let mut dst = vec![0u8; 512];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    let stream = host_stream();
    for round in 0..3u64 {
        let rt =
            p.b.qp
                .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(round))
                .unwrap();
        assert_eq!(rt.cqe, Some(round));
        stream.enqueue(p.b.qp.recv_wait_ops(&rt).unwrap());
        std::thread::sleep(Duration::from_millis(10));
        assert!(!stream.is_idle(), "passed a wait for a receive nobody sent");
        p.a.qp
            .post_send(&SendWr::send().sge(smr.sge(..)).wr_id(round))
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(p.b.rcq.consumer_index(), round + 1);
        assert_eq!(p.b.rcq.poll_one().unwrap(), None);
        poll_ok(&p.a.scq, 1);
        let mut got = vec![0u8; 512];
        dmr.read_at(0, &mut got);
        assert_eq!(got, pattern(15, 512));
    }
}

/// Receives that a host stream waits for are retired by the receive CQ's consumption alone
/// (the CQ serves only that receive queue): the wait stores no retired counter of its own, and
/// the 8-slot receive ring is reused many times with no host poll of the receive CQ.
fn host_stream_recv_waits_retire_by_completion_count(t: Topo) {
    let cfg = QpConfig {
        recv_wqes: 8,
        ..QpConfig::default()
    };
    let (dev_a, dev_b) = t.devices();
    let (pd_a, pd_b) = (dev_a.alloc_pd(), dev_b.alloc_pd());
    let (scq, rcq_a) = (dev_a.create_cq(64).unwrap(), dev_a.create_cq(64).unwrap());
    let (scq_b, rcq) = (dev_b.create_cq(64).unwrap(), dev_b.create_cq(64).unwrap());
    let mut a = pd_a.create_qp(&scq, &rcq_a, &cfg).unwrap();
    let mut b = pd_b.create_qp(&scq_b, &rcq, &cfg).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 8 * 8];
    let smr = pd_a.register(&mut src, Access::empty()).unwrap();
    let dmr = pd_b.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    let stream = host_stream();
    for i in 0..40u64 {
        assert_eq!(
            b.recv_room(),
            8,
            "receive {i}: the earlier ones are retired"
        );
        let slot = 8 * (i % 8) as usize;
        let rt = b
            .post_recv(&RecvWr::new().sge(dmr.sge(slot..slot + 8)).wr_id(i))
            .unwrap();
        let ops = b.recv_wait_ops(&rt).unwrap();
        assert_eq!(
            ops.len(),
            2,
            "a completion wait and the CQ doorbell record only: {ops:?}"
        );
        stream.enqueue(ops);
        smr.write_at(0, &i.to_ne_bytes());
        a.post_send(&SendWr::send().sge(smr.sge(..)).wr_id(i))
            .unwrap();
        poll_ok(&scq, 1);
        stream.synchronize().unwrap();
        assert_eq!(word(&dmr, slot), i);
    }
    assert_eq!(
        rcq.poll_one().unwrap(),
        None,
        "the stream consumed every completion"
    );
}

/// `recv_wait_ops_then`: the ops given run after the receive's wait and before the store of
/// the CQ's consumer index that retires it. A host stream holds at a flag the test sets only
/// after the message arrived; until then the CPU sees the receive neither retired nor its
/// ops run, and once the stream passes, both.
fn ops_between_a_recv_wait_and_its_retirement_run_before_the_cpu_sees_it_done(t: Topo) {
    let (dev_a, dev_b) = t.devices();
    let (pd_a, pd_b) = (dev_a.alloc_pd(), dev_b.alloc_pd());
    let (scq, rcq_a) = (dev_a.create_cq(64).unwrap(), dev_a.create_cq(64).unwrap());
    let (scq_b, rcq) = (dev_b.create_cq(64).unwrap(), dev_b.create_cq(64).unwrap());
    let mut a = pd_a.create_qp(&scq, &rcq_a, &QpConfig::default()).unwrap();
    let mut b = pd_b.create_qp(&scq_b, &rcq, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let mut src = 7u64.to_ne_bytes().to_vec();
    let mut dst = vec![0u8; 8];
    let smr = pd_a.register(&mut src, Access::empty()).unwrap();
    let dmr = pd_b.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    let words = gdasync::gdsync::SignalWords::new(2);
    let rt = b
        .post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(1))
        .unwrap();
    // Word 0 holds the stream; word 1 is what runs between the wait and the retirement.
    let mut between = words.wait64(0, 1, gdasync::gdsync::ops::WaitCond::Geq);
    between.append(words.write64(1, 5));
    let ops = b.recv_wait_ops_then(&rt, between).unwrap();
    use gdasync::gdsync::ops::Op;
    assert!(
        matches!(
            ops.as_slice(),
            [
                Op::Wait32 { .. },
                Op::Wait64 { .. },
                Op::Write64 { .. },
                Op::Barrier,
                Op::Write32 { .. }
            ]
        ),
        "the completion's wait, the ops given, a barrier (they store), then the retirement: {ops:?}"
    );
    let stream = host_stream();
    stream.enqueue(ops);
    a.post_send(&SendWr::send().sge(smr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&scq, 1);
    std::thread::sleep(QUIET);
    assert_eq!(rcq.consumer_index(), 0, "retired before the ops given ran");
    assert_eq!(words.load64(1), 0);
    words.store64(0, 1);
    stream.synchronize().unwrap();
    assert_eq!(words.load64(1), 5);
    assert_eq!(
        rcq.consumer_index(),
        1,
        "the stream retires the receive last"
    );
    assert_eq!(word(&dmr, 0), 7);
}

/// Many sends driven by a host stream only (doorbells and waits), with a 16-slot send ring
/// and a 16-entry CQ: both wrap many times, and the host never polls.
fn host_stream_wraps_rings(t: Topo) {
    const N: usize = 200;
    let cfg = QpConfig {
        send_wqebbs: 16,
        ..QpConfig::default()
    };
    let (dev_a, dev_b) = t.devices();
    let pd_a = dev_a.alloc_pd();
    let scq = dev_a.create_cq(16).unwrap();
    let rcq = dev_a.create_cq(16).unwrap();
    let mut a = pd_a.create_qp(&scq, &rcq, &cfg).unwrap();
    let mut b = Side::new(&dev_b, &QpConfig::default());
    a.connect(&b.qp.endpoint()).unwrap();
    b.qp.connect(&a.endpoint()).unwrap();
    // 16 on the soft device; libmlx5 may round up further (64 on rdma-core 44).
    let ring = a.send_ring_size() as usize;
    assert!((16..=N / 3).contains(&ring), "{ring} WQEBBs");

    let mut src = vec![0u8; 8 * N];
    let mut dst = vec![0u8; 8 * N];
    let smr = pd_a.register(&mut src, Access::empty()).unwrap();
    let dmr = b.pd.register(&mut dst, RW).unwrap();
    for i in 0..N {
        smr.write_at(8 * i, &(i as u64 + 1000).to_ne_bytes());
    }
    let stream = host_stream();
    let start = std::time::Instant::now();
    for i in 0..N {
        let wr = SendWr::write(dmr.remote().at(8 * i as u64))
            .sge(smr.sge(8 * i..8 * i + 8))
            .wr_id(i as u64);
        // The ring frees up only as the stream retires completions.
        let pr = loop {
            match a.prepare_send(&wr) {
                Ok(pr) => break pr,
                Err(gdasync::gdsync::Error::RingFull { .. }) => {
                    assert!(start.elapsed() < TIMEOUT, "ring never freed at {i}");
                    std::thread::yield_now();
                }
                Err(e) => panic!("prepare {i}: {e}"),
            }
        };
        let (tk, ops) = a.commit(pr).unwrap();
        assert_eq!(tk.cqe, Some(i as u64));
        stream.enqueue(ops);
        stream.enqueue(a.send_wait_ops(&tk).unwrap());
    }
    stream.synchronize().unwrap();
    assert_eq!(scq.consumer_index(), N as u64);
    assert_eq!(scq.poll_one().unwrap(), None);
    for i in 0..N {
        let mut w = [0u8; 8];
        dmr.read_at(8 * i, &mut w);
        assert_eq!(u64::from_ne_bytes(w), i as u64 + 1000, "write {i}");
    }
}

/// 1000 writes of increasing values to one location: the last one wins.
fn writes_to_one_location_last_wins(t: Topo) {
    const N: usize = 1000;
    let mut p = Pair::new(t);
    let mut src = vec![0u8; 8 * N];
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    for i in 0..N {
        smr.write_at(8 * i, &(i as u64 + 1).to_ne_bytes());
    }
    let remote = dmr.remote();
    post_all(&mut p.a, N, 64, |i| {
        SendWr::write(remote.at(8))
            .sge(smr.sge(8 * i..8 * i + 8))
            .wr_id(i as u64)
    });
    let mut b = [0u8; 8];
    dmr.read_at(8, &mut b);
    assert_eq!(u64::from_ne_bytes(b), N as u64, "the last write must win");
    // Same with inline writes and two sizes overlapping: the 16-byte ones cover the word.
    post_all(&mut p.a, N, 64, |i| {
        let len = if i % 3 == 0 { 16 } else { 8 };
        SendWr::write(remote.at(8))
            .sge(smr.sge(8 * (N - 1 - i).min(N - 2)..8 * (N - 1 - i).min(N - 2) + len))
            .inline()
            .wr_id(i as u64)
    });
    // The last (i = N-1, 16 bytes since 999 % 3 == 0) wrote src words 0 and 1.
    let mut b = [0u8; 16];
    dmr.read_at(8, &mut b);
    assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 1);
    assert_eq!(u64::from_ne_bytes(b[8..].try_into().unwrap()), 2);
}

/// 1000 sends arrive in posting order, each in the receive posted for it; some span several
/// packets.
fn sends_arrive_in_order(t: Topo) {
    const N: usize = 1000;
    const BIG: usize = 150 * 1024;
    let cfg_b = QpConfig {
        recv_wqes: 1024,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(t, &QpConfig::default(), &cfg_b);
    let is_big = |i: usize| i % 50 == 49;
    let nbig = N / 50;
    let mut slots = vec![0u8; 8 * N];
    let mut bigs = vec![0u8; BIG * nbig];
    let mut src = vec![0u8; 8 * N];
    let mut bigsrc = pattern(16, BIG + 8 * N);
    let slots_mr = p.b.pd.register(&mut slots, Access::LOCAL_WRITE).unwrap();
    let bigs_mr = p.b.pd.register(&mut bigs, Access::LOCAL_WRITE).unwrap();
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let bigsrc_mr = p.a.pd.register(&mut bigsrc, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        smr.write_at(8 * i, &(i as u64).to_ne_bytes());
        // Each big message starts with its sequence number.
        bigsrc_mr.write_at(8 * i, &(i as u64).to_ne_bytes());
    }
    for i in 0..N {
        let sge = if is_big(i) {
            let j = i / 50;
            bigs_mr.sge(j * BIG..(j + 1) * BIG)
        } else {
            slots_mr.sge(8 * i..8 * i + 8)
        };
        p.b.qp
            .post_recv(&RecvWr::new().sge(sge).wr_id(i as u64))
            .unwrap();
    }
    post_all(&mut p.a, N, 64, |i| {
        let sge = if is_big(i) {
            bigsrc_mr.sge(8 * i..8 * i + BIG)
        } else {
            smr.sge(8 * i..8 * i + 8)
        };
        SendWr::send().sge(sge).wr_id(i as u64)
    });
    let r = poll_ok(&p.b.rcq, N);
    let bigsrc_copy = {
        let mut v = pattern(16, BIG + 8 * N);
        for i in 0..N {
            v[8 * i..8 * i + 8].copy_from_slice(&(i as u64).to_ne_bytes());
        }
        v
    };
    for (i, c) in r.iter().enumerate() {
        assert_eq!(c.wr_id, i as u64, "completion {i} out of order");
        assert_eq!(c.byte_len as usize, if is_big(i) { BIG } else { 8 });
        if is_big(i) {
            let j = i / 50;
            let mut got = vec![0u8; BIG];
            bigs_mr.read_at(j * BIG, &mut got);
            assert!(
                got[..] == bigsrc_copy[8 * i..8 * i + BIG],
                "big message {i}"
            );
        } else {
            let mut b = [0u8; 8];
            slots_mr.read_at(8 * i, &mut b);
            assert_eq!(
                u64::from_ne_bytes(b),
                i as u64,
                "message {i} in the wrong receive"
            );
        }
    }
    assert_quiet(&p.b.rcq, Duration::ZERO);
}

/// Dropping a host stream right after `synchronize` returns must not hang.
#[test]
fn host_stream_drop_right_after_synchronize() {
    // Several threads at once, so that a worker is often preempted inside its loop.
    const THREADS: usize = 4;
    const ROUNDS: usize = 20_000;
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..THREADS {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                let stream = HostStream::new().unwrap();
                stream.enqueue(gdasync::gdsync::ops::Ops::barrier());
                stream.synchronize().unwrap();
                drop(stream);
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    for done in 0..THREADS * ROUNDS {
        if let Err(e) = rx.recv_timeout(Duration::from_secs(10)) {
            panic!("a host stream drop hung after {done} drops ({e})");
        }
    }
}

/// Receives posted before `connect` (state Init) are used once the peer sends.
#[test]
fn receive_posted_before_connect() {
    let dev_a = gdasync::gdsync::Device::soft().unwrap();
    let dev_b = gdasync::gdsync::Device::soft().unwrap();
    let mut a = Side::new(&dev_a, &QpConfig::default());
    let mut b = Side::new(&dev_b, &QpConfig::default());
    let mut dst = vec![0u8; 64];
    let mut src = pattern(17, 64);
    let dmr = b.pd.register(&mut dst, Access::LOCAL_WRITE).unwrap();
    let smr = a.pd.register(&mut src, Access::empty()).unwrap();
    b.qp.post_recv(&RecvWr::new().sge(dmr.sge(..)).wr_id(3))
        .unwrap();
    a.qp.connect(&b.qp.endpoint()).unwrap();
    b.qp.connect(&a.qp.endpoint()).unwrap();
    a.qp.post_send(&SendWr::send().sge(smr.sge(..)).wr_id(4))
        .unwrap();
    poll_ok(&a.scq, 1);
    let r = poll1(&b.rcq);
    assert!(r.is_ok() && r.wr_id == 3 && r.byte_len == 64, "{r:?}");
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert_eq!(got, pattern(17, 64));
}

/// The soft engines count the RDMA writes (without immediate) they take in as responders:
/// the requests that land without a completion to poll for, which the emulated driver's
/// lingering `poll_cq` watches. A write (here put straight into the target's memory, both
/// devices being of this process) counts at its target. The count is process-wide and other
/// tests run beside this one: only its growth is checked.
#[test]
fn soft_writes_taken_in_count_what_lands_without_a_completion() {
    let Pair { mut a, b } = Pair::new(Topo::TwoDevices);
    let mut dst = vec![0u8; 64];
    let mut src = pattern(5, 64);
    let dmr =
        b.pd.register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let smr = a.pd.register(&mut src, Access::empty()).unwrap();
    let before = gdasync::gdsync::soft_writes_taken_in();
    a.qp.post_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(1))
        .unwrap();
    poll_ok(&a.scq, 1);
    let after = gdasync::gdsync::soft_writes_taken_in();
    assert!(
        after > before,
        "the write's target took it in: {before} -> {after}"
    );
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert_eq!(got, pattern(5, 64));
}

/// A QP's send ring has the WQEBBs asked for (libmlx5 would size it at several per request),
/// so CQs of that size are enough for a kernel to take the QP.
fn send_ring_is_the_size_asked_for_so_a_kernel_can_take_it(t: Topo) {
    let (dev, _) = t.devices();
    let pd = dev.alloc_pd();
    for n in [16, 64, 512] {
        let (scq, rcq) = (dev.create_cq(n).unwrap(), dev.create_cq(4).unwrap());
        let cfg = QpConfig {
            send_wqebbs: n,
            recv_wqes: 4,
            ..QpConfig::default()
        };
        let qp = pd.create_qp(&scq, &rcq, &cfg).unwrap();
        assert_eq!(qp.send_ring_size(), n);
        let on_gpu = qp.into_device();
        assert!(on_gpu.is_ok(), "{n} WQEBBs: {:?}", on_gpu.err());
    }
}

/// With a CPU proxy as NIC handler, committed op lists ask the proxy to ring (a barrier and
/// one host store) instead of ringing themselves; the work still completes, from a host
/// executor and from a host stream.
#[test]
fn cpu_proxy_rings_for_committed_sends() {
    use gdasync::gdsync::ops::Op;
    use gdasync::gdsync::{Device, NicHandler};
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let cfg = QpConfig {
        nic_handler: Some(NicHandler::Cpu),
        ..QpConfig::default()
    };
    let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (scq2, rcq2) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let mut a = pd.create_qp(&scq, &rcq, &cfg).unwrap();
    let mut b = pd.create_qp(&scq2, &rcq2, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let mut src = vec![9u8; 64];
    let mut dst = vec![0u8; 64];
    let smr = pd.register(&mut src, Access::LOCAL_WRITE).unwrap();
    let dmr = pd
        .register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let p = a
        .prepare_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(1))
        .unwrap();
    let (_, ops) = a.commit(p).unwrap();
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(matches!(ops.as_slice(), [Op::Barrier, Op::Write64 { .. }]));
    HostExecutor::default().run(&ops).unwrap();
    let c = scq.wait_one(Duration::from_secs(5)).unwrap();
    assert!(c.is_ok() && c.wr_id == 1, "{c:?}");
    let mut got = [0u8; 64];
    dmr.read_at(0, &mut got);
    assert_eq!(got, [9u8; 64]);
    // From a host stream, with the stream waiting for the completion.
    let stream = HostStream::new().unwrap();
    smr.write_at(0, &[4u8; 64]);
    let p = a
        .prepare_send(&SendWr::write(dmr.remote().at(0)).sge(smr.sge(..)).wr_id(2))
        .unwrap();
    let t = a.post_prepared(p, &stream).unwrap();
    a.wait_send(&t, &stream).unwrap();
    stream.synchronize().unwrap();
    scq.check().unwrap();
    dmr.read_at(0, &mut got);
    assert_eq!(got, [4u8; 64]);
    assert_eq!(scq.consumer_index(), 2);
}

/// CPU posts interleaved with `HostStream` commits on one QP, thousands of times: each CPU
/// post waits until the stream's doorbell is out (the "rung to" word), so the QP's doorbells
/// never go backwards (the soft device, also behind the emulated driver, refuses one that
/// does with a QP error). Every send completes without error, in order, and its bytes land.
fn cpu_posts_interleave_with_host_stream_commits(t: Topo) {
    let mut p = Pair::new(t);
    let mut src = pattern(1, 64);
    let mut dst = vec![0u8; 64];
    let smr = p.a.pd.register(&mut src, Access::empty()).unwrap();
    let dmr = p.b.pd.register(&mut dst, RW).unwrap();
    let stream = HostStream::new().unwrap();
    let mut next = 0u64;
    for round in 0..250 {
        let first = next;
        for k in 0..8usize {
            let wr = SendWr::write(dmr.remote().at(8 * k as u64))
                .sge(smr.sge(8 * k..8 * k + 8))
                .wr_id(next);
            if k % 2 == 0 {
                let prepared = p.a.qp.prepare_send(&wr).unwrap();
                p.a.qp.post_prepared(prepared, &stream).unwrap();
            } else {
                // Right after the stream was handed a commit: the CPU post races its ring.
                let start = std::time::Instant::now();
                while p.a.qp.has_unrung_commits() {
                    assert!(start.elapsed() < TIMEOUT, "the stream never rang");
                    std::hint::spin_loop();
                }
                p.a.qp.post_send(&wr).unwrap();
            }
            next += 1;
        }
        stream.synchronize().unwrap();
        for (c, id) in poll_ok(&p.a.scq, 8).iter().zip(first..next) {
            assert_eq!(c.wr_id, id, "round {round}: completions in order");
        }
    }
    let mut got = vec![0u8; 64];
    dmr.read_at(0, &mut got);
    assert_eq!(got, pattern(1, 64));
}
