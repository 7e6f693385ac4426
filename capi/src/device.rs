//! Devices, protection domains and completion queues: open and close, allocate and free,
//! create, poll and wait.

use crate::args;
use crate::handle::{self, handle_impl};
use crate::status::{guard, Fail, GDASYNC_OK};
use gdsync::{Completion, WcStatus};
use std::ffi::{c_char, c_int};
use std::time::Duration;

/// An RDMA device (a soft device, or an mlx5 port). Thread-safe: any thread may use it.
/// Closing it while PDs, CQs or QPs made from it live is allowed: they keep the device open
/// until the last of them is destroyed.
pub struct gdasync_device {
    _opaque: [u8; 0],
}
handle_impl!(gdasync_device, 1, gdsync::Device);

/// A protection domain. Thread-safe. Freeing it while its MRs and QPs live is allowed: they
/// keep it until the last of them is destroyed.
pub struct gdasync_pd {
    _opaque: [u8; 0],
}
handle_impl!(gdasync_pd, 2, gdsync::ProtectionDomain);

/// A completion queue. Thread-safe; polls from several threads each take different
/// completions. Destroying it while QPs use it is allowed: they keep it until destroyed.
pub struct gdasync_cq {
    _opaque: [u8; 0],
}
handle_impl!(gdasync_cq, 3, gdsync::Cq);

/// A completion, as `gdasync_cq_poll` and `gdasync_cq_wait` return it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdasync_wc {
    /// The work request's id.
    pub wr_id: u64,
    /// `GDASYNC_WC_SUCCESS` (0), or the device's error syndrome (`GDASYNC_WC_*_ERR`).
    pub status: u32,
    /// What completed (`GDASYNC_WC_OP_*`).
    pub opcode: u32,
    /// Bytes received (receives) or read (RDMA reads; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data, host order (valid where `has_imm` is 1).
    pub imm_data: u32,
    /// 1 where the completion carries immediate data.
    pub has_imm: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The remote QP number (receives).
    pub src_qp: u32,
    /// The vendor syndrome of an error completion.
    pub vendor_err: u32,
}

/// Success.
pub const GDASYNC_WC_SUCCESS: u32 = 0;
/// Error status: the message was longer than the receive buffer (LOC_LEN_ERR).
pub const GDASYNC_WC_LOC_LEN_ERR: u32 = 0x01;
/// Error status: a malformed work request (LOC_QP_OP_ERR).
pub const GDASYNC_WC_LOC_QP_OP_ERR: u32 = 0x02;
/// Error status: a local key, bound or access right is wrong (LOC_PROT_ERR).
pub const GDASYNC_WC_LOC_PROT_ERR: u32 = 0x04;
/// Error status: the QP was in error; the work was not executed (WR_FLUSH_ERR).
pub const GDASYNC_WC_WR_FLUSH_ERR: u32 = 0x05;
/// Error status: the responder rejected the request (REM_INV_REQ_ERR).
pub const GDASYNC_WC_REM_INV_REQ_ERR: u32 = 0x12;
/// Error status: bad rkey, out of bounds, or no remote right (REM_ACCESS_ERR).
pub const GDASYNC_WC_REM_ACCESS_ERR: u32 = 0x13;
/// Error status: the responder could not complete the operation (REM_OP_ERR).
pub const GDASYNC_WC_REM_OP_ERR: u32 = 0x14;
/// Error status: the peer stopped answering (RETRY_EXC_ERR).
pub const GDASYNC_WC_RETRY_EXC_ERR: u32 = 0x15;
/// Error status: the responder had no receive posted (RNR_RETRY_EXC_ERR).
pub const GDASYNC_WC_RNR_RETRY_EXC_ERR: u32 = 0x16;
/// A completion's opcode: a send (requester).
pub const GDASYNC_WC_OP_SEND: u32 = 0;
/// An RDMA write (requester).
pub const GDASYNC_WC_OP_RDMA_WRITE: u32 = 1;
/// An RDMA read (requester).
pub const GDASYNC_WC_OP_RDMA_READ: u32 = 2;
/// A compare-and-swap (requester).
pub const GDASYNC_WC_OP_COMP_SWAP: u32 = 3;
/// A fetch-and-add (requester).
pub const GDASYNC_WC_OP_FETCH_ADD: u32 = 4;
/// A no-op (requester).
pub const GDASYNC_WC_OP_NOP: u32 = 5;
/// A send arrived (responder).
pub const GDASYNC_WC_OP_RECV: u32 = 128;
/// An RDMA write with immediate arrived (responder).
pub const GDASYNC_WC_OP_RECV_RDMA_WITH_IMM: u32 = 129;

impl From<Completion> for gdasync_wc {
    fn from(c: Completion) -> gdasync_wc {
        use gdsync::CompletionOp::*;
        gdasync_wc {
            wr_id: c.wr_id,
            status: match c.status {
                WcStatus::Success => GDASYNC_WC_SUCCESS,
                WcStatus::Error(s) => u8::from(s) as u32,
            },
            opcode: match c.opcode {
                Send => GDASYNC_WC_OP_SEND,
                Write => GDASYNC_WC_OP_RDMA_WRITE,
                Read => GDASYNC_WC_OP_RDMA_READ,
                CompareSwap => GDASYNC_WC_OP_COMP_SWAP,
                FetchAdd => GDASYNC_WC_OP_FETCH_ADD,
                Nop => GDASYNC_WC_OP_NOP,
                Recv => GDASYNC_WC_OP_RECV,
                RecvWriteImm => GDASYNC_WC_OP_RECV_RDMA_WITH_IMM,
            },
            byte_len: c.byte_len,
            imm_data: c.imm.unwrap_or(0),
            has_imm: c.imm.is_some() as u32,
            qp_num: c.qpn,
            src_qp: c.src_qpn,
            vendor_err: c.vendor_err as u32,
        }
    }
}

/// Opens a device: `"soft"` (a new soft device), `"mlx5_0"` or `"mlx5_0:2"` (an RDMA device
/// and port; without a port its first active one), or NULL / `""` for the default (the one
/// `GDSYNC_DEVICE` names, else the first active mlx5 port, else a soft device).
#[no_mangle]
pub extern "C" fn gdasync_device_open(name: *const c_char, out: *mut *mut gdasync_device) -> c_int {
    guard("gdasync_device_open", || {
        args::check_ptr(out, "out")?;
        let dev = match args::opt_string(name, "name")? {
            None | Some("") => gdsync::Device::default()?,
            Some(n) => gdsync::Device::open(n)?,
        };
        args::write(out, handle::insert(dev)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Writes the device's name (`"soft"`, `"mlx5_0"`) and a NUL into `buf` of `len` bytes.
#[no_mangle]
pub extern "C" fn gdasync_device_name(
    dev: *mut gdasync_device,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard("gdasync_device_name", || {
        let d = handle::get(dev, "dev")?;
        args::copy_string(&d.info().name, buf, len, "the device name")?;
        Ok(GDASYNC_OK)
    })
}

/// Closes the handle `dev`; the device closes once nothing made from it is left.
#[no_mangle]
pub extern "C" fn gdasync_device_close(dev: *mut gdasync_device) -> c_int {
    guard("gdasync_device_close", || {
        handle::remove(dev, "dev")?;
        Ok(GDASYNC_OK)
    })
}

/// Allocates a protection domain on `dev`.
#[no_mangle]
pub extern "C" fn gdasync_pd_alloc(dev: *mut gdasync_device, out: *mut *mut gdasync_pd) -> c_int {
    guard("gdasync_pd_alloc", || {
        args::check_ptr(out, "out")?;
        let pd = handle::get(dev, "dev")?.alloc_pd();
        args::write(out, handle::insert(pd)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Frees the handle `pd`.
#[no_mangle]
pub extern "C" fn gdasync_pd_free(pd: *mut gdasync_pd) -> c_int {
    guard("gdasync_pd_free", || {
        handle::remove(pd, "pd")?;
        Ok(GDASYNC_OK)
    })
}

/// Creates a completion queue of at least `entries` completions (rounded up to a power of
/// two).
#[no_mangle]
pub extern "C" fn gdasync_cq_create(
    dev: *mut gdasync_device,
    entries: u32,
    out: *mut *mut gdasync_cq,
) -> c_int {
    guard("gdasync_cq_create", || {
        args::check_ptr(out, "out")?;
        let cq = handle::get(dev, "dev")?.create_cq(entries)?;
        args::write(out, handle::insert(cq)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Destroys the handle `cq`.
#[no_mangle]
pub extern "C" fn gdasync_cq_destroy(cq: *mut gdasync_cq) -> c_int {
    guard("gdasync_cq_destroy", || {
        handle::remove(cq, "cq")?;
        Ok(GDASYNC_OK)
    })
}

/// Most completions one poll returns.
const MAX_POLL: usize = 1 << 16;

/// Polls up to `max` completions into `wc` (room for `max`); returns how many (0: none yet),
/// or a negative status. An error completion is returned like any other, its `status` set.
#[no_mangle]
pub extern "C" fn gdasync_cq_poll(cq: *mut gdasync_cq, wc: *mut gdasync_wc, max: c_int) -> c_int {
    guard("gdasync_cq_poll", || {
        let max = usize::try_from(max).map_err(|_| Fail::invalid("max is negative"))?;
        args::fill(wc, max, MAX_POLL, None::<gdasync_wc>, "wc")?;
        let cq = handle::get(cq, "cq")?;
        let mut got = Vec::with_capacity(max.min(64));
        cq.poll(&mut got, max)?;
        let n = args::fill(wc, max, MAX_POLL, got.into_iter().map(Into::into), "wc")?;
        Ok(n as c_int)
    })
}

/// Waits up to `timeout_ms` milliseconds for one completion and stores it in `wc`. The
/// completion may carry an error status: check `wc->status`.
#[no_mangle]
pub extern "C" fn gdasync_cq_wait(
    cq: *mut gdasync_cq,
    wc: *mut gdasync_wc,
    timeout_ms: u32,
) -> c_int {
    guard("gdasync_cq_wait", || {
        args::check_ptr(wc, "wc")?;
        let cq = handle::get(cq, "cq")?;
        let c = cq.wait_one(Duration::from_millis(timeout_ms.into()))?;
        args::write(wc, c.into(), "wc")?;
        Ok(GDASYNC_OK)
    })
}
