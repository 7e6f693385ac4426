//! Bad input through the C ABI (the extern "C" functions, called as C calls them): NULL
//! pointers and handles, wrong sizes, destroyed handles and handles of another type, garbage.
//! Each gets its status code and a message that names the cause, never a crash.

mod common;

use common::{last, refused};
use gdasync_c::*;
use std::ffi::{c_char, c_int, CStr};
use std::ptr::{null, null_mut};

fn c(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap()
}

/// Asserts every status is GDASYNC_OK.
#[track_caller]
fn all_ok(rcs: &[c_int]) {
    for (i, &rc) in rcs.iter().enumerate() {
        assert_eq!(rc, GDASYNC_OK, "call {i}: {}", last());
    }
}

/// A signalled work request of `opcode` with one SGE, to `remote_addr`/`rkey`.
fn wr(opcode: u32, sge: &gdasync_sge, remote_addr: u64, rkey: u32) -> gdasync_send_wr {
    gdasync_send_wr {
        wr_id: 7,
        opcode,
        flags: GDASYNC_SEND_SIGNALED,
        sg_list: sge,
        num_sge: 1,
        imm_data: 0,
        remote_addr,
        rkey,
        reserved: 0,
        compare_add: 0,
        swap: 0,
    }
}

/// Destroys what [`qp`] made.
#[track_caller]
fn teardown(
    dev: *mut gdasync_device,
    pd: *mut gdasync_pd,
    cq: *mut gdasync_cq,
    qp: *mut gdasync_qp,
) {
    all_ok(&[
        gdasync_qp_destroy(qp),
        gdasync_cq_destroy(cq),
        gdasync_pd_free(pd),
        gdasync_device_close(dev),
    ]);
}

fn soft() -> *mut gdasync_device {
    let mut dev = null_mut();
    assert_eq!(
        gdasync_device_open(c("soft").as_ptr(), &mut dev),
        GDASYNC_OK,
        "{}",
        last()
    );
    dev
}

/// A device, a PD, a CQ and a QP on it.
fn qp() -> (
    *mut gdasync_device,
    *mut gdasync_pd,
    *mut gdasync_cq,
    *mut gdasync_qp,
) {
    let dev = soft();
    let (mut pd, mut cq, mut qp) = (null_mut(), null_mut(), null_mut());
    assert_eq!(gdasync_pd_alloc(dev, &mut pd), GDASYNC_OK);
    assert_eq!(gdasync_cq_create(dev, 64, &mut cq), GDASYNC_OK);
    assert_eq!(
        gdasync_qp_create(pd, cq, cq, null(), &mut qp),
        GDASYNC_OK,
        "{}",
        last()
    );
    (dev, pd, cq, qp)
}

#[test]
fn null_pointers_and_handles_are_refused_by_name() {
    refused(
        gdasync_device_open(c("soft").as_ptr(), null_mut()),
        GDASYNC_ERR_NULL,
        "gdasync_device_open: out is NULL",
    );
    let mut pd = null_mut();
    refused(
        gdasync_pd_alloc(null_mut(), &mut pd),
        GDASYNC_ERR_NULL,
        "dev (gdasync_device) is NULL",
    );
    assert!(pd.is_null(), "nothing written on failure");
    refused(
        gdasync_qp_connect(null_mut(), c("x").as_ptr()),
        GDASYNC_ERR_NULL,
        "is NULL",
    );
    let (dev, _pd, cq, qp) = qp();
    refused(
        gdasync_qp_connect(qp, null()),
        GDASYNC_ERR_NULL,
        "endpoint is NULL",
    );
    refused(
        gdasync_qp_post_send(qp, null(), null_mut()),
        GDASYNC_ERR_NULL,
        "wr is NULL",
    );
    refused(
        gdasync_cq_poll(cq, null_mut(), 4),
        GDASYNC_ERR_NULL,
        "wc is NULL",
    );
    refused(
        gdasync_cq_wait(cq, null_mut(), 1),
        GDASYNC_ERR_NULL,
        "wc is NULL",
    );
    let mut n = 0u32;
    refused(
        gdasync_qp_num(qp, null_mut()),
        GDASYNC_ERR_NULL,
        "out is NULL",
    );
    assert_eq!(gdasync_qp_num(qp, &mut n), GDASYNC_OK);
    assert_eq!(gdasync_qp_destroy(qp), GDASYNC_OK);
    assert_eq!(gdasync_device_close(dev), GDASYNC_OK);
}

#[test]
fn destroyed_foreign_and_garbage_handles_are_refused() {
    let (dev, pd, cq, qp) = qp();
    // Another type's handle.
    refused(
        gdasync_qp_destroy(cq.cast()),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_qp",
    );
    refused(
        gdasync_pd_alloc(pd.cast(), &mut null_mut()),
        GDASYNC_ERR_HANDLE,
        "not a live gdasync_device",
    );
    // A pointer the library never made.
    let garbage = 0xdead_beef_usize as *mut gdasync_cq;
    refused(
        gdasync_cq_destroy(garbage),
        GDASYNC_ERR_HANDLE,
        "not made by gdasync",
    );
    let on_stack = &mut 0u64 as *mut u64 as *mut gdasync_qp;
    refused(
        gdasync_qp_destroy(on_stack),
        GDASYNC_ERR_HANDLE,
        "gdasync_qp",
    );
    // Destroyed: every later use and a second destroy.
    assert_eq!(gdasync_qp_destroy(qp), GDASYNC_OK);
    refused(
        gdasync_qp_destroy(qp),
        GDASYNC_ERR_HANDLE,
        "destroyed already",
    );
    let mut ep = [0 as c_char; GDASYNC_ENDPOINT_MAX];
    refused(
        gdasync_qp_endpoint(qp, ep.as_mut_ptr(), ep.len()),
        GDASYNC_ERR_HANDLE,
        "gdasync_qp_endpoint: qp is not a live gdasync_qp",
    );
    // The slot is reused by a new object: the old handle still does not name it.
    let mut cq2 = null_mut();
    assert_eq!(gdasync_cq_create(dev, 16, &mut cq2), GDASYNC_OK);
    refused(gdasync_qp_destroy(qp), GDASYNC_ERR_HANDLE, "gdasync_qp");
    refused(
        gdasync_cq_destroy(qp.cast()),
        GDASYNC_ERR_HANDLE,
        "gdasync_cq",
    );
    // Destroying in any order leaves the others usable.
    assert_eq!(gdasync_device_close(dev), GDASYNC_OK);
    let mut cq3 = null_mut();
    refused(
        gdasync_cq_create(dev, 16, &mut cq3),
        GDASYNC_ERR_HANDLE,
        "destroyed already",
    );
    let mut qp2 = null_mut();
    assert_eq!(
        gdasync_qp_create(pd, cq, cq2, null(), &mut qp2),
        GDASYNC_OK,
        "{}",
        last()
    );
    all_ok(&[
        gdasync_qp_destroy(qp2),
        gdasync_cq_destroy(cq),
        gdasync_cq_destroy(cq2),
        gdasync_pd_free(pd),
    ]);
}

#[test]
fn wrong_sizes_and_bad_values_say_what_to_change() {
    let (dev, pd, cq, qp) = qp();
    let mut small = [0 as c_char; 8];
    refused(
        gdasync_qp_endpoint(qp, small.as_mut_ptr(), small.len()),
        GDASYNC_ERR_SIZE,
        "the buffer has 8",
    );
    refused(
        gdasync_qp_endpoint(qp, null_mut(), 0),
        GDASYNC_ERR_SIZE,
        "needs",
    );
    let mut name = [0 as c_char; 2];
    refused(
        gdasync_device_name(dev, name.as_mut_ptr(), 2),
        GDASYNC_ERR_SIZE,
        "the buffer has 2",
    );
    refused(
        gdasync_device_open(c("mlx5_0:x").as_ptr(), &mut null_mut()),
        GDASYNC_ERR_INVALID,
        "expected soft",
    );
    let unterminated = vec![b'a' as c_char; 5000];
    refused(
        gdasync_device_open(unterminated.as_ptr(), &mut null_mut()),
        GDASYNC_ERR_SIZE,
        "longer than 4096",
    );
    refused(
        gdasync_qp_connect(qp, c("not an endpoint").as_ptr()),
        GDASYNC_ERR_INVALID,
        "not an endpoint string",
    );
    refused(
        gdasync_cq_poll(cq, null_mut(), -1),
        GDASYNC_ERR_INVALID,
        "max is negative",
    );
    let mut wc = gdasync_wc::default();
    assert_eq!(
        gdasync_cq_poll(cq, &mut wc, 1),
        0,
        "nothing to poll: {}",
        last()
    );
    refused(
        gdasync_cq_wait(cq, &mut wc, 10),
        GDASYNC_ERR_TIMEOUT,
        "timed out",
    );
    let attr = gdasync_qp_attr {
        send_wqebbs: 1 << 20,
        ..Default::default()
    };
    refused(
        gdasync_qp_create(pd, cq, cq, &attr, &mut null_mut()),
        GDASYNC_ERR_INVALID,
        "send_wqebbs",
    );
    let mut buf = [0u8; 64];
    let mut mr = null_mut();
    refused(
        gdasync_mr_reg(pd, null_mut(), 64, 0, &mut mr),
        GDASYNC_ERR_INVALID,
        "null pointer",
    );
    refused(
        gdasync_mr_reg(pd, buf.as_mut_ptr().cast(), 0, 0, &mut mr),
        GDASYNC_ERR_INVALID,
        "zero-length",
    );
    refused(
        gdasync_mr_reg(pd, buf.as_mut_ptr().cast(), 64, 0x100, &mut mr),
        GDASYNC_ERR_INVALID,
        "no GDASYNC_ACCESS_ flag",
    );
    refused(
        gdasync_mr_reg(
            pd,
            buf.as_mut_ptr().cast(),
            64,
            GDASYNC_ACCESS_REMOTE_WRITE,
            &mut mr,
        ),
        GDASYNC_ERR_INVALID,
        "need LOCAL_WRITE",
    );
    assert!(mr.is_null());
    teardown(dev, pd, cq, qp);
}

#[test]
fn bad_work_requests_are_refused_before_the_ring() {
    let (dev, pd, cq, qp) = qp();
    let sge = gdasync_sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    };
    let mut wr = wr(99, &sge, 0, 0);
    let post = |wr: &gdasync_send_wr| gdasync_qp_post_send(qp, wr, null_mut());
    refused(post(&wr), GDASYNC_ERR_INVALID, "wr->opcode 99");
    wr.opcode = GDASYNC_WR_SEND;
    wr.flags = 0x40;
    refused(post(&wr), GDASYNC_ERR_INVALID, "wr->flags 0x40");
    wr.flags = GDASYNC_SEND_SIGNALED;
    wr.num_sge = 17;
    refused(post(&wr), GDASYNC_ERR_INVALID, "at most 16");
    wr.num_sge = 1;
    wr.sg_list = null();
    refused(post(&wr), GDASYNC_ERR_NULL, "wr->sg_list is NULL");
    wr.sg_list = &sge;
    refused(post(&wr), GDASYNC_ERR_STATE, "not connected");
    refused(
        gdasync_qp_post_recv(qp, 1, null(), 2, null_mut()),
        GDASYNC_ERR_NULL,
        "sg_list is NULL",
    );
    // The prepare -> commit split: a consumed prepared send and a consumed list are dead.
    let mut p = null_mut();
    refused(
        gdasync_qp_prepare_send(qp, &wr, &mut p),
        GDASYNC_ERR_STATE,
        "not connected",
    );
    let mut peer = null_mut();
    assert_eq!(gdasync_qp_create(pd, cq, cq, null(), &mut peer), GDASYNC_OK);
    let mut ep = [0 as c_char; GDASYNC_ENDPOINT_MAX];
    assert_eq!(
        gdasync_qp_endpoint(peer, ep.as_mut_ptr(), ep.len()),
        GDASYNC_OK
    );
    assert_eq!(
        gdasync_qp_connect(qp, ep.as_ptr()),
        GDASYNC_OK,
        "{}",
        last()
    );
    assert_eq!(
        gdasync_qp_endpoint(qp, ep.as_mut_ptr(), ep.len()),
        GDASYNC_OK
    );
    assert_eq!(
        gdasync_qp_connect(peer, ep.as_ptr()),
        GDASYNC_OK,
        "{}",
        last()
    );
    wr.opcode = GDASYNC_WR_NOP;
    wr.num_sge = 0;
    assert_eq!(
        gdasync_qp_prepare_send(qp, &wr, &mut p),
        GDASYNC_OK,
        "{}",
        last()
    );
    let (mut t, mut ops) = (gdasync_send_ticket::default(), null_mut());
    assert_eq!(
        gdasync_qp_commit(qp, p, &mut t, &mut ops),
        GDASYNC_OK,
        "{}",
        last()
    );
    refused(
        gdasync_qp_commit(qp, p, &mut t, &mut ops),
        GDASYNC_ERR_HANDLE,
        "gdasync_prepared",
    );
    refused(
        gdasync_prepared_free(p),
        GDASYNC_ERR_HANDLE,
        "destroyed already",
    );
    assert_eq!(gdasync_ops_free(ops), GDASYNC_OK);
    refused(gdasync_ops_run(ops), GDASYNC_ERR_HANDLE, "gdasync_ops");
    all_ok(&[gdasync_qp_destroy(peer)]);
    teardown(dev, pd, cq, qp);
}

#[test]
fn the_last_error_is_per_thread_and_status_names_are_known() {
    refused(
        gdasync_pd_free(null_mut()),
        GDASYNC_ERR_NULL,
        "gdasync_pd_free",
    );
    let other = std::thread::spawn(last).join().unwrap();
    assert_eq!(other, "", "another thread's failure is not this thread's");
    // SAFETY: gdasync_status_name returns static NUL-terminated strings.
    let name = |s| {
        unsafe { CStr::from_ptr(gdasync_status_name(s)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(name(GDASYNC_ERR_HANDLE), "GDASYNC_ERR_HANDLE");
    assert_eq!(name(GDASYNC_ERR_INTERNAL), "GDASYNC_ERR_INTERNAL");
    assert_eq!(name(12345), "unknown status");
}

/// The whole path through the ABI: endpoints exchanged as strings, an RDMA write posted on a
/// host stream and its completion waited for there, then a CPU write and a poll.
#[test]
fn a_write_and_its_completion_wait_through_the_abi() {
    let dev = soft();
    let (mut pd, mut scq, mut cq_b, mut a, mut b) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(gdasync_pd_alloc(dev, &mut pd), GDASYNC_OK);
    assert_eq!(gdasync_cq_create(dev, 64, &mut scq), GDASYNC_OK);
    assert_eq!(gdasync_cq_create(dev, 64, &mut cq_b), GDASYNC_OK);
    let mut rcq = null_mut();
    assert_eq!(gdasync_cq_create(dev, 64, &mut rcq), GDASYNC_OK);
    // A send CQ of its own: the stream waits for the send's completion by its number.
    assert_eq!(gdasync_qp_create(pd, scq, rcq, null(), &mut a), GDASYNC_OK);
    assert_eq!(
        gdasync_qp_create(pd, cq_b, cq_b, null(), &mut b),
        GDASYNC_OK
    );
    let (mut ea, mut eb) = (
        [0 as c_char; GDASYNC_ENDPOINT_MAX],
        [0 as c_char; GDASYNC_ENDPOINT_MAX],
    );
    assert_eq!(
        gdasync_qp_endpoint(a, ea.as_mut_ptr(), ea.len()),
        GDASYNC_OK
    );
    assert_eq!(
        gdasync_qp_endpoint(b, eb.as_mut_ptr(), eb.len()),
        GDASYNC_OK
    );
    assert_eq!(gdasync_qp_connect(a, eb.as_ptr()), GDASYNC_OK, "{}", last());
    assert_eq!(gdasync_qp_connect(b, ea.as_ptr()), GDASYNC_OK, "{}", last());
    let mut src = *b"through the C ABI";
    let mut dst = [0u8; 32];
    let (mut smr, mut dmr) = (null_mut(), null_mut());
    assert_eq!(
        gdasync_mr_reg(pd, src.as_mut_ptr().cast(), src.len(), 0, &mut smr),
        GDASYNC_OK
    );
    let rw = GDASYNC_ACCESS_LOCAL_WRITE | GDASYNC_ACCESS_REMOTE_WRITE;
    assert_eq!(
        gdasync_mr_reg(pd, dst.as_mut_ptr().cast(), dst.len(), rw, &mut dmr),
        GDASYNC_OK
    );
    let (mut si, mut di) = (gdasync_mr_info::default(), gdasync_mr_info::default());
    assert_eq!(gdasync_mr_query(smr, &mut si), GDASYNC_OK);
    assert_eq!(gdasync_mr_query(dmr, &mut di), GDASYNC_OK);
    assert_eq!((si.length, di.gpu), (17, -1));
    let sge = gdasync_sge {
        addr: si.addr,
        length: 17,
        lkey: si.lkey,
    };
    let wr = wr(GDASYNC_WR_RDMA_WRITE, &sge, di.addr, di.rkey);
    let mut stream = null_mut();
    assert_eq!(gdasync_stream_create_host(&mut stream), GDASYNC_OK);
    let mut t = gdasync_send_ticket::default();
    assert_eq!(
        gdasync_qp_post_send_on_stream(a, &wr, stream, &mut t),
        GDASYNC_OK,
        "{}",
        last()
    );
    assert_eq!(t.has_cqe, 1);
    assert_eq!(
        gdasync_qp_wait_send_on_stream(a, &t, stream),
        GDASYNC_OK,
        "{}",
        last()
    );
    assert_eq!(gdasync_stream_synchronize(stream), GDASYNC_OK, "{}", last());
    assert_eq!(&dst[..17], b"through the C ABI");
    // Then from the CPU, polled.
    dst = [0; 32];
    assert_eq!(
        gdasync_qp_post_send(a, &wr, null_mut()),
        GDASYNC_OK,
        "{}",
        last()
    );
    let mut wc = gdasync_wc::default();
    assert_eq!(
        gdasync_cq_wait(scq, &mut wc, 5000),
        GDASYNC_OK,
        "{}",
        last()
    );
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, GDASYNC_WC_SUCCESS, GDASYNC_WC_OP_RDMA_WRITE)
    );
    // The device wrote dst behind the compiler's back: read it through a volatile load.
    // SAFETY: dst is a live local array.
    let landed: [u8; 17] = unsafe { std::ptr::read_volatile(dst.as_ptr().cast()) };
    assert_eq!(&landed, b"through the C ABI");
    refused(
        gdasync_stream_cuda_handle(stream, &mut null_mut()),
        GDASYNC_ERR_INVALID,
        "host stream",
    );
    all_ok(&[
        gdasync_stream_destroy(stream),
        gdasync_mr_dereg(smr),
        gdasync_mr_dereg(dmr),
        gdasync_qp_destroy(a),
        gdasync_qp_destroy(b),
        gdasync_cq_destroy(scq),
        gdasync_cq_destroy(cq_b),
        gdasync_cq_destroy(rcq),
        gdasync_pd_free(pd),
        gdasync_device_close(dev),
    ]);
}
