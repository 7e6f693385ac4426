//! Fixtures of the kernel-driven QP tests: connected QP pairs with dedicated CQs, still on the
//! CPU (handed to a "kernel" with `into_device`), pinned registered buffers, deterministic
//! messages, and raw reads and writes of the memory the device and the kernel share.

use gdasync::gdsync::{
    Access, Cq, Device, MemoryRegion, PinnedBuffer, ProtectionDomain, Qp, QpConfig, RecvWr, SendWr,
};
use std::time::Duration;

/// One end: a QP with dedicated CQs sized like its rings (so the CQs wrap as often as the
/// rings), still on the CPU.
pub struct End {
    pub qp: Qp,
    pub scq: Cq,
    pub rcq: Cq,
}

/// An [`End`] on `dev`.
pub fn end(dev: &Device, pd: &ProtectionDomain, cfg: &QpConfig) -> End {
    let scq = dev.create_cq(cfg.send_wqebbs.max(16)).unwrap();
    let rcq = dev.create_cq(cfg.recv_wqes).unwrap();
    let qp = pd.create_qp(&scq, &rcq, cfg).unwrap();
    End { qp, scq, rcq }
}

/// Two connected ends on one device.
pub fn connected(cfg: &QpConfig) -> (Device, ProtectionDomain, End, End) {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let (mut a, mut b) = (end(&dev, &pd, cfg), end(&dev, &pd, cfg));
    a.qp.connect(&b.qp.endpoint()).unwrap();
    b.qp.connect(&a.qp.endpoint()).unwrap();
    (dev, pd, a, b)
}

/// Moves `from`'s send counter and `to`'s receive counter forward by `n` with CPU traffic
/// (empty sends), so the kernel's work then crosses the 16-bit index wrap.
pub fn advance(from: &mut End, to: &mut End, n: u64) {
    let batch = (from.qp.send_ring_size().min(to.qp.recv_ring_size()) / 2) as u64;
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        for _ in 0..k {
            to.qp.post_recv(&RecvWr::new()).unwrap();
            from.qp.post_send(&SendWr::send()).unwrap();
        }
        for _ in 0..k {
            from.scq
                .wait_one(Duration::from_secs(20))
                .unwrap()
                .ok()
                .unwrap();
            to.rcq
                .wait_one(Duration::from_secs(20))
                .unwrap()
                .ok()
                .unwrap();
        }
        done += k;
    }
}

/// A pinned buffer registered with every access right.
pub fn pinned(pd: &ProtectionDomain, len: usize) -> (PinnedBuffer, MemoryRegion<'static>) {
    let buf = PinnedBuffer::new(len);
    // SAFETY: the test keeps `buf` (returned alongside) alive longer than the region: every
    // caller binds the pair and drops the region first (declaration order is reversed).
    let mr = unsafe { pd.register_raw(buf.addr() as *mut u8, len, Access::ALL) }.unwrap();
    (buf, mr)
}

/// Message `i` of `side`: a deterministic byte pattern (the GPU tests' kernels write the same).
pub fn message(i: u64, side: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8).wrapping_mul(13) ^ (k as u8).wrapping_mul(7) ^ side)
        .collect()
}

/// The bytes at `addr` (in a pinned buffer the caller holds).
pub fn read(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `addr..addr+len` lies in a pinned buffer the caller holds; the device wrote it
    // before the completion the caller consumed.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

/// Stores `data` at `addr` (in a pinned buffer the caller holds).
pub fn write(addr: u64, data: &[u8]) {
    // SAFETY: `addr..addr+len` lies in a pinned buffer the caller holds and the device does
    // not access it now (the send that reads it is posted afterwards).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
}
