//! What the user's QP handle and CQ polls share: the rings and control page the queue layer
//! allocated, the doorbell register the device handed out, the work-request ids, the
//! counters that say which slots are free again, and the QP's state word (what the library
//! knows of its state without asking the device).

use super::{QpConfig, QpState};
use crate::context::DeviceContext;
use crate::cq::{CqError, CqShared, CqUser};
use crate::format::{DBREC_SQ, SEG_SIZE, WQEBB};
use crate::mem::RingMem;
use crate::ops::KeepAlive;
use crate::provider::{DeviceQpRings, HwQpState, MemAt, QpCreated, QpMem, QpSpec};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Offsets in a QP's control page: the doorbell record (`[RQ][SQ]`, BE32, the device reads
/// it; unless the device placed its own: [`QpShared::dbrec`]), and the retired counters
/// executors store (native u64).
pub(crate) const QP_DBREC: usize = 0;
pub(crate) const QP_SQ_RETIRED: usize = 64;
pub(crate) const QP_RQ_RETIRED: usize = 128;
/// With a CPU proxy ([`crate::NicHandler::Cpu`]): the producer index the GPU asks the proxy to
/// ring (native u64).
pub(crate) const QP_PROXY: usize = 192;
/// With a kernel driving the QP ([`crate::kernel::DeviceQp`]): its send and receive producer
/// counters (native u64, free-running), stored through by the kernel so that the host reads
/// progress and the next launch resumes.
pub(crate) const QP_KERNEL_SQ_PI: usize = 256;
pub(crate) const QP_KERNEL_RQ_PI: usize = 264;
/// How far the send queue is rung: the producer counter (native u64, free-running) of the
/// last doorbell, stored by every ringer (the CPU, an executor, a kernel, the proxy) AFTER
/// its doorbell. The doorbell record cannot tell: ringers store it before their doorbell.
pub(crate) const QP_SQ_RUNG: usize = 320;

/// A QP's rings and control page, laid out as mlx5 does (receive ring at offset 0, send
/// ring after it): the queue layer's, or the device's own.
pub(crate) struct QpRings {
    pub buf: Arc<RingMem>,
    pub ctrl: Arc<RingMem>,
    pub sq_off: usize,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub rq_stride: u32,
    pub dbrec: MemAt,
}

/// A QP's rings as the queue layer asks the device for them: their sizes, the control page,
/// and the ring memory where the queue layer places the rings (`None`: the device owns its
/// rings, [`crate::DeviceAttr::owns_rings`], and is given none).
pub(crate) struct QpRingsAsked {
    ctrl: Arc<RingMem>,
    sq_cnt: u32,
    rq_cnt: u32,
    rq_stride: u32,
    max_inline: u32,
    mem: Option<QpMem>,
}

impl QpRingsAsked {
    /// The rings, mapped for the GPUs of `gpus` (none: host memory only).
    pub(super) fn new(
        cfg: &QpConfig,
        device_owns_rings: bool,
        gpus: Option<&Arc<crate::cuda::Cuda>>,
    ) -> Self {
        let sq_cnt = cfg.sq_cnt();
        let rq_cnt = cfg.recv_wqes.next_power_of_two();
        let rq_stride = (SEG_SIZE as u32 * cfg.max_recv_sge).next_power_of_two();
        let rq_bytes = (rq_cnt * rq_stride) as usize;
        let sq_off = rq_bytes.max(64);
        let ctrl = Arc::new(RingMem::new(crate::mem::page_size(), gpus));
        let mem = (!device_owns_rings).then(|| QpMem {
            buf: Arc::new(RingMem::new(sq_off + sq_cnt as usize * WQEBB, gpus)),
            sq_off,
            dbrec: MemAt {
                mem: ctrl.clone(),
                off: QP_DBREC,
            },
        });
        QpRingsAsked {
            ctrl,
            sq_cnt,
            rq_cnt,
            rq_stride,
            max_inline: cfg.max_inline,
            mem,
        }
    }

    /// The `create_qp` command for these rings.
    pub(super) fn spec(&self, pd: u32, send_cqn: u32, recv_cqn: u32) -> QpSpec {
        QpSpec {
            pd,
            rq_wqes: self.rq_cnt,
            rq_stride: self.rq_stride,
            sq_wqebbs: self.sq_cnt,
            max_inline: self.max_inline,
            send_cqn,
            recv_cqn,
            mem: self.mem.clone(),
        }
    }

    /// The rings the QP uses: the ones the device allocated, else the ones it was given
    /// (`None`: neither, a device that owns its rings but gave none).
    pub(super) fn rings(self, device: Option<DeviceQpRings>) -> Option<QpRings> {
        let (mem, sq_cnt, rq_cnt, rq_stride) = match (device, self.mem) {
            (Some(d), _) => (d.mem, d.sq_wqebbs, d.rq_wqes, d.rq_stride),
            (None, Some(mem)) => (mem, self.sq_cnt, self.rq_cnt, self.rq_stride),
            (None, None) => return None,
        };
        Some(QpRings {
            buf: mem.buf,
            ctrl: self.ctrl,
            sq_off: mem.sq_off,
            sq_cnt,
            rq_cnt,
            rq_stride,
            dbrec: mem.dbrec,
        })
    }
}

/// The QP as the user handle and CQ polls share it.
///
/// Aligned so that the `Arc`'s counters do not share a cache line with the fields posting
/// threads read.
#[repr(C, align(128))]
pub(crate) struct QpShared {
    pub qpn: u32,
    pub pd: u32,
    /// RQ at offset 0, SQ at `sq_off` (the mlx5 layout).
    pub buf: Arc<RingMem>,
    pub ctrl: Arc<RingMem>,
    pub sq_off: usize,
    /// The address of the send ring (`buf` at `sq_off`), whose `sq_cnt` WQEBBs were checked
    /// to lie inside `buf`: posts write WQEs in place from here.
    pub sq_addr: u64,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub rq_stride: u32,
    /// The doorbell record (`[RQ][SQ]`, BE32): in the control page, or where the device
    /// placed it.
    pub dbrec: MemAt,
    /// The doorbell register the device handed out (in its UAR page).
    pub doorbell: MemAt,
    /// Where the register's second half lies, which CPU posts alternate with (0: none).
    pub bf_size: usize,
    /// The register is write-combining device memory: CPU posts fence around the store.
    pub doorbell_wc: bool,
    /// The addresses of the doorbell record's send word and of the register's first half,
    /// checked once here (in bounds and aligned, both halves): CPU posts store through
    /// them ([`QpShared::sq_dbrec`], [`QpShared::doorbell_half`]).
    sq_dbrec_addr: u64,
    doorbell_addr: u64,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub(super) sq_wrid: Box<[AtomicU64]>,
    pub(super) sq_wqebbs: Box<[AtomicU8]>,
    pub(super) rq_wrid: Box<[AtomicU64]>,
    /// Free-running counters of what host polls have retired.
    pub(crate) sq_polled: AtomicU64,
    pub(crate) rq_polled: AtomicU64,
    /// While the receive CQ serves only this receive queue, receive `i` completes as that
    /// CQ's completion `i + rq_cqe_base`, so the CQ's consumption tells which receives are
    /// retired, and executors need not store a retired counter of their own. [`NO_BASE`]
    /// until the first receive; [`BAD_BASE`] for good once the numbering stopped matching.
    rq_cqe_base: AtomicU64,
    pub cfg: QpConfig,
    /// The QP's state as the library knows it (a [`HwQpState`] as `u8`): set by its own
    /// transitions, by the device's events and error completions that name the QP
    /// ([`DeviceContext::qp_failed`]), and by [`QpShared::query_state`]. Reading it is no
    /// device command (on a ConnectX, `ibv_query_qp` is a firmware command).
    pub(super) hw_state: Arc<AtomicU8>,
    /// The send and receive CQs' consumer index words when [`QpShared::state`] last looked
    /// at their completions for errors.
    cq_looked: [AtomicU32; 2],
    /// Who rings for committed op lists.
    pub handler: crate::NicHandler,
    pub ctx: Arc<DeviceContext>,
}

/// `QpShared::rq_cqe_base`: no receive yet; numbering that stopped matching.
const NO_BASE: u64 = u64::MAX;
const BAD_BASE: u64 = u64::MAX - 1;

impl QpShared {
    /// The shared state of a QP the device created on `rings`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        rings: QpRings,
        created: QpCreated,
        pd: u32,
        send_cq: &Arc<CqShared>,
        recv_cq: &Arc<CqShared>,
        cfg: &QpConfig,
        handler: crate::NicHandler,
        ctx: &Arc<DeviceContext>,
    ) -> Self {
        let QpRings {
            buf,
            ctrl,
            sq_off,
            sq_cnt,
            rq_cnt,
            rq_stride,
            dbrec,
        } = rings;
        assert!(
            crate::bounds::fits(sq_off, sq_cnt as usize * WQEBB, buf.len()),
            "send ring {sq_off}+{sq_cnt} WQEBBs out of {}",
            buf.len()
        );
        let sq_dbrec_addr = dbrec.mem.u32(dbrec.off + 4 * DBREC_SQ) as *const AtomicU32 as u64;
        let db = &created.doorbell;
        let doorbell_addr = db.mem.u64(db.off) as *const AtomicU64 as u64;
        db.mem.u64(db.off + created.bf_size); // (checks the second half)
        QpShared {
            sq_addr: buf.addr(sq_off),
            sq_dbrec_addr,
            doorbell_addr,
            qpn: created.qpn,
            pd,
            buf,
            ctrl,
            sq_off,
            sq_cnt,
            rq_cnt,
            rq_stride,
            dbrec,
            doorbell: created.doorbell,
            bf_size: created.bf_size,
            doorbell_wc: created.doorbell_wc,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            sq_wrid: (0..sq_cnt).map(|_| AtomicU64::new(0)).collect(),
            sq_wqebbs: (0..sq_cnt).map(|_| AtomicU8::new(0)).collect(),
            rq_wrid: (0..rq_cnt).map(|_| AtomicU64::new(0)).collect(),
            sq_polled: AtomicU64::new(0),
            rq_polled: AtomicU64::new(0),
            rq_cqe_base: AtomicU64::new(NO_BASE),
            cfg: cfg.clone(),
            hw_state: Arc::new(AtomicU8::new(HwQpState::Reset as u8)),
            cq_looked: [AtomicU32::new(0), AtomicU32::new(0)],
            handler,
            ctx: ctx.clone(),
        }
    }
    /// Host poll saw the requester CQE for `wqe_counter`: frees its slots, returns its wr_id.
    pub(crate) fn retire_send(&self, wqe_counter: u16) -> u64 {
        let slot = (wqe_counter as u32 & (self.sq_cnt - 1)) as usize;
        let wr_id = self.sq_wrid[slot].load(Ordering::Relaxed);
        let end = wqe_counter.wrapping_add(self.sq_wqebbs[slot].load(Ordering::Relaxed) as u16);
        advance16(&self.sq_polled, end);
        wr_id
    }
    /// Host poll saw the responder CQE for RQ index `c`.
    pub(crate) fn retire_recv(&self, c: u16) -> u64 {
        let wr_id = self.rq_wrid[(c as u32 & (self.rq_cnt - 1)) as usize].load(Ordering::Relaxed);
        advance16(&self.rq_polled, c.wrapping_add(1));
        wr_id
    }
    /// The QP's state as the library knows it: its own transitions, and the events and
    /// error completions that said it failed (read here: a few loads when none waits and
    /// no executor consumed completions since the last look). No device command.
    #[inline]
    pub(crate) fn state(&self) -> QpState {
        self.ctx.poll_events();
        if self.hw_state.load(Ordering::Acquire) != HwQpState::Error as u8 {
            self.look_at_cqs();
        }
        visible(HwQpState::from_u8(self.hw_state.load(Ordering::Acquire)))
    }
    /// Looks for error completions on the QP's CQs where their consumer index moved since
    /// the last look (an executor or kernel may have consumed one: its wait passes for
    /// errors too).
    fn look_at_cqs(&self) {
        for (cq, looked) in [&self.send_cq, &self.recv_cq]
            .into_iter()
            .zip(&self.cq_looked)
        {
            let ci = cq.ci_word();
            if looked.load(Ordering::Relaxed) != ci {
                cq.look_for_errors();
                looked.store(ci, Ordering::Relaxed);
            }
        }
    }
    /// The QP's state as the device reports it (`query_qp`: a firmware command on a
    /// ConnectX), kept as the library's word from then on.
    pub(crate) fn query_state(&self) -> QpState {
        let hw = self.ctx.provider.query_qp(self.qpn).state;
        self.hw_state.store(hw as u8, Ordering::Release);
        visible(hw)
    }
    /// A transition the library made succeeded: the QP is now `to` (unless it failed
    /// meanwhile: ERROR stays).
    pub(super) fn moved_to(&self, to: HwQpState) {
        let _ = self
            .hw_state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s != HwQpState::Error as u8).then_some(to as u8)
            });
    }
    pub(crate) fn sq_retired(&self) -> u64 {
        self.sq_polled
            .load(Ordering::Acquire)
            .max(self.ctrl.u64(QP_SQ_RETIRED).load(Ordering::Acquire))
    }
    pub(crate) fn rq_retired(&self) -> u64 {
        let r = self
            .rq_polled
            .load(Ordering::Acquire)
            .max(self.ctrl.u64(QP_RQ_RETIRED).load(Ordering::Acquire));
        match self.rq_base() {
            Some(base) => r.max(self.recv_cq.consumed().saturating_sub(base)),
            None => r,
        }
    }
    /// `rq_cqe_base`, if the receive CQ's consumption counts this queue's retired receives.
    pub(crate) fn rq_base(&self) -> Option<u64> {
        let base = self.rq_cqe_base.load(Ordering::Acquire);
        (base < BAD_BASE && !self.recv_cq.shared_ever.load(Ordering::Acquire)).then_some(base)
    }
    /// Receive `index` was given completion number `cqe`.
    pub(crate) fn note_rq_cqe(&self, index: u64, cqe: u64) {
        let base = cqe.wrapping_sub(index);
        let old = self.rq_cqe_base.load(Ordering::Relaxed);
        if old == NO_BASE && base < BAD_BASE {
            self.rq_cqe_base.store(base, Ordering::Release);
        } else if old != base {
            self.rq_cqe_base.store(BAD_BASE, Ordering::Release);
        }
    }
    /// Word `which` of the doorbell record ([`DBREC_RQ`](crate::format::DBREC_RQ) or
    /// [`DBREC_SQ`](crate::format::DBREC_SQ)).
    pub(crate) fn dbrec_word(&self, which: usize) -> &std::sync::atomic::AtomicU32 {
        self.dbrec.mem.u32(self.dbrec.off + 4 * which)
    }
    /// The doorbell record's send word ([`dbrec_word`](Self::dbrec_word)`(DBREC_SQ)`).
    #[inline]
    pub(crate) fn sq_dbrec(&self) -> &AtomicU32 {
        // SAFETY: `dbrec.mem.u32` made this address (in bounds, aligned) in `new`; the memory
        // lives as long as `self.dbrec`.
        unsafe { &*(self.sq_dbrec_addr as *const AtomicU32) }
    }
    /// The half of the doorbell register at `bf_offset` (0 or [`bf_size`](Self::bf_size)).
    #[inline]
    pub(crate) fn doorbell_half(&self, bf_offset: usize) -> &AtomicU64 {
        assert!(
            bf_offset == 0 || bf_offset == self.bf_size,
            "no doorbell half {bf_offset}"
        );
        // SAFETY: `doorbell.mem.u64` checked both halves (in bounds, aligned) in `new`; the
        // memory lives as long as `self.doorbell`.
        unsafe { &*((self.doorbell_addr + bf_offset as u64) as *const AtomicU64) }
    }
    /// The "rung to" word ([`QP_SQ_RUNG`]).
    #[inline]
    pub(crate) fn sq_rung(&self) -> &AtomicU64 {
        self.ctrl.u64(QP_SQ_RUNG)
    }
    /// Keeps the control page alive for an op list that stores into it.
    pub(crate) fn keep(&self) -> KeepAlive {
        self.ctrl.clone()
    }
    /// Keeps the doorbell record's memory alive for an op list that stores into it.
    pub(crate) fn keep_dbrec(&self) -> KeepAlive {
        self.dbrec.mem.clone()
    }
    /// Keeps the device's doorbell page alive for an op list that rings it.
    pub(crate) fn keep_doorbell(&self) -> KeepAlive {
        self.doorbell.mem.clone()
    }
    /// The retired counters executors and kernels store (send WQEBBs, receives).
    pub(crate) fn kernel_retired(&self) -> (u64, u64) {
        (
            self.ctrl.u64(QP_SQ_RETIRED).load(Ordering::Acquire),
            self.ctrl.u64(QP_RQ_RETIRED).load(Ordering::Acquire),
        )
    }
}

impl CqUser for QpShared {
    fn retire_send(&self, wqe_counter: u16) -> u64 {
        QpShared::retire_send(self, wqe_counter)
    }
    fn retire_recv(&self, c: u16) -> u64 {
        QpShared::retire_recv(self, c)
    }
    fn in_error(&self) -> bool {
        self.state() == QpState::Error
    }
    fn first_error_on(&self, cqn: u32) -> Option<CqError> {
        let e = self.ctx.provider.query_qp(self.qpn).last_error?;
        let cq = if e.responder {
            &self.recv_cq
        } else {
            &self.send_cq
        };
        (cq.cqn == cqn).then_some(CqError {
            qpn: self.qpn,
            wqe_counter: e.wqe_counter,
            syndrome: e.syndrome,
            responder: e.responder,
        })
    }
}

/// The state a user sees of the device's state: INIT until RTS.
fn visible(hw: HwQpState) -> QpState {
    match hw {
        HwQpState::Reset | HwQpState::Init | HwQpState::Rtr => QpState::Init,
        HwQpState::Rts => QpState::Rts,
        HwQpState::Error => QpState::Error,
    }
}

/// Moves a free-running counter forward to the 16-bit value `to` (never backwards).
pub(super) fn advance16(c: &AtomicU64, to: u16) {
    let cur = c.load(Ordering::Relaxed);
    let next = crate::format::advance16(cur, to);
    if next != cur {
        c.store(next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_owns_its_rings_is_given_none_and_its_own_are_used() {
        let cfg = QpConfig::default();
        // The soft device's way: the queue layer's rings, given and kept.
        let given = QpRingsAsked::new(&cfg, false, None);
        let mem = given.spec(1, 2, 3).mem.expect("rings given");
        let rings = given.rings(None).expect("the given rings");
        assert!(Arc::ptr_eq(&rings.buf, &mem.buf));
        assert_eq!(rings.sq_cnt, cfg.sq_cnt());
        // libmlx5's way: nothing allocated for the ring, the device's rings used.
        let asked = QpRingsAsked::new(&cfg, true, None);
        assert!(
            asked.spec(1, 2, 3).mem.is_none(),
            "no ring made for the device"
        );
        let ctrl = Arc::new(RingMem::host(crate::mem::page_size()));
        let device = DeviceQpRings {
            mem: QpMem {
                buf: Arc::new(RingMem::host(4 * WQEBB + 256)),
                sq_off: 256,
                dbrec: MemAt { mem: ctrl, off: 8 },
            },
            rq_wqes: 8,
            rq_stride: 32,
            sq_wqebbs: 4,
        };
        let buf = device.mem.buf.clone();
        let rings = asked.rings(Some(device)).expect("the device's rings");
        assert!(Arc::ptr_eq(&rings.buf, &buf));
        assert_eq!((rings.sq_off, rings.sq_cnt, rings.rq_cnt), (256, 4, 8));
        assert_eq!(rings.dbrec.off, 8);
        // A device that owns its rings but gave none: no rings, an error for the caller.
        assert!(QpRingsAsked::new(&cfg, true, None).rings(None).is_none());
    }
}
