//! The link ring's index logic checked exhaustively: every sequence of pushes (of records that
//! take one, two and three lines, and of empty ones) and pops up to a depth, on rings of four
//! and eight lines, from the first lap and from just before the stamp's 31-bit lap counter
//! wraps, run through the real [`Producer`] and [`Consumer`]. After each step: what the
//! consumer reads is exactly what was pushed, in order, byte for byte (a record is never seen
//! before it was pushed, twice, or over a stale one of an earlier lap); the producer never
//! has more bytes in flight than the ring holds; and an empty ring takes any record with
//! room for it (`2 × record + 64 <= ring`: its worst wrap is then a skip shorter than the
//! record), so neither side can wait on the other forever.
//!
//! Steps are whole calls on one thread: this checks the positions, wraps, skips and stamps;
//! the hand-over of a record between threads is the stamp's release store after the record
//! and the consumer's acquire load before it (and the head's, the other way).

use super::*;
use std::collections::VecDeque;

/// A ring of `cap` bytes starting at position `start` (both ends there, memory zeroed) in
/// `map`, which holds at least one such ring.
fn model_ring(map: &Arc<Mapping>, cap: u64, start: u64) -> (Producer, Consumer) {
    let (base, head_off) = ring(map, 0);
    // SAFETY: the ring's bytes lie inside the mapping (DATA_OFF + cap <= len, checked by
    // the caller's allocation) and no other reference to them is alive.
    unsafe { std::ptr::write_bytes(base, 0, cap as usize) };
    map.u64(head_off).store(start, Ordering::Release);
    let g = Geometry::new(cap);
    let p = Producer {
        base,
        ring: g,
        pos: start,
        cached_head: start,
        warmed: start,
        head_off,
        map: map.clone(),
        notify: None,
    };
    let c = Consumer {
        base,
        ring: g,
        pos: start,
        head_off,
        map: map.clone(),
    };
    (p, c)
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Push(usize),
    Pop,
}

const STEPS: [Step; 4] = [Step::Push(0), Step::Push(40), Step::Push(100), Step::Pop];

/// The payload of record `id` pushed at position `pos`: the stamp the same place will carry
/// in the next lap, over and over, then the id. Stale bytes that look like a future record's
/// stamp are what the producer's clearing of the next stamp word protects against: a
/// consumer that trusted them would read a record that was never pushed.
fn pattern(id: u32, pos: u64, g: Geometry, len: usize) -> Vec<u8> {
    let next_lap = g.stamp(pos + g.cap).to_le_bytes();
    let mut b: Vec<u8> = (0..len).map(|i| next_lap[i % 4]).collect();
    if len >= 8 {
        b[len - 4..].copy_from_slice(&id.to_le_bytes());
    }
    b
}

/// Bytes a record of `len` payload bytes takes in the ring.
fn record(len: usize) -> u64 {
    (HDR + len).next_multiple_of(64) as u64
}

/// Runs `steps` on a fresh ring; panics with the sequence on the first violation.
fn run(map: &Arc<Mapping>, cap: u64, start: u64, steps: &[Step]) {
    let (mut p, mut c) = model_ring(map, cap, start);
    let mut expect: VecDeque<(u32, Vec<u8>)> = VecDeque::new();
    let mut next_id = 0u32;
    let ctx = |i: usize| format!("ring {cap} B from {start}, steps {steps:?}, at step {i}");
    for (i, &step) in steps.iter().enumerate() {
        match step {
            Step::Push(len) => {
                let h = PktHeader {
                    kind: kind::REQ,
                    psn: next_id,
                    seg_len: len as u32,
                    ..Default::default()
                };
                let body = pattern(next_id, p.pos, p.ring, len);
                let empty = expect.is_empty();
                let pushed = p.try_push(&h, len, |buf| buf.copy_from_slice(&body));
                if pushed.is_some() {
                    expect.push_back((next_id, body));
                    next_id += 1;
                    let head = p.map.u64(p.head_off).load(Ordering::Acquire);
                    assert!(p.pos - head <= cap, "{}: over-full", ctx(i));
                } else {
                    assert!(
                        !(empty && 2 * record(len) + 64 <= cap),
                        "{}: an empty ring refused a record that fits",
                        ctx(i)
                    );
                }
            }
            Step::Pop => match c.peek() {
                None => assert!(expect.is_empty(), "{}: a record went missing", ctx(i)),
                Some((h, payload)) => {
                    let (id, body) = expect
                        .pop_front()
                        .unwrap_or_else(|| panic!("{}: a record that was never pushed", ctx(i)));
                    assert_eq!((h.psn, h.seg_len as usize), (id, body.len()), "{}", ctx(i));
                    assert!(payload == body, "{}: payload differs", ctx(i));
                    c.pop(&h);
                }
            },
        }
    }
}

/// Every sequence of `depth` steps.
fn sequences(depth: u32) -> impl Iterator<Item = Vec<Step>> {
    let n = STEPS.len() as u64;
    (0..n.pow(depth)).map(move |mut k| {
        (0..depth)
            .map(|_| {
                let s = STEPS[(k % n) as usize];
                k /= n;
                s
            })
            .collect()
    })
}

#[test]
fn every_sequence_of_pushes_and_pops_reads_back_what_was_pushed() {
    const DEPTH: u32 = 8;
    let mut runs = 0u64;
    for cap in [256u64, 512] {
        let map = Arc::new(Mapping::heap(DATA_OFF + cap as usize));
        // From the first lap, from mid-ring, and just before the stamp's lap counter (31 bits)
        // wraps, so that records straddle the wrap.
        let last_lap = (1u64 << 31) - 1;
        for start in [
            0,
            cap / 2,
            (last_lap - 1) * cap + cap / 2,
            last_lap * cap - 64,
        ] {
            for steps in sequences(DEPTH) {
                run(&map, cap, start, &steps);
                runs += 1;
            }
        }
    }
    assert_eq!(runs, 2 * 4 * 4u64.pow(DEPTH));
}

#[test]
fn geometry_offsets_and_stamps() {
    let g = Geometry::new(256);
    assert_eq!(
        (g.off(0), g.off(255), g.off(256), g.off(300)),
        (0, 255, 0, 44)
    );
    assert_eq!(g.stamp(0), 0x8000_0000);
    assert_eq!(g.stamp(256), 0x8000_0001);
    // The lap counter wraps at 2^31 laps; a stamp never reads as 0 (zeroed memory).
    assert_eq!(g.stamp(((1u64 << 31) - 1) * 256), 0xFFFF_FFFF);
    assert_eq!(g.stamp((1u64 << 31) * 256), 0x8000_0000);
    assert_eq!(Geometry::LINK.cap, RING_BYTES as u64);
}
