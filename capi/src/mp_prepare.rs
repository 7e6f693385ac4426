//! mp.h's prepare/post split (LibMP's batching API): `mp_send_prepare` and `mp_put_prepare`
//! check their arguments and make a request that holds the operation; the `*_post_on_stream`
//! calls hand prepared requests to a stream, which waits there for the peer's credit (sends)
//! and rings. The work request is written when the request is posted, not when prepared.

use crate::args;
use crate::handle;
use crate::mp_buf::Src;
use crate::mp_p2p::{deref_handle, mp_reg, mp_request, rank, sge_in, MpReq, Prepared};
use crate::mp_state::{mp_guard, with_comm};
use crate::mp_stream::executor;
use crate::mp_win::{mp_window, put_args};
use crate::status::{Fail, Res};
use parking_lot::Mutex;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Which post a prepared operation takes.
#[derive(Clone, Copy, PartialEq)]
enum Post {
    /// A send; `wait`: the stream also waits for its completion.
    Send { wait: bool },
    /// A put.
    Put,
}

/// Hands `prepared` to C as a new request at `req`.
fn give_prepared(prepared: Prepared, req: *mut *mut mp_request) -> Res<()> {
    let h = handle::insert::<mp_request>(Arc::new(Mutex::new(MpReq::Prepared(prepared))))?;
    args::write(req, h, "req")
}

/// Prepares a send of `size` bytes at `buf` (inside `*mp_reg`) to `peer`, for
/// `mp_send_post_on_stream` or `mp_isend_post_on_stream`; the request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_send_prepare(
    buf: *mut c_void,
    size: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    send_prepare("mp_send_prepare", (Src::Buf(buf, size), peer), mp_reg, req)
}

/// Prepares a send of what `src` names in `reg` to `peer`; the request goes to `*req`.
pub(crate) fn send_prepare(
    what: &str,
    (src, peer): (Src, c_int),
    reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
) -> c_int {
    mp_guard(what, || {
        args::check_ptr(req, "req")?;
        let (buf, size) = src.buffer()?;
        let sge = sge_in(buf, size, reg)?;
        let peer = known_peer(peer)?;
        give_prepared(Prepared::Send { sge, peer }, req)
    })
}

/// Prepares `mp_iput`'s put, for `mp_iput_post_on_stream`; the request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_put_prepare(
    src: *mut c_void,
    size: c_int,
    src_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    dst_window_t: *mut *mut mp_window,
    req: *mut *mut mp_request,
    flags: c_int,
) -> c_int {
    mp_guard("mp_put_prepare", || {
        let (sge, window) = put_args((src, size, src_reg), dst_window_t, req, flags)?;
        let peer = known_peer(peer)?;
        let displ = displ as u64;
        give_prepared(
            Prepared::Put {
                sge,
                window,
                peer,
                displ,
            },
            req,
        )
    })
}

/// `peer` as a rank of the job.
fn known_peer(peer: c_int) -> Res<usize> {
    let p = rank(peer)?;
    let size = with_comm(|c| Ok(c.size()))?;
    if p >= size {
        return Err(Fail::invalid(format!(
            "peer {peer} is no rank of this job of {size}"
        )));
    }
    Ok(p)
}

/// Posts the prepared requests at `reqs` on `stream`, in order, as `how` says. Each must be
/// a request prepared for that post; a refused one, and those after it, stay prepared.
fn post_all(reqs: &[*mut mp_request], stream: *mut c_void, how: Post) -> Res<()> {
    let exec = executor(stream)?;
    for &h in reqs {
        let slot = handle::get(h, "a request")?;
        let mut s = slot.lock();
        let (is_send, is_put) = match &*s {
            MpReq::Prepared(Prepared::Send { .. }) => (true, false),
            MpReq::Prepared(Prepared::Put { .. }) => (false, true),
            _ => (false, false),
        };
        let fits = match how {
            Post::Send { .. } => is_send,
            Post::Put => is_put,
        };
        if !fits {
            return Err(Fail::invalid(match (is_send, is_put) {
                (false, false) => "a request is not prepared: it was posted already, or made by a call other than mp_send_prepare or mp_put_prepare".to_string(),
                (true, _) => "a request was made by mp_send_prepare: post it with mp_send_post_on_stream or mp_isend_post_on_stream".to_string(),
                (_, true) => "a request was made by mp_put_prepare: post it with mp_iput_post_on_stream".to_string(),
            }));
        }
        let r = with_comm(|c| {
            Ok(match &*s {
                MpReq::Prepared(Prepared::Send { sge, peer }) => match how {
                    Post::Send { wait: true } => c.send_on(*sge, *peer, &*exec)?,
                    _ => c.isend_on(*sge, *peer, &*exec)?,
                },
                MpReq::Prepared(Prepared::Put {
                    sge,
                    window,
                    peer,
                    displ,
                }) => c.iput_on(*sge, &window.0, *peer, *displ, &*exec)?,
                _ => unreachable!("checked above"),
            })
        })?;
        *s = MpReq::Pending(r);
    }
    Ok(())
}

/// The `count` request handles at `reqs`.
fn handles<'a>(count: u32, reqs: *mut *mut mp_request) -> Res<&'a [*mut mp_request]> {
    args::array(
        reqs as *const *mut mp_request,
        count as usize,
        1 << 20,
        "reqs",
    )
}

/// Posts the send `*req` prepared on `stream`, and makes the stream wait for its completion.
#[no_mangle]
pub extern "C" fn mp_send_post_on_stream(req: *mut *mut mp_request, stream: *mut c_void) -> c_int {
    mp_guard("mp_send_post_on_stream", || {
        post_all(
            &[deref_handle(req, "req")?],
            stream,
            Post::Send { wait: true },
        )
    })
}

/// Posts the send `*req` prepared on `stream`; the stream does not wait for it.
#[no_mangle]
pub extern "C" fn mp_isend_post_on_stream(req: *mut *mut mp_request, stream: *mut c_void) -> c_int {
    mp_guard("mp_isend_post_on_stream", || {
        post_all(
            &[deref_handle(req, "req")?],
            stream,
            Post::Send { wait: false },
        )
    })
}

/// `mp_send_post_on_stream` for the `count` requests at `reqs`, in order.
#[no_mangle]
pub extern "C" fn mp_send_post_all_on_stream(
    count: u32,
    reqs: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_send_post_all_on_stream", || {
        post_all(handles(count, reqs)?, stream, Post::Send { wait: true })
    })
}

/// `mp_isend_post_on_stream` for the `count` requests at `reqs`, in order.
#[no_mangle]
pub extern "C" fn mp_isend_post_all_on_stream(
    count: u32,
    reqs: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_isend_post_all_on_stream", || {
        post_all(handles(count, reqs)?, stream, Post::Send { wait: false })
    })
}

/// Posts the put `*req` prepared (`mp_put_prepare`) on `stream`.
#[no_mangle]
pub extern "C" fn mp_iput_post_on_stream(req: *mut *mut mp_request, stream: *mut c_void) -> c_int {
    mp_guard("mp_iput_post_on_stream", || {
        post_all(&[deref_handle(req, "req")?], stream, Post::Put)
    })
}

/// `mp_iput_post_on_stream` for the `count` requests at `reqs`, in order.
#[no_mangle]
pub extern "C" fn mp_iput_post_all_on_stream(
    count: u32,
    reqs: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_iput_post_all_on_stream", || {
        post_all(handles(count, reqs)?, stream, Post::Put)
    })
}
