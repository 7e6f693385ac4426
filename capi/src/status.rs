//! Status codes, the thread's last error message, and the guard every exported function runs
//! its body in: errors become a code and a message, and no panic unwinds into C.

use gdsync::Error;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const GDASYNC_OK: c_int = 0;
/// A pointer argument that must not be NULL was NULL.
pub const GDASYNC_ERR_NULL: c_int = -1;
/// A handle is not a live handle of the expected type: destroyed already, of another type,
/// or never made by this library.
pub const GDASYNC_ERR_HANDLE: c_int = -2;
/// An argument is out of range or inconsistent.
pub const GDASYNC_ERR_INVALID: c_int = -3;
/// A buffer is too small, or a size does not match what the structure needs.
pub const GDASYNC_ERR_SIZE: c_int = -4;
/// The device or this build does not support the operation.
pub const GDASYNC_ERR_UNSUPPORTED: c_int = -5;
/// A wait did not pass in time.
pub const GDASYNC_ERR_TIMEOUT: c_int = -6;
/// Work completed with an error status.
pub const GDASYNC_ERR_COMPLETION: c_int = -7;
/// A queue is full: poll or wait for completions, then post again.
pub const GDASYNC_ERR_AGAIN: c_int = -8;
/// The object is in the wrong state for the call (a QP not connected or in error, a commit
/// out of order, a CQ whose completions a queued wait owns, a finalized communicator).
pub const GDASYNC_ERR_STATE: c_int = -9;
/// The device, the peer, CUDA or the operating system failed.
pub const GDASYNC_ERR_SYSTEM: c_int = -10;
/// A bug in gdasync was caught (a Rust panic) before it reached the caller.
pub const GDASYNC_ERR_INTERNAL: c_int = -11;

/// A failed call: its status code and message.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: c_int,
    pub(crate) msg: String,
}

/// Result of an exported function's body.
pub(crate) type Res<T> = Result<T, Fail>;

impl Fail {
    pub(crate) fn new(code: c_int, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }
    pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
        Fail::new(GDASYNC_ERR_INVALID, msg)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::InvalidArgument(_) => GDASYNC_ERR_INVALID,
            Error::NotConnected { .. }
            | Error::QpInError { .. }
            | Error::OutOfOrder { .. }
            | Error::NotWaitable(_)
            | Error::CqBusy { .. } => GDASYNC_ERR_STATE,
            Error::RingFull { .. } => GDASYNC_ERR_AGAIN,
            Error::Timeout { .. } => GDASYNC_ERR_TIMEOUT,
            Error::Completion { .. } | Error::CqOverrun { .. } => GDASYNC_ERR_COMPLETION,
            Error::Unsupported(_) | Error::NoCuda(_) => GDASYNC_ERR_UNSUPPORTED,
            _ => GDASYNC_ERR_SYSTEM,
        };
        Fail::new(code, e.to_string())
    }
}

thread_local! {
    /// The message of the last call that failed on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `f` as this thread's last error and returns its code.
pub(crate) fn record(f: Fail) -> c_int {
    // A message with a NUL in it is cut there rather than lost.
    let msg = f.msg.split('\0').next().unwrap_or_default().to_owned();
    let msg = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
    f.code
}

/// Runs an exported function's body: its value on success; on failure (or a panic, turned
/// into [`GDASYNC_ERR_INTERNAL`]) the code, with the message recorded for
/// [`gdasync_last_error`]. `what` names the function in the message.
pub(crate) fn guard(what: &str, body: impl FnOnce() -> Res<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => record(Fail::new(f.code, format!("{what}: {}", f.msg))),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            record(Fail::new(
                GDASYNC_ERR_INTERNAL,
                format!("{what}: internal error (a bug in gdasync, please report it): {why}"),
            ))
        }
    }
}

/// The message of the last call that failed on this thread ("" if none has). The string
/// stays valid until the next call on this thread fails; copy it to keep it.
#[no_mangle]
pub extern "C" fn gdasync_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// The name of a status code (`"GDASYNC_ERR_HANDLE"`), or `"unknown status"`.
#[no_mangle]
pub extern "C" fn gdasync_status_name(status: c_int) -> *const c_char {
    let s: &'static [u8] = match status {
        GDASYNC_OK => b"GDASYNC_OK\0",
        GDASYNC_ERR_NULL => b"GDASYNC_ERR_NULL\0",
        GDASYNC_ERR_HANDLE => b"GDASYNC_ERR_HANDLE\0",
        GDASYNC_ERR_INVALID => b"GDASYNC_ERR_INVALID\0",
        GDASYNC_ERR_SIZE => b"GDASYNC_ERR_SIZE\0",
        GDASYNC_ERR_UNSUPPORTED => b"GDASYNC_ERR_UNSUPPORTED\0",
        GDASYNC_ERR_TIMEOUT => b"GDASYNC_ERR_TIMEOUT\0",
        GDASYNC_ERR_COMPLETION => b"GDASYNC_ERR_COMPLETION\0",
        GDASYNC_ERR_AGAIN => b"GDASYNC_ERR_AGAIN\0",
        GDASYNC_ERR_STATE => b"GDASYNC_ERR_STATE\0",
        GDASYNC_ERR_SYSTEM => b"GDASYNC_ERR_SYSTEM\0",
        GDASYNC_ERR_INTERNAL => b"GDASYNC_ERR_INTERNAL\0",
        _ => b"unknown status\0",
    };
    s.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic inside a call comes back as GDASYNC_ERR_INTERNAL with its message; it does not
    /// unwind into the caller.
    #[test]
    fn a_panic_becomes_an_internal_error() {
        let rc = guard("gdasync_test", || panic!("boom {}", 42));
        assert_eq!(rc, GDASYNC_ERR_INTERNAL);
        // SAFETY: the last error is a NUL-terminated string owned by this thread.
        let msg = unsafe { std::ffi::CStr::from_ptr(gdasync_last_error()) };
        let msg = msg.to_str().unwrap();
        assert!(
            msg.starts_with("gdasync_test: internal error") && msg.ends_with("boom 42"),
            "{msg}"
        );
        let rc = guard("gdasync_test", || std::panic::panic_any(7u8));
        assert_eq!(rc, GDASYNC_ERR_INTERNAL);
    }

    #[test]
    fn messages_with_a_nul_are_cut_there() {
        let rc = record(Fail::invalid("before\0after"));
        assert_eq!(rc, GDASYNC_ERR_INVALID);
        // SAFETY: as above.
        let msg = unsafe { std::ffi::CStr::from_ptr(gdasync_last_error()) };
        assert_eq!(msg.to_str().unwrap(), "before");
    }
}
