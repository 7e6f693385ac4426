//! mp.h's put with signal (not in LibMP, in its naming style): a put, then an 8-byte signal
//! word written after the data at another place of the peer's window, so the peer (waiting on
//! the word with `mp_wait32` or `mp_wait32_on_stream`) knows the data is there.

use crate::mp_p2p::{give_request, mp_reg, mp_request, rank, sge_in};
use crate::mp_state::{mp_guard, with_comm};
use crate::mp_stream::executor;
use crate::mp_win::{mp_window, put_args};
use std::ffi::{c_int, c_void};

/// The arguments of a put with signal after the window: the signal word's source (8 bytes
/// at `signal`, inside `*signal_reg`) and its byte offset in the peer's window.
type SignalArgs = (*mut u64, *mut *mut mp_reg, usize);

/// A put with signal; `stream`: posted by that stream, else from the CPU now.
fn put_signal(
    what: &str,
    (src, size, src_reg, peer, displ): (*mut c_void, c_int, *mut *mut mp_reg, c_int, usize),
    window: *mut *mut mp_window,
    (signal, signal_reg, signal_displ): SignalArgs,
    req: *mut *mut mp_request,
    stream: Option<*mut c_void>,
) -> c_int {
    mp_guard(what, || {
        let (sge, w) = put_args((src, size, src_reg), window, req, 0)?;
        let sig = sge_in(signal.cast(), 8, signal_reg)?;
        let (dst, at) = (displ as u64, signal_displ as u64);
        let exec = stream.map(executor).transpose()?;
        let r = with_comm(|c| {
            let peer = rank(peer)?;
            Ok(match &exec {
                Some(e) => c.iput_signal_on(sge, &w.0, peer, dst, sig, at, &**e)?,
                None => c.iput_signal(sge, &w.0, peer, dst, sig, at)?,
            })
        })?;
        give_request(r, req)
    })
}

/// Writes `size` bytes at `src` (inside `*src_reg`) into `peer`'s part of `*dst_window_t`
/// at byte `displ`, then the 8-byte word at `signal` (inside `*signal_reg`; its value is read
/// now) at byte `signal_displ` (8-byte aligned) of the same window: the peer sees the signal
/// only after the data. The request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_iput_signal(
    src: *mut c_void,
    size: c_int,
    src_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    dst_window_t: *mut *mut mp_window,
    signal: *mut u64,
    signal_reg: *mut *mut mp_reg,
    signal_displ: usize,
    req: *mut *mut mp_request,
) -> c_int {
    put_signal(
        "mp_iput_signal",
        (src, size, src_reg, peer, displ),
        dst_window_t,
        (signal, signal_reg, signal_displ),
        req,
        None,
    )
}

/// `mp_iput_signal` posted by `stream` (it rings when it gets there; the signal's value is
/// read at this call).
#[no_mangle]
pub extern "C" fn mp_iput_signal_on_stream(
    src: *mut c_void,
    size: c_int,
    src_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    dst_window_t: *mut *mut mp_window,
    signal: *mut u64,
    signal_reg: *mut *mut mp_reg,
    signal_displ: usize,
    req: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    put_signal(
        "mp_iput_signal_on_stream",
        (src, size, src_reg, peer, displ),
        dst_window_t,
        (signal, signal_reg, signal_displ),
        req,
        Some(stream),
    )
}
