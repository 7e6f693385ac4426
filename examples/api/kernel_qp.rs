//! A kernel-driven queue pair: the host creates and connects a QP, hands it to the GPU
//! (`into_device`), and a CUDA kernel composes the WQE, rings the doorbell and polls the
//! completion by itself (`gds_qp_post_send`, `gds_cq_wait` from `gdsync.cuh`). Needs a CUDA GPU
//! and NVRTC; without one it says so and exits 0 (a GPU program has nothing to show here).
//!
//! ```text
//! cargo run --release --example kernel_qp
//! ```

use gdasync::gdsync::cuda::{Cuda, CudaStream, Module};
use gdasync::gdsync::kernel::{code, QpDesc};
use gdasync::gdsync::{Access, Device, PinnedBuffer, QpConfig, Result};

/// One RDMA write posted and waited for by the kernel; its return code lands in `out`.
const KERNEL: &str = r#"
extern "C" __global__ void write_once(gds_qp q, uint64_t src, uint32_t lkey, uint32_t len,
                                      uint64_t raddr, uint32_t rkey, uint64_t out) {
    gds_wc wc;
    int rc = gds_qp_post_send(&q, GDS_OP_RDMA_WRITE, src, lkey, len, raddr, rkey, 0, GDS_SIGNALED);
    if (rc == GDS_OK) rc = gds_cq_wait(&q.send_cq, &wc, 5000000000ull);
    *(volatile long long *)out = rc;
    __threadfence_system();
}
"#;

fn main() -> Result<()> {
    if !Cuda::available() {
        println!("skipped: no GPU (kernel_qp needs a CUDA GPU and NVRTC)");
        return Ok(());
    }
    let module = Module::compile(0, KERNEL)?;
    let stream = CudaStream::new(0)?;

    let dev = Device::soft()?;
    let pd = dev.alloc_pd();
    // A device QP has CQs of its own: the kernel polls them.
    let (scq, rcq, cq_b) = (
        dev.create_cq(256)?,
        dev.create_cq(256)?,
        dev.create_cq(256)?,
    );
    let mut a = pd.create_qp(&scq, &rcq, &QpConfig::default())?;
    let mut b = pd.create_qp(&cq_b, &cq_b, &QpConfig::default())?;
    a.connect(&b.endpoint())?;
    b.connect(&a.endpoint())?;
    let a = a.into_device()?; // from here on, only the kernel posts on it

    let (src, dst, out) = (
        PinnedBuffer::new(32),
        PinnedBuffer::new(32),
        PinnedBuffer::new(8),
    );
    src.write_at(0, b"posted by a CUDA kernel");
    let src_mr = pd.register_pinned(&src, Access::empty())?;
    let dst_mr = pd.register_pinned(&dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;

    let q: QpDesc = a.desc();
    let (s, lkey, len) = (src.addr(), src_mr.lkey(), 23u32);
    let (raddr, rkey, o) = (dst_mr.addr(), dst_mr.rkey(), out.addr());
    let f = module.function("write_once")?;
    let mut l = f.launch_builder(&stream);
    l.arg(&q)
        .arg(&s)
        .arg(&lkey)
        .arg(&len)
        .arg(&raddr)
        .arg(&rkey)
        .arg(&o);
    // SAFETY: the parameters match write_once's; the QP, buffers and `out` outlive the kernel
    // (the stream is synchronised before any of them is dropped).
    unsafe { l.launch(1, 1)? };
    stream.synchronize()?;

    let mut rc = [0u8; 8];
    out.read_at(0, &mut rc);
    let rc = i64::from_le_bytes(rc) as i32;
    let mut landed = [0u8; 23];
    dst.read_at(0, &mut landed);
    if rc != code::OK || &landed != b"posted by a CUDA kernel" {
        return Err(gdasync::gdsync::Error::invalid(format!(
            "the kernel's write failed: code {rc}, landed {:?}",
            String::from_utf8_lossy(&landed)
        )));
    }
    println!(
        "executor: a CUDA kernel on GPU 0; RDMA write of 23 bytes completed: {:?}",
        String::from_utf8_lossy(&landed)
    );
    Ok(())
}
