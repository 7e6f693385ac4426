//! What one `Comm::progress` call costs the CPU with 64 receives posted ahead (as a
//! ping-pong or a halo exchange keeps them): receives of registered memory against staged
//! receives of GPU memory (here pinned host memory standing in for it, staged the same way).
//! Each staged receive is a message the CPU walks in every progress call, so this is the
//! price a stream-triggered staged loop pays on its CPU per `test` or `wait`.
//! `cargo bench --bench mp_progress`.

use divan::Bencher;
use gdasync::gdsync::{Device, PinnedBuffer};
use gdasync::mp::bootstrap::ThreadBootstrap;
use gdasync::mp::{Comm, GpuRegion, Request};
use std::sync::mpsc;

fn main() {
    divan::main();
}

/// Receives each rank keeps posted.
const AHEAD: usize = 64;

/// Rank 0 with `AHEAD` receives posted (staged or not) from rank 1, which waits on its own
/// thread until told to send them all.
struct Posted {
    comm: Comm,
    recvs: Vec<Request>,
    _stand_in: GpuRegion,
    go: mpsc::Sender<()>,
    peer: std::thread::JoinHandle<()>,
}

impl Posted {
    fn new(staged: bool) -> Posted {
        let dev = Device::soft().expect("soft device");
        let mut boots = ThreadBootstrap::group(2);
        let (b1, b0) = (boots.pop().unwrap(), boots.pop().unwrap());
        let (go, told) = mpsc::channel::<()>();
        let d1 = dev.clone();
        let peer = std::thread::spawn(move || {
            let mut c = Comm::new(Box::new(b1), &d1).expect("rank 1");
            let mut buf = vec![0u8; 8 * AHEAD];
            let mr = c.register(&mut buf).expect("register");
            c.barrier().expect("barrier");
            told.recv().expect("told to send");
            let sends: Vec<_> = (0..AHEAD)
                .map(|k| c.isend(mr.sge(k * 8..k * 8 + 8), 0).expect("send"))
                .collect();
            c.wait_all(&sends).expect("sends");
            c.barrier().expect("barrier");
            drop(mr);
            c.finalize().expect("finalize");
        });
        let mut comm = Comm::new(Box::new(b0), &dev).expect("rank 0");
        comm.set_staging(4096, AHEAD + 16, 32)
            .expect("staging pool");
        let stand_in = comm.register_gpu_stand_in(PinnedBuffer::new(8 * AHEAD));
        let host: &'static mut [u8] = Box::leak(vec![0u8; 8 * AHEAD].into_boxed_slice());
        let mr = Box::leak(Box::new(comm.register(host).expect("register")));
        comm.barrier().expect("barrier");
        let recvs = (0..AHEAD)
            .map(|k| match staged {
                true => comm.irecv_gpu(stand_in.slice(k * 8..k * 8 + 8), 1),
                false => comm.irecv(mr.sge(k * 8..k * 8 + 8), 1),
            })
            .collect::<Result<_, _>>()
            .expect("receives");
        Posted {
            comm,
            recvs,
            _stand_in: stand_in,
            go,
            peer,
        }
    }

    /// Lets rank 1 send, waits for every receive, and ends both ranks.
    fn finish(mut self) {
        self.go.send(()).expect("rank 1 is there");
        self.comm.wait_all(&self.recvs).expect("receives");
        self.comm.barrier().expect("barrier");
        self.comm.finalize().expect("finalize");
        self.peer.join().expect("rank 1");
    }
}

#[divan::bench(args = ["registered", "staged"], sample_count = 200, sample_size = 100)]
fn progress_with_64_receives_posted(bencher: Bencher, memory: &str) {
    let mut p = Posted::new(memory == "staged");
    bencher.bench_local(|| p.comm.progress().expect("progress"));
    p.finish();
}
