//! # gdasync-c: the C ABI of gdasync
//!
//! `libgdasync.so` and `libgdasync.a`, with `include/gdasync.h` (generated from the
//! declarations here, checked in). Every exported function checks its pointers, returns a
//! status code (`GDASYNC_OK`, or a negative `GDASYNC_ERR_*`) with the message kept for
//! [`gdasync_last_error`] on the calling thread, and never lets a panic unwind into C.
//! Handles are opaque values the library never dereferences: a destroyed handle, or one of
//! another type, is refused with `GDASYNC_ERR_HANDLE`.

// The exported types carry their C names (gdasync_qp, gdasync_wc), which the header repeats.
#![allow(non_camel_case_types)]

mod args;
mod device;
mod handle;
mod kernel_qp;
mod mp_buf;
mod mp_p2p;
mod mp_prepare;
mod mp_queue;
mod mp_signal;
mod mp_state;
mod mp_stream;
mod mp_vec;
mod mp_win;
mod mr;
mod ops;
mod qp;
mod status;
mod stream;

pub use device::*;
pub use kernel_qp::*;
pub use mp_buf::MP_IOV_MAX;
pub use mp_p2p::*;
pub use mp_prepare::*;
pub use mp_queue::*;
pub use mp_signal::*;
pub use mp_state::*;
pub use mp_stream::*;
pub use mp_vec::*;
pub use mp_win::*;
pub use mr::*;
pub use ops::*;
pub use qp::*;
pub use status::*;
pub use stream::*;

/// The library's version, `"MAJOR.MINOR.PATCH"`.
#[no_mangle]
pub extern "C" fn gdasync_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
