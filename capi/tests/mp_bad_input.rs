//! mp.h through the C ABI, in a one-rank job (mp's state is per process: one test, in order):
//! calls before mp_init_env and after mp_finalize, NULL and dead handles, buffers outside
//! their registration, bad flags; each fails with MP_FAILURE and a message, never a crash.

mod common;

use common::{mp_fails as fails, mp_ok as ok, one_rank_env};
use gdasync_c::*;
use std::ffi::c_void;
use std::ptr::null_mut;

#[test]
fn mp_refuses_bad_input_before_during_and_after_a_job() {
    let mut buf = vec![0u8; 256];
    let p = buf.as_mut_ptr() as *mut c_void;
    let (mut reg, mut req) = (null_mut(), null_mut());
    fails(
        mp_register(p, 256, &mut reg),
        "not initialised: call mp_init_env",
    );
    fails(mp_barrier(), "not initialised");
    let mut v = 0;
    ok(mp_query_param(MP_PARAM_VERSION, &mut v));
    assert_eq!(v, MP_API_VERSION);
    fails(mp_query_param(7, &mut v), "param 7");

    // A job of one rank, over the TCP bootstrap, on a free loopback port.
    one_rank_env();
    fails(mp_init_env(0x100, -1), "no MP_INIT_ flag");
    ok(mp_init_env(0xf, -1));
    fails(mp_init_env(0, -1), "initialised already");
    let (mut rank, mut size) = (-1, -1);
    ok(mp_query_rank(&mut rank, &mut size));
    assert_eq!((rank, size), (0, 1));

    fails(mp_register(p, 256, null_mut()), "reg is NULL");
    fails(mp_register(null_mut(), 256, &mut reg), "null pointer");
    ok(mp_register(p, 256, &mut reg));
    let outside = buf[200..].as_mut_ptr() as *mut c_void;
    fails(
        mp_isend(outside, 100, 0, &mut reg, &mut req),
        "not inside the registration",
    );
    fails(
        mp_isend(p, -1, 0, &mut reg, &mut req),
        "size -1 is negative",
    );
    fails(
        mp_irecv(p, 8, -3, &mut reg, &mut req),
        "peer -3 is negative",
    );
    fails(mp_irecv(p, 8, 5, &mut reg, &mut req), "5");
    fails(mp_irecv(p, 8, 0, null_mut(), &mut req), "is NULL");
    let mut garbage = 0x1234usize as *mut mp_reg;
    fails(
        mp_isend(p, 8, 0, &mut garbage, &mut req),
        "not a live mp_reg",
    );
    fails(mp_wait(null_mut()), "req is NULL");
    let mut dead = 0x5678usize as *mut mp_request;
    fails(mp_wait(&mut dead), "not a live mp_request");
    fails(mp_wait32(null_mut(), 1, MP_WAIT_GEQ), "ptr is NULL");
    let mut word = 5u32;
    fails(mp_wait32(&mut word, 1, 9), "flags 9");
    ok(mp_wait32(&mut word, 5, MP_WAIT_EQ));
    ok(mp_wait32(&mut word, 4, MP_WAIT_GEQ));
    ok(mp_wait32(&mut word, 4, MP_WAIT_AND));
    // The stream family: a CUDA stream needs the GPU given to mp_init_env.
    let cuda_stream = 0x1000usize as *mut c_void;
    fails(
        mp_isend_on_stream(p, 8, 0, &mut reg, &mut req, cuda_stream),
        "gpu_id -1",
    );
    fails(
        mp_wait_on_stream(&mut dead, cuda_stream),
        "not a live mp_request",
    );
    ok(mp_wait_all_on_stream(
        0,
        null_mut(),
        MP_HOST_STREAM_BITS as *mut c_void,
    ));
    ok(mp_progress_all(0, null_mut()));
    ok(mp_barrier());

    let mut win = null_mut();
    ok(mp_window_create(p, 256, &mut win));
    fails(
        mp_iput(p, 8, &mut reg, 0, 0, &mut win, &mut req, 0x10),
        "no MP_PUT_ flag",
    );
    // The prepare/post split: arguments checked at prepare; a request posted once, by the
    // post of its kind; waiting for one never posted fails and keeps it.
    let host = MP_HOST_STREAM_BITS as *mut c_void;
    fails(
        mp_send_prepare(p, 8, 1, &mut reg, &mut req),
        "peer 1 is no rank",
    );
    fails(
        mp_send_prepare(outside, 100, 0, &mut reg, &mut req),
        "not inside",
    );
    fails(
        mp_send_prepare(p, 8, 0, &mut reg, null_mut()),
        "req is NULL",
    );
    fails(
        mp_put_prepare(p, 8, &mut reg, 0, 0, &mut win, &mut req, 0x10),
        "no MP_PUT_ flag",
    );
    fails(
        mp_put_prepare(p, 8, &mut reg, 0, 0, null_mut(), &mut req, 0),
        "is NULL",
    );
    let (mut sreq, mut preq) = (null_mut(), null_mut());
    ok(mp_send_prepare(p, 8, 0, &mut reg, &mut sreq));
    ok(mp_put_prepare(
        p, 8, &mut reg, 0, 16, &mut win, &mut preq, 0,
    ));
    fails(mp_wait(&mut sreq), "never posted");
    fails(mp_wait_all_on_stream(1, &mut sreq, host), "never posted");
    fails(
        mp_iput_post_on_stream(&mut sreq, host),
        "made by mp_send_prepare",
    );
    fails(
        mp_isend_post_on_stream(&mut preq, host),
        "made by mp_put_prepare",
    );
    fails(
        mp_isend_post_on_stream(&mut dead, host),
        "not a live mp_request",
    );
    fails(mp_isend_post_on_stream(null_mut(), host), "req is NULL");
    fails(mp_isend_post_all_on_stream(2, null_mut(), host), "is NULL");
    fails(mp_send_post_on_stream(&mut sreq, cuda_stream), "gpu_id -1");
    // Put with signal: the signal is one aligned 8-byte word inside its registration.
    let sig = buf[8..].as_mut_ptr() as *mut u64;
    fails(
        mp_iput_signal(p, 8, &mut reg, 0, 0, &mut win, sig, &mut reg, 12, &mut req),
        "8-byte word",
    );
    fails(
        mp_iput_signal(
            p,
            8,
            &mut reg,
            0,
            0,
            &mut win,
            (p as usize + 252) as *mut u64,
            &mut reg,
            16,
            &mut req,
        ),
        "not inside",
    );
    fails(
        mp_iput_signal(
            p,
            8,
            &mut reg,
            0,
            0,
            &mut win,
            sig,
            null_mut(),
            16,
            &mut req,
        ),
        "is NULL",
    );
    let (r, w) = (&mut reg as *mut _, &mut win as *mut _);
    let on_stream = |req, s| mp_iput_signal_on_stream(p, 8, r, 0, 0, w, sig, r, 16, req, s);
    fails(on_stream(null_mut(), host), "req is NULL");
    fails(on_stream(&mut req, cuda_stream), "gpu_id -1");
    // One rank has no peer to put to: refused at the post, the request stays prepared.
    fails(mp_iput_post_all_on_stream(1, &mut preq, host), "not a peer");
    fails(
        mp_isend_post_on_stream(&mut preq, host),
        "made by mp_put_prepare",
    );
    // Vector calls: 1 to MP_IOV_MAX blocks that follow one another inside the registration.
    let iov = |at: usize, len: usize| libc::iovec {
        iov_base: buf[at..].as_ptr() as *mut c_void,
        iov_len: len,
    };
    let mut apart = [iov(0, 8), iov(16, 8)];
    fails(
        mp_isendv(apart.as_mut_ptr(), 2, 0, &mut reg, &mut req),
        "block 1 starts at",
    );
    fails(
        mp_irecvv(apart.as_mut_ptr(), 0, 0, &mut reg, &mut req),
        "nblocks 0",
    );
    fails(
        mp_irecvv(apart.as_mut_ptr(), MP_IOV_MAX + 1, 0, &mut reg, &mut req),
        "nblocks 31",
    );
    fails(mp_isendv(null_mut(), 1, 0, &mut reg, &mut req), "is NULL");
    let mut past = [iov(200, 40), iov(240, 40)];
    fails(
        mp_sendv_prepare(past.as_mut_ptr(), 2, 0, &mut reg, &mut req),
        "not inside the registration",
    );
    fails(
        mp_sendv_prepare(past.as_mut_ptr(), 1, 1, &mut reg, &mut req),
        "peer 1 is no rank",
    );
    fails(
        mp_isendv_on_stream(past.as_mut_ptr(), 1, 0, &mut reg, &mut req, cuda_stream),
        "gpu_id -1",
    );
    ok(mp_window_destroy(&mut win));
    assert!(win.is_null(), "destroy sets the handle to NULL");
    let stale = reg;
    ok(mp_deregister(&mut reg));
    assert!(reg.is_null());
    let mut stale = stale;
    fails(mp_deregister(&mut stale), "destroyed already");

    ok(mp_finalize());
    fails(mp_barrier(), "mp was finalized");
    fails(mp_register(p, 256, &mut reg), "finalized");
    fails(mp_finalize(), "finalized");
}
