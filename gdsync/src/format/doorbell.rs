//! Doorbell records and doorbell register values.
//!
//! QP doorbell record: two BE32 words, `[RQ counter][SQ counter]`, each the 16-bit "next free"
//! index. CQ doorbell record: `[consumer index & 0xFFFFFF][arm word]`. The doorbell register
//! takes one aligned 8-byte store of the first 8 bytes of the last posted WQE's ctrl segment.

use super::Be32;

/// Index of the RQ counter in a QP doorbell record (`MLX5_RCV_DBR`).
pub const DBREC_RQ: usize = 0;
/// Index of the SQ counter in a QP doorbell record (`MLX5_SND_DBR`).
pub const DBREC_SQ: usize = 1;
/// Index of the consumer index in a CQ doorbell record (`MLX5_CQ_SET_CI`).
pub const DBREC_CQ_CI: usize = 0;

/// The QP doorbell-record word for producer counter `pi`: `BE32(pi & 0xFFFF)`.
pub const fn qp_dbrec_value(pi: u64) -> Be32 {
    Be32::new((pi & 0xFFFF) as u32)
}

/// The CQ doorbell-record word for consumer index `ci`: `BE32(ci & 0xFFFFFF)`.
pub const fn cq_ci_value(ci: u64) -> Be32 {
    Be32::new((ci & 0xFF_FFFF) as u32)
}

/// The 64-bit value whose native (little-endian) store writes the 8 doorbell bytes `head`.
pub const fn doorbell_value(head: [u8; 8]) -> u64 {
    u64::from_le_bytes(head)
}

/// The reader of [`doorbell_value`]: the send-queue position just past the WQE whose first 8
/// bytes a doorbell carries (the ctrl segment's WQE index plus the WQE's size in 64-byte
/// blocks), if the doorbell names QP `qpn` and a non-empty WQE. A NIC processes up to there
/// without reading the doorbell record.
pub const fn doorbell_end(value: u64, qpn: u32) -> Option<u16> {
    let b = value.to_le_bytes();
    let opmod_idx_opcode = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let qpn_ds = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    let ds = qpn_ds & 0x3F;
    if qpn_ds >> 8 != qpn || ds == 0 {
        return None;
    }
    let idx = (opmod_idx_opcode >> 8) as u16;
    Some(idx.wrapping_add(ds.div_ceil(4) as u16))
}
