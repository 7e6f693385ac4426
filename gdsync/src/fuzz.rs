//! Entry points of the fuzz targets in `fuzz/`, and the replay of their corpora as ordinary
//! tests: each feeds arbitrary bytes to one decoder of bytes that come from outside this code
//! (completion and work-queue entries other code writes, a peer's TCP link stream and
//! handshake, endpoint records). Each returns normally for every input and checks that what
//! it decodes encodes back to the same value; a panic is what the fuzzer looks for.
//!
//! Built for tests and with the `fuzzing` feature only: not part of the API.

use crate::device::soft::tcp::{self, Answer, Hello, ANSWER_LEN, HELLO_LEN};
use crate::format::{Cqe64, CqeOwner, DataSegs, RecvWqe, SendWqe, WqeData, CQE_SIZE};
use crate::Endpoint;

/// The first `N` bytes of `data`, zero-padded: every input reaches the decoder.
fn padded<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    (b, &data[n..])
}

/// A CQE as a CQ reader decodes it, and the owner-bit rule for the index and ring size in
/// the bytes after it.
pub fn cqe(data: &[u8]) {
    let (bytes, rest) = padded::<CQE_SIZE>(data);
    let c = Cqe64(bytes);
    let _ = format!("{c:?}");
    let _ = (
        c.opcode(),
        c.owner(),
        c.solicited(),
        c.is_error(),
        c.syndrome(),
    );
    let _ = (
        c.qpn(),
        c.wqe_opcode(),
        c.byte_cnt(),
        c.imm(),
        c.wqe_counter(),
    );
    let _ = (
        c.flags_rqpn(),
        c.srqn_uidx(),
        c.timestamp(),
        c.vendor_syndrome(),
    );
    assert_eq!(c.qpn(), c.sop_drop_qpn() & 0xFF_FFFF);
    let (n, rest) = padded::<8>(rest);
    let (cnt, _) = padded::<4>(rest);
    let (n, cnt) = (u64::from_le_bytes(n), u32::from_le_bytes(cnt));
    let new = CqeOwner::is_new(c.op_own(), n, cnt);
    assert!(
        !new || c.op_own() >> 4 != 0xF,
        "an invalid CQE is never new"
    );
    let _ = CqeOwner::wait_word(n, cnt);
}

/// A send WQE as the device reads it from a send ring; one that checks out writes back to
/// bytes that read the same (but for the remote-address segment's reserved bytes, which the
/// reader keeps and the writer zeroes, and an empty inline segment, which it writes as none).
pub fn send_wqe(data: &[u8]) {
    let Ok(mut w) = SendWqe::parse(data) else {
        return;
    };
    let _ = format!("{w:?}");
    if let Ok(ds) = w.check() {
        let mut out = vec![0u8; ds * crate::format::SEG_SIZE];
        assert_eq!(w.write_to(&mut out), Ok(ds));
        if let Some(r) = w.raddr.as_mut() {
            r.reserved = [0; 4];
        }
        // An empty inline segment is written as none: a zero-length gather list.
        if w.data == WqeData::Inline(&[]) {
            w.data = WqeData::Gather(DataSegs::EMPTY);
        }
        assert_eq!(SendWqe::parse(&out), Ok(w));
    }
}

/// A receive WQE as the device reads it from a receive-ring slot; it writes back to a slot
/// that reads the same.
pub fn recv_wqe(data: &[u8]) {
    let Ok(w) = RecvWqe::parse(data) else { return };
    let _ = w
        .segs
        .iter()
        .map(|d| d.byte_count.get() as u64)
        .sum::<u64>();
    let mut slot = vec![0xEEu8; data.len()];
    if w.write_to(&mut slot).is_ok() {
        assert_eq!(RecvWqe::parse(&slot), Ok(w));
    }
}

/// A TCP link stream as the inbound thread reads it: frames until the stream ends or turns
/// out corrupt. Every header read encodes back to the bytes it came from.
pub fn tcp_frames(data: &[u8]) {
    let mut rd = data;
    let mut payload = tcp::payload_buffer();
    loop {
        let before = rd;
        let Ok(h) = tcp::read_frame(&mut rd, &mut payload) else {
            return;
        };
        assert_eq!(tcp::encode_header(&h)[..], before[..tcp::FRAME_HDR]);
        assert!(h.seg_len as usize <= payload.len());
    }
}

/// The TCP link handshake: the listener's reading of a hello, the dialer's of an answer.
pub fn tcp_handshake(data: &[u8]) {
    let (hello, rest) = padded::<HELLO_LEN>(data);
    if let Some(h) = Hello::from_bytes(&hello) {
        let _ = h.compatible();
        assert_eq!(Hello::from_bytes(&h.to_bytes()), Some(h));
    }
    let (answer, _) = padded::<ANSWER_LEN>(rest);
    if let Some(code) = Answer::code_of(&answer) {
        let _ = Answer::describe(code);
    }
}

/// An endpoint, from its wire form and from its string form: what decodes encodes back to
/// the same endpoint both ways.
pub fn endpoint(data: &[u8]) {
    if let Ok(e) = Endpoint::from_bytes(data) {
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()).ok(), Some(e));
        assert_eq!(e.to_string().parse::<Endpoint>().ok(), Some(e));
    }
    if let Ok(e) = std::str::from_utf8(data).map(str::parse::<Endpoint>) {
        let Ok(e) = e else { return };
        assert_eq!(e.to_string().parse::<Endpoint>().ok(), Some(e));
    }
}

/// A fuzz target: its name (as `fuzz/fuzz_targets/` and `fuzz/corpus/` name it) and entry.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this crate.
pub const TARGETS: [Target; 6] = [
    ("cqe", cqe),
    ("send_wqe", send_wqe),
    ("recv_wqe", recv_wqe),
    ("tcp_frames", tcp_frames),
    ("tcp_handshake", tcp_handshake),
    ("endpoint", endpoint),
];

/// Feeds every file of `fuzz/corpus/<target>/` (and `fuzz/regressions/<target>/`, inputs
/// that once failed) to `run`, `manifest_dir` being a crate's directory beside `fuzz/`;
/// returns how many. Panics if the corpus is missing or empty, or naming the input that
/// made `run` panic.
pub fn replay(manifest_dir: &str, target: &str, run: fn(&[u8])) -> usize {
    let root = std::path::Path::new(manifest_dir).join("../fuzz");
    let mut n = 0;
    for kind in ["corpus", "regressions"] {
        let dir = root.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert!(kind != "corpus", "no corpus at {}", dir.display());
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let r = std::panic::catch_unwind(|| run(&data));
            assert!(r.is_ok(), "{target} panics on {}", path.display());
            n += 1;
        }
    }
    assert!(n > 0, "the corpus of {target} is empty");
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed corpora replay without a panic (as CI runs them, on stable).
    #[test]
    fn corpora_replay() {
        for (name, run) in TARGETS {
            let n = replay(env!("CARGO_MANIFEST_DIR"), name, run);
            eprintln!("{name}: {n} inputs");
        }
    }

    /// Inputs at the edges each target must survive, corpus or not.
    #[test]
    fn edge_inputs() {
        let long = vec![0xFFu8; 70_000];
        for (_, run) in TARGETS {
            for input in [&[][..], &[0], &[0xFF; 64], &long] {
                run(input);
            }
        }
    }
}
