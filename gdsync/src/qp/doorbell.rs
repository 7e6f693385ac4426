//! The send doorbell: the one store sequence that exposes sends to the device (the doorbell
//! record, the barrier, the doorbell register, the write-combining fences, the alternation of
//! the register's halves, and the "rung to" word published after the doorbell), in the two
//! forms its callers need: stores on this thread (a CPU post, a batch rung on the CPU, the CPU
//! proxy ringing for a GPU) and an op list for an executor (a commit, a batch handed to an
//! executor).

use super::{Qp, QpShared, Ringers, QP_PROXY, QP_SQ_RUNG};
use crate::format::{doorbell_value, qp_dbrec_value, Be32, DBREC_SQ};
use crate::ops::{Op, Ops};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The words one ring stores: the send doorbell record, the doorbell register (or its half in
/// turn) and the "rung to" word ([`QP_SQ_RUNG`]).
pub(crate) struct RingWords<'a> {
    pub dbrec: &'a AtomicU32,
    pub register: &'a AtomicU64,
    pub rung: &'a AtomicU64,
    /// The register is write-combining device memory: fence around its store.
    pub wc: bool,
}

/// Rings on this thread: the WQEs before the record (a barrier for the device, then release),
/// the record before the register (a fence for a write-combining register), the register's
/// store pushed out after it, then "rung to" `end` (so a CPU post that reads it knows this
/// doorbell is out: see [`Qp::has_unrung_commits`]). `end` is the producer counter after the
/// last WQE exposed, `head` the first 8 bytes of the last WQE.
#[inline]
pub(crate) fn ring(w: &RingWords, end: u64, head: [u8; 8]) {
    crate::barrier::dma_wmb();
    w.dbrec
        .store(qp_dbrec_value(end).native(), Ordering::Release);
    if w.wc {
        crate::mem::wc_fence();
    }
    w.register.store(doorbell_value(head), Ordering::Release);
    if w.wc {
        crate::mem::wc_fence();
    }
    w.rung.store(end, Ordering::Release);
}

/// How the CPU proxy rings for sends a GPU wrote up to producer counter `end` on QP `qpn`
/// (the proxy is handed this function with the QP's doorbell, so it names no QP): [`ring`],
/// with a doorbell that carries the index and the QP (the proxy has no WQE at hand), as
/// NVSHMEM and DOCA ring.
pub(crate) fn ring_for_proxy(
    dbrec: &AtomicU32,
    register: &AtomicU64,
    rung: &AtomicU64,
    wc: bool,
    qpn: u32,
    end: u64,
) {
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&Be32::new(((end as u32) & 0xFFFF) << 8).bytes());
    head[4..].copy_from_slice(&Be32::new((qpn & 0xFF_FFFF) << 8).bytes());
    let words = RingWords {
        dbrec,
        register,
        rung,
        wc,
    };
    ring(&words, end, head);
}

/// The op list that rings for sends up to producer counter `end`, whose last WQE begins with
/// `head`: barrier, store the doorbell record, barrier, ring the 8-byte doorbell (the first
/// half of the register; CPU executors flush it), barrier, store "rung to" `end` (only for a
/// QP of [`Ringers::Mixed`]); or, where a CPU
/// proxy rings for this QP, a barrier and the request to it (the proxy publishes "rung to").
/// (`kernel::SendDesc::from_ops` reads this shape back.)
pub(super) fn ring_ops(s: &QpShared, end: u64, head: [u8; 8]) -> Ops {
    let keep = s.keep();
    let mut ops = Ops::new();
    if s.handler == crate::NicHandler::Cpu {
        // The proxy rings: what ran before is visible first, then the request.
        ops.push(Op::Barrier, &keep);
        ops.push(
            Op::Write64 {
                addr: s.ctrl.addr(QP_PROXY),
                value: end,
            },
            &keep,
        );
        ops.mark_ring(s.ctrl.addr(QP_PROXY));
        return ops;
    }
    // What ran before (the payload, a marker in it) is visible before the record: a ConnectX
    // still busy with this queue may read the record, and the requests it exposes, before the
    // doorbell rings (libmlx5's `udma_to_device_barrier`). A stream elides the barrier (its
    // write fences by itself); a list kernel fences here.
    ops.push(Op::Barrier, &keep);
    ops.push(
        Op::Write32 {
            addr: s.dbrec.addr() + 4 * DBREC_SQ as u64,
            value: qp_dbrec_value(end).native(),
        },
        &s.keep_dbrec(),
    );
    ops.push(Op::Barrier, &keep);
    ops.push(
        Op::Doorbell {
            addr: s.doorbell.addr(),
            value: doorbell_value(head),
        },
        &s.keep_doorbell(),
    );
    // "Rung to", only where CPU posts interleave with commits (`Ringers`): the CPU post
    // reads it to know this doorbell is out. Where only executors ring, a CPU post learns
    // that from completions instead (`Qp::doorbell_reached`).
    // A write implies no order of its own (`Op::Write32`): the barrier keeps "rung to" after
    // the doorbell on every executor (a stream elides it: its writes fence themselves).
    if s.cfg.ringers == Ringers::Mixed {
        ops.push(Op::Barrier, &keep);
        ops.push(
            Op::Write64 {
                addr: s.ctrl.addr(QP_SQ_RUNG),
                value: end,
            },
            &keep,
        );
    }
    ops.mark_ring(s.dbrec.addr());
    ops
}

impl Qp {
    /// Rings on this thread for sends up to `end` (see [`ring`]): the register's halves in
    /// turn, as libmlx5 rings (executors ring the first), then the device is told.
    #[inline]
    pub(super) fn ring_doorbell(&mut self, end: u64, head: [u8; 8]) {
        let s = &*self.shared;
        let words = RingWords {
            dbrec: s.sq_dbrec(),
            register: s.doorbell_half(self.bf_offset),
            rung: s.sq_rung(),
            wc: s.doorbell_wc,
        };
        ring(&words, end, head);
        self.bf_offset ^= s.bf_size;
        self.ctx.provider.kick();
    }
}
