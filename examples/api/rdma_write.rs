//! A CPU RDMA write: two devices (a NIC each; here soft devices, so it runs anywhere), a queue
//! pair on each connected to the other, one buffer written into the other's memory, and the
//! completion that says it landed.
//!
//! ```text
//! cargo run --release --example rdma_write
//! ```

use gdasync::gdsync::{Access, Device, QpConfig, SendWr};
use std::time::Duration;

fn main() -> Result<(), gdasync::gdsync::Error> {
    // Two NICs. With GDSYNC_DEVICE (or Device::open) the same code drives an mlx5 HCA.
    let (dev_a, dev_b) = (Device::soft()?, Device::soft()?);
    let (pd_a, pd_b) = (dev_a.alloc_pd(), dev_b.alloc_pd());
    let (cq_a, cq_b) = (dev_a.create_cq(64)?, dev_b.create_cq(64)?);
    let mut a = pd_a.create_qp(&cq_a, &cq_a, &QpConfig::default())?;
    let mut b = pd_b.create_qp(&cq_b, &cq_b, &QpConfig::default())?;

    // Endpoints are plain data: between processes they travel out of band (a socket, MPI).
    a.connect(&b.endpoint())?;
    b.connect(&a.endpoint())?;

    // The source on A; the target on B, open to remote writes.
    let mut src = b"written by the NIC, not by a CPU store".to_vec();
    let mut dst = vec![0u8; 64];
    let src_mr = pd_a.register(&mut src, Access::empty())?;
    let dst_mr = pd_b.register(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let remote = dst_mr.remote(); // address, length and rkey: what B would send to A

    // Post the write and wait for its completion (an error completion comes back as Err).
    a.post_send(&SendWr::write(remote.at(0)).sge(src_mr.sge(..)).wr_id(1))?;
    let done = cq_a.wait_one(Duration::from_secs(5))?.ok()?;

    let mut landed = vec![0u8; src_mr.len()];
    dst_mr.read_at(0, &mut landed);
    assert_eq!(landed, b"written by the NIC, not by a CPU store");
    println!(
        "RDMA write of {} bytes completed (wr_id {}): {:?}",
        src_mr.len(),
        done.wr_id,
        String::from_utf8_lossy(&landed)
    );
    Ok(())
}
