//! mp.h's vector calls (LibMP's `mp_isendv`, `mp_irecvv`, `mp_isendv_on_stream`,
//! `mp_sendv_prepare`): the blocks of a `struct iovec` list, which must follow one another in
//! memory, travel as one buffer (`mp_buf.rs` checks them).

use crate::mp_buf::Src;
use crate::mp_p2p::{mp_reg, mp_request, two_sided};
use crate::mp_prepare::send_prepare;
use crate::mp_stream::send_on;
use std::ffi::{c_int, c_void};

/// `mp_isend` of the `nblocks` blocks at `v` (inside `*mp_reg`), sent as one buffer.
#[no_mangle]
pub extern "C" fn mp_isendv(
    v: *mut libc::iovec,
    nblocks: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    let src = Src::Vec(v, nblocks);
    two_sided("mp_isendv", (src, peer), mp_reg, req, mp::Comm::isend)
}

/// `mp_irecv` into the `nblocks` blocks at `v` (inside `*mp_reg`), received as one buffer.
#[no_mangle]
pub extern "C" fn mp_irecvv(
    v: *mut libc::iovec,
    nblocks: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    let src = Src::Vec(v, nblocks);
    two_sided("mp_irecvv", (src, peer), mp_reg, req, mp::Comm::irecv)
}

/// `mp_isend_on_stream` of the `nblocks` blocks at `v`, sent as one buffer.
#[no_mangle]
pub extern "C" fn mp_isendv_on_stream(
    v: *mut libc::iovec,
    nblocks: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    let src = Src::Vec(v, nblocks);
    send_on(
        "mp_isendv_on_stream",
        (src, peer),
        mp_reg,
        req,
        stream,
        false,
    )
}

/// `mp_send_prepare` of the `nblocks` blocks at `v`, sent as one buffer.
#[no_mangle]
pub extern "C" fn mp_sendv_prepare(
    v: *mut libc::iovec,
    nblocks: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    send_prepare(
        "mp_sendv_prepare",
        (Src::Vec(v, nblocks), peer),
        mp_reg,
        req,
    )
}
