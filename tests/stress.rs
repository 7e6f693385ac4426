//! 100,000 messages of random sizes (0 to 1 MiB) between two QPs on two devices of one
//! process: no loss, no duplication, no reordering, no corruption.
//!
//! Each message is a send with immediate data; the immediate is its sequence number. A
//! message of 16 bytes or more starts with its sequence number (8 bytes) and a checksum of
//! the rest (8 bytes); shorter ones are checked byte for byte against the payload the
//! receiver regenerates from the sequence number. The receiver regenerates every size from
//! the same PRNG, so the length is checked too.
//!
//! Sizes (deterministic xorshift PRNG, seed below), chosen so a debug build moves ~150 MB:
//! - every 10,000th message is exactly 1 MiB (10 messages);
//! - otherwise, with probability 1/64, log-uniform up to 1 MiB: e uniform in 0..=20, size
//!   uniform in 2^e/2..=2^e (about 1,550 messages, ~75 KB on average);
//! - otherwise log-uniform up to 4 KiB: e uniform in 0..=12, size uniform in 0..=2^e
//!   (about 98,400 messages, ~315 B on average; some are empty).
//!
//! Flow control: the receiver keeps `WINDOW` receives posted (1 MiB each, two SGEs split at
//! a different point per slot); the sender never has more than `WINDOW` messages beyond the
//! last one received, so receiver-not-ready never happens: the sender's `rnr_retry` is 0,
//! so a single RNR NAK would fail the test. Every third small message goes inline, every
//! seventh is gathered from three SGEs; every fourth send is signalled.

mod common;

use common::*;
use gdasync::gdsync::{Access, QpConfig, RecvWr, SendWr};
use std::time::{Duration, Instant};

const N: u64 = 100_000;
const MAX: usize = 1 << 20;
const WINDOW: usize = 32;
const SEED: u64 = 0x5EED_0F57_E55E;

fn next_size(rng: &mut Rng, seq: u64) -> usize {
    if seq % 10_000 == 9_999 {
        return MAX;
    }
    if rng.below(64) == 0 {
        let e = rng.below(21);
        let hi = 1u64 << e;
        (hi / 2 + rng.below(hi - hi / 2 + 1)) as usize
    } else {
        let e = rng.below(13);
        rng.below((1 << e) + 1) as usize
    }
}

/// Fills `buf` with message `seq`'s bytes.
fn fill_message(seq: u64, buf: &mut [u8]) {
    let mut r = Rng::new(seq ^ 0xDA7A);
    if buf.len() >= 16 {
        r.fill(&mut buf[16..]);
        let sum = checksum(&buf[16..]);
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..16].copy_from_slice(&sum.to_le_bytes());
    } else {
        r.fill(buf);
    }
}

/// Checks message `seq` as received.
fn check_message(seq: u64, got: &[u8]) {
    if got.len() >= 16 {
        let s = u64::from_le_bytes(got[..8].try_into().unwrap());
        assert_eq!(s, seq, "message {seq} carries sequence number {s}");
        let sum = u64::from_le_bytes(got[8..16].try_into().unwrap());
        assert_eq!(
            checksum(&got[16..]),
            sum,
            "message {seq} ({} bytes) corrupted",
            got.len()
        );
    } else {
        let mut want = vec![0u8; got.len()];
        fill_message(seq, &mut want);
        assert_eq!(got, &want[..], "message {seq} corrupted");
    }
}

#[test]
fn hundred_thousand_messages() {
    let cfg_a = QpConfig {
        rnr_retry: 0,
        ..QpConfig::default()
    };
    let mut p = Pair::with_config(Topo::TwoDevices, &cfg_a, &QpConfig::default());
    let mut sbuf = vec![0u8; WINDOW * MAX];
    let mut rbuf = vec![0u8; WINDOW * MAX];
    let smr = p.a.pd.register(&mut sbuf, Access::empty()).unwrap();
    let rmr = p.b.pd.register(&mut rbuf, Access::LOCAL_WRITE).unwrap();
    let post_recv = |p: &mut Pair, slot: usize| {
        let base = slot * MAX;
        let split = 1000 + slot * 4099;
        p.b.qp
            .post_recv(
                &RecvWr::new()
                    .sge(rmr.sge(base..base + split))
                    .sge(rmr.sge(base + split..base + MAX))
                    .wr_id(slot as u64),
            )
            .unwrap();
    };
    for slot in 0..WINDOW {
        post_recv(&mut p, slot);
    }

    let mut send_sizes = Rng::new(SEED);
    let mut recv_sizes = Rng::new(SEED);
    let (mut sent, mut sends_done, mut received) = (0u64, 0u64, 0u64);
    let mut bytes = 0u64;
    let mut scratch = vec![0u8; MAX];
    let mut comps = Vec::with_capacity(64);
    let mut last_progress = Instant::now();
    while received < N {
        let mut progress = false;
        // Send while the receiver has receives for it and a send buffer is free.
        while sent < N && sent < received + WINDOW as u64 && sent < sends_done + WINDOW as u64 {
            let size = next_size(&mut send_sizes, sent);
            let slot = (sent % WINDOW as u64) as usize;
            let base = slot * MAX;
            fill_message(sent, &mut scratch[..size]);
            smr.write_at(base, &scratch[..size]);
            let mut wr = SendWr::send_imm(sent as u32).wr_id(sent);
            if size <= 128 && sent % 3 == 0 {
                wr = wr.sge(smr.sge(base..base + size)).inline();
            } else if sent % 7 == 0 && size >= 3 {
                let (x, y) = (size / 3, 2 * size / 3);
                wr = wr.sges(&[
                    smr.sge(base..base + x),
                    smr.sge(base + x..base + y),
                    smr.sge(base + y..base + size),
                ]);
            } else if size > 0 {
                wr = wr.sge(smr.sge(base..base + size));
            }
            if (sent + 1) % 4 != 0 && sent + 1 != N {
                wr = wr.unsignaled();
            }
            p.a.qp
                .post_send(&wr)
                .unwrap_or_else(|e| panic!("post message {sent}: {e}"));
            sent += 1;
            bytes += size as u64;
            progress = true;
        }
        // Send completions free send buffers (in order: a completion covers those before).
        comps.clear();
        p.a.scq.poll(&mut comps, 64).unwrap();
        for c in &comps {
            assert!(c.is_ok(), "send failed: {c:?}");
            assert!(
                (c.wr_id >= sends_done && c.wr_id < sent)
                    && ((c.wr_id + 1) % 4 == 0 || c.wr_id + 1 == N),
                "unexpected send completion {c:?} (done {sends_done}, sent {sent})"
            );
            sends_done = c.wr_id + 1;
            progress = true;
        }
        // Receive completions: in order, each in the next slot, intact.
        comps.clear();
        p.b.rcq.poll(&mut comps, 64).unwrap();
        for c in &comps {
            assert!(c.is_ok(), "receive {received} failed: {c:?}");
            let slot = (received % WINDOW as u64) as usize;
            assert_eq!(
                c.wr_id, slot as u64,
                "receive {received} completed out of order"
            );
            assert_eq!(
                c.imm,
                Some(received as u32),
                "message {received}: lost, duplicated or reordered"
            );
            let size = next_size(&mut recv_sizes, received);
            assert_eq!(c.byte_len as usize, size, "message {received} length");
            rmr.read_at(slot * MAX, &mut scratch[..size]);
            check_message(received, &scratch[..size]);
            received += 1;
            post_recv(&mut p, slot);
            progress = true;
        }
        if progress {
            last_progress = Instant::now();
        } else {
            assert!(
                last_progress.elapsed() < TIMEOUT,
                "stalled: sent {sent}, sends done {sends_done}, received {received}"
            );
            std::thread::yield_now();
        }
    }
    // Send completions may trail their receives (the engine acknowledges after delivering):
    // the ones still due arrive in order, each a signalled send, ending with the last.
    while sends_done < N {
        let c = poll1(&p.a.scq);
        assert!(
            c.is_ok() && c.wr_id >= sends_done && ((c.wr_id + 1) % 4 == 0 || c.wr_id + 1 == N),
            "trailing send completion {c:?} (done {sends_done})"
        );
        sends_done = c.wr_id + 1;
    }
    assert_quiet(&p.b.rcq, Duration::from_millis(20));
    assert_quiet(&p.a.scq, Duration::ZERO);
    println!("{N} messages, {bytes} bytes");
    assert!(
        bytes > 20 * MAX as u64,
        "size distribution degenerate: {bytes} bytes"
    );
}
