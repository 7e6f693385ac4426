//! Handing a QP to a GPU kernel from C: the descriptor gdsync.cuh's `gds_qp` is (gdsync's
//! `QpDesc`, under the C name `gdasync_kernel_qp`), what the kernel has done with it
//! (`DeviceQpProgress`, as `gdasync_kernel_progress`), and taking the QP back for the CPU.

use crate::args;
use crate::handle;
use crate::qp::{gdasync_qp, HeldQp};
use crate::status::{guard, Fail, Res, GDASYNC_ERR_STATE, GDASYNC_OK};
use gdsync::kernel::{DeviceQp, DeviceQpProgress, QpDesc};
use std::ffi::c_int;

/// The refusal of a QP held the wrong way for the call: `how` says how it is held.
fn wrong(held: &HeldQp, how: &str) -> Fail {
    match held.qpn() {
        Ok(n) => Fail::new(GDASYNC_ERR_STATE, format!("QP {n:#x} {how}")),
        Err(e) => e,
    }
}

/// Runs `f` on the QP `h` names, which a kernel must be driving.
fn with_kernel<R>(h: *mut gdasync_qp, f: impl FnOnce(&DeviceQp) -> R) -> Res<R> {
    match &*handle::get(h, "qp")?.lock() {
        HeldQp::Kernel(q) => Ok(f(q)),
        other => Err(wrong(
            other,
            "is driven by the CPU: hand it to a kernel with gdasync_qp_to_kernel first",
        )),
    }
}

/// Moves the QP `h` names between the CPU and the kernels: `f` gets it and returns what is
/// held from then on, with the call's result. The lock is held throughout.
fn move_held<R>(h: *mut gdasync_qp, f: impl FnOnce(HeldQp) -> (HeldQp, Res<R>)) -> Res<R> {
    let shared = handle::get(h, "qp")?;
    let mut held = shared.lock();
    let (next, r) = f(std::mem::replace(&mut *held, HeldQp::Moving));
    *held = next;
    r
}

/// Hands `qp` to GPU kernels: from here on a kernel posts and polls on it through the
/// descriptor written to `desc` (gdsync.cuh's `gds_qp`, byte for byte: pass it to a kernel by
/// value, or copy it to memory the kernel reads), and the CPU can neither post on it nor wait
/// for its completions. Refused, with the QP left to the CPU as it was, unless each of its
/// CQs serves this QP alone and holds at least as many entries as the ring it serves, and
/// nothing is outstanding (every send and receive completed and polled, no prepared send
/// uncommitted). Connect it first: a kernel cannot.
#[no_mangle]
pub extern "C" fn gdasync_qp_to_kernel(qp: *mut gdasync_qp, desc: *mut QpDesc) -> c_int {
    guard("gdasync_qp_to_kernel", || {
        args::check_ptr(desc, "desc")?;
        let d = move_held(qp, |held| match held {
            HeldQp::Host(q) => match q.try_into_device() {
                Ok(d) => {
                    let desc = d.desc();
                    (HeldQp::Kernel(d), Ok(desc))
                }
                Err(e) => (HeldQp::Host(*e.qp), Err(e.error.into())),
            },
            other => {
                let e = wrong(&other, "is with a kernel already");
                (other, Err(e))
            }
        })?;
        args::write(desc, d, "desc")?;
        Ok(GDASYNC_OK)
    })
}

/// Writes what `f` reads of the QP `h` names (with a kernel) to `out`.
fn kernel_out<T>(h: *mut gdasync_qp, out: *mut T, f: fn(&DeviceQp) -> T) -> Res<c_int> {
    args::check_ptr(out, "out")?;
    let v = with_kernel(h, f)?;
    args::write(out, v, "out")?;
    Ok(GDASYNC_OK)
}

/// Writes the descriptor of `qp` (with a kernel) to `out`, with the counters where the last
/// kernel left them, for the next launch to resume from. Take one for each launch, never
/// while a kernel drives the QP.
#[no_mangle]
pub extern "C" fn gdasync_qp_kernel_desc(qp: *mut gdasync_qp, out: *mut QpDesc) -> c_int {
    guard("gdasync_qp_kernel_desc", || {
        kernel_out(qp, out, DeviceQp::desc)
    })
}

/// What kernels have done with `qp` (with a kernel) so far, to `out`: they store their
/// counters through to host memory after every call of gdsync.cuh.
#[no_mangle]
pub extern "C" fn gdasync_qp_kernel_progress(
    qp: *mut gdasync_qp,
    out: *mut DeviceQpProgress,
) -> c_int {
    guard("gdasync_qp_kernel_progress", || {
        kernel_out(qp, out, DeviceQp::progress)
    })
}

/// Writes 1 to `out` where GPUs reach the rings, doorbells and CQs of `qp` (with a kernel),
/// else 0 (no CUDA driver: a kernel cannot use the descriptor).
#[no_mangle]
pub extern "C" fn gdasync_qp_kernel_gpu_mapped(qp: *mut gdasync_qp, out: *mut u32) -> c_int {
    guard("gdasync_qp_kernel_gpu_mapped", || {
        kernel_out(qp, out, |d| d.gpu_mapped() as u32)
    })
}

/// Takes `qp` back from the kernels, once they have ended with nothing outstanding (every
/// send and receive they posted completed, and its completion consumed): the CPU posts and
/// polls on from where they stopped. Refused, with the QP left with the kernel, otherwise.
#[no_mangle]
pub extern "C" fn gdasync_qp_to_host(qp: *mut gdasync_qp) -> c_int {
    guard("gdasync_qp_to_host", || {
        move_held(qp, |held| match held {
            HeldQp::Kernel(d) => match d.into_host() {
                Ok(q) => (HeldQp::Host(q), Ok(GDASYNC_OK)),
                Err(e) => (HeldQp::Kernel(*e.qp), Err(e.error.into())),
            },
            other => {
                let e = wrong(&other, "is driven by the CPU already");
                (other, Err(e))
            }
        })
    })
}
