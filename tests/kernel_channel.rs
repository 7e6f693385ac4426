//! Kernel-driven QPs and kernel channels, without a GPU: a thread plays the kernel. It reads
//! the descriptors the host filled once (`DeviceQp::desc`, `KernelChannels::desc`) and writes
//! exactly the bytes the device functions of `gdsync.cuh` write (WQEs, doorbell records,
//! doorbells, CQ consumer indices, credits), through `twin`, a line-by-line Rust copy of
//! those functions; the soft device must execute them as a ConnectX would.

mod common;

use common::kernel_channel_ranks;
use gdasync::gdsync::format::{
    DataSeg, DataSegs, FmCeSe, Opcode, RaddrSeg, RecvWqe, SendWqe, Syndrome, WqeData,
};
use gdasync::gdsync::kernel::{code, DeviceQp, PeerDesc, QpDesc};
use gdasync::gdsync::{
    Access, Cq, Device, MemoryRegion, NicHandler, PinnedBuffer, ProtectionDomain, Qp, QpConfig,
    RecvWr, SendWr,
};
use std::time::{Duration, Instant};

/// A wait that should pass promptly (seconds: a loaded 2-core machine must never trip it).
const TIMEOUT_NS: u64 = 20_000_000_000;

/// The device functions of `gdsync.cuh`, in Rust, line by line: the same loads, stores and
/// fences on the same addresses. `__threadfence_system()` is a sequentially consistent
/// fence; volatile loads and stores are relaxed atomics. Where the header reads the GPU
/// clock (every 256 spins) this copy also yields, to share the test machine's cores.
mod twin {
    use gdasync::gdsync::kernel::{code, CqDesc, PeerDesc, QpDesc};
    use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    use std::time::Instant;

    pub const OP_NOP: u32 = 0x00;
    pub const OP_RDMA_WRITE: u32 = 0x08;
    pub const OP_RDMA_WRITE_IMM: u32 = 0x09;
    pub const OP_SEND: u32 = 0x0A;
    pub const OP_SEND_IMM: u32 = 0x0B;
    pub const OP_RDMA_READ: u32 = 0x10;
    pub const SIGNALED: u32 = 1;
    pub const FENCE: u32 = 2;
    pub const SOLICITED: u32 = 4;
    pub const MAX_INLINE: u32 = 28;
    pub const WC_SEND_DONE: u8 = 0x0;
    pub const WC_RECV_WRITE_IMM: u8 = 0x1;
    pub const WC_RECV: u8 = 0x2;
    pub const WC_RECV_IMM: u8 = 0x3;
    pub const WC_REQ_ERR: u8 = 0xD;
    pub const WC_RESP_ERR: u8 = 0xE;

    /// `gds_wc`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Wc {
        pub byte_len: u32,
        pub imm: u32,
        pub qpn: u32,
        pub wqe_counter: u16,
        pub opcode: u8,
        pub wqe_opcode: u8,
        pub syndrome: u8,
        pub vendor_syndrome: u8,
    }

    // Memory the descriptors point to: rings, doorbells and counters in pinned host memory,
    // alive while the DeviceQp / KernelChannels the test holds are.
    fn st32(addr: u64, v: u32) {
        // SAFETY: a 4-aligned word of ring or control memory the descriptor points to.
        unsafe { &*(addr as *const AtomicU32) }.store(v, Ordering::Relaxed)
    }
    fn st64(addr: u64, v: u64) {
        // SAFETY: an 8-aligned word of ring or control memory the descriptor points to.
        unsafe { &*(addr as *const AtomicU64) }.store(v, Ordering::Relaxed)
    }
    fn ld64(addr: u64) -> u64 {
        // SAFETY: as st64.
        unsafe { &*(addr as *const AtomicU64) }.load(Ordering::Relaxed)
    }
    /// `gds_ld_acquire64`.
    fn ld_acquire64(addr: u64) -> u64 {
        // SAFETY: as st64.
        unsafe { &*(addr as *const AtomicU64) }.load(Ordering::Acquire)
    }
    /// A 16-byte vector store (`uint4`): four words at a 16-aligned address.
    fn st128(addr: u64, w: [u32; 4]) {
        for (i, x) in w.iter().enumerate() {
            st32(addr + 4 * i as u64, *x);
        }
    }
    /// A 16-byte load (`__ldcv` of `ulonglong2`).
    fn ld128(addr: u64) -> (u64, u64) {
        (ld64(addr), ld64(addr + 8))
    }
    fn threadfence_system() {
        fence(Ordering::SeqCst)
    }
    fn bswap32(x: u32) -> u32 {
        x.swap_bytes()
    }

    /// `gds_expired`.
    pub fn expired(spins: u32, start: &mut Option<Instant>, timeout_ns: u64) -> bool {
        if spins & 255 != 255 {
            std::hint::spin_loop();
            return false;
        }
        std::thread::yield_now();
        match start {
            None => {
                *start = Some(Instant::now());
                false
            }
            Some(s) => s.elapsed().as_nanos() as u64 > timeout_ns,
        }
    }

    fn seg_data(w: &mut [u32], addr: u64, len: u32, lkey: u32) {
        w[0] = bswap32(len);
        w[1] = bswap32(lkey);
        w[2] = bswap32((addr >> 32) as u32);
        w[3] = bswap32(addr as u32);
    }
    fn seg_raddr(w: &mut [u32], raddr: u64, rkey: u32) {
        w[0] = bswap32((raddr >> 32) as u32);
        w[1] = bswap32(raddr as u32);
        w[2] = bswap32(rkey);
        w[3] = 0;
    }

    /// `gds_qp_send_room`.
    pub fn qp_send_room(qp: &QpDesc) -> u32 {
        qp.sq_wqebbs - (qp.sq_pi - qp.send_cq.wq_ci) as u32
    }

    /// `gds_qp_submit`.
    fn qp_submit(
        qp: &mut QpDesc,
        opcode: u32,
        w: &mut [u32],
        ds: u32,
        imm: u32,
        flags: u32,
    ) -> i32 {
        let fm_ce_se = if flags & SIGNALED != 0 { 0x08 } else { 0 }
            | if flags & SOLICITED != 0 { 0x02 } else { 0 }
            | if flags & FENCE != 0 { 0x80 } else { 0 };
        w[0] = bswap32((((qp.sq_pi & 0xFFFF) as u32) << 8) | opcode);
        w[1] = bswap32((qp.qpn << 8) | ds);
        w[2] = fm_ce_se << 24;
        w[3] = if opcode == OP_SEND_IMM || opcode == OP_RDMA_WRITE_IMM {
            bswap32(imm)
        } else {
            0
        };
        let slot = qp.sq + (qp.sq_pi & (qp.sq_wqebbs as u64 - 1)) * 64;
        for i in 0..ds as usize {
            st128(
                slot + 16 * i as u64,
                w[4 * i..4 * i + 4].try_into().unwrap(),
            );
        }
        qp.sq_pi += 1;
        threadfence_system();
        if qp.proxy != 0 {
            st64(qp.proxy, qp.sq_pi);
        } else {
            st32(qp.dbrec + 4, bswap32((qp.sq_pi & 0xFFFF) as u32));
            threadfence_system();
            st64(qp.db, ((w[1] as u64) << 32) | w[0] as u64);
        }
        st64(qp.state, qp.sq_pi);
        code::OK
    }

    fn op_remote(opcode: u32) -> bool {
        opcode == OP_RDMA_WRITE || opcode == OP_RDMA_WRITE_IMM || opcode == OP_RDMA_READ
    }

    /// `gds_qp_begin_send`.
    #[allow(clippy::too_many_arguments)]
    fn qp_begin_send(
        qp: &QpDesc,
        opcode: u32,
        len: u32,
        max_len: u32,
        raddr: u64,
        rkey: u32,
        w: &mut [u32],
        ds: &mut usize,
    ) -> i32 {
        if !(opcode == OP_SEND || opcode == OP_SEND_IMM || op_remote(opcode))
            || len > max_len
            || qp.sq == 0
            || (qp.db == 0 && qp.proxy == 0)
        {
            return code::INVALID;
        }
        if qp_send_room(qp) == 0 {
            return code::FULL;
        }
        *ds = 1;
        if op_remote(opcode) {
            seg_raddr(&mut w[4 * *ds..], raddr, rkey);
            *ds += 1;
        }
        code::OK
    }

    /// `gds_qp_post_send`.
    #[allow(clippy::too_many_arguments)]
    pub fn qp_post_send(
        qp: &mut QpDesc,
        opcode: u32,
        laddr: u64,
        lkey: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
        imm: u32,
        flags: u32,
    ) -> i32 {
        let mut w = [0u32; 12];
        let mut ds = 0;
        let rc = qp_begin_send(qp, opcode, len, 0x7FFF_FFFF, raddr, rkey, &mut w, &mut ds);
        if rc != code::OK {
            return rc;
        }
        if len > 0 {
            seg_data(&mut w[4 * ds..], laddr, len, lkey);
            ds += 1;
        }
        qp_submit(qp, opcode, &mut w, ds as u32, imm, flags)
    }

    /// `gds_qp_post_send_inline`.
    pub fn qp_post_send_inline(
        qp: &mut QpDesc,
        opcode: u32,
        data: &[u8],
        raddr: u64,
        rkey: u32,
        imm: u32,
        flags: u32,
    ) -> i32 {
        if opcode == OP_RDMA_READ {
            return code::INVALID;
        }
        let len = data.len() as u32;
        let mut w = [0u32; 16];
        let mut ds = 0;
        let rc = qp_begin_send(qp, opcode, len, MAX_INLINE, raddr, rkey, &mut w, &mut ds);
        if rc != code::OK {
            return rc;
        }
        w[4 * ds] = bswap32(len | 0x8000_0000);
        // The payload bytes follow the header, in memory order (native words on x86).
        let mut bytes = [0u8; 4 * 16];
        for (i, x) in w.iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&x.to_ne_bytes());
        }
        bytes[16 * ds + 4..16 * ds + 4 + data.len()].copy_from_slice(data);
        for (i, x) in w.iter_mut().enumerate() {
            *x = u32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        }
        ds += (4 + len as usize).div_ceil(16);
        qp_submit(qp, opcode, &mut w, ds as u32, imm, flags)
    }

    /// `gds_qp_post_nop`.
    pub fn qp_post_nop(qp: &mut QpDesc, flags: u32) -> i32 {
        if qp.sq == 0 || (qp.db == 0 && qp.proxy == 0) {
            return code::INVALID;
        }
        if qp_send_room(qp) == 0 {
            return code::FULL;
        }
        let mut w = [0u32; 4];
        qp_submit(qp, OP_NOP, &mut w, 1, 0, flags)
    }

    /// `gds_qp_post_recv`.
    pub fn qp_post_recv(qp: &mut QpDesc, addr: u64, len: u32, lkey: u32) -> i32 {
        if len > 0x7FFF_FFFF || qp.rq == 0 {
            return code::INVALID;
        }
        if qp.rq_pi - qp.recv_cq.wq_ci >= qp.rq_wqes as u64 {
            return code::FULL;
        }
        let wqe = qp.rq + (qp.rq_pi & (qp.rq_wqes as u64 - 1)) * qp.rq_stride as u64;
        let mut n = 0;
        if len > 0 {
            let mut w = [0u32; 4];
            seg_data(&mut w, addr, len, lkey);
            st128(wqe, w);
            n = 1;
        }
        if n * 16 < qp.rq_stride {
            st128(wqe + 16 * n as u64, [0, bswap32(0x100), 0, 0]);
        }
        qp.rq_pi += 1;
        threadfence_system();
        st32(qp.dbrec, bswap32((qp.rq_pi & 0xFFFF) as u32));
        st64(qp.state + 8, qp.rq_pi);
        code::OK
    }

    /// `gds_cq_poll`.
    pub fn cq_poll(cq: &mut CqDesc, wc: &mut Wc) -> i32 {
        cq_poll_fields(cq, wc, true)
    }

    /// `gds_cq_poll_fields`.
    pub fn cq_poll_fields(cq: &mut CqDesc, wc: &mut Wc, body: bool) -> i32 {
        let e = cq.cqes + (cq.ci & (cq.entries as u64 - 1)) * 64;
        let tail = ld_acquire64(e + 56);
        let word60 = (tail >> 32) as u32;
        let op_own = word60 >> 24;
        if (op_own >> 4) == 0xF || (op_own & 1) != ((cq.ci & cq.entries as u64) != 0) as u32 {
            return code::EMPTY;
        }
        let opcode = (word60 >> 28) as u8;
        let err = opcode == WC_REQ_ERR || opcode == WC_RESP_ERR;
        let (mut lo, mut hi) = ((0, 0), (0, 0));
        if body || err {
            lo = ld128(e + 32);
            hi = ld128(e + 48);
            threadfence_system();
        }
        let counter = (((word60 & 0xFF) << 8) | ((word60 >> 8) & 0xFF)) as u16;
        let sop = bswap32(tail as u32);
        wc.byte_len = if err || !body {
            0
        } else {
            bswap32((lo.1 >> 32) as u32)
        };
        wc.imm = if body {
            bswap32((lo.0 >> 32) as u32)
        } else {
            0
        };
        wc.qpn = sop & 0xFF_FFFF;
        wc.wqe_counter = counter;
        wc.opcode = opcode;
        wc.wqe_opcode = if opcode == WC_SEND_DONE || opcode == WC_REQ_ERR {
            (sop >> 24) as u8
        } else {
            0
        };
        wc.syndrome = if err { (hi.0 >> 56) as u8 } else { 0 };
        wc.vendor_syndrome = if err { (hi.0 >> 48) as u8 } else { 0 };
        cq.ci += 1;
        cq.wq_ci += counter.wrapping_add(1).wrapping_sub(cq.wq_ci as u16) as u64;
        st32(cq.dbrec, bswap32((cq.ci & 0xFF_FFFF) as u32));
        st64(cq.retired, cq.ci);
        st64(cq.wq_retired, cq.wq_ci);
        if err {
            code::CQE_ERROR | wc.syndrome as i32
        } else {
            code::OK
        }
    }

    /// `gds_cq_wait`.
    pub fn cq_wait(cq: &mut CqDesc, wc: &mut Wc, timeout_ns: u64) -> i32 {
        let mut start = None;
        let mut spins = 0u32;
        loop {
            let rc = cq_poll(cq, wc);
            if rc != code::EMPTY {
                return rc;
            }
            if expired(spins, &mut start, timeout_ns) {
                return code::TIMEOUT;
            }
            spins = spins.wrapping_add(1);
        }
    }

    /// `gds_peer_fail`.
    fn peer_fail(p: &mut PeerDesc, rc: i32) {
        if p.error == 0 {
            p.error = rc as u32;
            st32(p.state + 40, p.error);
        }
    }

    /// `gds_peer_wqe_flags`.
    fn peer_wqe_flags(p: &PeerDesc, flags: u32) -> u32 {
        if p.qp.sq_pi + 1 - p.signaled_pi >= (p.qp.sq_wqebbs / 2) as u64 {
            flags | SIGNALED
        } else {
            flags
        }
    }

    /// `gds_peer_posted`.
    fn peer_posted(p: &mut PeerDesc, flags: u32) {
        if flags & SIGNALED == 0 {
            return;
        }
        p.signaled_pi = p.qp.sq_pi;
        p.signaled_sends = p.sends;
    }

    /// `gds_peer_poll_send`.
    fn peer_poll_send(p: &mut PeerDesc) -> i32 {
        let mut wc = Wc::default();
        let rc = cq_poll_fields(&mut p.qp.send_cq, &mut wc, false);
        if rc == code::EMPTY {
            return rc;
        }
        let outstanding = p.qp.sq_pi - p.qp.send_cq.wq_ci;
        let mut done = p.sends.saturating_sub(outstanding);
        if p.qp.send_cq.wq_ci >= p.signaled_pi && p.signaled_sends > done {
            done = p.signaled_sends;
        }
        if done > p.sends_done {
            p.sends_done = done;
            st64(p.state + 8, p.sends_done);
        }
        if rc != code::OK {
            peer_fail(p, rc);
        }
        rc
    }

    /// `gds_peer_check`.
    fn peer_check(p: &PeerDesc) -> i32 {
        if p.credit == 0 {
            return code::INVALID;
        }
        if p.error != 0 {
            p.error as i32
        } else {
            code::OK
        }
    }

    /// `gds_peer_make_room`.
    fn peer_make_room(
        p: &mut PeerDesc,
        spins: u32,
        start: &mut Option<Instant>,
        timeout_ns: u64,
    ) -> i32 {
        if p.error != 0 {
            return p.error as i32;
        }
        if peer_poll_send(p) == code::EMPTY && expired(spins, start, timeout_ns) {
            return code::TIMEOUT;
        }
        if p.error != 0 {
            p.error as i32
        } else {
            code::OK
        }
    }

    /// `gds_peer_send_flags`.
    pub fn peer_send_flags(
        p: &mut PeerDesc,
        laddr: u64,
        lkey: u32,
        len: u32,
        flags: u32,
        timeout_ns: u64,
    ) -> i32 {
        let rc = peer_check(p);
        if rc != code::OK {
            return rc;
        }
        let mut start = None;
        let mut spins = 0u32;
        while p.credits < p.sends + 1 {
            p.credits = ld64(p.credit);
            if p.credits < p.sends + 1 && expired(spins, &mut start, timeout_ns) {
                return code::TIMEOUT;
            }
            spins = spins.wrapping_add(1);
        }
        let mut start = None;
        let mut spins = 0u32;
        loop {
            let f = peer_wqe_flags(p, flags);
            let rc = match qp_post_send(&mut p.qp, OP_SEND, laddr, lkey, len, 0, 0, 0, f) {
                code::FULL => peer_make_room(p, spins, &mut start, timeout_ns),
                code::OK => {
                    p.sends += 1;
                    st64(p.state, p.sends);
                    peer_posted(p, f);
                    return code::OK;
                }
                rc => rc,
            };
            if rc != code::OK {
                return rc;
            }
            spins = spins.wrapping_add(1);
        }
    }

    /// `gds_peer_send`.
    pub fn peer_send(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32, timeout_ns: u64) -> i32 {
        peer_send_flags(p, laddr, lkey, len, SIGNALED, timeout_ns)
    }

    /// `gds_peer_post_recv`.
    pub fn peer_post_recv(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32) -> i32 {
        let rc = peer_check(p);
        if rc != code::OK {
            return rc;
        }
        let rc = qp_post_recv(&mut p.qp, laddr, len, lkey);
        if rc != code::OK {
            return rc;
        }
        p.recvs += 1;
        st64(p.state + 24, p.recvs);
        code::OK
    }

    /// `gds_peer_give_credit`.
    pub fn peer_give_credit(p: &mut PeerDesc, timeout_ns: u64) -> i32 {
        let rc = peer_check(p);
        if rc != code::OK || p.credited == p.recvs {
            return rc;
        }
        let mut start = None;
        let mut spins = 0u32;
        loop {
            let f = peer_wqe_flags(p, 0);
            let (raddr, rkey) = (p.remote_credit, p.remote_credit_rkey);
            let rc = qp_post_send_inline(
                &mut p.qp,
                OP_RDMA_WRITE,
                &p.recvs.to_ne_bytes(),
                raddr,
                rkey,
                0,
                f,
            );
            let rc = match rc {
                code::FULL => peer_make_room(p, spins, &mut start, timeout_ns),
                code::OK => {
                    p.credited = p.recvs;
                    peer_posted(p, f);
                    return code::OK;
                }
                rc => rc,
            };
            if rc != code::OK {
                return rc;
            }
            spins = spins.wrapping_add(1);
        }
    }

    /// `gds_peer_recv`.
    pub fn peer_recv(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32, timeout_ns: u64) -> i32 {
        let rc = peer_post_recv(p, laddr, lkey, len);
        if rc != code::OK {
            rc
        } else {
            peer_give_credit(p, timeout_ns)
        }
    }

    /// `gds_peer_wait_sends`.
    pub fn peer_wait_sends(p: &mut PeerDesc, n: u64, timeout_ns: u64) -> i32 {
        if p.credit == 0 || n == 0 || n > p.sends - p.sends_waited {
            return code::INVALID;
        }
        let target = p.sends_waited + n;
        let mut start = None;
        let mut spins = 0u32;
        while p.sends_done < target {
            if p.signaled_sends < target && p.error == 0 {
                match qp_post_nop(&mut p.qp, SIGNALED) {
                    code::OK => peer_posted(p, SIGNALED),
                    code::FULL => {}
                    rc => return rc,
                }
            }
            let rc = peer_make_room(p, spins, &mut start, timeout_ns);
            if rc != code::OK {
                return rc;
            }
            spins = spins.wrapping_add(1);
        }
        if p.error != 0 {
            return p.error as i32;
        }
        p.sends_waited = target;
        st64(p.state + 16, p.sends_waited);
        code::OK
    }

    /// `gds_peer_wait_send`.
    pub fn peer_wait_send(p: &mut PeerDesc, timeout_ns: u64) -> i32 {
        peer_wait_sends(p, 1, timeout_ns)
    }

    /// `gds_peer_wait_recv`.
    pub fn peer_wait_recv(p: &mut PeerDesc, len: Option<&mut u32>, timeout_ns: u64) -> i32 {
        if p.credit == 0 || p.recvs_waited == p.recvs {
            return code::INVALID;
        }
        if p.error != 0 {
            return p.error as i32;
        }
        let mut wc = Wc::default();
        let mut start = None;
        let mut spins = 0u32;
        let rc = loop {
            let rc = cq_poll_fields(&mut p.qp.recv_cq, &mut wc, len.is_some());
            if rc != code::EMPTY {
                break rc;
            }
            if expired(spins, &mut start, timeout_ns) {
                return code::TIMEOUT;
            }
            spins = spins.wrapping_add(1);
        };
        if rc != code::OK {
            peer_fail(p, rc);
            return rc;
        }
        p.recvs_waited += 1;
        st64(p.state + 32, p.recvs_waited);
        if let Some(len) = len {
            *len = wc.byte_len;
        }
        code::OK
    }
}

use twin::Wc;

// ------------------------------------------------------------------ set-up

/// One end: a QP with dedicated CQs sized like its rings (so the CQs wrap as often as the
/// rings), still on the CPU.
struct End {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
}

fn end(dev: &Device, pd: &ProtectionDomain, cfg: &QpConfig) -> End {
    let scq = dev.create_cq(cfg.send_wqebbs.max(16)).unwrap();
    let rcq = dev.create_cq(cfg.recv_wqes).unwrap();
    let qp = pd.create_qp(&scq, &rcq, cfg).unwrap();
    End { qp, scq, rcq }
}

/// Two connected ends on one device.
fn connected(cfg: &QpConfig) -> (Device, ProtectionDomain, End, End) {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let (mut a, mut b) = (end(&dev, &pd, cfg), end(&dev, &pd, cfg));
    a.qp.connect(&b.qp.endpoint()).unwrap();
    b.qp.connect(&a.qp.endpoint()).unwrap();
    (dev, pd, a, b)
}

/// Moves `from`'s send counter and `to`'s receive counter forward by `n` with CPU traffic
/// (empty sends), so the kernel's work then crosses the 16-bit index wrap.
fn advance(from: &mut End, to: &mut End, n: u64) {
    let batch = (from.qp.send_ring_size().min(to.qp.recv_ring_size()) / 2) as u64;
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        for _ in 0..k {
            to.qp.post_recv(&RecvWr::new()).unwrap();
            from.qp.post_send(&SendWr::send()).unwrap();
        }
        for _ in 0..k {
            from.scq
                .wait_one(Duration::from_secs(20))
                .unwrap()
                .ok()
                .unwrap();
            to.rcq
                .wait_one(Duration::from_secs(20))
                .unwrap()
                .ok()
                .unwrap();
        }
        done += k;
    }
}

fn pinned(pd: &ProtectionDomain, len: usize) -> (PinnedBuffer, MemoryRegion<'static>) {
    let buf = PinnedBuffer::new(len);
    // SAFETY: the test keeps `buf` (returned alongside) alive longer than the region: every
    // caller binds the pair and drops the region first (declaration order is reversed).
    let mr = unsafe { pd.register_raw(buf.addr() as *mut u8, len, Access::ALL) }.unwrap();
    (buf, mr)
}

fn message(i: u64, side: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8).wrapping_mul(13) ^ (k as u8).wrapping_mul(7) ^ side)
        .collect()
}

fn read(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `addr..addr+len` lies in a pinned buffer the caller holds; the device wrote it
    // before the completion the caller consumed.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

fn write(addr: u64, data: &[u8]) {
    // SAFETY: `addr..addr+len` lies in a pinned buffer the caller holds and the device does
    // not access it now (the send that reads it is posted afterwards).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
}

// ------------------------------------------------------------------ kernel-driven QPs

/// One "kernel" per end, each driving its QP: ping-pongs of sends of varying lengths, data
/// checked on arrival. Small rings and CQs (16) wrap ~60 times, and the counters start just
/// below 2^16 so the 16-bit WQE and receive indices wrap too.
#[test]
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
                twin::qp_post_recv(&mut qp, slot(i), MAX as u32, lkey),
                code::OK
            );
        }
        for i in 0..ITERS {
            let send = |qp: &mut QpDesc, wc: &mut Wc| {
                let m = message(i, me, len(i));
                write(base, &m);
                assert_eq!(
                    twin::qp_post_send(
                        qp,
                        twin::OP_SEND,
                        base,
                        lkey,
                        m.len() as u32,
                        0,
                        0,
                        0,
                        twin::SIGNALED
                    ),
                    code::OK
                );
                // The source is reused next time: wait for this send.
                assert_eq!(twin::cq_wait(&mut qp.send_cq, wc, TIMEOUT_NS), code::OK);
                assert_eq!(
                    (wc.opcode, wc.wqe_opcode as u32),
                    (twin::WC_SEND_DONE, twin::OP_SEND)
                );
            };
            if first {
                send(&mut qp, &mut wc);
            }
            assert_eq!(
                twin::cq_wait(&mut qp.recv_cq, &mut wc, TIMEOUT_NS),
                code::OK,
                "{me}: receive {i}"
            );
            assert_eq!((wc.opcode, wc.byte_len as usize), (twin::WC_RECV, len(i)));
            assert_eq!(
                read(slot(i), len(i)),
                message(i, me ^ 1, len(i)),
                "{me}: data {i}"
            );
            assert_eq!(
                twin::qp_post_recv(&mut qp, slot(i + SLOTS), MAX as u32, lkey),
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
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        1000,
        bbuf.addr() + 2048,
        bmr.rkey(),
        0,
        twin::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.opcode, wc.wqe_opcode as u32, wc.qpn, wc.wqe_counter),
        (twin::WC_SEND_DONE, twin::OP_RDMA_WRITE, a.qpn(), 0)
    );
    assert_eq!(read(bbuf.addr() + 2048, 1000), data);

    // RDMA read back into a at 1024, 600 bytes.
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_RDMA_READ,
        abuf.addr() + 1024,
        amr.lkey(),
        600,
        bbuf.addr() + 2048,
        bmr.rkey(),
        0,
        twin::SIGNALED | twin::FENCE,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.wqe_opcode as u32, wc.byte_len, wc.wqe_counter),
        (twin::OP_RDMA_READ, 600, 1)
    );
    assert_eq!(read(abuf.addr() + 1024, 600), data[..600]);

    // Write with immediate (takes a receive, no data in it) and send with immediate.
    assert_eq!(twin::qp_post_recv(&mut qb, 0, 0, 0), code::OK);
    assert_eq!(
        twin::qp_post_recv(&mut qb, bbuf.addr(), 64, bmr.lkey()),
        code::OK
    );
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_RDMA_WRITE_IMM,
        abuf.addr(),
        amr.lkey(),
        100,
        bbuf.addr() + 3000,
        bmr.rkey(),
        0xdead_beef,
        0, // unsignalled: completes with the next signalled send
    );
    assert_eq!(rc, code::OK);
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_SEND_IMM,
        abuf.addr() + 10,
        amr.lkey(),
        50,
        0,
        0,
        0x0102_0304,
        twin::SIGNALED | twin::SOLICITED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(
        twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.wqe_counter),
        (twin::WC_RECV_WRITE_IMM, 0xdead_beef, 100, 0)
    );
    assert_eq!(read(bbuf.addr() + 3000, 100), data[..100]);
    assert_eq!(
        twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.qpn),
        (twin::WC_RECV_IMM, 0x0102_0304, 50, b.qpn())
    );
    assert_eq!(read(bbuf.addr(), 50), data[10..60]);
    // One completion for both sends; it frees both slots.
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.wqe_opcode as u32, wc.wqe_counter),
        (twin::OP_SEND_IMM, 3)
    );
    assert_eq!(qa.send_cq.wq_ci, 4);
    assert_eq!(twin::qp_send_room(&qa), qa.sq_wqebbs);

    // Inline: a send of 28 bytes from the "kernel's registers", and an 8-byte write.
    assert_eq!(
        twin::qp_post_recv(&mut qb, bbuf.addr() + 100, 64, bmr.lkey()),
        code::OK
    );
    let inline = message(2, 3, 28);
    assert_eq!(
        twin::qp_post_send_inline(&mut qa, twin::OP_SEND, &inline, 0, 0, 0, twin::SIGNALED),
        code::OK
    );
    assert_eq!(
        twin::qp_post_send_inline(
            &mut qa,
            twin::OP_RDMA_WRITE,
            &0x1122_3344_5566_7788u64.to_ne_bytes(),
            bbuf.addr() + 4000,
            bmr.rkey(),
            0,
            twin::SIGNALED
        ),
        code::OK
    );
    assert_eq!(
        twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(wc.byte_len, 28);
    assert_eq!(read(bbuf.addr() + 100, 28), inline);
    for _ in 0..2 {
        assert_eq!(
            twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
            code::OK
        );
    }
    assert_eq!(
        read(bbuf.addr() + 4000, 8),
        0x1122_3344_5566_7788u64.to_ne_bytes()
    );
    // Arguments the header refuses, writing nothing.
    let before = qa;
    assert_eq!(
        twin::qp_post_send_inline(&mut qa, twin::OP_SEND, &[0; 29], 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(
        twin::qp_post_send_inline(&mut qa, twin::OP_RDMA_READ, &[0; 8], 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(
        twin::qp_post_send(&mut qa, 0x11, 0, 0, 8, 0, 0, 0, 0),
        code::INVALID
    );
    assert_eq!(qa, before);
}

/// A full send ring refuses a post and writes nothing; completions make room. A full
/// receive ring refuses too. Nothing outstanding is lost.
#[test]
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
        let flags = if k == 15 { twin::SIGNALED } else { 0 };
        let rc = twin::qp_post_send(
            &mut qa,
            twin::OP_RDMA_WRITE,
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
    assert_eq!(twin::qp_send_room(&qa), 0);
    let slot0 = read(qa.sq, 64);
    let before = qa;
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        8,
        bbuf.addr() + 1000,
        bmr.rkey(),
        0,
        twin::SIGNALED,
    );
    assert_eq!(rc, code::FULL);
    assert_eq!(
        twin::qp_post_send_inline(&mut qa, twin::OP_SEND, &[1], 0, 0, 0, 0),
        code::FULL
    );
    assert_eq!(qa, before, "a refused post changes nothing");
    assert_eq!(read(qa.sq, 64), slot0, "the oldest WQE was not overwritten");
    let mut wc = Wc::default();
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(wc.wqe_counter, 15);
    assert_eq!(twin::qp_send_room(&qa), 16, "one completion freed all 16");
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
            twin::qp_post_recv(&mut qb, bbuf.addr() + 2048 + 64 * k, 64, bmr.lkey()),
            code::OK
        );
    }
    let before = qb;
    assert_eq!(
        twin::qp_post_recv(&mut qb, bbuf.addr(), 64, bmr.lkey()),
        code::FULL
    );
    assert_eq!(qb, before);
    // The posted receives all work.
    for k in 0..16u64 {
        let m = message(k, 5, 40);
        write(abuf.addr() + 1024, &m);
        assert_eq!(
            twin::qp_post_send_inline(&mut qa, twin::OP_SEND, &m[..28], 0, 0, 0, twin::SIGNALED),
            code::OK
        );
        assert_eq!(
            twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
            code::OK
        );
        assert_eq!(read(bbuf.addr() + 2048 + 64 * k, 28), m[..28]);
        assert_eq!(
            twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
            code::OK
        );
    }
}

/// An error completion comes back as `CQE_ERROR | syndrome` (never a hang), later work is
/// flushed, the host's `Cq::check` reports it, and host polls stay refused meanwhile.
#[test]
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
        twin::cq_wait(&mut qa.send_cq, &mut wc, 20_000_000),
        code::TIMEOUT
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    // Bad rkey.
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_RDMA_WRITE,
        abuf.addr(),
        amr.lkey(),
        64,
        bbuf.addr(),
        bmr.rkey() ^ 0x5555,
        0,
        twin::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    let rc = twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS);
    assert_eq!(rc, code::CQE_ERROR | Syndrome::RemoteAccess as i32);
    assert_eq!(code::syndrome(rc), Some(Syndrome::RemoteAccess));
    assert_eq!(
        (wc.opcode, wc.syndrome, wc.wqe_opcode as u32),
        (twin::WC_REQ_ERR, 0x13, twin::OP_RDMA_WRITE)
    );
    // The QP is in error: the next send is flushed, not lost, not hung.
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_SEND,
        abuf.addr(),
        amr.lkey(),
        8,
        0,
        0,
        0,
        twin::SIGNALED,
    );
    assert_eq!(rc, code::OK);
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::CQE_ERROR | Syndrome::WrFlush as i32
    );
    let e = ascq.check().unwrap_err().to_string();
    assert!(e.contains("RemoteAccess"), "{e}");

    // Bad lkey, for a send and for an RDMA write (a fresh pair each): a local protection
    // error, whatever the opcode.
    for op in [twin::OP_SEND, twin::OP_RDMA_WRITE] {
        let (_dev2, pd2, c, d) = connected(&QpConfig::default());
        let (cbuf, cmr) = pinned(&pd2, 128);
        let (c, _d) = (c.qp.into_device().unwrap(), d.qp.into_device().unwrap());
        let mut qc = c.desc();
        let rc = twin::qp_post_send(
            &mut qc,
            op,
            cbuf.addr(),
            cmr.lkey() ^ 0x7777,
            64,
            cbuf.addr() + 64,
            cmr.rkey(),
            0,
            twin::SIGNALED,
        );
        assert_eq!(rc, code::OK);
        let rc = twin::cq_wait(&mut qc.send_cq, &mut wc, TIMEOUT_NS);
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
        twin::qp_post_recv(&mut qb, abuf.addr(), 64, amr.lkey()),
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
        twin::qp_post_send_inline(&mut qa, twin::OP_SEND, b"hello", 0, 0, 0, twin::SIGNALED),
        code::OK
    );
    assert_eq!(
        twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
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
            twin::peer_send(&mut own, 0, 0, 0, 1_000_000),
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
                        twin::peer_wait_recv(p, want.then_some(&mut *got), TIMEOUT_NS),
                        code::OK,
                        "{me}: receive {i}"
                    );
                    assert_eq!(*got as usize, if want { len(i) } else { 0 });
                    assert_eq!(read(recv_at, len(i)), message(i, peer as u8, len(i)));
                };
                assert_eq!(
                    twin::peer_recv(&mut p, recv_at, mr.lkey(), MAX as u32, TIMEOUT_NS),
                    code::OK
                );
                if me == 1 {
                    recv(&mut p, &mut got);
                }
                write(send_at, &message(i, me as u8, len(i)));
                assert_eq!(
                    twin::peer_send(&mut p, send_at, mr.lkey(), len(i) as u32, TIMEOUT_NS),
                    code::OK,
                    "{me}: send {i}"
                );
                assert_eq!(twin::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
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

/// Kernel-channel failures come back as codes: a send with no receive posted times out
/// (nothing sent), a message longer than the receive fails both sides with their syndromes,
/// and every later call returns the channel's first error.
#[test]
fn kernel_channel_errors_and_timeouts() {
    kernel_channel_ranks(4, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 256);
        let mut p = ch.desc(peer).unwrap();
        if me == 0 {
            // No credit yet: the send times out and posts nothing.
            let t = Instant::now();
            assert_eq!(
                twin::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert!(t.elapsed() < Duration::from_secs(10));
            assert_eq!(p.sends, 0);
            assert_eq!(twin::peer_wait_send(&mut p, 1000), code::INVALID);
        }
        comm.barrier().unwrap();
        if me == 1 {
            assert_eq!(
                twin::peer_recv(&mut p, buf.addr(), mr.lkey(), 16, TIMEOUT_NS),
                code::OK
            );
            // Without the byte count the error completion is still seen, with its syndrome.
            let rc = twin::peer_wait_recv(&mut p, None, TIMEOUT_NS);
            assert_eq!(code::syndrome(rc), Some(Syndrome::LocalLength), "{rc:#x}");
        } else {
            assert_eq!(
                twin::peer_send(&mut p, buf.addr(), mr.lkey(), 200, TIMEOUT_NS),
                code::OK
            );
            let rc = twin::peer_wait_send(&mut p, TIMEOUT_NS);
            assert_eq!(
                code::syndrome(rc),
                Some(Syndrome::RemoteInvalReq),
                "{rc:#x}"
            );
        }
        // Sticky: the channel reports its error from now on, and the host sees it.
        let first = p.error as i32;
        assert_eq!(
            twin::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 1000),
            first
        );
        assert_eq!(ch.progress(peer).unwrap().error as i32, first);
    });
}

/// The schedule of `mp_pp` (`pingpong --api mp --trigger kernel`, in
/// examples/pingpong/kernels.cu), line by line, with a thread per rank in the kernel's place:
/// 64 receives posted ahead on a channel of depth 64 with one credit, then per iteration (rank
/// 1 takes the message first) the marker, the send (one in `sig_every` signalled, and the
/// last), the wait for the sends up to the previous one when it was signalled, and the
/// consumed receive posted again with a credit per `recv_batch`, then (rank 0) the answer;
/// the sends left waited at the end. Each rank posts exactly `iters` receives (none left
/// over), never finds a ring full, and the last message's marker is in its buffer. The GPU
/// runs the kernel itself in tests/gpu_mp.rs.
#[test]
fn pingpong_kernel_schedule_between_thread_ranks() {
    const AHEAD: u32 = 64;
    // (size, iters, recv_batch, sig_every): the defaults, one credit per receive, every send
    // signalled (the former schedule), and a batch as deep as the ring with a period longer
    // than half the send ring (the header then signals on its own).
    for (size, iters, batch, sig_every) in [
        (8u32, 300u64, 16u32, 16u64),
        (4096, 150, 16, 16),
        (64, 1, 16, 16),
        (8, 200, 1, 16),
        (8, 100, 1, 1),
        (8, 300, 64, 100),
        (8, 37, 5, 7),
    ] {
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
                        check!(4, twin::peer_wait_recv(&mut p, want, TIMEOUT_NS));
                        if last && len != size {
                            return 0x1000;
                        }
                    }};
                }
                while p.recvs < iters && p.recvs < AHEAD as u64 {
                    let r = twin::peer_post_recv(&mut p, rbuf.addr(), rmr.lkey(), size);
                    check!(1, r);
                }
                check!(5, twin::peer_give_credit(&mut p, TIMEOUT_NS));
                credits_given += 1;
                while at < iters {
                    let i = at;
                    if rank == 1 {
                        take!();
                    }
                    let marker = (2 * i + 1 + rank) as u32;
                    write(sbuf.addr() + size as u64 - 4, &marker.to_ne_bytes());
                    let signaled = i % sig_every == sig_every - 1 || i + 1 == iters;
                    let flags = if signaled { twin::SIGNALED } else { 0 };
                    check!(
                        2,
                        twin::peer_send_flags(
                            &mut p,
                            sbuf.addr(),
                            smr.lkey(),
                            size,
                            flags,
                            TIMEOUT_NS
                        )
                    );
                    if i > 0 && (i - 1) % sig_every == sig_every - 1 {
                        let n = p.sends - 1 - p.sends_waited;
                        check!(3, twin::peer_wait_sends(&mut p, n, TIMEOUT_NS));
                    }
                    if (rank == 1 || i > 0) && p.recvs < iters {
                        let r = twin::peer_post_recv(&mut p, rbuf.addr(), rmr.lkey(), size);
                        check!(1, r);
                        if p.recvs - p.credited >= batch as u64 || p.recvs == iters {
                            check!(5, twin::peer_give_credit(&mut p, TIMEOUT_NS));
                            credits_given += 1;
                        }
                    }
                    if rank == 0 {
                        take!();
                    }
                    at += 1;
                }
                if p.sends > p.sends_waited {
                    let n = p.sends - p.sends_waited;
                    check!(3, twin::peer_wait_sends(&mut p, n, TIMEOUT_NS));
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

/// Batched credits: receives posted without a credit do not let the peer send (its send
/// times out, posting nothing); one `give_credit` then covers all of them, with a single
/// credit write; a credit with nothing new to announce writes nothing.
#[test]
fn kernel_channel_one_credit_covers_a_batch_of_receives() {
    const N: u64 = 8;
    kernel_channel_ranks(16, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 64 * (N as usize + 1));
        let mut p = ch.desc(peer).unwrap();
        if me == 1 {
            for k in 0..N {
                let at = buf.addr() + 64 * k;
                assert_eq!(twin::peer_post_recv(&mut p, at, mr.lkey(), 64), code::OK);
            }
            assert_eq!(
                (p.recvs, p.credited, p.qp.sq_pi),
                (N, 0, 0),
                "no credit yet"
            );
        }
        comm.barrier().unwrap();
        if me == 0 {
            // Receives are posted at the peer, but not credited: no send goes out.
            assert_eq!(
                twin::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert_eq!((p.sends, p.qp.sq_pi), (0, 0));
        }
        comm.barrier().unwrap();
        if me == 1 {
            assert_eq!(twin::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!((p.credited, p.qp.sq_pi), (N, 1), "one credit write");
            assert_eq!(twin::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!(p.qp.sq_pi, 1, "nothing new to credit: nothing written");
            for k in 0..N {
                let mut got = 0;
                assert_eq!(
                    twin::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
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
                    twin::peer_send(&mut p, at, mr.lkey(), 8 + k as u32, TIMEOUT_NS),
                    code::OK,
                    "send {k}: the one credit covers it"
                );
            }
            assert_eq!(p.credits, N);
            // Credit for N receives only: the next send waits (and times out).
            assert_eq!(
                twin::peer_send(&mut p, buf.addr(), mr.lkey(), 8, 30_000_000),
                code::TIMEOUT
            );
            assert_eq!(twin::peer_wait_sends(&mut p, N, TIMEOUT_NS), code::OK);
            assert_eq!((p.sends, p.sends_done, p.sends_waited), (N, N, N));
        }
    });
}

/// Selective signalling: 100 sends with one in 16 signalled through a send ring of 16 slots
/// (it wraps 6 times), then one wait for all of them: every send is counted, no post finds
/// the ring full for good (the header signals one WQE per half ring by itself), and far
/// fewer completions are written than sends. The receiver keeps 8 receives posted and
/// credits them 4 at a time.
#[test]
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
                    twin::peer_post_recv(&mut p, slot(k), mr.lkey(), 64),
                    code::OK
                );
            }
            assert_eq!(twin::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
            for k in 0..SENDS {
                let mut got = 0;
                assert_eq!(
                    twin::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
                    code::OK
                );
                assert_eq!(read(slot(k), 8), k.to_ne_bytes(), "message {k}");
                if p.recvs < SENDS {
                    let at = slot(p.recvs);
                    assert_eq!(twin::peer_post_recv(&mut p, at, mr.lkey(), 64), code::OK);
                    if p.recvs - p.credited >= 4 || p.recvs == SENDS {
                        assert_eq!(twin::peer_give_credit(&mut p, TIMEOUT_NS), code::OK);
                    }
                }
            }
        } else {
            assert_eq!(p.qp.sq_wqebbs, 16);
            for k in 0..SENDS {
                // Each message from its own source slot, reused only once the sends of a
                // ring's worth before it are known complete (waited below).
                write(slot(k), &k.to_ne_bytes());
                let flags = if k % 16 == 15 { twin::SIGNALED } else { 0 };
                let rc = twin::peer_send_flags(&mut p, slot(k), mr.lkey(), 8, flags, TIMEOUT_NS);
                assert_eq!(rc, code::OK, "send {k}");
                assert!(p.sends_done <= p.sends);
                if k % DEPTH as u64 == DEPTH as u64 - 1 {
                    // The sources are reused next: wait for the sends so far.
                    let n = p.sends - p.sends_waited;
                    assert_eq!(twin::peer_wait_sends(&mut p, n, TIMEOUT_NS), code::OK);
                }
            }
            let n = p.sends - p.sends_waited;
            assert_eq!(twin::peer_wait_sends(&mut p, n, TIMEOUT_NS), code::OK);
            assert_eq!(
                (p.sends, p.sends_done, p.sends_waited),
                (SENDS, SENDS, SENDS)
            );
            assert_eq!(twin::peer_wait_send(&mut p, 1000), code::INVALID);
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
fn kernel_channel_wait_for_a_trailing_unsignalled_send_posts_a_nop() {
    kernel_channel_ranks(16, |comm, ch| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let (buf, mr) = pinned(comm.pd(), 256);
        let mut p = ch.desc(peer).unwrap();
        if me == 1 {
            for _ in 0..4 {
                assert_eq!(
                    twin::peer_recv(&mut p, buf.addr(), mr.lkey(), 64, TIMEOUT_NS),
                    code::OK
                );
            }
            for _ in 0..4 {
                let mut got = 0;
                assert_eq!(
                    twin::peer_wait_recv(&mut p, Some(&mut got), TIMEOUT_NS),
                    code::OK
                );
            }
        } else {
            for _ in 0..3 {
                let rc = twin::peer_send_flags(&mut p, buf.addr(), mr.lkey(), 8, 0, TIMEOUT_NS);
                assert_eq!(rc, code::OK);
            }
            assert_eq!(
                (p.qp.sq_pi, p.signaled_pi),
                (3, 0),
                "three unsignalled sends"
            );
            let t = Instant::now();
            assert_eq!(twin::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
            assert!(t.elapsed() < Duration::from_secs(10));
            assert_eq!(p.qp.sq_pi, 4, "a NOP was posted after them");
            assert_eq!(
                (p.qp.send_cq.ci, p.qp.send_cq.wq_ci),
                (1, 4),
                "its completion"
            );
            // It finished all three; the next waits need no completion.
            assert_eq!((p.sends_done, p.sends_waited), (3, 1));
            assert_eq!(twin::peer_wait_sends(&mut p, 2, TIMEOUT_NS), code::OK);
            assert_eq!((p.qp.sq_pi, p.sends_waited), (4, 3));
            // A signalled send: its own completion ends the wait, no NOP.
            assert_eq!(
                twin::peer_send(&mut p, buf.addr(), mr.lkey(), 8, TIMEOUT_NS),
                code::OK
            );
            assert_eq!(twin::peer_wait_send(&mut p, TIMEOUT_NS), code::OK);
            assert_eq!((p.qp.sq_pi, p.qp.send_cq.ci, p.sends_done), (5, 2, 4));
            assert_eq!(
                twin::peer_wait_sends(&mut p, 1, TIMEOUT_NS),
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
        let rc = twin::qp_post_send(
            &mut qa,
            twin::OP_RDMA_WRITE,
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
    assert_eq!(
        twin::qp_post_nop(&mut qa, 0),
        code::OK,
        "an unsignalled NOP"
    );
    assert_eq!(twin::qp_post_nop(&mut qa, twin::SIGNALED), code::OK);
    assert_eq!(
        twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
        code::OK
    );
    assert_eq!(
        (wc.opcode, wc.wqe_opcode as u32, wc.qpn, wc.wqe_counter),
        (twin::WC_SEND_DONE, twin::OP_NOP, a.qpn(), WRITES as u16 + 1)
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
        twin::cq_poll(&mut qa.send_cq, &mut wc),
        code::EMPTY,
        "one completion only"
    );
}

/// The WQEs the header writes read back, through the soft device's own reader
/// (`format::SendWqe::parse`, `format::RecvWqe::parse`), as the requests the kernel made:
/// write, write with immediate, read, send with immediate, inline send and write, NOP, and
/// the receive the send lands in.
#[test]
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
        (twin::OP_RDMA_WRITE, Opcode::RdmaWrite, 0),
        (twin::OP_RDMA_WRITE_IMM, Opcode::RdmaWriteImm, 0x0A0B_0C0D),
        (twin::OP_RDMA_READ, Opcode::RdmaRead, 0),
    ];
    for (op, opcode, imm) in ops {
        if opcode.consumes_recv() {
            assert_eq!(twin::qp_post_recv(&mut qb, 0, 0, 0), code::OK);
        }
        let rc = twin::qp_post_send(
            &mut qa,
            op,
            abuf.addr(),
            la,
            100,
            bbuf.addr() + 512,
            rb,
            imm,
            twin::SIGNALED,
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
    assert_eq!(twin::qp_post_recv(&mut qb, bbuf.addr(), 256, lb), code::OK);
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
    let rc = twin::qp_post_send(
        &mut qa,
        twin::OP_SEND_IMM,
        abuf.addr(),
        la,
        100,
        0,
        0,
        7,
        twin::SIGNALED,
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
        twin::qp_post_recv(&mut qb, bbuf.addr() + 1024, 64, lb),
        code::OK
    );
    let inline = message(4, 1, 28);
    let rc = twin::qp_post_send_inline(&mut qa, twin::OP_SEND, &inline, 0, 0, 0, twin::SIGNALED);
    assert_eq!(rc, code::OK);
    let want = expect(&qa, Opcode::Send, None, 0, WqeData::Inline(&inline));
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    let rc = twin::qp_post_send_inline(
        &mut qa,
        twin::OP_RDMA_WRITE,
        &inline[..8],
        bbuf.addr() + 2048,
        rb,
        0,
        twin::SIGNALED,
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

    assert_eq!(twin::qp_post_nop(&mut qa, twin::SIGNALED), code::OK);
    let want = expect(&qa, Opcode::Nop, None, 0, WqeData::Gather(DataSegs::EMPTY));
    assert_eq!(SendWqe::parse(&last_wqe(&qa)), Ok(want));
    signalled += 1;

    // The device executed them all, as read.
    let mut wc = Wc::default();
    for _ in 0..signalled {
        assert_eq!(
            twin::cq_wait(&mut qa.send_cq, &mut wc, TIMEOUT_NS),
            code::OK
        );
        assert_eq!(wc.opcode, twin::WC_SEND_DONE, "{wc:?}");
    }
    for _ in 0..3 {
        assert_eq!(
            twin::cq_wait(&mut qb.recv_cq, &mut wc, TIMEOUT_NS),
            code::OK
        );
    }
    assert_eq!(read(bbuf.addr() + 1024, 28), inline);
    drop(b);
}

// ------------------------------------------------------------------ the header itself

/// A kernel calling every device function of the kernel-driven QP and peer API.
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
