//! Queue pairs: create (sizes), endpoints as strings for out-of-band exchange, connect, and
//! CPU posts of sends, RDMA writes and reads, atomics and receives.

use crate::args;
use crate::device::{gdasync_cq, gdasync_pd};
use crate::handle::{self, handle_impl};
use crate::status::{guard, Fail, Res, GDASYNC_ERR_STATE, GDASYNC_OK};
use gdsync::{
    Qp, QpConfig, RecvTicket, RecvWr, RemoteAddr, SendFlags, SendTicket, SendWr, Sge, WrOp,
};
use parking_lot::Mutex;
use std::ffi::{c_char, c_int};
use std::sync::Arc;
use std::time::Duration;

/// A reliable-connected queue pair. Thread-safe: calls on one QP from several threads are
/// serialised by the library (posts from one thread keep their order).
pub struct gdasync_qp {
    _opaque: [u8; 0],
}
/// The QP, shared by calls in flight; posting needs it exclusively.
pub(crate) type SharedQp = Arc<Mutex<HeldQp>>;
handle_impl!(gdasync_qp, 4, SharedQp);

/// Who drives a QP: the CPU, or a GPU kernel (`gdasync_qp_to_kernel`).
pub(crate) enum HeldQp {
    /// The CPU posts and polls.
    Host(Qp),
    /// A kernel does, through the descriptor.
    Kernel(gdsync::kernel::DeviceQp),
    /// Only while a hand-over holds the lock (left behind only by a bug in it).
    Moving,
}

impl HeldQp {
    /// The QP, where the CPU drives it.
    pub(crate) fn host(&mut self) -> Res<&mut Qp> {
        match self {
            HeldQp::Host(q) => Ok(q),
            HeldQp::Kernel(q) => Err(Fail::new(
                GDASYNC_ERR_STATE,
                format!(
                    "QP {:#x} is driven by a GPU kernel (gdasync_qp_to_kernel): the CPU cannot post on it nor wait for it; take it back with gdasync_qp_to_host",
                    q.qpn()
                ),
            )),
            HeldQp::Moving => Err(HeldQp::lost()),
        }
    }

    /// The QP's number.
    pub(crate) fn qpn(&self) -> Res<u32> {
        match self {
            HeldQp::Host(q) => Ok(q.qpn()),
            HeldQp::Kernel(q) => Ok(q.qpn()),
            HeldQp::Moving => Err(HeldQp::lost()),
        }
    }

    fn lost() -> Fail {
        Fail::new(
            crate::status::GDASYNC_ERR_INTERNAL,
            "the QP was lost by a failed hand-over between the CPU and a kernel (a bug in gdasync): destroy it",
        )
    }
}

/// Runs `f` on the QP `h` names, which the CPU must be driving; calls on one QP are
/// serialised.
pub(crate) fn with_host<R>(h: *mut gdasync_qp, f: impl FnOnce(&mut Qp) -> Res<R>) -> Res<R> {
    let qp = handle::get(h, "qp")?;
    let mut held = qp.lock();
    f(held.host()?)
}

/// Room an endpoint string needs, its NUL included.
pub const GDASYNC_ENDPOINT_MAX: usize = 256;
/// Most scatter/gather entries in one work request.
pub const GDASYNC_MAX_SGE: u32 = 16;

/// Sizes and settings of a new QP; a field left 0 takes its default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_qp_attr {
    /// Send ring size in 64-byte blocks (default 256).
    pub send_wqebbs: u32,
    /// Receive ring size in receives (default 256).
    pub recv_wqes: u32,
    /// Most SGEs per receive (default 4).
    pub max_recv_sge: u32,
    /// Most bytes of inline payload per send (default 220).
    pub max_inline: u32,
    /// Milliseconds outstanding work may go without an answer from the peer before it
    /// completes with an error (default 5000).
    pub timeout_ms: u32,
    /// Zero.
    pub reserved: u32,
}

/// A scatter/gather entry: `length` bytes at `addr` of the region with local key `lkey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// A send-queue work request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gdasync_send_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `GDASYNC_WR_*`.
    pub opcode: u32,
    /// `GDASYNC_SEND_*` flags.
    pub flags: u32,
    /// The gather list (the scatter list of reads; the result word of atomics).
    pub sg_list: *const gdasync_sge,
    /// Entries in `sg_list` (at most `GDASYNC_MAX_SGE`).
    pub num_sge: u32,
    /// Immediate data (`GDASYNC_WR_SEND_WITH_IMM`, `GDASYNC_WR_RDMA_WRITE_WITH_IMM`).
    pub imm_data: u32,
    /// The peer's address (writes, reads, atomics).
    pub remote_addr: u64,
    /// The peer region's remote key.
    pub rkey: u32,
    /// Zero.
    pub reserved: u32,
    /// The value to add (fetch-and-add) or compare with (compare-and-swap).
    pub compare_add: u64,
    /// The value stored by compare-and-swap.
    pub swap: u64,
}

/// A send.
pub const GDASYNC_WR_SEND: u32 = 0;
/// A send with immediate data.
pub const GDASYNC_WR_SEND_WITH_IMM: u32 = 1;
/// An RDMA write.
pub const GDASYNC_WR_RDMA_WRITE: u32 = 2;
/// An RDMA write with immediate data (consumes a receive at the peer).
pub const GDASYNC_WR_RDMA_WRITE_WITH_IMM: u32 = 3;
/// An RDMA read.
pub const GDASYNC_WR_RDMA_READ: u32 = 4;
/// An 8-byte fetch-and-add.
pub const GDASYNC_WR_ATOMIC_FETCH_AND_ADD: u32 = 5;
/// An 8-byte compare-and-swap.
pub const GDASYNC_WR_ATOMIC_CMP_AND_SWP: u32 = 6;
/// No operation (completes in order).
pub const GDASYNC_WR_NOP: u32 = 7;

/// Write a completion on success (errors always complete).
pub const GDASYNC_SEND_SIGNALED: u32 = 1;
/// Copy the payload into the work request at post time.
pub const GDASYNC_SEND_INLINE: u32 = 2;
/// Wait for earlier reads and atomics first.
pub const GDASYNC_SEND_FENCE: u32 = 4;
/// Solicited event at the responder.
pub const GDASYNC_SEND_SOLICITED: u32 = 8;

/// Identifies a posted send: its place in the ring and, where it is known in advance, its
/// completion's number on the send CQ (what a stream wait needs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_send_ticket {
    /// Producer counter of the request's first block.
    pub index: u64,
    /// Producer counter just after it.
    pub end: u64,
    /// Its completion's number (valid where `has_cqe` is 1).
    pub cqe: u64,
    /// 1 where the send is signalled and the send CQ serves this QP's sends only.
    pub has_cqe: u32,
    /// Zero.
    pub reserved: u32,
}

/// Identifies a posted receive and, where known in advance, its completion's number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_recv_ticket {
    /// Receive counter.
    pub index: u64,
    /// Its completion's number (valid where `has_cqe` is 1).
    pub cqe: u64,
    /// 1 where the receive CQ serves this QP's receives only.
    pub has_cqe: u32,
    /// Zero.
    pub reserved: u32,
}

/// A completion number as the tickets carry it in C: the number and whether it is known.
fn cqe_to_c(cqe: Option<u64>) -> (u64, u32) {
    (cqe.unwrap_or(0), cqe.is_some() as u32)
}

impl From<SendTicket> for gdasync_send_ticket {
    fn from(t: SendTicket) -> Self {
        let (cqe, has_cqe) = cqe_to_c(t.cqe);
        let (index, end, reserved) = (t.index, t.end, 0);
        Self {
            index,
            end,
            cqe,
            has_cqe,
            reserved,
        }
    }
}

impl From<gdasync_send_ticket> for SendTicket {
    fn from(t: gdasync_send_ticket) -> Self {
        let cqe = (t.has_cqe != 0).then_some(t.cqe);
        Self {
            index: t.index,
            end: t.end,
            cqe,
        }
    }
}

impl From<RecvTicket> for gdasync_recv_ticket {
    fn from(t: RecvTicket) -> Self {
        let (cqe, has_cqe) = cqe_to_c(t.cqe);
        Self {
            index: t.index,
            cqe,
            has_cqe,
            reserved: 0,
        }
    }
}

impl From<gdasync_recv_ticket> for RecvTicket {
    fn from(t: gdasync_recv_ticket) -> Self {
        let cqe = (t.has_cqe != 0).then_some(t.cqe);
        Self {
            index: t.index,
            cqe,
        }
    }
}

/// The QP settings `attr` asks for (NULL: the defaults).
fn config(attr: *const gdasync_qp_attr) -> Res<QpConfig> {
    let mut cfg = QpConfig::default();
    if attr.is_null() {
        return Ok(cfg);
    }
    let a = args::read(attr, "attr")?;
    let pick = |v: u32, d: u32| if v == 0 { d } else { v };
    cfg.send_wqebbs = pick(a.send_wqebbs, cfg.send_wqebbs);
    cfg.recv_wqes = pick(a.recv_wqes, cfg.recv_wqes);
    cfg.max_recv_sge = pick(a.max_recv_sge, cfg.max_recv_sge);
    cfg.max_inline = pick(a.max_inline, cfg.max_inline);
    if a.timeout_ms != 0 {
        cfg.timeout = Duration::from_millis(a.timeout_ms.into());
    }
    Ok(cfg)
}

/// Creates a QP of `pd` on `send_cq` and `recv_cq` (which may be the same CQ), sized by
/// `attr` (NULL: defaults). It takes receives at once; it sends once connected.
#[no_mangle]
pub extern "C" fn gdasync_qp_create(
    pd: *mut gdasync_pd,
    send_cq: *mut gdasync_cq,
    recv_cq: *mut gdasync_cq,
    attr: *const gdasync_qp_attr,
    out: *mut *mut gdasync_qp,
) -> c_int {
    guard("gdasync_qp_create", || {
        args::check_ptr(out, "out")?;
        let cfg = config(attr)?;
        let (pd, scq) = (handle::get(pd, "pd")?, handle::get(send_cq, "send_cq")?);
        let rcq = handle::get(recv_cq, "recv_cq")?;
        let qp = pd.create_qp(&scq, &rcq, &cfg)?;
        let held = Arc::new(Mutex::new(HeldQp::Host(qp)));
        args::write(out, handle::insert(held)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Destroys `qp`: its outstanding work is flushed.
#[no_mangle]
pub extern "C" fn gdasync_qp_destroy(qp: *mut gdasync_qp) -> c_int {
    guard("gdasync_qp_destroy", || {
        handle::remove(qp, "qp")?;
        Ok(GDASYNC_OK)
    })
}

/// The QP's number.
#[no_mangle]
pub extern "C" fn gdasync_qp_num(qp: *mut gdasync_qp, out: *mut u32) -> c_int {
    guard("gdasync_qp_num", || {
        let n = handle::get(qp, "qp")?.lock().qpn()?;
        args::write(out, n, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Writes the QP's endpoint, a string of at most `GDASYNC_ENDPOINT_MAX` bytes with its NUL,
/// into `buf` of `len` bytes. Hand it to the peer (a socket, a file, MPI), which connects
/// to it.
#[no_mangle]
pub extern "C" fn gdasync_qp_endpoint(qp: *mut gdasync_qp, buf: *mut c_char, len: usize) -> c_int {
    guard("gdasync_qp_endpoint", || {
        let ep = with_host(qp, |q| Ok(q.endpoint().to_string()))?;
        args::copy_string(&ep, buf, len, "the endpoint")?;
        Ok(GDASYNC_OK)
    })
}

/// Connects `qp` to the peer QP whose endpoint string is `endpoint`.
#[no_mangle]
pub extern "C" fn gdasync_qp_connect(qp: *mut gdasync_qp, endpoint: *const c_char) -> c_int {
    guard("gdasync_qp_connect", || {
        let qp = handle::get(qp, "qp")?;
        let ep: gdsync::Endpoint = args::string(endpoint, "endpoint")?.parse()?;
        qp.lock().host()?.connect(&ep)?;
        Ok(GDASYNC_OK)
    })
}

/// The scatter/gather list a C array names.
fn sges(p: *const gdasync_sge, n: u32, what: &str) -> Res<Vec<Sge>> {
    let list = args::array(p, n as usize, GDASYNC_MAX_SGE as usize, what)?;
    Ok(list
        .iter()
        .map(|g| Sge {
            addr: g.addr,
            len: g.length,
            lkey: g.lkey,
        })
        .collect())
}

/// The work request a C one describes.
pub(crate) fn send_wr(wr: *const gdasync_send_wr) -> Res<SendWr> {
    let w = args::read(wr, "wr")?;
    let remote = RemoteAddr {
        addr: w.remote_addr,
        rkey: w.rkey,
    };
    let op = match w.opcode {
        GDASYNC_WR_SEND => WrOp::Send,
        GDASYNC_WR_SEND_WITH_IMM => WrOp::SendImm(w.imm_data),
        GDASYNC_WR_RDMA_WRITE => WrOp::Write(remote),
        GDASYNC_WR_RDMA_WRITE_WITH_IMM => WrOp::WriteImm(remote, w.imm_data),
        GDASYNC_WR_RDMA_READ => WrOp::Read(remote),
        GDASYNC_WR_ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd {
            remote,
            add: w.compare_add,
        },
        GDASYNC_WR_ATOMIC_CMP_AND_SWP => WrOp::CompareSwap {
            remote,
            compare: w.compare_add,
            swap: w.swap,
        },
        GDASYNC_WR_NOP => WrOp::Nop,
        o => {
            return Err(Fail::invalid(format!(
                "wr->opcode {o} is no GDASYNC_WR_ opcode"
            )))
        }
    };
    let flags = SendFlags::from_bits(w.flags)
        .filter(|f| !f.contains(SendFlags::INLINE_HOST))
        .ok_or_else(|| {
            Fail::invalid(format!(
                "wr->flags {:#x} has bits that are no GDASYNC_SEND_ flag",
                w.flags
            ))
        })?;
    let mut s = SendWr::nop()
        .wr_id(w.wr_id)
        .sges(&sges(w.sg_list, w.num_sge, "wr->sg_list")?);
    s.op = op;
    s.flags = flags;
    Ok(s)
}

/// Posts a send-queue work request from the CPU; its ticket goes to `ticket` (may be NULL).
#[no_mangle]
pub extern "C" fn gdasync_qp_post_send(
    qp: *mut gdasync_qp,
    wr: *const gdasync_send_wr,
    ticket: *mut gdasync_send_ticket,
) -> c_int {
    guard("gdasync_qp_post_send", || {
        let wr = send_wr(wr)?;
        let t = with_host(qp, |q| Ok(q.post_send(&wr)?))?;
        args::write_opt(ticket, t.into(), "ticket")?;
        Ok(GDASYNC_OK)
    })
}

/// Posts a receive of `num_sge` entries at `sg_list` (none: for zero-length sends and RDMA
/// writes with immediate); its ticket goes to `ticket` (may be NULL).
#[no_mangle]
pub extern "C" fn gdasync_qp_post_recv(
    qp: *mut gdasync_qp,
    wr_id: u64,
    sg_list: *const gdasync_sge,
    num_sge: u32,
    ticket: *mut gdasync_recv_ticket,
) -> c_int {
    guard("gdasync_qp_post_recv", || {
        let mut wr = RecvWr::new().wr_id(wr_id);
        wr.sges.extend(sges(sg_list, num_sge, "sg_list")?);
        let t = with_host(qp, |q| Ok(q.post_recv(&wr)?))?;
        args::write_opt(ticket, t.into(), "ticket")?;
        Ok(GDASYNC_OK)
    })
}
