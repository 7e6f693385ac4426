//! Unit tests of the mlx5 formats: byte-exact checks against the worked examples of the
//! data-path reference (`mlx5-datapath.md`, sections 2 to 5) and property-based round trips.

use super::*;
use crate::ops::WaitCond;
use proptest::prelude::*;

/// Concatenates 16-byte segments into one WQE image.
fn wqe_bytes(segs: &[[u8; 16]]) -> Vec<u8> {
    segs.iter().flat_map(|s| s.iter().copied()).collect()
}

/// A CQE with every byte zero (unlike `Cqe64::default()`, whose op_own is 0xF1).
fn zero_cqe() -> Cqe64 {
    Cqe64([0; 64])
}

/// Asserts that every byte of `cqe` outside `range` is zero.
fn assert_zero_outside(cqe: &Cqe64, range: core::ops::Range<usize>) {
    for (i, b) in cqe.0.iter().enumerate() {
        if !range.contains(&i) {
            assert_eq!(*b, 0, "byte {i} changed, only {range:?} should have");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worked examples of the reference (sections 2.1 and 2.6)
// ---------------------------------------------------------------------------------------------

#[test]
fn ctrl_seg_worked_example_2_1() {
    let c = CtrlSeg::new(
        0x1234,
        Opcode::RdmaWrite.into(),
        0xAB_CDEF,
        3,
        FmCeSe::CQ_UPDATE,
        [0; 4],
    );
    assert_eq!(
        c.to_bytes(),
        [
            0x00, 0x12, 0x34, 0x08, 0xab, 0xcd, 0xef, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00,
            0x00, 0x00
        ]
    );
    assert_eq!(c.wqe_index(), 0x1234);
    assert_eq!(c.opcode(), Some(Opcode::RdmaWrite));
    assert_eq!(c.opcode_byte(), 0x08);
    assert_eq!(c.opmod(), 0);
    assert_eq!(c.qpn(), 0xAB_CDEF);
    assert_eq!(c.ds(), 3);
    assert!(c.flags().signalled());
    assert_eq!(c.flags().fence_mode(), 0);
}

#[test]
fn rdma_write_worked_example_2_6() {
    let pi: u64 = 5;
    let ctrl = CtrlSeg::new(
        idx16(pi),
        Opcode::RdmaWrite as u8,
        0x00_0123,
        3,
        FmCeSe::CQ_UPDATE,
        [0; 4],
    );
    let raddr = RaddrSeg::new(0x7f00_0000_2000, 0x2222);
    let data = DataSeg::new(0x7f00_0000_1000, 4096, 0x1111);
    let wqe = wqe_bytes(&[ctrl.to_bytes(), raddr.to_bytes(), data.to_bytes()]);
    assert_eq!(wqe.len(), 48);

    assert_eq!(
        wqe[0..16],
        [
            0x00, 0x00, 0x05, 0x08, 0x00, 0x01, 0x23, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00,
            0x00, 0x00
        ]
    );
    assert_eq!(
        wqe[16..32],
        [
            0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x22, 0x22, 0x00, 0x00,
            0x00, 0x00
        ]
    );
    assert_eq!(
        wqe[32..48],
        [
            0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x11, 0x11, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00,
            0x10, 0x00
        ]
    );

    // One WQEBB: the new producer counter is 6, and the SQ doorbell record says so.
    let new_pi = pi + wqebbs_for_ds(ctrl.ds() as usize) as u64;
    assert_eq!(new_pi, 6);
    assert_eq!(qp_dbrec_value(new_pi).bytes(), [0x00, 0x00, 0x00, 0x06]);

    // The doorbell carries the first 8 bytes of the ctrl segment.
    let head = ctrl.head();
    assert_eq!(head, [0x00, 0x00, 0x05, 0x08, 0x00, 0x01, 0x23, 0x03]);
    assert_eq!(head[..], wqe[..8]);
    let v = doorbell_value(head);
    assert_eq!(v, 0x0323_0100_0805_0000);
    // A little-endian 64-bit store of the value writes exactly those bytes.
    assert_eq!(v.to_le_bytes(), head);
    // Read back by a NIC: the WQE at index 5 of QP 0x123, one block: processing ends at 6,
    // the doorbell record's value. A doorbell that names another QP says nothing.
    assert_eq!(doorbell_end(v, 0x123), Some(6));
    assert_eq!(doorbell_end(v, 0x124), None);
    assert_eq!(doorbell_end(0, 0), None, "a WQE of no segments");
}

#[test]
fn dbrec_example_new_pi_6() {
    assert_eq!(qp_dbrec_value(6).bytes(), [0, 0, 0, 6]);
    assert_eq!(qp_dbrec_value(6).get(), 6);
}

// ---------------------------------------------------------------------------------------------
// Segment layouts
// ---------------------------------------------------------------------------------------------

#[test]
fn data_seg_layout() {
    let d = DataSeg::new(0x0102_0304_0506_0708, 0x1122_3344, 0xAABB_CCDD);
    assert_eq!(
        d.to_bytes(),
        [
            0x11, 0x22, 0x33, 0x44, 0xAA, 0xBB, 0xCC, 0xDD, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
            0x07, 0x08
        ]
    );
    assert_eq!(d.byte_count.get(), 0x1122_3344);
    assert_eq!(d.lkey.get(), 0xAABB_CCDD);
    assert_eq!(d.addr.get(), 0x0102_0304_0506_0708);
    assert!(!d.is_terminator());
    assert!(!d.is_inline());
}

#[test]
fn raddr_seg_layout() {
    let r = RaddrSeg::new(0x0102_0304_0506_0708, 0xA1B2_C3D4);
    assert_eq!(
        r.to_bytes(),
        [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xA1, 0xB2, 0xC3, 0xD4, 0x00, 0x00,
            0x00, 0x00
        ]
    );
    assert_eq!(r.reserved, [0; 4]);
}

#[test]
fn raddr_seg_to_bytes_writes_zero_reserved() {
    // to_bytes leaves the reserved bytes 0 even if the struct holds something there.
    let mut r = RaddrSeg::new(1, 2);
    r.reserved = [9; 4];
    assert_eq!(r.to_bytes()[12..], [0, 0, 0, 0]);
}

#[test]
fn atomic_seg_layout() {
    let a = AtomicSeg::new(0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
    assert_eq!(
        a.to_bytes(),
        [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16,
            0x17, 0x18
        ]
    );
    assert_eq!(a.swap_add.get(), 0x0102_0304_0506_0708);
    assert_eq!(a.compare.get(), 0x1112_1314_1516_1718);
}

#[test]
fn atomic_wqe_is_one_full_wqebb() {
    // ctrl, raddr, atomic, data(8 B): 4 DS, exactly 64 bytes.
    let ctrl = CtrlSeg::new(
        7,
        Opcode::AtomicFa.into(),
        0x42,
        4,
        FmCeSe::CQ_UPDATE,
        [0; 4],
    );
    let wqe = wqe_bytes(&[
        ctrl.to_bytes(),
        RaddrSeg::new(0x1000, 0x33).to_bytes(),
        AtomicSeg::new(5, 0).to_bytes(),
        DataSeg::new(0x2000, 8, 0x44).to_bytes(),
    ]);
    assert_eq!(wqe.len(), WQEBB);
    assert_eq!(wqebbs_for_ds(ctrl.ds() as usize), 1);
    assert_eq!(wqe[3], 0x12);
    assert_eq!(wqe[32..40], 5u64.to_be_bytes());
    assert_eq!(wqe[48..52], [0, 0, 0, 8]);
}

#[test]
fn inline_header_layout() {
    let h = InlineHeader::new(42);
    assert_eq!(h.byte_count.bytes(), [0x80, 0x00, 0x00, 0x2A]);
    assert_eq!(h.byte_count.get(), 42 | INLINE_SEG_FLAG);
    assert_eq!(h.len(), 42);
    assert!(!h.is_empty());

    let h = InlineHeader::new(0x3FF);
    assert_eq!(h.byte_count.bytes(), [0x80, 0x00, 0x03, 0xFF]);
    assert_eq!(h.len(), 0x3FF);

    let h = InlineHeader::new(0);
    assert_eq!(h.byte_count.bytes(), [0x80, 0, 0, 0]);
    assert!(h.is_empty());

    // Seen as the first word of a data segment, the header reads as inline.
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&InlineHeader::new(8).byte_count.bytes());
    let d = DataSeg::from_bytes(&b);
    assert!(d.is_inline());
    assert!(!d.is_terminator());
}

#[test]
fn inline_header_ds_for() {
    // ceil((4 + len) / 16)
    assert_eq!(InlineHeader::ds_for(0), 1);
    assert_eq!(InlineHeader::ds_for(1), 1);
    assert_eq!(InlineHeader::ds_for(12), 1);
    assert_eq!(InlineHeader::ds_for(13), 2);
    assert_eq!(InlineHeader::ds_for(28), 2);
    assert_eq!(InlineHeader::ds_for(29), 3);
    assert_eq!(InlineHeader::ds_for(60), 4);
    assert_eq!(InlineHeader::ds_for(61), 5);
    for len in 0..2048usize {
        assert_eq!(
            InlineHeader::ds_for(len),
            (4 + len).div_ceil(16),
            "len {len}"
        );
    }
}

#[test]
fn terminator_layout() {
    let t = DataSeg::terminator();
    assert_eq!(
        t.to_bytes(),
        [0, 0, 0, 0, 0x00, 0x00, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(INVALID_LKEY, 0x100);
    assert!(t.is_terminator());
    assert!(!t.is_inline());
    // A zero-length segment with another lkey is not a terminator, nor is a non-empty one
    // with the invalid lkey.
    assert!(!DataSeg::new(0, 0, 0x101).is_terminator());
    assert!(!DataSeg::new(0, 1, INVALID_LKEY).is_terminator());
}

#[test]
fn segment_constants() {
    assert_eq!(SEG_SIZE, 16);
    assert_eq!(WQEBB, 64);
    assert_eq!(MAX_WQE_DS, 63);
    assert_eq!(MAX_WQE_WQEBBS, 16);
    assert_eq!(INLINE_SEG_FLAG, 0x8000_0000);
    assert_eq!(core::mem::size_of::<CtrlSeg>(), 16);
    assert_eq!(core::mem::size_of::<RaddrSeg>(), 16);
    assert_eq!(core::mem::size_of::<AtomicSeg>(), 16);
    assert_eq!(core::mem::size_of::<DataSeg>(), 16);
    assert_eq!(core::mem::size_of::<InlineHeader>(), 4);
}

#[test]
fn fm_ce_se_bits() {
    assert_eq!(FmCeSe::SOLICITED.bits(), 0x02);
    assert_eq!(FmCeSe::CQ_UPDATE.bits(), 0x08);
    assert_eq!(FmCeSe::INITIATOR_SMALL_FENCE.bits(), 0x20);
    assert_eq!(FmCeSe::FENCE.bits(), 0x80);

    let f = |b: u8| FmCeSe::from_bits_retain(b);
    // Completion mode (bits 3:2): 2 and 3 request a CQE, 0 and 1 do not.
    assert!(!f(0x00).signalled());
    assert!(!f(0x04).signalled());
    assert!(f(0x08).signalled());
    assert!(f(0x0C).signalled());
    assert!(!f(0x02 | 0x20 | 0x80).signalled());
    // Fence mode (bits 7:5).
    assert_eq!(f(0x00).fence_mode(), 0);
    assert_eq!(f(0x20).fence_mode(), 1);
    assert_eq!(f(0x40).fence_mode(), 2);
    assert_eq!(f(0x60).fence_mode(), 3);
    assert_eq!(f(0x80).fence_mode(), 4);
    assert_eq!(f(0x8A).fence_mode(), 4);
    // Unnamed bits are kept, not dropped.
    assert_eq!(f(0x60).bits(), 0x60);
    let c = CtrlSeg::new(0, 0, 0, 1, f(0x6E), [0; 4]);
    assert_eq!(c.to_bytes()[11], 0x6E);
    assert_eq!(c.flags().bits(), 0x6E);
}

#[test]
fn ctrl_seg_imm_is_not_swapped() {
    let c = CtrlSeg::new(
        1,
        Opcode::SendImm.into(),
        9,
        2,
        FmCeSe::empty(),
        [0xDE, 0xAD, 0xBE, 0xEF],
    );
    let b = c.to_bytes();
    assert_eq!(b[12..16], [0xDE, 0xAD, 0xBE, 0xEF]);
    assert_eq!(b[8..11], [0, 0, 0]);
    assert_eq!(b[11], 0);
}

#[test]
fn ctrl_seg_qpn_and_ds_are_masked() {
    let c = CtrlSeg::new(0xFFFF, 0xFF, 0xFFFF_FFFF, 0x3F, FmCeSe::empty(), [0; 4]);
    // wqe_index and opcode fill bits 23:0 of word 0, opmod stays 0.
    assert_eq!(c.to_bytes()[..4], [0x00, 0xFF, 0xFF, 0xFF]);
    assert_eq!(c.opmod(), 0);
    assert_eq!(c.wqe_index(), 0xFFFF);
    assert_eq!(c.opcode_byte(), 0xFF);
    assert_eq!(c.opcode(), None);
    assert_eq!(c.qpn(), 0xFF_FFFF);
    assert_eq!(c.ds(), 0x3F);
    assert_eq!(c.to_bytes()[4..8], [0xFF, 0xFF, 0xFF, 0x3F]);

    // A ds wider than 6 bits reads back masked.
    let c = CtrlSeg::new(0, 0, 0x12_3456, 0xC5, FmCeSe::empty(), [0; 4]);
    assert_eq!(c.ds(), 0x05);
    assert_eq!(c.qpn(), 0x12_3456);
}

#[test]
fn ctrl_seg_from_reference_bytes() {
    let b = [
        0x00, 0x12, 0x34, 0x08, 0xab, 0xcd, 0xef, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00,
        0x00,
    ];
    let c = CtrlSeg::from_bytes(&b);
    assert_eq!(c.wqe_index(), 0x1234);
    assert_eq!(c.opcode(), Some(Opcode::RdmaWrite));
    assert_eq!(c.qpn(), 0xAB_CDEF);
    assert_eq!(c.ds(), 3);
    assert_eq!(c.flags(), FmCeSe::CQ_UPDATE);
    assert_eq!(c.to_bytes(), b);
    // opmod is read from the top byte.
    let mut b2 = b;
    b2[0] = 0x08;
    assert_eq!(CtrlSeg::from_bytes(&b2).opmod(), 0x08);
    assert_eq!(CtrlSeg::from_bytes(&b2).wqe_index(), 0x1234);
}

// ---------------------------------------------------------------------------------------------
// Index arithmetic and doorbell values
// ---------------------------------------------------------------------------------------------

#[test]
fn wqebbs_for_ds_values() {
    assert_eq!(wqebbs_for_ds(0), 0);
    for ds in 1..=4 {
        assert_eq!(wqebbs_for_ds(ds), 1, "ds {ds}");
    }
    for ds in 5..=8 {
        assert_eq!(wqebbs_for_ds(ds), 2, "ds {ds}");
    }
    assert_eq!(wqebbs_for_ds(9), 3);
    assert_eq!(wqebbs_for_ds(60), 15);
    assert_eq!(wqebbs_for_ds(61), 16);
    assert_eq!(wqebbs_for_ds(63), 16);
    assert_eq!(wqebbs_for_ds(MAX_WQE_DS), MAX_WQE_WQEBBS);
}

#[test]
fn idx16_wraps() {
    assert_eq!(idx16(0), 0);
    assert_eq!(idx16(0xFFFF), 0xFFFF);
    assert_eq!(idx16(0x1_0000), 0);
    assert_eq!(idx16(0x1_0005), 5);
    assert_eq!(idx16(u64::MAX), 0xFFFF);

    assert_eq!(idx16_diff(2, 0xFFFE), 4);
    assert_eq!(idx16_diff(0, 0xFFFF), 1);
    assert_eq!(idx16_diff(5, 5), 0);
    assert_eq!(idx16_diff(0, 1), 0xFFFF);
    assert_eq!(idx16_diff(0x1234, 0x1200), 0x34);
}

#[test]
fn dbrec_values() {
    assert_eq!(DBREC_RQ, 0);
    assert_eq!(DBREC_SQ, 1);
    assert_eq!(DBREC_CQ_CI, 0);
    // QP: 16 bits of the counter, big-endian.
    assert_eq!(qp_dbrec_value(0x1_2345).bytes(), [0x00, 0x00, 0x23, 0x45]);
    assert_eq!(qp_dbrec_value(0xFFFF).bytes(), [0x00, 0x00, 0xFF, 0xFF]);
    assert_eq!(qp_dbrec_value(0x1_0000).bytes(), [0, 0, 0, 0]);
    // CQ: 24 bits of the consumer index, big-endian.
    assert_eq!(cq_ci_value(0x1234_5678).bytes(), [0x00, 0x34, 0x56, 0x78]);
    assert_eq!(cq_ci_value(0xFF_FFFF).bytes(), [0x00, 0xFF, 0xFF, 0xFF]);
    assert_eq!(cq_ci_value(0x100_0000).bytes(), [0, 0, 0, 0]);
}

#[test]
fn doorbell_value_is_little_endian_image() {
    let h = [1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(doorbell_value(h), 0x0807_0605_0403_0201);
    assert_eq!(doorbell_value([0; 8]), 0);
}

// ---------------------------------------------------------------------------------------------
// CQE
// ---------------------------------------------------------------------------------------------

#[test]
fn cqe_byte_cnt_offset() {
    let mut c = zero_cqe();
    c.set_byte_cnt(0x1122_3344);
    assert_eq!(c.0[44..48], [0x11, 0x22, 0x33, 0x44]);
    assert_zero_outside(&c, 44..48);
    assert_eq!(c.byte_cnt(), 0x1122_3344);
}

#[test]
fn cqe_wqe_counter_offset() {
    let mut c = zero_cqe();
    c.set_wqe_counter(0xA1B2);
    assert_eq!(c.0[60..62], [0xA1, 0xB2]);
    assert_zero_outside(&c, 60..62);
    assert_eq!(c.wqe_counter(), 0xA1B2);
}

#[test]
fn cqe_sop_drop_qpn_offset() {
    let mut c = zero_cqe();
    c.set_sop_drop_qpn(0x08AB_CDEF);
    assert_eq!(c.0[56..60], [0x08, 0xAB, 0xCD, 0xEF]);
    assert_zero_outside(&c, 56..60);
    assert_eq!(c.sop_drop_qpn(), 0x08AB_CDEF);
    assert_eq!(c.qpn(), 0xAB_CDEF);
    assert_eq!(c.wqe_opcode(), 0x08);
    assert_eq!(Opcode::from_u8(c.wqe_opcode()), Some(Opcode::RdmaWrite));
}

#[test]
fn cqe_flags_rqpn_offset() {
    let mut c = zero_cqe();
    c.set_flags_rqpn(0x2A12_3456);
    assert_eq!(c.0[24..28], [0x2A, 0x12, 0x34, 0x56]);
    assert_zero_outside(&c, 24..28);
    assert_eq!(c.flags_rqpn(), 0x2A12_3456);
}

#[test]
fn cqe_srqn_uidx_offset() {
    let mut c = zero_cqe();
    c.set_srqn_uidx(0x00C0_FFEE);
    assert_eq!(c.0[32..36], [0x00, 0xC0, 0xFF, 0xEE]);
    assert_zero_outside(&c, 32..36);
    assert_eq!(c.srqn_uidx(), 0x00C0_FFEE);
}

#[test]
fn cqe_timestamp_offset() {
    let mut c = zero_cqe();
    c.set_timestamp(0x0102_0304_0506_0708);
    assert_eq!(c.0[48..56], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_zero_outside(&c, 48..56);
    assert_eq!(c.timestamp(), 0x0102_0304_0506_0708);
}

#[test]
fn cqe_imm_offset_unswapped() {
    let mut c = zero_cqe();
    c.set_imm([0x01, 0x02, 0x03, 0x04]);
    assert_eq!(c.0[36..40], [0x01, 0x02, 0x03, 0x04]);
    assert_zero_outside(&c, 36..40);
    assert_eq!(c.imm(), [0x01, 0x02, 0x03, 0x04]);
}

#[test]
fn cqe_syndrome_and_vendor_offsets() {
    let mut c = zero_cqe();
    c.set_syndrome(Syndrome::RemoteAccess, 0x93);
    assert_eq!(c.0[55], 0x13);
    assert_eq!(c.0[54], 0x93);
    assert_zero_outside(&c, 54..56);
    assert_eq!(c.syndrome(), Some(Syndrome::RemoteAccess));
    assert_eq!(c.syndrome_byte(), 0x13);
    assert_eq!(c.vendor_syndrome(), 0x93);

    // An unknown syndrome byte decodes to None but is still readable.
    c.0[55] = 0x7E;
    assert_eq!(c.syndrome(), None);
    assert_eq!(c.syndrome_byte(), 0x7E);
}

#[test]
fn cqe_op_own_encoding() {
    let mut c = zero_cqe();
    c.set_op_own(CqeOpcode::ReqErr, true, 1);
    assert_eq!(c.0[63], 0xD3);
    assert_zero_outside(&c, 63..64);
    assert_eq!(c.op_own(), 0xD3);
    assert_eq!(c.opcode(), Some(CqeOpcode::ReqErr));
    assert!(c.solicited());
    assert_eq!(c.owner(), 1);
    assert!(c.is_error());

    c.set_op_own(CqeOpcode::Req, false, 0);
    assert_eq!(c.0[63], 0x00);
    assert_eq!(c.opcode(), Some(CqeOpcode::Req));
    assert!(!c.solicited());
    assert_eq!(c.owner(), 0);
    assert!(!c.is_error());

    // Only the low bit of `owner` is used.
    c.set_op_own(CqeOpcode::RespSend, false, 3);
    assert_eq!(c.0[63], 0x21);
    c.set_op_own(CqeOpcode::RespSendImm, true, 2);
    assert_eq!(c.0[63], 0x32);

    c.set_op_own(CqeOpcode::RespErr, false, 0);
    assert_eq!(c.0[63], 0xE0);
    assert!(c.is_error());
    c.set_op_own(CqeOpcode::SigErr, false, 0);
    assert_eq!(c.0[63], 0xC0);
    assert!(!c.is_error());

    // Format bits (3:2) do not disturb the decoding of opcode, owner and SE.
    c.0[63] = 0x2C | 0x01;
    assert_eq!(c.opcode(), Some(CqeOpcode::RespSend));
    assert_eq!(c.owner(), 1);
    assert!(!c.solicited());
}

#[test]
fn cqe_default_is_init_state() {
    assert_eq!(CQE_INIT_OP_OWN, 0xF1);
    assert_eq!(CQE_SIZE, 64);
    assert_eq!(core::mem::size_of::<Cqe64>(), 64);
    assert_eq!(core::mem::align_of::<Cqe64>(), 64);
    let c = Cqe64::default();
    assert_eq!(c.op_own(), CQE_INIT_OP_OWN);
    assert_eq!(c.opcode(), Some(CqeOpcode::Invalid));
    assert_eq!(c.owner(), 1);
    assert!(!c.is_error());
    assert_zero_outside(&c, 63..64);
}

#[test]
fn cqe_owner_word_reads_bytes_60_to_64_little_endian() {
    assert_eq!(CQE_OWNER_WORD_OFFSET, 60);
    let mut c = Cqe64::default();
    c.set_wqe_counter(0x1234);
    c.0[62] = 0x56; // signature
    assert_eq!(c.owner_word(), 0xF156_3412);
    assert_eq!(
        c.owner_word(),
        u32::from_le_bytes(
            c.0[CQE_OWNER_WORD_OFFSET..CQE_OWNER_WORD_OFFSET + 4]
                .try_into()
                .unwrap()
        )
    );
    // The owner bit is bit 24 of the word.
    assert_eq!((c.owner_word() >> 24) & 1, 1);
    c.set_op_own(CqeOpcode::Req, false, 0);
    assert_eq!(c.owner_word(), 0x0056_3412);
    assert_eq!((c.owner_word() >> 24) & 1, 0);
    // Other bytes of the CQE are not part of the word.
    c.0[59] = 0xFF;
    c.0[0] = 0xFF;
    assert_eq!(c.owner_word(), 0x0056_3412);
}

#[test]
fn cqe_owner_expected_is_pass_parity() {
    let cnt = 8u32;
    for n in 0..8 {
        assert_eq!(CqeOwner::expected(n, cnt), 0, "n {n}");
    }
    for n in 8..16 {
        assert_eq!(CqeOwner::expected(n, cnt), 1, "n {n}");
    }
    assert_eq!(CqeOwner::expected(16, cnt), 0);
    assert_eq!(CqeOwner::expected(24, cnt), 1);
    assert_eq!(CqeOwner::expected(0x1_0000_0008, cnt), 1);
    assert_eq!(CqeOwner::expected(1, 1), 1);
    assert_eq!(CqeOwner::expected(2, 1), 0);
}

#[test]
fn cqe_owner_is_new_rules() {
    let cnt = 4u32;
    // Opcode 0xF is never new, whatever the owner bit.
    for n in 0..16 {
        assert!(!CqeOwner::is_new(0xF0, n, cnt), "n {n}");
        assert!(!CqeOwner::is_new(0xF1, n, cnt), "n {n}");
        assert!(!CqeOwner::is_new(0xFF, n, cnt), "n {n}");
    }
    // Pass 0 wants owner 0, pass 1 owner 1.
    assert!(CqeOwner::is_new(0x00, 0, cnt));
    assert!(CqeOwner::is_new(0x00, 3, cnt));
    assert!(!CqeOwner::is_new(0x01, 0, cnt));
    assert!(!CqeOwner::is_new(0x00, 4, cnt));
    assert!(CqeOwner::is_new(0x01, 4, cnt));
    assert!(CqeOwner::is_new(0x01, 7, cnt));
    assert!(CqeOwner::is_new(0x00, 8, cnt));
    // Error CQEs and SE / format bits follow the same owner rule.
    assert!(CqeOwner::is_new(0xD0, 0, cnt));
    assert!(CqeOwner::is_new(0xE1, 5, cnt));
    assert!(!CqeOwner::is_new(0xE1, 1, cnt));
    assert!(CqeOwner::is_new(0x22, 2, cnt));
    assert!(CqeOwner::is_new(0x23, 6, cnt));
}

/// Whether the wait `CqeOwner::wait_word(n, cnt)` passes on `cqe`.
fn wait_passes(cqe: &Cqe64, n: u64, cnt: u32) -> bool {
    let (cond, value) = CqeOwner::wait_word(n, cnt);
    cond.test32(cqe.owner_word(), value)
}

#[test]
fn cqe_wait_word_pass_0() {
    let cnt = 16u32;
    for n in [0u64, 1, 15, 32, 33] {
        assert_eq!(
            CqeOwner::wait_word(n, cnt),
            (WaitCond::Nor, 0xFEFF_FFFF),
            "n {n}"
        );
        // The initial entry (op_own 0xF1) holds the wait.
        let mut c = Cqe64::default();
        assert!(
            !wait_passes(&c, n, cnt),
            "n {n}: passed on the initial word"
        );
        // A CQE with owner 0 releases it, whatever the wqe_counter and signature bytes.
        c.set_wqe_counter(0xFFFF);
        c.0[62] = 0xFF;
        assert!(!wait_passes(&c, n, cnt));
        c.set_op_own(CqeOpcode::Req, false, 0);
        assert!(wait_passes(&c, n, cnt), "n {n}: good CQE did not release");
        c.set_op_own(CqeOpcode::RespSend, true, 0);
        assert!(wait_passes(&c, n, cnt));
        // An error CQE releases it too.
        let mut e = Cqe64::default();
        e.set_op_own(CqeOpcode::ReqErr, false, 0);
        e.set_syndrome(Syndrome::RemoteAccess, 0);
        assert!(wait_passes(&e, n, cnt), "n {n}: error CQE did not release");
        // A stale entry of the pass before (owner 1) does not.
        let mut stale = Cqe64::default();
        stale.set_op_own(CqeOpcode::Req, false, 1);
        assert!(!wait_passes(&stale, n, cnt));
    }
}

#[test]
fn cqe_wait_word_pass_1() {
    let cnt = 16u32;
    for n in [16u64, 17, 31, 48] {
        assert_eq!(
            CqeOwner::wait_word(n, cnt),
            (WaitCond::And, 0x0100_0000),
            "n {n}"
        );
        // The entry as pass 0 left it (owner 0) holds the wait.
        let mut c = Cqe64::default();
        c.set_op_own(CqeOpcode::Req, false, 0);
        c.set_wqe_counter(0xFFFF);
        c.0[62] = 0xFF;
        assert!(!wait_passes(&c, n, cnt), "n {n}: passed on a pass-0 CQE");
        // The pass-1 CQE (owner 1) releases it.
        c.set_op_own(CqeOpcode::Req, false, 1);
        assert!(wait_passes(&c, n, cnt), "n {n}: good CQE did not release");
        // An error CQE of pass 1 releases it too.
        let mut e = Cqe64::default();
        e.set_op_own(CqeOpcode::ReqErr, false, 1);
        e.set_syndrome(Syndrome::WrFlush, 0);
        assert!(wait_passes(&e, n, cnt), "n {n}: error CQE did not release");
        let mut e = zero_cqe();
        e.set_op_own(CqeOpcode::RespErr, false, 1);
        assert!(wait_passes(&e, n, cnt));
    }
}

#[test]
fn cqe_error_cqe_releases_pass_0_wait_on_initial_ring() {
    // The scenario of a stream waiting on the first CQE of a fresh ring, which completes in
    // error: written as the HCA would, over the initialised entry.
    let mut c = Cqe64::default();
    let (cond, value) = CqeOwner::wait_word(0, 64);
    assert!(!cond.test32(c.owner_word(), value));
    c.set_sop_drop_qpn(((Opcode::RdmaWrite as u32) << 24) | 0x123);
    c.set_wqe_counter(0);
    c.set_syndrome(Syndrome::RemoteAccess, 0x88);
    c.set_op_own(CqeOpcode::ReqErr, false, 0);
    assert!(cond.test32(c.owner_word(), value));
    assert!(CqeOwner::is_new(c.op_own(), 0, 64));
    assert!(c.is_error());
}

// ---------------------------------------------------------------------------------------------
// Opcodes and syndromes
// ---------------------------------------------------------------------------------------------

const OPCODES: &[(u8, Opcode)] = &[
    (0x00, Opcode::Nop),
    (0x01, Opcode::SendInval),
    (0x08, Opcode::RdmaWrite),
    (0x09, Opcode::RdmaWriteImm),
    (0x0A, Opcode::Send),
    (0x0B, Opcode::SendImm),
    (0x10, Opcode::RdmaRead),
    (0x11, Opcode::AtomicCs),
    (0x12, Opcode::AtomicFa),
    (0x14, Opcode::AtomicMaskedCs),
    (0x15, Opcode::AtomicMaskedFa),
    (0x1B, Opcode::LocalInval),
    (0x25, Opcode::Umr),
];

const CQE_OPCODES: &[(u8, CqeOpcode)] = &[
    (0x0, CqeOpcode::Req),
    (0x1, CqeOpcode::RespWrImm),
    (0x2, CqeOpcode::RespSend),
    (0x3, CqeOpcode::RespSendImm),
    (0x4, CqeOpcode::RespSendInv),
    (0x5, CqeOpcode::ResizeCq),
    (0x6, CqeOpcode::NoPacket),
    (0xC, CqeOpcode::SigErr),
    (0xD, CqeOpcode::ReqErr),
    (0xE, CqeOpcode::RespErr),
    (0xF, CqeOpcode::Invalid),
];

const SYNDROMES: &[(u8, Syndrome)] = &[
    (0x01, Syndrome::LocalLength),
    (0x02, Syndrome::LocalQpOp),
    (0x04, Syndrome::LocalProt),
    (0x05, Syndrome::WrFlush),
    (0x06, Syndrome::MwBind),
    (0x10, Syndrome::BadResp),
    (0x11, Syndrome::LocalAccess),
    (0x12, Syndrome::RemoteInvalReq),
    (0x13, Syndrome::RemoteAccess),
    (0x14, Syndrome::RemoteOp),
    (0x15, Syndrome::TransportRetryExc),
    (0x16, Syndrome::RnrRetryExc),
    (0x22, Syndrome::RemoteAborted),
];

#[test]
fn opcode_values_round_trip() {
    for &(b, op) in OPCODES {
        assert_eq!(op as u8, b, "{op:?}");
        assert_eq!(u8::from(op), b, "{op:?}");
        assert_eq!(Opcode::from_u8(b), Some(op), "{b:#x}");
    }
    for b in 0..=255u8 {
        if !OPCODES.iter().any(|&(v, _)| v == b) {
            assert_eq!(Opcode::from_u8(b), None, "{b:#x}");
        }
    }
}

#[test]
fn cqe_opcode_values_round_trip() {
    for &(b, op) in CQE_OPCODES {
        assert_eq!(op as u8, b, "{op:?}");
        assert_eq!(u8::from(op), b, "{op:?}");
        assert_eq!(CqeOpcode::from_u8(b), Some(op), "{b:#x}");
    }
    for b in 0..=255u8 {
        if !CQE_OPCODES.iter().any(|&(v, _)| v == b) {
            assert_eq!(CqeOpcode::from_u8(b), None, "{b:#x}");
        }
    }
    for &(_, op) in CQE_OPCODES {
        assert_eq!(
            op.is_error(),
            matches!(op, CqeOpcode::ReqErr | CqeOpcode::RespErr),
            "{op:?}"
        );
    }
}

#[test]
fn syndrome_values_round_trip() {
    for &(b, s) in SYNDROMES {
        assert_eq!(s as u8, b, "{s:?}");
        assert_eq!(u8::from(s), b, "{s:?}");
        assert_eq!(Syndrome::from_u8(b), Some(s), "{b:#x}");
    }
    for b in 0..=255u8 {
        if !SYNDROMES.iter().any(|&(v, _)| v == b) {
            assert_eq!(Syndrome::from_u8(b), None, "{b:#x}");
        }
    }
}

#[test]
fn opcode_properties() {
    use Opcode::*;
    for &(_, op) in OPCODES {
        assert_eq!(
            op.has_raddr(),
            matches!(
                op,
                RdmaWrite | RdmaWriteImm | RdmaRead | AtomicCs | AtomicFa
            ),
            "{op:?}"
        );
        assert_eq!(op.is_atomic(), matches!(op, AtomicCs | AtomicFa), "{op:?}");
        assert_eq!(
            op.consumes_recv(),
            matches!(op, Send | SendImm | RdmaWriteImm),
            "{op:?}"
        );
        assert_eq!(op.has_imm(), matches!(op, SendImm | RdmaWriteImm), "{op:?}");
        assert_eq!(
            op.is_supported(),
            matches!(
                op,
                Nop | RdmaWrite | RdmaWriteImm | Send | SendImm | RdmaRead | AtomicCs | AtomicFa
            ),
            "{op:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Big-endian field types
// ---------------------------------------------------------------------------------------------

#[test]
fn be_types_examples() {
    assert_eq!(Be16::new(0x1234).bytes(), [0x12, 0x34]);
    assert_eq!(Be32::new(0x1234_5678).bytes(), [0x12, 0x34, 0x56, 0x78]);
    assert_eq!(
        Be64::new(0x0102_0304_0506_0708).bytes(),
        [1, 2, 3, 4, 5, 6, 7, 8]
    );
    #[cfg(target_endian = "little")]
    {
        assert_eq!(Be16::new(0x1234).native(), 0x3412);
        assert_eq!(Be32::new(0x1234_5678).native(), 0x7856_3412);
        assert_eq!(
            Be64::new(0x0102_0304_0506_0708).native(),
            0x0807_0605_0403_0201
        );
        // The SQ dbrec for pi 6, as a native 32-bit store writes it.
        assert_eq!(qp_dbrec_value(6).native(), 0x0600_0000);
    }
    assert_eq!(Be32::default().get(), 0);
    assert_eq!(format!("{:?}", Be32::new(0xAB)), "Be32(0xab)");
    assert_eq!(format!("{:?}", Be16::new(0x10)), "Be16(0x10)");
    assert_eq!(format!("{:?}", Be64::new(1)), "Be64(0x1)");
}

// ---------------------------------------------------------------------------------------------
// Property-based round trips
// ---------------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn prop_ctrl_seg_round_trip(
        wqe_index in any::<u16>(),
        opcode in any::<u8>(),
        qpn in any::<u32>(),
        ds in any::<u8>(),
        flags in any::<u8>(),
        imm in any::<[u8; 4]>(),
    ) {
        let c = CtrlSeg::new(wqe_index, opcode, qpn, ds, FmCeSe::from_bits_retain(flags), imm);
        let b = c.to_bytes();
        let p = CtrlSeg::from_bytes(&b);
        prop_assert_eq!(p, c);
        prop_assert_eq!(p.to_bytes(), b);
        prop_assert_eq!(p.wqe_index(), wqe_index);
        prop_assert_eq!(p.opcode_byte(), opcode);
        prop_assert_eq!(p.opcode(), Opcode::from_u8(opcode));
        prop_assert_eq!(p.opmod(), 0);
        prop_assert_eq!(p.qpn(), qpn & 0xFF_FFFF);
        prop_assert_eq!(p.ds(), ds & 0x3F);
        prop_assert_eq!(p.flags().bits(), flags);
        prop_assert_eq!(p.imm, imm);
        prop_assert_eq!(p.signature, 0);
        prop_assert_eq!(p.dci_stream_channel_id, [0, 0]);
        // Byte image: BE32(opmod|idx|opcode), BE32(qpn|ds), sig, dci, fm_ce_se, imm.
        prop_assert_eq!(&b[0..4], &(((wqe_index as u32) << 8) | opcode as u32).to_be_bytes()[..]);
        prop_assert_eq!(&b[4..8], &(((qpn & 0xFF_FFFF) << 8) | ds as u32).to_be_bytes()[..]);
        prop_assert_eq!(&b[8..11], &[0u8, 0, 0][..]);
        prop_assert_eq!(b[11], flags);
        prop_assert_eq!(&b[12..16], &imm[..]);
        prop_assert_eq!(&p.head()[..], &b[..8]);
    }

    #[test]
    fn prop_ctrl_seg_from_any_bytes(b in any::<[u8; 16]>()) {
        let c = CtrlSeg::from_bytes(&b);
        prop_assert_eq!(c.to_bytes(), b);
        prop_assert_eq!(c.opmod(), b[0]);
        prop_assert_eq!(c.wqe_index(), u16::from_be_bytes([b[1], b[2]]));
        prop_assert_eq!(c.opcode_byte(), b[3]);
        prop_assert_eq!(c.qpn(), u32::from_be_bytes([0, b[4], b[5], b[6]]));
        prop_assert_eq!(c.ds(), b[7] & 0x3F);
        prop_assert_eq!(c.flags().bits(), b[11]);
    }

    #[test]
    fn prop_raddr_seg_round_trip(raddr in any::<u64>(), rkey in any::<u32>()) {
        let r = RaddrSeg::new(raddr, rkey);
        let b = r.to_bytes();
        prop_assert_eq!(&b[0..8], &raddr.to_be_bytes()[..]);
        prop_assert_eq!(&b[8..12], &rkey.to_be_bytes()[..]);
        prop_assert_eq!(&b[12..16], &[0u8; 4][..]);
        let p = RaddrSeg::from_bytes(&b);
        prop_assert_eq!(p, r);
        prop_assert_eq!(p.raddr.get(), raddr);
        prop_assert_eq!(p.rkey.get(), rkey);
    }

    #[test]
    fn prop_atomic_seg_round_trip(swap_add in any::<u64>(), compare in any::<u64>()) {
        let a = AtomicSeg::new(swap_add, compare);
        let b = a.to_bytes();
        prop_assert_eq!(&b[0..8], &swap_add.to_be_bytes()[..]);
        prop_assert_eq!(&b[8..16], &compare.to_be_bytes()[..]);
        let p = AtomicSeg::from_bytes(&b);
        prop_assert_eq!(p, a);
        prop_assert_eq!(p.swap_add.get(), swap_add);
        prop_assert_eq!(p.compare.get(), compare);
    }

    #[test]
    fn prop_data_seg_round_trip(addr in any::<u64>(), len in any::<u32>(), lkey in any::<u32>()) {
        let d = DataSeg::new(addr, len, lkey);
        let b = d.to_bytes();
        prop_assert_eq!(&b[0..4], &len.to_be_bytes()[..]);
        prop_assert_eq!(&b[4..8], &lkey.to_be_bytes()[..]);
        prop_assert_eq!(&b[8..16], &addr.to_be_bytes()[..]);
        let p = DataSeg::from_bytes(&b);
        prop_assert_eq!(p, d);
        prop_assert_eq!(p.addr.get(), addr);
        prop_assert_eq!(p.byte_count.get(), len);
        prop_assert_eq!(p.lkey.get(), lkey);
        prop_assert_eq!(p.is_inline(), len & INLINE_SEG_FLAG != 0);
        prop_assert_eq!(p.is_terminator(), len == 0 && lkey == INVALID_LKEY);
    }

    #[test]
    fn prop_segments_from_any_bytes(b in any::<[u8; 16]>()) {
        prop_assert_eq!(RaddrSeg::from_bytes(&b).raddr.bytes(), <[u8; 8]>::try_from(&b[..8]).unwrap());
        prop_assert_eq!(AtomicSeg::from_bytes(&b).to_bytes(), b);
        prop_assert_eq!(DataSeg::from_bytes(&b).to_bytes(), b);
        // RaddrSeg::to_bytes zeroes the reserved tail.
        let mut want = b;
        want[12..].fill(0);
        prop_assert_eq!(RaddrSeg::from_bytes(&b).to_bytes(), want);
    }

    #[test]
    fn prop_inline_header(len in 0u32..0x400) {
        let h = InlineHeader::new(len);
        prop_assert_eq!(h.byte_count.bytes(), (len | 0x8000_0000).to_be_bytes());
        prop_assert_eq!(h.len(), len);
        prop_assert_eq!(h.is_empty(), len == 0);
        let ds = InlineHeader::ds_for(len as usize);
        prop_assert!(ds * 16 >= 4 + len as usize);
        prop_assert!((ds - 1) * 16 < 4 + len as usize);
    }

    #[test]
    fn prop_cqe_setters_getters(
        base in any::<[u8; 64]>(),
        flags_rqpn in any::<u32>(),
        srqn_uidx in any::<u32>(),
        imm in any::<[u8; 4]>(),
        byte_cnt in any::<u32>(),
        timestamp in any::<u64>(),
        sop_drop_qpn in any::<u32>(),
        wqe_counter in any::<u16>(),
        opcode_idx in 0..CQE_OPCODES.len(),
        solicited in any::<bool>(),
        owner in any::<u8>(),
        syndrome_idx in 0..SYNDROMES.len(),
        vendor in any::<u8>(),
    ) {
        let opcode = CQE_OPCODES[opcode_idx].1;
        let syndrome = SYNDROMES[syndrome_idx].1;
        let mut c = Cqe64(base);
        c.set_flags_rqpn(flags_rqpn);
        c.set_srqn_uidx(srqn_uidx);
        c.set_imm(imm);
        c.set_byte_cnt(byte_cnt);
        c.set_timestamp(timestamp);
        c.set_sop_drop_qpn(sop_drop_qpn);
        c.set_wqe_counter(wqe_counter);
        c.set_op_own(opcode, solicited, owner);

        prop_assert_eq!(c.flags_rqpn(), flags_rqpn);
        prop_assert_eq!(c.srqn_uidx(), srqn_uidx);
        prop_assert_eq!(c.imm(), imm);
        prop_assert_eq!(c.byte_cnt(), byte_cnt);
        prop_assert_eq!(c.timestamp(), timestamp);
        prop_assert_eq!(c.sop_drop_qpn(), sop_drop_qpn);
        prop_assert_eq!(c.qpn(), sop_drop_qpn & 0xFF_FFFF);
        prop_assert_eq!(c.wqe_opcode(), (sop_drop_qpn >> 24) as u8);
        prop_assert_eq!(c.wqe_counter(), wqe_counter);
        prop_assert_eq!(c.opcode(), Some(opcode));
        prop_assert_eq!(c.solicited(), solicited);
        prop_assert_eq!(c.owner(), owner & 1);
        prop_assert_eq!(c.is_error(), opcode.is_error());
        prop_assert_eq!(
            c.op_own(),
            ((opcode as u8) << 4) | ((solicited as u8) << 1) | (owner & 1)
        );
        // The owner word: wqe_counter (BE), signature, op_own, loaded little-endian.
        prop_assert_eq!(
            c.owner_word(),
            u32::from_le_bytes([
                (wqe_counter >> 8) as u8,
                wqe_counter as u8,
                base[62],
                c.op_own(),
            ])
        );
        prop_assert_eq!((c.owner_word() >> 24) & 1, (owner & 1) as u32);

        // Bytes no setter touches keep their value.
        for i in (0..24).chain(28..32).chain(40..44).chain(62..63) {
            prop_assert_eq!(c.0[i], base[i], "byte {}", i);
        }

        // The error view: syndrome and vendor syndrome take timestamp bytes 55 and 54 and
        // nothing else.
        let mut e = c;
        e.set_syndrome(syndrome, vendor);
        prop_assert_eq!(e.syndrome(), Some(syndrome));
        prop_assert_eq!(e.syndrome_byte(), syndrome as u8);
        prop_assert_eq!(e.vendor_syndrome(), vendor);
        prop_assert_eq!(&e.0[54..56], &[vendor, syndrome as u8][..]);
        for i in (0..54).chain(56..64) {
            prop_assert_eq!(e.0[i], c.0[i], "byte {}", i);
        }
        prop_assert_eq!(e.timestamp() >> 16, timestamp >> 16);
        prop_assert_eq!(e.wqe_counter(), wqe_counter);
        prop_assert_eq!(e.qpn(), sop_drop_qpn & 0xFF_FFFF);
        prop_assert_eq!(e.is_error(), opcode.is_error());
    }

    #[test]
    fn prop_cqe_owner_rules(
        n in any::<u64>(),
        log_cnt in 0u32..24,
        opcode_idx in 0..CQE_OPCODES.len(),
        solicited in any::<bool>(),
        wqe_counter in any::<u16>(),
        signature in any::<u8>(),
    ) {
        let cnt = 1u32 << log_cnt;
        let opcode = CQE_OPCODES[opcode_idx].1;
        let expected = CqeOwner::expected(n, cnt);
        prop_assert_eq!(expected as u64, (n / cnt as u64) & 1);
        let (cond, value) = CqeOwner::wait_word(n, cnt);
        for owner in 0..2u8 {
            let mut c = Cqe64::default();
            c.set_wqe_counter(wqe_counter);
            c.0[62] = signature;
            c.set_op_own(opcode, solicited, owner);
            let new = CqeOwner::is_new(c.op_own(), n, cnt);
            prop_assert_eq!(new, opcode != CqeOpcode::Invalid && owner == expected);
            // The wait looks at the owner bit only: any opcode, error or not, releases it.
            prop_assert_eq!(cond.test32(c.owner_word(), value), owner == expected);
        }
    }

    #[test]
    fn prop_be16(v in any::<u16>()) {
        let b = Be16::new(v);
        prop_assert_eq!(b.get(), v);
        prop_assert_eq!(b.bytes(), v.to_be_bytes());
        prop_assert_eq!(b.native(), u16::from_ne_bytes(v.to_be_bytes()));
        prop_assert_eq!(b.native().to_ne_bytes(), b.bytes());
        prop_assert_eq!(Be16::new(v), Be16::new(v));
        prop_assert_eq!(b.native(), v.to_be());
    }

    #[test]
    fn prop_be32(v in any::<u32>()) {
        let b = Be32::new(v);
        prop_assert_eq!(b.get(), v);
        prop_assert_eq!(b.bytes(), v.to_be_bytes());
        prop_assert_eq!(b.native(), u32::from_ne_bytes(v.to_be_bytes()));
        prop_assert_eq!(b.native().to_ne_bytes(), b.bytes());
        prop_assert_eq!(b.native(), v.to_be());
        prop_assert_eq!(Be32(b.bytes()), b);
    }

    #[test]
    fn prop_be64(v in any::<u64>()) {
        let b = Be64::new(v);
        prop_assert_eq!(b.get(), v);
        prop_assert_eq!(b.bytes(), v.to_be_bytes());
        prop_assert_eq!(b.native(), u64::from_ne_bytes(v.to_be_bytes()));
        prop_assert_eq!(b.native().to_ne_bytes(), b.bytes());
        prop_assert_eq!(b.native(), v.to_be());
        prop_assert_eq!(Be64(b.bytes()), b);
    }

    #[test]
    fn prop_dbrec_and_doorbell(pi in any::<u64>(), head in any::<[u8; 8]>()) {
        prop_assert_eq!(qp_dbrec_value(pi).get() as u64, pi & 0xFFFF);
        prop_assert_eq!(qp_dbrec_value(pi).get(), idx16(pi) as u32);
        prop_assert_eq!(cq_ci_value(pi).get() as u64, pi & 0xFF_FFFF);
        prop_assert_eq!(doorbell_value(head).to_le_bytes(), head);
    }

    #[test]
    fn prop_idx16_diff_inverts_add(b in any::<u64>(), d in any::<u16>()) {
        let a = b.wrapping_add(d as u64);
        prop_assert_eq!(idx16_diff(idx16(a), idx16(b)), d);
    }

    #[test]
    fn prop_wqebbs_for_ds(ds in 0usize..=4096) {
        let w = wqebbs_for_ds(ds);
        prop_assert_eq!(w, if ds % 4 == 0 { ds / 4 } else { ds / 4 + 1 });
        prop_assert!(w * 4 >= ds);
    }
}
