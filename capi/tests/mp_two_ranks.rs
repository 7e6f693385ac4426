//! mp.h's vector calls and descriptor queue carrying data between two ranks (this test's
//! process is rank 0; it runs itself again as rank 1), on the soft device, over the TCP
//! bootstrap, with the descriptor queue posted on MP_HOST_STREAM; and a barrier that
//! MP_HOST_STREAM runs.

mod common;

use common::{mp_ok as ok, one_rank_env};
use gdasync_c::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

const TEST: &str = "vectors_and_a_descriptor_queue_carry_data_between_two_ranks";

/// The block of `len` bytes at byte `at` of `buf`.
fn iov(buf: &mut [u8], at: usize, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: buf[at..].as_mut_ptr() as *mut c_void,
        iov_len: len,
    }
}

/// Rank 0: a vector send of three blocks, then a prepared vector send posted by a descriptor
/// queue, which writes a word before and after the send's completion wait.
fn rank0(buf: &mut [u8], reg: &mut *mut mp_reg) {
    let mut req = null_mut();
    let mut v = [iov(buf, 0, 4), iov(buf, 4, 4), iov(buf, 8, 8)];
    ok(mp_isendv(v.as_mut_ptr(), 3, 1, reg, &mut req));
    ok(mp_wait(&mut req));
    let host = MP_HOST_STREAM_BITS as *mut c_void;
    let (mut dq, flag) = (null_mut(), AtomicU32::new(0));
    let mut v = [iov(buf, 16, 8), iov(buf, 24, 8)];
    ok(mp_sendv_prepare(v.as_mut_ptr(), 2, 1, reg, &mut req));
    ok(mp_desc_queue_alloc(&mut dq));
    ok(mp_desc_queue_add_send(&mut dq, &mut req));
    ok(mp_desc_queue_add_write_value32(&mut dq, flag.as_ptr(), 1));
    ok(mp_desc_queue_add_wait_send(&mut dq, &mut req));
    ok(mp_desc_queue_add_write_value32(&mut dq, flag.as_ptr(), 2));
    ok(mp_desc_queue_post_on_stream(host, &mut dq, 0));
    ok(mp_wait32(flag.as_ptr(), 2, MP_WAIT_EQ));
    ok(mp_wait(&mut req));
    ok(mp_desc_queue_free(&mut dq));
    assert_eq!(flag.load(Ordering::Acquire), 2);
}

/// Rank 1: a vector receive of two blocks, then a plain receive; checks the bytes.
fn rank1(buf: &mut [u8], reg: &mut *mut mp_reg) {
    let mut req = null_mut();
    let mut v = [iov(buf, 0, 10), iov(buf, 10, 6)];
    ok(mp_irecvv(v.as_mut_ptr(), 2, 0, reg, &mut req));
    ok(mp_wait(&mut req));
    ok(mp_irecv(
        buf[16..].as_mut_ptr() as *mut c_void,
        16,
        0,
        reg,
        &mut req,
    ));
    ok(mp_wait(&mut req));
    let want: Vec<u8> = (0..32).collect();
    assert_eq!(&buf[..32], &want[..], "rank 1 got the blocks in order");
}

/// Both ranks queue a barrier on MP_HOST_STREAM and, behind it, a write of a flag; rank 1
/// arrives 400 ms late. Rank 0's flag stays 0 until then (its stream waits at the barrier;
/// its CPU did not), then both flags become 1.
fn barrier_on_the_host_stream(late: bool) {
    let host = MP_HOST_STREAM_BITS as *mut c_void;
    let (mut dq, flag) = (null_mut(), AtomicU32::new(0));
    if late {
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    ok(mp_barrier_on_stream(host));
    ok(mp_desc_queue_alloc(&mut dq));
    ok(mp_desc_queue_add_write_value32(&mut dq, flag.as_ptr(), 1));
    ok(mp_desc_queue_post_on_stream(host, &mut dq, 0));
    if !late {
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(
            flag.load(Ordering::Acquire),
            0,
            "the stream passed the barrier alone"
        );
    }
    ok(mp_wait32(flag.as_ptr(), 1, MP_WAIT_EQ));
    ok(mp_desc_queue_free(&mut dq));
}

#[test]
fn vectors_and_a_descriptor_queue_carry_data_between_two_ranks() {
    let child = std::env::var_os("MP_TWO_RANKS_CHILD").is_some();
    let peer = if child {
        None
    } else {
        one_rank_env();
        std::env::set_var("GDSYNC_SIZE", "2");
        let exe = std::env::current_exe().unwrap();
        let c = std::process::Command::new(exe)
            .args(["--exact", TEST, "--nocapture"])
            .env("MP_TWO_RANKS_CHILD", "1")
            .env("GDSYNC_RANK", "1")
            .spawn()
            .expect("run rank 1");
        Some(c)
    };
    ok(mp_init_env(0, -1));
    let mut buf: Vec<u8> = if child {
        vec![0; 64]
    } else {
        (0..64).collect()
    };
    let mut reg = null_mut();
    ok(mp_register(buf.as_mut_ptr() as *mut c_void, 64, &mut reg));
    if child {
        rank1(&mut buf, &mut reg);
    } else {
        rank0(&mut buf, &mut reg);
    }
    barrier_on_the_host_stream(child);
    ok(mp_barrier());
    ok(mp_deregister(&mut reg));
    ok(mp_finalize());
    if let Some(mut c) = peer {
        assert!(c.wait().unwrap().success(), "rank 1 passed");
    }
}
