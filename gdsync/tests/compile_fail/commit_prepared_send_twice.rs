//! A `PreparedSend` is committed once: `Qp::commit` takes it by value, so its doorbell
//! cannot be rung a second time.
use gdsync::{Qp, SendWr};

fn twice(qp: &mut Qp, wr: &SendWr) {
    let prepared = qp.prepare_send(wr).unwrap();
    let _first = qp.commit(prepared).unwrap();
    let _again = qp.commit(prepared).unwrap();
}

fn main() {}
