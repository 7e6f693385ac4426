//! mp.h's stream family: sends, puts and waits that a stream runs (LibMP's `*_on_stream`).
//! The stream is the program's own CUDA stream (`cudaStream_t`, of the GPU `mp_init_env` was
//! given), or `MP_HOST_STREAM`, a CPU thread of the library's for machines without a GPU;
//! each is wrapped once and kept until `mp_finalize`.

use crate::handle;
use crate::mp_buf::Src;
use crate::mp_p2p::{deref_handle, give_request, mp_reg, mp_request, rank, sge_in, MpReq};
use crate::mp_state::{mp_guard, with_comm, with_state};
use crate::mp_win::mp_window;
use crate::status::{Fail, Res};
use crate::stream::Stream;
use gdsync::exec::{Executor, HostStream};
use gdsync::ops::{Op, Ops, WaitCond};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The stream value that names the library's host stream (all bits set).
pub const MP_HOST_STREAM_BITS: usize = usize::MAX;

/// The executor for the program's stream value `s`.
pub(crate) fn executor(s: *mut c_void) -> Res<Arc<Stream>> {
    let key = s as usize;
    with_state(|st| {
        if let Some(e) = st.streams.get(&key) {
            return Ok(e.clone());
        }
        let e = Arc::new(if key == MP_HOST_STREAM_BITS {
            Stream::Host(HostStream::new()?)
        } else {
            let gpu = st.gpu.ok_or_else(|| {
                Fail::invalid("a CUDA stream, but mp_init_env was given gpu_id -1: pass the GPU of your streams")
            })?;
            Stream::wrap_cuda(s, gpu)?
        });
        st.streams.insert(key, e.clone());
        Ok(e)
    })
}

/// A send on `stream`: it waits there for the receiver's credit, then rings the doorbell.
pub(crate) fn send_on(
    what: &str,
    (src, peer): (Src, c_int),
    reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
    stream: *mut c_void,
    wait: bool,
) -> c_int {
    mp_guard(what, || {
        crate::args::check_ptr(req, "req")?;
        let (buf, size) = src.buffer()?;
        let sge = sge_in(buf, size, reg)?;
        let exec = executor(stream)?;
        let r = with_comm(|c| {
            let peer = rank(peer)?;
            Ok(if wait {
                c.send_on(sge, peer, &*exec)?
            } else {
                c.isend_on(sge, peer, &*exec)?
            })
        })?;
        give_request(r, req)
    })
}

/// Sends `size` bytes at `buf` to `peer` from `stream`, and makes the stream wait for the
/// send's completion. The request must still be released with `mp_wait`.
#[no_mangle]
pub extern "C" fn mp_send_on_stream(
    buf: *mut c_void,
    size: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    send_on(
        "mp_send_on_stream",
        (Src::Buf(buf, size), peer),
        mp_reg,
        req,
        stream,
        true,
    )
}

/// Sends `size` bytes at `buf` to `peer` from `stream` (which waits there for the peer's
/// receive, then rings); the CPU does not wait.
#[no_mangle]
pub extern "C" fn mp_isend_on_stream(
    buf: *mut c_void,
    size: c_int,
    peer: c_int,
    mp_reg: *mut *mut mp_reg,
    req: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    send_on(
        "mp_isend_on_stream",
        (Src::Buf(buf, size), peer),
        mp_reg,
        req,
        stream,
        false,
    )
}

/// The pending requests at `reqs`, not released.
fn pending(reqs: &[*mut mp_request]) -> Res<Vec<mp::Request>> {
    let mut out = Vec::with_capacity(reqs.len());
    for &h in reqs {
        let slot = handle::get(h, "a request")?;
        let r = slot.lock();
        crate::mp_p2p::posted(&r)?;
        if let MpReq::Pending(r) = *r {
            out.push(r);
        }
    }
    Ok(out)
}

/// Makes `stream` wait for the `count` requests at `reqs` (posted on a stream); they are
/// complete once it passed, and must still be released with `mp_wait`/`mp_wait_all`.
#[no_mangle]
pub extern "C" fn mp_wait_all_on_stream(
    count: u32,
    reqs: *mut *mut mp_request,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_wait_all_on_stream", || {
        let hs = crate::args::array(
            reqs as *const *mut mp_request,
            count as usize,
            1 << 20,
            "reqs",
        )?;
        let rs = pending(hs)?;
        let exec = executor(stream)?;
        with_comm(|c| Ok(c.wait_all_on(&rs, &*exec)?))
    })
}

/// A barrier that `stream` runs (mp's `barrier_on`): the stream stores this rank's arrival
/// at its partners and waits there for theirs; the CPU returns at once. Work queued on the
/// stream after it runs once every rank reached the barrier.
#[no_mangle]
pub extern "C" fn mp_barrier_on_stream(stream: *mut c_void) -> c_int {
    mp_guard("mp_barrier_on_stream", || {
        let exec = executor(stream)?;
        with_comm(|c| Ok(c.barrier_on(&*exec)?))
    })
}

/// Makes `stream` wait for `*req`, as `mp_wait_all_on_stream` does for one.
#[no_mangle]
pub extern "C" fn mp_wait_on_stream(req: *mut *mut mp_request, stream: *mut c_void) -> c_int {
    mp_guard("mp_wait_on_stream", || {
        let rs = pending(&[deref_handle(req, "req")?])?;
        let exec = executor(stream)?;
        with_comm(|c| Ok(c.wait_all_on(&rs, &*exec)?))
    })
}

/// `mp_iput` posted by `stream` (it rings when it gets there).
#[no_mangle]
pub extern "C" fn mp_iput_on_stream(
    src: *mut c_void,
    size: c_int,
    src_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    window: *mut *mut mp_window,
    req: *mut *mut mp_request,
    flags: c_int,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_iput_on_stream", || {
        let (sge, w) = crate::mp_win::put_args((src, size, src_reg), window, req, flags)?;
        let exec = executor(stream)?;
        let r = with_comm(|c| Ok(c.iput_on(sge, &w.0, rank(peer)?, displ as u64, &*exec)?))?;
        give_request(r, req)
    })
}

/// Makes `stream` wait until the word at `ptr` meets `value` under `flags` (`MP_WAIT_GEQ`,
/// wrap-aware on a stream as CUDA's; `MP_WAIT_EQ`; `MP_WAIT_AND`). The word must stay valid
/// until the stream has passed the wait, and a CUDA stream must reach it (device memory, or
/// host memory registered with CUDA).
#[no_mangle]
pub extern "C" fn mp_wait32_on_stream(
    ptr: *mut u32,
    value: u32,
    flags: c_int,
    stream: *mut c_void,
) -> c_int {
    mp_guard("mp_wait32_on_stream", || {
        let word = crate::args::word32(ptr, "ptr")?;
        let cond = wait_cond(flags)?;
        let exec = executor(stream)?;
        let mut ops = Ops::new();
        let addr = word.as_ptr() as u64;
        // SAFETY: the header's contract: the word stays valid until the stream has passed the
        // wait; it is 4-byte aligned (checked).
        unsafe { ops.push_raw(Op::Wait32 { addr, value, cond }) };
        exec.submit(ops)?;
        Ok(())
    })
}

/// The stream wait condition `flags` names (`MP_WAIT_GEQ`, `MP_WAIT_EQ`, `MP_WAIT_AND`).
pub(crate) fn wait_cond(flags: c_int) -> Res<WaitCond> {
    Ok(match flags {
        crate::mp_win::MP_WAIT_GEQ => WaitCond::Geq,
        crate::mp_win::MP_WAIT_EQ => WaitCond::Eq,
        crate::mp_win::MP_WAIT_AND => WaitCond::And,
        f => return Err(Fail::invalid(format!("flags {f} is no MP_WAIT_ condition"))),
    })
}
