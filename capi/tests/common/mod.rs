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

/// This thread's last mp.h error message.
pub fn mp_last() -> String {
    // SAFETY: mp_last_error returns a NUL-terminated string valid until the next failure.
    unsafe { CStr::from_ptr(gdasync_c::mp_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts an mp.h call failed with a message containing `words`.
#[track_caller]
pub fn mp_fails(rc: c_int, words: &str) {
    let msg = mp_last();
    assert_eq!(
        rc,
        gdasync_c::MP_FAILURE,
        "expected a failure saying {words:?}"
    );
    assert!(msg.contains(words), "message {msg:?} should say {words:?}");
}

/// Asserts an mp.h call succeeded.
#[track_caller]
pub fn mp_ok(rc: c_int) {
    assert_eq!(rc, gdasync_c::MP_SUCCESS, "{}", mp_last());
}

/// Sets the environment of a job of one rank over the TCP bootstrap on a free loopback port,
/// on the soft device (for `mp_init_env`).
pub fn one_rank_env() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::env::set_var("GDSYNC_RANK", "0");
    std::env::set_var("GDSYNC_SIZE", "1");
    std::env::set_var("GDSYNC_ROOT", format!("127.0.0.1:{port}"));
    std::env::set_var("GDSYNC_JOB_SECRET", "ab".repeat(32));
    std::env::set_var("GDSYNC_DEVICE", "soft");
}
