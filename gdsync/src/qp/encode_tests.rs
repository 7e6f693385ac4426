//! The encoder against the format's checked writer: every WQE a post puts in the send ring,
//! by the straight path for one inline SGE or by the general one, is byte for byte what
//! [`SendWqe::write_to`] writes for the same work request; and the region a QP keeps from its
//! last inline send is not used once deregistered.

use crate::format::*;
use crate::mem::slot_off;
use crate::wr::{RemoteAddr, SendWr};
use crate::{Access, Cq, Device, Error, ProtectionDomain, Qp, QpConfig};

/// Two connected QPs of one PD on one soft device (sends are prepared, never rung).
fn connected(dev: &Device) -> (Qp, Qp, Cq, ProtectionDomain) {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    (a, b, cq, pd)
}

/// The WQE `wr` should give at producer counter `pi`, written by the checked writer;
/// `payload` is its inline payload where it is inline.
fn expected(qp: &Qp, pi: u64, wr: &SendWr, payload: Option<&[u8]>) -> Vec<u8> {
    let (opcode, remote, imm) = wr.op.wqe_fields();
    assert!(
        !opcode.is_atomic() && opcode != Opcode::Nop,
        "not covered here: {:?}",
        wr.op
    );
    let segs: Vec<DataSeg> = wr
        .sges
        .iter()
        .filter(|g| g.len > 0)
        .map(|g| DataSeg::new(g.addr, g.len, g.lkey))
        .collect();
    let mut flags = FmCeSe::empty();
    flags.set(
        FmCeSe::CQ_UPDATE,
        wr.flags.contains(crate::SendFlags::SIGNALED),
    );
    let wqe = SendWqe {
        wqe_index: pi as u16,
        opcode,
        qpn: qp.qpn(),
        flags,
        imm: imm.to_be_bytes(),
        raddr: remote.map(|r: RemoteAddr| RaddrSeg::new(r.addr, r.rkey)),
        atomic: None,
        data: match payload {
            Some(p) => WqeData::Inline(p),
            None => WqeData::Gather(DataSegs::from_segs(&segs)),
        },
    };
    let mut out = vec![0u8; MAX_WQE_WQEBBS * WQEBB];
    let ds = wqe.write_to(&mut out).unwrap();
    out.truncate(ds * SEG_SIZE);
    out
}

/// The bytes of the WQE at producer counter `pi`, `len` of them (wrapping at the ring's end).
fn ring_bytes(qp: &Qp, pi: u64, len: usize) -> Vec<u8> {
    let s = &qp.shared;
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(WQEBB).enumerate() {
        s.buf
            .read(slot_off(s.sq_off, pi + i as u64, s.sq_cnt, WQEBB), chunk);
    }
    out
}

#[test]
fn posted_wqes_are_what_the_checked_writer_writes() {
    let dev = Device::soft().unwrap();
    let (mut a, _b, _cq, pd) = connected(&dev);
    let mut mine: Vec<u8> = (0..=255u8).cycle().take(512).collect();
    let mut theirs = vec![0u8; 512];
    let mr = pd.register(&mut mine, Access::LOCAL_WRITE).unwrap();
    let theirs_mr = pd
        .register(&mut theirs, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let to = theirs_mr.remote().at(16);
    let data = (0..=255u8).cycle().take(512).collect::<Vec<u8>>();
    let ops = [
        SendWr::send(),
        SendWr::send_imm(0x1234_5678),
        SendWr::write(to),
        SendWr::write_imm(to, 0xDEAD_BEEF),
    ];
    // Every length an inline segment can end on, over the ring's end more than once.
    for (n, len) in (1..=220usize).chain([0, 300]).enumerate() {
        for (k, op) in ops.iter().enumerate() {
            let at = (n * 7 + k) % 200;
            let mut wr = op.clone().wr_id(n as u64).sge(mr.sge(at..at + len));
            let inline = len > 0 && len <= 220 && (n + k) % 3 != 0;
            if inline {
                wr = wr.inline();
            }
            if (n + k) % 2 == 0 {
                wr = wr.unsignaled();
            }
            // Retire what is there: the ring never fills.
            a.shared
                .sq_polled
                .store(a.sq_pi, std::sync::atomic::Ordering::Release);
            let pi = a.sq_pi;
            let p = a.prepare_send(&wr).unwrap();
            let want = expected(&a, pi, &wr, inline.then(|| &data[at..at + len]));
            assert_eq!(ring_bytes(&a, pi, want.len()), want, "{wr:?} at {pi}");
            // (Dropped uncommitted: a no-op later, never rung here.)
            drop(p);
        }
    }
}

#[test]
fn an_inline_send_from_a_deregistered_region_is_refused() {
    let dev = Device::soft().unwrap();
    let (mut a, _b, _cq, pd) = connected(&dev);
    let mut buf = vec![7u8; 64];
    let mut other = vec![9u8; 64];
    let mr = pd.register(&mut buf, Access::LOCAL_WRITE).unwrap();
    let sge = mr.sge(0..8);
    let send = || SendWr::send().sge(sge).inline().unsignaled();
    drop(a.prepare_send(&send()).unwrap()); // the QP now keeps this region
    drop(mr);
    let refused = a.prepare_send(&send());
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("not inside a region")),
        "{refused:?}"
    );
    // Another registration (perhaps under the same key) is looked up afresh.
    let mr2 = pd.register(&mut other, Access::LOCAL_WRITE).unwrap();
    drop(
        a.prepare_send(&SendWr::send().sge(mr2.sge(0..8)).inline())
            .unwrap(),
    );
    if mr2.sge(0..8).lkey == sge.lkey {
        let refused = a.prepare_send(&send());
        assert!(
            refused.is_err(),
            "the old address is outside the new region"
        );
    }
}
