//! What the keep-alive tests share (mp/tests/keep_alive.rs on host streams, the root's
//! tests/gpu_keep_alive.rs on CUDA streams): two connected queue pairs.

use gdsync::{Cq, Device, Qp, QpConfig};

/// Two connected QPs, each with a send and a receive CQ, on one soft device.
pub fn pair(dev: &Device) -> (Qp, Cq, Cq, Qp, Cq, Cq) {
    let pd = dev.alloc_pd();
    let cqs = || (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let ((s0, r0), (s1, r1)) = (cqs(), cqs());
    let mut q0 = pd.create_qp(&s0, &r0, &QpConfig::default()).unwrap();
    let mut q1 = pd.create_qp(&s1, &r1, &QpConfig::default()).unwrap();
    q0.connect(&q1.endpoint()).unwrap();
    q1.connect(&q0.endpoint()).unwrap();
    (q0, s0, r0, q1, s1, r1)
}
