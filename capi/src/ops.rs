//! The prepare → commit split: a prepared send (its work request written into the ring, not
//! yet visible to the device), the commit that hands back the op list ringing its doorbell,
//! the op lists that wait for a completion, and running a list on the calling thread.

use crate::args;
use crate::handle::{self, handle_impl};
use crate::qp::{gdasync_qp, gdasync_recv_ticket, gdasync_send_ticket, gdasync_send_wr};
use crate::status::{guard, Fail, Res, GDASYNC_ERR_STATE, GDASYNC_OK};
use gdsync::exec::HostExecutor;
use gdsync::ops::Ops;
use gdsync::PreparedSend;
use parking_lot::Mutex;
use std::ffi::c_int;
use std::sync::Arc;

/// A prepared send: its work request is in the QP's ring, not yet visible to the device.
/// Commit it (`gdasync_qp_commit`), or free it (`gdasync_prepared_free`: it becomes a no-op
/// exposed with the next commit). Commit prepared sends in the order they were prepared.
pub struct gdasync_prepared {
    _opaque: [u8; 0],
}
/// The prepared send until it is committed or freed.
pub(crate) type SharedPrepared = Arc<Mutex<Option<PreparedSend>>>;
handle_impl!(gdasync_prepared, 6, SharedPrepared);

/// An op list: memory writes, waits and barriers that ring a doorbell or wait for a
/// completion, for an executor to run (`gdasync_ops_run` on this thread,
/// `gdasync_stream_submit` on a stream). Running or submitting it consumes the handle.
/// Op lists that ring one QP's doorbells must run in the order they were committed.
pub struct gdasync_ops {
    _opaque: [u8; 0],
}
/// The list until it is run, submitted or freed.
pub(crate) type SharedOps = Arc<Mutex<Option<Ops>>>;
handle_impl!(gdasync_ops, 7, SharedOps);

/// Takes the op list out of `ops`, which is dead from here on.
pub(crate) fn take_ops(ops: *mut gdasync_ops) -> Res<Ops> {
    let list = handle::remove(ops, "ops")?;
    let taken = list.lock().take();
    taken.ok_or_else(|| Fail::new(GDASYNC_ERR_STATE, "ops was run or submitted already"))
}

/// Hands `ops` to C as a new handle at `out`.
pub(crate) fn give_ops(ops: Ops, out: *mut *mut gdasync_ops) -> Res<()> {
    let h = handle::insert::<gdasync_ops>(Arc::new(Mutex::new(Some(ops))))?;
    args::write(out, h, "out")
}

/// Prepares a send: writes `wr` into the QP's ring without making it visible to the device.
#[no_mangle]
pub extern "C" fn gdasync_qp_prepare_send(
    qp: *mut gdasync_qp,
    wr: *const gdasync_send_wr,
    out: *mut *mut gdasync_prepared,
) -> c_int {
    guard("gdasync_qp_prepare_send", || {
        args::check_ptr(out, "out")?;
        let wr = crate::qp::send_wr(wr)?;
        let p = crate::qp::with_host(qp, |q| Ok(q.prepare_send(&wr)?))?;
        let h = handle::insert::<gdasync_prepared>(Arc::new(Mutex::new(Some(p))))?;
        args::write(out, h, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Commits the prepared send `p` (consumed on success; still prepared after a refusal):
/// its ticket goes to `ticket` (may be NULL) and the op list that rings its doorbell to
/// `doorbell`, for an executor to run.
#[no_mangle]
pub extern "C" fn gdasync_qp_commit(
    qp: *mut gdasync_qp,
    p: *mut gdasync_prepared,
    ticket: *mut gdasync_send_ticket,
    doorbell: *mut *mut gdasync_ops,
) -> c_int {
    guard("gdasync_qp_commit", || {
        args::check_ptr(doorbell, "doorbell")?;
        let slot = handle::get(p, "p")?;
        let (t, ops) = crate::qp::with_host(qp, |q| {
            let prepared = slot
                .lock()
                .take()
                .ok_or_else(|| Fail::new(GDASYNC_ERR_STATE, "p was committed already"))?;
            match q.commit(prepared) {
                Ok(done) => Ok(done),
                Err(e) => {
                    *slot.lock() = Some(e.prepared);
                    Err(e.error.into())
                }
            }
        })?;
        handle::remove(p, "p")?;
        args::write_opt(ticket, t.into(), "ticket")?;
        give_ops(ops, doorbell)?;
        Ok(GDASYNC_OK)
    })
}

/// Frees a prepared send without committing it: it becomes a no-op, exposed with the next
/// commit (completing as a no-op with its wr_id if it was signalled).
#[no_mangle]
pub extern "C" fn gdasync_prepared_free(p: *mut gdasync_prepared) -> c_int {
    guard("gdasync_prepared_free", || {
        handle::remove(p, "p")?;
        Ok(GDASYNC_OK)
    })
}

/// The op list that waits for the completion of the send `ticket` names (its completion
/// number must be known: `has_cqe`) and consumes it, to `out`.
#[no_mangle]
pub extern "C" fn gdasync_qp_send_wait_ops(
    qp: *mut gdasync_qp,
    ticket: *const gdasync_send_ticket,
    out: *mut *mut gdasync_ops,
) -> c_int {
    guard("gdasync_qp_send_wait_ops", || {
        args::check_ptr(out, "out")?;
        let t = args::read(ticket, "ticket")?;
        let ops = crate::qp::with_host(qp, |q| Ok(q.send_wait_ops(&t.into())?))?;
        give_ops(ops, out)?;
        Ok(GDASYNC_OK)
    })
}

/// The op list that waits for the completion of the receive `ticket` names and consumes
/// it, to `out`.
#[no_mangle]
pub extern "C" fn gdasync_qp_recv_wait_ops(
    qp: *mut gdasync_qp,
    ticket: *const gdasync_recv_ticket,
    out: *mut *mut gdasync_ops,
) -> c_int {
    guard("gdasync_qp_recv_wait_ops", || {
        args::check_ptr(out, "out")?;
        let t = args::read(ticket, "ticket")?;
        let ops = crate::qp::with_host(qp, |q| Ok(q.recv_wait_ops(&t.into())?))?;
        give_ops(ops, out)?;
        Ok(GDASYNC_OK)
    })
}

/// Runs `ops` now on the calling thread (a wait gives up after 60 s) and frees it, whatever
/// the outcome.
#[no_mangle]
pub extern "C" fn gdasync_ops_run(ops: *mut gdasync_ops) -> c_int {
    guard("gdasync_ops_run", || {
        let list = take_ops(ops)?;
        HostExecutor::default().run(&list)?;
        Ok(GDASYNC_OK)
    })
}

/// Frees `ops` without running it.
#[no_mangle]
pub extern "C" fn gdasync_ops_free(ops: *mut gdasync_ops) -> c_int {
    guard("gdasync_ops_free", || {
        handle::remove(ops, "ops")?;
        Ok(GDASYNC_OK)
    })
}
