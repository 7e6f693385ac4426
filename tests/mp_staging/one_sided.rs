//! Staged puts and gets larger than a bounce, without a GPU (a module of
//! tests/mp_staging.rs): byte for byte at 0 and 1 byte, a bounce less one, exactly a bounce,
//! a bounce and one, 5.5 bounces, at odd offsets, all outstanding at once; a put with signal
//! of many chunks whose signal is seen only after every byte landed; the peer leaving or its
//! window going away in the middle of one (or, on a host stream, before it); a later put
//! landing after a staged one's chunks; what an executor refuses. And empty staged messages,
//! which take no bounce and keep their place among chunked ones. CPU and host-stream
//! triggers.

use super::{bytes, on_threads_failing, pattern, region, write, REGION};
use crate::common::on_threads;
use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::{Access, MemoryRegion, PinnedBuffer};
use gdasync::mp::{Comm, Request, Window};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The bounce of these tests: small, so that a few KiB span many.
const B: usize = 1000;

/// Lengths of the puts and gets: none, 1 byte, a bounce less one, exactly a bounce, a bounce
/// and one, 5.5 bounces, two bounces and 3.
const LENS: [usize; 7] = [0, 1, B - 1, B, B + 1, 5 * B + B / 2, 2 * B + 3];

/// (length, offset in the stand-in region, offset in the window) of each case: odd offsets,
/// one after another with untouched bytes between, the window's apart from the region's.
fn cases() -> Vec<(usize, usize, usize)> {
    let mut end = 0;
    LENS.iter()
        .enumerate()
        .map(|(m, &len)| {
            let at = end + 2 * m + 3;
            end = at + len;
            (len, at, at + 11)
        })
        .collect()
}

/// REGION bytes of pinned host memory holding `fill`.
fn filled(fill: &[u8]) -> PinnedBuffer {
    let wbuf = PinnedBuffer::with_cuda(REGION, None);
    wbuf.write_at(0, fill);
    wbuf
}

/// A window over `wbuf` (collective), and its registration.
fn window<'b>(comm: &mut Comm, wbuf: &'b PinnedBuffer) -> (Window, MemoryRegion<'b>) {
    let wmr = comm.pd().register_pinned(wbuf, Access::ALL).unwrap();
    (comm.window(&wmr).unwrap(), wmr)
}

/// Every rank puts (or gets) every case to (from) its right neighbour, all outstanding at
/// once: from the CPU through 2 bounces each way (chunks of later cases wait for earlier
/// ones' bounces), on a host stream with a bounce per chunk. Then every byte and the bytes
/// around each case are checked.
fn one_sided_sizes(comm: &mut Comm, get: bool, on_stream: bool) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let pool = if on_stream { 16 } else { 2 };
    comm.set_staging(B, pool, pool).unwrap();
    let stream = HostStream::new().unwrap();
    let fill = 0xEE;
    let reg = region(comm, fill);
    let mine: Vec<u8> = (0..REGION).map(|i| pattern(me, i)).collect();
    let blank = vec![fill; REGION];
    let wbuf = filled(if get { &mine } else { &blank });
    let (win, _wmr) = window(comm, &wbuf);
    write(&reg, 0, if get { &blank } else { &mine });
    comm.barrier().unwrap();
    let mut reqs = Vec::new();
    for (len, at, wat) in cases() {
        let s = reg.slice(at..at + len);
        let w = wat as u64;
        reqs.push(
            match (get, on_stream) {
                (false, false) => comm.iput_gpu(s, &win, right, w),
                (false, true) => comm.iput_gpu_on(s, &win, right, w, &stream),
                (true, false) => comm.iget_gpu(s, &win, right, w),
                (true, true) => comm.iget_gpu_on(s, &win, right, w, &stream),
            }
            .unwrap(),
        );
    }
    if on_stream && get {
        comm.wait_all_on(&reqs, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    comm.wait_all(&reqs).unwrap();
    comm.barrier().unwrap();
    let got = if get {
        bytes(&reg)
    } else {
        let mut w = vec![0u8; REGION];
        wbuf.read_at(0, &mut w);
        w
    };
    for (m, (len, at, wat)) in cases().into_iter().enumerate() {
        // A put lands at the window's offset with the left neighbour's bytes of the region's
        // offset; a get at the region's with the right neighbour's of the window's.
        let (to, from, who) = if get {
            (at, wat, right)
        } else {
            (wat, at, left)
        };
        for i in 0..len {
            let want = pattern(who, from + i);
            assert_eq!(got[to + i], want, "rank {me}: case {m} ({len} B): byte {i}");
        }
        assert_eq!(got[to - 1], fill, "rank {me}: case {m}: the byte before");
        assert_eq!(got[to + len], fill, "rank {me}: case {m}: the byte after");
    }
    comm.barrier().unwrap();
}

#[test]
fn chunked_staged_puts_land_byte_for_byte_on_the_cpu() {
    on_threads(2, |c| one_sided_sizes(c, false, false));
    on_threads(3, |c| one_sided_sizes(c, false, false));
}

#[test]
fn chunked_staged_puts_land_byte_for_byte_on_a_host_stream() {
    on_threads(2, |c| one_sided_sizes(c, false, true));
}

#[test]
fn chunked_staged_gets_land_byte_for_byte_on_the_cpu() {
    on_threads(2, |c| one_sided_sizes(c, true, false));
    on_threads(3, |c| one_sided_sizes(c, true, false));
}

#[test]
fn chunked_staged_gets_land_byte_for_byte_on_a_host_stream() {
    on_threads(2, |c| one_sided_sizes(c, true, true));
}

/// Rank 0 puts 5.5 bounces with signal into rank 1's window, twice (from the CPU through 2
/// send bounces, or on a host stream), and between them a put of one bounce less one and
/// one of no bytes, each round a new payload and signal value;
/// rank 1 watches the signal word and, the moment it changes, checks every byte of the
/// round's payload: the signal is written after the last chunk, never before.
fn put_signal_after_the_last_chunk(comm: &mut Comm, on_stream: bool) {
    const LEN: usize = 5 * B + B / 2;
    const AT: usize = 24;
    let pool = if on_stream { 6 } else { 2 };
    comm.set_staging(B, pool, pool).unwrap();
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let wbuf = filled(&[0; REGION]);
    let (win, _wmr) = window(comm, &wbuf);
    let sig = PinnedBuffer::with_cuda(8, None);
    let smr = comm.pd().register_pinned(&sig, Access::ALL).unwrap();
    comm.barrier().unwrap();
    for round in 1..=4u64 {
        let m = round as usize;
        // Rounds 2 and 4 fit one bounce (and post the signal with it) or have no bytes.
        let len = [LEN, B - 1, LEN, 0][m - 1];
        if comm.rank() == 0 {
            write(
                &reg,
                3,
                &(0..len).map(|i| pattern(m, i)).collect::<Vec<_>>(),
            );
            sig.write_at(0, &round.to_ne_bytes());
            let s = reg.slice(3..3 + len);
            let r = match on_stream {
                true => comm.iput_signal_gpu_on(s, &win, 1, AT as u64, smr.sge(..), 0, &stream),
                false => comm.iput_signal_gpu(s, &win, 1, AT as u64, smr.sge(..), 0),
            }
            .unwrap();
            // From the CPU, the chunks after the first two wait for this wait: a signal
            // written early would be seen long before them.
            std::thread::sleep(Duration::from_millis(20));
            stream.synchronize().unwrap();
            comm.wait(r).unwrap();
        } else {
            // SAFETY: the window's first 8 bytes, 8-byte aligned in its live pinned buffer.
            let word = unsafe { &*(wbuf.addr() as *const AtomicU64) };
            let until = Instant::now() + Duration::from_secs(10);
            while word.load(Ordering::Acquire) != round {
                assert!(Instant::now() < until, "round {round}: no signal");
                std::hint::spin_loop();
            }
            let mut got = vec![0u8; len];
            wbuf.read_at(AT, &mut got);
            for (i, &b) in got.iter().enumerate() {
                assert_eq!(b, pattern(m, i), "round {round}: byte {i} after the signal");
            }
        }
        comm.barrier().unwrap();
    }
}

#[test]
fn a_chunked_put_with_signal_signals_after_every_byte_on_the_cpu() {
    on_threads(2, |c| put_signal_after_the_last_chunk(c, false));
}

#[test]
fn a_chunked_put_with_signal_signals_after_every_byte_on_a_host_stream() {
    on_threads(2, |c| put_signal_after_the_last_chunk(c, true));
}

/// What breaks in the middle of a chunked put or get.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Break {
    /// Rank 1 leaves the job.
    Leave,
    /// Rank 1 deregisters its window: the next chunk's write or read fails at its NIC.
    Deregister,
}

/// The steps of each fault test (the midway ones by `get` and `Break`, then the host
/// stream's by `get`), shared by its two rank threads (tests run at once in one process).
static STEPS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

/// Rank 0 puts (or gets) 5.5 bounces to (from) rank 1's window from the CPU through 2
/// bounces; once the first two chunks are through (rank 1 sees them land; a get is given
/// time), rank 1 breaks (`brk`; leaving is given time) and rank 0 waits: its wait is released within 2 s by an
/// error that names the cause, and the first two chunks are in place.
fn one_sided_fault_midway(comm: &mut Comm, get: bool, brk: Break) {
    const LEN: usize = 5 * B + B / 2;
    comm.set_timeout(Duration::from_secs(10));
    comm.set_staging(B, 2, 2).unwrap();
    let reg = region(comm, 0xEE);
    let mine: Vec<u8> = (0..REGION).map(|i| pattern(9, i)).collect();
    let wbuf = filled(if comm.rank() == 1 && get {
        &mine
    } else {
        &[0; REGION]
    });
    let (win, wmr) = window(comm, &wbuf);
    comm.barrier().unwrap();
    let at = &STEPS[2 * get as usize + (brk == Break::Deregister) as usize];
    let step = |s: usize| {
        let until = Instant::now() + Duration::from_secs(10);
        while at.load(Ordering::Acquire) < s {
            assert!(Instant::now() < until, "step {s} never came");
            std::thread::yield_now();
        }
    };
    if comm.rank() == 1 {
        if !get {
            // The first two chunks land (rank 0 posts no more until it waits).
            let until = Instant::now() + Duration::from_secs(10);
            let mut got = vec![0u8; 2 * B];
            while got != mine[..2 * B] {
                assert!(Instant::now() < until, "the first two chunks never landed");
                wbuf.read_at(1, &mut got);
            }
        }
        step(1);
        match brk {
            Break::Leave => return,
            Break::Deregister => drop(wmr),
        }
        at.store(2, Ordering::Release);
        // Stay in the job until rank 0 has its error (its cause is the window, not a
        // departure).
        step(3);
        return;
    }
    if get {
        write(&reg, 0, &[0xEE; REGION]);
    } else {
        write(&reg, 1, &mine[..LEN]);
    }
    let s = reg.slice(1..1 + LEN);
    let r = match get {
        true => comm.iget_gpu(s, &win, 1, 1),
        false => comm.iput_gpu(s, &win, 1, 1),
    }
    .unwrap();
    // The first two chunks' reads are done long before (the NIC needs no call of ours).
    std::thread::sleep(Duration::from_millis(200));
    at.store(1, Ordering::Release);
    match brk {
        // Its communicator is dropped as its thread returns: time enough for that.
        Break::Leave => std::thread::sleep(Duration::from_millis(300)),
        Break::Deregister => step(2),
    }
    let start = Instant::now();
    let e = comm.wait(r).unwrap_err();
    at.store(3, Ordering::Release);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the wait took {:?}",
        start.elapsed()
    );
    println!("rank 0: {e}");
    // A departure is seen by the bootstrap or, first, by the NIC's retries.
    let causes: &[&str] = match brk {
        Break::Leave => &["rank 1 left the job", "rank 1 stopped answering"],
        Break::Deregister => &["IBV_WC_REM_ACCESS_ERR"],
    };
    let e = e.to_string();
    assert!(causes.iter().any(|c| e.contains(c)), "{e}");
    if get {
        let got = bytes(&reg);
        for i in 0..2 * B {
            assert_eq!(
                got[1 + i],
                pattern(9, 1 + i),
                "the first two chunks: byte {i}"
            );
        }
    }
}

#[test]
fn a_chunked_staged_put_is_released_when_the_peer_leaves_midway() {
    on_threads_failing(|c| one_sided_fault_midway(c, false, Break::Leave));
}

#[test]
fn a_chunked_staged_put_is_released_by_an_error_completion_midway() {
    on_threads_failing(|c| one_sided_fault_midway(c, false, Break::Deregister));
}

#[test]
fn a_chunked_staged_get_is_released_when_the_peer_leaves_midway() {
    on_threads_failing(|c| one_sided_fault_midway(c, true, Break::Leave));
}

#[test]
fn a_chunked_staged_get_is_released_by_an_error_completion_midway() {
    on_threads_failing(|c| one_sided_fault_midway(c, true, Break::Deregister));
}

/// On an executor a put with signal larger than its side of the pool is refused with what
/// to do, and goes from the CPU.
#[test]
fn a_chunked_put_with_signal_beyond_the_pool_is_refused_on_an_executor() {
    on_threads(2, |comm| {
        const LEN: usize = 5 * B + B / 2;
        let peer = 1 - comm.rank();
        comm.set_staging(B, 4, 4).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0);
        let wbuf = filled(&[0; REGION]);
        let (win, _wmr) = window(comm, &wbuf);
        let sig = PinnedBuffer::with_cuda(8, None);
        let smr = comm.pd().register_pinned(&sig, Access::ALL).unwrap();
        let s = reg.slice(..LEN);
        let e = comm
            .iput_signal_gpu_on(s, &win, peer, 8, smr.sge(..), 0, &stream)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("put with signal of 5500 bytes on an executor needs 6 bounces")
                && e.contains("iput_signal_gpu"),
            "{e}"
        );
        let r = comm
            .iput_signal_gpu(s, &win, peer, 8, smr.sge(..), 0)
            .unwrap();
        comm.wait(r).unwrap();
        comm.barrier().unwrap();
    });
}

/// Both ranks post their receives first, then their sends: 5.5 bounces, nothing, a bounce
/// and one, nothing twice, 3 bytes, through 2 bounces each way, from the CPU. The empty
/// messages keep their place among the chunked ones (receives match sends in order) and
/// never wait for a bounce or for the chunks ahead of them: everything arrives, each with
/// its length.
#[test]
fn empty_staged_messages_keep_their_place_among_chunked_ones() {
    on_threads(2, |comm| {
        const MSGS: [usize; 6] = [5 * B + B / 2, 0, B + 1, 0, 0, 3];
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        comm.set_timeout(Duration::from_secs(5));
        comm.set_staging(B, 2, 2).unwrap();
        let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
        let at = |m: usize| m * (6 * B) + 1;
        let mut reqs = Vec::new();
        for (m, &len) in MSGS.iter().enumerate() {
            reqs.push(
                comm.irecv_gpu(rreg.slice(at(m)..at(m) + len), peer)
                    .unwrap(),
            );
        }
        for (m, &len) in MSGS.iter().enumerate() {
            let p: Vec<u8> = (0..len).map(|i| pattern(me * 10 + m, i)).collect();
            write(&sreg, at(m), &p);
            reqs.push(
                comm.isend_gpu(sreg.slice(at(m)..at(m) + len), peer)
                    .unwrap(),
            );
        }
        let n = comm.wait_all(&reqs).unwrap();
        let want: Vec<u32> = MSGS.iter().map(|&l| l as u32).collect();
        assert_eq!(n[..MSGS.len()], want[..], "bytes received");
        let got = bytes(&rreg);
        for (m, &len) in MSGS.iter().enumerate() {
            for i in 0..len {
                assert_eq!(
                    got[at(m) + i],
                    pattern(peer * 10 + m, i),
                    "message {m}: byte {i}"
                );
            }
            assert_eq!(got[at(m) + len], 0xEE, "message {m}: the byte after");
        }
        comm.barrier().unwrap();
    });
}

/// Empty staged receives and sends hold no bounce: with 2 bounces each way, two empty
/// receives outstanding, then a receive of 2 bounces on a host stream (which needs both
/// receive bounces at once, and would wait out the timeout for one held); on the other
/// rank two empty sends on a host stream, then 2 bounces from the CPU. All complete.
#[test]
fn empty_staged_messages_hold_no_bounce() {
    on_threads(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        comm.set_timeout(Duration::from_secs(1));
        comm.set_staging(B, 2, 2).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0xEE);
        let empty = reg.slice(5..5);
        let mut reqs: Vec<Request> = Vec::new();
        if me == 1 {
            reqs.push(comm.irecv_gpu(empty, peer).unwrap());
            reqs.push(comm.irecv_gpu(empty, peer).unwrap());
            let big = comm
                .irecv_gpu_on(reg.slice(1..1 + 2 * B), peer, &stream)
                .unwrap();
            comm.wait_on(big, &stream).unwrap();
            reqs.push(big);
        } else {
            write(
                &reg,
                1,
                &(0..2 * B).map(|i| pattern(4, i)).collect::<Vec<_>>(),
            );
            reqs.push(comm.isend_gpu_on(empty, peer, &stream).unwrap());
            reqs.push(comm.isend_gpu_on(empty, peer, &stream).unwrap());
            stream.synchronize().unwrap();
            reqs.push(comm.isend_gpu(reg.slice(1..1 + 2 * B), peer).unwrap());
        }
        stream.synchronize().unwrap();
        let n = comm.wait_all(&reqs).unwrap();
        if me == 1 {
            assert_eq!(n[..2], [0, 0]);
            let got = bytes(&reg);
            for i in 0..2 * B {
                assert_eq!(got[1 + i], pattern(4, i), "byte {i}");
            }
        }
        comm.barrier().unwrap();
    });
}

/// Work on one connection keeps the order of the calls: rank 0 puts 5.5 bounces from staged
/// memory through 2 send bounces (from the CPU, or on a host stream), then at once puts 16
/// bytes of registered host memory over the last chunk's place. The later put lands last:
/// the window holds its bytes there, and the staged bytes everywhere else.
fn a_later_put_lands_after_the_chunks(comm: &mut Comm, on_stream: bool) {
    const LEN: usize = 5 * B + B / 2;
    const OVER: usize = 5 * B + 7;
    let pool = if on_stream { 6 } else { 2 };
    comm.set_staging(B, pool, pool).unwrap();
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let wbuf = filled(&[0; REGION]);
    let (win, _wmr) = window(comm, &wbuf);
    let mut small = [0x5Au8; 16];
    let smr = comm.register(&mut small).unwrap();
    comm.barrier().unwrap();
    if comm.rank() == 0 {
        write(
            &reg,
            0,
            &(0..LEN).map(|i| pattern(2, i)).collect::<Vec<_>>(),
        );
        let s = reg.slice(..LEN);
        let (big, little) = match on_stream {
            true => (
                comm.iput_gpu_on(s, &win, 1, 0, &stream).unwrap(),
                comm.iput_on(smr.sge(..), &win, 1, OVER as u64, &stream)
                    .unwrap(),
            ),
            false => (
                comm.iput_gpu(s, &win, 1, 0).unwrap(),
                comm.iput(smr.sge(..), &win, 1, OVER as u64).unwrap(),
            ),
        };
        stream.synchronize().unwrap();
        comm.wait_all(&[big, little]).unwrap();
    }
    comm.barrier().unwrap();
    if comm.rank() == 1 {
        let mut got = vec![0u8; LEN];
        wbuf.read_at(0, &mut got);
        for (i, &b) in got.iter().enumerate() {
            let want = match (OVER..OVER + 16).contains(&i) {
                true => 0x5A,
                false => pattern(2, i),
            };
            assert_eq!(b, want, "byte {i}");
        }
    }
    comm.barrier().unwrap();
}

#[test]
fn a_later_put_lands_after_the_chunks_of_a_staged_one_on_the_cpu() {
    on_threads(2, |c| a_later_put_lands_after_the_chunks(c, false));
}

#[test]
fn a_later_put_lands_after_the_chunks_of_a_staged_one_on_a_host_stream() {
    on_threads(2, |c| a_later_put_lands_after_the_chunks(c, true));
}

/// On a host stream (every chunk posted at once, each in its own bounce), rank 1's window is
/// deregistered before rank 0 puts (or gets, waiting on the stream) 5.5 bounces into (from)
/// it: the first chunk fails at rank 1's NIC and the rest are flushed, the stream passes
/// every chunk's wait, and rank 0's wait ends within 2 s with the cause.
fn one_sided_error_on_a_host_stream(comm: &mut Comm, get: bool) {
    const LEN: usize = 5 * B + B / 2;
    comm.set_timeout(Duration::from_secs(10));
    comm.set_staging(B, 6, 6).unwrap();
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let wbuf = filled(&[0; REGION]);
    let (win, wmr) = window(comm, &wbuf);
    let at = &STEPS[4 + get as usize];
    drop(wmr);
    if comm.rank() == 1 {
        comm.barrier().unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while at.load(Ordering::Acquire) < 1 {
            assert!(Instant::now() < until, "rank 0 never finished");
            std::thread::yield_now();
        }
        return;
    }
    comm.barrier().unwrap();
    let start = Instant::now();
    let s = reg.slice(1..1 + LEN);
    let r = match get {
        true => comm.iget_gpu_on(s, &win, 1, 1, &stream).unwrap(),
        false => comm.iput_gpu_on(s, &win, 1, 1, &stream).unwrap(),
    };
    if get {
        comm.wait_on(r, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    let e = comm.wait(r).unwrap_err().to_string();
    at.store(1, Ordering::Release);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    println!("rank 0: {e}");
    assert!(e.contains("IBV_WC_REM_ACCESS_ERR"), "{e}");
}

#[test]
fn a_chunked_staged_put_on_a_host_stream_is_released_by_an_error_completion() {
    on_threads_failing(|c| one_sided_error_on_a_host_stream(c, false));
}

#[test]
fn a_chunked_staged_get_on_a_host_stream_is_released_by_an_error_completion() {
    on_threads_failing(|c| one_sided_error_on_a_host_stream(c, true));
}
