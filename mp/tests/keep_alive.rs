//! Op lists keep the memory they name alive: a host stream still waiting on the memory of a
//! `Comm`, a window, a memory region, a CQ or a QP after its handle is dropped reads (or
//! writes) live memory, never freed memory. CI runs this
//! file under AddressSanitizer as well (`.ci/run`), where a read of freed memory aborts.

mod support;
use gdsync::exec::HostStream;
use gdsync::ops::WaitCond;
use gdsync::{Access, Device, PinnedBuffer, SendWr, SignalWords};
use mp::bootstrap::ThreadBootstrap;
use mp::Comm;
use std::sync::{Arc, Barrier};
use std::time::Duration;
use support::pair;

/// How long the stream's wait polls the dropped communicator's memory before giving up.
const WAIT: Duration = Duration::from_millis(300);

/// Two thread ranks; rank 0 runs `on_zero` with the stream, rank 1 runs `on_one` (its part
/// of collectives), then waits for rank 0 to finish.
fn two_ranks(on_zero: fn(Comm, &HostStream), on_one: fn(&mut Comm)) {
    let dev = Device::soft().unwrap();
    let gate = Arc::new(Barrier::new(2));
    let hs: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let (dev, gate) = (dev.clone(), gate.clone());
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                if comm.rank() == 0 {
                    let stream = HostStream::with_timeout(WAIT).unwrap();
                    on_zero(comm, &stream);
                    gate.wait();
                } else {
                    // Rank 1 posts no receive and leaves once rank 0 is done.
                    on_one(&mut comm);
                    gate.wait();
                    drop(comm);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
}

/// Asserts the stream is still waiting, lets it poll a while, then that its wait ended with
/// a timeout (the word it polls was never released) rather than anything else.
fn wait_still_pending_then_times_out(stream: &HostStream) {
    assert!(!stream.is_idle(), "the stream must still be waiting");
    std::thread::sleep(WAIT / 3);
    let e = stream.synchronize().expect_err("no peer released the wait");
    assert!(
        matches!(e, gdsync::Error::Timeout { .. }),
        "the wait ends by its timeout: {e}"
    );
}

/// `isend_on` queues a wait for the receiver's credit on the communicator's control memory;
/// rank 1 posts no receive, so the wait is pending when the `Comm` is dropped.
#[test]
fn comm_dropped_while_a_stream_waits_for_a_credit() {
    two_ranks(
        |mut comm, stream| {
            let mut buf = vec![0u8; 64];
            let mr = comm.register(&mut buf).unwrap();
            comm.isend_on(mr.sge(0..8), 1, stream).unwrap();
            drop(mr);
            drop(comm);
            wait_still_pending_then_times_out(stream);
        },
        |_| (),
    );
}

/// `barrier_on` queues a wait for the partner's epoch word in the control memory.
#[test]
fn comm_dropped_while_a_stream_waits_in_a_barrier() {
    two_ranks(
        |mut comm, stream| {
            comm.barrier_on(stream).unwrap();
            drop(comm);
            wait_still_pending_then_times_out(stream);
        },
        |_| (),
    );
}

/// A window over pinned memory: the stream waits (with the buffer's own keep-alive builder)
/// for a signal word in the window; the window, its region, the buffer handle and the `Comm`
/// all go before the wait ends.
#[test]
fn window_dropped_while_a_stream_waits_on_its_memory() {
    two_ranks(
        |mut comm, stream| {
            let buf = PinnedBuffer::new(64);
            let mr = comm.pd().register_pinned(&buf, Access::ALL).unwrap();
            let win = comm.window(&mr).unwrap();
            stream.enqueue(buf.wait64(8, 1, WaitCond::Geq));
            drop((win, mr));
            drop(buf);
            drop(comm);
            wait_still_pending_then_times_out(stream);
        },
        |comm| {
            let buf = PinnedBuffer::new(64);
            let mr = comm.pd().register_pinned(&buf, Access::ALL).unwrap();
            comm.window(&mr).unwrap();
        },
    );
}

/// A memory region over pinned memory: the stream waits on a word of it; region and buffer
/// go first.
#[test]
fn memory_region_dropped_while_a_stream_waits_on_its_memory() {
    let dev = Device::soft().unwrap();
    let stream = HostStream::with_timeout(WAIT).unwrap();
    let buf = PinnedBuffer::new(64);
    let pd = dev.alloc_pd();
    let mr = pd.register_pinned(&buf, Access::ALL).unwrap();
    stream.enqueue(buf.wait32(4, 1, WaitCond::Eq));
    drop(mr);
    drop(buf);
    drop(pd);
    wait_still_pending_then_times_out(&stream);
}

/// A completion queue: the stream waits for a completion that never comes (nothing was
/// posted); the CQ (with its QPs) goes first.
#[test]
fn cq_dropped_while_a_stream_waits_for_a_completion() {
    let dev = Device::soft().unwrap();
    let stream = HostStream::with_timeout(WAIT).unwrap();
    let pair = pair(&dev);
    stream.enqueue(pair.2.wait_ops(0).unwrap());
    drop(pair);
    wait_still_pending_then_times_out(&stream);
}

/// A queue pair: the stream holds a committed send (its doorbell record and doorbell
/// stores) behind a wait on a signal word; the QP and its CQs go, then the signal releases
/// the stream, which stores into the QP's doorbell memory.
#[test]
fn qp_dropped_while_a_stream_holds_its_doorbell() {
    let dev = Device::soft().unwrap();
    let stream = HostStream::with_timeout(Duration::from_secs(5)).unwrap();
    let gate = SignalWords::new(1);
    let (mut q0, s0, r0, q1, s1, r1) = pair(&dev);
    let p = q0.prepare_send(&SendWr::nop()).unwrap();
    let (_, ring) = q0.commit(p).unwrap();
    stream.enqueue(gate.wait64(0, 1, WaitCond::Geq));
    stream.enqueue(ring);
    drop((q0, s0, r0, q1, s1, r1));
    assert!(!stream.is_idle(), "the stream must still hold the doorbell");
    std::thread::sleep(Duration::from_millis(50));
    gate.store64(0, 1);
    stream.synchronize().unwrap();
}
