//! mp.h's one-sided side: windows (`mp_window_create`, collective), `mp_iput` and `mp_iget`
//! into and out of a peer's window, a CPU wait on a memory word (`mp_wait32`), and the
//! barrier LibMP left to MPI (`mp_barrier`).

use crate::args;
use crate::handle::{self, handle_impl};
use crate::mp_p2p::{deref_handle, give_request, mp_reg, mp_request, rank, sge_in};
use crate::mp_state::{mp_guard, with_comm};
use crate::status::{Fail, GDASYNC_ERR_TIMEOUT};
use gdsync::{Access, MemoryRegion};
use mp::Window;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A window (`mp_window_t` is a pointer to one): every rank's exposed region.
pub struct mp_window {
    _opaque: [u8; 0],
}
/// The window and the registration of this rank's region.
pub(crate) type SharedWindow = Arc<(Window, MemoryRegion<'static>)>;
handle_impl!(mp_window, 11, SharedWindow);

/// `mp_iput`: inline the payload where it fits (gdasync decides by itself; accepted).
pub const MP_PUT_INLINE: c_int = 1;
/// `mp_iput`: LibMP's unsignalled put, whose request could not be waited for. Here the put
/// is signalled anyway and its request may (and should) be waited for.
pub const MP_PUT_NOWAIT: c_int = 2;

/// `mp_wait32`: until `*ptr >= value` (unsigned).
pub const MP_WAIT_GEQ: c_int = 0;
/// `mp_wait32`: until `*ptr == value` (LibMP tested `>`: fixed).
pub const MP_WAIT_EQ: c_int = 1;
/// `mp_wait32`: until `*ptr & value` is not 0.
pub const MP_WAIT_AND: c_int = 2;

/// How long `mp_wait32` waits before it fails (the wait never spins forever).
const WAIT32_TIMEOUT: Duration = Duration::from_secs(60);

/// Exposes `size` bytes at `addr` as this rank's part of a new window (collective: every
/// rank calls it, each with its own region); the handle goes to `*window`.
#[no_mangle]
pub extern "C" fn mp_window_create(
    addr: *mut c_void,
    size: usize,
    window: *mut *mut mp_window,
) -> c_int {
    mp_guard("mp_window_create", || {
        args::check_ptr(window, "window")?;
        let pd = with_comm(|c| Ok(c.pd().clone()))?;
        // SAFETY: the header's contract: the memory stays allocated until mp_window_destroy.
        let mr = unsafe { pd.register_raw(addr.cast(), size, Access::ALL)? };
        let w = with_comm(|c| Ok(c.window(&mr)?))?;
        args::write(
            window,
            handle::insert::<mp_window>(Arc::new((w, mr)))?,
            "window",
        )
    })
}

/// Destroys `*window` (this rank's region is no longer exposed) and sets it to NULL.
#[no_mangle]
pub extern "C" fn mp_window_destroy(window: *mut *mut mp_window) -> c_int {
    mp_guard("mp_window_destroy", || {
        handle::remove(deref_handle(window, "window")?, "*window")?;
        args::write(window, std::ptr::null_mut(), "window")
    })
}

/// What a put's arguments name: the source SGE and the window (`req` and `flags` checked).
pub(crate) fn put_args(
    (src, size, src_reg): (*mut c_void, c_int, *mut *mut mp_reg),
    window: *mut *mut mp_window,
    req: *mut *mut mp_request,
    flags: c_int,
) -> Result<(gdsync::Sge, SharedWindow), Fail> {
    args::check_ptr(req, "req")?;
    if flags & !(MP_PUT_INLINE | MP_PUT_NOWAIT) != 0 {
        return Err(Fail::invalid(format!(
            "flags {flags:#x} has bits that are no MP_PUT_ flag"
        )));
    }
    let sge = sge_in(src, size, src_reg)?;
    let w = handle::get(deref_handle(window, "window")?, "*window")?;
    Ok((sge, w))
}

/// Writes `size` bytes at `src` (inside `*src_reg`) into `peer`'s part of `*window` at
/// byte `displ`; the request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_iput(
    src: *mut c_void,
    size: c_int,
    src_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    window: *mut *mut mp_window,
    req: *mut *mut mp_request,
    flags: c_int,
) -> c_int {
    mp_guard("mp_iput", || {
        let (sge, w) = put_args((src, size, src_reg), window, req, flags)?;
        let r = with_comm(|c| Ok(c.iput(sge, &w.0, rank(peer)?, displ as u64)?))?;
        give_request(r, req)
    })
}

/// Reads `size` bytes of `peer`'s part of `*window` at byte `displ` into `dst` (inside
/// `*dst_reg`); the request goes to `*req`.
#[no_mangle]
pub extern "C" fn mp_iget(
    dst: *mut c_void,
    size: c_int,
    dst_reg: *mut *mut mp_reg,
    peer: c_int,
    displ: usize,
    window: *mut *mut mp_window,
    req: *mut *mut mp_request,
) -> c_int {
    mp_guard("mp_iget", || {
        args::check_ptr(req, "req")?;
        let sge = sge_in(dst, size, dst_reg)?;
        let w = handle::get(deref_handle(window, "window")?, "*window")?;
        let r = with_comm(|c| Ok(c.iget(sge, &w.0, rank(peer)?, displ as u64)?))?;
        give_request(r, req)
    })
}

/// Waits on the CPU until the word at `ptr` meets `value` under `flags` (`MP_WAIT_GEQ`,
/// `MP_WAIT_EQ`, `MP_WAIT_AND`); fails after 60 s rather than spin forever.
#[no_mangle]
pub extern "C" fn mp_wait32(ptr: *mut u32, value: u32, flags: c_int) -> c_int {
    mp_guard("mp_wait32", || {
        let met: fn(u32, u32) -> bool = match flags {
            MP_WAIT_GEQ => |v, x| v >= x,
            MP_WAIT_EQ => |v, x| v == x,
            MP_WAIT_AND => |v, x| v & x != 0,
            f => return Err(Fail::invalid(format!("flags {f} is no MP_WAIT_ condition"))),
        };
        let word = args::word32(ptr, "ptr")?;
        let start = Instant::now();
        let mut spins = 0u32;
        while !met(word.load(Ordering::Acquire), value) {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if start.elapsed() > WAIT32_TIMEOUT {
                    let now = word.load(Ordering::Acquire);
                    return Err(Fail::new(GDASYNC_ERR_TIMEOUT, format!("the word at {ptr:p} is {now:#x}, still not meeting {value:#x} (flags {flags}) after {} s", WAIT32_TIMEOUT.as_secs())));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    })
}

/// Waits until every rank has called it (not in LibMP, which left barriers to MPI).
#[no_mangle]
pub extern "C" fn mp_barrier() -> c_int {
    mp_guard("mp_barrier", || with_comm(|c| Ok(c.barrier()?)))
}
