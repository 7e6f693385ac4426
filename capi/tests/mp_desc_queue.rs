//! mp.h's descriptor queue through the C ABI, in a one-rank job on the host stream
//! (MP_HOST_STREAM): waits and writes run in the queue's order once posted, and bad input
//! (NULL and freed queues, wrong flags, requests in the wrong state) fails with MP_FAILURE
//! and a message, never a crash.

mod common;

use common::{mp_fails as fails, mp_ok as ok, one_rank_env};
use gdasync_c::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Waits up to 2 s for `w` to hold `v`.
fn eventually(w: &AtomicU32, v: u32) -> bool {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if w.load(Ordering::Acquire) == v {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn descriptor_queue_posts_in_order_and_refuses_bad_input() {
    one_rank_env();
    ok(mp_init_env(0, -1));
    let host = MP_HOST_STREAM_BITS as *mut c_void;
    let mut dq = null_mut();
    fails(mp_desc_queue_alloc(null_mut()), "dq is NULL");
    ok(mp_desc_queue_alloc(&mut dq));
    // Empty: posts nothing and succeeds (as LibMP); flags other than 0 are refused.
    ok(mp_desc_queue_post_on_stream(host, &mut dq, 0));
    fails(mp_desc_queue_post_on_stream(host, &mut dq, 1), "flags 1");

    // The stream waits for `gate`, then writes `a` and `b` in order; nothing runs before the post.
    let (gate, a, b) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    let p = |w: &AtomicU32| w.as_ptr();
    fails(
        mp_desc_queue_add_wait_value32(&mut dq, p(&gate), 1, 3),
        "flags 3",
    );
    fails(
        mp_desc_queue_add_wait_value32(&mut dq, null_mut(), 1, MP_WAIT_EQ),
        "ptr is NULL",
    );
    ok(mp_desc_queue_add_wait_value32(
        &mut dq,
        p(&gate),
        1,
        MP_WAIT_GEQ,
    ));
    ok(mp_desc_queue_add_write_value32(&mut dq, p(&a), 7));
    ok(mp_desc_queue_add_wait_value32(
        &mut dq,
        p(&a),
        7,
        MP_WAIT_EQ,
    ));
    ok(mp_desc_queue_add_write_value32(&mut dq, p(&b), 9));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        a.load(Ordering::Acquire),
        0,
        "added, not posted: nothing ran"
    );
    ok(mp_desc_queue_post_on_stream(host, &mut dq, 0));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        b.load(Ordering::Acquire),
        0,
        "the stream waits for the gate"
    );
    gate.store(1, Ordering::Release);
    assert!(eventually(&b, 9), "the stream ran the queue after the gate");
    assert_eq!(a.load(Ordering::Acquire), 7);
    // The queue is empty after the post: posting it again runs nothing more.
    a.store(0, Ordering::Release);
    ok(mp_desc_queue_post_on_stream(host, &mut dq, 0));
    ok(mp_wait32(p(&b), 9, MP_WAIT_EQ));
    assert_eq!(a.load(Ordering::Acquire), 0, "a posted queue is empty");

    // Requests: a send must be prepared, a wait must be for a posted request or a queued send.
    let mut buf = vec![0u8; 64];
    let (mut reg, mut req) = (null_mut(), null_mut());
    ok(mp_register(buf.as_mut_ptr() as *mut c_void, 64, &mut reg));
    let mut win = null_mut();
    ok(mp_window_create(
        buf.as_mut_ptr() as *mut c_void,
        64,
        &mut win,
    ));
    ok(mp_put_prepare(
        buf.as_mut_ptr() as *mut c_void,
        8,
        &mut reg,
        0,
        0,
        &mut win,
        &mut req,
        0,
    ));
    fails(
        mp_desc_queue_add_wait_send(&mut dq, &mut req),
        "add it with mp_desc_queue_add_send",
    );
    fails(mp_desc_queue_add_send(&mut dq, null_mut()), "req is NULL");
    let mut dead = 0x5678usize as *mut mp_request;
    fails(
        mp_desc_queue_add_send(&mut dq, &mut dead),
        "not a live mp_request",
    );
    ok(mp_desc_queue_add_send(&mut dq, &mut req));
    fails(
        mp_desc_queue_add_send(&mut dq, &mut req),
        "added to a queue already",
    );
    ok(mp_desc_queue_add_wait_send(&mut dq, &mut req));
    // One rank has no peer to put to: refused at the post, kept in the queue, request prepared.
    fails(mp_desc_queue_post_on_stream(host, &mut dq, 0), "not a peer");
    fails(mp_wait(&mut req), "never posted");
    fails(mp_desc_queue_post_on_stream(host, &mut dq, 0), "not a peer");
    let cuda_stream = 0x1000usize as *mut c_void;
    fails(
        mp_desc_queue_post_on_stream(cuda_stream, &mut dq, 0),
        "gpu_id -1",
    );

    // Freeing drops what was not posted; a freed or NULL queue is refused.
    let stale = dq;
    ok(mp_desc_queue_free(&mut dq));
    assert!(dq.is_null(), "free sets the handle to NULL");
    let mut stale = stale;
    fails(
        mp_desc_queue_post_on_stream(host, &mut stale, 0),
        "destroyed already",
    );
    fails(
        mp_desc_queue_add_write_value32(&mut stale, p(&a), 1),
        "destroyed already",
    );
    fails(mp_desc_queue_free(&mut stale), "destroyed already");
    fails(
        mp_desc_queue_post_on_stream(host, null_mut(), 0),
        "dq is NULL",
    );
    fails(mp_desc_queue_free(null_mut()), "dq is NULL");
    ok(mp_window_destroy(&mut win));
    ok(mp_deregister(&mut reg));
    ok(mp_finalize());
    fails(mp_desc_queue_alloc(&mut dq), "finalized");
}
