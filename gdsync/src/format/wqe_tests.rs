//! Tests of the send and receive WQE writer and reader: round trips for every opcode, inline
//! payloads and data-segment lists, and the reader's answer to malformed or arbitrary bytes.

use super::*;
use proptest::collection::vec;
use proptest::prelude::*;

/// The opcodes a send WQE can carry here.
const SUPPORTED: &[Opcode] = &[
    Opcode::Nop,
    Opcode::RdmaWrite,
    Opcode::RdmaWriteImm,
    Opcode::Send,
    Opcode::SendImm,
    Opcode::RdmaRead,
    Opcode::AtomicCs,
    Opcode::AtomicFa,
];

/// A data segment a reader cannot take for an inline header or a terminator.
fn data_seg() -> impl Strategy<Value = DataSeg> {
    (any::<u64>(), 1u32..INLINE_SEG_FLAG, any::<u32>()).prop_map(|(a, l, k)| DataSeg::new(a, l, k))
}

/// What a send WQE carries after its fixed segments, owned.
#[derive(Clone, Debug)]
enum Data {
    Inline(Vec<u8>),
    Gather(Vec<DataSeg>),
}

/// A send WQE's fields and its owned data, for every opcode; up to 16 data segments, or an
/// inline payload as long as still fits.
fn send_parts() -> impl Strategy<Value = (SendWqe<'static>, Data)> {
    (
        proptest::sample::select(SUPPORTED),
        any::<u16>(),
        0u32..1 << 24,
        any::<u8>(),
        any::<[u8; 4]>(),
        any::<(u64, u32, u64, u64)>(),
        any::<bool>(),
        vec(data_seg(), 0..=16),
        vec(any::<u8>(), 0..=1000),
    )
        .prop_map(
            |(op, idx, qpn, flags, imm, (raddr, rkey, sa, cmp), inline, segs, payload)| {
                let nop = op == Opcode::Nop;
                let wqe = SendWqe {
                    wqe_index: idx,
                    opcode: op,
                    qpn,
                    flags: FmCeSe::from_bits_retain(flags),
                    imm,
                    raddr: (op.has_raddr() && !nop).then(|| RaddrSeg::new(raddr, rkey)),
                    atomic: op.is_atomic().then(|| AtomicSeg::new(sa, cmp)),
                    data: WqeData::Gather(DataSegs::EMPTY),
                };
                let data = if nop {
                    Data::Gather(Vec::new())
                } else if inline && op.carries_payload() {
                    Data::Inline(payload)
                } else {
                    Data::Gather(segs)
                };
                (wqe, data)
            },
        )
}

fn with_data<'a>(mut w: SendWqe<'a>, d: &'a Data) -> SendWqe<'a> {
    w.data = match d {
        Data::Inline(p) => WqeData::Inline(p),
        Data::Gather(s) => WqeData::Gather(DataSegs::from_segs(s)),
    };
    w
}

/// A valid WQE's bytes (of exactly its ds units).
fn rdma_write_bytes() -> Vec<u8> {
    let segs = [DataSeg::new(0x1000, 64, 7)];
    let w = SendWqe {
        wqe_index: 5,
        opcode: Opcode::RdmaWrite,
        qpn: 0x12,
        flags: FmCeSe::CQ_UPDATE,
        imm: [0; 4],
        raddr: Some(RaddrSeg::new(0x2000, 9)),
        atomic: None,
        data: WqeData::Gather(DataSegs::from_segs(&segs)),
    };
    let mut b = vec![0u8; 48];
    assert_eq!(w.write_to(&mut b), Ok(3));
    b
}

#[test]
fn send_wqe_writes_the_reference_layout() {
    let b = rdma_write_bytes();
    let ctrl = CtrlSeg::from_bytes(b[..16].try_into().unwrap());
    assert_eq!(
        (ctrl.wqe_index(), ctrl.opcode(), ctrl.qpn(), ctrl.ds()),
        (5, Some(Opcode::RdmaWrite), 0x12, 3)
    );
    assert_eq!(&b[16..32], &RaddrSeg::new(0x2000, 9).to_bytes());
    assert_eq!(&b[32..48], &DataSeg::new(0x1000, 64, 7).to_bytes());
}

#[test]
fn send_wqe_parse_rejects_malformed_bytes() {
    let good = rdma_write_bytes();
    assert!(SendWqe::parse(&good).is_ok());
    // ds 0.
    let mut b = good.clone();
    b[7] = 0;
    assert_eq!(SendWqe::parse(&b), Err(WqeError::EmptyDs));
    // Fewer bytes than ds says.
    assert_eq!(
        SendWqe::parse(&good[..40]),
        Err(WqeError::Truncated { need: 48, have: 40 })
    );
    assert!(matches!(
        SendWqe::parse(&good[..8]),
        Err(WqeError::Truncated { .. })
    ));
    // Unknown and unmodelled opcodes.
    let mut b = good.clone();
    b[3] = 0x7F;
    assert_eq!(SendWqe::parse(&b), Err(WqeError::UnknownOpcode(0x7F)));
    b[3] = Opcode::Umr as u8;
    assert_eq!(SendWqe::parse(&b), Err(WqeError::Unsupported(Opcode::Umr)));
    // An RDMA write without room for its remote-address segment.
    let mut b = good.clone();
    b[7] = 1;
    assert!(matches!(
        SendWqe::parse(&b),
        Err(WqeError::Shape {
            op: Opcode::RdmaWrite,
            ..
        })
    ));
    // A read whose data segment is flagged inline.
    let mut b = good.clone();
    b[3] = Opcode::RdmaRead as u8;
    b[32] |= 0x80;
    assert_eq!(
        SendWqe::parse(&b),
        Err(WqeError::InlineNotAllowed(Opcode::RdmaRead))
    );
    // An inline header claiming more bytes than the WQE holds.
    let mut b = good.clone();
    b[32..36].copy_from_slice(&InlineHeader::new(13).byte_count.bytes());
    assert_eq!(
        SendWqe::parse(&b),
        Err(WqeError::InlineOverrun { len: 13, room: 12 })
    );
}

#[test]
fn nop_segments_are_not_read() {
    // A write neutralised into a NOP keeps its segments; they are not parsed.
    let mut b = rdma_write_bytes();
    b[3] = Opcode::Nop as u8;
    b[16] = 0xFF; // would read as an oversized inline header
    let w = SendWqe::parse(&b).unwrap();
    assert_eq!((w.opcode, w.raddr, w.atomic), (Opcode::Nop, None, None));
    assert_eq!(w.data, WqeData::Gather(DataSegs::EMPTY));
}

#[test]
fn an_empty_inline_payload_takes_no_segment() {
    // libmlx5 and the kernel's mlx5 driver write no inline segment for zero bytes.
    let w = SendWqe {
        wqe_index: 9,
        opcode: Opcode::Send,
        qpn: 2,
        flags: FmCeSe::CQ_UPDATE,
        imm: [0; 4],
        raddr: None,
        atomic: None,
        data: WqeData::Inline(&[]),
    };
    let mut out = [0xA5u8; 32];
    assert_eq!(w.write_to(&mut out), Ok(1));
    assert_eq!(w.ctrl().ds(), 1);
    assert!(out[16..].iter().all(|&b| b == 0xA5));
    let back = SendWqe::parse(&out).unwrap();
    assert_eq!(back.data, WqeData::Gather(DataSegs::EMPTY));
    // A foreign writer's empty inline segment still reads as an empty payload.
    out[16..20].copy_from_slice(&InlineHeader::new(0).byte_count.bytes());
    out[7] = 2;
    assert_eq!(SendWqe::parse(&out).unwrap().data, WqeData::Inline(&[]));
}

#[test]
fn send_wqe_writer_refuses_what_it_cannot_read_back() {
    let segs = [DataSeg::new(0, 8, 1)];
    let w = SendWqe {
        wqe_index: 0,
        opcode: Opcode::Send,
        qpn: 1,
        flags: FmCeSe::empty(),
        imm: [0; 4],
        raddr: None,
        atomic: None,
        data: WqeData::Gather(DataSegs::from_segs(&segs)),
    };
    let mut out = [0u8; 1024];
    assert_eq!(w.write_to(&mut out), Ok(2));
    assert!(matches!(
        SendWqe {
            raddr: Some(RaddrSeg::new(0, 0)),
            ..w
        }
        .write_to(&mut out),
        Err(WqeError::Shape { .. })
    ));
    assert_eq!(
        SendWqe {
            opcode: Opcode::RdmaRead,
            raddr: Some(RaddrSeg::new(0, 0)),
            data: WqeData::Inline(&[1, 2]),
            ..w
        }
        .write_to(&mut out),
        Err(WqeError::InlineNotAllowed(Opcode::RdmaRead))
    );
    let inline_looking = [DataSeg::new(0, INLINE_SEG_FLAG | 4, 1)];
    assert_eq!(
        SendWqe {
            data: WqeData::Gather(DataSegs::from_segs(&inline_looking)),
            ..w
        }
        .write_to(&mut out),
        Err(WqeError::AmbiguousSeg(0))
    );
    let big = [0u8; 1000];
    assert_eq!(
        SendWqe {
            data: WqeData::Inline(&big),
            ..w
        }
        .write_to(&mut out),
        Err(WqeError::TooLarge { ds: 64 })
    );
    assert_eq!(
        w.write_to(&mut out[..16]),
        Err(WqeError::Truncated { need: 32, have: 16 })
    );
    assert_eq!(
        SendWqe {
            opcode: Opcode::LocalInval,
            ..w
        }
        .write_to(&mut out),
        Err(WqeError::Unsupported(Opcode::LocalInval))
    );
}

#[test]
fn recv_wqe_examples() {
    let segs = [DataSeg::new(0x10, 100, 3)];
    let w = RecvWqe {
        segs: DataSegs::from_segs(&segs),
    };
    let mut slot = [0xAAu8; 64];
    assert_eq!(w.write_to(&mut slot), Ok(32));
    assert_eq!(&slot[16..32], &DataSeg::terminator().to_bytes());
    assert_eq!(&slot[32..], &[0xAA; 32], "past the terminator is untouched");
    assert_eq!(RecvWqe::parse(&slot), Ok(w));
    // A full slot has no terminator.
    let mut slot = [0u8; 16];
    assert_eq!(w.write_to(&mut slot), Ok(16));
    assert_eq!(RecvWqe::parse(&slot), Ok(w));
    assert_eq!(RecvWqe::parse(&[0; 24]), Err(WqeError::RecvStride(24)));
    assert_eq!(RecvWqe::parse(&[]), Err(WqeError::RecvStride(0)));
    let two = [segs[0], segs[0]];
    assert_eq!(
        RecvWqe {
            segs: DataSegs::from_segs(&two)
        }
        .write_to(&mut slot),
        Err(WqeError::Truncated { need: 32, have: 16 })
    );
    let term = [DataSeg::terminator()];
    assert_eq!(
        RecvWqe {
            segs: DataSegs::from_segs(&term)
        }
        .write_to(&mut [0; 32]),
        Err(WqeError::AmbiguousSeg(0))
    );
}

#[test]
fn opcode_predicates() {
    use Opcode::*;
    for &op in SUPPORTED {
        assert_eq!(op.reads_remote(), op == RdmaRead, "{op:?}");
        assert_eq!(
            op.writes_remote(),
            matches!(op, RdmaWrite | RdmaWriteImm),
            "{op:?}"
        );
        assert_eq!(
            op.returns_data(),
            matches!(op, RdmaRead | AtomicCs | AtomicFa),
            "{op:?}"
        );
        assert_eq!(
            op.carries_payload(),
            matches!(op, Send | SendImm | RdmaWrite | RdmaWriteImm),
            "{op:?}"
        );
        assert_eq!(
            op.responder_cqe(),
            match op {
                Send => Some(CqeOpcode::RespSend),
                SendImm => Some(CqeOpcode::RespSendImm),
                RdmaWriteImm => Some(CqeOpcode::RespWrImm),
                _ => None,
            },
            "{op:?}"
        );
        assert_eq!(op.responder_cqe().is_some(), op.consumes_recv(), "{op:?}");
        // Every operation but a NOP either carries a payload or returns data, never both.
        assert_eq!(
            op.carries_payload() ^ op.returns_data(),
            op != Nop,
            "{op:?}"
        );
    }
}

/// The send and write opcodes [`SendWqe::peek_common`] reads.
const COMMON: [Opcode; 4] = [
    Opcode::Send,
    Opcode::SendImm,
    Opcode::RdmaWrite,
    Opcode::RdmaWriteImm,
];

/// `w` written, padded with zeros to at least a block: its bytes and its first block.
fn written(w: &SendWqe<'_>) -> (Vec<u8>, [u8; WQEBB]) {
    let mut buf = vec![0u8; 4 * WQEBB];
    let ds = w.write_to(&mut buf).expect("a valid WQE");
    buf.truncate(ds * SEG_SIZE);
    let mut first = [0u8; WQEBB];
    let n = buf.len().min(WQEBB);
    first[..n].copy_from_slice(&buf[..n]);
    (buf, first)
}

/// What [`SendWqe::peek_common`] read, as the full parse reads it: the WQE with its data
/// (`wqe`, its `ds` units).
fn as_parsed<'a>(c: &CommonWqe, wqe: &'a [u8]) -> SendWqe<'a> {
    let data = match c.data {
        CommonData::Inline { at, len } => WqeData::Inline(&wqe[at..at + len]),
        CommonData::Segment(d) => {
            // The one segment ends the WQE.
            let last = &wqe[wqe.len() - SEG_SIZE..];
            assert_eq!(DataSeg::from_bytes(last.try_into().unwrap()), d);
            WqeData::Gather(DataSegs::from_bytes(last))
        }
    };
    SendWqe {
        wqe_index: c.ctrl.wqe_index(),
        opcode: c.opcode,
        qpn: c.ctrl.qpn(),
        flags: c.ctrl.flags(),
        imm: c.ctrl.imm,
        raddr: c.raddr,
        atomic: None,
        data,
    }
}

#[test]
fn peek_common_reads_inline_payloads_as_the_full_parse_does() {
    let payload: Vec<u8> = (1..=60).collect();
    for opcode in COMMON {
        for len in 0..=60 {
            for flags in [FmCeSe::empty(), FmCeSe::SOLICITED | FmCeSe::CQ_UPDATE] {
                let w = SendWqe {
                    wqe_index: 7,
                    opcode,
                    qpn: 0x12,
                    flags,
                    imm: [1, 2, 3, 4],
                    raddr: opcode
                        .has_raddr()
                        .then(|| RaddrSeg::new(0x1122_3344_5566_7788, 0xAABB)),
                    atomic: None,
                    data: WqeData::Inline(&payload[..len]),
                };
                let (bytes, first) = written(&w);
                let fast = SendWqe::peek_common(&first);
                if len == 0 {
                    // Written with no data segment at all: the full parse's to read.
                    assert!(fast.is_none(), "{opcode:?}, empty");
                    continue;
                }
                let fast = fast.unwrap_or_else(|| panic!("{opcode:?}, {len} bytes"));
                assert_eq!(as_parsed(&fast, &bytes), w, "{opcode:?}, {len} bytes");
                assert_eq!(SendWqe::parse(&bytes), Ok(w));
            }
        }
    }
}

#[test]
fn peek_common_reads_one_segment_as_the_full_parse_does() {
    for opcode in COMMON {
        for len in [1, 255, 256, 4096, (1 << 31) - 1] {
            let seg = [DataSeg::new(0x1000_2000_3000, len, 0x55AA)];
            let w = SendWqe {
                wqe_index: 3,
                opcode,
                qpn: 0x12,
                flags: FmCeSe::SOLICITED,
                imm: [4, 3, 2, 1],
                raddr: opcode
                    .has_raddr()
                    .then(|| RaddrSeg::new(0x1122_3344_5566_7788, 0xAABB)),
                atomic: None,
                data: WqeData::Gather(DataSegs::from_segs(&seg)),
            };
            let (bytes, first) = written(&w);
            let fast =
                SendWqe::peek_common(&first).unwrap_or_else(|| panic!("{opcode:?}, {len} bytes"));
            assert_eq!(fast.data, CommonData::Segment(seg[0]));
            assert_eq!(as_parsed(&fast, &bytes), w, "{opcode:?}, {len} bytes");
            assert_eq!(SendWqe::parse(&bytes), Ok(w));
        }
    }
}

#[test]
fn peek_common_leaves_everything_else_to_the_full_parse() {
    let one = [DataSeg::new(0x1000, 8, 0x55)];
    let write = SendWqe {
        wqe_index: 0,
        opcode: Opcode::RdmaWrite,
        qpn: 1,
        flags: FmCeSe::empty(),
        imm: [0; 4],
        raddr: Some(RaddrSeg::new(0x2000, 9)),
        atomic: None,
        data: WqeData::Gather(DataSegs::from_segs(&one)),
    };
    let declined = |w: &SendWqe<'_>| SendWqe::peek_common(&written(w).1).is_none();
    assert!(!declined(&write), "the common case is taken");
    let two = [one[0], DataSeg::new(0x3000, 8, 0x55)];
    let empty = [DataSeg::new(0x1000, 0, 0x55)];
    let cases = [
        ("two segments", DataSegs::from_segs(&two), Opcode::RdmaWrite),
        ("no segment", DataSegs::EMPTY, Opcode::RdmaWrite),
        (
            "an empty segment",
            DataSegs::from_segs(&empty),
            Opcode::RdmaWrite,
        ),
        ("a read", DataSegs::from_segs(&one), Opcode::RdmaRead),
        ("a NOP", DataSegs::from_segs(&one), Opcode::Nop),
    ];
    for (what, segs, opcode) in cases {
        let w = SendWqe {
            opcode,
            raddr: (opcode.has_raddr()).then_some(RaddrSeg::new(0x2000, 9)),
            data: WqeData::Gather(segs),
            ..write
        };
        assert!(declined(&w), "{what}");
    }
    // Malformed: an inline payload that runs past the WQE's ds units. The full parse
    // refuses it too.
    let payload = [9u8; 20];
    let inline = SendWqe {
        data: WqeData::Inline(&payload),
        ..write
    };
    let (mut bytes, _) = written(&inline);
    bytes[7] -= 1;
    let mut first = [0u8; WQEBB];
    first.copy_from_slice(&bytes[..WQEBB]);
    assert!(SendWqe::peek_common(&first).is_none());
    assert!(SendWqe::parse(&bytes[..bytes.len() - SEG_SIZE]).is_err());
}

proptest! {
    #[test]
    fn prop_send_wqe_round_trip((fields, data) in send_parts()) {
        let w = with_data(fields, &data);
        let ds = w.ds();
        let mut out = [0xA5u8; 1100];
        match w.write_to(&mut out) {
            Ok(n) => {
                prop_assert_eq!(n, ds);
                prop_assert!(ds <= MAX_WQE_DS);
                // An empty inline payload is written as no segment: it reads back as an
                // empty gather list.
                let back = match w.data {
                    WqeData::Inline([]) => SendWqe { data: WqeData::Gather(DataSegs::EMPTY), ..w },
                    _ => w,
                };
                prop_assert_eq!(SendWqe::parse(&out[..ds * SEG_SIZE]), Ok(back));
                prop_assert_eq!(SendWqe::parse(&out), Ok(back));
                prop_assert!(out[ds * SEG_SIZE..].iter().all(|&b| b == 0xA5));
                prop_assert_eq!(CtrlSeg::from_bytes(out[..16].try_into().unwrap()), w.ctrl());
            }
            // Only an inline payload can outgrow a WQE (16 data segments always fit).
            Err(e) => {
                prop_assert_eq!(e, WqeError::TooLarge { ds });
                prop_assert!(matches!(data, Data::Inline(_)) && ds > MAX_WQE_DS);
            }
        }
    }

    /// On any valid WQE and on arbitrary bytes, what the fast look reads is what the full
    /// parse reads.
    #[test]
    fn prop_peek_common_reads_what_parse_reads((fields, data) in send_parts(), noise in vec(any::<u8>(), WQEBB..=4 * WQEBB)) {
        let w = with_data(fields, &data);
        let mut out = [0u8; 1100];
        if w.write_to(&mut out).is_ok() {
            let first: [u8; WQEBB] = out[..WQEBB].try_into().unwrap();
            if let Some(c) = SendWqe::peek_common(&first) {
                let n = c.ctrl.ds() as usize * SEG_SIZE;
                prop_assert_eq!(SendWqe::parse(&out[..n]), Ok(as_parsed(&c, &out[..n])));
            }
        }
        let first: [u8; WQEBB] = noise[..WQEBB].try_into().unwrap();
        if let Some(c) = SendWqe::peek_common(&first) {
            let n = c.ctrl.ds() as usize * SEG_SIZE;
            if let Some(wqe) = noise.get(..n) {
                prop_assert_eq!(SendWqe::parse(wqe), Ok(as_parsed(&c, wqe)));
            }
        }
    }

    #[test]
    fn prop_send_wqe_parse_any_bytes(b in vec(any::<u8>(), 0..1100)) {
        if let Ok(w) = SendWqe::parse(&b) {
            let ctrl = CtrlSeg::from_bytes(b[..16].try_into().unwrap());
            prop_assert!(w.opcode.is_supported());
            prop_assert!(ctrl.ds() > 0 && b.len() >= ctrl.ds() as usize * SEG_SIZE);
            prop_assert!(w.ds() <= ctrl.ds() as usize);
        }
    }

    #[test]
    fn prop_send_wqe_parse_rejects_broken_wqes(
        (fields, data) in send_parts(),
        cut in 1usize..16,
        bad_op in any::<u8>(),
    ) {
        let w = with_data(fields, &data);
        let mut out = [0u8; 1100];
        if let Ok(ds) = w.write_to(&mut out) {
            let n = ds * SEG_SIZE;
            // Short by any amount: an error.
            let short = SendWqe::parse(&out[..n - cut.min(n)]);
            prop_assert!(matches!(short, Err(WqeError::Truncated { .. })), "{:?}", short);
            let mut b = out;
            b[7] &= !0x3F;
            prop_assert_eq!(SendWqe::parse(&b), Err(WqeError::EmptyDs));
            let mut b = out;
            b[3] = bad_op;
            match Opcode::from_u8(bad_op) {
                None => prop_assert_eq!(SendWqe::parse(&b), Err(WqeError::UnknownOpcode(bad_op))),
                Some(op) if !op.is_supported() => {
                    prop_assert_eq!(SendWqe::parse(&b), Err(WqeError::Unsupported(op)))
                }
                Some(_) => {}
            }
        }
    }

    #[test]
    fn prop_recv_wqe_round_trip(shift in 0u32..5, segs in vec(data_seg(), 0..=16)) {
        let stride = SEG_SIZE << shift;
        let segs = &segs[..segs.len().min(stride / SEG_SIZE)];
        let w = RecvWqe { segs: DataSegs::from_segs(segs) };
        let mut slot = vec![0x5Au8; stride];
        let n = w.write_to(&mut slot).unwrap();
        prop_assert_eq!(n, (segs.len() * SEG_SIZE + SEG_SIZE).min(stride));
        prop_assert_eq!(RecvWqe::parse(&slot), Ok(w));
        prop_assert!(slot[n..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn prop_recv_wqe_parse_any_bytes(b in vec(any::<u8>(), 0..300)) {
        match RecvWqe::parse(&b) {
            Ok(w) => {
                prop_assert!(!b.is_empty() && b.len() % SEG_SIZE == 0);
                prop_assert!(w.segs.iter().all(|d| !d.is_terminator()));
                prop_assert!(w.segs.len() * SEG_SIZE <= b.len());
            }
            Err(e) => prop_assert_eq!(e, WqeError::RecvStride(b.len())),
        }
    }
}
