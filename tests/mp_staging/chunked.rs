//! Staged messages larger than a bounce, without a GPU (a module of tests/mp_staging.rs):
//! bounce-sized chunks byte for byte at 1 byte, a bounce less one, exactly a bounce, a bounce
//! and one, 5.5 bounces, at odd offsets; many messages outstanding both ways through a pool
//! far smaller than them (bounces reused only once copied out); the peer leaving in the
//! middle of one; ranks whose bounces differ; what is refused; and staged gets at odd sizes
//! and offsets. CPU and host-stream triggers.

use super::{bytes, on_threads_failing, pattern, region, write, REGION};
use crate::common::on_threads;
use gdasync::gdsync::exec::{Executor, HostStream};
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::{Access, PinnedBuffer, SignalWords};
use gdasync::mp::{Comm, GpuRegion, Request};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The bounce of these tests: small, so that messages of a few KiB span many.
const B: usize = 1000;

/// (size, offset): 1 byte, a bounce less one, exactly a bounce, a bounce and one, 5.5
/// bounces, two bounces and 3.
const SIZES: [(usize, usize); 6] = [
    (1, 3),
    (B - 1, 1),
    (B, 7),
    (B + 1, 0),
    (5 * B + B / 2, 13),
    (2 * B + 3, 5),
];

fn payload(m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(m, i)).collect()
}

/// Checks message `m` (`len` bytes at `at` of `reg`) byte for byte, and the bytes around it
/// (`fill`).
fn check(reg: &GpuRegion, at: usize, len: usize, m: usize, fill: u8) {
    let got = bytes(reg);
    for i in 0..len {
        assert_eq!(
            got[at + i],
            pattern(m, i),
            "message {m} ({len} B at {at}): byte {i}"
        );
    }
    if at > 0 {
        assert_eq!(
            got[at - 1],
            fill,
            "message {m}: the byte before was written"
        );
    }
    assert_eq!(
        got[at + len],
        fill,
        "message {m}: the byte after was written"
    );
}

/// A staged send (rank 0) or receive (rank 1) of `len` bytes at `at`, from the CPU or on
/// `stream` (a receive then waited for on it).
fn post(
    comm: &mut Comm,
    reg: &GpuRegion,
    at: usize,
    len: usize,
    stream: Option<&HostStream>,
) -> Request {
    let peer = 1 - comm.rank();
    let s = reg.slice(at..at + len);
    let r = match (comm.rank(), stream) {
        (0, None) => comm.isend_gpu(s, peer),
        (0, Some(e)) => comm.isend_gpu_on(s, peer, e),
        (_, None) => comm.irecv_gpu(s, peer),
        (_, Some(e)) => comm.irecv_gpu_on(s, peer, e),
    }
    .unwrap();
    if let (1, Some(e)) = (comm.rank(), stream) {
        comm.wait_on(r, e).unwrap();
    }
    r
}

/// SIZES one after another, rank 0 to rank 1. From the CPU through 2 bounces each way (a
/// 5.5-bounce message reuses each three times); on a host stream every chunk has its own.
fn sizes(comm: &mut Comm, on_stream: bool) {
    let stream = HostStream::new().unwrap();
    let e = on_stream.then_some(&stream);
    let n = if on_stream { 6 } else { 2 };
    comm.set_staging(B, n, n).unwrap();
    let fill = 0xEE;
    let reg = region(comm, fill);
    for (m, &(len, at)) in SIZES.iter().enumerate() {
        if comm.rank() == 0 {
            write(&reg, at, &payload(m, len));
        }
        let r = post(comm, &reg, at, len, e);
        stream.synchronize().unwrap();
        let got = comm.wait(r).unwrap() as usize;
        if comm.rank() == 1 {
            // An executor's wait for one bounce learns no byte count.
            if !on_stream || len > B {
                assert_eq!(got, len, "message {m}: bytes received");
            }
            check(&reg, at, len, m, fill);
            write(&reg, at, &vec![fill; len]);
        }
    }
    comm.barrier().unwrap();
}

#[test]
fn chunked_staged_messages_byte_for_byte_on_the_cpu() {
    on_threads(2, |c| sizes(c, false));
}

#[test]
fn chunked_staged_messages_byte_for_byte_on_a_host_stream() {
    on_threads(2, |c| sizes(c, true));
}

/// Both ranks send each other N messages of 5.5 bounces, every one outstanding at once
/// (receive m, send m, ...), then wait for all. From the CPU through 2 bounces each way:
/// chunks of later messages wait for earlier ones' bounces, and receives match sends in
/// order. On a host stream every chunk has its own bounce.
fn many_outstanding(comm: &mut Comm, on_stream: bool) {
    const N: usize = 5;
    const LEN: usize = 5 * B + B / 2;
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let stream = HostStream::new().unwrap();
    let pool = if on_stream { 6 * N } else { 2 };
    comm.set_staging(B, pool, pool).unwrap();
    let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
    let at = |m: usize| m * (LEN + 7) + 3;
    let (mut recvs, mut sends) = (Vec::new(), Vec::new());
    for m in 0..N {
        write(&sreg, at(m), &payload(me * N + m, LEN));
        let (r, s) = (
            rreg.slice(at(m)..at(m) + LEN),
            sreg.slice(at(m)..at(m) + LEN),
        );
        if on_stream {
            recvs.push(comm.irecv_gpu_on(r, peer, &stream).unwrap());
            sends.push(comm.isend_gpu_on(s, peer, &stream).unwrap());
        } else {
            recvs.push(comm.irecv_gpu(r, peer).unwrap());
            sends.push(comm.isend_gpu(s, peer).unwrap());
        }
    }
    if on_stream {
        comm.wait_all_on(&recvs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    assert_eq!(comm.wait_all(&sends).unwrap(), vec![0; N]);
    assert_eq!(comm.wait_all(&recvs).unwrap(), vec![LEN as u32; N]);
    for m in 0..N {
        check(&rreg, at(m), LEN, peer * N + m, 0xEE);
    }
    comm.barrier().unwrap();
}

/// From the CPU, more staged messages of a bounce or less outstanding than the pool has
/// bounces (every receive posted before any send, as halo exchanges post them): those that
/// find no free bounce queue and are posted as bounces free, instead of blocking a receive
/// that only this rank's later sends could free. Each lands byte for byte, in order.
#[test]
fn small_staged_messages_beyond_the_pool_queue_on_the_cpu() {
    on_threads(2, |comm| {
        const LENS: [usize; 6] = [1, 100, B, 7, B - 1, 3];
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        comm.set_staging(B, 2, 2).unwrap();
        let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
        let at = |m: usize| m * (B + 9) + 5;
        for (m, &len) in LENS.iter().enumerate() {
            write(&sreg, at(m), &payload(me * 10 + m, len));
        }
        let recvs: Vec<Request> = (0..LENS.len())
            .map(|m| comm.irecv_gpu(rreg.slice(at(m)..at(m) + LENS[m]), peer))
            .collect::<Result<_, _>>()
            .unwrap();
        let sends: Vec<Request> = (0..LENS.len())
            .map(|m| comm.isend_gpu(sreg.slice(at(m)..at(m) + LENS[m]), peer))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(comm.wait_all(&sends).unwrap(), vec![0; LENS.len()]);
        let got = comm.wait_all(&recvs).unwrap();
        assert_eq!(got, LENS.iter().map(|&l| l as u32).collect::<Vec<_>>());
        for (m, &len) in LENS.iter().enumerate() {
            check(&rreg, at(m), len, peer * 10 + m, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

#[test]
fn chunked_staged_messages_outstanding_both_ways_on_the_cpu() {
    on_threads(2, |c| many_outstanding(c, false));
}

#[test]
fn chunked_staged_messages_outstanding_both_ways_on_a_host_stream() {
    on_threads(2, |c| many_outstanding(c, true));
}

/// From the CPU, a message after a chunked one with the same peer does not overtake the
/// chunks still waiting for a bounce (receives match sends in order): rank 0 sends 5.5
/// bounces through 2 send bounces and then 64 bytes of host memory; rank 1 receives them in
/// the same order through 2 receive bounces. Both arrive whole.
#[test]
fn a_later_message_does_not_overtake_the_chunks_of_an_earlier_one() {
    on_threads(2, |comm| {
        const LEN: usize = 5 * B + B / 2;
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        comm.set_staging(B, 2, 2).unwrap();
        let reg = region(comm, 0);
        let mut small = payload(7, 64);
        if me == 0 {
            write(&reg, 5, &payload(6, LEN));
        } else {
            small.fill(0);
        }
        let mr = comm.register(&mut small).unwrap();
        if me == 0 {
            let big = comm.isend_gpu(reg.slice(5..5 + LEN), peer).unwrap();
            // The first chunks go (the receiver has posted the small receive after them)
            // before the small send is posted: the chunks must still go first.
            let until = Instant::now() + Duration::from_millis(100);
            let mut done = None;
            while done.is_none() && Instant::now() < until {
                done = comm.test(big).unwrap();
            }
            let little = comm.isend(mr.sge(..), peer).unwrap();
            if done.is_none() {
                comm.wait(big).unwrap();
            }
            comm.wait(little).unwrap();
        } else {
            let big = comm.irecv_gpu(reg.slice(5..5 + LEN), peer).unwrap();
            let little = comm.irecv(mr.sge(..), peer).unwrap();
            let n = comm.wait_all(&[big, little]).unwrap();
            assert_eq!(n, vec![LEN as u32, 64]);
        }
        drop(mr);
        if me == 1 {
            check(&reg, 5, LEN, 6, 0);
            assert_eq!(small, payload(7, 64), "the small message");
        }
        comm.barrier().unwrap();
    });
}

/// A chunked receive posted from the CPU whose chunks all have bounces, waited for on a
/// host stream (`wait_on`, as pingpong and stencil2d wait for receives): every chunk lands,
/// copied by the CPU as it came or by the stream after its wait.
#[test]
fn a_chunked_receive_from_the_cpu_can_be_waited_for_on_a_host_stream() {
    on_threads(2, |comm| {
        const LEN: usize = 5 * B + B / 2;
        let peer = 1 - comm.rank();
        comm.set_staging(B, 6, 6).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0xEE);
        if comm.rank() == 0 {
            write(&reg, 3, &payload(5, LEN));
            let r = comm.isend_gpu(reg.slice(3..3 + LEN), peer).unwrap();
            comm.wait(r).unwrap();
        } else {
            let r = comm.irecv_gpu(reg.slice(3..3 + LEN), peer).unwrap();
            comm.wait_on(r, &stream).unwrap();
            stream.synchronize().unwrap();
            assert_eq!(comm.wait(r).unwrap(), LEN as u32);
            check(&reg, 3, LEN, 5, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

/// A staged receive posted from the CPU and waited for on an executor lands in the
/// executor's order, even where the CPU's progress saw its completion first: the receiver's
/// stream is held (reading the buffer, say) by a wait on a flag when the message arrives and
/// the CPU makes progress; the buffer stays untouched until the flag is set and the stream
/// runs the copy in. (The CPU used to copy in at its first progress after the completion:
/// behind the stream's back, and a synchronous copy of several microseconds.)
#[test]
fn a_staged_receive_waited_for_on_a_stream_lands_in_the_streams_order() {
    on_threads(2, |comm| {
        const LEN: usize = 100;
        let peer = 1 - comm.rank();
        comm.set_staging(B, 4, 4).unwrap();
        let reg = region(comm, 0xEE);
        if comm.rank() == 0 {
            write(&reg, 3, &payload(9, LEN));
            let r = comm.isend_gpu(reg.slice(3..3 + LEN), peer).unwrap();
            comm.wait(r).unwrap();
            comm.barrier().unwrap();
        } else {
            let stream = HostStream::new().unwrap();
            let flag = SignalWords::new(1);
            let r = comm.irecv_gpu(reg.slice(3..3 + LEN), peer).unwrap();
            stream.submit(flag.wait32(0, 1, WaitCond::Geq)).unwrap();
            // The message arrives (the sender saw its completion before the barrier) and
            // the CPU makes progress.
            comm.barrier().unwrap();
            for _ in 0..100 {
                comm.progress().unwrap();
            }
            comm.wait_on(r, &stream).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert!(
                bytes(&reg)[3..3 + LEN].iter().all(|&b| b == 0xEE),
                "the message was copied in before the stream got to its wait"
            );
            assert_eq!(
                comm.test(r).unwrap(),
                None,
                "complete before the stream copied its bytes in"
            );
            flag.store32(0, 1);
            stream.synchronize().unwrap();
            assert_eq!(comm.wait(r).unwrap(), LEN as u32);
            check(&reg, 3, LEN, 9, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

/// A staged receive from the CPU (`irecv_gpu`) whose completion an executor's wait for a
/// later receive steps over (the executor consumes the receive queue's completions in order)
/// still lands whole: the CPU learns of it from the executor's consumption, without its byte
/// count, and copies in the receive's whole length (it copied none).
#[test]
fn a_staged_receive_an_executor_steps_over_lands_whole() {
    on_threads(2, |comm| {
        const LEN: usize = 200;
        let peer = 1 - comm.rank();
        comm.set_staging(B, 4, 4).unwrap();
        let reg = region(comm, 0xEE);
        let (a, b) = (3..3 + LEN, 300..300 + LEN);
        if comm.rank() == 0 {
            write(&reg, a.start, &payload(1, LEN));
            write(&reg, b.start, &payload(2, LEN));
            let s1 = comm.isend_gpu(reg.slice(a), peer).unwrap();
            let s2 = comm.isend_gpu(reg.slice(b), peer).unwrap();
            comm.wait_all(&[s1, s2]).unwrap();
        } else {
            let stream = HostStream::new().unwrap();
            let r1 = comm.irecv_gpu(reg.slice(a.clone()), peer).unwrap();
            let r2 = comm
                .irecv_gpu_on(reg.slice(b.clone()), peer, &stream)
                .unwrap();
            comm.wait_on(r2, &stream).unwrap();
            stream.synchronize().unwrap();
            assert_eq!(
                comm.wait(r1).unwrap(),
                LEN as u32,
                "the stepped-over receive"
            );
            assert_eq!(comm.wait(r2).unwrap(), LEN as u32);
            check(&reg, a.start, LEN, 1, 0xEE);
            check(&reg, b.start, LEN, 2, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

/// A chunked message with more chunks (600 of 16 bytes) than mp's receive ring has slots
/// (512), through a pool with a bounce for each: the receiver's chunks wait for ring slots
/// as for bounces, and the message lands whole.
#[test]
fn a_chunked_receive_longer_than_the_receive_ring_waits_for_its_slots() {
    on_threads(2, |comm| {
        const LEN: usize = 600 * 16;
        let peer = 1 - comm.rank();
        comm.set_staging(16, 600, 600).unwrap();
        let reg = region(comm, 0xEE);
        if comm.rank() == 0 {
            write(&reg, 1, &payload(8, LEN));
            let r = comm.isend_gpu(reg.slice(1..1 + LEN), peer).unwrap();
            comm.wait(r).unwrap();
        } else {
            let r = comm.irecv_gpu(reg.slice(1..1 + LEN), peer).unwrap();
            assert_eq!(comm.wait(r).unwrap(), LEN as u32);
            check(&reg, 1, LEN, 8, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

/// An executor's wait for a chunked send from the CPU whose chunks still wait for the
/// peer's credits is refused whole (no chunk has a completion to wait for yet), and the
/// send then completes on the CPU.
#[test]
fn an_executor_wait_for_chunks_waiting_for_credits_is_refused() {
    static REFUSED: AtomicBool = AtomicBool::new(false);
    on_threads(2, |comm| {
        const LEN: usize = 5 * B + B / 2;
        let peer = 1 - comm.rank();
        comm.set_staging(B, 6, 6).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0);
        if comm.rank() == 0 {
            write(&reg, 0, &payload(3, LEN));
            let r = comm.isend_gpu(reg.slice(..LEN), peer).unwrap();
            let e = comm.wait_on(r, &stream).unwrap_err().to_string();
            assert!(e.contains("credits"), "{e}");
            // Not a barrier: its write would queue behind the sends, which wait for credits.
            REFUSED.store(true, Ordering::Release);
            comm.wait(r).unwrap();
        } else {
            while !REFUSED.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            let r = comm.irecv_gpu(reg.slice(..LEN), peer).unwrap();
            assert_eq!(comm.wait(r).unwrap(), LEN as u32);
            check(&reg, 0, LEN, 3, 0);
        }
        comm.barrier().unwrap();
    });
}

/// Both ranks post their sends first (two of 5.5 bounces and one of 300 bytes), then the
/// matching receives, through 2 bounces each way, and only then wait: the later staged
/// messages queue behind the chunks of the earlier ones instead of waiting for them to be
/// posted (which needs the peer's receives, posted after its own sends). All arrive whole.
#[test]
fn staged_sends_posted_before_the_receives_queue_behind_the_chunks() {
    on_threads(2, |comm| {
        const LEN: usize = 5 * B + B / 2;
        const MSGS: [(usize, usize); 3] = [(LEN, 1), (LEN, LEN + 9), (300, 2 * LEN + 20)];
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        comm.set_timeout(Duration::from_secs(5));
        comm.set_staging(B, 2, 2).unwrap();
        let (sreg, rreg) = (region(comm, 0), region(comm, 0xEE));
        let mut reqs = Vec::new();
        for (m, &(len, at)) in MSGS.iter().enumerate() {
            write(&sreg, at, &payload(me * 3 + m, len));
            reqs.push(comm.isend_gpu(sreg.slice(at..at + len), peer).unwrap());
        }
        for &(len, at) in &MSGS {
            reqs.push(comm.irecv_gpu(rreg.slice(at..at + len), peer).unwrap());
        }
        let n = comm.wait_all(&reqs).unwrap();
        assert_eq!(n[3..], [LEN as u32, LEN as u32, 300]);
        for (m, &(len, at)) in MSGS.iter().enumerate() {
            check(&rreg, at, len, peer * 3 + m, 0xEE);
        }
        comm.barrier().unwrap();
    });
}

/// Rank 1 receives 5.5 bounces through 2 receive bounces (from the CPU; on a host stream,
/// a bounce per chunk); rank 0 sends the first two bounces' worth (in chunks too) and sees
/// them complete. Then `fault`: `Leave` drops rank 0's communicator (it leaves the job);
/// `TooLong` sends two bounces' worth in one bounce (raised for it), which fails the third
/// chunk's receive with a length error. Rank 1's waits are released within 2 s with an
/// error, and the two chunks that came are in place.
fn fault_midway(comm: &mut Comm, on_stream: bool, fault: Fault) {
    const LEN: usize = 5 * B + B / 2;
    comm.set_timeout(Duration::from_secs(10));
    let stream = HostStream::new().unwrap();
    let e = on_stream.then_some(&stream);
    let recvs = if on_stream { 6 } else { 2 };
    comm.set_staging(B, recvs, 2).unwrap();
    let reg = region(comm, 0xEE);
    if comm.rank() == 0 {
        write(&reg, 1, &payload(9, LEN));
        let r = post(comm, &reg, 1, 2 * B, None);
        comm.wait(r).unwrap();
        if fault == Fault::TooLong {
            comm.set_staging(2 * B, 2, 2).unwrap();
            let r = post(comm, &reg, 1, 2 * B, None);
            println!("rank 0: {}", comm.wait(r).unwrap_err());
        }
        return;
    }
    let r = post(comm, &reg, 1, LEN, e);
    let start = Instant::now();
    stream.synchronize().unwrap();
    let e = comm.wait(r).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the waits took {:?}",
        start.elapsed()
    );
    println!("rank 1: {e}");
    let cause = match fault {
        Fault::Leave => "rank 0 left the job",
        Fault::TooLong => "longer than the receive buffer",
    };
    assert!(e.to_string().contains(cause), "{e}");
    let got = bytes(&reg);
    for i in 0..2 * B {
        assert_eq!(got[1 + i], pattern(9, i), "the first two chunks: byte {i}");
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The sender leaves the job.
    Leave,
    /// The sender sends a chunk longer than the receiver's bounce.
    TooLong,
}

#[test]
fn chunked_staged_receive_is_released_when_the_peer_leaves_midway() {
    on_threads_failing(|c| fault_midway(c, false, Fault::Leave));
}

#[test]
fn chunked_staged_receive_is_released_by_an_error_midway_on_the_cpu() {
    on_threads_failing(|c| fault_midway(c, false, Fault::TooLong));
}

#[test]
fn chunked_staged_receive_is_released_by_an_error_midway_on_a_host_stream() {
    on_threads_failing(|c| fault_midway(c, true, Fault::TooLong));
}

/// Ranks whose bounces differ cannot agree on chunks: the receiver gets a short chunk in
/// the middle of its message and reports it with a line that says why; the sender, whose
/// later chunks never get credits, times out.
#[test]
fn chunked_staged_messages_across_different_bounces_are_reported() {
    on_threads_failing(|comm| {
        const LEN: usize = 5 * B + B / 2;
        comm.set_timeout(Duration::from_millis(500));
        let bounce = if comm.rank() == 0 { B / 2 } else { B };
        comm.set_staging(bounce, 2, 2).unwrap();
        let reg = region(comm, 0);
        let r = post(comm, &reg, 0, LEN, None);
        let e = comm.wait(r).unwrap_err().to_string();
        if comm.rank() == 1 {
            assert!(e.contains("same bounce size"), "{e}");
        }
    });
}

/// What cannot work is refused with a line that says what to do: a chunked message on an
/// executor that needs more bounces than its side of the pool (sends, receives, puts and
/// gets), an executor's wait for a chunked message whose chunks the CPU has not all
/// posted (they wait for bounces), resizing the pool under a chunked message. After the refusals, the same message goes from the CPU.
#[test]
fn staged_sizes_that_cannot_work_are_refused() {
    on_threads(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        const LEN: usize = 5 * B + B / 2;
        comm.set_staging(B, 4, 4).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0);
        let s = reg.slice(..LEN);
        let e = comm.isend_gpu_on(s, peer, &stream).unwrap_err().to_string();
        assert!(
            e.contains("needs 6 bounces") && e.contains("set_staging"),
            "{e}"
        );
        let e = comm.irecv_gpu_on(s, peer, &stream).unwrap_err().to_string();
        assert!(
            e.contains("needs 6 bounces") && e.contains("irecv_gpu"),
            "{e}"
        );
        let wbuf = PinnedBuffer::with_cuda(REGION, None);
        let wmr = comm.pd().register_pinned(&wbuf, Access::ALL).unwrap();
        let win = comm.window(&wmr).unwrap();
        let e = comm.iput_gpu_on(s, &win, peer, 0, &stream).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("staged put of 5500 bytes on an executor needs 6 bounces")
                && e.contains("set_staging")
                && e.contains("iput_gpu"),
            "{e}"
        );
        let e = comm.iget_gpu_on(s, &win, peer, 0, &stream).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("staged get of 5500 bytes on an executor needs 6 bounces")
                && e.contains("iget_gpu"),
            "{e}"
        );
        if me == 0 {
            write(&reg, 0, &payload(4, LEN));
        }
        let r = post(comm, &reg, 0, LEN, None);
        let e = comm.wait_on(r, &stream).unwrap_err().to_string();
        assert!(
            e.contains("not posted all its chunks") && e.contains("wait()"),
            "{e}"
        );
        let e = comm.set_staging(B, 8, 8).unwrap_err().to_string();
        assert!(e.contains("in use"), "{e}");
        assert_eq!(comm.wait(r).unwrap(), if me == 1 { LEN as u32 } else { 0 });
        if me == 1 {
            check(&reg, 0, LEN, 4, 0);
        }
        comm.set_staging(B, 8, 8).unwrap();
        comm.barrier().unwrap();
    });
}

/// Gets into staged memory: each rank reads odd-sized pieces at odd offsets of its right
/// neighbour's window (pinned host memory) into odd offsets of its stand-in region, from
/// the CPU or on a host stream (read into a bounce, copied in after the wait); every byte
/// arrives and the bytes around each piece stay.
fn staged_gets(comm: &mut Comm, on_stream: bool) {
    const GETS: [(usize, usize, usize); 5] = [
        (1, 0, 5),
        (3, 11, 1),
        (B - 1, 17, 2001),
        (B, 1001, 7),
        (777, 4093, 3333),
    ];
    let (me, n) = (comm.rank(), comm.size());
    let right = (me + 1) % n;
    comm.set_staging(B, 8, 8).unwrap();
    let stream = HostStream::new().unwrap();
    let fill = 0xEE;
    let reg = region(comm, fill);
    let wbuf = PinnedBuffer::with_cuda(REGION, None);
    wbuf.write_at(0, &payload(me, REGION));
    let wmr = comm.pd().register_pinned(&wbuf, Access::ALL).unwrap();
    let win = comm.window(&wmr).unwrap();
    comm.barrier().unwrap();
    let mut reqs = Vec::new();
    for &(len, from, at) in &GETS {
        let s = reg.slice(at..at + len);
        let r = match on_stream {
            true => comm.iget_gpu_on(s, &win, right, from as u64, &stream),
            false => comm.iget_gpu(s, &win, right, from as u64),
        }
        .unwrap();
        reqs.push(r);
    }
    if on_stream {
        comm.wait_all_on(&reqs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    comm.wait_all(&reqs).unwrap();
    let got = bytes(&reg);
    for (g, &(len, from, at)) in GETS.iter().enumerate() {
        for i in 0..len {
            let want = pattern(right, from + i);
            assert_eq!(got[at + i], want, "rank {me}: get {g} byte {i}");
        }
        assert_eq!(got[at - 1], fill, "rank {me}: get {g}: the byte before");
        assert_eq!(got[at + len], fill, "rank {me}: get {g}: the byte after");
    }
    comm.barrier().unwrap();
}

#[test]
fn staged_gets_land_byte_for_byte_on_the_cpu_and_a_host_stream() {
    on_threads(2, |c| staged_gets(c, false));
    on_threads(3, |c| staged_gets(c, true));
}
