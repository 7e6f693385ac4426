//! Entry points of the fuzz targets in `fuzz/` for this crate's decoders, and the replay of
//! their corpora as ordinary tests: the TCP bootstrap's stream (length prefixes, hellos,
//! rank 0's packed exchange) and the records ranks exchange through it (connection records,
//! window records). Each returns normally for every input; a panic is what the fuzzer looks
//! for.
//!
//! Built for tests and with the `fuzzing` feature only: not part of the API.

use crate::bootstrap::{decode_abort, decode_hello, get, unpack, MAX_RECORD};
use crate::comm::{decode_remote, decode_setup, encode_remote};

/// A job size from a fuzzer's byte: 1 to 64 ranks.
fn size_of(b: Option<&u8>) -> usize {
    b.map_or(1, |&b| 1 + (b as usize % 64))
}

/// A bootstrap TCP stream from a peer: a job size, then length-prefixed messages read as a
/// rank reads them (a hello, a contribution, rank 0's packed exchange or its word that a rank
/// left), until the stream ends
/// or breaks a rule.
pub fn bootstrap_stream(data: &[u8]) {
    let size = size_of(data.first());
    let mut rd = data.get(1..).unwrap_or_default();
    while let Ok(msg) = get(&mut rd, MAX_RECORD) {
        assert!(msg.len() <= MAX_RECORD);
        let _ = decode_hello(&msg);
        // Rank 0's word that a rank left is never also an exchange.
        if decode_abort(&msg).is_some() {
            assert!(unpack(&msg, size).is_none());
        }
        if let Some(all) = unpack(&msg, size) {
            assert_eq!(all.len(), size);
            assert_eq!(all.iter().map(|a| 4 + a.len()).sum::<usize>(), msg.len());
        }
    }
}

/// A record ranks exchange over the bootstrap: a job size and a count of endpoints per rank,
/// then a connection record; the same bytes as a window record.
pub fn connection_record(data: &[u8]) {
    let size = size_of(data.first());
    let per = 1 + data.get(1).map_or(0, |&b| b as usize % 3);
    let rec = data.get(2..).unwrap_or_default();
    if let Ok((ctrl, eps)) = decode_setup(rec, size, per) {
        assert_eq!(eps.len(), size);
        assert!(eps.iter().flatten().all(|v| v.len() == per));
        let mut b = Vec::new();
        encode_remote(&ctrl, &mut b);
        assert_eq!(b[..], rec[..b.len()]);
    }
    if let Some(r) = decode_remote(rec) {
        let mut b = Vec::new();
        encode_remote(&r, &mut b);
        assert_eq!(b, rec);
    }
}

/// The targets of this crate.
pub const TARGETS: [gdsync::fuzz::Target; 2] = [
    ("bootstrap_stream", bootstrap_stream),
    ("connection_record", connection_record),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed corpora (and past failures under `fuzz/regressions/`) replay without a
    /// panic, as CI runs them on stable.
    #[test]
    fn corpora_replay() {
        for (name, run) in TARGETS {
            let n = gdsync::fuzz::replay(env!("CARGO_MANIFEST_DIR"), name, run);
            eprintln!("{name}: {n} inputs");
        }
    }

    #[test]
    fn edge_inputs() {
        let huge_prefix = [&[3u8][..], &u32::MAX.to_le_bytes()].concat();
        for (_, run) in TARGETS {
            for input in [&[][..], &[0], &[0xFF; 64], &huge_prefix] {
                run(input);
            }
        }
    }
}
