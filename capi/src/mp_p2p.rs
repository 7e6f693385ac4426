//! mp.h's registrations and two-sided messages: `mp_register`/`mp_deregister`,
//! `mp_isend`/`mp_irecv` matched per peer in order, and waiting for and progressing requests.

use crate::args;
use crate::handle::{self, handle_impl};
use crate::mp_buf::Src;
use crate::mp_state::{mp_guard, with_comm};
use crate::mr::SharedMr;
use crate::status::{Fail, Res};
use gdsync::{Access, Sge};
use parking_lot::Mutex;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A registration (`mp_reg_t` is a pointer to one).
pub struct mp_reg {
    _opaque: [u8; 0],
}
handle_impl!(mp_reg, 9, SharedMr);

/// A request (`mp_request_t` is a pointer to one): released by `mp_wait`/`mp_wait_all`.
pub struct mp_request {
    _opaque: [u8; 0],
}
/// A request: prepared (not posted yet), pending, or seen complete by `mp_progress_all`
/// (not yet released).
pub(crate) enum MpReq {
    Prepared(Prepared),
    Pending(mp::Request),
    Done,
}

/// An operation prepared, not yet posted (`mp_prepare.rs`).
pub(crate) enum Prepared {
    /// A send of `sge` to `peer`.
    Send { sge: Sge, peer: usize },
    /// A put of `sge` into `peer`'s part of `window` at byte `displ`.
    Put {
        sge: Sge,
        window: Arc<(mp::Window, gdsync::MemoryRegion<'static>)>,
        peer: usize,
        displ: u64,
    },
}

/// Refuses a request that was prepared and never posted (nothing to wait for).
pub(crate) fn posted(r: &MpReq) -> Res<()> {
    match r {
        MpReq::Prepared(_) => Err(Fail::invalid(
            "a request was prepared and never posted: post it on a stream first (mp_isend_post_on_stream, mp_iput_post_on_stream)",
        )),
        _ => Ok(()),
    }
}
/// The request, shared by calls in flight.
pub(crate) type SharedReq = Arc<Mutex<MpReq>>;
handle_impl!(mp_request, 10, SharedReq);

/// The handle `p` points to (an `mp_reg_t *` or `mp_request_t *` argument).
pub(crate) fn deref_handle<T>(p: *mut *mut T, what: &str) -> Res<*mut T> {
    args::read(p as *const *mut T, what)
}

/// Hands a new request to C at `req`.
pub(crate) fn give_request(r: mp::Request, req: *mut *mut mp_request) -> Res<()> {
    let h = handle::insert::<mp_request>(Arc::new(Mutex::new(MpReq::Pending(r))))?;
    args::write(req, h, "req")
}

/// The SGE for `size` bytes at `buf`, which must lie inside the registration `reg` names.
pub(crate) fn sge_in(buf: *mut c_void, size: c_int, reg: *mut *mut mp_reg) -> Res<Sge> {
    let len = u32::try_from(size).map_err(|_| Fail::invalid(format!("size {size} is negative")))?;
    let mr = handle::get(deref_handle(reg, "mp_reg")?, "*mp_reg")?;
    let (addr, start) = (buf as u64, mr.addr());
    let inside = addr >= start
        && addr
            .checked_add(len.into())
            .is_some_and(|e| e <= start + mr.len() as u64);
    if !inside {
        return Err(Fail::invalid(format!(
            "{size} bytes at {addr:#x} are not inside the registration ({} bytes at {start:#x})",
            mr.len()
        )));
    }
    Ok(Sge {
        addr,
        len,
        lkey: mr.lkey(),
    })
}

/// A peer's rank as a usize.
pub(crate) fn rank(peer: c_int) -> Res<usize> {
    usize::try_from(peer).map_err(|_| Fail::invalid(format!("peer {peer} is negative")))
}

/// Registers `length` bytes at `addr` (host memory, or GPU memory the device reaches) for
/// sends, receives and windows; the handle goes to `*reg`. The memory must stay allocated
/// until `mp_deregister`.
#[no_mangle]
pub extern "C" fn mp_register(addr: *mut c_void, length: usize, reg: *mut *mut mp_reg) -> c_int {
    mp_guard("mp_register", || {
        args::check_ptr(reg, "reg")?;
        let pd = with_comm(|c| Ok(c.pd().clone()))?;
        // SAFETY: the header's contract: the memory stays allocated until mp_deregister.
        let mr = unsafe { pd.register_raw(addr.cast(), length, Access::ALL)? };
        args::write(reg, handle::insert::<mp_reg>(Arc::new(mr))?, "reg")
    })
}

/// Deregisters `*reg` and sets it to NULL.
#[no_mangle]
pub extern "C" fn mp_deregister(reg: *mut *mut mp_reg) -> c_int {
    mp_guard("mp_deregister", || {
        handle::remove(deref_handle(reg, "reg")?, "*reg")?;
        args::write(reg, std::ptr::null_mut(), "reg")
    })
}

/// A two-sided call: `post` with the SGE `src` names in `reg` and the peer; the request goes
/// to `*req`.
pub(crate) fn two_sided(
    what: &str,
    (src, peer): (Src, c_int),
    reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
    post: fn(&mut mp::Comm, Sge, usize) -> gdsync::Result<mp::Request>,
) -> c_int {
    mp_guard(what, || {
        args::check_ptr(req, "req")?;
        let (buf, size) = src.buffer()?;
        let sge = sge_in(buf, size, reg)?;
        let r = with_comm(|c| Ok(post(c, sge, rank(peer)?)?))?;
        give_request(r, req)
    })
}

/// Posts a receive of up to `size` bytes at `buf` (inside `*reg`) for the next message from
/// `peer`; the request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_irecv(
    buf: *mut c_void,
    size: c_int,
    peer: c_int,
    reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    two_sided(
        "mp_irecv",
        (Src::Buf(buf, size), peer),
        reg,
        req,
        mp::Comm::irecv,
    )
}

/// Sends `size` bytes at `buf` (inside `*reg`) to `peer`; it goes out once the peer has a
/// receive posted for it. The request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_isend(
    buf: *mut c_void,
    size: c_int,
    peer: c_int,
    reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    two_sided(
        "mp_isend",
        (Src::Buf(buf, size), peer),
        reg,
        req,
        mp::Comm::isend,
    )
}

/// Takes the requests `reqs` names out of the table (released: dead from here on).
fn take_requests(reqs: &[*mut mp_request]) -> Res<Vec<Option<mp::Request>>> {
    for &h in reqs {
        posted(&handle::get(h, "a request")?.lock())?;
    }
    reqs.iter()
        .map(|&h| {
            let r = handle::remove(h, "a request")?;
            let state = std::mem::replace(&mut *r.lock(), MpReq::Done);
            Ok(match state {
                MpReq::Pending(r) => Some(r),
                MpReq::Done | MpReq::Prepared(_) => None,
            })
        })
        .collect()
}

/// Waits on the CPU for `*req` to complete and releases it.
#[no_mangle]
pub extern "C" fn mp_wait(req: *mut *mut mp_request) -> c_int {
    mp_guard("mp_wait", || {
        let h = deref_handle(req, "req")?;
        if let Some(r) = take_requests(&[h])?[0] {
            with_comm(|c| Ok(c.wait(r)?))?;
        }
        Ok(())
    })
}

/// Waits on the CPU for the `count` requests at `reqs` and releases them.
#[no_mangle]
pub extern "C" fn mp_wait_all(count: u32, reqs: *mut *mut mp_request) -> c_int {
    mp_guard("mp_wait_all", || {
        let hs = args::array(
            reqs as *const *mut mp_request,
            count as usize,
            1 << 20,
            "reqs",
        )?;
        let pending: Vec<mp::Request> = take_requests(hs)?.into_iter().flatten().collect();
        with_comm(|c| Ok(c.wait_all(&pending)?))?;
        Ok(())
    })
}

/// Moves the `count` requests at `reqs` on without blocking; returns how many are complete
/// (they stay valid until `mp_wait`/`mp_wait_all` releases them), or -1 on failure.
#[no_mangle]
pub extern "C" fn mp_progress_all(count: u32, reqs: *mut *mut mp_request) -> c_int {
    let mut done = 0;
    let rc = mp_guard("mp_progress_all", || {
        let hs = args::array(
            reqs as *const *mut mp_request,
            count as usize,
            1 << 20,
            "reqs",
        )?;
        let slots = hs
            .iter()
            .map(|&h| handle::get(h, "a request"))
            .collect::<Res<Vec<_>>>()?;
        with_comm(|c| {
            for slot in &slots {
                let mut s = slot.lock();
                if let MpReq::Pending(r) = *s {
                    if c.test(r)?.is_some() {
                        *s = MpReq::Done;
                    }
                }
                done += matches!(*s, MpReq::Done) as c_int;
            }
            Ok(())
        })
    });
    if rc == crate::mp_state::MP_SUCCESS {
        done
    } else {
        -1
    }
}
