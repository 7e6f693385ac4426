//! Kernel-initiated operation: descriptors a GPU kernel uses to ring doorbells and wait for
//! completions, and rings of them so one persistent kernel can do so many times.
//!
//! The descriptors are the same memory operations as the op lists ([`Ops`]) that commits and
//! completion waits produce, in `#[repr(C)]` form. The CUDA side is [`HEADER`] (the file
//! `gdsync/include/gdsync.cuh`), whose layouts a test checks against these types; kernels are
//! compiled at run time with NVRTC ([`crate::cuda::Module`]).
//!
//! LibMP's device descriptors were single-use (its example capped a kernel at ~20
//! iterations). A [`DescRing`] is refilled by the host while the kernel runs: the kernel takes
//! entry `i` once the host published it (`seq == i + 1`) and reports what it consumed.
//!
//! A [`DeviceQp`] goes further: the host fills one descriptor ([`QpDesc`]) and the kernel
//! posts any number of sends and receives by itself, composing the WQEs, the doorbell record
//! and the doorbell, and polling the CQs (`gds_qp_post_send`, `gds_cq_wait`, ...), as
//! NVSHMEM's IBGDA does. [`PeerDesc`] adds receiver-ready credits on top (`gds_peer_send`,
//! `gds_peer_recv`, ...); the messaging layer builds a table of them, one per peer, and a
//! table of [`RemoteDesc`] per window for kernels' puts and gets (`gds_peer_put`,
//! `gds_peer_get`).

mod device_qp;
mod peer;
mod qp_handover;
mod remote;
pub use device_qp::{
    CqDesc, DeviceQp, DeviceQpProgress, HandOverError, IntoDeviceError, IntoHostError, QpDesc,
};
pub use peer::{PeerDesc, PeerState};
pub use remote::RemoteDesc;

use crate::mem::{gpu_addr_in, RingMem};
use crate::ops::{Op, Ops, WaitCond};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::kernel_header::HEADER;

/// LL messages (`gds_block_ll_pack`, `gds_block_ll_recv` in gdsync.cuh): a small staged
/// payload as 8-byte lines of 4 data bytes and a 4-byte flag, which the receiving kernel polls
/// instead of a marker, then a second read of the bounce.
pub mod ll {
    /// The largest payload an LL message carries (`GDS_LL_MAX`).
    pub const MAX: usize = 1024;

    /// The bytes on the wire (and in each bounce) of an LL message of `len` payload bytes
    /// (`gds_ll_bytes`).
    pub const fn bytes(len: usize) -> usize {
        len.div_ceil(4) * 8
    }
}

/// Return codes of the device functions.
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// A wait timed out.
    pub const TIMEOUT: i32 = 1;
    /// A malformed descriptor or argument.
    pub const INVALID: i32 = 2;
    /// The ring has no free slot (nothing was written): consume completions first.
    pub const FULL: i32 = 3;
    /// A poll found no new completion.
    pub const EMPTY: i32 = 4;
    /// An error completion: `CQE_ERROR | syndrome`.
    pub const CQE_ERROR: i32 = 0x100;

    /// The syndrome an error code carries (`GDS_ERR_CQE | syndrome`), if it is one.
    pub fn syndrome(rc: i32) -> Option<crate::format::Syndrome> {
        if rc & !0xFF == CQE_ERROR {
            crate::format::Syndrome::from_u8((rc & 0xFF) as u8)
        } else {
            None
        }
    }
}

/// Ring a doorbell: fence, store `dbrec_value` at `dbrec`, fence, store `db_value` at `db`, then
/// `rung_value` at `rung` (the QP's "rung to" word, stored after the doorbell; 0: none). Where
/// a CPU proxy rings the doorbell, `dbrec` is 0 and `db` is the proxy's request word (the
/// proxy publishes "rung to").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendDesc {
    /// Address of the send doorbell-record word (0: a CPU proxy rings).
    pub dbrec: u64,
    /// Address of the doorbell register, or of the CPU proxy's request word.
    pub db: u64,
    /// The doorbell value.
    pub db_value: u64,
    /// The doorbell-record value.
    pub dbrec_value: u32,
    /// Zero.
    pub reserved: u32,
    /// Address of the QP's "rung to" word, stored after the doorbell (0: none).
    pub rung: u64,
    /// The "rung to" value: the producer counter the doorbell exposes sends up to.
    pub rung_value: u64,
}
const _: () = assert!(std::mem::size_of::<SendDesc>() == 48);

/// Wait for a 32-bit word, then store the CQ consumer index and retired counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitDesc {
    /// Address of the watched word.
    pub word: u64,
    /// CQ doorbell record (0: none).
    pub ci_rec: u64,
    /// CQ retired counter (0: none).
    pub retired: u64,
    /// Value for `retired`.
    pub retired_value: u64,
    /// Ring retired counter (0: none).
    pub ring_retired: u64,
    /// Value for `ring_retired`.
    pub ring_retired_value: u64,
    /// Operand of the condition.
    pub value: u32,
    /// Condition (GEQ 0, EQ 1, AND 2, NOR 3).
    pub cond: u32,
    /// Value for `ci_rec`.
    pub ci_value: u32,
    /// Zero.
    pub reserved: u32,
}
const _: () = assert!(std::mem::size_of::<WaitDesc>() == 64);

impl SendDesc {
    /// The descriptor for a commit's op list: `Barrier`, `Write32` doorbell record, `Barrier`,
    /// `Doorbell`, `Barrier`, `Write64` "rung to"; or, where a CPU proxy rings, `Barrier`,
    /// `Write64` request. The first four alone (a QP of [`Ringers::Executors`](crate::Ringers),
    /// whose commits store no "rung to"; or with a `Write64` doorbell) give a descriptor whose
    /// send stores nothing after the doorbell.
    /// Addresses are the GPUs' addresses of the memory the list names.
    pub fn from_ops(ops: &Ops) -> Result<Self> {
        let at = |a: &u64| gpu_addr_in(ops.kept(), *a);
        match ops.as_slice() {
            [Op::Barrier, Op::Write32 {
                addr: dbrec,
                value: dbrec_value,
            }, Op::Barrier, Op::Doorbell {
                addr: db,
                value: db_value,
            }, Op::Barrier, Op::Write64 {
                addr: rung,
                value: rung_value,
            }] => Ok(SendDesc {
                dbrec: at(dbrec),
                db: at(db),
                db_value: *db_value,
                dbrec_value: *dbrec_value,
                rung: at(rung),
                rung_value: *rung_value,
                ..Default::default()
            }),
            [Op::Barrier, Op::Write64 {
                addr: db,
                value: db_value,
            }] => Ok(SendDesc {
                db: at(db),
                db_value: *db_value,
                ..Default::default()
            }),
            [Op::Barrier, Op::Write32 {
                addr: dbrec,
                value: dbrec_value,
            }, Op::Barrier, Op::Write64 {
                addr: db,
                value: db_value,
            }
            | Op::Doorbell {
                addr: db,
                value: db_value,
            }] => Ok(SendDesc {
                dbrec: at(dbrec),
                db: at(db),
                db_value: *db_value,
                dbrec_value: *dbrec_value,
                ..Default::default()
            }),
            other => Err(Error::invalid(format!("not a commit op list: {other:?}"))),
        }
    }
}

impl WaitDesc {
    /// The descriptor for a completion wait's op list (`Wait32` on the CQE word, `Write32`
    /// consumer index, `Write64` retired counter, optionally `Write64` ring retired counter;
    /// the barriers between them are the kernel's stores' order, `gds_wait`), at the GPUs'
    /// addresses of the memory the list names.
    pub fn from_ops(ops: &Ops) -> Result<Self> {
        let s = ops.as_slice();
        let (word, value, cond) = match s.first() {
            Some(Op::Wait32 { addr, value, cond }) => (
                gpu_addr_in(ops.kept(), *addr),
                *value,
                WaitCond::code(*cond),
            ),
            _ => return Err(Error::invalid(format!("not a wait op list: {s:?}"))),
        };
        let mut d = WaitDesc {
            word,
            value,
            cond,
            ..Default::default()
        };
        let mut writes64 = 0;
        for op in &s[1..] {
            match *op {
                Op::Barrier => {}
                Op::Write32 { addr, value } if d.ci_rec == 0 => {
                    d.ci_rec = gpu_addr_in(ops.kept(), addr);
                    d.ci_value = value;
                }
                Op::Write64 { addr, value } if writes64 == 0 => {
                    d.retired = gpu_addr_in(ops.kept(), addr);
                    d.retired_value = value;
                    writes64 += 1;
                }
                Op::Write64 { addr, value } if writes64 == 1 => {
                    d.ring_retired = gpu_addr_in(ops.kept(), addr);
                    d.ring_retired_value = value;
                    writes64 += 1;
                }
                _ => {
                    return Err(Error::invalid(format!(
                        "a kernel wait takes one wait and up to three stores: {s:?}"
                    )))
                }
            }
        }
        Ok(d)
    }
}

/// One ring entry: `seq` is written last.
#[repr(C)]
#[derive(Clone, Copy)]
struct DescEntry {
    seq: u64,
    kind: u32,
    reserved: u32,
    body: [u64; 8],
}
const _: () = assert!(std::mem::size_of::<DescEntry>() == 80);

/// The ring as the kernel sees it (`gds_desc_ring`): pass [`DescRing::device_desc`] as a
/// kernel argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingDesc {
    /// Address of the entries.
    pub descs: u64,
    /// Address of the consumed counter.
    pub consumed: u64,
    /// Number of entries.
    pub cap: u32,
    /// Zero.
    pub reserved: u32,
}
const _: () = assert!(std::mem::size_of::<RingDesc>() == 24);
// SAFETY: `#[repr(C)]` plain data laid out as `gds_desc_ring` (the size is asserted above).
unsafe impl crate::cuda::KernelArg for RingDesc {}

/// A ring of descriptors in pinned host memory: the host pushes, a kernel runs them in order
/// (`gds_ring_run(&ring, i, timeout)`).
pub struct DescRing {
    mem: Arc<RingMem>,
    cap: u32,
    pushed: u64,
    /// Op lists of pushed descriptors keep their memory alive until consumed.
    keep: std::collections::VecDeque<(u64, Ops)>,
}

const CONSUMED_OFF: usize = 0;
const ENTRIES_OFF: usize = 64;

impl std::fmt::Debug for DescRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DescRing")
            .field("cap", &self.cap)
            .field("pushed", &self.pushed)
            .finish()
    }
}

impl DescRing {
    /// A ring of `cap` entries, mapped for the GPUs of the process's default CUDA handle
    /// ([`Cuda::get`](crate::cuda::Cuda::get)) where it has any; [`DescRing::with_cuda`]
    /// takes a handle of your own.
    pub fn new(cap: u32) -> Self {
        Self::with_cuda(cap, crate::cuda::Cuda::default_gpus())
    }

    /// A ring of `cap` entries, mapped for the GPUs of `cuda` (`None`: host memory only).
    pub fn with_cuda(cap: u32, cuda: Option<&Arc<crate::cuda::Cuda>>) -> Self {
        let cap = cap.max(1);
        let mem = Arc::new(RingMem::new(ENTRIES_OFF + cap as usize * 80, cuda));
        Self {
            mem,
            cap,
            pushed: 0,
            keep: Default::default(),
        }
    }
    /// What to pass to the kernel.
    pub fn device_desc(&self) -> RingDesc {
        RingDesc {
            descs: self.mem.gpu_addr(ENTRIES_OFF),
            consumed: self.mem.gpu_addr(CONSUMED_OFF),
            cap: self.cap,
            reserved: 0,
        }
    }
    /// Entries the kernel has consumed.
    pub fn consumed(&self) -> u64 {
        self.mem.u64(CONSUMED_OFF).load(Ordering::Acquire)
    }
    /// Entries pushed so far.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }
    /// Whether a push would have to wait for the kernel.
    pub fn is_full(&self) -> bool {
        // Saturating: `consumed` is written by the kernel, and one that overshoots must not
        // wrap the count into "full forever".
        self.pushed.saturating_sub(self.consumed()) >= self.cap as u64
    }
    /// Pushes the send for a commit's op list.
    pub fn push_send(&mut self, ops: Ops, timeout: Duration) -> Result<u64> {
        let d = SendDesc::from_ops(&ops)?;
        let mut body = [0u64; 8];
        body[0] = d.dbrec;
        body[1] = d.db;
        body[2] = d.db_value;
        body[3] = d.dbrec_value as u64;
        body[4] = d.rung;
        body[5] = d.rung_value;
        self.push(1, body, ops, timeout)
    }
    /// Pushes the wait for a completion wait's op list.
    pub fn push_wait(&mut self, ops: Ops, timeout: Duration) -> Result<u64> {
        let d = WaitDesc::from_ops(&ops)?;
        let body = [
            d.word,
            d.ci_rec,
            d.retired,
            d.retired_value,
            d.ring_retired,
            d.ring_retired_value,
            d.value as u64 | (d.cond as u64) << 32,
            d.ci_value as u64,
        ];
        self.push(2, body, ops, timeout)
    }
    fn push(&mut self, kind: u32, body: [u64; 8], ops: Ops, timeout: Duration) -> Result<u64> {
        let start = Instant::now();
        while self.is_full() {
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: "a free descriptor-ring entry (is the kernel running?)".into(),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            std::thread::yield_now();
        }
        let consumed = self.consumed();
        while self.keep.front().is_some_and(|(i, _)| *i < consumed) {
            self.keep.pop_front();
        }
        let i = self.pushed;
        let off = ENTRIES_OFF + (i % self.cap as u64) as usize * 80;
        self.mem.u32(off + 8).store(kind, Ordering::Relaxed);
        for (k, w) in body.iter().enumerate() {
            self.mem.u64(off + 16 + 8 * k).store(*w, Ordering::Relaxed);
        }
        self.mem.u64(off).store(i + 1, Ordering::Release);
        self.keep.push_back((i, ops));
        self.pushed += 1;
        Ok(i)
    }
}

impl Drop for DescRing {
    fn drop(&mut self) {
        // Entries a kernel may still read must stay alive: a ring dropped under a running
        // kernel leaks its memory rather than freeing it.
        if self.consumed() < self.pushed {
            std::mem::forget(self.mem.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::ops_of;
    use std::mem::{offset_of, size_of};

    #[test]
    fn the_ll_constants_are_the_headers() {
        assert!(
            HEADER.contains(&format!("#define GDS_LL_MAX {}\n", ll::MAX)),
            "GDS_LL_MAX in gdsync.cuh differs from ll::MAX"
        );
        assert_eq!(
            [ll::bytes(1), ll::bytes(4), ll::bytes(5), ll::bytes(8)],
            [8, 8, 16, 16]
        );
    }

    /// Every layout the CUDA header asserts (sizes and offsets) matches the Rust types.
    #[test]
    fn header_layouts_match_the_rust_types() {
        let mut checked = 0;
        for line in HEADER.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("GDS_OFFSET_CHECK(") {
                let parts: Vec<&str> = rest
                    .trim_end_matches(");")
                    .split(',')
                    .map(str::trim)
                    .collect();
                let (ty, field, off): (&str, &str, usize) =
                    (parts[0], parts[1], parts[2].parse().unwrap());
                let rust = match (ty, field) {
                    ("gds_send_desc", "dbrec") => offset_of!(SendDesc, dbrec),
                    ("gds_send_desc", "db") => offset_of!(SendDesc, db),
                    ("gds_send_desc", "db_value") => offset_of!(SendDesc, db_value),
                    ("gds_send_desc", "dbrec_value") => offset_of!(SendDesc, dbrec_value),
                    ("gds_send_desc", "rung") => offset_of!(SendDesc, rung),
                    ("gds_send_desc", "rung_value") => offset_of!(SendDesc, rung_value),
                    ("gds_wait_desc", "word") => offset_of!(WaitDesc, word),
                    ("gds_wait_desc", "ci_rec") => offset_of!(WaitDesc, ci_rec),
                    ("gds_wait_desc", "retired") => offset_of!(WaitDesc, retired),
                    ("gds_wait_desc", "retired_value") => offset_of!(WaitDesc, retired_value),
                    ("gds_wait_desc", "ring_retired") => offset_of!(WaitDesc, ring_retired),
                    ("gds_wait_desc", "ring_retired_value") => {
                        offset_of!(WaitDesc, ring_retired_value)
                    }
                    ("gds_wait_desc", "value") => offset_of!(WaitDesc, value),
                    ("gds_wait_desc", "cond") => offset_of!(WaitDesc, cond),
                    ("gds_wait_desc", "ci_value") => offset_of!(WaitDesc, ci_value),
                    ("gds_desc", "seq") => offset_of!(DescEntry, seq),
                    ("gds_desc", "kind") => offset_of!(DescEntry, kind),
                    ("gds_desc", "send") => offset_of!(DescEntry, body),
                    ("gds_desc_ring", "descs") => offset_of!(RingDesc, descs),
                    ("gds_desc_ring", "consumed") => offset_of!(RingDesc, consumed),
                    ("gds_desc_ring", "cap") => offset_of!(RingDesc, cap),
                    ("gds_cq", "cqes") => offset_of!(CqDesc, cqes),
                    ("gds_cq", "dbrec") => offset_of!(CqDesc, dbrec),
                    ("gds_cq", "retired") => offset_of!(CqDesc, retired),
                    ("gds_cq", "wq_retired") => offset_of!(CqDesc, wq_retired),
                    ("gds_cq", "ci") => offset_of!(CqDesc, ci),
                    ("gds_cq", "wq_ci") => offset_of!(CqDesc, wq_ci),
                    ("gds_cq", "entries") => offset_of!(CqDesc, entries),
                    ("gds_cq", "cqn") => offset_of!(CqDesc, cqn),
                    ("gds_qp", "sq") => offset_of!(QpDesc, sq),
                    ("gds_qp", "rq") => offset_of!(QpDesc, rq),
                    ("gds_qp", "dbrec") => offset_of!(QpDesc, dbrec),
                    ("gds_qp", "db") => offset_of!(QpDesc, db),
                    ("gds_qp", "proxy") => offset_of!(QpDesc, proxy),
                    ("gds_qp", "state") => offset_of!(QpDesc, state),
                    ("gds_qp", "sq_pi") => offset_of!(QpDesc, sq_pi),
                    ("gds_qp", "rq_pi") => offset_of!(QpDesc, rq_pi),
                    ("gds_qp", "qpn") => offset_of!(QpDesc, qpn),
                    ("gds_qp", "sq_wqebbs") => offset_of!(QpDesc, sq_wqebbs),
                    ("gds_qp", "rq_wqes") => offset_of!(QpDesc, rq_wqes),
                    ("gds_qp", "rq_stride") => offset_of!(QpDesc, rq_stride),
                    ("gds_qp", "send_cq") => offset_of!(QpDesc, send_cq),
                    ("gds_qp", "recv_cq") => offset_of!(QpDesc, recv_cq),
                    ("gds_peer_state", "sends") => offset_of!(PeerState, sends),
                    ("gds_peer_state", "sends_done") => offset_of!(PeerState, sends_done),
                    ("gds_peer_state", "sends_waited") => offset_of!(PeerState, sends_waited),
                    ("gds_peer_state", "recvs") => offset_of!(PeerState, recvs),
                    ("gds_peer_state", "recvs_waited") => offset_of!(PeerState, recvs_waited),
                    ("gds_peer_state", "error") => offset_of!(PeerState, error),
                    ("gds_peer_state", "one_sided") => offset_of!(PeerState, one_sided),
                    ("gds_peer", "qp") => offset_of!(PeerDesc, qp),
                    ("gds_peer", "credit") => offset_of!(PeerDesc, credit),
                    ("gds_peer", "remote_credit") => offset_of!(PeerDesc, remote_credit),
                    ("gds_peer", "state") => offset_of!(PeerDesc, state),
                    ("gds_peer", "sends") => offset_of!(PeerDesc, sends),
                    ("gds_peer", "sends_done") => offset_of!(PeerDesc, sends_done),
                    ("gds_peer", "sends_waited") => offset_of!(PeerDesc, sends_waited),
                    ("gds_peer", "recvs") => offset_of!(PeerDesc, recvs),
                    ("gds_peer", "recvs_waited") => offset_of!(PeerDesc, recvs_waited),
                    ("gds_peer", "credits") => offset_of!(PeerDesc, credits),
                    ("gds_peer", "remote_credit_rkey") => offset_of!(PeerDesc, remote_credit_rkey),
                    ("gds_peer", "rank") => offset_of!(PeerDesc, rank),
                    ("gds_peer", "error") => offset_of!(PeerDesc, error),
                    ("gds_peer", "credited") => offset_of!(PeerDesc, credited),
                    ("gds_peer", "signaled_pi") => offset_of!(PeerDesc, signaled_pi),
                    ("gds_peer", "signaled_sends") => offset_of!(PeerDesc, signaled_sends),
                    ("gds_peer", "send_bounce") => offset_of!(PeerDesc, send_bounce),
                    ("gds_peer", "recv_bounce") => offset_of!(PeerDesc, recv_bounce),
                    ("gds_peer", "send_bounce_nic") => offset_of!(PeerDesc, send_bounce_nic),
                    ("gds_peer", "recv_bounce_nic") => offset_of!(PeerDesc, recv_bounce_nic),
                    ("gds_peer", "send_bounce_lkey") => offset_of!(PeerDesc, send_bounce_lkey),
                    ("gds_peer", "recv_bounce_lkey") => offset_of!(PeerDesc, recv_bounce_lkey),
                    ("gds_peer", "slot_bytes") => offset_of!(PeerDesc, slot_bytes),
                    ("gds_peer", "send_slots") => offset_of!(PeerDesc, send_slots),
                    ("gds_peer", "recv_slots") => offset_of!(PeerDesc, recv_slots),
                    ("gds_peer", "one_sided") => offset_of!(PeerDesc, one_sided),
                    ("gds_remote", "addr") => offset_of!(RemoteDesc, addr),
                    ("gds_remote", "len") => offset_of!(RemoteDesc, len),
                    ("gds_remote", "rkey") => offset_of!(RemoteDesc, rkey),
                    other => panic!("header checks a field the test does not know: {other:?}"),
                };
                assert_eq!(rust, off, "{ty}.{field}");
                checked += 1;
            } else if let Some(rest) = line.strip_prefix("static_assert(sizeof(") {
                let ty = &rest[..rest.find(')').unwrap()];
                let n: usize = rest[rest.find("== ").unwrap() + 3..]
                    .split(',')
                    .next()
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                let rust = match ty {
                    "gds_send_desc" => size_of::<SendDesc>(),
                    "gds_wait_desc" => size_of::<WaitDesc>(),
                    "gds_desc" => size_of::<DescEntry>(),
                    "gds_desc_ring" => size_of::<RingDesc>(),
                    "gds_cq" => size_of::<CqDesc>(),
                    "gds_qp" => size_of::<QpDesc>(),
                    "gds_peer_state" => size_of::<PeerState>(),
                    "gds_peer" => size_of::<PeerDesc>(),
                    "gds_remote" => size_of::<RemoteDesc>(),
                    other => panic!("unknown type {other}"),
                };
                assert_eq!(rust, n, "sizeof {ty}");
                checked += 1;
            }
        }
        assert_eq!(
            checked, 88,
            "every layout assertion of the header was checked"
        );
    }

    /// A commit's list as commits make it: barrier, record, barrier, doorbell, then a barrier
    /// and "rung to" at `rung` (address, value) where the QP's commits store it.
    fn commit_ops(rung: Option<(u64, u64)>) -> Ops {
        let mut list = vec![
            Op::Barrier,
            Op::Write32 {
                addr: 0x1000,
                value: 0x0600_0000,
            },
            Op::Barrier,
            Op::Doorbell {
                addr: 0x2008,
                value: 0x0323_0100_0805_0000,
            },
        ];
        if let Some((addr, value)) = rung {
            list.extend([Op::Barrier, Op::Write64 { addr, value }]);
        }
        // SAFETY: the ops are only converted, never run.
        unsafe { ops_of(&list) }
    }

    /// A commit that stores "rung to" gives a descriptor that stores it after the doorbell.
    #[test]
    fn send_descriptor_carries_rung_to() {
        assert_eq!(
            SendDesc::from_ops(&commit_ops(Some((0x3140, 6)))).unwrap(),
            SendDesc {
                dbrec: 0x1000,
                db: 0x2008,
                db_value: 0x0323_0100_0805_0000,
                dbrec_value: 0x0600_0000,
                reserved: 0,
                rung: 0x3140,
                rung_value: 6
            }
        );
    }

    /// A commit of a QP whose commits store no "rung to" (barrier, record, barrier, doorbell)
    /// gives a descriptor that stores nothing after the doorbell.
    #[test]
    fn send_descriptor_without_rung_to() {
        let d = SendDesc::from_ops(&commit_ops(None)).unwrap();
        assert_eq!(
            (d.dbrec, d.db, d.rung, d.rung_value),
            (0x1000, 0x2008, 0, 0)
        );
    }

    /// The descriptors a commit and a completion wait produce carry exactly their ops.
    #[test]
    fn descriptors_mirror_op_lists() {
        // SAFETY (these three lists): the ops are only converted, never run.
        let ops = unsafe {
            ops_of(&[
                Op::Barrier,
                Op::Write32 {
                    addr: 0x1000,
                    value: 0x0600_0000,
                },
                Op::Barrier,
                Op::Write64 {
                    addr: 0x2008,
                    value: 0x0323_0100_0805_0000,
                },
            ])
        };
        let d = SendDesc::from_ops(&ops).unwrap();
        assert_eq!(
            d,
            SendDesc {
                dbrec: 0x1000,
                db: 0x2008,
                db_value: 0x0323_0100_0805_0000,
                dbrec_value: 0x0600_0000,
                reserved: 0,
                rung: 0,
                rung_value: 0
            }
        );
        assert!(WaitDesc::from_ops(&ops).is_err());
        // Where a CPU proxy rings: one request store after the barrier.
        // SAFETY: as above.
        let proxied = unsafe {
            ops_of(&[
                Op::Barrier,
                Op::Write64 {
                    addr: 0x7000,
                    value: 1,
                },
            ])
        };
        assert_eq!(
            SendDesc::from_ops(&proxied).unwrap(),
            SendDesc {
                dbrec: 0,
                db: 0x7000,
                db_value: 1,
                dbrec_value: 0,
                reserved: 0,
                rung: 0,
                rung_value: 0
            }
        );
        // SAFETY: as above.
        let w = unsafe {
            ops_of(&[
                Op::Wait32 {
                    addr: 0x3000 + 60,
                    value: 0xFEFF_FFFF,
                    cond: WaitCond::Nor,
                },
                Op::Write32 {
                    addr: 0x4000,
                    value: 0x0100_0000,
                },
                Op::Write64 {
                    addr: 0x4040,
                    value: 1,
                },
                Op::Write64 {
                    addr: 0x5040,
                    value: 4,
                },
            ])
        };
        let d = WaitDesc::from_ops(&w).unwrap();
        assert_eq!((d.word, d.value, d.cond), (0x303c, 0xFEFF_FFFF, 3));
        assert_eq!(
            (
                d.ci_rec,
                d.ci_value,
                d.retired,
                d.retired_value,
                d.ring_retired,
                d.ring_retired_value
            ),
            (0x4000, 0x0100_0000, 0x4040, 1, 0x5040, 4)
        );
        assert!(SendDesc::from_ops(&w).is_err());
    }
}
