//! mp.h's descriptor queue (LibMP's `mp_desc_queue_*`): sends, completion waits and 32-bit
//! waits and writes collected on the host, then handed to a stream in one list by
//! `mp_desc_queue_post_on_stream` (adjacent doorbells of one queue pair ring once). Sends are
//! written to their queue pair at the post, in the queue's order, so nothing rings early.

use crate::args;
use crate::handle::{self, handle_impl};
use crate::mp_p2p::{deref_handle, mp_request, MpReq, Prepared, SharedReq};
use crate::mp_state::{mp_guard, with_comm};
use crate::mp_stream::{executor, wait_cond};
use crate::status::{Fail, Res};
use gdsync::exec::Executor;
use gdsync::ops::{Op, Ops, WaitCond};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A descriptor queue (`mp_desc_queue_t` is a pointer to one): freed by `mp_desc_queue_free`.
pub struct mp_desc_queue {
    _opaque: [u8; 0],
}

/// One descriptor, in the order it was added.
enum Desc {
    /// A prepared send or put, posted at the queue's post.
    Send(SharedReq),
    /// The stream waits for the request's completion.
    Wait(SharedReq),
    /// The stream waits until the word at `addr` meets `value` under `cond`.
    Wait32 {
        addr: u64,
        value: u32,
        cond: WaitCond,
    },
    /// The stream writes `value` to the word at `addr`.
    Write32 { addr: u64, value: u32 },
}

/// The descriptors not posted yet.
#[derive(Default)]
pub(crate) struct Queue(Vec<Desc>);
/// The queue, shared by calls in flight.
pub(crate) type SharedQueue = Arc<Mutex<Queue>>;
handle_impl!(mp_desc_queue, 12, SharedQueue);

/// At most this many descriptors wait in one queue (a bound, not a LibMP limit).
pub const MP_DESC_QUEUE_MAX: usize = 1 << 16;

/// Collects the lists the communicator would submit into one.
#[derive(Default)]
struct Collect(RefCell<Ops>);

impl Executor for Collect {
    fn submit(&self, ops: Ops) -> gdsync::Result<()> {
        self.0.borrow_mut().append(ops);
        Ok(())
    }
}

/// Allocates an empty queue; the handle goes to `*dq`.
#[no_mangle]
pub extern "C" fn mp_desc_queue_alloc(dq: *mut *mut mp_desc_queue) -> c_int {
    mp_guard("mp_desc_queue_alloc", || {
        args::check_ptr(dq, "dq")?;
        crate::mp_state::with_state(|_| Ok(()))?;
        let h = handle::insert::<mp_desc_queue>(Arc::new(Mutex::new(Queue::default())))?;
        args::write(dq, h, "dq")
    })
}

/// Frees `*dq` and sets it to NULL; descriptors not posted are dropped (their prepared
/// requests stay prepared).
#[no_mangle]
pub extern "C" fn mp_desc_queue_free(dq: *mut *mut mp_desc_queue) -> c_int {
    mp_guard("mp_desc_queue_free", || {
        handle::remove(deref_handle(dq, "dq")?, "*dq")?;
        args::write(dq, std::ptr::null_mut(), "dq")
    })
}

/// Adds `d` to the queue `*dq` names, after `check` accepted it against the queue.
fn add(
    dq: *mut *mut mp_desc_queue,
    d: Desc,
    check: impl FnOnce(&Queue, &Desc) -> Res<()>,
) -> Res<()> {
    let q = handle::get(deref_handle(dq, "dq")?, "*dq")?;
    let mut q = q.lock();
    if q.0.len() >= MP_DESC_QUEUE_MAX {
        return Err(Fail::invalid(format!(
            "the queue holds {MP_DESC_QUEUE_MAX} descriptors already: post it first"
        )));
    }
    check(&q, &d)?;
    q.0.push(d);
    Ok(())
}

/// The request `*req` names.
fn request(req: *mut *mut mp_request) -> Res<SharedReq> {
    handle::get(deref_handle(req, "req")?, "*req")
}

/// Adds the send or put prepared in `*req` (`mp_send_prepare`, `mp_put_prepare`): the stream
/// waits there for the peer's receive (sends), then rings.
#[no_mangle]
pub extern "C" fn mp_desc_queue_add_send(
    dq: *mut *mut mp_desc_queue,
    req: *mut *mut mp_request,
) -> c_int {
    mp_guard("mp_desc_queue_add_send", || {
        let r = request(req)?;
        add(dq, Desc::Send(r), |q, d| {
            let Desc::Send(r) = d else { unreachable!() };
            if !matches!(*r.lock(), MpReq::Prepared(_)) || queued(q, r) {
                return Err(Fail::invalid("the request is not prepared: it was posted or added to a queue already, or made by a call other than mp_send_prepare or mp_put_prepare"));
            }
            Ok(())
        })
    })
}

/// Whether `r` is a send added to `q`.
fn queued(q: &Queue, r: &SharedReq) -> bool {
    q.0.iter()
        .any(|d| matches!(d, Desc::Send(s) if Arc::ptr_eq(s, r)))
}

/// Adds a wait for `*req`: posted on a stream, or a send added to this queue before.
fn add_wait(dq: *mut *mut mp_desc_queue, req: *mut *mut mp_request) -> Res<()> {
    let r = request(req)?;
    add(dq, Desc::Wait(r), |q, d| {
        let Desc::Wait(r) = d else { unreachable!() };
        match *r.lock() {
            MpReq::Pending(_) => Ok(()),
            MpReq::Prepared(_) if queued(q, r) => Ok(()),
            MpReq::Prepared(_) => Err(Fail::invalid("the request is prepared, not posted: add it with mp_desc_queue_add_send before its wait")),
            MpReq::Done => Err(Fail::invalid("the request is complete already (mp_progress_all saw it): nothing to wait for")),
        }
    })
}

/// Adds a wait for the send `*req`'s completion.
#[no_mangle]
pub extern "C" fn mp_desc_queue_add_wait_send(
    dq: *mut *mut mp_desc_queue,
    req: *mut *mut mp_request,
) -> c_int {
    mp_guard("mp_desc_queue_add_wait_send", || add_wait(dq, req))
}

/// Adds a wait for the receive `*req`'s completion.
#[no_mangle]
pub extern "C" fn mp_desc_queue_add_wait_recv(
    dq: *mut *mut mp_desc_queue,
    req: *mut *mut mp_request,
) -> c_int {
    mp_guard("mp_desc_queue_add_wait_recv", || add_wait(dq, req))
}

/// Adds a wait until the word at `ptr` meets `value` under `flags` (as
/// `mp_wait32_on_stream`); the word must stay valid until the stream has passed it.
#[no_mangle]
pub extern "C" fn mp_desc_queue_add_wait_value32(
    dq: *mut *mut mp_desc_queue,
    ptr: *mut u32,
    value: u32,
    flags: c_int,
) -> c_int {
    mp_guard("mp_desc_queue_add_wait_value32", || {
        let addr = args::word32(ptr, "ptr")?.as_ptr() as u64;
        let cond = wait_cond(flags)?;
        add(dq, Desc::Wait32 { addr, value, cond }, |_, _| Ok(()))
    })
}

/// Adds a write of `value` to the word at `ptr`, after what the stream did before it; the
/// word must stay valid until the stream has passed it.
#[no_mangle]
pub extern "C" fn mp_desc_queue_add_write_value32(
    dq: *mut *mut mp_desc_queue,
    ptr: *mut u32,
    value: u32,
) -> c_int {
    mp_guard("mp_desc_queue_add_write_value32", || {
        let addr = args::word32(ptr, "ptr")?.as_ptr() as u64;
        add(dq, Desc::Write32 { addr, value }, |_, _| Ok(()))
    })
}

/// Appends `d`'s ops to `out`: posts a send, or adds a wait.
fn run(d: &Desc, out: &Collect) -> Res<()> {
    let mut ops = Ops::new();
    match d {
        Desc::Send(r) => {
            let mut s = r.lock();
            let posted = with_comm(|c| {
                Ok(match &*s {
                    MpReq::Prepared(Prepared::Send { sge, peer }) => {
                        c.isend_on(*sge, *peer, out)?
                    }
                    MpReq::Prepared(Prepared::Put {
                        sge,
                        window,
                        peer,
                        displ,
                    }) => c.iput_on(*sge, &window.0, *peer, *displ, out)?,
                    _ => {
                        return Err(Fail::invalid(
                            "a queued request was posted meanwhile by another call",
                        ))
                    }
                })
            })?;
            *s = MpReq::Pending(posted);
        }
        Desc::Wait(r) => match *r.lock() {
            MpReq::Pending(p) => with_comm(|c| Ok(c.wait_on(p, out)?))?,
            _ => {
                return Err(Fail::invalid(
                    "a request the queue waits for was released, or never posted",
                ))
            }
        },
        // SAFETY: the header's contract: the word stays valid until the stream has passed the
        // op; it is 4-byte aligned (checked when added).
        &Desc::Wait32 { addr, value, cond } => unsafe {
            ops.push_raw(Op::Wait32 { addr, value, cond })
        },
        &Desc::Write32 { addr, value } => {
            // Ordered after the stream's earlier work, as LibMP's write descriptor: after the
            // retirement of a receive waited for before it too (a CPU that sees the word may
            // test the request at once).
            out.0.borrow_mut().retire_now();
            ops = Ops::barrier();
            // SAFETY: as for Wait32.
            unsafe { ops.push_raw(Op::Write32 { addr, value }) };
        }
    }
    out.submit(ops)?;
    Ok(())
}

/// Posts the descriptors of `*dq` on `stream` in one list, in order, and empties the queue
/// (an empty queue posts nothing). `flags` must be 0. Where a descriptor is refused, those
/// before it are posted and it and those after it stay in the queue.
#[no_mangle]
pub extern "C" fn mp_desc_queue_post_on_stream(
    stream: *mut c_void,
    dq: *mut *mut mp_desc_queue,
    flags: c_int,
) -> c_int {
    mp_guard("mp_desc_queue_post_on_stream", || {
        let q = handle::get(deref_handle(dq, "dq")?, "*dq")?;
        if flags != 0 {
            return Err(Fail::invalid(format!(
                "flags {flags}: no flags are defined, pass 0"
            )));
        }
        let mut q = q.lock();
        if q.0.is_empty() {
            return Ok(());
        }
        let exec = executor(stream)?;
        let out = Collect::default();
        let mut done = 0;
        let res =
            q.0.iter()
                .try_for_each(|d| run(d, &out).map(|()| done += 1));
        q.0.drain(..done);
        let ops = out.0.into_inner();
        if !ops.is_empty() {
            exec.submit(ops)?;
        }
        res
    })
}
