//! gdsync's WQE writer against libmlx5's encoder, byte for byte: every operation gdsync can
//! post is posted through libmlx5's own `ibv_post_send` (and receives through
//! `ibv_post_recv`) on a QP of the emulated mlx5 device; the WQE libmlx5 wrote into its ring
//! is compared with the one `gdsync::format::SendWqe` / `RecvWqe` writes for the same work
//! request at the same producer index, filled as the queue layer fills them (`Qp::encode` in
//! gdsync's qp/encode.rs: opcode, flags, immediate, segments; zero-length SGEs skipped; an
//! atomic's SGE forced to 8 bytes). Nothing executes the WQEs: this test attaches no HCA to the
//! emulated driver (tests/mlx5_data.rs does), so the ring keeps what libmlx5 wrote.
//!
//! Before each post the ring slots ahead are filled with a pattern, so a byte libmlx5 does not
//! write shows as the pattern. Field by field, the control segment agrees as follows:
//! - `opmod` (byte 0): 0 in both, for every standard opcode.
//! - `wqe_index` (bytes 1-2): both the SQ producer counter (WQEBBs) of the WQE's first block,
//!   not reduced to the ring; the same counter, since ours is built at the index libmlx5 used.
//! - `opcode` (byte 3), `qpn` and `ds` (bytes 4-7): equal (ds is derived, not given).
//! - `signature` (byte 8): 0 in both; libmlx5 writes one only on QPs made with WQE
//!   signatures, which gdsync never asks for (and the child's `MLX5_*` variables are cleared).
//! - `dci_stream_channel_id` (bytes 9-10): 0 in both (RC); libmlx5 clears bytes 8-11 at once.
//! - `fm_ce_se` (byte 11): CQ update 0x08 for signalled, solicited 0x02, fence 0x80
//!   (`MLX5_WQE_CTRL_FENCE`, what `IBV_SEND_FENCE` gives); the QP is not `sq_sig_all`.
//! - `imm` (bytes 12-15): the immediate's 4 bytes in network order in both; 0 otherwise.
//!
//! The differences, each checked to be exactly that (libmlx5 left the ring's earlier bytes,
//! gdsync wrote zeroes), are in [`documented_differences`]. The doorbell is checked too: the
//! doorbell record counts the WQEBBs our WQEs take, and the doorbell register got either the
//! BlueFlame copy of the WQE (one WR, 1 < ds <= 16) or the 8-byte control head that
//! `CtrlSeg::head` gives, in alternating halves of the BlueFlame register.
//!
//! Not covered: a WQE that wraps around the ring's end (libmlx5 posts at most `max_send_wr`
//! work requests before a completion frees slots, and nothing completes here).

use gdsync::format::{
    doorbell_value, wqebbs_for_ds, AtomicSeg, DataSeg, DataSegs, FmCeSe, RaddrSeg, RecvWqe,
    SendWqe, WqeData, MAX_WQE_DS, SEG_SIZE, WQEBB,
};
use gdsync::mlx5::{Context, Mr, Qp, QpCaps, QpRings, RemoteQp, RtrAttr, RtsAttr};
use gdsync::{Access, RecvWr, SendFlags, SendWr, WrOp};
use std::ops::Range;

use uverbs_emu::in_child_under_emulator;

/// What the ring holds before a post: a byte libmlx5 did not write reads as this.
const RING_FILL: u8 = 0xa5;
/// What the BlueFlame register holds before a post.
const BF_FILL: u8 = 0x5a;
/// Size of the registered buffer the work requests name.
const BUF_LEN: usize = 1 << 16;

/// Byte `off` of the registered buffer (inline payloads are copied from it).
fn byte_at(off: u64) -> u8 {
    (off * 7 % 251) as u8
}

/// A connected (loopback) QP of the emulated device, and a registered buffer.
struct Rig {
    qp: Qp,
    rings: QpRings,
    mr: Mr<'static>,
    /// The BlueFlame half the previous post wrote.
    bf_half: Option<usize>,
}

impl Rig {
    fn new(ctx: &std::sync::Arc<Context>, caps: QpCaps) -> Rig {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let qp = pd.create_qp(&cq, &cq, &caps).unwrap();
        let port = ctx.query_port(1).unwrap();
        let gid = ctx.choose_gid(1, None).unwrap().entry;
        let me = RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            lid: 0,
            gid: Some(gid.gid),
        };
        qp.to_init(1, Access::ALL).unwrap();
        qp.to_rtr(&RtrAttr {
            sgid_index: gid.index as u8,
            ..RtrAttr::new(me, 1, port.active_mtu)
        })
        .unwrap();
        qp.to_rts(&RtsAttr::default()).unwrap();
        // The test process ends after the test: the buffer may live as long.
        let buf: &'static mut [u8] = Vec::leak((0..BUF_LEN as u64).map(byte_at).collect());
        let mr = pd.reg_mr(buf, Access::ALL).unwrap();
        let rings = qp.rings();
        Rig {
            qp,
            rings,
            mr,
            bf_half: None,
        }
    }

    /// Word `i` of the QP's doorbell record (0: receive, 1: send), as a 16-bit counter.
    fn dbrec(&self, i: usize) -> u16 {
        let p = (self.rings.dbrec + 4 * i) as *const u32;
        // SAFETY: the doorbell record is two aligned words libmlx5 allocated for the QP.
        u32::from_be(unsafe { p.read_volatile() }) as u16
    }

    /// The address of send-ring block `pi`.
    fn sq_block(&self, pi: u16) -> *mut u8 {
        let slot = pi as usize & (self.rings.sq_wqe_cnt as usize - 1);
        (self.rings.sq_buf + slot * WQEBB) as *mut u8
    }

    /// Fills `n` send-ring blocks from `pi` (free ones: nothing was posted there yet).
    fn fill_sq(&self, pi: u16, n: usize) {
        assert!(
            pi as usize + n <= self.rings.sq_wqe_cnt as usize,
            "ring used up"
        );
        for i in 0..n {
            // SAFETY: a block of the send ring libmlx5 allocated; no WQE is there yet.
            unsafe { self.sq_block(pi + i as u16).write_bytes(RING_FILL, WQEBB) };
        }
    }

    /// `n` blocks of the send ring from `pi`.
    fn read_sq(&self, pi: u16, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n * WQEBB];
        for (i, chunk) in out.chunks_mut(WQEBB).enumerate() {
            // SAFETY: a block of the send ring, read after the post that wrote it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.sq_block(pi + i as u16),
                    chunk.as_mut_ptr(),
                    WQEBB,
                )
            };
        }
        out
    }

    /// BlueFlame half `h` of the QP's doorbell register (in the emulator, plain memory).
    fn bf(&self, h: usize) -> *mut u8 {
        (self.rings.bf_reg + h * self.rings.bf_size as usize) as *mut u8
    }

    fn read_bf(&self, h: usize) -> Vec<u8> {
        let mut out = vec![0u8; self.rings.bf_size as usize];
        // SAFETY: the register lies in a UAR page the emulator backs with memory.
        unsafe { std::ptr::copy_nonoverlapping(self.bf(h), out.as_mut_ptr(), out.len()) };
        out
    }

    /// Posts `wrs` through libmlx5 and compares each WQE it wrote with ours, then the
    /// doorbell record and register.
    fn check_send(&mut self, name: &str, wrs: &[SendWr]) {
        let start = self.dbrec(1);
        self.fill_sq(start, 16 * wrs.len());
        for h in 0..2 {
            // SAFETY: as in read_bf.
            unsafe { self.bf(h).write_bytes(BF_FILL, self.rings.bf_size as usize) };
        }
        // SAFETY: the work requests name the registered buffer, which lives to the end.
        unsafe { self.qp.verbs_post_send(wrs) }.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut pi = start;
        let (mut last, mut last_ds) = (Vec::new(), 0);
        for wr in wrs {
            let ours = self.our_wqe(wr, pi);
            let ds = ours.len() / SEG_SIZE;
            let nbb = wqebbs_for_ds(ds);
            let theirs = self.read_sq(pi, nbb);
            compare(name, wr, &ours, &theirs[..ours.len()]);
            assert!(
                theirs[ours.len()..].iter().all(|&b| b == RING_FILL),
                "{name}: libmlx5 wrote past its WQE's {ds} DS"
            );
            (last, last_ds) = (theirs, ds);
            pi = pi.wrapping_add(nbb as u16);
        }
        assert_eq!(
            self.dbrec(1),
            pi,
            "{name}: the doorbell record counts other WQEBBs than ours take"
        );
        self.check_doorbell(name, wrs.len(), last_ds, &last);
    }

    /// The doorbell register after a post whose last WQE is `wqe` (whole blocks, as in the
    /// ring), of `ds` units: exactly one half written, the other one than last time.
    fn check_doorbell(&mut self, name: &str, nreq: usize, ds: usize, wqe: &[u8]) {
        let written: Vec<usize> = (0..2)
            .filter(|&h| self.read_bf(h).iter().any(|&b| b != BF_FILL))
            .collect();
        assert_eq!(
            written.len(),
            1,
            "{name}: BlueFlame halves written: {written:?}"
        );
        let h = written[0];
        assert_ne!(
            Some(h),
            self.bf_half,
            "{name}: the BlueFlame half did not alternate"
        );
        self.bf_half = Some(h);
        let reg = self.read_bf(h);
        let head: [u8; 8] = wqe[..8].try_into().unwrap();
        // Our doorbell value, stored natively, writes the control head.
        assert_eq!(
            u64::from_ne_bytes(reg[..8].try_into().unwrap()),
            doorbell_value(head),
            "{name}: doorbell"
        );
        let bf_size = self.rings.bf_size as usize;
        let blueflame = nreq == 1 && ds > 1 && ds * SEG_SIZE <= bf_size;
        let copied = if blueflame { wqe.len() } else { 8 };
        assert_eq!(
            reg[..copied],
            wqe[..copied],
            "{name}: BlueFlame copy (blueflame: {blueflame})"
        );
        assert!(
            reg[copied..].iter().all(|&b| b == BF_FILL),
            "{name}: the register got more than {copied} bytes (blueflame: {blueflame})"
        );
    }

    /// Our WQE for `wr` at producer index `pi`, filled as the queue layer's encoder fills it.
    fn our_wqe(&self, wr: &SendWr, pi: u16) -> Vec<u8> {
        assert!(wr.op != WrOp::Nop, "verbs has no NOP");
        let (opcode, remote, imm) = wr.op.wqe_fields();
        let atomic = match wr.op {
            WrOp::FetchAdd { add, .. } => Some(AtomicSeg::new(add, 0)),
            WrOp::CompareSwap { compare, swap, .. } => Some(AtomicSeg::new(swap, compare)),
            _ => None,
        };
        let base = self.mr.addr();
        let payload: Vec<u8> = wr
            .sges
            .iter()
            .flat_map(|g| (g.addr - base..g.addr - base + g.len as u64).map(byte_at))
            .collect();
        let segs: Vec<DataSeg> = wr
            .sges
            .iter()
            .filter(|g| g.len > 0 || atomic.is_some())
            .map(|g| DataSeg::new(g.addr, if atomic.is_some() { 8 } else { g.len }, g.lkey))
            .collect();
        let data = match wr.flags.contains(SendFlags::INLINE) {
            true => WqeData::Inline(&payload),
            false => WqeData::Gather(DataSegs::from_segs(&segs)),
        };
        let mut flags = FmCeSe::empty();
        flags.set(FmCeSe::CQ_UPDATE, wr.flags.contains(SendFlags::SIGNALED));
        flags.set(FmCeSe::SOLICITED, wr.flags.contains(SendFlags::SOLICITED));
        flags.set(FmCeSe::FENCE, wr.flags.contains(SendFlags::FENCE));
        let wqe = SendWqe {
            wqe_index: pi,
            opcode,
            qpn: self.rings.qpn,
            flags,
            imm: imm.to_be_bytes(),
            raddr: remote.map(|r| RaddrSeg::new(r.addr, r.rkey)),
            atomic,
            data,
        };
        let mut out = vec![0u8; MAX_WQE_DS * SEG_SIZE];
        let ds = wqe.write_to(&mut out).unwrap();
        out.truncate(ds * SEG_SIZE);
        out
    }

    /// Posts `wr` through libmlx5 and compares the receive WQE with ours (the slot filled
    /// beforehand in both, so bytes neither writes compare equal too).
    fn check_recv(&self, name: &str, wr: &RecvWr) {
        let pi = self.dbrec(0);
        let stride = self.rings.rq_stride as usize;
        let slot = pi as usize & (self.rings.rq_wqe_cnt as usize - 1);
        let at = (self.rings.rq_buf + slot * stride) as *mut u8;
        // SAFETY: a free slot of the receive ring libmlx5 allocated.
        unsafe { at.write_bytes(RING_FILL, stride) };
        // SAFETY: the SGEs name the registered buffer, which lives to the end.
        unsafe { self.qp.verbs_post_recv(std::slice::from_ref(wr)) }
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            self.dbrec(0),
            pi.wrapping_add(1),
            "{name}: receive doorbell record"
        );
        let mut theirs = vec![0u8; stride];
        // SAFETY: the slot just written.
        unsafe { std::ptr::copy_nonoverlapping(at, theirs.as_mut_ptr(), stride) };
        // As the queue layer posts a receive: zero-length SGEs are skipped.
        let segs: Vec<DataSeg> = wr
            .sges
            .iter()
            .filter(|g| g.len > 0)
            .map(|g| DataSeg::new(g.addr, g.len, g.lkey))
            .collect();
        let mut ours = vec![RING_FILL; stride];
        RecvWqe {
            segs: DataSegs::from_segs(&segs),
        }
        .write_to(&mut ours)
        .unwrap();
        assert_eq!(
            ours, theirs,
            "{name}: receive WQEs differ (ours, libmlx5's)"
        );
    }
}

/// A run of WQE bytes where libmlx5's WQE differs from ours by design, and why.
struct Difference {
    bytes: Range<usize>,
    why: &'static str,
}

/// Where libmlx5 leaves the ring's earlier bytes and gdsync writes zeroes, for `wr` whose
/// WQE (ours) is `len` bytes. The HCA reads neither.
fn documented_differences(wr: &SendWr, len: usize) -> Vec<Difference> {
    let mut d = Vec::new();
    if let WrOp::FetchAdd { .. } = wr.op {
        // ctrl, raddr, then the atomic segment: swap_add at 32, compare at 40.
        d.push(Difference {
            bytes: 40..48,
            why: "fetch-and-add's compare operand: libmlx5 writes only swap_add, gdsync \
                  writes compare = 0; the HCA reads compare only for compare-and-swap",
        });
    }
    if wr.flags.contains(SendFlags::INLINE) {
        let fixed = SEG_SIZE * (1 + matches!(wr.op, WrOp::Write(_) | WrOp::WriteImm(..)) as usize);
        let payload_end = fixed + 4 + wr.len() as usize;
        d.push(Difference {
            bytes: payload_end.min(len)..len,
            why: "inline padding to the 16-byte unit: libmlx5 leaves it, gdsync zeroes it; \
                  the HCA reads byte_count bytes of payload",
        });
    }
    d
}

/// The field of a WQE for `wr` at byte `i`, for messages.
fn field(wr: &SendWr, i: usize) -> String {
    const CTRL: [(usize, &str); 6] = [
        (4, "opmod_idx_opcode"),
        (8, "qpn_ds"),
        (9, "signature"),
        (11, "dci_stream_channel_id"),
        (12, "fm_ce_se"),
        (16, "imm"),
    ];
    if i < SEG_SIZE {
        return format!("ctrl.{}", CTRL.iter().find(|(end, _)| i < *end).unwrap().1);
    }
    let mut segs = Vec::new();
    if !matches!(wr.op, WrOp::Send | WrOp::SendImm(_)) {
        segs.push("raddr");
    }
    if matches!(wr.op, WrOp::FetchAdd { .. } | WrOp::CompareSwap { .. }) {
        segs.push("atomic");
    }
    let unit = i / SEG_SIZE - 1;
    let name = match segs.get(unit) {
        Some(s) => s.to_string(),
        None if wr.flags.contains(SendFlags::INLINE) => "inline".into(),
        None => format!("data[{}]", unit - segs.len()),
    };
    format!("{name} +{}", i % SEG_SIZE)
}

/// Compares our WQE with libmlx5's (its first `ours.len()` bytes): equal but for the
/// documented differences, each of which must be exactly what it says.
fn compare(name: &str, wr: &SendWr, ours: &[u8], theirs: &[u8]) {
    let known = documented_differences(wr, ours.len());
    let mut unexplained = Vec::new();
    for i in 0..ours.len() {
        match known.iter().find(|k| k.bytes.contains(&i)) {
            Some(k) => assert!(
                theirs[i] == RING_FILL && ours[i] == 0,
                "{name}: byte {i} ({}): {}; but gdsync wrote {:#04x} and libmlx5 {:#04x}",
                field(wr, i),
                k.why,
                ours[i],
                theirs[i]
            ),
            None if ours[i] != theirs[i] => unexplained.push(format!("{i} ({})", field(wr, i))),
            None => {}
        }
    }
    assert!(
        unexplained.is_empty(),
        "{name}: WQEs differ at bytes {}\n  gdsync:  {}\n  libmlx5: {}",
        unexplained.join(", "),
        hex(ours),
        hex(theirs)
    );
}

fn hex(b: &[u8]) -> String {
    b.chunks(SEG_SIZE)
        .map(|u| u.iter().map(|x| format!("{x:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every send gdsync can express in verbs: each operation, with 0, 1 and several SGEs,
/// inline at sizes around the 16-byte unit, signalled or not, fenced, solicited.
fn send_cases(r: &Rig) -> Vec<(&'static str, Vec<SendWr>)> {
    let s = |off, len| r.mr.sge(off, len);
    let one = |name, wr: SendWr| (name, vec![wr]);
    vec![
        one("send, 1 SGE", SendWr::send().sge(s(0, 64))),
        one(
            "send, unsignalled",
            SendWr::send().sge(s(0, 64)).unsignaled(),
        ),
        one("send, solicited", SendWr::send().sge(s(64, 8)).solicited()),
        one("send, fenced", SendWr::send().sge(s(64, 8)).fence()),
        one("send, no SGE (ds 1: a plain doorbell)", SendWr::send()),
        one(
            "send, 3 SGEs",
            SendWr::send().sges(&[s(0, 8), s(64, 100), s(256, 4096)]),
        ),
        one(
            "send, 4 SGEs (2 WQEBBs)",
            SendWr::send().sges(&[s(0, 8), s(64, 100), s(256, 4096), s(8192, 1)]),
        ),
        one(
            "send, a zero-length SGE is skipped",
            SendWr::send().sges(&[s(0, 8), s(8, 0), s(16, 8)]),
        ),
        one("send inline, 0 bytes", SendWr::send().inline()),
        one("send inline, 1 byte", SendWr::send().sge(s(3, 1)).inline()),
        one(
            "send inline, 12 bytes (no padding)",
            SendWr::send().sge(s(0, 12)).inline(),
        ),
        one(
            "send inline, 13 bytes",
            SendWr::send().sge(s(0, 13)).inline(),
        ),
        one(
            "send inline, 100 bytes from 2 SGEs",
            SendWr::send().sges(&[s(5, 60), s(1000, 40)]).inline(),
        ),
        one(
            "send with immediate",
            SendWr::send_imm(0x1234_5678).sge(s(0, 32)),
        ),
        one(
            "send with immediate, inline",
            SendWr::send_imm(0xdead_beef)
                .sge(s(0, 20))
                .inline()
                .unsignaled(),
        ),
        one("write", SendWr::write(r.mr.remote(4096)).sge(s(0, 64))),
        one(
            "write, unsignalled",
            SendWr::write(r.mr.remote(4096)).sge(s(0, 64)).unsignaled(),
        ),
        one(
            "write, fenced",
            SendWr::write(r.mr.remote(4096)).sge(s(0, 64)).fence(),
        ),
        one(
            "write, 2 SGEs",
            SendWr::write(r.mr.remote(4096)).sges(&[s(0, 64), s(128, 64)]),
        ),
        one(
            "write, 4 SGEs (2 WQEBBs)",
            SendWr::write(r.mr.remote(4096)).sges(&[s(0, 1), s(2, 2), s(4, 4), s(8, 8)]),
        ),
        one(
            "write inline, 8 bytes",
            SendWr::write(r.mr.remote(8)).sge(s(0, 8)).inline(),
        ),
        one(
            "write inline, 128 bytes (max_inline)",
            SendWr::write(r.mr.remote(4096)).sge(s(17, 128)).inline(),
        ),
        one(
            "write with immediate",
            SendWr::write_imm(r.mr.remote(4096), 7).sge(s(0, 64)),
        ),
        one(
            "write with immediate, inline, solicited",
            SendWr::write_imm(r.mr.remote(4096), 0x0102_0304)
                .sge(s(0, 30))
                .inline()
                .solicited(),
        ),
        one(
            "write with immediate, no SGE",
            SendWr::write_imm(r.mr.remote(4096), 9),
        ),
        one("read", SendWr::read(r.mr.remote(4096)).sge(s(0, 64))),
        one(
            "read, 2 SGEs, fenced",
            SendWr::read(r.mr.remote(4096))
                .sges(&[s(0, 64), s(512, 1000)])
                .fence(),
        ),
        one(
            "compare-and-swap",
            SendWr::compare_swap(
                r.mr.remote(4096),
                0x1111_2222_3333_4444,
                0x5555_6666_7777_8888,
            )
            .sge(s(64, 8)),
        ),
        one(
            "fetch-and-add",
            SendWr::fetch_add(r.mr.remote(4096), 0x0102_0304_0506_0708).sge(s(64, 8)),
        ),
        one(
            "fetch-and-add, unsignalled, fenced",
            SendWr::fetch_add(r.mr.remote(8), 1)
                .sge(s(72, 8))
                .unsignaled()
                .fence(),
        ),
        (
            "write then send in one call (one doorbell, no BlueFlame)",
            vec![
                SendWr::write(r.mr.remote(4096)).sge(s(0, 64)).unsignaled(),
                SendWr::send().sge(s(0, 8)),
            ],
        ),
    ]
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_send_wqes_match_libmlx5_byte_for_byte() {
    if in_child_under_emulator("mlx5_send_wqes_match_libmlx5_byte_for_byte", "mlx5_0") {
        return;
    }
    let ctx = Context::open("mlx5_0").unwrap();
    let mut rig = Rig::new(
        &ctx,
        QpCaps {
            max_send_wr: 128,
            max_send_sge: 4,
            max_inline_data: 128,
            ..QpCaps::default()
        },
    );
    assert!(
        rig.rings.bf_size > 0,
        "the emulated QP has a BlueFlame register"
    );
    let cases = send_cases(&rig);
    for (name, wrs) in &cases {
        rig.check_send(name, wrs);
    }
    println!("{} sends compared", cases.len());
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_recv_wqes_match_libmlx5_byte_for_byte() {
    if in_child_under_emulator("mlx5_recv_wqes_match_libmlx5_byte_for_byte", "mlx5_0") {
        return;
    }
    let ctx = Context::open("mlx5_0").unwrap();
    // Room for 4 segments: fewer end with the terminator.
    let rig = Rig::new(
        &ctx,
        QpCaps {
            max_recv_sge: 4,
            ..QpCaps::default()
        },
    );
    assert_eq!(rig.rings.rq_stride, 64);
    let s = |off, len| rig.mr.sge(off, len);
    let cases = [
        ("receive, 1 SGE + terminator", RecvWr::new().sge(s(0, 64))),
        ("receive, no SGE (terminator only)", RecvWr::new()),
        (
            "receive, 3 SGEs + terminator",
            RecvWr::new().sge(s(0, 8)).sge(s(8, 8)).sge(s(1024, 4096)),
        ),
        (
            "receive, 4 SGEs fill the slot (no terminator)",
            RecvWr::new()
                .sge(s(0, 1))
                .sge(s(1, 1))
                .sge(s(2, 1))
                .sge(s(3, 1)),
        ),
        (
            "receive, a zero-length SGE is skipped",
            RecvWr::new().sge(s(0, 8)).sge(s(8, 0)).sge(s(16, 8)),
        ),
    ];
    for (name, wr) in &cases {
        rig.check_recv(name, wr);
    }
    // One segment per slot: the slot is full without a terminator.
    let narrow = Rig::new(&ctx, QpCaps::default());
    assert_eq!(narrow.rings.rq_stride, 16);
    narrow.check_recv(
        "receive, 1 SGE in a 16-byte slot",
        &RecvWr::new().sge(narrow.mr.sge(0, 64)),
    );
}

/// The one gdsync send that has no libmlx5 equivalent is refused before anything is posted.
#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_verbs_post_refuses_what_verbs_cannot_say() {
    if in_child_under_emulator("mlx5_verbs_post_refuses_what_verbs_cannot_say", "mlx5_0") {
        return;
    }
    let ctx = Context::open("mlx5_0").unwrap();
    let rig = Rig::new(&ctx, QpCaps::default());
    let before = rig.dbrec(1);
    for wr in [
        SendWr::nop(),
        SendWr::send().sge(rig.mr.sge(0, 8)).inline_host(),
    ] {
        // SAFETY: nothing is posted (refused), and the buffer lives to the end anyway.
        let e = unsafe { rig.qp.verbs_post_send(&[wr]) }.unwrap_err();
        assert!(e.to_string().starts_with("invalid argument"), "{e}");
    }
    // Inline beyond the QP's max_inline_data: libmlx5 refuses it.
    let big = SendWr::send().sge(rig.mr.sge(0, 4096)).inline();
    // SAFETY: as above.
    assert!(unsafe { rig.qp.verbs_post_send(&[big]) }.is_err());
    assert_eq!(rig.dbrec(1), before, "nothing was posted");
}
