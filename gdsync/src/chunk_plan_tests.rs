//! Tests of [`super::ChunkPlan`]: sizes around the chunk size, many chunks, and a copy through
//! a bounce ring at odd offsets that must reproduce the message byte for byte.

use super::*;

const C: usize = 256 * 1024;

fn lens(plan: &ChunkPlan) -> Vec<usize> {
    plan.chunks().map(|c| c.len).collect()
}

#[test]
fn sizes_around_the_chunk() {
    let plan = |len| ChunkPlan::new(len, C, 2).unwrap();
    assert_eq!(plan(0).count(), 0);
    assert_eq!(lens(&plan(1)), vec![1]);
    assert_eq!(lens(&plan(C - 1)), vec![C - 1]);
    assert_eq!(lens(&plan(C)), vec![C]);
    assert_eq!(lens(&plan(C + 1)), vec![C, 1]);
    assert_eq!(lens(&plan(C * 11 / 2)), vec![C, C, C, C, C, C / 2]);
    assert_eq!(plan(1).bounce_len(), 1);
    assert_eq!(plan(C + 1).bounce_len(), C);
}

#[test]
fn chunks_tile_the_message_and_rotate_bounces() {
    let plan = ChunkPlan::new(C * 11 / 2, C, 4).unwrap();
    let mut next = 0;
    for (i, c) in plan.chunks().enumerate() {
        assert_eq!((c.index, c.offset, c.bounce), (i, next, i % 4));
        next += c.len;
    }
    assert_eq!(next, C * 11 / 2);
    assert_eq!(plan.get(6), None);
    assert_eq!(plan.must_be_credited(3), None);
    assert_eq!(plan.must_be_credited(4), Some(0));
    assert_eq!(plan.must_be_credited(5), Some(1));
}

#[test]
fn a_later_message_continues_the_rotation_and_the_credits() {
    // The first message had 3 chunks over 2 bounces: the next starts on bounce 1, and its
    // first chunk reuses the bounce of chunk 1 of the stream.
    let plan = ChunkPlan::new(C + 1, C, 2).unwrap().starting_at(3);
    let got: Vec<(usize, usize, usize)> =
        plan.chunks().map(|c| (c.index, c.seq, c.bounce)).collect();
    assert_eq!(got, vec![(0, 3, 1), (1, 4, 0)]);
    assert_eq!(plan.must_be_credited(0), Some(1));
    assert_eq!(plan.must_be_credited(1), Some(2));
    assert_eq!(
        ChunkPlan::new(1, C, 4)
            .unwrap()
            .starting_at(2)
            .must_be_credited(0),
        None
    );
}

#[test]
fn zero_chunk_or_bounces_is_refused() {
    assert_eq!(ChunkPlan::new(10, 0, 2), None);
    assert_eq!(ChunkPlan::new(10, 4, 0), None);
}

#[test]
fn staged_copy_at_odd_offsets_is_exact() {
    for (len, chunk, bounces, src_off, dst_off) in [
        (1, 7, 2, 3, 5),
        (6, 7, 2, 1, 0),
        (7, 7, 3, 0, 3),
        (8, 7, 2, 5, 1),
        (39, 7, 2, 3, 7),
    ] {
        let src: Vec<u8> = (0..len + src_off).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; len + dst_off];
        let plan = ChunkPlan::new(len, chunk, bounces).unwrap();
        let mut ring = vec![vec![0u8; plan.bounce_len()]; bounces];
        for c in plan.chunks() {
            let s = src_off + c.offset;
            ring[c.bounce][..c.len].copy_from_slice(&src[s..s + c.len]);
            let d = dst_off + c.offset;
            dst[d..d + c.len].copy_from_slice(&ring[c.bounce][..c.len]);
        }
        assert_eq!(&dst[dst_off..], &src[src_off..], "len {len} chunk {chunk}");
    }
}
