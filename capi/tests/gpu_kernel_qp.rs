//! On a GPU: a CUDA kernel (NVRTC-compiled after gdsync.cuh) drives QPs made, connected and
//! handed over through the C API (`gdasync_qp_to_kernel`), on the soft device: it posts the
//! receives and the sends, polls both CQs and checks every message; then the QPs come back to
//! the CPU (`gdasync_qp_to_host`) and the C API posts on them again. Ignored unless asked for:
//! `GDSYNC_TEST_CUDA=1 cargo test --release -p gdasync-c --test gpu_kernel_qp -- --include-ignored`
//! (it then requires a GPU). `tests/kernel_qp.rs` runs the same hand-over with the CPU in the
//! kernel's place.

mod common;

use gdasync_c::*;
use gdsync::cuda::{Cuda, CudaStream, Module};
use gdsync::kernel::QpDesc;
use gdsync::PinnedBuffer;
use std::ffi::c_int;
use std::ptr::{null, null_mut};

/// The test kernel (compiled with NVRTC after the header).
const KERNEL: &str = include_str!("kernels/c_api_qp.cu");

const ROUNDS: u64 = 1000;

#[track_caller]
fn ok(rc: c_int) {
    assert_eq!(rc, GDASYNC_OK, "{}", common::last());
}

/// A QP with its own CQs, and a pinned buffer registered for it.
struct Side {
    qp: *mut gdasync_qp,
    buf: PinnedBuffer,
    info: gdasync_mr_info,
}

fn side(dev: *mut gdasync_device, pd: *mut gdasync_pd) -> Side {
    let (mut scq, mut rcq, mut qp, mut mr) = (null_mut(), null_mut(), null_mut(), null_mut());
    ok(gdasync_cq_create(dev, 256, &mut scq));
    ok(gdasync_cq_create(dev, 256, &mut rcq));
    ok(gdasync_qp_create(pd, scq, rcq, null(), &mut qp));
    let buf = PinnedBuffer::new(4096);
    let access = GDASYNC_ACCESS_LOCAL_WRITE | GDASYNC_ACCESS_REMOTE_WRITE;
    ok(gdasync_mr_reg(
        pd,
        buf.addr() as *mut _,
        4096,
        access,
        &mut mr,
    ));
    let mut info = gdasync_mr_info::default();
    ok(gdasync_mr_query(mr, &mut info));
    Side { qp, buf, info }
}

fn connect(a: &Side, b: &Side) {
    let (mut ea, mut eb) = ([0; GDASYNC_ENDPOINT_MAX], [0; GDASYNC_ENDPOINT_MAX]);
    ok(gdasync_qp_endpoint(a.qp, ea.as_mut_ptr(), ea.len()));
    ok(gdasync_qp_endpoint(b.qp, eb.as_mut_ptr(), eb.len()));
    ok(gdasync_qp_connect(a.qp, eb.as_ptr()));
    ok(gdasync_qp_connect(b.qp, ea.as_ptr()));
}

#[test]
#[ignore = "needs a CUDA GPU: GDSYNC_TEST_CUDA=1 cargo test --release -p gdasync-c --test gpu_kernel_qp -- --include-ignored"]
fn a_cuda_kernel_drives_qps_made_through_the_c_api() {
    match Cuda::get() {
        Ok(c) if !c.gpus.is_empty() => {}
        Ok(_) => panic!("this GPU test needs a CUDA GPU: the driver reports none"),
        Err(e) => panic!("this GPU test needs a CUDA GPU: {e}"),
    }
    let (mut dev, mut pd) = (null_mut(), null_mut());
    ok(gdasync_device_open(c"soft".as_ptr(), &mut dev));
    ok(gdasync_pd_alloc(dev, &mut pd));
    let (a, b) = (side(dev, pd), side(dev, pd));
    connect(&a, &b);
    let (mut da, mut db) = (QpDesc::default(), QpDesc::default());
    ok(gdasync_qp_to_kernel(a.qp, &mut da));
    ok(gdasync_qp_to_kernel(b.qp, &mut db));
    let mut mapped = 0;
    ok(gdasync_qp_kernel_gpu_mapped(a.qp, &mut mapped));
    assert_eq!(mapped, 1, "the rings must be GPU-mapped");

    let m = Module::compile(0, KERNEL).unwrap();
    let stream = CudaStream::new(0).unwrap();
    let out = PinnedBuffer::new(64);
    let (abuf, alkey, bbuf, blkey) = (a.buf.gpu_addr(), a.info.lkey, b.buf.gpu_addr(), b.info.lkey);
    let (rounds, out_addr) = (ROUNDS, out.gpu_addr());
    let f = m.function("c_api_qp").unwrap();
    let mut l = f.launch_builder(&stream);
    l.arg(&da)
        .arg(&db)
        .arg(&abuf)
        .arg(&alkey)
        .arg(&bbuf)
        .arg(&blkey);
    l.arg(&rounds).arg(&out_addr);
    let start = std::time::Instant::now();
    // SAFETY: the parameters match c_api_qp; the QPs, buffers and `out` outlive the kernel
    // (synchronised below).
    unsafe { l.launch(1, 1).unwrap() };
    stream.synchronize().unwrap();
    let took = start.elapsed();
    let mut w = [0u8; 24];
    out.read_at(0, &mut w);
    let word = |k: usize| u64::from_ne_bytes(w[8 * k..8 * k + 8].try_into().unwrap());
    assert_eq!(
        (word(0), word(1), word(2)),
        (0, 0, ROUNDS),
        "kernel: status, bad bytes, rounds"
    );
    let mut p = gdsync::kernel::DeviceQpProgress::default();
    ok(gdasync_qp_kernel_progress(a.qp, &mut p));
    assert_eq!((p.sends_posted, p.sends_retired), (ROUNDS, ROUNDS));
    ok(gdasync_qp_kernel_progress(b.qp, &mut p));
    assert_eq!((p.recvs_posted, p.recvs_retired), (ROUNDS, ROUNDS));
    eprintln!(
        "a kernel drove QPs made through gdasync.h: {ROUNDS} sends in {took:?} ({:.2} us each)",
        took.as_secs_f64() * 1e6 / ROUNDS as f64
    );

    // Back to the CPU, which sends on from there.
    ok(gdasync_qp_to_host(a.qp));
    ok(gdasync_qp_to_host(b.qp));
    let sge = gdasync_sge {
        addr: b.info.addr + 64,
        length: 64,
        lkey: b.info.lkey,
    };
    ok(gdasync_qp_post_recv(b.qp, 1, &sge, 1, null_mut()));
    let src = gdasync_sge {
        addr: a.info.addr,
        length: 64,
        lkey: a.info.lkey,
    };
    let wr = gdasync_send_wr {
        wr_id: 2,
        opcode: GDASYNC_WR_SEND,
        flags: GDASYNC_SEND_SIGNALED,
        sg_list: &src,
        num_sge: 1,
        imm_data: 0,
        remote_addr: 0,
        rkey: 0,
        reserved: 0,
        compare_add: 0,
        swap: 0,
    };
    ok(gdasync_qp_post_send(a.qp, &wr, null_mut()));
    ok(gdasync_qp_destroy(a.qp));
    ok(gdasync_qp_destroy(b.qp));
    ok(gdasync_pd_free(pd));
    ok(gdasync_device_close(dev));
}
