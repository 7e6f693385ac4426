//! The format's constants in C: renders `gdsync/include/gdsync_format.h`, the header that
//! `gdsync.cuh` includes, from the constants and enums of this module, and checks the copy
//! in the repository against it. A stale copy fails the test; `GDSYNC_BLESS=1` rewrites it.

use super::cqe::{
    CQE_BYTE_CNT_OFFSET, CQE_IMM_OFFSET, CQE_INIT_OP_OWN, CQE_OP_OWN_OFFSET, CQE_OWNER_MASK,
    CQE_OWNER_WORD_OFFSET, CQE_SIZE, CQE_SOP_DROP_QPN_OFFSET, CQE_SYNDROME_OFFSET,
    CQE_VENDOR_SYNDROME_OFFSET, CQE_WQE_COUNTER_OFFSET,
};
use super::{
    CqeOpcode, FmCeSe, InlineHeader, Opcode, Syndrome, DBREC_CQ_CI, DBREC_RQ, DBREC_SQ,
    INLINE_SEG_FLAG, INVALID_LKEY, MAX_WQE_DS, MAX_WQE_WQEBBS, SEG_SIZE, WQEBB,
};
use std::fmt::Write;

/// The checked-in copy.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include/gdsync_format.h");

/// `RdmaWriteImm` -> `RDMA_WRITE_IMM`.
fn screaming(name: &str) -> String {
    let mut s = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
    }
    s
}

/// One `#define` per value of a byte enum, named `prefix` + the variant's name.
fn byte_enum<T: std::fmt::Debug>(out: &mut String, prefix: &str, decode: fn(u8) -> Option<T>) {
    for b in 0..=u8::MAX {
        if let Some(v) = decode(b) {
            let name = screaming(&format!("{v:?}"));
            writeln!(out, "#define {prefix}{name} 0x{b:02X}").unwrap();
        }
    }
}

fn define(out: &mut String, name: &str, value: impl std::fmt::Display) {
    writeln!(out, "#define {name} {value}").unwrap();
}

/// The header's text.
fn render() -> String {
    let mut s = String::from(
        "// gdsync_format.h: GENERATED from the Rust module gdsync::format (gdsync/src/format/\n\
         // c_header.rs), DO NOT EDIT. Regenerate with\n\
         //     GDSYNC_BLESS=1 cargo test -p gdsync --lib c_header\n\
         // The mlx5 data-path constants that gdsync.cuh composes WQEs and reads CQEs with.\n\
         #ifndef GDSYNC_FORMAT_H\n#define GDSYNC_FORMAT_H\n\n\
         // Send WQE opcodes (ctrl segment, low byte of word 0).\n",
    );
    byte_enum(&mut s, "GDS_OP_", Opcode::from_u8);
    s.push_str("\n// CQE opcodes (op_own >> 4).\n");
    byte_enum(&mut s, "GDS_CQE_OP_", CqeOpcode::from_u8);
    s.push_str("\n// Error-CQE syndromes.\n");
    byte_enum(&mut s, "GDS_SYNDROME_", Syndrome::from_u8);
    s.push_str("\n// Bits of the ctrl segment's fm_ce_se byte.\n");
    for (name, flag) in FmCeSe::all().iter_names() {
        define(
            &mut s,
            &format!("GDS_FM_CE_SE_{name}"),
            format!("0x{:02X}u", flag.bits()),
        );
    }
    s.push_str(
        "\n// WQE sizes in bytes, segment units (DS) and the inline and receive-list markers.\n",
    );
    define(&mut s, "GDS_WQEBB", WQEBB);
    define(&mut s, "GDS_SEG_SIZE", SEG_SIZE);
    define(&mut s, "GDS_MAX_WQE_DS", MAX_WQE_DS);
    define(&mut s, "GDS_MAX_WQE_WQEBBS", MAX_WQE_WQEBBS);
    define(&mut s, "GDS_INLINE_HEADER_SIZE", size_of::<InlineHeader>());
    define(
        &mut s,
        "GDS_INLINE_SEG_FLAG",
        format!("0x{INLINE_SEG_FLAG:08X}u"),
    );
    define(&mut s, "GDS_INVALID_LKEY", format!("0x{INVALID_LKEY:X}u"));
    s.push_str("\n// Doorbell records: 32-bit word index of each counter.\n");
    define(&mut s, "GDS_DBREC_RQ", DBREC_RQ);
    define(&mut s, "GDS_DBREC_SQ", DBREC_SQ);
    define(&mut s, "GDS_DBREC_CQ_CI", DBREC_CQ_CI);
    s.push_str(
        "\n// The 64-byte CQE: byte offsets of its fields, the owner bit, the initial op_own.\n",
    );
    define(&mut s, "GDS_CQE_SIZE", CQE_SIZE);
    for (name, off) in [
        ("IMM", CQE_IMM_OFFSET),
        ("BYTE_CNT", CQE_BYTE_CNT_OFFSET),
        ("VENDOR_SYNDROME", CQE_VENDOR_SYNDROME_OFFSET),
        ("SYNDROME", CQE_SYNDROME_OFFSET),
        ("SOP_DROP_QPN", CQE_SOP_DROP_QPN_OFFSET),
        ("WQE_COUNTER", CQE_WQE_COUNTER_OFFSET),
        ("OWNER_WORD", CQE_OWNER_WORD_OFFSET),
        ("OP_OWN", CQE_OP_OWN_OFFSET),
    ] {
        define(&mut s, &format!("GDS_CQE_{name}_OFFSET"), off);
    }
    define(
        &mut s,
        "GDS_CQE_OWNER_MASK",
        format!("0x{CQE_OWNER_MASK:02X}u"),
    );
    define(
        &mut s,
        "GDS_CQE_INIT_OP_OWN",
        format!("0x{CQE_INIT_OP_OWN:02X}u"),
    );
    s.push_str("\n#endif\n");
    s
}

/// The checked-in header is what the format's constants render to (CI runs this test, so a
/// stale copy fails CI).
#[test]
fn c_header_is_current() {
    let want = render();
    if std::env::var_os("GDSYNC_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(PATH, &want).unwrap();
    }
    let have = std::fs::read_to_string(PATH).unwrap_or_default();
    assert!(
        have == want,
        "gdsync/include/gdsync_format.h is stale: run GDSYNC_BLESS=1 cargo test -p gdsync --lib \
         c_header to regenerate it"
    );
}

/// The names gdsync.cuh has always used come out of the renderer unchanged.
#[test]
fn c_header_keeps_the_cuda_names() {
    let h = render();
    for line in [
        "#define GDS_OP_NOP 0x00",
        "#define GDS_OP_RDMA_WRITE 0x08",
        "#define GDS_OP_RDMA_WRITE_IMM 0x09",
        "#define GDS_OP_SEND 0x0A",
        "#define GDS_OP_SEND_IMM 0x0B",
        "#define GDS_OP_RDMA_READ 0x10",
        "#define GDS_CQE_OP_REQ_ERR 0x0D",
        "#define GDS_FM_CE_SE_CQ_UPDATE 0x08u",
        "#define GDS_INLINE_SEG_FLAG 0x80000000u",
        "#define GDS_CQE_SOP_DROP_QPN_OFFSET 56",
    ] {
        assert!(h.lines().any(|l| l == line), "{line} missing from:\n{h}");
    }
}
