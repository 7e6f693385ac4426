//! Tests of staging: payloads byte for byte through bounce slots at odd sizes and offsets
//! and across chunk boundaries, on both host executors, and an error completion in the
//! middle of a staged transfer.

use super::{Chunk, Staging};
use crate::exec::{Executor, HostExecutor, HostStream};
use crate::ops::{Op, Ops, WaitCond};
use crate::{Error, PinnedBuffer};
use std::time::{Duration, Instant};

/// The op list that moves chunk `c` of `src` to `dst` as a staged send and receive do: copy
/// into the sender's slot, the wire (the NIC moving the slot to the receiver's slot), copy
/// out of the receiver's slot.
fn staged_chunk(tx: &Staging, rx: &Staging, c: Chunk, src: u64, dst: u64) -> Ops {
    // SAFETY: src and dst point into buffers the tests keep alive until the lists have run.
    let mut ops = unsafe { tx.copy_out(c.slot, src + c.offset as u64, c.len) };
    let wire = Op::Copy {
        dst: rx.slot_addr(c.slot),
        src: tx.slot_addr(c.slot),
        len: c.len as u64,
    };
    // SAFETY: both slots lie in bounce buffers that outlive the test's executors.
    unsafe { ops.push_raw(wire) };
    // SAFETY: as above.
    ops.append(unsafe { rx.copy_in(c.slot, dst + c.offset as u64, c.len) });
    ops
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 7) as u8).collect()
}

/// Stages `len` bytes at byte `off` of a source to byte `off` of a destination through
/// 256-byte slots on `exec`; checks every byte, and that nothing around the range changed.
fn round_trip(exec: &impl Executor, len: usize, off: usize, sync: impl Fn()) {
    let (tx, rx) = (Staging::new(256, None), Staging::new(256, None));
    let src = pattern(len + 2 * off + 8);
    let mut dst = vec![0xeeu8; src.len()];
    let (s, d) = (
        src.as_ptr() as u64 + off as u64,
        dst.as_mut_ptr() as u64 + off as u64,
    );
    for c in tx.chunks(len) {
        exec.submit(staged_chunk(&tx, &rx, c, s, d)).unwrap();
    }
    sync();
    assert_eq!(
        &dst[off..off + len],
        &src[off..off + len],
        "{len} bytes at {off}"
    );
    assert!(
        dst[..off].iter().all(|&b| b == 0xee),
        "before, {len} at {off}"
    );
    assert!(
        dst[off + len..].iter().all(|&b| b == 0xee),
        "after, {len} at {off}"
    );
}

const SIZES: [usize; 8] = [0, 1, 7, 255, 256, 257, 511, 1031];

#[test]
fn staging_moves_odd_sizes_and_offsets_byte_for_byte_on_the_host_executor() {
    for len in SIZES {
        for off in [0, 1, 3, 13] {
            round_trip(&HostExecutor::default(), len, off, || {});
        }
    }
}

#[test]
fn staging_moves_odd_sizes_and_offsets_byte_for_byte_on_a_host_stream() {
    let stream = HostStream::new().unwrap();
    for len in SIZES {
        for off in [0, 5] {
            round_trip(&stream, len, off, || stream.synchronize().unwrap());
        }
    }
}

#[test]
fn chunks_alternate_slots_and_cover_the_message() {
    let st = Staging::new(100, None);
    let c: Vec<Chunk> = st.chunks(250).collect();
    assert_eq!(c.len(), 3);
    assert_eq!((c[0].offset, c[0].len, c[0].slot), (0, 100, 0));
    assert_eq!((c[1].offset, c[1].len, c[1].slot), (100, 100, 1));
    assert_eq!((c[2].offset, c[2].len, c[2].slot), (200, 50, 0));
    assert_eq!(st.chunks(0).count(), 0);
    assert_eq!(st.slot_addr(1) - st.slot_addr(0), 100);
}

/// A staged receive waits for its completion, then copies in: when the completion queue
/// reports an error in the middle of the transfer, the wait is released at once with the
/// error (no timeout), and the copy after it does not run.
#[test]
fn an_error_completion_mid_transfer_releases_the_wait_and_is_reported() {
    let (tx, rx) = (Staging::new(64, None), Staging::new(64, None));
    let src = pattern(128);
    let mut dst = vec![0u8; 128];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    let cq = PinnedBuffer::new(64);
    let stream = HostStream::new().unwrap();
    let chunks: Vec<Chunk> = tx.chunks(128).collect();
    stream.enqueue(staged_chunk(&tx, &rx, chunks[0], s, d));
    crate::failed_rings::cq_failed(cq.addr(), 64, 77);
    let mut second = cq.wait32(0, 1, WaitCond::Geq);
    second.append(staged_chunk(&tx, &rx, chunks[1], s, d));
    let start = Instant::now();
    stream.enqueue(second);
    let err = stream.synchronize().unwrap_err();
    crate::failed_rings::forget(cq.addr());
    assert!(matches!(err, Error::CqOverrun { cqn: 77 }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(&dst[..64], &src[..64], "the chunk before the error arrived");
    assert!(dst[64..].iter().all(|&b| b == 0), "nothing after the error");
}

#[test]
#[should_panic(expected = "do not fit a staging slot")]
fn a_copy_larger_than_a_slot_is_refused() {
    let st = Staging::new(16, None);
    let buf = [0u8; 32];
    // SAFETY: the list is never run.
    let _ = unsafe { st.copy_out(0, buf.as_ptr() as u64, 32) };
}

/// A CUDA stream runs a list with copies as runs of memory operations with the copies between
/// them: the cut keeps the order, and every run keeps all the list's memory alive (a copy's
/// memory must outlive the run after it).
#[test]
fn a_list_is_cut_at_its_copies_in_order_with_its_memory_kept() {
    let st = Staging::new(64, None);
    let flag = PinnedBuffer::new(64);
    let src = [0u8; 8];
    let mut ops = flag.wait32(0, 1, WaitCond::Geq);
    // SAFETY: the list is never run.
    ops.append(unsafe { st.copy_out(1, src.as_ptr() as u64, 8) });
    ops.append(flag.write32(4, 2));
    ops.append(flag.write32(8, 3));
    // SAFETY: as above.
    ops.append(unsafe { st.copy_in(0, src.as_ptr() as u64, 8) });
    let parts = ops.split_at_copies();
    let shape: Vec<String> = parts
        .iter()
        .map(|p| match p {
            Ok(run) => format!("run of {}", run.len()),
            Err(op) => format!(
                "copy of {}",
                if let Op::Copy { len, .. } = op {
                    *len
                } else {
                    0
                }
            ),
        })
        .collect();
    assert_eq!(shape, ["run of 1", "copy of 8", "run of 2", "copy of 8"]);
    for run in parts.iter().filter_map(|p| p.as_ref().ok()) {
        assert_eq!(
            run.kept().len(),
            ops.kept().len(),
            "every run keeps the list's memory"
        );
    }
    assert_eq!(
        ops.kept().len(),
        2,
        "the flag's buffer and the bounce buffer"
    );
    let plain = flag.write32(0, 1).split_at_copies();
    assert!(matches!(plain.as_slice(), [Ok(r)] if r.len() == 1));
}
