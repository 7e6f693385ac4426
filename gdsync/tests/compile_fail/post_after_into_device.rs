//! `Qp::into_device` hands the rings to a GPU kernel: the CPU can no longer post on the QP
//! (it is consumed; `DeviceQp::into_host` gives it back).
use gdsync::kernel::DeviceQp;
use gdsync::{Qp, Result, SendWr};

fn hand_over(mut qp: Qp, wr: &SendWr) {
    // Called through a function pointer of the exact signature (it takes the `Qp` by value),
    // so the error does not quote the library's source file.
    let into_device: fn(Qp) -> Result<DeviceQp> = Qp::into_device;
    let dqp = into_device(qp).unwrap();
    qp.post_send(wr).unwrap();
    drop(dqp);
}

fn main() {}
