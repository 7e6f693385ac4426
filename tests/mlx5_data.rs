//! rdma-core's own data path against the soft HCA: work posted by libmlx5's `ibv_post_send`
//! and `ibv_post_recv` on two connected QPs of the emulated mlx5 device is executed by the
//! soft device serving that device (`gdsync::mlx5::serve_emulated_driver`), and its
//! completions are read back by libmlx5's own `ibv_poll_cq`: status, opcode, byte count,
//! immediate, QP number and work-request id, with the data checked in memory. The soft
//! device is thereby checked against rdma-core's encoder (the WQEs it parses) and decoder
//! (the CQEs it writes), not only against gdsync's own.
//!
//! Each test runs its body in a child under the emulated driver (the preload must be in a
//! process's environment from its start); ignored where rdma-core is not installed.

use gdsync::mlx5::{
    serve_emulated_driver, Context, Cq, Mr, Pd, Placement, Qp, QpCaps, RemoteQp, RtrAttr, RtsAttr,
    VerbsCompletion,
};
use gdsync::{Access, RecvWr, RemoteAddr, SendWr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uverbs_emu::in_child_under_emulator;

/// Bytes of each side's registered buffer.
const BUF_LEN: usize = 1 << 16;
/// `ibv_wc_opcode` values.
const WC_SEND: u32 = 0;
const WC_RDMA_WRITE: u32 = 1;
const WC_RDMA_READ: u32 = 2;
const WC_COMP_SWAP: u32 = 3;
const WC_FETCH_ADD: u32 = 4;
const WC_RECV: u32 = 128;
const WC_RECV_RDMA_WITH_IMM: u32 = 129;
/// `ibv_wc_status` values.
const WC_SUCCESS: u32 = 0;
const WC_REM_ACCESS_ERR: u32 = 10;
const WC_WR_FLUSH_ERR: u32 = 5;
/// How long a completion may take before the test gives up (a hang guard, not a measure).
const PATIENCE: Duration = Duration::from_secs(20);

/// One side of the connection: a QP with a CQ of its own and a registered buffer.
struct Side {
    qp: Qp,
    cq: Arc<Cq>,
    mr: Mr<'static>,
    pd: Arc<Pd>,
}

impl Side {
    /// `len` bytes of the buffer at `off`.
    fn peek(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= BUF_LEN);
        let mut out = vec![0u8; len];
        // SAFETY: inside the leaked, registered buffer; the HCA wrote it before the
        // completion that was polled (libmlx5's poll orders the reads after it).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.mr.addr() as usize + off) as *const u8,
                out.as_mut_ptr(),
                len,
            )
        };
        out
    }

    /// Writes `bytes` into the buffer at `off` (no work on it is outstanding).
    fn poke(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= BUF_LEN);
        // SAFETY: inside the leaked, registered buffer, which no posted work touches now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (self.mr.addr() as usize + off) as *mut u8,
                bytes.len(),
            )
        };
    }

    /// libmlx5's `ibv_post_send` of one work request.
    fn post(&self, wr: SendWr) {
        // SAFETY: every SGE and remote address lies in the leaked, registered buffers.
        unsafe { self.qp.verbs_post_send(&[wr]) }.unwrap();
    }

    /// libmlx5's `ibv_post_recv` of one receive.
    fn post_recv(&self, wr: RecvWr) {
        // SAFETY: as in `post`.
        unsafe { self.qp.verbs_post_recv(&[wr]) }.unwrap();
    }

    /// The next completion of this side's CQ, as `ibv_poll_cq` decodes it.
    fn next(&self) -> VerbsCompletion {
        let start = Instant::now();
        loop {
            if let Some(c) = self.cq.verbs_poll(1).unwrap().pop() {
                return c;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no completion on QP {:#x} after {PATIENCE:?}",
                self.qp.qpn()
            );
            std::thread::yield_now();
        }
    }

    /// Checks that nothing more completed on this side's CQ.
    fn none_left(&self) {
        let left = self.cq.verbs_poll(4).unwrap();
        assert!(left.is_empty(), "unexpected completions: {left:?}");
    }
}

/// A pattern byte for offset `off` of a buffer, different per `seed`.
fn pattern(seed: u8, off: usize) -> u8 {
    (off as u8).wrapping_mul(31).wrapping_add(seed)
}

/// Where the CQs' and QPs' rings lie.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rings {
    /// Where libmlx5 allocates them.
    Libmlx5,
    /// In memory the test placed (`Pd::placing`).
    Placed,
}

/// Page-aligned memory for one object's ring (`len` bytes) and doorbell record, kept until
/// the test process ends.
fn placed_memory(len: usize) -> Placement {
    let layout = std::alloc::Layout::from_size_align(len + 4096, 4096).unwrap();
    // SAFETY: a nonzero size; never freed (the process ends after the test).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    assert_ne!(ptr, 0);
    Placement {
        ring: ptr,
        ring_len: len,
        dbrec: ptr + len,
    }
}

/// Two QPs of the emulated device (`mlx5_0`) connected to each other, each with its own CQ and
/// buffer (`a` filled with pattern 1, `b` with pattern 2), served by the soft HCA.
fn connected_pair(rings: Rings) -> (Side, Side) {
    assert_eq!(serve_emulated_driver().unwrap(), 1, "one emulated device");
    let ctx = Context::open("mlx5_0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let placing = pd.placing().unwrap();
    let port = ctx.query_port(1).unwrap();
    let gid = ctx.choose_gid(1, None).unwrap().entry;
    let caps = QpCaps {
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
        ..QpCaps::default()
    };
    let make = |seed: u8| {
        let (cq, qp) = match rings {
            Rings::Libmlx5 => {
                let cq = ctx.create_cq(64).unwrap();
                let qp = pd.create_qp(&cq, &cq, &caps).unwrap();
                (cq, qp)
            }
            Rings::Placed => {
                let cq = placing.create_cq_in(64, placed_memory(64 << 10)).unwrap();
                let qp = placing
                    .create_qp_in(&cq, &cq, &caps, placed_memory(256 << 10))
                    .unwrap();
                (cq, qp)
            }
        };
        // The test process ends after the test: the buffer may live as long.
        let buf: &'static mut [u8] = Vec::leak((0..BUF_LEN).map(|i| pattern(seed, i)).collect());
        let mr = pd.reg_mr(buf, Access::ALL).unwrap();
        qp.to_init(1, Access::ALL).unwrap();
        Side {
            qp,
            cq,
            mr,
            pd: pd.clone(),
        }
    };
    let (a, b) = (make(1), make(2));
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let remote = RemoteQp {
            qpn: peer.qp.qpn(),
            psn: 0,
            lid: port.lid,
            gid: Some(gid.gid),
        };
        me.qp
            .to_rtr(&RtrAttr {
                sgid_index: gid.index as u8,
                ..RtrAttr::new(remote, 1, port.active_mtu)
            })
            .unwrap();
        me.qp.to_rts(&RtsAttr::default()).unwrap();
    }
    (a, b)
}

/// In the test's process: runs test `name` again in a child under the emulated driver, and
/// returns `None` once it passed there. In that child: the connected pair.
fn pair_in_child(name: &str, rings: Rings) -> Option<(Side, Side)> {
    match in_child_under_emulator(name, "mlx5_0") {
        true => None,
        false => Some(connected_pair(rings)),
    }
}

/// Checks a completion field by field against what it should say.
#[track_caller]
fn expect(c: VerbsCompletion, wr_id: u64, opcode: u32, byte_len: Option<u32>, imm: Option<u32>) {
    assert_eq!(c.status, WC_SUCCESS, "{c:?}");
    assert_eq!((c.wr_id, c.opcode, c.imm), (wr_id, opcode, imm), "{c:?}");
    if let Some(len) = byte_len {
        assert_eq!(c.byte_len, len, "{c:?}");
    }
}

/// Checks the sender's completion of a send or write with immediate: libmlx5 flags it
/// `IBV_WC_WITH_IMM` from the WQE opcode in the CQE, though the CQE carries no immediate
/// for the requester (and libmlx5 leaves `imm_data` as it was).
#[track_caller]
fn expect_sent_imm(c: VerbsCompletion, wr_id: u64, opcode: u32) {
    assert_eq!(c.status, WC_SUCCESS, "{c:?}");
    assert_eq!((c.wr_id, c.opcode), (wr_id, opcode), "{c:?}");
    assert!(c.imm.is_some(), "flagged as with immediate: {c:?}");
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libmlx5_sends_and_receives_complete_on_the_soft_hca() {
    let Some((a, b)) = pair_in_child(
        "mlx5_libmlx5_sends_and_receives_complete_on_the_soft_hca",
        Rings::Libmlx5,
    ) else {
        return;
    };
    // A send of two SGEs into a receive of two SGEs.
    b.post_recv(
        RecvWr::new()
            .wr_id(100)
            .sge(b.mr.sge(0, 30))
            .sge(b.mr.sge(100, 70)),
    );
    a.post(
        SendWr::send()
            .wr_id(1)
            .sge(a.mr.sge(0, 20))
            .sge(a.mr.sge(50, 40)),
    );
    expect(a.next(), 1, WC_SEND, None, None);
    let r = b.next();
    expect(r, 100, WC_RECV, Some(60), None);
    assert_eq!(r.qp_num, b.qp.qpn());
    let sent: Vec<u8> = [a.peek(0, 20), a.peek(50, 40)].concat();
    assert_eq!([b.peek(0, 30), b.peek(100, 30)].concat(), sent);
    assert_eq!(b.peek(130, 1), [pattern(2, 130)], "past the message");

    // A send with immediate, inline.
    b.post_recv(RecvWr::new().wr_id(101).sge(b.mr.sge(1000, 64)));
    a.post(
        SendWr::send_imm(0xdead_beef)
            .wr_id(2)
            .sge(a.mr.sge(200, 48))
            .inline(),
    );
    expect_sent_imm(a.next(), 2, WC_SEND);
    expect(b.next(), 101, WC_RECV, Some(48), Some(0xdead_beef));
    assert_eq!(b.peek(1000, 48), a.peek(200, 48));

    // An unsignalled send: only the receive completes, then a signalled one behind it.
    b.post_recv(RecvWr::new().wr_id(102).sge(b.mr.sge(2000, 16)));
    b.post_recv(RecvWr::new().wr_id(103).sge(b.mr.sge(2100, 16)));
    a.post(SendWr::send().wr_id(3).sge(a.mr.sge(300, 16)).unsignaled());
    a.post(SendWr::send().wr_id(4).sge(a.mr.sge(400, 0)));
    expect(a.next(), 4, WC_SEND, None, None);
    expect(b.next(), 102, WC_RECV, Some(16), None);
    expect(b.next(), 103, WC_RECV, Some(0), None);
    assert_eq!(b.peek(2000, 16), a.peek(300, 16));
    a.none_left();
    b.none_left();
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libmlx5_qps_on_dynamic_uars_are_rung_there() {
    let Some((a, b)) = pair_in_child(
        "mlx5_libmlx5_qps_on_dynamic_uars_are_rung_there",
        Rings::Libmlx5,
    ) else {
        return;
    };
    // On the ioctl ABI (the default) libmlx5 allocates its UARs itself, as on a current
    // kernel: one for its CQs' doorbells and one for every two QPs, which it names by page
    // in CREATE_QP and rings at either of the page's BlueFlame registers. On the legacy
    // ABI it takes the static UAR pages GET_CONTEXT gives.
    let (uars, qps) = uverbs_emu::control::dyn_uar_count().unwrap();
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        assert_eq!((uars, qps), (0, 0), "no dynamic UARs on the legacy ABI");
    } else {
        assert!(
            uars >= 2 && qps >= 2,
            "{uars} dynamic UARs, {qps} QPs on them"
        );
    }
    // Both QPs move data, each rung on its own register: sends both ways, then a write.
    for (from, to, id) in [(&a, &b, 1), (&b, &a, 2)] {
        to.post_recv(RecvWr::new().wr_id(100 + id).sge(to.mr.sge(0, 64)));
        from.post(SendWr::send().wr_id(id).sge(from.mr.sge(512, 64)));
        expect(from.next(), id, WC_SEND, None, None);
        expect(to.next(), 100 + id, WC_RECV, Some(64), None);
        assert_eq!(to.peek(0, 64), from.peek(512, 64));
    }
    a.none_left();
    b.none_left();
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libmlx5_rdma_and_atomics_complete_on_the_soft_hca() {
    let name = "mlx5_libmlx5_rdma_and_atomics_complete_on_the_soft_hca";
    if let Some((a, b)) = pair_in_child(name, Rings::Libmlx5) {
        rdma_and_atomics(a, b);
    }
}

/// The same work on CQs and QPs whose rings and doorbell records lie in memory the test
/// placed: libmlx5 writes its WQEs there, the soft HCA reads them there and writes the CQEs
/// libmlx5 polls there.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libmlx5_rdma_and_atomics_on_placed_rings() {
    if let Some((a, b)) = pair_in_child(
        "mlx5_libmlx5_rdma_and_atomics_on_placed_rings",
        Rings::Placed,
    ) {
        rdma_and_atomics(a, b);
    }
}

/// RDMA write (with and without immediate), read and both atomics from `a` to `b`, with
/// every completion and byte checked.
fn rdma_and_atomics(a: Side, b: Side) {
    // RDMA write: the target sees no completion.
    a.post(
        SendWr::write(b.mr.remote(4096))
            .wr_id(10)
            .sge(a.mr.sge(0, 100)),
    );
    expect(a.next(), 10, WC_RDMA_WRITE, None, None);
    assert_eq!(b.peek(4096, 100), a.peek(0, 100));
    b.none_left();

    // RDMA write with immediate: consumes a receive, whose completion has the length.
    b.post_recv(RecvWr::new().wr_id(200));
    a.post(
        SendWr::write_imm(b.mr.remote(8192), 0x0102_0304)
            .wr_id(11)
            .sge(a.mr.sge(1000, 300)),
    );
    expect_sent_imm(a.next(), 11, WC_RDMA_WRITE);
    let r = b.next();
    expect(r, 200, WC_RECV_RDMA_WITH_IMM, Some(300), Some(0x0102_0304));
    assert_eq!(r.qp_num, b.qp.qpn());
    assert_eq!(b.peek(8192, 300), a.peek(1000, 300));

    // RDMA read into two SGEs.
    a.post(
        SendWr::read(b.mr.remote(12288))
            .wr_id(12)
            .sge(a.mr.sge(20000, 50))
            .sge(a.mr.sge(21000, 150)),
    );
    expect(a.next(), 12, WC_RDMA_READ, Some(200), None);
    assert_eq!(
        [a.peek(20000, 50), a.peek(21000, 150)].concat(),
        b.peek(12288, 200)
    );

    // Atomics on an 8-byte word of b: fetch-and-add, then compare-and-swap that hits and one
    // that misses.
    let word = 16384u64;
    b.poke(word as usize, &10u64.to_ne_bytes());
    let target = b.mr.remote(word);
    // (work request, its completion's opcode, the value fetched, the word after)
    let atomics = [
        (SendWr::fetch_add(target, 5), WC_FETCH_ADD, 10u64, 15u64),
        (SendWr::compare_swap(target, 15, 99), WC_COMP_SWAP, 15, 99),
        (SendWr::compare_swap(target, 15, 7), WC_COMP_SWAP, 99, 99),
    ];
    for (i, (wr, opcode, fetched, after)) in atomics.into_iter().enumerate() {
        let (id, at) = (13 + i as u64, 30000 + 8 * i as u64);
        a.post(wr.wr_id(id).sge(a.mr.sge(at, 8)));
        expect(a.next(), id, opcode, Some(8), None);
        assert_eq!(a.peek(at as usize, 8), fetched.to_ne_bytes(), "atomic {i}");
        assert_eq!(b.peek(word as usize, 8), after.to_ne_bytes(), "atomic {i}");
    }
    a.none_left();
    b.none_left();
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_libmlx5_reads_the_soft_hcas_error_completions() {
    let Some((a, b)) = pair_in_child(
        "mlx5_libmlx5_reads_the_soft_hcas_error_completions",
        Rings::Libmlx5,
    ) else {
        return;
    };
    // A write with a wrong rkey: a remote access error, the send behind it flushed, and the
    // target's memory untouched. (The soft device reports no vendor syndrome: `vendor_err`
    // is 0 where a ConnectX puts its own code.)
    let bad = RemoteAddr {
        rkey: b.mr.rkey() ^ 0x80,
        ..b.mr.remote(0)
    };
    a.post(SendWr::write(bad).wr_id(20).sge(a.mr.sge(0, 64)));
    a.post(SendWr::send().wr_id(21).sge(a.mr.sge(0, 8)));
    let e = a.next();
    assert_eq!((e.wr_id, e.status), (20, WC_REM_ACCESS_ERR), "{e:?}");
    let f = a.next();
    assert_eq!((f.wr_id, f.status), (21, WC_WR_FLUSH_ERR), "{f:?}");
    assert_eq!(
        b.peek(0, 64),
        (0..64).map(|i| pattern(2, i)).collect::<Vec<_>>()
    );
    a.none_left();
}

/// `len` bytes at `addr` of this process, read without touching them (`None`: not mapped).
fn read_own(addr: usize, len: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; len];
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the kernel reads this process's memory at `addr` (EFAULT where it is not
    // mapped) and writes `out`, which is `len` bytes.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == len as isize).then_some(out)
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_a_write_into_a_region_the_process_unmapped_lands_in_its_pinned_pages() {
    let Some((a, b)) = pair_in_child(
        "mlx5_a_write_into_a_region_the_process_unmapped_lands_in_its_pinned_pages",
        Rings::Libmlx5,
    ) else {
        return;
    };
    // A region of the process's own mapping, unmapped while registered: as on a ConnectX,
    // whose pages stay pinned, the write completes and lands in pages the process no longer
    // uses; they go when the region does.
    let len = 64 << 10;
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above; the test unmaps it while registered on purpose (the
    // driver keeps the pages until the region is dropped).
    let mr = unsafe { b.pd.reg_mr_raw(p as u64, len, Access::ALL) }.unwrap();
    // SAFETY: the mapping above, which nothing of this process touches after.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    a.post(
        SendWr::write(mr.remote(4096))
            .wr_id(30)
            .sge(a.mr.sge(0, 100)),
    );
    expect(a.next(), 30, WC_RDMA_WRITE, None, None);
    assert_eq!(read_own(p as usize + 4096, 100), Some(a.peek(0, 100)));
    drop(mr);
    assert_eq!(
        read_own(p as usize, 1),
        None,
        "the pages went with the region"
    );

    // A heap buffer freed while registered (glibc gives a 1 MiB block back with munmap).
    let heap = vec![0u8; 1 << 20].leak();
    let at = heap.as_mut_ptr() as u64;
    // SAFETY: the block is freed while registered on purpose, as above.
    let mr = unsafe { b.pd.reg_mr_raw(at, heap.len(), Access::ALL) }.unwrap();
    // SAFETY: the block `vec!` allocated, freed once; nothing of this process touches it after.
    unsafe { libc::free(at as *mut libc::c_void) };
    a.post(
        SendWr::write(mr.remote(512 << 10))
            .wr_id(31)
            .sge(a.mr.sge(100, 200)),
    );
    expect(a.next(), 31, WC_RDMA_WRITE, None, None);
    let landed = read_own(at as usize + (512 << 10), 200);
    assert_eq!(landed, Some(a.peek(100, 200)));
    drop(mr);
    a.none_left();
    b.none_left();
}
