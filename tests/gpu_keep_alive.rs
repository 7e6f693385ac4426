//! Op lists keep the memory they name alive on a CUDA stream, and dropping a handle never
//! waits for the GPU: a stream stands at a gate (a wait on a host word) in front of work that
//! names a queue pair's, a completion queue's, a memory region's, a window's or a
//! communicator's memory; the handle is dropped (the drop must return at once: the driver's
//! unregister and free wait for the device, and here the same thread opens the gate next);
//! then the gate opens and the stream must run its work on live, mapped memory. The host-stream
//! versions run under AddressSanitizer in CI (mp/tests/keep_alive.rs). Each test is ignored
//! unless asked for (`cargo test --release --test gpu_keep_alive -- --include-ignored`), and
//! then requires a GPU.

mod common;

#[path = "../mp/tests/support/mod.rs"]
mod support;
use common::gpu::gpu;
use gdasync::gdsync::cuda::CudaStream;
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::{Access, Device, PinnedBuffer, SendWr, SignalWords};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::Comm;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::pair;

/// A drop that takes longer than this waited for the gated stream.
const PROMPT: Duration = Duration::from_secs(1);

/// A stream standing at a gate; `open` lets it on and checks it ran `done` after its work.
struct Gated {
    stream: CudaStream,
    gate: SignalWords,
    done: SignalWords,
}

impl Gated {
    fn new() -> Self {
        let g = Gated {
            stream: CudaStream::new(0).unwrap(),
            gate: SignalWords::new(1),
            done: SignalWords::new(1),
        };
        g.stream.enqueue(g.gate.wait32(0, 1, WaitCond::Eq)).unwrap();
        g
    }

    /// Asserts that drops begun at `start` (of `name`) returned at once.
    fn dropped_promptly(&self, name: &str, start: Instant) {
        let took = start.elapsed();
        assert!(
            took < PROMPT,
            "dropping {name} took {took:?}: it waited for a stream standing at a gate"
        );
    }

    /// Opens the gate and asserts the stream ran everything enqueued (then `done`).
    fn open(self, what: &str) {
        self.stream.enqueue(self.done.write32(0, 1)).unwrap();
        self.gate.store32(0, 1);
        let start = Instant::now();
        while self.done.load32(0) != 1 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(self.done.load32(0), 1, "the stream ran {what}");
        self.stream.synchronize().unwrap();
    }
}

/// A committed send's doorbell stores wait behind the gate; the QP and its CQs go first.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn qp_dropped_while_a_cuda_stream_holds_its_doorbell() {
    let _gpu = gpu();
    let g = Gated::new();
    let (mut q0, s0, r0, q1, s1, r1) = pair(&Device::soft().unwrap());
    let p = q0.prepare_send(&SendWr::nop()).unwrap();
    let (_, ring) = q0.commit(p).unwrap();
    g.stream.enqueue(ring).unwrap();
    let start = Instant::now();
    drop((q0, s0, r0, q1, s1, r1));
    g.dropped_promptly("a QP and its CQs", start);
    g.open("the doorbell stores");
}

/// A wait for a send completion that has already landed in the CQ's memory; the CQ goes
/// (with its QPs) before the stream reads it.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn cq_dropped_while_a_cuda_stream_waits_for_a_completion() {
    let _gpu = gpu();
    let g = Gated::new();
    let (mut q0, s0, r0, q1, s1, r1) = pair(&Device::soft().unwrap());
    g.stream.enqueue(s0.wait_ops(0).unwrap()).unwrap();
    q0.post_send(&SendWr::nop().wr_id(7)).unwrap();
    // Time for the CQE to land (the posting thread runs the soft engine as it posts): if it
    // had not, the stream would never pass and `open` fails.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    drop((q0, s0, r0, q1, s1, r1));
    g.dropped_promptly("a CQ and its QPs", start);
    g.open("the completion wait");
}

/// A wait on a word of a registered pinned buffer, written before the region and the buffer
/// go.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn memory_region_dropped_while_a_cuda_stream_waits_on_its_memory() {
    let _gpu = gpu();
    let g = Gated::new();
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let buf = PinnedBuffer::new(64);
    let mr = pd.register_pinned(&buf, Access::ALL).unwrap();
    g.stream.enqueue(buf.wait32(4, 1, WaitCond::Eq)).unwrap();
    buf.write_at(4, &1u32.to_ne_bytes());
    let start = Instant::now();
    drop(mr);
    drop(buf);
    drop(pd);
    g.dropped_promptly("a memory region, its buffer and its PD", start);
    g.open("the wait on the region's memory");
}

/// Two thread ranks: rank 0 runs `on_zero` with a gated stream (it queues its work, meets
/// rank 1 once on `met`, then drops), rank 1 runs `on_one` before that meeting; rank 1 keeps
/// its `Comm` until rank 0 is done.
fn two_ranks(on_zero: fn(Comm, &Gated, &Barrier), on_one: fn(&mut Comm)) {
    let _gpu = gpu();
    let dev = Device::soft().unwrap();
    let met = Arc::new(Barrier::new(2));
    let hs: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let (dev, met) = (dev.clone(), met.clone());
            std::thread::spawn(move || {
                let mut comm = Comm::new(Box::new(b), &dev).unwrap();
                if comm.rank() == 0 {
                    let g = Gated::new();
                    on_zero(comm, &g, &met);
                    g.open("the communicator's work");
                    met.wait();
                } else {
                    on_one(&mut comm);
                    met.wait();
                    met.wait();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
}

/// A barrier on the stream waits for the partner's epoch word in the communicator's control
/// memory; the partner's CPU barrier writes it; the `Comm` goes before the stream reads it.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn comm_dropped_while_a_cuda_stream_waits_in_a_barrier() {
    two_ranks(
        |mut comm, g, met| {
            comm.barrier_on(&g.stream).unwrap();
            met.wait();
            let start = Instant::now();
            drop(comm);
            g.dropped_promptly("a communicator", start);
        },
        |comm| {
            // Its epoch reaches rank 0 at once; rank 0's half goes out only after the gate
            // opens, so this barrier ends by its timeout (or not: either way is fine here).
            comm.set_timeout(Duration::from_millis(300));
            let _ = comm.barrier();
        },
    );
}

/// A window over pinned memory: the stream waits for the signal word of a put with signal
/// from rank 1; the window, its region, the buffer and the `Comm` go before the stream reads it.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn window_dropped_while_a_cuda_stream_waits_for_a_signal() {
    two_ranks(
        |mut comm, g, met| {
            let buf = PinnedBuffer::new(64);
            let mr = comm.pd().register_pinned(&buf, Access::ALL).unwrap();
            let win = comm.window(&mr).unwrap();
            g.stream.enqueue(buf.wait64(8, 5, WaitCond::Geq)).unwrap();
            met.wait();
            let mut signal = [0u8; 8];
            buf.read_at(8, &mut signal);
            assert_eq!(u64::from_ne_bytes(signal), 5, "rank 1's signal landed");
            let start = Instant::now();
            drop((win, mr));
            drop(buf);
            drop(comm);
            g.dropped_promptly(
                "a window, its region, its buffer and the communicator",
                start,
            );
        },
        |comm| {
            let buf = PinnedBuffer::new(64);
            buf.write_at(0, &5u64.to_ne_bytes());
            let mr = comm.pd().register_pinned(&buf, Access::ALL).unwrap();
            let win = comm.window(&mr).unwrap();
            let req = comm
                .iput_signal(mr.sge(16..24), &win, 0, 0, mr.sge(0..8), 8)
                .unwrap();
            comm.wait(req).unwrap();
        },
    );
}

/// Memory dropped while a stream stands at a gate is given back only once the stream is idle:
/// the driver's free and unregister would wait for that stream, and while they waited, this
/// thread's allocation, registration, new stream and copy would wait behind them, so the
/// thread that opens the gate could never reach it. (A helper thread opens the gate after
/// 5 s, so that a regression fails here instead of hanging.)
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_keep_alive -- --include-ignored"]
fn allocations_and_copies_go_on_while_a_waiting_stream_holds_releases_back() {
    use gdasync::gdsync::cuda::DeviceBuffer;
    use gdasync::gdsync::release::settle;
    let _gpu = gpu();
    let g = Gated::new();
    let kept = DeviceBuffer::alloc(0, 64).unwrap();
    drop(DeviceBuffer::alloc(0, 4096).unwrap());
    drop(PinnedBuffer::new(4096));
    std::thread::sleep(Duration::from_millis(50));
    let (gate, (done, stop)) = (g.gate.clone(), std::sync::mpsc::channel::<()>());
    let rescue = std::thread::spawn(move || {
        use std::sync::mpsc::RecvTimeoutError::Timeout;
        if let Err(Timeout) = stop.recv_timeout(Duration::from_secs(5)) {
            gate.store32(0, 1);
        }
    });
    let start = Instant::now();
    let _b = DeviceBuffer::alloc(0, 4096).unwrap();
    let _p = PinnedBuffer::new(4096);
    let mut got = [1u8; 64];
    kept.copy_to_host(0, &mut got).unwrap();
    let (took, gated) = (start.elapsed(), g.gate.load32(0) == 0);
    // A new stream was held too; its first work, bounded, is not timed here.
    let _s = CudaStream::new(0).unwrap();
    drop(done);
    assert!(
        gated && took < PROMPT,
        "allocating, registering and copying took {took:?}: they waited for releases that waited for a stream standing at a gate"
    );
    assert_eq!(got, [0u8; 64], "a new device buffer reads as zeros");
    g.open("its work after the gate");
    assert!(
        settle(Duration::from_secs(5)),
        "the releases held back ran once the stream was idle"
    );
    rescue.join().unwrap();
}
