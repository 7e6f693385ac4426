//! What the C ABI tests share: the last error message, and checks of a refused call.

// Each test file uses what it needs of these.
#![allow(dead_code)]

use gdasync_c::gdasync_last_error;
use std::ffi::{c_int, CStr};

/// This thread's last error message.
pub fn last() -> String {
    // SAFETY: gdasync_last_error returns a NUL-terminated string valid until the next failure.
    unsafe { CStr::from_ptr(gdasync_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts `rc` is `code` and the message contains `words`.
#[track_caller]
pub fn refused(rc: c_int, code: c_int, words: &str) {
    let msg = last();
    assert_eq!(rc, code, "status (message: {msg})");
    assert!(msg.contains(words), "message {msg:?} should say {words:?}");
}
