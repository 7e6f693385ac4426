// gdsync_format.h: GENERATED from the Rust module gdsync::format (gdsync/src/format/
// c_header.rs), DO NOT EDIT. Regenerate with
//     GDSYNC_BLESS=1 cargo test -p gdsync --lib c_header
// The mlx5 data-path constants that gdsync.cuh composes WQEs and reads CQEs with.
#ifndef GDSYNC_FORMAT_H
#define GDSYNC_FORMAT_H

// Send WQE opcodes (ctrl segment, low byte of word 0).
#define GDS_OP_NOP 0x00
#define GDS_OP_SEND_INVAL 0x01
#define GDS_OP_RDMA_WRITE 0x08
#define GDS_OP_RDMA_WRITE_IMM 0x09
#define GDS_OP_SEND 0x0A
#define GDS_OP_SEND_IMM 0x0B
#define GDS_OP_RDMA_READ 0x10
#define GDS_OP_ATOMIC_CS 0x11
#define GDS_OP_ATOMIC_FA 0x12
#define GDS_OP_ATOMIC_MASKED_CS 0x14
#define GDS_OP_ATOMIC_MASKED_FA 0x15
#define GDS_OP_LOCAL_INVAL 0x1B
#define GDS_OP_UMR 0x25

// CQE opcodes (op_own >> 4).
#define GDS_CQE_OP_REQ 0x00
#define GDS_CQE_OP_RESP_WR_IMM 0x01
#define GDS_CQE_OP_RESP_SEND 0x02
#define GDS_CQE_OP_RESP_SEND_IMM 0x03
#define GDS_CQE_OP_RESP_SEND_INV 0x04
#define GDS_CQE_OP_RESIZE_CQ 0x05
#define GDS_CQE_OP_NO_PACKET 0x06
#define GDS_CQE_OP_SIG_ERR 0x0C
#define GDS_CQE_OP_REQ_ERR 0x0D
#define GDS_CQE_OP_RESP_ERR 0x0E
#define GDS_CQE_OP_INVALID 0x0F

// Error-CQE syndromes.
#define GDS_SYNDROME_LOCAL_LENGTH 0x01
#define GDS_SYNDROME_LOCAL_QP_OP 0x02
#define GDS_SYNDROME_LOCAL_PROT 0x04
#define GDS_SYNDROME_WR_FLUSH 0x05
#define GDS_SYNDROME_MW_BIND 0x06
#define GDS_SYNDROME_BAD_RESP 0x10
#define GDS_SYNDROME_LOCAL_ACCESS 0x11
#define GDS_SYNDROME_REMOTE_INVAL_REQ 0x12
#define GDS_SYNDROME_REMOTE_ACCESS 0x13
#define GDS_SYNDROME_REMOTE_OP 0x14
#define GDS_SYNDROME_TRANSPORT_RETRY_EXC 0x15
#define GDS_SYNDROME_RNR_RETRY_EXC 0x16
#define GDS_SYNDROME_REMOTE_ABORTED 0x22

// Bits of the ctrl segment's fm_ce_se byte.
#define GDS_FM_CE_SE_SOLICITED 0x02u
#define GDS_FM_CE_SE_CQ_UPDATE 0x08u
#define GDS_FM_CE_SE_INITIATOR_SMALL_FENCE 0x20u
#define GDS_FM_CE_SE_FENCE 0x80u

// WQE sizes in bytes, segment units (DS) and the inline and receive-list markers.
#define GDS_WQEBB 64
#define GDS_SEG_SIZE 16
#define GDS_MAX_WQE_DS 63
#define GDS_MAX_WQE_WQEBBS 16
#define GDS_INLINE_HEADER_SIZE 4
#define GDS_INLINE_SEG_FLAG 0x80000000u
#define GDS_INVALID_LKEY 0x100u

// Doorbell records: 32-bit word index of each counter.
#define GDS_DBREC_RQ 0
#define GDS_DBREC_SQ 1
#define GDS_DBREC_CQ_CI 0

// The 64-byte CQE: byte offsets of its fields, the owner bit, the initial op_own.
#define GDS_CQE_SIZE 64
#define GDS_CQE_IMM_OFFSET 36
#define GDS_CQE_BYTE_CNT_OFFSET 44
#define GDS_CQE_VENDOR_SYNDROME_OFFSET 54
#define GDS_CQE_SYNDROME_OFFSET 55
#define GDS_CQE_SOP_DROP_QPN_OFFSET 56
#define GDS_CQE_WQE_COUNTER_OFFSET 60
#define GDS_CQE_OWNER_WORD_OFFSET 60
#define GDS_CQE_OP_OWN_OFFSET 63
#define GDS_CQE_OWNER_MASK 0x01u
#define GDS_CQE_INIT_OP_OWN 0xF1u

#endif
